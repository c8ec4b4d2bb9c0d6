// LL protocol kernels; see ll_protocol.h for the contract and ll_line.h for the line format.
//
// Lines are moved with one 16-byte volatile store and read with one 16-byte volatile load
// (st/ld.volatile.global.v4.u32): volatile so that every poll really goes to memory and the
// compiler keeps the stores in order; no fence is needed because the flags travel in the
// same 8-byte units as the data they vouch for. The PTX model guarantees only each 4-byte
// element of a vector access; that an aligned 8-byte half is seen whole is relied on, as
// NCCL's LL does with the same layout and accesses (docs/gpu.md, "LL protocol"). Each thread
// owns the lines i, i + stride, ... of the message, so there is no sharing and no
// synchronisation between threads.
#include <cuda_runtime.h>

#include <utility>

#include "kernels/device_ops.cuh"
#include "kernels/ll_protocol.h"
#include "reduce/reduce.h"

namespace ridge::gpu {
namespace {

using namespace ops;

__device__ inline void storeLine(ll::Line* p, const ll::Line& l) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(l.data0), "r"(l.flag0),
               "r"(l.data1), "r"(l.flag1)
               : "memory");
}

__device__ inline ll::Line loadLine(const ll::Line* p) {
  ll::Line l;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(l.data0), "=r"(l.flag0), "=r"(l.data1), "=r"(l.flag1)
               : "l"(p)
               : "memory");
  return l;
}

__device__ inline uint64_t globalNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Polls between looks at the clock and at the shared timeout word; and an upper bound on
// polls in case the global timer does not advance (every loop is bounded in count too).
constexpr uint32_t kPollsPerCheck = 256;
constexpr uint64_t kMaxPolls = uint64_t(1) << 36;

// Spins until line `p` carries `flag`. False when the wait timed out here or elsewhere.
__device__ inline bool waitLine(const ll::Line* p, uint32_t flag, uint64_t deadline, int* timedOut,
                                ll::Line* out) {
  for (uint64_t polls = 1; polls <= kMaxPolls; ++polls) {
    const ll::Line l = loadLine(p);
    if (ll::ready(l, flag)) {
      *out = l;
      return true;
    }
    if (polls % kPollsPerCheck == 0) {
      if (*static_cast<volatile int*>(timedOut)) return false;  // another thread gave up
      if (globalNs() > deadline) break;
    }
  }
  atomicExch_system(timedOut, 1);  // system scope: the host may read it while kernels run
  return false;
}

__global__ void __launch_bounds__(kLLThreads)
    llSendKernel(ll::Line* peer, const unsigned char* src, size_t bytes, uint32_t flag) {
  const size_t n = ll::linesFor(bytes);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    storeLine(peer + i, ll::encode(ll::loadPayload(src, bytes, i), flag));
}

__global__ void __launch_bounds__(kLLThreads)
    llRecvKernel(unsigned char* dst, const ll::Line* lines, size_t bytes, uint32_t flag, uint64_t timeoutNs,
                 int* timedOut) {
  const size_t n = ll::linesFor(bytes);
  const uint64_t deadline = globalNs() + timeoutNs;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    ll::Line l;
    if (!waitLine(lines + i, flag, deadline, timedOut, &l)) return;
    ll::storePayload(dst, bytes, i, ll::payloadOf(l));
  }
}

// 8 payload bytes as elements of T (every Ridge type divides 8).
template <typename T>
union Payload {
  uint64_t raw;
  T e[ll::kLinePayload / sizeof(T)];
};

