// Latency and bandwidth of one message hop through the LL protocol against the bulk
// kernels, at small sizes, on one GPU, in one run (tests/gpu/run.sh runs it).
//
//   ridge-gpu-ll-lat [iterations=2000]
//
// A hop moves a message from a source buffer into a destination buffer through an
// intermediate buffer that stands in for a peer's memory:
//   LL    the receiver kernel (stream A, launched first) spins on the lines that the sender
//         kernel (stream B) stores; the flags in the lines are the only synchronisation.
//   bulk  launchCopy into the intermediate buffer, then launchCopy out of it, on one
//         stream: stream order stands in for the flag a bulk protocol would need (so the
//         bulk figure is a lower bound: a real cross-GPU bulk hop adds a flag round trip).
// Both are timed with CUDA events over `iterations` back-to-back hops, after an untimed pass
// of the same size. Prints one line per size; exits 0 (a benchmark reports, it does not
// judge), 1 on a CUDA error or an LL receive that timed out, 3 without a CUDA device.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/device_reduce.h"
#include "kernels/ll_protocol.h"

namespace {

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "ridge-gpu-ll-lat: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

ridgeStream_t rs(cudaStream_t s) {
  return reinterpret_cast<ridgeStream_t>(s);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ridge;
  if (gpu::deviceCount() == 0) {
    std::printf("skipped: no CUDA device\n");
    return 3;
  }
  const int iters = argc > 1 ? std::atoi(argv[1]) : 2000;
  if (iters < 1 || iters > 1000000) {
    std::fprintf(stderr, "usage: ridge-gpu-ll-lat [iterations 1..1000000]\n");
    return 2;
  }
  constexpr size_t kMax = size_t(256) << 10;
  unsigned char *src = nullptr, *mid = nullptr, *dst = nullptr;
  ll::Line* lines = nullptr;
  int* timedOut = nullptr;
  cudaStream_t a = nullptr, b = nullptr;
  cudaEvent_t t0 = nullptr, t1 = nullptr, sent = nullptr, received = nullptr;
  if (!ok(cudaMalloc(&src, kMax), "cudaMalloc") || !ok(cudaMalloc(&mid, kMax), "cudaMalloc") ||
      !ok(cudaMalloc(&dst, kMax), "cudaMalloc") ||
      !ok(cudaMalloc(&lines, ll::linesFor(kMax) * sizeof(ll::Line)), "cudaMalloc") ||
      !ok(cudaMalloc(&timedOut, sizeof(int)), "cudaMalloc") ||
      !ok(cudaMemset(lines, 0, ll::linesFor(kMax) * sizeof(ll::Line)), "cudaMemset") ||
      !ok(cudaMemset(timedOut, 0, sizeof(int)), "cudaMemset") ||
      !ok(cudaMemset(src, 1, kMax), "cudaMemset") ||
      !ok(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), "cudaStreamCreate") ||
      !ok(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), "cudaStreamCreate") ||
      !ok(cudaEventCreate(&t0), "cudaEventCreate") || !ok(cudaEventCreate(&t1), "cudaEventCreate") ||
      !ok(cudaEventCreateWithFlags(&sent, cudaEventDisableTiming), "cudaEventCreate") ||
      !ok(cudaEventCreateWithFlags(&received, cudaEventDisableTiming), "cudaEventCreate"))
    return 1;
  // The kernels are loaded before any receiver spins: under lazy module loading the sender's
  // first launch could otherwise wait for the spinning receiver (kernels/device_reduce.h). The
  // setup above ran on the legacy stream, which the non-blocking streams do not wait for.
  if (const Status s = gpu::preloadKernels(); !s.isOk()) {
    std::fprintf(stderr, "ridge-gpu-ll-lat: %s\n", s.message().c_str());
    return 1;
  }
  if (!ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize")) return 1;
  std::printf("# one hop on one GPU, %d hops per size; bulk = two launchCopy on one stream (no flag)\n",
              iters);
  std::printf(
      "# each size runs once untimed first; both columns include the host's enqueue rate (4 API\n"
      "# calls per LL hop, 2 per bulk hop), so at small sizes they are launch-bound, not hop latency\n");
  std::printf("# %10s %12s %12s %10s %12s %12s\n", "bytes", "LL (us)", "bulk (us)", "bulk/LL", "LL (GB/s)",
              "bulk (GB/s)");
  uint64_t step = 0;
  // `hops` LL hops of `bytes`: every hop a fresh flag, so the receiver never takes the
  // previous hop's lines. One line buffer: the sender of hop i+1 must not overwrite lines the
  // receiver of hop i has not read yet, so each send waits for the previous receive (a real
  // protocol would rotate buffers with credits instead; this wait is inside the LL figure).
  // The time from t0 to t1 is in *ms.
  auto llHops = [&](size_t bytes, int hops, float* ms) {
    if (!ok(cudaEventRecord(t0, a), "cudaEventRecord") ||
        !ok(cudaEventRecord(received, a), "cudaEventRecord"))
      return false;
    for (int i = 0; i < hops; ++i) {
      const uint32_t flag = ll::flagForStep(++step);
      if (!ok(cudaStreamWaitEvent(b, received, 0), "cudaStreamWaitEvent") ||
          !gpu::launchLLRecv(dst, lines, bytes, flag, 5000000000ull, timedOut, rs(a)).isOk() ||
          !gpu::launchLLSend(lines, src, bytes, flag, rs(b)).isOk() ||
          !ok(cudaEventRecord(received, a), "record"))
        return false;
    }
    return ok(cudaEventRecord(sent, b), "cudaEventRecord") && ok(cudaStreamWaitEvent(a, sent, 0), "wait") &&
           ok(cudaEventRecord(t1, a), "cudaEventRecord") &&
           ok(cudaEventSynchronize(t1), "cudaEventSynchronize") &&
           ok(cudaEventElapsedTime(ms, t0, t1), "cudaEventElapsedTime");
  };
  auto bulkHops = [&](size_t bytes, int hops, float* ms) {
    if (!ok(cudaEventRecord(t0, a), "cudaEventRecord")) return false;
    for (int i = 0; i < hops; ++i)
      if (!gpu::launchCopy(mid, src, bytes, rs(a)).isOk() || !gpu::launchCopy(dst, mid, bytes, rs(a)).isOk())
        return false;
    return ok(cudaEventRecord(t1, a), "cudaEventRecord") &&
           ok(cudaEventSynchronize(t1), "cudaEventSynchronize") &&
           ok(cudaEventElapsedTime(ms, t0, t1), "cudaEventElapsedTime");
  };
  const int warmup = iters < 50 ? iters : 50;
  for (size_t bytes = 8; bytes <= kMax; bytes *= 4) {
    float llMs = 0, bulkMs = 0, untimed = 0;
    if (!llHops(bytes, warmup, &untimed) || !llHops(bytes, iters, &llMs) ||
        !bulkHops(bytes, warmup, &untimed) || !bulkHops(bytes, iters, &bulkMs))
      return 1;
    int to = 0;
    if (!ok(cudaMemcpy(&to, timedOut, sizeof to, cudaMemcpyDeviceToHost), "cudaMemcpy")) return 1;
    if (to) {
      std::fprintf(stderr, "ridge-gpu-ll-lat: an LL receive timed out at %zu bytes\n", bytes);
      return 1;
    }
    const double llUs = llMs * 1e3 / iters, bulkUs = bulkMs * 1e3 / iters;
    std::printf("  %10zu %12.2f %12.2f %10.2f %12.3f %12.3f\n", bytes, llUs, bulkUs, bulkUs / llUs,
                double(bytes) / (llUs * 1e3), double(bytes) / (bulkUs * 1e3));
  }
  return 0;
}
