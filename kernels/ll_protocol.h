// The low-latency (LL) small-message protocol on the GPU: a sender stores 16-byte lines
// (8 payload bytes + the step's flag twice, see ll_line.h) straight into a buffer its peer
// can read (peer GPU memory, or mapped host memory); the receiver spins on each line until
// both flags equal the step's flag, then uses the payload. One message costs one write
// latency, with no separate flag write, no fence and no polling of a counter, which is what
// matters below a few KiB; above that the bulk kernels (device_reduce.h) win because LL
// carries 8 payload bytes per 16 written.
//
// Waits are bounded: a receiver that has not seen its line after `timeoutNs` nanoseconds
// (the GPU's global timer) sets *timedOut (an int the host can read: mapped host memory
// or device memory) and gives up; the other threads see the word and give up too. The
// host checks the word after the stream has run the kernel.
//
// Only compiled in CUDA builds (RIDGE_HAVE_CUDA). Functions enqueue on `stream` and return.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "kernels/ll_collective.h"
#include "kernels/ll_line.h"
#include "ridge/ridge.h"

namespace ridge::gpu {

/// Default blocks of an LL launch (256 threads each; one line per thread per pass): enough
/// for a 64 KiB message in one pass, and few enough that a small message does not pay for
/// launching idle blocks. `blocks` 0 picks min(this, lines / 256 rounded up).
constexpr int kLLDefaultBlocks = 32;
constexpr int kLLThreads = 256;

/// Stores `bytes` bytes of `src` as linesFor(bytes) lines carrying `flag` at `peerLines`.
Status launchLLSend(ll::Line* peerLines, const void* src, size_t bytes, uint32_t flag, ridgeStream_t stream,
                    int blocks = 0);

/// Waits for linesFor(bytes) lines with `flag` at `lines` and copies their payload to `dst`.
/// On timeout sets *timedOut to 1; dst then holds whatever lines had arrived.
Status launchLLRecv(void* dst, const ll::Line* lines, size_t bytes, uint32_t flag, uint64_t timeoutNs,
                    int* timedOut, ridgeStream_t stream, int blocks = 0);

/// One fused ring step: waits for the previous rank's lines (flag `flagIn`) at `lines`,
/// reduces each element as op(received, mine[i]) (received first: the fold order of a ring
/// that starts at rank 0), divides by finalDivisor when it is > 0 (the last step of avg),
/// and stores the result as lines with `flagOut` at `nextLines` (the next rank's buffer;
/// null on the last step) and as plain elements at `dst` (null when not wanted). `count`
/// elements of `type`.
Status launchLLRecvReduceSend(ll::Line* nextLines, void* dst, const ll::Line* lines, const void* mine,
                              size_t count, ridgeDataType_t type, ridgeRedOp_t op, int finalDivisor,
                              uint32_t flagIn, uint32_t flagOut, uint64_t timeoutNs, int* timedOut,
                              ridgeStream_t stream, int blocks = 0);

/// One LL collective (kernels/ll_collective.h), fused into one kernel: each thread sends its
/// lines of the message to every peer, then waits for every peer's same lines and stores
/// its output lines (copies, or the reduction in the bulk path's fold order). Gives up when
/// a wait passes d.timeoutNs (writing d.statusBase + ll::kTimedOut into the status word) or
/// finds the word set (abort). Reductions dispatch on d.type and d.op; the other collectives
/// use one instantiation.
Status launchLLCollective(const ll::Launch& d, ridgeStream_t stream, int blocks = 0);

/// Kernel instantiations preloadLLKernels loads: send, receive, and the fused step and the
/// collective for every type and op.
constexpr int kLLPreloadedKernels = 2 + 2 * int{ridgeNumTypes} * int{ridgeNumOps};

/// Loads the LL kernels (kLLPreloadedKernels of them) into the current device context; part
/// of preloadKernels (device_reduce.h). *loaded: how many.
Status preloadLLKernels(int* loaded);

/// One kernel of this file's CUDA module (the send kernel), for preloadedModuleAnchors.
const void* llModuleAnchor();

}  // namespace ridge::gpu