template <typename T, ridgeRedOp_t Op>
__global__ void __launch_bounds__(kLLThreads)
    llRecvReduceSendKernel(ll::Line* next, T* dst, const ll::Line* lines, const T* mine, size_t count,
                           int divisor, uint32_t flagIn, uint32_t flagOut, uint64_t timeoutNs,
                           int* timedOut) {
  constexpr size_t kPer = ll::kLinePayload / sizeof(T);
  using R = Arith<T>;
  const size_t bytes = count * sizeof(T);
  const size_t n = ll::linesFor(bytes);
  const uint64_t deadline = globalNs() + timeoutNs;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    ll::Line l;
    if (!waitLine(lines + i, flagIn, deadline, timedOut, &l)) return;
    Payload<T> in, out;
    in.raw = ll::payloadOf(l);
    out.raw = 0;  // elements past the end stay zero: the padding of the last line
    const size_t first = i * kPer;
#pragma unroll
    for (size_t e = 0; e < kPer; ++e) {
      if (first + e >= count) break;
      out.e[e] = R::store(finish<Op>(combine<Op>(R::load(in.e[e]), R::load(mine[first + e])), divisor));
    }
    if (next) storeLine(next + i, ll::encode(out.raw, flagOut));
    if (dst) ll::storePayload(reinterpret_cast<unsigned char*>(dst), bytes, i, out.raw);
  }
}

// The device environment of the LL collective's per-line logic (ll_collective.h): 16-byte
// volatile line accesses, the bounded spin that also watches the communicator's status word
// (mapped host memory), and the element arithmetic of the reduce kernel.
template <typename T, ridgeRedOp_t Op>
struct DeviceLLEnv {
  volatile uint32_t* status;
  uint32_t statusBase;
  uint64_t deadline;

  __device__ void store(ll::Line* p, const ll::Line& l) const { storeLine(p, l); }

  // Stops the launch with statusBase + `code` (kMismatch); as a timeout, a plain store.
  __device__ void fail(uint32_t code) const {
    if (*status == statusBase) {
      *status = statusBase + code;
      __threadfence_system();
    }
  }

  __device__ bool wait(const ll::Line* p, uint32_t flag, ll::Line* out) const {
    for (uint64_t polls = 1; polls <= kMaxPolls; ++polls) {
      const ll::Line l = loadLine(p);
      if (ll::ready(l, flag)) {
        *out = l;
        return true;
      }
      if (polls % kPollsPerCheck == 0) {
        if (*status != statusBase) return false;  // timed out elsewhere, or aborted
        if (globalNs() > deadline) break;
      }
    }
    // A plain store, not an atomic: system-scope atomics on host memory need PCIe atomics.
    // A racing abort (kAborted) may be overwritten; either value stops every waiter.
    if (*status == statusBase) {
      *status = statusBase + ll::kTimedOut;
      __threadfence_system();
    }
    return false;
  }

  // op over the 8-byte payloads srcs[0..n), `elems` elements each, folded left to right in
  // the accumulation type and rounded once (the reduce kernel's arithmetic).
  __device__ uint64_t reduce(const uint64_t* srcs, int n, int elems, int divisor) const {
    using R = Arith<T>;
    Payload<T> out, in;
    out.raw = 0;
    for (int e = 0; e < elems; ++e) {
      in.raw = srcs[0];
      typename R::Acc acc = R::load(in.e[e]);
      for (int k = 1; k < n; ++k) {
        in.raw = srcs[k];
        acc = combine<Op>(acc, R::load(in.e[e]));
      }
      out.e[e] = R::store(finish<Op>(acc, divisor));
    }
    return out.raw;
  }
};

template <typename T, ridgeRedOp_t Op>
__global__ void __launch_bounds__(kLLThreads) llCollectiveKernel(const ll::Launch d) {
  const DeviceLLEnv<T, Op> env{reinterpret_cast<volatile uint32_t*>(d.statusWord), d.statusBase,
                               globalNs() + d.timeoutNs};
  const size_t n = ll::messageLines(d);
  const size_t first = blockIdx.x * size_t(blockDim.x) + threadIdx.x, stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = first; i < n; i += stride) ll::sendLine(d, i, env);
  for (size_t i = first; i < n; i += stride)
    if (!ll::receiveLine(d, i, env)) return;
}

