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

#include "kernels/device_reduce.h"

namespace ridge::gpu {
namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // vectors per thread per iteration: independent loads in flight

struct Sources {
  const void* ptr[kMaxReduceSources];
};

// The arithmetic type of each element type: fp16/bf16 accumulate in fp32; integer sums
// wrap, so signed types compute in their unsigned twin (signed overflow is undefined).
template <typename T>
struct Arith {
  using Acc = T;
  __device__ static Acc load(T v) { return v; }
  __device__ static T store(Acc v) { return v; }
};
template <>
struct Arith<__half> {
  using Acc = float;
  __device__ static float load(__half v) { return __half2float(v); }
  __device__ static __half store(float v) { return __float2half_rn(v); }
};
template <>
struct Arith<__nv_bfloat16> {
  using Acc = float;
  __device__ static float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

template <typename A>
__device__ inline bool isNan(A v) {
  return v != v;  // false for integers, true only for NaN floats
}

// Float adds and multiplies must not be contracted into FMAs: the host kernels are built
// with -ffp-contract=off, and a fused result would differ in the last bit.
__device__ inline float addRn(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ inline double addRn(double a, double b) {
  return __dadd_rn(a, b);
}

template <typename A>
__device__ inline A wrapAdd(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return addRn(a, b);
  }
}

template <typename A>
__device__ inline A wrapMul(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    // Promote 8-bit operands through unsigned int so the product wraps, never overflows int.
    return static_cast<A>(static_cast<U>(static_cast<unsigned long long>(static_cast<U>(a)) *
                                         static_cast<unsigned long long>(static_cast<U>(b))));
  } else if constexpr (std::is_same_v<A, float>) {
    return __fmul_rn(a, b);
  } else {
    return __dmul_rn(a, b);
  }
}

template <ridgeRedOp_t Op, typename A>
__device__ inline A combine(A acc, A v) {
  if constexpr (Op == ridgeSum || Op == ridgeAvg) {
    return wrapAdd(acc, v);
  } else if constexpr (Op == ridgeProd) {
    return wrapMul(acc, v);
  } else {
    // The first NaN in fold order wins; on equal values (-0 and +0) the later operand.
    if (isNan(acc)) return acc;
    if (isNan(v)) return v;
    if constexpr (Op == ridgeMax) return acc > v ? acc : v;
    return acc < v ? acc : v;
  }
}

template <ridgeRedOp_t Op, typename A>
__device__ inline A finish(A acc, int divisor) {
  if constexpr (Op == ridgeAvg) {
    if (divisor > 0) {
      if constexpr (std::is_integral_v<A>) {
        // In a type wide enough for any positive int divisor, as the host kernels do.
        if constexpr (std::is_signed_v<A>)
          return static_cast<A>(static_cast<long long>(acc) / divisor);
        else
          return static_cast<A>(static_cast<unsigned long long>(acc) / static_cast<unsigned>(divisor));
      } else if constexpr (std::is_same_v<A, float>) {
        return __fdiv_rn(acc, static_cast<float>(divisor));
      } else {
        return __ddiv_rn(acc, static_cast<double>(divisor));
      }
    }
  }
  return acc;
}

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

template <typename T, ridgeRedOp_t Op>
__global__ void __launch_bounds__(kThreads)
    reduceKernel(T* __restrict__ dst, Sources srcs, int nsrcs, size_t count, int divisor, bool vectorOk) {
  constexpr int kPerVec = 16 / sizeof(T);
  using R = Arith<T>;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
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
    copyKernel(uint4* __restrict__ dst, const uint4* __restrict__ src, size_t nvec, unsigned char* dstTail,
               const unsigned char* srcTail, size_t tailBytes) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  size_t v = tid;
  for (; v + (kUnroll - 1) * stride < nvec; v += kUnroll * stride) {
    uint4 r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) r[u] = src[v + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[v + u * stride] = r[u];
  }
  for (; v < nvec; v += stride) dst[v] = src[v];
  for (size_t i = tid; i < tailBytes; i += stride) dstTail[i] = srcTail[i];
}

int blocksFor(size_t work, int maxBlocks) {
  static int fill = [] {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      sms = 108;
    }
    return sms * 4;  // 4 resident blocks of 512 threads per SM: full occupancy on sm_80/90
  }();
  const size_t needed = (work + kThreads - 1) / kThreads;
  size_t blocks = needed < static_cast<size_t>(fill) ? needed : static_cast<size_t>(fill);
  if (maxBlocks > 0 && blocks > static_cast<size_t>(maxBlocks)) blocks = static_cast<size_t>(maxBlocks);
  return blocks < 1 ? 1 : static_cast<int>(blocks);
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

template <typename T, ridgeRedOp_t Op>
cudaError_t launchTyped(void* dst, const Sources& s, int nsrcs, size_t count, int divisor,
                        cudaStream_t stream, int maxBlocks) {
  bool vectorOk = aligned16(dst);
  for (int k = 0; k < nsrcs; ++k) vectorOk = vectorOk && aligned16(s.ptr[k]);
  const size_t work = vectorOk ? (count * sizeof(T) + 15) / 16 : count;
  reduceKernel<T, Op><<<blocksFor(work, maxBlocks), kThreads, 0, stream>>>(static_cast<T*>(dst), s, nsrcs,
                                                                           count, divisor, vectorOk);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launchOp(ridgeRedOp_t op, void* dst, const Sources& s, int nsrcs, size_t count, int divisor,
                     cudaStream_t stream, int maxBlocks) {
  switch (op) {
    case ridgeSum: return launchTyped<T, ridgeSum>(dst, s, nsrcs, count, divisor, stream, maxBlocks);
    case ridgeProd: return launchTyped<T, ridgeProd>(dst, s, nsrcs, count, divisor, stream, maxBlocks);
    case ridgeMax: return launchTyped<T, ridgeMax>(dst, s, nsrcs, count, divisor, stream, maxBlocks);
    case ridgeMin: return launchTyped<T, ridgeMin>(dst, s, nsrcs, count, divisor, stream, maxBlocks);
    case ridgeAvg: return launchTyped<T, ridgeAvg>(dst, s, nsrcs, count, divisor, stream, maxBlocks);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

Status launchReduce(void* dst, const void* const* srcs, int nsrcs, size_t count, ridgeDataType_t type,
                    ridgeRedOp_t op, int finalDivisor, ridgeStream_t stream, int maxBlocks) {
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
  cudaError_t err;
  switch (type) {
    case ridgeInt8: err = launchOp<int8_t>(op, dst, s, nsrcs, count, finalDivisor, st, maxBlocks); break;
    case ridgeUint8: err = launchOp<uint8_t>(op, dst, s, nsrcs, count, finalDivisor, st, maxBlocks); break;
    case ridgeInt32: err = launchOp<int32_t>(op, dst, s, nsrcs, count, finalDivisor, st, maxBlocks); break;
    case ridgeUint32: err = launchOp<uint32_t>(op, dst, s, nsrcs, count, finalDivisor, st, maxBlocks); break;
    case ridgeInt64: err = launchOp<int64_t>(op, dst, s, nsrcs, count, finalDivisor, st, maxBlocks); break;
    case ridgeUint64: err = launchOp<uint64_t>(op, dst, s, nsrcs, count, finalDivisor, st, maxBlocks); break;
    case ridgeFloat16: err = launchOp<__half>(op, dst, s, nsrcs, count, finalDivisor, st, maxBlocks); break;
    case ridgeBfloat16:
      err = launchOp<__nv_bfloat16>(op, dst, s, nsrcs, count, finalDivisor, st, maxBlocks);
      break;
    case ridgeFloat32: err = launchOp<float>(op, dst, s, nsrcs, count, finalDivisor, st, maxBlocks); break;
    case ridgeFloat64: err = launchOp<double>(op, dst, s, nsrcs, count, finalDivisor, st, maxBlocks); break;
    default:
      return makeError(ridgeInvalidArgument, "launchReduce: invalid data type %d", static_cast<int>(type));
  }
  if (err != cudaSuccess)
    return makeError(ridgeSystemError, "launchReduce: kernel launch failed: %s", cudaGetErrorString(err));
  return Status::ok();
}

Status launchCopy(void* dst, const void* src, size_t bytes, ridgeStream_t stream, int maxBlocks) {
  if (!dst || !src) return makeError(ridgeInvalidArgument, "launchCopy: null pointer");
  if (bytes == 0) return Status::ok();
  const bool vec = aligned16(dst) && aligned16(src);
  const size_t nvec = vec ? bytes / 16 : 0;
  const size_t body = nvec * 16;
  copyKernel<<<blocksFor(vec ? nvec : bytes, maxBlocks), kThreads, 0,
               reinterpret_cast<cudaStream_t>(stream)>>>(
      static_cast<uint4*>(dst), static_cast<const uint4*>(src), nvec, static_cast<unsigned char*>(dst) + body,
      static_cast<const unsigned char*>(src) + body, bytes - body);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return makeError(ridgeSystemError, "launchCopy: kernel launch failed: %s", cudaGetErrorString(err));
  return Status::ok();
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
