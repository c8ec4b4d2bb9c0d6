// GPU copy and reduction kernels. See device_reduce.h for the semantics; they follow
// src/reduce/reduce.h exactly so that one host reference checks both.
//
// Shape: a grid-stride loop over 16-byte vectors (one 128-bit load per source and one
// store per vector: the widest access a thread can issue, so a warp moves 512 contiguous
// bytes per instruction), unrolled so each thread keeps several independent loads in
// flight, which is what it takes to approach DRAM bandwidth on A100/H100. Elements that
// do not fill a vector, and buffers that are not 16-byte aligned, take a scalar loop.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/device_ops.cuh"
#include "kernels/device_reduce.h"
#include "kernels/ll_protocol.h"

namespace ridge::gpu {
namespace {

using namespace ops;

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // vectors per thread per iteration: independent loads in flight

struct Sources {
  const void* ptr[kMaxReduceSources];
};

template <typename T, ridgeRedOp_t Op>
__device__ inline T reduceElement(const Sources& s, int nsrcs, size_t i, int divisor) {
  using R = Arith<T>;
  typename R::Acc acc = R::load(static_cast<const T*>(s.ptr[0])[i]);
  for (int k = 1; k < nsrcs; ++k) acc = combine<Op>(acc, R::load(static_cast<const T*>(s.ptr[k])[i]));
  return R::store(finish<Op>(acc, divisor));
}

// One 16-byte vector: load it from every source as a union of elements, fold, store.
template <typename T>
union Vec {
  uint4 raw;
  T e[16 / sizeof(T)];
};

// The part of a launch one block works on. The grid is `channels` groups of
// gridDim.x / channels blocks; group c owns the slice channelRange gives it (the last one
// runs to the end of the buffer, tail elements included) and strides over it with its own
// blocks only, so channels never share a cache line and each can be given several blocks.
struct Slice {
  size_t begin, end;   // units of the whole buffer
  size_t tid, stride;  // this thread's index and the stride within its channel
};
__device__ inline Slice channelSlice(size_t total, size_t perSlice, int channels) {
  const unsigned bpc = gridDim.x / static_cast<unsigned>(channels);
  const SliceRange r = channelRange(blockIdx.x / bpc, channels, total, perSlice);
  return {r.begin, r.end, static_cast<size_t>(blockIdx.x % bpc) * blockDim.x + threadIdx.x,
          static_cast<size_t>(bpc) * blockDim.x};
}

template <typename T, ridgeRedOp_t Op>
__global__ void __launch_bounds__(kThreads)
    reduceKernel(T* __restrict__ dstAll, Sources srcsAll, int nsrcs, size_t countAll, int divisor,
                 bool vectorOk, int channels, size_t sliceElems) {
  constexpr int kPerVec = 16 / sizeof(T);
  using R = Arith<T>;
  // sliceElems is a whole number of vectors, so every slice keeps the buffers' alignment.
  const Slice sl = channelSlice(countAll, sliceElems, channels);
  T* dst = dstAll + sl.begin;
  Sources srcs;
  for (int k = 0; k < nsrcs; ++k) srcs.ptr[k] = static_cast<const T*>(srcsAll.ptr[k]) + sl.begin;
  const size_t count = sl.end - sl.begin;
  const size_t stride = sl.stride;
  const size_t tid = sl.tid;
  size_t scalarFrom = 0;
  if (vectorOk) {
    const size_t nvec = count / kPerVec;
    // Main body: kUnroll vectors per thread, loads of all of them issued before any math.
    size_t v = tid;
    for (; v + (kUnroll - 1) * stride < nvec; v += kUnroll * stride) {
      Vec<T> acc[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) acc[u].raw = static_cast<const uint4*>(srcs.ptr[0])[v + u * stride];
      typename R::Acc a[kUnroll][kPerVec];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int e = 0; e < kPerVec; ++e) a[u][e] = R::load(acc[u].e[e]);
      for (int k = 1; k < nsrcs; ++k) {
        Vec<T> in[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) in[u].raw = static_cast<const uint4*>(srcs.ptr[k])[v + u * stride];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
#pragma unroll
          for (int e = 0; e < kPerVec; ++e) a[u][e] = combine<Op>(a[u][e], R::load(in[u].e[e]));
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        Vec<T> out;
#pragma unroll
        for (int e = 0; e < kPerVec; ++e) out.e[e] = R::store(finish<Op>(a[u][e], divisor));
        reinterpret_cast<uint4*>(dst)[v + u * stride] = out.raw;
      }
    }
    // Remaining whole vectors, one per thread.
    for (; v < nvec; v += stride) {
      for (int e = 0; e < kPerVec; ++e) {
        const size_t i = v * kPerVec + e;
        dst[i] = reduceElement<T, Op>(srcs, nsrcs, i, divisor);
      }
    }
    scalarFrom = nvec * kPerVec;
  }
  for (size_t i = scalarFrom + tid; i < count; i += stride)
    dst[i] = reduceElement<T, Op>(srcs, nsrcs, i, divisor);
}

__global__ void __launch_bounds__(kThreads)
    copyKernel(uint4* __restrict__ dstAll, const uint4* __restrict__ srcAll, size_t nvecAll,
               unsigned char* dstTail, const unsigned char* srcTail, size_t tailBytes, int channels,
               size_t sliceVecs) {
  const Slice sl = channelSlice(nvecAll, sliceVecs, channels);
  uint4* dst = dstAll + sl.begin;
  const uint4* src = srcAll + sl.begin;
  const size_t nvec = sl.end - sl.begin;
  const size_t stride = sl.stride;
  const size_t tid = sl.tid;
  size_t v = tid;
  for (; v + (kUnroll - 1) * stride < nvec; v += kUnroll * stride) {
    uint4 r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) r[u] = src[v + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[v + u * stride] = r[u];
  }
  for (; v < nvec; v += stride) dst[v] = src[v];
  if (blockIdx.x / (gridDim.x / channels) == static_cast<unsigned>(channels) - 1)  // the last channel
    for (size_t i = tid; i < tailBytes; i += stride) dstTail[i] = srcTail[i];
}

// Blocks that fill the device: 4 resident blocks of 512 threads per SM, full occupancy on
// sm_80/90 (108 SMs assumed when the device cannot be asked).
int fillBlocks() {
  static int fill = [] {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      sms = 108;
    }
    return sms * 4;
  }();
  return fill;
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// How a launch is asked for: the old single-channel form (maxBlocks caps a grid that fills
// the device) or an explicit channel shape.
struct Request {
  int maxBlocks = 0;
  LaunchShape shape;  // channels 0: the single-channel form
};

// The grid of one launch over `units` work items (16-byte vectors, or elements on the
// scalar path): kernels/channel_partition.h.
ChannelPlan gridFor(size_t units, const Request& rq) {
  return planChannels(units, rq.shape.channels, rq.shape.blocksPerChannel, rq.maxBlocks, fillBlocks(),
                      kThreads);
}

template <typename T, ridgeRedOp_t Op>
cudaError_t launchTyped(void* dst, const Sources& s, int nsrcs, size_t count, int divisor,
                        cudaStream_t stream, const Request& rq) {
  constexpr size_t kPerVec = 16 / sizeof(T);
  bool vectorOk = aligned16(dst);
  for (int k = 0; k < nsrcs; ++k) vectorOk = vectorOk && aligned16(s.ptr[k]);
  // Vector path: slices are whole vectors (the tail elements fall in the last slice).
  const ChannelPlan g = vectorOk ? gridFor(count / kPerVec, rq) : gridFor(count, rq);
  const size_t sliceElems = vectorOk ? g.perSlice * kPerVec : g.perSlice;
  reduceKernel<T, Op><<<g.channels * g.blocksPerChannel, kThreads, 0, stream>>>(
      static_cast<T*>(dst), s, nsrcs, count, divisor, vectorOk, g.channels,
      g.channels == 1 ? count : sliceElems);
  return cudaGetLastError();
}

template <typename T, ridgeRedOp_t Op>
struct ReduceLauncher {
  static cudaError_t run(void* dst, const Sources& s, int nsrcs, size_t count, int divisor,
                         cudaStream_t stream, const Request& rq) {
    return launchTyped<T, Op>(dst, s, nsrcs, count, divisor, stream, rq);
  }
};

template <typename T, ridgeRedOp_t Op>
struct ReduceLoader {
  static cudaError_t run() { return loadKernel(reduceKernel<T, Op>); }
};

Status reduceWith(void* dst, const void* const* srcs, int nsrcs, size_t count, ridgeDataType_t type,
                  ridgeRedOp_t op, int finalDivisor, ridgeStream_t stream, const Request& rq) {
  if (!dst || !srcs || nsrcs < 1 || nsrcs > kMaxReduceSources)
    return makeError(ridgeInvalidArgument, "launchReduce: %d sources (1 to %d allowed) or null pointer",
                     nsrcs, kMaxReduceSources);
  if (op != ridgeSum && op != ridgeProd && op != ridgeMax && op != ridgeMin && op != ridgeAvg)
    return makeError(ridgeInvalidArgument, "launchReduce: invalid reduction op %d", static_cast<int>(op));
  if (count == 0) return Status::ok();
  Sources s{};
  for (int k = 0; k < nsrcs; ++k) {
    if (!srcs[k]) return makeError(ridgeInvalidArgument, "launchReduce: source %d is null", k);
    s.ptr[k] = srcs[k];
  }
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  if (!validType(type))
    return makeError(ridgeInvalidArgument, "launchReduce: invalid data type %d", static_cast<int>(type));
  const cudaError_t err = withTypeAndOp<ReduceLauncher>(type, op, dst, s, nsrcs, count, finalDivisor, st, rq);
  if (err != cudaSuccess)
    return makeError(ridgeSystemError, "launchReduce: kernel launch failed: %s", cudaGetErrorString(err));
  return Status::ok();
}

Status copyWith(void* dst, const void* src, size_t bytes, ridgeStream_t stream, const Request& rq) {
  if (!dst || !src) return makeError(ridgeInvalidArgument, "launchCopy: null pointer");
  if (bytes == 0) return Status::ok();
  const bool vec = aligned16(dst) && aligned16(src);
  const size_t nvec = vec ? bytes / 16 : 0;
  const size_t body = nvec * 16;
  // Unaligned buffers go bytewise through the tail loop, which only the last channel runs:
  // a single channel then gets the whole grid.
  Request one = rq;
  if (!vec && one.shape.channels > 1) one.shape.channels = 1;
  const ChannelPlan g = gridFor(vec ? nvec : bytes, one);
  copyKernel<<<g.channels * g.blocksPerChannel, kThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      static_cast<uint4*>(dst), static_cast<const uint4*>(src), nvec, static_cast<unsigned char*>(dst) + body,
      static_cast<const unsigned char*>(src) + body, bytes - body, g.channels,
      g.channels == 1 ? nvec : g.perSlice);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return makeError(ridgeSystemError, "launchCopy: kernel launch failed: %s", cudaGetErrorString(err));
  return Status::ok();
}

}  // namespace

