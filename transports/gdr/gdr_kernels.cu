// The device-side verbs subset (gdr_device.h) instantiated in real kernels, so that CUDA
// builds compile it for sm_80/sm_90 and the GPU check (tests/gpu/gdr_write_check.sh) runs it.
#include "transports/gdr/gdr_kernels.h"

namespace ridge {
namespace gdr {
namespace {

__global__ void gdrSendKernel(SendChannel ch, SendState* st, Counters* ctr, const char* src, size_t bytes,
                              unsigned long long spinLimit, int* status, unsigned long long* cycles) {
  __shared__ char* slot;
  __shared__ int failed;
  const long long t0 = clock64();
  if (threadIdx.x == 0) failed = 0;
  size_t done = 0;
  bool first = true;
  while (done < bytes || first) {
    first = false;
    const uint32_t chunk =
        static_cast<uint32_t>(bytes - done < ch.payloadCapacity ? bytes - done : ch.payloadCapacity);
    if (threadIdx.x == 0) {
      slot = nullptr;
      for (unsigned long long spin = 0; spin < spinLimit && slot == nullptr; ++spin)
        slot = tryAcquireSlot(ch, st, ctr);
      if (slot == nullptr) failed = kKernelCreditTimeout;
    }
    __syncthreads();
    if (failed) break;
    writeStaging(slot, src + done, chunk, threadIdx.x, blockDim.x);
    __syncthreads();
    if (threadIdx.x == 0) {
      postSlot(ch, st, chunk, done + chunk == bytes, ctr);
      flushDoorbell(ch, st, ctr);
      ctr->devicePosts += 1;
    }
    __syncthreads();
    done += chunk;
  }
  if (threadIdx.x == 0) {
    if (!failed) {
      // Completion: the NIC retires the last WQE once the target acknowledged it.
      unsigned long long spin = 0;
      // (the last slot of a message asks for a CQE, so it reports.)
      while (spin < spinLimit) {
        pollSendCq(ch, st, ctr);
        if (st->retired == st->pi) break;
        ++spin;
      }
      if (spin == spinLimit) failed = kKernelCompletionTimeout;
    }
    *status = failed;
    *cycles = static_cast<unsigned long long>(clock64() - t0);
  }
}

__global__ void gdrPostKernel(SendChannel ch, ProducerShared* shared, uint32_t bytes, int last) {
  // Local copies: the state is read once (mapped host memory) and written back once.
  SendState st = shared->st;
  Counters ctr{};
  postSlot(ch, &st, bytes, last != 0, &ctr);
  flushDoorbell(ch, &st, &ctr);
  ctr.devicePosts = 1;
  shared->st = st;
  shared->ctr.slotsWritten += ctr.slotsWritten;
  shared->ctr.creditsConsumed += ctr.creditsConsumed;
  shared->ctr.doorbells += ctr.doorbells;
  shared->ctr.remoteReads += ctr.remoteReads;
  shared->ctr.devicePosts += ctr.devicePosts;
  __threadfence_system();  // the state before the word the host waits on
  storeVolatile64(&shared->postsRun, shared->postsRun + 1);
  __threadfence_system();
}

__global__ void postedWriteKernel(char* dst, const char* src, size_t bytes, int reps) {
  const unsigned lanes = gridDim.x * blockDim.x;
  const unsigned lane = blockIdx.x * blockDim.x + threadIdx.x;
  for (int r = 0; r < reps; ++r) writeStaging(dst, src, bytes, lane, lanes);
  __threadfence_system();
}

}  // namespace

cudaError_t launchGdrSend(const SendChannel& ch, SendState* st, Counters* ctr, const char* src, size_t bytes,
                          unsigned long long spinLimit, int* status, unsigned long long* cycles,
                          cudaStream_t stream) {
  gdrSendKernel<<<1, 256, 0, stream>>>(ch, st, ctr, src, bytes, spinLimit, status, cycles);
  return cudaGetLastError();
}

cudaError_t launchGdrPost(const SendChannel& ch, ProducerShared* shared, uint32_t bytes, bool last,
                          cudaStream_t stream) {
  gdrPostKernel<<<1, 1, 0, stream>>>(ch, shared, bytes, last ? 1 : 0);
  return cudaGetLastError();
}

cudaError_t preloadGdrKernels() {
  cudaFuncAttributes a;
  cudaError_t e = cudaFuncGetAttributes(&a, gdrPostKernel);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, gdrSendKernel);
  return e;
}

cudaError_t launchPostedWrites(char* dst, const char* src, size_t bytes, int reps, int blocks, int threads,
                               cudaStream_t stream) {
  postedWriteKernel<<<blocks, threads, 0, stream>>>(dst, src, bytes, reps);
  return cudaGetLastError();
}

}  // namespace gdr
}  // namespace ridge
