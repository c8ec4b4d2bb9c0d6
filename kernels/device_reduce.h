// Copy and element-wise reduction on GPU memory, launched on a CUDA stream: the arithmetic
// of the GPU data path, with the same semantics as the host kernels in src/reduce/reduce.h
// (fold order, fp16/bf16 accumulated in fp32 and rounded once, integer wrap-around, NaN
// and signed-zero rules of max/min, avg with a final divisor), so a host reference checks
// them bit for bit.
//
// Only compiled when Ridge is built with CUDA (RIDGE_HAVE_CUDA). The functions enqueue and
// return; completion is observed on the stream.
#pragma once

#include <cstddef>

#include "core/status.h"
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

/// Number of CUDA devices this process sees; 0 when there is no device or driver (never an
/// error: a CUDA build must run on machines without a GPU).
int deviceCount();

}  // namespace ridge::gpu
