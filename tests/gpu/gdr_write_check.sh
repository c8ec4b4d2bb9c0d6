#!/usr/bin/env bash
# GDR-write on a real GPU against the software NIC, one command:
#   tests/gpu/gdr_write_check.sh
# Builds with CUDA in build-gdr-cuda/, then runs ridge-gdr-write-check: a CUDA kernel writes the
# payload into mapped pinned host memory (standing in for NIC staging), builds the WQEs and
# rings the softnic doorbell page mapped into the GPU; the softnic sends the slots to a second
# rank, which checks every byte. Prints posted-write bandwidth and doorbell-to-completion time.
# Exit status: 0 passed, 1 failed, 3 no CUDA device ("skipped: no CUDA device").
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "skipped: no CUDA toolkit"
  exit 3
fi
export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B build-gdr-cuda -G Ninja -DRIDGE_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build-gdr-cuda -j"$(nproc)" ridge-gdr-write-check >/dev/null
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no CUDA device"
  exit 3
fi
RIDGE_SOCKET_IFNAME=${RIDGE_SOCKET_IFNAME:-lo} exec ./build-gdr-cuda/tests/gdr/ridge-gdr-write-check
