// Tests for src/reduce: every type x op x source count x length x aliasing against an
// independent reference, the 16-bit float conversions over every bit pattern, and the
// portable build against the AVX2 build bit for bit.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "reduce/reduce.h"

namespace ridge {
namespace {

// ---- Independent reference conversions (no bit tricks shared with the library) ------

double refHalfToDouble(uint16_t h) {
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0x1f) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(static_cast<double>(m), -24);
  return sign * std::ldexp(static_cast<double>(1024 + m), e - 25);
}

double refBf16ToDouble(uint16_t b) {
  const int e = (b >> 7) & 0xff;
  const int m = b & 0x7f;
  const double sign = (b & 0x8000) ? -1.0 : 1.0;
  if (e == 0xff) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(static_cast<double>(m), -133);
  return sign * std::ldexp(static_cast<double>(128 + m), e - 134);
}

// Rounds |x| to a binary format with `mant` stored mantissa bits, smallest normal
// exponent `emin`, largest finite exponent `emax`, nearest even; returns the rounded
// magnitude (may be inf). Uses nearbyint in the default rounding mode.
double refRoundMagnitude(double ax, int mant, int emin, int emax) {
  if (ax == 0) return 0;
  int e;
  std::frexp(ax, &e);  // ax in [2^(e-1), 2^e)
  int k = e - 1;
  if (k < emin) k = emin;  // subnormal: fixed quantum
  const double quantum = std::ldexp(1.0, k - mant);
  const double q = std::nearbyint(ax / quantum) * quantum;
  // Overflow: anything that rounds to 2^(emax+1) or beyond.
  if (q >= std::ldexp(1.0, emax + 1)) return INFINITY;
  return q;
}

uint16_t refDoubleToHalf(double x) {
  if (std::isnan(x)) return 0x7e00;
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double q = refRoundMagnitude(std::fabs(x), 10, -14, 15);
  if (std::isinf(q)) return sign | 0x7c00;
  if (q < std::ldexp(1.0, -14)) return sign | static_cast<uint16_t>(q / std::ldexp(1.0, -24));
  int e;
  const double f = std::frexp(q, &e);  // q = f * 2^e, f in [0.5, 1)
  const int mant = static_cast<int>(f * 2048.0) - 1024;
  return sign | static_cast<uint16_t>(((e - 1 + 15) << 10) | mant);
}

uint16_t refDoubleToBf16(double x) {
  if (std::isnan(x)) return 0x7fc0;
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double q = refRoundMagnitude(std::fabs(x), 7, -126, 127);
  if (std::isinf(q)) return sign | 0x7f80;
  const float qf = static_cast<float>(q);  // exact: q is a bf16 value
  uint32_t u;
  std::memcpy(&u, &qf, 4);
  EXPECT_EQ(u & 0xffffu, 0u);
  return sign | static_cast<uint16_t>(u >> 16);
}

float bitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t floatToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
double bitsToDouble(uint64_t u) {
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}
uint64_t doubleToBits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

bool isHalfNan(uint16_t h) {
  return (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
}
bool isBf16Nan(uint16_t b) {
  return (b & 0x7f80) == 0x7f80 && (b & 0x7f);
}

const ridgeDataType_t kAllTypes[] = {ridgeInt8,   ridgeUint8,   ridgeInt32,   ridgeUint32,  ridgeInt64,
                                     ridgeUint64, ridgeFloat16, ridgeFloat32, ridgeFloat64, ridgeBfloat16};
const ridgeRedOp_t kAllOps[] = {ridgeSum, ridgeProd, ridgeMax, ridgeMin, ridgeAvg};

bool isIntType(ridgeDataType_t t) {
  return t <= ridgeUint64;
}
bool isSignedInt(ridgeDataType_t t) {
  return t == ridgeInt8 || t == ridgeInt32 || t == ridgeInt64;
}

// ---- Element storage as uint64 bit patterns -------------------------------------------

uint64_t loadElem(const uint8_t* base, size_t i, size_t es) {
  switch (es) {
    case 1: return base[i];
    case 2: {
      uint16_t v;
      std::memcpy(&v, base + 2 * i, 2);
      return v;
    }
    case 4: {
      uint32_t v;
      std::memcpy(&v, base + 4 * i, 4);
      return v;
    }
    default: {
      uint64_t v;
      std::memcpy(&v, base + 8 * i, 8);
      return v;
    }
  }
}
void storeElem(uint8_t* base, size_t i, size_t es, uint64_t bits) {
  switch (es) {
    case 1: base[i] = static_cast<uint8_t>(bits); break;
    case 2: {
      uint16_t v = static_cast<uint16_t>(bits);
      std::memcpy(base + 2 * i, &v, 2);
      break;
    }
    case 4: {
      uint32_t v = static_cast<uint32_t>(bits);
      std::memcpy(base + 4 * i, &v, 4);
      break;
    }
    default: std::memcpy(base + 8 * i, &bits, 8); break;
  }
}

// ---- Reference reduction --------------------------------------------------------------

// Float-like value of one element of a floating type, as the library's accumulator
// sees it (float for 16-bit types and float32, double for float64).
double floatValue(ridgeDataType_t t, uint64_t bits) {
  switch (t) {
    case ridgeFloat16: return refHalfToDouble(static_cast<uint16_t>(bits));
    case ridgeBfloat16: return refBf16ToDouble(static_cast<uint16_t>(bits));
    case ridgeFloat32: return bitsToFloat(static_cast<uint32_t>(bits));
    default: return bitsToDouble(bits);
  }
}

// Folds left to right; ties in max/min pick the later operand (the documented rule).
uint64_t refReduce(ridgeDataType_t t, ridgeRedOp_t op, int div, const uint64_t* v, int n) {
  if (isIntType(t)) {
    const int bits = static_cast<int>(dataTypeSize(t)) * 8;
    const uint64_t mask = bits == 64 ? ~0ull : ((1ull << bits) - 1);
    auto sx = [&](uint64_t x) -> int64_t {
      x &= mask;
      if (bits < 64 && (x >> (bits - 1)) & 1) x |= ~mask;
      return static_cast<int64_t>(x);
    };
    const bool sgn = isSignedInt(t);
    auto less = [&](uint64_t a, uint64_t b) { return sgn ? sx(a) < sx(b) : (a & mask) < (b & mask); };
    uint64_t acc = v[0] & mask;
    for (int k = 1; k < n; ++k) {
      const uint64_t x = v[k] & mask;
      switch (op) {
        case ridgeSum:
        case ridgeAvg: acc = (acc + x) & mask; break;
        case ridgeProd: acc = (acc * x) & mask; break;
        case ridgeMax: acc = less(x, acc) ? acc : x; break;
        case ridgeMin: acc = less(acc, x) ? acc : x; break;
        default: break;
      }
    }
    if (op == ridgeAvg && div > 0) {
      if (sgn)
        acc = static_cast<uint64_t>(sx(acc) / static_cast<int64_t>(div)) & mask;
      else
        acc = acc / static_cast<uint64_t>(div);
    }
    return acc;
  }
  if (t == ridgeFloat64) {
    double acc = floatValue(t, v[0]);
    for (int k = 1; k < n; ++k) {
      const double x = floatValue(t, v[k]);
      switch (op) {
        case ridgeSum:
        case ridgeAvg: acc = acc + x; break;
        case ridgeProd: acc = acc * x; break;
        case ridgeMax: acc = (acc > x || std::isnan(acc)) ? acc : x; break;
        case ridgeMin: acc = (acc < x || std::isnan(acc)) ? acc : x; break;
        default: break;
      }
    }
    if (op == ridgeAvg && div > 0) acc = acc / static_cast<double>(div);
    return doubleToBits(acc);
  }
  // float32 accumulation; every step done in double and rounded to float, which is the
  // correctly rounded float result for + * / on float operands.
  float acc = static_cast<float>(floatValue(t, v[0]));
  for (int k = 1; k < n; ++k) {
    const float x = static_cast<float>(floatValue(t, v[k]));
    switch (op) {
      case ridgeSum:
      case ridgeAvg: acc = static_cast<float>(static_cast<double>(acc) + x); break;
      case ridgeProd: acc = static_cast<float>(static_cast<double>(acc) * x); break;
      case ridgeMax: acc = (acc > x || std::isnan(acc)) ? acc : x; break;
      case ridgeMin: acc = (acc < x || std::isnan(acc)) ? acc : x; break;
      default: break;
    }
  }
  if (op == ridgeAvg && div > 0) acc = static_cast<float>(static_cast<double>(acc) / div);
  switch (t) {
    case ridgeFloat16: return refDoubleToHalf(acc);
    case ridgeBfloat16: return refDoubleToBf16(acc);
    default: return floatToBits(acc);
  }
}

// Bit equality, except that any two NaNs of a floating type are equal.
bool sameResult(ridgeDataType_t t, uint64_t a, uint64_t b) {
  if (a == b) return true;
  switch (t) {
    case ridgeFloat16: return isHalfNan(static_cast<uint16_t>(a)) && isHalfNan(static_cast<uint16_t>(b));
    case ridgeBfloat16: return isBf16Nan(static_cast<uint16_t>(a)) && isBf16Nan(static_cast<uint16_t>(b));
    case ridgeFloat32:
      return std::isnan(bitsToFloat(static_cast<uint32_t>(a))) &&
             std::isnan(bitsToFloat(static_cast<uint32_t>(b)));
    case ridgeFloat64: return std::isnan(bitsToDouble(a)) && std::isnan(bitsToDouble(b));
    default: return false;
  }
}

// ---- Input generation -----------------------------------------------------------------

// A random finite bit pattern of a floating type (any exponent, subnormals included).
uint64_t randomFinite(ridgeDataType_t t, std::mt19937_64& rng) {
  for (;;) {
    const uint64_t r = rng();
    switch (t) {
      case ridgeFloat16: {
        uint16_t h = r & 0xffff;
        if ((h & 0x7c00) != 0x7c00) return h;
        break;
      }
      case ridgeBfloat16: {
        uint16_t b = r & 0xffff;
        if ((b & 0x7f80) != 0x7f80) return b;
        break;
      }
      case ridgeFloat32: {
        uint32_t u = r & 0xffffffffu;
        if ((u & 0x7f800000u) != 0x7f800000u) return u;
        break;
      }
      default:
        if ((r & 0x7ff0000000000000ull) != 0x7ff0000000000000ull) return r;
        break;
    }
  }
}

uint64_t encodeFloat(ridgeDataType_t t, double x) {
  switch (t) {
    case ridgeFloat16: return refDoubleToHalf(x);
    case ridgeBfloat16: return refDoubleToBf16(x);
    case ridgeFloat32: return floatToBits(static_cast<float>(x));
    default: return doubleToBits(x);
  }
}

// Inputs whose reduction is meaningful: full random bits for integers (wrapping is
// part of the contract); for floats a mix of any finite value and moderate values, and
// for prod magnitudes in [0.5, 2) so products of a few sources stay in range.
uint64_t randomInput(ridgeDataType_t t, ridgeRedOp_t op, std::mt19937_64& rng) {
  if (isIntType(t)) return rng();
  std::uniform_real_distribution<double> moderate(-100.0, 100.0);
  std::uniform_real_distribution<double> unit(0.5, 2.0);
  if (op == ridgeProd) return encodeFloat(t, (rng() & 1 ? -1.0 : 1.0) * unit(rng));
  if (rng() & 1) return randomFinite(t, rng);
  return encodeFloat(t, moderate(rng));
}

// ---- Running one case -----------------------------------------------------------------

constexpr size_t kGuard = 16;  // guard elements on each side of every buffer
constexpr uint8_t kGuardByte = 0xa5;

struct Case {
  ridgeDataType_t type;
  ridgeRedOp_t op;
  int nsrcs;
  size_t count;
  int alias;  // -1: separate dst; otherwise dst == srcs[alias]
  int divisor;
  size_t misalign;  // element offset added to every buffer's start
  bool useReduce2;
};

std::string describe(const Case& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "type=%s op=%s nsrcs=%d count=%zu alias=%d div=%d misalign=%zu r2=%d",
                dataTypeName(c.type), redOpName(c.op), c.nsrcs, c.count, c.alias, c.divisor, c.misalign,
                c.useReduce2 ? 1 : 0);
  return buf;
}

// Returns the number of mismatches (and reports the first few).
int runCase(const Case& c, std::mt19937_64& rng) {
  const size_t es = dataTypeSize(c.type);
  const size_t total = c.count + 2 * kGuard + c.misalign;
  std::vector<std::vector<uint8_t>> bufs(c.nsrcs + 1, std::vector<uint8_t>(total * es, kGuardByte));
  std::vector<std::vector<uint64_t>> in(c.nsrcs, std::vector<uint64_t>(c.count));
  std::vector<const void*> srcs(c.nsrcs);
  for (int s = 0; s < c.nsrcs; ++s) {
    uint8_t* base = bufs[s].data() + (kGuard + c.misalign) * es;
    for (size_t i = 0; i < c.count; ++i) {
      in[s][i] = randomInput(c.type, c.op, rng);
      storeElem(base, i, es, in[s][i]);
    }
    srcs[s] = base;
  }
  const int dstBuf = c.alias >= 0 ? c.alias : c.nsrcs;
  uint8_t* dst = bufs[dstBuf].data() + (kGuard + c.misalign) * es;

  if (c.useReduce2) {
    reduce2(dst, srcs[0], srcs[1], c.count, c.type, c.op, c.divisor);
  } else {
    reduceMany(dst, srcs.data(), c.nsrcs, c.count, c.type, c.op, c.divisor);
  }

  int bad = 0;
  std::vector<uint64_t> column(c.nsrcs);
  for (size_t i = 0; i < c.count; ++i) {
    for (int s = 0; s < c.nsrcs; ++s) column[s] = in[s][i];
    const uint64_t want = refReduce(c.type, c.op, c.divisor, column.data(), c.nsrcs);
    const uint64_t got = loadElem(dst, i, es);
    if (!sameResult(c.type, want, got)) {
      if (++bad <= 3) {
        ADD_FAILURE() << describe(c) << " index " << i << ": want 0x" << std::hex << want << " got 0x" << got
                      << std::dec;
      }
    }
  }
  // Guards around the destination and (when not aliased) the sources are untouched,
  // and unaliased sources are unchanged.
  const uint8_t* d = bufs[dstBuf].data();
  for (size_t b = 0; b < (kGuard + c.misalign) * es; ++b) {
    if (d[b] != kGuardByte) {
      ++bad;
      ADD_FAILURE() << describe(c) << " wrote before dst";
      break;
    }
  }
  for (size_t b = (kGuard + c.misalign + c.count) * es; b < total * es; ++b) {
    if (d[b] != kGuardByte) {
      ++bad;
      ADD_FAILURE() << describe(c) << " wrote past dst";
      break;
    }
  }
  for (int s = 0; s < c.nsrcs; ++s) {
    if (s == dstBuf) continue;
    const uint8_t* base = static_cast<const uint8_t*>(srcs[s]);
    for (size_t i = 0; i < c.count; ++i) {
      if (loadElem(base, i, es) != (in[s][i] & (es == 8 ? ~0ull : ((1ull << (8 * es)) - 1)))) {
        ++bad;
        ADD_FAILURE() << describe(c) << " modified source " << s;
        break;
      }
    }
  }
  return bad;
}

// ---- The exhaustive sweep -------------------------------------------------------------

class ReduceSweep : public ::testing::TestWithParam<std::tuple<ridgeDataType_t, ridgeRedOp_t, bool>> {
 protected:
  void SetUp() override {
    if (std::get<2>(GetParam())) reduceForceScalarForTesting(true);
  }
  void TearDown() override { reduceForceScalarForTesting(false); }
};

TEST_P(ReduceSweep, MatchesReference) {
  const auto [type, op, scalar] = GetParam();
  if (scalar) {
    ASSERT_STREQ(reduceImplName(), "generic");
  }
  std::mt19937_64 rng(0x5eed0000u + type * 16 + op);
  const size_t counts[] = {0, 1, 7, 31, 33, 1000, 4099};
  std::vector<int> divisors = {3};
  if (op == ridgeAvg) divisors = {0, 1, 2, 3, 7, 1000};
  int failures = 0;
  int cases = 0;
  for (int nsrcs = 1; nsrcs <= 4; ++nsrcs) {
    for (size_t count : counts) {
      for (int alias : {-1, 0, nsrcs - 1}) {
        for (int div : divisors) {
          for (size_t misalign : {size_t{0}, size_t{1}}) {
            Case c{type, op, nsrcs, count, alias, div, misalign, false};
            failures += runCase(c, rng);
            ++cases;
            if (nsrcs == 2) {
              c.useReduce2 = true;
              failures += runCase(c, rng);
              ++cases;
            }
            if (failures > 20) FAIL() << "too many failures";
          }
        }
      }
    }
  }
  EXPECT_EQ(failures, 0);
  EXPECT_GT(cases, 100);
}

TEST_P(ReduceSweep, ManySourcesAcrossBlocks) {
  const auto [type, op, scalar] = GetParam();
  std::mt19937_64 rng(0xb10c0000u + type * 16 + op);
  int failures = 0;
  for (int nsrcs : {5, 8, 13}) {
    for (size_t count : {size_t{2047}, size_t{2048}, size_t{2049}, size_t{10007}}) {
      for (int alias : {-1, nsrcs / 2}) {
        Case c{type, op, nsrcs, count, alias, op == ridgeAvg ? nsrcs : 0, 0, false};
        failures += runCase(c, rng);
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

std::string sweepName(const ::testing::TestParamInfo<ReduceSweep::ParamType>& info) {
  return std::string(dataTypeName(std::get<0>(info.param))) + "_" + redOpName(std::get<1>(info.param)) +
         (std::get<2>(info.param) ? "_generic" : "_best");
}

INSTANTIATE_TEST_SUITE_P(AllTypesOps, ReduceSweep,
                         ::testing::Combine(::testing::ValuesIn(kAllTypes), ::testing::ValuesIn(kAllOps),
                                            ::testing::Bool()),
                         sweepName);

// ---- Hand-checked cases (the reference above could share a misunderstanding) ---------

template <class T>
std::vector<T> run3(const std::vector<T>& a, const std::vector<T>& b, const std::vector<T>& c,
                    ridgeDataType_t t, ridgeRedOp_t op, int div) {
  std::vector<T> out(a.size());
  const void* srcs[3] = {a.data(), b.data(), c.data()};
  reduceMany(out.data(), srcs, 3, a.size(), t, op, div);
  return out;
}

class ReduceBothPaths : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { reduceForceScalarForTesting(GetParam()); }
  void TearDown() override { reduceForceScalarForTesting(false); }
};

TEST_P(ReduceBothPaths, IntegerWrapAndTruncatingAverage) {
  // int8: 100 + 100 + 100 = 300 -> 44 (wraps); avg over 3 of the wrapped sum: 44/3 = 14.
  std::vector<int8_t> a(9, 100), b(9, 100), c(9, 100);
  EXPECT_EQ(run3(a, b, c, ridgeInt8, ridgeSum, 0)[8], 44);
  EXPECT_EQ(run3(a, b, c, ridgeInt8, ridgeAvg, 3)[8], 14);
  EXPECT_EQ(run3(a, b, c, ridgeInt8, ridgeAvg, 0)[8], 44);  // divisor 0: a sum
  // Negative sums truncate toward zero: (-7 + 0 + 0) / 2 = -3.
  std::vector<int8_t> n(40, -7), z(40, 0);
  EXPECT_EQ(run3(n, z, z, ridgeInt8, ridgeAvg, 2)[39], -3);
  // int8 wrap to negative: 100 + 100 + 0 = -56, /2 = -28.
  std::vector<int8_t> h(33, 100);
  EXPECT_EQ(run3(h, h, z, ridgeInt8, ridgeAvg, 2)[0], -28);
  // uint8: 200 + 100 + 0 = 44 (mod 256), /2 = 22; divisors larger than the type work.
  std::vector<uint8_t> u1(5, 200), u2(5, 100), u0(5, 0);
  EXPECT_EQ(run3(u1, u2, u0, ridgeUint8, ridgeAvg, 2)[4], 22);
  EXPECT_EQ(run3(u1, u1, u0, ridgeUint8, ridgeAvg, 1000)[4], 0);  // 144/1000
  EXPECT_EQ(run3(u1, u2, u0, ridgeUint8, ridgeProd, 0)[4], 0);    // 200*100*0
  // Signed vs unsigned max: 0x80 is -128 as int8 and 128 as uint8.
  std::vector<int8_t> s1(33, -128), s2(33, 1);
  EXPECT_EQ(run3(s1, s2, s1, ridgeInt8, ridgeMax, 0)[32], 1);
  std::vector<uint8_t> v1(33, 128), v2(33, 1);
  EXPECT_EQ(run3(v1, v2, v1, ridgeUint8, ridgeMax, 0)[32], 128);
  EXPECT_EQ(run3(v1, v2, v1, ridgeUint8, ridgeMin, 0)[32], 1);
  // uint64 wrap and prod; int64 min.
  std::vector<uint64_t> big(7, ~0ull), two(7, 2);
  EXPECT_EQ(run3(big, two, two, ridgeUint64, ridgeSum, 0)[6], 3ull);
  EXPECT_EQ(run3(big, two, two, ridgeUint64, ridgeProd, 0)[6], ~0ull - 3);
  EXPECT_EQ(run3(big, two, two, ridgeUint64, ridgeAvg, 2)[6], 1ull);
  std::vector<int64_t> i1(5, INT64_MIN), i2(5, -1), i3(5, 5);
  EXPECT_EQ(run3(i1, i2, i3, ridgeInt64, ridgeMin, 0)[4], INT64_MIN);
  EXPECT_EQ(run3(i1, i2, i3, ridgeInt64, ridgeMax, 0)[4], 5);
  // INT64_MIN + (-1) wraps to INT64_MAX, + 5 wraps to INT64_MIN + 4; avg /4 = (INT64_MIN+4)/4.
  EXPECT_EQ(run3(i1, i2, i3, ridgeInt64, ridgeSum, 0)[4], INT64_MIN + 4);
  EXPECT_EQ(run3(i1, i2, i3, ridgeInt64, ridgeAvg, 4)[4], (INT64_MIN + 4) / 4);
  std::vector<int32_t> j1(9, -9), j2(9, 2), j3(9, 0);
  EXPECT_EQ(run3(j1, j2, j3, ridgeInt32, ridgeAvg, 2)[8], -3);  // -7/2
}

TEST_P(ReduceBothPaths, SixteenBitFloatsRoundOnceAfterFloatAccumulation) {
  // fp16: 2048 + 1 + 1. Rounding after each step would give 2048 (2049 ties to even);
  // float accumulation gives 2050, which fp16 represents.
  const uint16_t h2048 = floatToHalf(2048.0f), h1 = floatToHalf(1.0f);
  ASSERT_EQ(h2048, 0x6800);
  ASSERT_EQ(h1, 0x3c00);
  std::vector<uint16_t> a(37, h2048), b(37, h1);
  std::vector<uint16_t> r = run3(a, b, b, ridgeFloat16, ridgeSum, 0);
  for (uint16_t x : r) ASSERT_EQ(halfToFloat(x), 2050.0f);
  // bf16: 256 + 1 + 1 = 258 (stepwise rounding would give 256).
  std::vector<uint16_t> c(37, floatToBf16(256.0f)), d(37, floatToBf16(1.0f));
  r = run3(c, d, d, ridgeBfloat16, ridgeSum, 0);
  for (uint16_t x : r) ASSERT_EQ(bf16ToFloat(x), 258.0f);
  // avg: (1 + 1 + 2048) / 3 = 683.33.. -> fp16 683.5 (ulp 0.5 in [512, 1024)).
  r = run3(b, b, a, ridgeFloat16, ridgeAvg, 3);
  for (uint16_t x : r) ASSERT_EQ(halfToFloat(x), 683.5f);
  // Overflow to infinity only at the store: 60000 + 60000 - 60000 = 60000.
  std::vector<uint16_t> p(9, floatToHalf(60000.0f)), m(9, floatToHalf(-60000.0f));
  r = run3(p, p, m, ridgeFloat16, ridgeSum, 0);
  for (uint16_t x : r) ASSERT_EQ(x, floatToHalf(60000.0f));
  r = run3(p, p, p, ridgeFloat16, ridgeSum, 0);
  for (uint16_t x : r) ASSERT_EQ(x, 0x7c00);
}

TEST_P(ReduceBothPaths, FloatSumIsALeftFold) {
  // (1e8 + 1) + -1e8 = 0 in float (1e8 + 1 rounds to 1e8), while 1e8 + (1 + -1e8)
  // would be 0 too; use 2^24 to make the order visible: (2^24 + 1) + 1 = 2^24 in float
  // per step, but 2^24 + (1 + 1) = 2^24 + 2.
  const float big = 16777216.0f;
  std::vector<float> a(19, big), b(19, 1.0f);
  std::vector<float> r = run3(a, b, b, ridgeFloat32, ridgeSum, 0);
  for (float x : r) ASSERT_EQ(x, big);
  r = run3(b, b, a, ridgeFloat32, ridgeSum, 0);
  for (float x : r) ASSERT_EQ(x, big + 2.0f);
  const double dbig = 9007199254740992.0;  // 2^53
  std::vector<double> da(19, dbig), db(19, 1.0);
  std::vector<double> dr = run3(da, db, db, ridgeFloat64, ridgeSum, 0);
  for (double x : dr) ASSERT_EQ(x, dbig);
  dr = run3(db, db, da, ridgeFloat64, ridgeSum, 0);
  for (double x : dr) ASSERT_EQ(x, dbig + 2.0);
}

TEST_P(ReduceBothPaths, MaxMinNanAndSignedZero) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> n(11, nan), one(11, 1.0f), pz(11, 0.0f), nz(11, -0.0f);
  for (ridgeRedOp_t op : {ridgeMax, ridgeMin}) {
    for (float x : run3(n, one, one, ridgeFloat32, op, 0)) EXPECT_TRUE(std::isnan(x));
    for (float x : run3(one, n, one, ridgeFloat32, op, 0)) EXPECT_TRUE(std::isnan(x));
    for (float x : run3(one, one, n, ridgeFloat32, op, 0)) EXPECT_TRUE(std::isnan(x));
  }
  // Ties (including -0 == +0) keep the later operand.
  for (float x : run3(pz, pz, nz, ridgeFloat32, ridgeMax, 0)) EXPECT_TRUE(std::signbit(x));
  for (float x : run3(nz, nz, pz, ridgeFloat32, ridgeMin, 0)) EXPECT_FALSE(std::signbit(x));
  const double dn = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> d1(5, 1.0), d2(5, dn);
  for (double x : run3(d1, d2, d1, ridgeFloat64, ridgeMax, 0)) EXPECT_TRUE(std::isnan(x));
  for (double x : run3(d1, d1, d2, ridgeFloat64, ridgeMin, 0)) EXPECT_TRUE(std::isnan(x));
  std::vector<uint16_t> h1(21, 0x3c00), hn(21, 0x7e00), b1(21, 0x3f80), bn(21, 0x7fc0);
  for (uint16_t x : run3(h1, hn, h1, ridgeFloat16, ridgeMax, 0)) EXPECT_TRUE(isHalfNan(x));
  for (uint16_t x : run3(h1, h1, hn, ridgeFloat16, ridgeMin, 0)) EXPECT_TRUE(isHalfNan(x));
  for (uint16_t x : run3(b1, bn, b1, ridgeBfloat16, ridgeMax, 0)) EXPECT_TRUE(isBf16Nan(x));
  for (uint16_t x : run3(b1, b1, bn, ridgeBfloat16, ridgeMin, 0)) EXPECT_TRUE(isBf16Nan(x));
}

TEST_P(ReduceBothPaths, SingleSourceCopiesBitsAndDivides) {
  // A signalling-NaN fp16 pattern survives a one-source sum untouched (it is a copy).
  std::vector<uint16_t> s(13, 0x7d01), d(13, 0);
  const void* srcs[1] = {s.data()};
  reduceMany(d.data(), srcs, 1, s.size(), ridgeFloat16, ridgeSum, 0);
  EXPECT_EQ(d, s);
  std::vector<int32_t> i(13, -9), o(13, 0);
  srcs[0] = i.data();
  reduceMany(o.data(), srcs, 1, i.size(), ridgeInt32, ridgeAvg, 2);
  for (int32_t x : o) EXPECT_EQ(x, -4);
  reduceMany(o.data(), srcs, 1, i.size(), ridgeInt32, ridgeMax, 2);  // divisor ignored
  for (int32_t x : o) EXPECT_EQ(x, -9);
}

TEST_P(ReduceBothPaths, ZeroCountAndInvalidArgumentsWriteNothing) {
  std::vector<float> a(8, 1.0f), d(8, 7.0f);
  const void* srcs[2] = {a.data(), a.data()};
  reduceMany(d.data(), srcs, 2, 0, ridgeFloat32, ridgeSum, 0);
  reduceMany(d.data(), srcs, 0, 8, ridgeFloat32, ridgeSum, 0);
  reduceMany(d.data(), srcs, 2, 8, static_cast<ridgeDataType_t>(ridgeNumTypes), ridgeSum, 0);
  reduceMany(d.data(), srcs, 2, 8, ridgeFloat32, static_cast<ridgeRedOp_t>(ridgeNumOps), 0);
  reduce2(nullptr, nullptr, nullptr, 0, ridgeFloat32, ridgeSum, 0);
  for (float x : d) EXPECT_EQ(x, 7.0f);
  reduce2(d.data(), a.data(), a.data(), 8, ridgeFloat32, ridgeSum, 0);
  for (float x : d) EXPECT_EQ(x, 2.0f);
}

INSTANTIATE_TEST_SUITE_P(Paths, ReduceBothPaths, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return std::string(i.param ? "generic" : "best");
                         });

// ---- Conversions ----------------------------------------------------------------------

TEST(HalfConversion, AllPatternsToFloat) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = halfToFloat(static_cast<uint16_t>(h));
    if (isHalfNan(static_cast<uint16_t>(h))) {
      ASSERT_TRUE(std::isnan(f)) << h;
      EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << h;
      // Quiet NaN, payload kept in the top bits.
      EXPECT_EQ(floatToBits(f) & 0x7fffffffu, 0x7fc00000u | ((h & 0x3ffu) << 13)) << h;
    } else {
      ASSERT_EQ(static_cast<double>(f), refHalfToDouble(static_cast<uint16_t>(h))) << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << h;
    }
  }
}