Status launchReduce(void* dst, const void* const* srcs, int nsrcs, size_t count, ridgeDataType_t type,
                    ridgeRedOp_t op, int finalDivisor, ridgeStream_t stream, int maxBlocks) {
  Request rq;
  rq.maxBlocks = maxBlocks;
  return reduceWith(dst, srcs, nsrcs, count, type, op, finalDivisor, stream, rq);
}

Status launchReduceChannels(void* dst, const void* const* srcs, int nsrcs, size_t count, ridgeDataType_t type,
                            ridgeRedOp_t op, int finalDivisor, ridgeStream_t stream, LaunchShape shape) {
  if (shape.channels < 1 || shape.blocksPerChannel < 0)
    return makeError(ridgeInvalidArgument, "launchReduceChannels: %d channels, %d blocks per channel",
                     shape.channels, shape.blocksPerChannel);
  Request rq;
  rq.shape = shape;
  return reduceWith(dst, srcs, nsrcs, count, type, op, finalDivisor, stream, rq);
}

Status launchCopy(void* dst, const void* src, size_t bytes, ridgeStream_t stream, int maxBlocks) {
  Request rq;
  rq.maxBlocks = maxBlocks;
  return copyWith(dst, src, bytes, stream, rq);
}

Status launchCopyChannels(void* dst, const void* src, size_t bytes, ridgeStream_t stream, LaunchShape shape) {
  if (shape.channels < 1 || shape.blocksPerChannel < 0)
    return makeError(ridgeInvalidArgument, "launchCopyChannels: %d channels, %d blocks per channel",
                     shape.channels, shape.blocksPerChannel);
  Request rq;
  rq.shape = shape;
  return copyWith(dst, src, bytes, stream, rq);
}

Status preloadKernels(int* loaded) {
  int n = 0;
  cudaError_t err = loadForEveryTypeAndOp<ReduceLoader>(&n);
  if (err == cudaSuccess && (err = loadKernel(copyKernel)) == cudaSuccess) ++n;
  if (err != cudaSuccess) (void)cudaGetLastError();
  // One initialization, not assignments: nvcc's front end warns on assigning a [[nodiscard]] Status.
  Status s = err != cudaSuccess ? makeError(ridgeSystemError, "loading the reduce and copy kernels: %s",
                                            cudaGetErrorString(err))
                                : preloadLLKernels(&n);
  if (loaded) *loaded = n;
  return s;
}

int preloadedModuleAnchors(const void** out, int max) {
  const void* anchors[] = {reinterpret_cast<const void*>(copyKernel), llModuleAnchor()};
  constexpr int n = sizeof anchors / sizeof anchors[0];
  for (int i = 0; i < n && i < max; ++i) out[i] = anchors[i];
  return n;
}

int deviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace ridge::gpu
