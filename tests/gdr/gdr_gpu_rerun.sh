#!/usr/bin/env bash
# The GPU checks of the gdr17 work (collectives on device buffers, doorbell rungs, the move of
# gdr_device.h and its kernels to transports/gdr/), for a lent GPU machine:
#   tests/gdr/gdr_gpu_rerun.sh [BUILD_DIR]
# Builds (CUDA, Release) only the three binaries in BUILD_DIR (default build-gdr-cuda), then
#   1. ridge-gdr-write-check: the moved kernels (ridge_gdr_kernels) write mlx5 WQEs, ring the
#      software NIC's UAR mapped into the GPU, data intact (as tests/gpu/gdr_write_check.sh);
#   2. test_verbs_ladder: with the CUDA runtime present, the fake-NIC doorbell-rung tests (the
#      emulated runtime as their GPU), the probe with CUDA, and the runs over RIDGE_NET=verbs
#      where the CUDA runtime is the active one (device producer not offered: CPU posts);
#   3. ridge_gdr_device_buffer_test: device collectives through the device-side producer on
#      the emulated runtime, read slots through dma-buf, beside a real CUDA runtime.
# Every step bounded (timeout); exit status 0 when all passed, 1 otherwise, 3 without a GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-gdr-cuda}
export PATH=/usr/local/cuda/bin:$PATH
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no CUDA device"
  exit 3
fi
cmake -S . -B "$BUILD" -G Ninja -DRIDGE_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null || exit 1
ninja -C "$BUILD" -j"$(nproc)" ridge-gdr-write-check test_verbs_ladder ridge_gdr_device_buffer_test >/dev/null ||
  exit 1
export RIDGE_SOCKET_IFNAME=${RIDGE_SOCKET_IFNAME:-lo}
status=0
for step in "$BUILD/tests/gdr/ridge-gdr-write-check" "$BUILD/tests/verbs/test_verbs_ladder" \
            "$BUILD/tests/gdr/ridge_gdr_device_buffer_test"; do
  echo "== $step"
  timeout 120 "$step" 2>&1 | grep -vE "RIDGE INFO" | tail -25
  rc=${PIPESTATUS[0]}
  echo "== $step: exit $rc"
  [ "$rc" -eq 0 ] || status=1
done
exit $status