TEST(HalfConversion, AllPatternsRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t back = floatToHalf(halfToFloat(static_cast<uint16_t>(h)));
    if (isHalfNan(static_cast<uint16_t>(h))) {
      EXPECT_EQ(back, h | 0x0200u) << h;  // quieted, otherwise unchanged
    } else {
      ASSERT_EQ(back, h) << h;
    }
  }
}

TEST(HalfConversion, MidpointsRoundToEven) {
  // Every pair of adjacent non-negative finite halves, plus 65504 -> inf.
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const double lo = refHalfToDouble(static_cast<uint16_t>(h));
    const double hi = h + 1 == 0x7c00 ? 65536.0 : refHalfToDouble(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // exact in float
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const uint16_t even = (h & 1) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h);
    ASSERT_EQ(floatToHalf(mid), even) << h;
    ASSERT_EQ(floatToHalf(-mid), even | 0x8000) << h;
    ASSERT_EQ(floatToHalf(std::nextafter(mid, 0.0f)), h) << h;
    ASSERT_EQ(floatToHalf(std::nextafter(mid, INFINITY)), h + 1) << h;
  }
  EXPECT_EQ(floatToHalf(65519.996f), 0x7bff);
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(floatToHalf(1e30f), 0x7c00);
  EXPECT_EQ(floatToHalf(-INFINITY), 0xfc00);
  EXPECT_EQ(floatToHalf(1e-30f), 0x0000);
  EXPECT_EQ(floatToHalf(-1e-30f), 0x8000);
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // half of the smallest: even
  EXPECT_EQ(floatToHalf(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_TRUE(isHalfNan(floatToHalf(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(isHalfNan(floatToHalf(bitsToFloat(0x7f800001u))));  // low-payload sNaN
  EXPECT_TRUE(isHalfNan(floatToHalf(bitsToFloat(0xff800001u))));
}

TEST(HalfConversion, RandomFloatsMatchReference) {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t u = static_cast<uint32_t>(rng());
    // Concentrate on the exponents where half is interesting.
    if (i & 1) u = (u & 0x807fffffu) | ((100u + (u >> 23) % 45u) << 23);
    const float f = bitsToFloat(u);
    const uint16_t got = floatToHalf(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(isHalfNan(got));
      continue;
    }
    ASSERT_EQ(got, refDoubleToHalf(f)) << std::hex << u;
  }
}

TEST(Bf16Conversion, AllPatterns) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t bb = static_cast<uint16_t>(b);
    const float f = bf16ToFloat(bb);
    const uint16_t back = floatToBf16(f);
    if (isBf16Nan(bb)) {
      ASSERT_TRUE(std::isnan(f));
      EXPECT_EQ(back, b | 0x0040u) << b;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), refBf16ToDouble(bb)) << b;
    ASSERT_EQ(back, b) << b;
    // Midpoint to the next pattern up in magnitude (finite ones only).
    if ((b & 0x7fff) < 0x7f80) {
      const uint32_t mid = (b << 16) + 0x8000u;
      const uint16_t even = (b & 1) ? static_cast<uint16_t>(b + 1) : bb;
      ASSERT_EQ(floatToBf16(bitsToFloat(mid)), even) << b;
      ASSERT_EQ(floatToBf16(bitsToFloat(mid - 1)), bb) << b;
      ASSERT_EQ(floatToBf16(bitsToFloat(mid + 1)), static_cast<uint16_t>(b + 1)) << b;
    }
  }
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
  EXPECT_TRUE(isBf16Nan(floatToBf16(bitsToFloat(0x7f800001u))));
  EXPECT_TRUE(isBf16Nan(floatToBf16(bitsToFloat(0xffff0001u))));
}

