// Host launchers for the device-side verbs subset (gdr_device.h) in real kernels. Built only
// in CUDA builds; tests/gpu/gdr_write_check uses them, and compiling gdr_kernels.cu for
// sm_80/sm_90 is what proves the shared header is valid device code.
#pragma once

#include <cuda_runtime.h>

#include "transports/gdr/gdr_device.h"

namespace ridge {
namespace gdr {

// Result word a kernel leaves for the host.
enum KernelStatus : int {
  kKernelOk = 0,
  kKernelCreditTimeout = 1,      // no staging or receiver credit within the spin budget
  kKernelCompletionTimeout = 2,  // the NIC did not retire the last send within the budget
};

// Sends `bytes` from `src` (device memory) as slots of at most ch.payloadCapacity: one block,
// its threads copy each slot's payload into staging, thread 0 posts the WQE and rings the
// doorbell (once per slot), then waits until the NIC retired the last one. `ch`, `st` and
// `ctr` hold device-visible pointers (mapped host memory). `spinLimit` bounds every wait.
cudaError_t launchGdrSend(const SendChannel& ch, SendState* st, Counters* ctr, const char* src, size_t bytes,
                          unsigned long long spinLimit, int* status, unsigned long long* cycles,
                          cudaStream_t stream);

// The device-side post of one slot whose payload is already in staging (the transport's
// kernel twin of GdrTransport::runDevicePost): seal (header, trailer), mlx5 WQE, doorbell
// record, UAR, on `stream`; one thread, no waiting (the host took the slot's credits). `shared`
// (mapped host memory) holds the send state, loaded at the start and stored back at the end,
// and postsRun, stored last after a system fence. `ch` holds the device's addresses.
cudaError_t launchGdrPost(const SendChannel& ch, ProducerShared* shared, uint32_t bytes, bool last,
                          cudaStream_t stream);
// Loads the gdr kernels into the current device (lazy module loading would load them at their
// first launch, which may wait for the device while a stream is parked: docs/gpu.md).
cudaError_t preloadGdrKernels();

// Posted-write bandwidth probe: `blocks` x `threads` copy `bytes` from device memory into
// mapped host memory `dst` `reps` times.
cudaError_t launchPostedWrites(char* dst, const char* src, size_t bytes, int reps, int blocks, int threads,
                               cudaStream_t stream);

}  // namespace gdr
}  // namespace ridge
