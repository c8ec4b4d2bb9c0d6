#!/usr/bin/env bash
# Builds the GPU test binaries and benchmarks here (CUDA, sm_90 only: H100 and H200) and packs
# them, stripped, with the shared libraries they load, into .gpupack/ (ignored by git through
# .git/info/exclude), so that a lent GPU machine needs neither GoogleTest nor the hwloc/verbs
# headers and spends no time compiling:
#   tests/gpu/pack.sh            then, on the device: .gpupack/run.sh REPORT_DIR
# Packed: every library ldd lists except glibc's own (libc, libm, libdl, libpthread, librt,
# the loader) and the driver's (libcuda.so.1, libnvidia-*), which must come from the device.
# Also packed: GoogleTest's sources (.gpupack/googletest.tar.xz, from /usr/src/googletest),
# for the fallback that builds on the device (tests/gpu/run.sh). docs/gpu.md has the call.
# Environment: GPUPACK_BUILD_DIR (default build-cuda), GPUPACK_JOBS (default 2).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
build=${GPUPACK_BUILD_DIR:-build-cuda}
jobs=${GPUPACK_JOBS:-2}
pack="$root/.gpupack"
max_bytes=$((48 << 20)) # well under the 64 MiB a device call carries
bins=(test_gpu_kernels test_gpu_stream test_gpu_p2p test_gpu_ll test_gpu_ll_collective test_ll_line test_gpu_dmabuf
  ridge-gpu-kernel-bw ridge-gpu-ll-lat ridge-gpu-coll-lat ridge-bench)

launchers=()
if command -v ccache >/dev/null 2>&1; then
  launchers=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRIDGE_WITH_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 "${launchers[@]}" >/dev/null
grep -q '^CMAKE_CUDA_ARCHITECTURES:.*=90$' "$build/CMakeCache.txt" || {
  echo "pack.sh: $build is not configured for sm_90 only" >&2
  exit 1
}
cmake --build "$build" -j"$jobs" --target "${bins[@]}"

# The packed folder must never be committed, nor travel other than as a carried path.
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpupack/' "$exclude" 2>/dev/null || echo '/.gpupack/' >>"$exclude"

rm -rf "$pack"
mkdir -p "$pack/bin" "$pack/lib"
for b in "${bins[@]}"; do
  src=$(find "$build/tests/gpu" "$build/bench" -maxdepth 1 -type f -name "$b" | head -1)
  [ -n "$src" ] || {
    echo "pack.sh: $b was not built" >&2
    exit 1
  }
  cp "$src" "$pack/bin/$b"
  strip "$pack/bin/$b"
done

# from_device LIB: libraries the device must provide itself.
from_device() {
  case $1 in
    libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux* | libcuda.so* | libnvidia-* | \
      linux-vdso.so.*) return 0 ;;
  esac
  return 1
}

# Every library the binaries resolve here, copied under its soname (ldd lists the whole
# dependency closure, so the libraries' own needs are in it).
for b in "$pack"/bin/*; do
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r soname path; do
  from_device "$soname" && continue
  [ -f "$pack/lib/$soname" ] && continue
  cp -L "$path" "$pack/lib/$soname"
  chmod u+w "$pack/lib/$soname"
  strip --strip-unneeded "$pack/lib/$soname" 2>/dev/null || true
done

if [ -d /usr/src/googletest ]; then
  tar -C /usr/src -cJf "$pack/googletest.tar.xz" googletest
fi

cat >"$pack/run.sh" <<'RUNNER'
#!/usr/bin/env bash
# Written by tests/gpu/pack.sh: the GPU checks on the packed binaries, with the packed
# libraries first on their library path (run_checks.sh sets LD_LIBRARY_PATH for them).
#   .gpupack/run.sh REPORT_DIR        (on a lent device: .gpupack/run.sh $OUT)
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/../tests/gpu/run_checks.sh" "$here/bin" "${1:-$here/report}" "$here/lib"
RUNNER
chmod +x "$pack/run.sh"

# The newest glibc symbol version any packed file needs: the device's glibc must be at least
# that (the report prints both).
glibc_needed=$(for f in "$pack"/bin/* "$pack"/lib/*; do objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_2\.[0-9]*'; done |
  sort -V -u | tail -1)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- 2>/dev/null || commit="$commit+uncommitted changes"
{
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) from $commit on $(grep -m1 '^PRETTY_NAME=' /etc/os-release | cut -d= -f2-)," \
    "$(ldd --version | head -1), $(nvcc --version | tail -1), sm_90; needs ${glibc_needed:-an unknown glibc} or newer"
  (cd "$pack" && find bin lib -type f -printf '%s %p\n' | sort -k2)
} >"$pack/MANIFEST"

# Every packed binary must resolve every library from the pack or from the excluded set.
bad=0
for b in "$pack"/bin/*; do
  while read -r soname arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ "$path" = "not" ]; then
      from_device "$soname" || {
        echo "pack.sh: $(basename "$b"): $soname not found" >&2
        bad=1
      }
    elif [[ $path != "$pack/lib/"* ]] && ! from_device "$soname"; then
      echo "pack.sh: $(basename "$b"): $soname resolves outside the pack ($path)" >&2
      bad=1
    fi
  done < <(LD_LIBRARY_PATH="$pack/lib" ldd "$b")
done
size=$(du -sb "$pack" | cut -f1)
if [ "$size" -gt "$max_bytes" ]; then
  echo "pack.sh: .gpupack is $size bytes, over $max_bytes" >&2
  bad=1
fi
[ "$bad" -eq 0 ] || exit 1
echo "pack: $pack ($((size >> 20)) MiB, $(find "$pack/bin" -type f | wc -l) binaries, $(find "$pack/lib" -type f | wc -l) libraries)"
