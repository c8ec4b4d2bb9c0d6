// Element arithmetic of the GPU kernels (device_reduce.cu, ll_protocol.cu), with the
// semantics of the host kernels in src/reduce/reduce.h: fold order, fp16/bf16 accumulated
// in fp32 and rounded once, integer wrap-around, NaN and signed-zero rules of max/min, avg
// with a final divisor. CUDA only (included from .cu files); kept to C++17.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "ridge/ridge.h"

namespace ridge::gpu::ops {

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

// Calls Launcher<T, Op>::run(args...) for the element type and op given at run time: one
// switch for every kernel family. cudaErrorInvalidValue for a type or op out of range
// (callers validate first, to report which).
template <template <typename, ridgeRedOp_t> class Launcher, typename T, typename... A>
cudaError_t withOp(ridgeRedOp_t op, A&&... a) {
  switch (op) {
    case ridgeSum: return Launcher<T, ridgeSum>::run(a...);
    case ridgeProd: return Launcher<T, ridgeProd>::run(a...);
    case ridgeMax: return Launcher<T, ridgeMax>::run(a...);
    case ridgeMin: return Launcher<T, ridgeMin>::run(a...);
    case ridgeAvg: return Launcher<T, ridgeAvg>::run(a...);
    default: return cudaErrorInvalidValue;
  }
}

template <template <typename, ridgeRedOp_t> class Launcher, typename... A>
cudaError_t withTypeAndOp(ridgeDataType_t t, ridgeRedOp_t op, A&&... a) {
  switch (t) {
    case ridgeInt8: return withOp<Launcher, int8_t>(op, a...);
    case ridgeUint8: return withOp<Launcher, uint8_t>(op, a...);
    case ridgeInt32: return withOp<Launcher, int32_t>(op, a...);
    case ridgeUint32: return withOp<Launcher, uint32_t>(op, a...);
    case ridgeInt64: return withOp<Launcher, int64_t>(op, a...);
    case ridgeUint64: return withOp<Launcher, uint64_t>(op, a...);
    case ridgeFloat16: return withOp<Launcher, __half>(op, a...);
    case ridgeBfloat16: return withOp<Launcher, __nv_bfloat16>(op, a...);
    case ridgeFloat32: return withOp<Launcher, float>(op, a...);
    case ridgeFloat64: return withOp<Launcher, double>(op, a...);
    default: return cudaErrorInvalidValue;
  }
}

// Loads `kernel` into the current device context without launching it (the way the CUDA
// Programming Guide gives to defeat lazy loading); see preloadKernels in device_reduce.h.
template <typename Kernel>
cudaError_t loadKernel(Kernel* kernel) {
  cudaFuncAttributes attr;
  return cudaFuncGetAttributes(&attr, kernel);
}

// Calls Loader<T, Op>::run() for every type and op; adds those that succeeded to *loaded and
// returns the first error.
template <template <typename, ridgeRedOp_t> class Loader>
cudaError_t loadForEveryTypeAndOp(int* loaded) {
  for (int t = 0; t < ridgeNumTypes; ++t)
    for (int op = 0; op < ridgeNumOps; ++op) {
      const cudaError_t e =
          withTypeAndOp<Loader>(static_cast<ridgeDataType_t>(t), static_cast<ridgeRedOp_t>(op));
      if (e != cudaSuccess) return e;
      ++*loaded;
    }
  return cudaSuccess;
}

inline bool validType(ridgeDataType_t t) {
  return static_cast<int>(t) >= 0 && static_cast<int>(t) < ridgeNumTypes;
}
inline bool validOp(ridgeRedOp_t op) {
  return static_cast<int>(op) >= 0 && static_cast<int>(op) < ridgeNumOps;
}

}  // namespace ridge::gpu::ops
