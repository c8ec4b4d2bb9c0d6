// Reduction layer: names, scalar conversions, and run-time dispatch to one of two builds
// of the kernels in reduce_kernels.inc (portable, and AVX2/F16C/FMA on x86-64).
#include "reduce/reduce.h"

#include <atomic>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define RIDGE_REDUCE_HAVE_AVX2_BUILD 1
#endif

// Returning 32-byte vectors from always-inline helpers in the baseline build makes GCC
// warn about an ABI that no call ever uses.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace ridge {
namespace reduce_detail {

using KernelFn = void (*)(void* dst, const void* const* srcs, int nsrcs, size_t count, int finalDivisor);
constexpr int kNumKernelOps = 5;  // sum, prod, max, min, avg-with-division

struct KernelTable {
  KernelFn fn[ridgeNumTypes][kNumKernelOps];
  void (*halfToFloatN)(float*, const uint16_t*, size_t);
  void (*floatToHalfN)(uint16_t*, const float*, size_t);
  void (*bf16ToFloatN)(float*, const uint16_t*, size_t);
  void (*floatToBf16N)(uint16_t*, const float*, size_t);
};

namespace generic {
#include "reduce/reduce_kernels.inc"
}  // namespace generic

#if defined(RIDGE_REDUCE_HAVE_AVX2_BUILD)
#pragma GCC push_options
#pragma GCC target("avx2,f16c,fma")
#define RIDGE_REDUCE_F16C 1
namespace avx2 {
#include "reduce/reduce_kernels.inc"
}  // namespace avx2
#undef RIDGE_REDUCE_F16C
#pragma GCC pop_options
#endif

namespace {

bool cpuHasAvx2() {
#if defined(RIDGE_REDUCE_HAVE_AVX2_BUILD)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

const KernelTable* bestTable() {
#if defined(RIDGE_REDUCE_HAVE_AVX2_BUILD)
  if (cpuHasAvx2()) return &avx2::kTable;
#endif
  return &generic::kTable;
}

// Chosen on first use and cached; every choice is a constant table, so a race between
// two first calls only stores the same pointer twice.
std::atomic<const KernelTable*> gTable{nullptr};

inline const KernelTable* table() {
  const KernelTable* t = gTable.load(std::memory_order_acquire);
  if (__builtin_expect(t != nullptr, 1)) return t;
  t = bestTable();
  gTable.store(t, std::memory_order_release);
  return t;
}

bool equalsIgnoreCase(const char* a, const char* b) {
  for (; *a && *b; ++a, ++b) {
    char x = *a, y = *b;
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return *a == *b;
}

inline uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace
}  // namespace reduce_detail

using namespace reduce_detail;

size_t dataTypeSize(ridgeDataType_t t) {
  switch (t) {
    case ridgeInt8:
    case ridgeUint8: return 1;
    case ridgeFloat16:
    case ridgeBfloat16: return 2;
    case ridgeInt32:
    case ridgeUint32:
    case ridgeFloat32: return 4;
    case ridgeInt64:
    case ridgeUint64:
    case ridgeFloat64: return 8;
    default: return 0;
  }
}

namespace {
const char* const kTypeNames[ridgeNumTypes] = {"int8",   "uint8", "int32", "uint32", "int64",
                                               "uint64", "half",  "float", "double", "bfloat16"};
const char* const kOpNames[ridgeNumOps] = {"sum", "prod", "max", "min", "avg"};

struct TypeAlias {
  const char* name;
  ridgeDataType_t type;
};
const TypeAlias kTypeAliases[] = {
    {"char", ridgeInt8},       {"int", ridgeInt32},       {"float16", ridgeFloat16},
    {"fp16", ridgeFloat16},    {"float32", ridgeFloat32}, {"fp32", ridgeFloat32},
    {"float64", ridgeFloat64}, {"fp64", ridgeFloat64},    {"bf16", ridgeBfloat16},
};
}  // namespace

const char* dataTypeName(ridgeDataType_t t) {
  const int i = static_cast<int>(t);
  return (i >= 0 && i < ridgeNumTypes) ? kTypeNames[i] : "invalid";
}

const char* redOpName(ridgeRedOp_t op) {
  const int i = static_cast<int>(op);
  return (i >= 0 && i < ridgeNumOps) ? kOpNames[i] : "invalid";
}

bool parseDataType(const char* name, ridgeDataType_t* out) {
  if (name == nullptr || out == nullptr) return false;
  for (int i = 0; i < ridgeNumTypes; ++i) {
    if (equalsIgnoreCase(name, kTypeNames[i])) {
      *out = static_cast<ridgeDataType_t>(i);
      return true;
    }
  }
  for (const TypeAlias& a : kTypeAliases) {
    if (equalsIgnoreCase(name, a.name)) {
      *out = a.type;
      return true;
    }
  }
  return false;
}

bool parseRedOp(const char* name, ridgeRedOp_t* out) {
  if (name == nullptr || out == nullptr) return false;
  for (int i = 0; i < ridgeNumOps; ++i) {
    if (equalsIgnoreCase(name, kOpNames[i])) {
      *out = static_cast<ridgeRedOp_t>(i);
      return true;
    }
  }
  return false;
}

namespace {
// Maps (op, divisor) to the kernel column; -1 for an invalid op.
inline int kernelColumn(ridgeRedOp_t op, int finalDivisor) {
  switch (op) {
    case ridgeSum: return 0;
    case ridgeProd: return 1;
    case ridgeMax: return 2;
    case ridgeMin: return 3;
    case ridgeAvg: return finalDivisor > 0 ? 4 : 0;
    default: return -1;
  }
}
}  // namespace

void reduceMany(void* dst, const void* const* srcs, int nsrcs, size_t count, ridgeDataType_t type,
                ridgeRedOp_t op, int finalDivisor) {
  const int t = static_cast<int>(type);
  const int col = kernelColumn(op, finalDivisor);
  if (count == 0 || nsrcs < 1 || t < 0 || t >= ridgeNumTypes || col < 0) return;
  table()->fn[t][col](dst, srcs, nsrcs, count, finalDivisor);
}

void reduce2(void* dst, const void* a, const void* b, size_t count, ridgeDataType_t type, ridgeRedOp_t op,
             int finalDivisor) {
  const void* srcs[2] = {a, b};
  reduceMany(dst, srcs, 2, count, type, op, finalDivisor);
}

// ---- Scalar conversions ---------------------------------------------------------------
// Same algorithms as the portable vector code, one lane at a time.

float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  uint32_t r;
  if (em < 0x0400u) {
    r = floatBits(static_cast<float>(em) * 0x1p-24f);  // zero or subnormal, exact
  } else if (em >= 0x7c00u) {
    r = (em << 13) | 0x7f800000u | (em > 0x7c00u ? 0x00400000u : 0u);  // inf or quiet NaN
  } else {
    r = (em << 13) + 0x38000000u;
  }
  return bitsFloat(r | sign);
}

uint16_t floatToHalf(float f) {
  const uint32_t x = floatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  uint32_t r;
  if (a > 0x7f800000u) {
    r = 0x7e00u | ((a >> 13) & 0x3ffu);  // quiet NaN, top payload bits kept
  } else if (a >= 0x477ff000u) {
    r = 0x7c00u;  // rounds to 65536 or more, or is infinite
  } else if (a >= 0x38800000u) {
    r = (a - 0x38000000u + 0x0fffu + ((a >> 13) & 1u)) >> 13;
  } else {
    // volatile keeps the compiler from folding the rounding add away.
    volatile float biased = bitsFloat(a) + 0.5f;
    r = floatBits(biased) - 0x3f000000u;
  }
  return static_cast<uint16_t>(r | sign);
}

float bf16ToFloat(uint16_t b) {
  return bitsFloat(static_cast<uint32_t>(b) << 16);
}

uint16_t floatToBf16(float f) {
  const uint32_t x = floatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

void halfToFloatN(float* out, const uint16_t* in, size_t n) {
  table()->halfToFloatN(out, in, n);
}
void floatToHalfN(uint16_t* out, const float* in, size_t n) {
  table()->floatToHalfN(out, in, n);
}
void bf16ToFloatN(float* out, const uint16_t* in, size_t n) {
  table()->bf16ToFloatN(out, in, n);
}
void floatToBf16N(uint16_t* out, const float* in, size_t n) {
  table()->floatToBf16N(out, in, n);
}

// ---- Implementation selection ---------------------------------------------------------

const char* reduceImplName() {
#if defined(RIDGE_REDUCE_HAVE_AVX2_BUILD)
  if (table() == &avx2::kTable) return "avx2";
#endif
  return "generic";
}

bool reduceHasSimdImpl() {
  return cpuHasAvx2();
}

void reduceForceScalarForTesting(bool force) {
  gTable.store(force ? &generic::kTable : bestTable(), std::memory_order_release);
}

}  // namespace ridge