// Launches `kernel` with `blocks` x kLLThreads on `stream` and returns this launch's own error.
// Not <<<>>> then cudaGetLastError: the LL collectives launch on the caller's thread, and
// cudaGetLastError would also return (and clear) an error an earlier launch of the caller
// left pending there, blaming Ridge and breaking the communicator for the caller's mistake.
template <typename... Params, typename... Args>
cudaError_t launchKernel(void (*kernel)(Params...), int blocks, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(kLLThreads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

template <typename T, ridgeRedOp_t Op>
struct CollectiveLauncher {
  static cudaError_t run(const ll::Launch& d, int blocks, cudaStream_t stream) {
    return launchKernel(llCollectiveKernel<T, Op>, blocks, stream, d);
  }
};

template <typename T, ridgeRedOp_t Op>
struct CollectiveLoader {
  static cudaError_t run() { return loadKernel(llCollectiveKernel<T, Op>); }
};

template <typename T, ridgeRedOp_t Op>
struct FusedLauncher {
  static cudaError_t run(ll::Line* next, void* dst, const ll::Line* lines, const void* mine, size_t count,
                         int divisor, uint32_t flagIn, uint32_t flagOut, uint64_t timeoutNs, int* timedOut,
                         int blocks, cudaStream_t stream) {
    return launchKernel(llRecvReduceSendKernel<T, Op>, blocks, stream, next, static_cast<T*>(dst), lines,
                        static_cast<const T*>(mine), count, divisor, flagIn, flagOut, timeoutNs, timedOut);
  }
};

template <typename T, ridgeRedOp_t Op>
struct FusedLoader {
  static cudaError_t run() { return loadKernel(llRecvReduceSendKernel<T, Op>); }
};

int blocksFor(size_t lines, int blocks) {
  if (blocks > 0) return blocks;
  const size_t want = (lines + kLLThreads - 1) / kLLThreads;
  return want < 1 ? 1 : want > size_t(kLLDefaultBlocks) ? kLLDefaultBlocks : static_cast<int>(want);
}

Status launched(const char* what, cudaError_t err) {
  if (err != cudaSuccess)
    return makeError(ridgeSystemError, "%s: kernel launch failed: %s", what, cudaGetErrorString(err));
  return Status::ok();
}

cudaStream_t cudaStreamOf(ridgeStream_t s) {
  return reinterpret_cast<cudaStream_t>(s);
}

}  // namespace

const void* llModuleAnchor() {
  return reinterpret_cast<const void*>(llSendKernel);
}

Status preloadLLKernels(int* loaded) {
  cudaError_t err = loadKernel(llSendKernel);
  if (err == cudaSuccess) {
    ++*loaded;
    err = loadKernel(llRecvKernel);
  }
  if (err == cudaSuccess) {
    ++*loaded;
    err = loadForEveryTypeAndOp<FusedLoader>(loaded);
  }
  if (err == cudaSuccess) err = loadForEveryTypeAndOp<CollectiveLoader>(loaded);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return makeError(ridgeSystemError, "loading the LL kernels: %s", cudaGetErrorString(err));
  }
  return Status::ok();
}

Status launchLLSend(ll::Line* peerLines, const void* src, size_t bytes, uint32_t flag, ridgeStream_t stream,
                    int blocks) {
  if (!peerLines || !src) return makeError(ridgeInvalidArgument, "launchLLSend: null pointer");
  if (flag == 0)
    return makeError(ridgeInvalidArgument, "launchLLSend: flag 0 is what an unused buffer holds");
  if (bytes == 0) return Status::ok();
  return launched("launchLLSend",
                  launchKernel(llSendKernel, blocksFor(ll::linesFor(bytes), blocks), cudaStreamOf(stream),
                               peerLines, static_cast<const unsigned char*>(src), bytes, flag));
}

