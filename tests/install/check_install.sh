#!/usr/bin/env bash
# Installs the build into a scratch prefix, then builds and runs a consumer with
# find_package(Ridge) and another with pkg-config, as users would.
set -euo pipefail
build=$1; src=$2
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
echo "install OK"
