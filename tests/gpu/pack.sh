#!/usr/bin/env bash
# Builds the GPU checks here (CUDA, sm_90 only: H100 and H200) and packs them, stripped, with
# every shared library they load, into .gpupack/ (ignored by git through .git/info/exclude), so
# that a lent GPU machine spends no time compiling and needs nothing but its driver and glibc:
#   tests/gpu/pack.sh        then, on the device: .gpupack/run.sh $OUT   (docs/gpu.md)
# The GPU code is compiled once, into libridge_gpu.so (RIDGE_GPU_CODE_SHARED), which every test
# binary and benchmark loads; CUDA's runtime is the shared one (CMAKE_CUDA_RUNTIME_LIBRARY).
# Packed: bin/ (tests, benchmarks, the GDR-write check, the PCIe premise benchmark), lib/ (every
# library they need except the device's own: glibc's (libc, libm, libdl, libpthread, librt, the
# loader) and the driver's (libcuda.so.1, libnvidia-*)), run.sh and run_checks.sh (the runner,
# a copy of tests/gpu/run_checks.sh), MANIFEST, googletest.tar.xz (for the fallback that builds
# on the device, tests/gpu/run.sh). When the build has Ridge's NCCL-compatible library (target
# GPUPACK_NCCL_TARGET, default ridge_nccl or nccl_ridge) and nccl-tests' sources are there, nccl-tests are
# built for sm_90 against it into nccl-tests/ (with libnccl.so.2 and libverifiable.so.0 in
# lib/); otherwise the runner reports those steps as skipped.
# Checks, each fatal: the pack is under 40 MiB (a device call carries 64 MiB in all); every
# NEEDED entry of every packed file is in lib/ or the device's own (the closure, read with
# readelf, not the loader's search of this machine); and, as root, the loader in a chroot that
# holds only glibc and the pack resolves every binary with LD_LIBRARY_PATH=lib (the host's
# library folders hidden).
# Environment: GPUPACK_BUILD_DIR (default build-cuda), GPUPACK_JOBS (default 2),
# GPUPACK_NCCL_TARGET (default: ridge_nccl, else nccl_ridge), GPUPACK_NCCL_TESTS_SRC (default
# ../shared/third_party/nccl-tests beside the main checkout), GPUPACK_NCCL_LIB (a libnccl.so.2
# to build nccl-tests against instead of the target's: for trying this step out).
set -euo pipefail
shopt -s nullglob
cd "$(dirname "$0")/../.."
root=$(pwd)
build=${GPUPACK_BUILD_DIR:-build-cuda}
jobs=${GPUPACK_JOBS:-2}
nccl_targets=${GPUPACK_NCCL_TARGET:-ridge_nccl nccl_ridge}
pack="$root/.gpupack"
max_bytes=$((40 << 20))
bins=(test_gpu_kernels test_gpu_stream test_gpu_p2p test_gpu_ll test_gpu_ll_collective test_ll_line test_gpu_dmabuf
  ridge-gpu-kernel-bw ridge-gpu-ll-lat ridge-gpu-coll-lat ridge-gpu-pcie-premise ridge-gdr-write-check ridge-bench)
nccl_tests=(all_reduce all_gather broadcast reduce_scatter alltoall sendrecv)
export PATH=/usr/local/cuda/bin:$PATH

launchers=()
if command -v ccache >/dev/null 2>&1; then
  launchers=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
# No build RPATH: the packed binaries find their libraries through the runner's
# LD_LIBRARY_PATH only, never through a path of this machine (-rpath-link lets the linker find
# libridge_gpu.so behind libridge.so). No MPI or Gloo: the checks use neither, and their
# libraries would take a third of the pack.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRIDGE_WITH_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DRIDGE_GPU_CODE_SHARED=ON -DCMAKE_CUDA_RUNTIME_LIBRARY=Shared \
  -DCMAKE_SKIP_BUILD_RPATH=ON -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$root/$build/kernels" \
  -DCMAKE_SHARED_LINKER_FLAGS="-Wl,-rpath-link,$root/$build/kernels" \
  -DRIDGE_WITH_MPI=OFF -DCMAKE_DISABLE_FIND_PACKAGE_Gloo=ON "${launchers[@]}" >/dev/null
