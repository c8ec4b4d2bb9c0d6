#!/bin/sh
# Builds NVIDIA's nccl-tests (a checkout outside this repository, never copied into it) out of
# tree against Ridge's libnccl.so.2, and proves with readelf and ldd that the binaries resolve
# libnccl.so.2 to Ridge's, not to the CUDA toolkit's copy that the loader cache also knows.
#
#   build_nccl_tests.sh <nccl-tests dir> <build dir> <Ridge's libnccl.so.2> <nccl.h> <nvcc> <cudart dir> [bin...]
#
# Exit 77 (ctest: skipped) when the checkout or nvcc is missing.
set -eu
src=$1 out=$2 lib=$3 header=$4 nvcc=$5 cudart=$6
shift 6
bins=${*:-all_reduce all_gather broadcast reduce_scatter alltoall sendrecv}
if [ ! -f "$src/src/Makefile" ]; then echo "SKIP: no nccl-tests checkout at $src"; exit 77; fi
if [ ! -x "$nvcc" ]; then echo "SKIP: no nvcc ($nvcc)"; exit 77; fi

# The staging NCCL_HOME: NVIDIA's header and Ridge's library. CUDA_LIB points here too (with
# a link to cudart) so that no -L of the toolkit's lib64, where its own libnccl lives, is seen.
stage=$out/stage
mkdir -p "$stage/include" "$stage/lib"
ln -sf "$header" "$stage/include/nccl.h"
ln -sf "$lib" "$stage/lib/libnccl.so"
ln -sf "$lib" "$stage/lib/libnccl.so.2"
ln -sf "$cudart/libcudart.so" "$stage/lib/libcudart.so"
targets=
for b in $bins; do targets="$targets $out/bin/${b}_perf"; done
# sm_90 only keeps the build short; the run path is set so that no LD_LIBRARY_PATH is needed.
make -C "$src/src" -j2 BUILDDIR="$out/bin" NCCL_HOME="$stage" CUDA_LIB="$stage/lib" NVCC="$nvcc" \
  "CUDARTLIB=cudart -Xlinker -rpath=$stage/lib" \
  NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" $targets

want=$(readlink -f "$lib")
status=0
for t in $targets; do
  if ! readelf -d "$t" | grep -q 'NEEDED.*\[libnccl.so.2\]'; then
    echo "FAIL: $t does not need libnccl.so.2"; status=1; continue
  fi
  got=$(env -u LD_LIBRARY_PATH ldd "$t" | awk '$1 == "libnccl.so.2" { print $3 }')
  if [ -z "$got" ] || [ "$(readlink -f "$got")" != "$want" ]; then
    echo "FAIL: $t resolves libnccl.so.2 to '$got', not Ridge's $want"; status=1; continue
  fi
  echo "OK: $(basename "$t") -> $got (Ridge's)"
done
exit $status
