// Copy and element-wise reduction on GPU memory, launched on a CUDA stream: the arithmetic
// of the GPU data path, with the same semantics as the host kernels in src/reduce/reduce.h
// (fold order, fp16/bf16 accumulated in fp32 and rounded once, integer wrap-around, NaN
// and signed-zero rules of max/min, avg with a final divisor), so a host reference checks
// them bit for bit, NaN payloads aside (the GPU's float arithmetic returns its one canonical
// NaN where the host keeps the input's payload; both are NaN).
//
// Only compiled when Ridge is built with CUDA (RIDGE_HAVE_CUDA). The functions enqueue and
// return; completion is observed on the stream.
#pragma once

#include <cstddef>

#include "core/status.h"
#include "kernels/channel_partition.h"
#include "kernels/ll_protocol.h"
#include "ridge/ridge.h"

namespace ridge::gpu {

/// Most sources one launch folds; an algorithm with more inputs chains launches.
constexpr int kMaxReduceSources = 8;

/// dst[i] = op(srcs[0][i], ..., srcs[nsrcs-1][i]) for i < count, on `stream`. Every pointer
/// must be device-accessible (device, managed or mapped pinned host memory). dst may equal
/// a source. `maxBlocks` 0 picks a grid that fills the device; tests pass small values to
/// exercise the grid-stride loop.
Status launchReduce(void* dst, const void* const* srcs, int nsrcs, size_t count, ridgeDataType_t type,
                    ridgeRedOp_t op, int finalDivisor, ridgeStream_t stream, int maxBlocks = 0);

/// dst[0..bytes) = src[0..bytes) with the same vectorised loop (for copies inside a fused
/// pipeline; plain transfers use the copy engines).
Status launchCopy(void* dst, const void* src, size_t bytes, ridgeStream_t stream, int maxBlocks = 0);

/// Launch geometry of the bulk kernels with channels. The buffer is cut into `channels`
/// contiguous slices of whole 16-byte vectors; each slice is worked by its own
/// `blocksPerChannel` blocks of 512 threads (a channel is not limited to one block, as it is
/// in NCCL's kernels: one block of 512 threads cannot keep enough loads in flight to reach
/// HBM bandwidth on its own). blocksPerChannel 0 is the default: the blocks that fill the
/// device (4 resident 512-thread blocks per SM, so 528 on an H100 SXM) shared out over the
/// channels, and never more blocks than the slice has 512-vector strips (no idle blocks).
/// The arithmetic (planChannels, channelRange) is in kernels/channel_partition.h.
struct LaunchShape {
  int channels = 1;
  int blocksPerChannel = 0;
};

/// launchReduce with an explicit channel shape (channels 1 to kMaxChannels; more are
/// clamped, and never more channels than vectors).
Status launchReduceChannels(void* dst, const void* const* srcs, int nsrcs, size_t count, ridgeDataType_t type,
                            ridgeRedOp_t op, int finalDivisor, ridgeStream_t stream, LaunchShape shape);

/// launchCopy with an explicit channel shape. Buffers that are not 16-byte aligned are
/// copied bytewise by one channel.
Status launchCopyChannels(void* dst, const void* src, size_t bytes, ridgeStream_t stream, LaunchShape shape);

/// Kernel instantiations preloadKernels loads: the reduce kernel for every type and op, the
/// copy kernel and the LL kernels (kLLPreloadedKernels, ll_protocol.h). That is every kernel
/// Ridge's library code launches here (the gdr kernels, transports/gdr/gdr_kernels.cu, are a
/// module of their own that the gdr transport preloads itself, preloadGdrKernels; its post
/// kernel never waits). Derived from the type and op
/// counts, so a new type or op cannot leave it stale; a new kernel must be added to the
/// preload and here, and the GPU test that enumerates the modules' functions
/// (preloadedModuleAnchors) fails until it is.
constexpr int kPreloadedKernels = int{ridgeNumTypes} * int{ridgeNumOps} + 1 + kLLPreloadedKernels;

/// One kernel of each CUDA module (one per .cu file: device_reduce.cu, ll_protocol.cu) whose
/// kernels preloadKernels loads, as the host-side entry symbols cudaGetFuncBySymbol takes.
/// A test finds each module from them and checks that the functions the modules hold are
/// exactly the kPreloadedKernels that preloadKernels loads. Writes at most `max`; returns
/// how many there are.
int preloadedModuleAnchors(const void** out, int max);

/// Loads every kernel of this library into the calling thread's current device context
/// (cudaFuncGetAttributes on each instantiation, which the CUDA Programming Guide names as
/// the way to force a lazily loaded kernel in). Why: with lazy module loading (the Linux
/// default since CUDA 12.2) a kernel is loaded at its first launch, and loading may wait for
/// the device to synchronize; a first launch while a stream is parked on a release word, or
/// while an LL receiver spins for a sender not yet loaded, would then never return. Call it
/// before anything can park or spin. *loaded (optional): instantiations loaded, which is
/// kPreloadedKernels on success. Idempotent; costs one driver call per kernel.
Status preloadKernels(int* loaded = nullptr);

/// Number of CUDA devices this process sees; 0 when there is no device or driver (never an
/// error: a CUDA build must run on machines without a GPU).
int deviceCount();

}  // namespace ridge::gpu