for want in 'CMAKE_CUDA_ARCHITECTURES:.*=90$' 'RIDGE_GPU_CODE_SHARED:.*=ON$' 'CMAKE_SKIP_BUILD_RPATH:.*=ON$'; do
  grep -q "^$want" "$build/CMakeCache.txt" || {
    echo "pack.sh: $build is not configured as the pack needs ($want)" >&2
    exit 1
  }
done
targets=("${bins[@]}")
have_nccl_target=0
nccl_target=${nccl_targets%% *}
for t in $nccl_targets; do
  # Not grep -q: it would stop reading early, ninja would die of SIGPIPE, and pipefail would
  # make an existing target look absent.
  if ninja -C "$build" -t targets all 2>/dev/null | grep "^$t:" >/dev/null; then
    have_nccl_target=1
    nccl_target=$t
    targets+=("$t")
    break
  fi
done
cmake --build "$build" -j"$jobs" --target "${targets[@]}"

# The packed folder must never be committed, nor travel other than as a carried path.
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpupack/' "$exclude" 2>/dev/null || echo '/.gpupack/' >>"$exclude"

rm -rf "$pack"
mkdir -p "$pack/bin" "$pack/lib"
for b in "${bins[@]}"; do
  src=$(find "$build/tests/gpu" "$build/tests/gdr" "$build/bench" -maxdepth 1 -type f -name "$b" | head -1)
  [ -n "$src" ] || {
    echo "pack.sh: $b was not built" >&2
    exit 1
  }
  cp "$src" "$pack/bin/$b"
  strip "$pack/bin/$b"
done

# ---- nccl-tests against Ridge's NCCL-compatible library, when both exist -------------------
nccl_note="nccl-tests: not packed (no build target ${nccl_targets// / or })"
if [ "$have_nccl_target" -eq 1 ] || [ -n "${GPUPACK_NCCL_LIB:-}" ]; then
  nt_src=${GPUPACK_NCCL_TESTS_SRC:-}
  if [ -z "$nt_src" ]; then
    for d in "$(git rev-parse --path-format=absolute --git-common-dir)/../../shared/third_party/nccl-tests" \
      "$root/../shared/third_party/nccl-tests" /work/shared/third_party/nccl-tests; do
      [ -f "$d/src/Makefile" ] && nt_src=$(cd "$d" && pwd) && break
    done
  fi
  ridge_nccl=$(find "${GPUPACK_NCCL_LIB:-$root/$build}" -name 'libnccl.so*' -type f 2>/dev/null | while read -r f; do
    readelf -d "$f" 2>/dev/null | grep -q 'SONAME.*\[libnccl\.so\.2\]' && echo "$f"
  done | head -1) || true
  header=$(for h in "$root/nccl/include/nccl.h" "$root/nccl/nccl.h" /usr/local/cuda/include/nccl.h; do
    [ -f "$h" ] && echo "$h"
  done | head -1) || true
  if [ -z "$nt_src" ]; then
    nccl_note="nccl-tests: not packed (no nccl-tests sources; set GPUPACK_NCCL_TESTS_SRC)"
  elif [ -z "$ridge_nccl" ]; then
    nccl_note="nccl-tests: not packed ($nccl_target built no file with soname libnccl.so.2 under $build)"
  elif [ -z "$header" ]; then
    nccl_note="nccl-tests: not packed (no nccl.h: neither Ridge's nccl/ nor the CUDA toolkit has one)"
  else
    # Built out of the shared sources' tree (a copy), for sm_90 only, DSO=1 (the verification
    # kernels once, in libverifiable.so.0), against a home holding the header and Ridge's library.
    nt_build="$root/$build/nccl-tests"
    rm -rf "$nt_build"
    mkdir -p "$nt_build/home/include" "$nt_build/home/lib"
    cp -r "$nt_src" "$nt_build/src-copy"
    cp "$header" "$nt_build/home/include/nccl.h"
    ln -s "$ridge_nccl" "$nt_build/home/lib/libnccl.so"
    nvcc=nvcc
    command -v ccache >/dev/null 2>&1 && nvcc="ccache $(command -v nvcc)"
    make_targets=()
    for t in "${nccl_tests[@]}"; do make_targets+=("$nt_build/out/${t}_perf"); done
    make -C "$nt_build/src-copy/src" -j"$jobs" MPI=0 DSO=1 BUILDDIR="$nt_build/out" \
      NCCL_HOME="$nt_build/home" CUDA_HOME=/usr/local/cuda NVCC="$nvcc" \
      NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" "${make_targets[@]}" >"$nt_build/make.log" 2>&1 || true
    mkdir -p "$pack/nccl-tests"
    missing=
    for t in "${nccl_tests[@]}"; do
      if [ -f "$nt_build/out/${t}_perf" ]; then
        cp "$nt_build/out/${t}_perf" "$pack/nccl-tests/"
        strip "$pack/nccl-tests/${t}_perf"
      else
        missing="$missing ${t}_perf"
      fi
    done
    if [ -n "$missing" ]; then
      echo "pack.sh: nccl-tests did not build:$missing (see $nt_build/make.log)" >&2
      tail -20 "$nt_build/make.log" >&2
      exit 1
    fi
    cp -L "$ridge_nccl" "$pack/lib/libnccl.so.2"
    cp -L "$nt_build/out/verifiable/libverifiable.so.0" "$pack/lib/"
    chmod u+w "$pack/lib/libnccl.so.2" "$pack/lib/libverifiable.so.0"
    strip --strip-unneeded "$pack/lib/libnccl.so.2" "$pack/lib/libverifiable.so.0"
    nccl_note="nccl-tests: ${nccl_tests[*]} against $ridge_nccl ($header)"
  fi
