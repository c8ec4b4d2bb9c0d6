// Bandwidth of Ridge's GPU reduce kernel against the same GPU's device-to-device copy, in
// one run: issue 7's target is reduce >= 90% of copy for >= 64 MiB, counting bytes read
// plus written (copy: 2N per N-byte buffer; 2-source reduce: 3N).
//
//   ridge-gpu-kernel-bw [MiB=256] [iterations=20]
//
// Prints one line per dtype and the ratio; exits 0 (a benchmark reports, it does not judge),
// or 3 when there is no CUDA device.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/device_reduce.h"
#include "reduce/reduce.h"

static double timeMs(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  return ms;
}

int main(int argc, char** argv) {
  if (ridge::gpu::deviceCount() == 0) {
    std::printf("skipped: no CUDA device\n");
    return 3;
  }
  const size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 256;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 20;
  const size_t bytes = mib << 20;
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  void *a = nullptr, *b = nullptr, *c = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess ||
      cudaMalloc(&c, bytes) != cudaSuccess) {
    std::printf("cannot allocate 3 x %zu MiB\n", mib);
    return 1;
  }
  cudaMemset(a, 0, bytes);
  cudaMemset(b, 0, bytes);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  // Copy-engine and kernel copies: the larger is the ceiling.
  cudaMemcpyAsync(c, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e0);
  for (int i = 0; i < iters; ++i) cudaMemcpyAsync(c, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  const double copyGBs = 2.0 * bytes * iters / (timeMs(e0, e1) * 1e6);
  std::printf("# %s, %zu MiB buffers, %d iterations; GB/s count bytes read + written\n", prop.name, mib,
              iters);
  std::printf("%-10s %12s %12s %8s\n", "kernel", "GB/s", "copy GB/s", "ratio");
  std::printf("%-10s %12.1f %12.1f %8.3f\n", "memcpyD2D", copyGBs, copyGBs, 1.0);
  (void)ridge::gpu::launchCopy(c, a, bytes, nullptr);
  cudaEventRecord(e0);
  for (int i = 0; i < iters; ++i) (void)ridge::gpu::launchCopy(c, a, bytes, nullptr);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  const double kcopy = 2.0 * bytes * iters / (timeMs(e0, e1) * 1e6);
  std::printf("%-10s %12.1f %12.1f %8.3f\n", "copy", kcopy, copyGBs, kcopy / copyGBs);
  const ridgeDataType_t types[] = {ridgeFloat32, ridgeFloat16, ridgeBfloat16, ridgeFloat64, ridgeInt32};
  for (ridgeDataType_t t : types) {
    const size_t count = bytes / ridge::dataTypeSize(t);
    const void* srcs[2] = {a, b};
    (void)ridge::gpu::launchReduce(c, srcs, 2, count, t, ridgeSum, 0, nullptr);
    cudaEventRecord(e0);
    for (int i = 0; i < iters; ++i)
      (void)ridge::gpu::launchReduce(c, srcs, 2, count, t, ridgeSum, 0, nullptr);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    const double gbs = 3.0 * bytes * iters / (timeMs(e0, e1) * 1e6);
    std::printf("sum/%-6s %12.1f %12.1f %8.3f\n", ridge::dataTypeName(t), gbs, copyGBs, gbs / copyGBs);
  }
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(err));
    return 1;
  }
  return 0;
}
