#!/usr/bin/env bash
# GPU checks, one command, for a machine with a CUDA device:
#   tests/gpu/run.sh [REPORT_FILE]
# Builds Ridge with CUDA in build-gpu/, runs the GPU tests (kernels against the host
# reference for every dtype x op, the LL protocol and the channel shapes), the kernel
# bandwidth benchmark (reduce vs the same GPU's device-to-device copy), the LL-vs-bulk
# small-message benchmark and the register/spill report of the kernels, and writes a
# short report (default build-gpu/gpu-report.txt). Exit status: 0 all passed, 1 a test
# failed, 3 no CUDA device (nothing was checked).
set -euo pipefail
cd "$(dirname "$0")/../.."
report=${1:-build-gpu/gpu-report.txt}
jobs=$(nproc)
cmake -S . -B build-gpu -G Ninja -DRIDGE_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build-gpu -j"$jobs" test_gpu_kernels test_gpu_stream test_gpu_p2p test_gpu_ll test_ll_line test_gpu_dmabuf ridge-gpu-kernel-bw ridge-gpu-ll-lat ridge-bench ridge_kernels >/dev/null
mkdir -p "$(dirname "$report")"
{
  echo "# Ridge GPU report, $(date -u +%Y-%m-%dT%H:%MZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not available"
} >"$report"
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no CUDA device" | tee -a "$report"
  exit 3
fi
status=0
# run_tests TITLE LABEL BINARY: one GPU test binary, its output in the report.
run_tests() {
  echo "## $1" >>"$report"
  if RIDGE_SOCKET_IFNAME=lo "$3" --gtest_brief=1 >>"$report" 2>&1; then
    echo "$2 tests: passed" | tee -a "$report"
  else
    echo "$2 tests: FAILED" | tee -a "$report"
    status=1
  fi
}
run_tests "kernel tests" kernel ./build-gpu/tests/gpu/test_gpu_kernels
run_tests "stream-ordered collectives" stream ./build-gpu/tests/gpu/test_gpu_stream
run_tests "P2P transport (two processes, CUDA IPC)" p2p ./build-gpu/tests/gpu/test_gpu_p2p
# The two-GPU case skips itself with fewer GPUs; say so rather than let "passed" cover it.
[ "$(nvidia-smi -L | wc -l)" -ge 2 ] || echo "P2P between two GPUs: skipped (one GPU)" | tee -a "$report"
run_tests "LL protocol and channel tests" LL ./build-gpu/tests/gpu/test_gpu_ll
run_tests "LL line format (host code)" "LL line" ./build-gpu/tests/gpu/test_ll_line
echo "## dma-buf export" >>"$report"
if RIDGE_DEBUG=INFO ./build-gpu/tests/gpu/test_gpu_dmabuf --gtest_brief=1 >>"$report" 2>&1; then
  echo "dma-buf tests: passed" | tee -a "$report"
else
  echo "dma-buf tests: FAILED" | tee -a "$report"
  status=1
fi
echo "## kernel bandwidth (ridge-gpu-kernel-bw 256 20)" >>"$report"
./build-gpu/bench/ridge-gpu-kernel-bw 256 20 | tee -a "$report"
echo "## LL vs bulk, one hop at small sizes (ridge-gpu-ll-lat 2000)" >>"$report"
./build-gpu/bench/ridge-gpu-ll-lat 2000 | tee -a "$report" || status=1
# The issue's figure: a 4-rank allreduce on the one GPU (Ridge on device buffers, P2P
# between the ranks' processes), and NCCL beside Ridge with as many ranks as GPUs (NCCL
# runs one rank per GPU).
echo "## 4 ranks on one GPU, device buffers" >>"$report"
RIDGE_SOCKET_IFNAME=lo ./build-gpu/bench/ridge-bench allreduce -np 4 --ridge-buffers device -b 1K -e 256M -f 4 \
  | tee -a "$report" || status=1
gpus=$(nvidia-smi -L | wc -l)
echo "## Ridge beside NCCL, $gpus rank(s), device buffers" >>"$report"
RIDGE_SOCKET_IFNAME=lo ./build-gpu/bench/ridge-bench allreduce -np "$gpus" --peer nccl --ridge-buffers device \
  -b 1K -e 256M -f 4 | tee -a "$report" || status=1
echo "## registers and spills per kernel (sm_90)" >>"$report"
for name in device_reduce ll_protocol; do
  obj=$(find build-gpu/kernels -name "$name.cu.o" | head -1)
  if [ -n "$obj" ] && command -v cuobjdump >/dev/null; then
    cuobjdump --dump-resource-usage "$obj" 2>/dev/null | grep -E "Function|REG|STACK" | head -40 >>"$report" || true
  fi
done
echo "report: $report"
exit $status