fi
echo "$nccl_note"

# from_device LIB: libraries the device must provide itself.
from_device() {
  case $1 in
    libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux* | libcuda.so* | libnvidia-* | \
      linux-vdso.so.*) return 0 ;;
  esac
  return 1
}
# needed FILE: the sonames FILE names as NEEDED.
needed() {
  readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'
}
# locate SONAME: where this machine has it: the build tree first, then the loader's cache.
locate() {
  local f
  f=$(find "$root/$build" -name "$1" \( -type f -o -type l \) 2>/dev/null | head -1)
  [ -n "$f" ] || f=$(ldconfig -p | awk -v s="$1" '$1 == s && /x86-64/ {print $NF; exit}')
  [ -n "$f" ] || f=$(find /usr/local/cuda/lib64/ /usr/local/cuda/lib/ -name "$1" 2>/dev/null | head -1)
  echo "$f"
}

# The NEEDED closure, copied under each soname: every packed file's needs, then the needs of
# what that added, until nothing new.
changed=1
while [ "$changed" -eq 1 ]; do
  changed=0
  for f in "$pack"/bin/* "$pack"/lib/* "$pack"/nccl-tests/*; do
    [ -f "$f" ] || continue
    for so in $(needed "$f"); do
      from_device "$so" && continue
      [ -f "$pack/lib/$so" ] && continue
      path=$(locate "$so")
      [ -n "$path" ] || {
        echo "pack.sh: $(basename "$f") needs $so, which is nowhere here" >&2
        exit 1
      }
      cp -L "$path" "$pack/lib/$so"
      chmod u+w "$pack/lib/$so"
      strip --strip-unneeded "$pack/lib/$so" 2>/dev/null || true
      changed=1
    done
  done
done

if [ -d /usr/src/googletest ]; then
  tar -C /usr/src -cJf "$pack/googletest.tar.xz" googletest
fi
cp tests/gpu/run_checks.sh "$pack/run_checks.sh"
cat >"$pack/run.sh" <<'RUNNER'
#!/usr/bin/env bash
# Written by tests/gpu/pack.sh: the GPU checks on the packed binaries, with the packed
# libraries first on their library path, within 290 s (docs/gpu.md, "Running the GPU checks
# on a lent device"):
#   .gpupack/run.sh OUT_DIR        (on a lent device: .gpupack/run.sh $OUT)
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/run_checks.sh" "$here/bin" "${1:-$here/report}" "$here/lib"
RUNNER
chmod +x "$pack/run.sh" "$pack/run_checks.sh"

# The newest glibc symbol version any packed file needs: the device's glibc must be at least
# that (the report prints both).
glibc_needed=$(for f in "$pack"/bin/* "$pack"/lib/* "$pack"/nccl-tests/*; do
  objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_2\.[0-9]*' || true
done | sort -V -u | tail -1)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- 2>/dev/null || commit="$commit+uncommitted changes"
{
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) from $commit on $(grep -m1 '^PRETTY_NAME=' /etc/os-release | cut -d= -f2-)," \
    "$(ldd --version | head -1), $(nvcc --version | tail -1), sm_90, GPU code once (libridge_gpu.so);" \
    "needs ${glibc_needed:-an unknown glibc} or newer; $nccl_note"
  (cd "$pack" && find . -type f -printf '%s %P\n' | sort -k2)
} >"$pack/MANIFEST"

# ---- Checks ----------------------------------------------------------------------------------
bad=0
# 1. The closure: every NEEDED of every packed ELF file is packed or the device's own.
for f in "$pack"/bin/* "$pack"/lib/* "$pack"/nccl-tests/*; do
  [ -f "$f" ] || continue
  for so in $(needed "$f"); do
    if ! from_device "$so" && [ ! -f "$pack/lib/$so" ]; then
      echo "pack.sh: $(basename "$f") needs $so, which is not packed" >&2
      bad=1
    fi
  done
done
# 2. The loader itself, with nothing of this machine's but glibc (what the device provides):
# a chroot holding the loader, glibc's libraries and the pack.
if [ "$(id -u)" -eq 0 ] && command -v chroot >/dev/null; then
  jail=$(mktemp -d)
  trap 'rm -rf "$jail"' EXIT
  mkdir -p "$jail/lib64" "$jail/glibc" "$jail/pack"
  cp -L /lib64/ld-linux-x86-64.so.2 "$jail/lib64/"
  for so in libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1; do
    cp -L "$(ldconfig -p | awk -v s="$so" '$1 == s && /x86-64/ {print $NF; exit}')" "$jail/glibc/"
  done
  cp -r "$pack/bin" "$pack/lib" "$jail/pack/"
  [ -d "$pack/nccl-tests" ] && cp -r "$pack/nccl-tests" "$jail/pack/"
  for f in "$jail"/pack/bin/* "$jail"/pack/nccl-tests/*; do
    [ -f "$f" ] || continue
    rel=${f#"$jail"}
    if ! out=$(chroot "$jail" /lib64/ld-linux-x86-64.so.2 --inhibit-cache --library-path /pack/lib:/glibc \
      --list "$rel" 2>&1) || grep -q 'not found' <<<"$out"; then
      echo "pack.sh: $(basename "$f") does not load with only glibc and the pack:" >&2
      echo "$out" >&2
      bad=1
    fi
  done
  loader_check="the loader resolved every binary in a chroot with only glibc and the pack"
else
  loader_check="no chroot check (needs root): the closure alone"
fi
# 3. The size.
size=$(du -sb "$pack" | cut -f1)
if [ "$size" -gt "$max_bytes" ]; then
  echo "pack.sh: .gpupack is $size bytes, over $max_bytes (40 MiB)" >&2
  bad=1
fi
[ "$bad" -eq 0 ] || exit 1
echo "pack: $pack, $size bytes ($(((size + (1 << 19)) >> 20)) MiB of 40), $(find "$pack/bin" -type f | wc -l) binaries," \
  "$(find "$pack/lib" -type f | wc -l) libraries${nccl_note:+; $nccl_note}; $loader_check"