TEST(Bf16Conversion, RandomFloatsMatchReference) {
  std::mt19937_64 rng(43);
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t u = static_cast<uint32_t>(rng());
    const float f = bitsToFloat(u);
    const uint16_t got = floatToBf16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(isBf16Nan(got));
      continue;
    }
    ASSERT_EQ(got, refDoubleToBf16(f)) << std::hex << u;
  }
}

// Bulk conversions on both builds agree with the scalar ones bit for bit, NaNs included.
class BulkConversion : public ReduceBothPaths {};

TEST_P(BulkConversion, MatchesScalarOnEveryPattern) {
  std::vector<uint16_t> all(65536 + 5);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> f(all.size());
  halfToFloatN(f.data(), all.data(), all.size());
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(floatToBits(f[i]), floatToBits(halfToFloat(all[i]))) << i;
  bf16ToFloatN(f.data(), all.data(), all.size());
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(floatToBits(f[i]), floatToBits(bf16ToFloat(all[i]))) << i;

  std::mt19937_64 rng(7);
  std::vector<float> in(1 << 20);
  for (size_t i = 0; i < in.size(); ++i) {
    uint32_t u = static_cast<uint32_t>(rng());
    if (i % 3 == 0) u = (u & 0x807fffffu) | ((100u + (u >> 23) % 45u) << 23);
    if (i % 3 == 1) u = (u & 0xffffe000u) | ((i & 2) ? 0x1000u : 0x0fffu);  // near ties
    in[i] = bitsToFloat(u);
  }
  in.resize(in.size() - 3);  // a tail that is not a whole vector
  std::vector<uint16_t> out(in.size());
  floatToHalfN(out.data(), in.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(out[i], floatToHalf(in[i])) << std::hex << floatToBits(in[i]);
  floatToBf16N(out.data(), in.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(out[i], floatToBf16(in[i])) << std::hex << floatToBits(in[i]);
}

INSTANTIATE_TEST_SUITE_P(Paths, BulkConversion, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return std::string(i.param ? "generic" : "best");
                         });

// ---- The two builds agree -------------------------------------------------------------

// Inputs with every kind of special value mixed in.
uint64_t nastyInput(ridgeDataType_t t, std::mt19937_64& rng) {
  if (isIntType(t)) return rng();
  const uint64_t r = rng();
  switch (r % 8) {
    case 0: return encodeFloat(t, INFINITY);
    case 1: return encodeFloat(t, -INFINITY);
    case 2: return encodeFloat(t, (r & 64) ? 0.0 : -0.0);
    case 3: return encodeFloat(t, std::numeric_limits<double>::quiet_NaN());
    default: return randomFinite(t, rng);  // subnormals included
  }
}

TEST(ReducePaths, AvxAndGenericAgreeBitForBit) {
  if (!reduceHasSimdImpl()) GTEST_SKIP() << "no AVX2/F16C on this CPU";
  std::mt19937_64 rng(99);
  const size_t count = 4099;
  int compared = 0;
  for (ridgeDataType_t t : kAllTypes) {
    const size_t es = dataTypeSize(t);
    for (ridgeRedOp_t op : kAllOps) {
      for (int nsrcs = 1; nsrcs <= 5; ++nsrcs) {
        for (int div : {0, 3}) {
          std::vector<std::vector<uint8_t>> in(nsrcs, std::vector<uint8_t>(count * es));
          std::vector<const void*> srcs(nsrcs);
          for (int s = 0; s < nsrcs; ++s) {
            for (size_t i = 0; i < count; ++i) storeElem(in[s].data(), i, es, nastyInput(t, rng));
            srcs[s] = in[s].data();
          }
          std::vector<uint8_t> fast(count * es), slow(count * es);
          reduceForceScalarForTesting(false);
          ASSERT_STREQ(reduceImplName(), "avx2");
          reduceMany(fast.data(), srcs.data(), nsrcs, count, t, op, div);
          reduceForceScalarForTesting(true);
          ASSERT_STREQ(reduceImplName(), "generic");
          reduceMany(slow.data(), srcs.data(), nsrcs, count, t, op, div);
          reduceForceScalarForTesting(false);
          for (size_t i = 0; i < count; ++i) {
            ASSERT_TRUE(sameResult(t, loadElem(fast.data(), i, es), loadElem(slow.data(), i, es)))
                << dataTypeName(t) << " " << redOpName(op) << " nsrcs=" << nsrcs << " div=" << div
                << " index " << i << std::hex << " avx2=0x" << loadElem(fast.data(), i, es) << " generic=0x"
                << loadElem(slow.data(), i, es);
          }
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 10 * 5 * 5 * 2);
}

// ---- Names ----------------------------------------------------------------------------

TEST(ReduceNames, SizesNamesAndParsing) {
  const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
  const char* names[] = {"int8",   "uint8", "int32", "uint32", "int64",
                         "uint64", "half",  "float", "double", "bfloat16"};
  for (int i = 0; i < ridgeNumTypes; ++i) {
    const auto t = static_cast<ridgeDataType_t>(i);
    EXPECT_EQ(dataTypeSize(t), sizes[i]);
    EXPECT_STREQ(dataTypeName(t), names[i]);
    ridgeDataType_t back = ridgeNumTypes;
    ASSERT_TRUE(parseDataType(names[i], &back));
    EXPECT_EQ(back, t);
  }
  EXPECT_EQ(dataTypeSize(static_cast<ridgeDataType_t>(ridgeNumTypes)), 0u);
  EXPECT_EQ(dataTypeSize(static_cast<ridgeDataType_t>(-1)), 0u);
  const std::pair<const char*, ridgeDataType_t> aliases[] = {
      {"float16", ridgeFloat16}, {"fp16", ridgeFloat16}, {"float32", ridgeFloat32}, {"fp32", ridgeFloat32},
      {"float64", ridgeFloat64}, {"fp64", ridgeFloat64}, {"bf16", ridgeBfloat16},   {"char", ridgeInt8},
      {"int", ridgeInt32},       {"FP16", ridgeFloat16}, {"Double", ridgeFloat64}};
  for (const auto& [name, t] : aliases) {
    ridgeDataType_t got = ridgeNumTypes;
    EXPECT_TRUE(parseDataType(name, &got)) << name;
    EXPECT_EQ(got, t) << name;
  }
  ridgeDataType_t untouched = ridgeUint8;
  EXPECT_FALSE(parseDataType("float8", &untouched));
  EXPECT_FALSE(parseDataType("", &untouched));
  EXPECT_FALSE(parseDataType("int88", &untouched));
  EXPECT_FALSE(parseDataType(nullptr, &untouched));
  EXPECT_EQ(untouched, ridgeUint8);

  const char* ops[] = {"sum", "prod", "max", "min", "avg"};
  for (int i = 0; i < ridgeNumOps; ++i) {
    EXPECT_STREQ(redOpName(static_cast<ridgeRedOp_t>(i)), ops[i]);
    ridgeRedOp_t op = ridgeNumOps;
    ASSERT_TRUE(parseRedOp(ops[i], &op));
    EXPECT_EQ(op, static_cast<ridgeRedOp_t>(i));
  }
  ridgeRedOp_t op = ridgeSum;
  EXPECT_FALSE(parseRedOp("mean", &op));
  EXPECT_FALSE(parseRedOp("su", &op));
  EXPECT_EQ(op, ridgeSum);
  EXPECT_STREQ(redOpName(static_cast<ridgeRedOp_t>(ridgeNumOps)), "invalid");
  EXPECT_STREQ(dataTypeName(static_cast<ridgeDataType_t>(ridgeNumTypes)), "invalid");
}

// ---- Throughput (printed, not asserted) -----------------------------------------------

double bestSeconds(int reps, const std::function<void()>& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s < best) best = s;
  }
  return best;
}

TEST(ReduceThroughput, Reduce2FloatSum16MiB) {
  const size_t bytes = 16u << 20;
  const size_t n = bytes / sizeof(float);
  std::vector<float> a(n, 1.0f), b(n, 2.0f), d(n, 0.0f);
  const double tcopy = bestSeconds(10, [&] { std::memcpy(d.data(), a.data(), bytes); });
  std::printf("[ throughput ] memcpy 16 MiB: %.1f GB/s (read+write %.1f GB/s)\n", bytes / tcopy / 1e9,
              2 * bytes / tcopy / 1e9);
  for (bool scalar : {true, false}) {
    if (!scalar && !reduceHasSimdImpl()) continue;
    reduceForceScalarForTesting(scalar);
    const double t =
        bestSeconds(10, [&] { reduce2(d.data(), a.data(), b.data(), n, ridgeFloat32, ridgeSum, 0); });
    std::printf("[ throughput ] reduce2 float sum 16 MiB (%s): %.1f GB/s of output, %.1f GB/s moved\n",
                reduceImplName(), bytes / t / 1e9, 3 * bytes / t / 1e9);
    const size_t hn = bytes / 2;
    std::vector<uint16_t> ha(hn, 0x3c00), hb(hn, 0x4000), hd(hn, 0);
    for (ridgeDataType_t ht : {ridgeFloat16, ridgeBfloat16}) {
      const double th =
          bestSeconds(5, [&] { reduce2(hd.data(), ha.data(), hb.data(), hn, ht, ridgeSum, 0); });
      std::printf("[ throughput ] reduce2 %s sum 16 MiB (%s): %.1f GB/s of output\n", dataTypeName(ht),
                  reduceImplName(), bytes / th / 1e9);
    }
    std::vector<const void*> four = {a.data(), b.data(), a.data(), b.data()};
    const double t4 =
        bestSeconds(5, [&] { reduceMany(d.data(), four.data(), 4, n, ridgeFloat32, ridgeSum, 0); });
    std::printf("[ throughput ] reduceMany(4) float sum 16 MiB (%s): %.1f GB/s of output, %.1f GB/s moved\n",
                reduceImplName(), bytes / t4 / 1e9, 5 * bytes / t4 / 1e9);
    reduce2(d.data(), a.data(), b.data(), n, ridgeFloat32, ridgeSum, 0);
  }
  reduceForceScalarForTesting(false);
  EXPECT_EQ(d[n - 1], 3.0f);
}

// Every kernel on 256 KiB per buffer (cache resident), to spot one that fell off the
// vector path.
TEST(ReduceThroughput, AllKernelsInCache) {
  const size_t bytes = 256u << 10;
  std::vector<uint8_t> a(bytes, 1), b(bytes, 1), c(bytes, 1), d(bytes);
  for (bool scalar : {true, false}) {
    if (!scalar && !reduceHasSimdImpl()) continue;
    reduceForceScalarForTesting(scalar);
    std::printf("[ throughput ] %-8s GB/s of output, reduce2 / reduceMany(3), %s:\n", "", reduceImplName());
    for (ridgeDataType_t t : kAllTypes) {
      const size_t n = bytes / dataTypeSize(t);
      std::printf("[ throughput ]   %-8s", dataTypeName(t));
      for (ridgeRedOp_t op : kAllOps) {
        const int div = op == ridgeAvg ? 2 : 0;
        const double t2 = bestSeconds(5, [&] { reduce2(d.data(), a.data(), b.data(), n, t, op, div); });
        const void* srcs[3] = {a.data(), b.data(), c.data()};
        const double t3 = bestSeconds(5, [&] { reduceMany(d.data(), srcs, 3, n, t, op, div); });
        std::printf("  %s %5.1f/%5.1f", redOpName(op), bytes / t2 / 1e9, bytes / t3 / 1e9);
      }
      std::printf("\n");
    }
  }
  reduceForceScalarForTesting(false);
}

}  // namespace
}  // namespace ridge
