// Element-wise reductions on host memory: the arithmetic under every collective.
//
// Everything here is allocation-free, lock-free and makes no system calls. Each call
// dispatches once on (type, op) to a kernel specialised for that pair, and the
// kernels come in two builds of the same source: a portable one (SSE2 on x86-64,
// whatever the compiler vectorises to elsewhere) and, on x86-64, an AVX2/F16C/FMA one
// picked at run time when the CPU has those features. Both builds give bit-identical
// results (NaN payloads aside, see below).
//
// Semantics shared by reduceMany and reduce2:
//   * dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[n-1][i], folded left to right.
//     For float32/float64 that order is exact, so a reference that folds the same way
//     reproduces the result bit for bit.
//   * float16/bfloat16 load as float32, accumulate every source in float32 and round
//     once, to nearest even, on store.
//   * Integer sum and prod wrap modulo 2^bits; max/min compare signed or unsigned as
//     the type says.
//   * ridgeAvg sums; with finalDivisor > 0 the sum is divided by finalDivisor before it
//     is stored (integers: the wrapped sum read as the type, truncating division;
//     floats: division in the accumulation precision, then one rounding). With
//     finalDivisor == 0 avg is exactly sum (a partial sum inside an algorithm).
//     finalDivisor is ignored for the other ops.
//   * max/min and NaN: a NaN in any source makes the result NaN (the first NaN in fold
//     order wins). max(-0, +0) and min(-0, +0) return the later operand.
//   * nsrcs == 1 copies bit for bit (memmove), or divides when avg asks for it.
//   * dst may be exactly equal to any source pointer; partial overlap is not allowed.
//   * Invalid type or op, nsrcs < 1 or count == 0: nothing is written. Callers
//     validate arguments before they get here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ridge/ridge.h"

namespace ridge {

// Bytes per element; 0 for an invalid type.
size_t dataTypeSize(ridgeDataType_t t);
// nccl-tests names: "int8","uint8","int32","uint32","int64","uint64","half","float",
// "double","bfloat16"; "invalid" for anything else.
const char* dataTypeName(ridgeDataType_t t);
// "sum","prod","max","min","avg"; "invalid" for anything else.
const char* redOpName(ridgeRedOp_t op);
// Accepts the names above plus float16/fp16, float32/fp32, float64/fp64, bf16, char,
// int (ASCII case-insensitive). Returns false (and leaves *out alone) when unknown.
bool parseDataType(const char* name, ridgeDataType_t* out);
bool parseRedOp(const char* name, ridgeRedOp_t* out);

// dst[i] = op(srcs[0][i], ..., srcs[nsrcs-1][i]) for i < count; see above.
void reduceMany(void* dst, const void* const* srcs, int nsrcs, size_t count, ridgeDataType_t type,
                ridgeRedOp_t op, int finalDivisor);
// The same with two sources; the hot case.
void reduce2(void* dst, const void* a, const void* b, size_t count, ridgeDataType_t type, ridgeRedOp_t op,
             int finalDivisor);

// Scalar conversions: round to nearest even, overflow goes to infinity, NaN stays NaN
// (signalling NaNs come back quiet, sign and top payload bits kept, the same as F16C).
float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
float bf16ToFloat(uint16_t b);  // exact: the bits moved up 16 places
uint16_t floatToBf16(float f);

// Bulk forms of the conversions (vectorised, F16C when available); any n. Results are
// identical to the scalar forms element by element.
void halfToFloatN(float* out, const uint16_t* in, size_t n);
void floatToHalfN(uint16_t* out, const float* in, size_t n);
void bf16ToFloatN(float* out, const uint16_t* in, size_t n);
void floatToBf16N(uint16_t* out, const float* in, size_t n);

// Name of the kernel build in use: "avx2" or "generic".
const char* reduceImplName();
// True when this CPU can run the AVX2 build (whether or not it is forced off).
bool reduceHasSimdImpl();
// Tests only: true forces the portable build, false goes back to the best one.
// Not meant to race with reductions running on other threads.
void reduceForceScalarForTesting(bool force);

}  // namespace ridge