Status launchLLRecv(void* dst, const ll::Line* lines, size_t bytes, uint32_t flag, uint64_t timeoutNs,
                    int* timedOut, ridgeStream_t stream, int blocks) {
  if (!dst || !lines || !timedOut) return makeError(ridgeInvalidArgument, "launchLLRecv: null pointer");
  if (flag == 0)
    return makeError(ridgeInvalidArgument, "launchLLRecv: flag 0 is what an unused buffer holds");
  if (bytes == 0) return Status::ok();
  return launched("launchLLRecv",
                  launchKernel(llRecvKernel, blocksFor(ll::linesFor(bytes), blocks), cudaStreamOf(stream),
                               static_cast<unsigned char*>(dst), lines, bytes, flag, timeoutNs, timedOut));
}

Status launchLLRecvReduceSend(ll::Line* nextLines, void* dst, const ll::Line* lines, const void* mine,
                              size_t count, ridgeDataType_t type, ridgeRedOp_t op, int finalDivisor,
                              uint32_t flagIn, uint32_t flagOut, uint64_t timeoutNs, int* timedOut,
                              ridgeStream_t stream, int blocks) {
  if (!lines || !mine || !timedOut || (!nextLines && !dst))
    return makeError(ridgeInvalidArgument, "launchLLRecvReduceSend: null pointer (or neither next nor dst)");
  if (!validType(type) || !validOp(op))
    return makeError(ridgeInvalidArgument, "launchLLRecvReduceSend: invalid data type %d or op %d",
                     static_cast<int>(type), static_cast<int>(op));
  if (flagIn == 0 || (nextLines && flagOut == 0))
    return makeError(ridgeInvalidArgument, "launchLLRecvReduceSend: flag 0 is what an unused buffer holds");
  if (count == 0) return Status::ok();
  const int grid = blocksFor(ll::linesFor(count * dataTypeSize(type)), blocks);
  const cudaError_t err =
      withTypeAndOp<FusedLauncher>(type, op, nextLines, dst, lines, mine, count, finalDivisor, flagIn,
                                   flagOut, timeoutNs, timedOut, grid, cudaStreamOf(stream));
  if (err != cudaSuccess)
    return makeError(ridgeSystemError, "launchLLRecvReduceSend: kernel launch failed: %s",
                     cudaGetErrorString(err));
  return Status::ok();
}

Status launchLLCollective(const ll::Launch& d, ridgeStream_t stream, int blocks) {
  if (d.nranks < 2 || d.nranks > ll::kMaxRanks || d.rank < 0 || d.rank >= d.nranks || d.statusWord == 0)
    return makeError(ridgeInvalidArgument, "launchLLCollective: bad descriptor (rank %d of %d)", d.rank,
                     d.nranks);
  if (d.flag == 0)
    return makeError(ridgeInvalidArgument, "launchLLCollective: flag 0 is what an unused buffer holds");
  const ridgeDataType_t type = static_cast<ridgeDataType_t>(d.type);
  const ridgeRedOp_t op = static_cast<ridgeRedOp_t>(d.op);
  const bool reduces = d.kind == ll::CollKind::AllReduce || d.kind == ll::CollKind::ReduceScatter ||
                       d.kind == ll::CollKind::Reduce;
  if (reduces && (!validType(type) || !validOp(op)))
    return makeError(ridgeInvalidArgument, "launchLLCollective: invalid data type %d or op %d", d.type, d.op);
  const size_t lines = ll::messageLines(d);
  if (lines == 0) return Status::ok();
  const int grid = blocksFor(lines, blocks);
  return launched("launchLLCollective",
                  reduces ? withTypeAndOp<CollectiveLauncher>(type, op, d, grid, cudaStreamOf(stream))
                          : CollectiveLauncher<uint8_t, ridgeSum>::run(d, grid, cudaStreamOf(stream)));
}

}  // namespace ridge::gpu
