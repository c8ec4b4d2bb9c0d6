#!/usr/bin/env bash
# GPU checks, one command, for a machine with a CUDA device, building on that machine:
#   tests/gpu/run.sh [REPORT_DIR]
# Builds Ridge with CUDA (sm_90 only: H100 and H200) in build-gpu/, then runs
# tests/gpu/run_checks.sh on it: the GPU tests (kernels against the host reference for every
# dtype x op, the LL protocol and channel shapes, stream-ordered collectives, P2P between
# processes, dma-buf), the kernel bandwidth and LL-vs-bulk benchmarks, Ridge beside NCCL and
# the register/spill report. Report: REPORT_DIR/report.txt and details.txt (default
# build-gpu/), the build's output in REPORT_DIR/build.log. On a lent device, pass $OUT so that the report comes
# back even when the command is cut off.
# GoogleTest: the system's when the machine has one; else the sources that tests/gpu/pack.sh
# puts in .gpupack/googletest.tar.xz (carry .gpupack), built into /tmp/gtest first.
# The prebuilt pack (tests/gpu/pack.sh, .gpupack/run.sh) runs the same checks without a
# build; this script is the fallback when the pack does not load on the device.
# Exit status: 0 all passed, 1 the build or a check failed, 3 no CUDA device.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
report_dir=${1:-build-gpu}
mkdir -p "$report_dir" || exit 2
build_log="$report_dir/build.log"
export PATH=/usr/local/cuda/bin:$PATH
jobs=$(nproc)
: >"$build_log"

# build_failed WHAT: the tail of the build log on stdout and in the report, exit 1.
build_failed() {
  {
    echo "# Ridge GPU report, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "build: FAILED ($1); the end of $build_log:"
    tail -40 "$build_log"
  } | tee "$report_dir/report.txt"
  exit 1
}

if ! command -v nvcc >/dev/null 2>&1; then
  echo "no nvcc on PATH or in /usr/local/cuda/bin" >>"$build_log"
  build_failed "no CUDA compiler"
fi
gtest_args=()
if [ ! -d /usr/include/gtest ] && [ ! -d /usr/local/include/gtest ] && [ -f .gpupack/googletest.tar.xz ]; then
  # Bounded like every step (a lent device's command may run 600 s at most).
  if ! { mkdir -p /tmp/gtest-src && tar -C /tmp/gtest-src -xJf .gpupack/googletest.tar.xz &&
    timeout 300 cmake -S /tmp/gtest-src/googletest -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_GMOCK=OFF -DCMAKE_INSTALL_PREFIX=/tmp/gtest &&
    timeout 300 cmake --build /tmp/gtest-build -j"$jobs" --target install; } >>"$build_log" 2>&1; then
    build_failed "building GoogleTest from .gpupack/googletest.tar.xz"
  fi
  gtest_args=(-DCMAKE_PREFIX_PATH=/tmp/gtest)
fi
if ! timeout 300 cmake -S . -B build-gpu -G Ninja -DRIDGE_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 "${gtest_args[@]}" >>"$build_log" 2>&1; then
  build_failed "cmake configure"
fi
if ! timeout 480 ninja -C build-gpu -j"$jobs" test_gpu_kernels test_gpu_stream test_gpu_p2p test_gpu_ll test_gpu_ll_collective \
  test_ll_line test_gpu_dmabuf ridge-gpu-kernel-bw ridge-gpu-ll-lat ridge-gpu-coll-lat ridge-gpu-pcie-premise \
  ridge-gdr-write-check ridge-bench >>"$build_log" 2>&1; then
  build_failed "ninja"
fi
echo "build: $SECONDS s" >>"$build_log"
# The checks get what is left of a 600 s device command (unless a budget is given).
export GPU_CHECKS_BUDGET_S=${GPU_CHECKS_BUDGET_S:-$((570 - SECONDS))}
exec "$(dirname "$0")/run_checks.sh" build-gpu "$report_dir"
