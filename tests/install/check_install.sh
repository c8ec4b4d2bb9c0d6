#!/usr/bin/env bash
# Installs the build into a scratch prefix, then builds and runs a consumer with
# find_package(Ridge) and another with pkg-config, as users would; then runs the installed
# tools the way a user would: without LD_LIBRARY_PATH (they find libridge by their RPATH).
set -euo pipefail
build=$1; src=$2; version=$3
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
export RIDGE_SOCKET_IFNAME=lo
LD_LIBRARY_PATH="$work/prefix/lib:${LD_LIBRARY_PATH:-}" "$work/consumer/consumer"
pc=$(find "$work/prefix" -name ridge.pc | head -n1)
export PKG_CONFIG_PATH=$(dirname "$pc")
cc "$src/consumer/main.c" $(pkg-config --cflags --libs ridge) -o "$work/consumer-pc"
LD_LIBRARY_PATH="$(pkg-config --variable=libdir ridge)" "$work/consumer-pc"
for tool in ridge-bench ridge-topo; do
  [ -x "$work/prefix/bin/$tool" ] || { echo "missing installed tool $tool"; exit 1; }
done
# Installing replaces the build-tree RPATH with the install RPATH, so what ldd finds here
# is what a user's machine finds.
unset LD_LIBRARY_PATH
for tool in "$work"/prefix/bin/*; do
  if ldd "$tool" | grep -q "not found"; then
    echo "installed $(basename "$tool") cannot find its libraries:"; ldd "$tool" | grep "not found"; exit 1
  fi
  if ldd "$tool" | grep -q "libridge" && ! ldd "$tool" | grep libridge | grep -q "=> $work/prefix/"; then
    echo "installed $(basename "$tool") loads libridge from outside the prefix:"; ldd "$tool" | grep libridge
    exit 1
  fi
done
out=$("$work/prefix/bin/ridge-topo" --version)
[ "$out" = "ridge-topo (Ridge) $version" ] || { echo "ridge-topo --version printed '$out'"; exit 1; }
"$work/prefix/bin/ridge-topo" --preset cross-rc matrix >/dev/null
for doc in LICENSE CHANGELOG.md README.md; do
  [ -f "$work/prefix/share/doc/ridge/$doc" ] || { echo "missing installed $doc"; exit 1; }
done
echo "install OK"
