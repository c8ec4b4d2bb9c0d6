// ridge-bench: element types, input patterns and result checking.
//
// Every input element is a small integer chosen by a hash of (source rank, global index).
// Because the values are integers of a few bits, every rank can compute what any output
// element must be, for any collective, without seeing the other ranks' buffers, and the
// exact results are representable in every type:
//
//   Move   (broadcast, allgather, alltoall, sendrecv): values in [-125, 126] (unsigned
//          types [0, 251]) minus the poison byte's value; 8 bits of mantissa hold them
//          exactly in bfloat16, int8 holds them, and the wide range makes a misplaced block
//          show up.
//   Reduce (sum, avg, max, min): values in [-6, 6] ([0, 12] unsigned), so a sum over
//          N ranks stays within +-6N: exact in half up to N = 341 and in bfloat16 up to
//          N = 42; integer sums that overflow (int8 beyond 21 ranks) are compared after
//          wrapping like the hardware does.
//   Prod:  values in {1, 2, -1} ({1, 2} unsigned) with the factor 2 only on ranks 0..7,
//          so |product| <= 256 whatever the rank count.
//
// Floating-point results are compared with a tolerance of eps(type) * nranks times the
// magnitude of the terms (sum, avg); max, min and prod must match exactly. Integer results
// must match exactly (avg truncates like ridgeAvg does).
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <type_traits>

#include "bench.h"

namespace rbench {

namespace {

constexpr TypeInfo kTypes[] = {
    {ridgeInt8, "int8", 1, false, true, 0.0},         {ridgeUint8, "uint8", 1, false, false, 0.0},
    {ridgeInt32, "int32", 4, false, true, 0.0},       {ridgeUint32, "uint32", 4, false, false, 0.0},
    {ridgeInt64, "int64", 8, false, true, 0.0},       {ridgeUint64, "uint64", 8, false, false, 0.0},
    {ridgeFloat16, "half", 2, true, true, 0x1p-10},   {ridgeFloat32, "float", 4, true, true, 0x1p-23},
    {ridgeFloat64, "double", 8, true, true, 0x1p-52}, {ridgeBfloat16, "bfloat16", 2, true, true, 0x1p-7},
};

// ---- 16-bit floats, converted by hand (no dependency on compiler extensions) ----------
float halfToFloat(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal: value = mant * 2^-24; normalise it into a float.
    float v = std::ldexp(float(mant), -24);
    return sign ? -v : v;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) return uint16_t(sign | 0x7c00u | (mant ? 0x200u : 0u));
  int e = int(exp) - 127 + 15;
  if (e >= 31) return uint16_t(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000u;
    unsigned shift = unsigned(14 - e);
    uint32_t h = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return uint16_t(sign | h);
  }
  uint32_t h = (uint32_t(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry may reach infinity
  return uint16_t(sign | h);
}

float bf16ToFloat(uint16_t b) {
  uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

struct Half {
  uint16_t bits;
};
struct Bf16 {
  uint16_t bits;
};

// Load/store of one element as double; wrap() maps an exact integer result to what the
// type holds after two's-complement overflow.
template <class T>
struct Access {
  static double load(const void* p, size_t i) { return double(static_cast<const T*>(p)[i]); }
  static void store(void* p, size_t i, double v) {
    if constexpr (std::is_floating_point_v<T>) {
      static_cast<T*>(p)[i] = T(v);
    } else {
      static_cast<T*>(p)[i] = T(int64_t(v));
    }
  }
  static double wrap(double v) {
    if constexpr (std::is_floating_point_v<T>) {
      return v;
    } else {
      return double(T(int64_t(v)));
    }
  }
};
template <>
struct Access<Half> {
  static double load(const void* p, size_t i) { return halfToFloat(static_cast<const uint16_t*>(p)[i]); }
  static void store(void* p, size_t i, double v) { static_cast<uint16_t*>(p)[i] = floatToHalf(float(v)); }
  static double wrap(double v) { return v; }
};
template <>
struct Access<Bf16> {
  static double load(const void* p, size_t i) { return bf16ToFloat(static_cast<const uint16_t*>(p)[i]); }
  static void store(void* p, size_t i, double v) { static_cast<uint16_t*>(p)[i] = floatToBf16(float(v)); }
  static double wrap(double v) { return v; }
};

template <class F>
auto dispatch(ridgeDataType_t t, F&& f) {
  switch (t) {
    case ridgeInt8: return f(Access<int8_t>{});
    case ridgeUint8: return f(Access<uint8_t>{});
    case ridgeInt32: return f(Access<int32_t>{});
    case ridgeUint32: return f(Access<uint32_t>{});
    case ridgeInt64: return f(Access<int64_t>{});
    case ridgeUint64: return f(Access<uint64_t>{});
    case ridgeFloat16: return f(Access<Half>{});
    case ridgeFloat64: return f(Access<double>{});
    case ridgeBfloat16: return f(Access<Bf16>{});
    case ridgeFloat32:
    default: return f(Access<float>{});
  }
}

constexpr unsigned char kPoisonByte = 0xA5;
constexpr int64_t kPoisonInt8 = int8_t(kPoisonByte);  // -91
constexpr int64_t kPoisonUint8 = kPoisonByte;         // 165

// A 64-bit mix of (rank, index); any good finaliser would do.
inline uint64_t mix(uint64_t rank, uint64_t g) {
  uint64_t h = g * 0x9e3779b97f4a7c15ull + (rank + 1) * 0xd1b54a32d192ed03ull;
  h ^= h >> 32;
  h *= 0xd6e8feb86659fd93ull;
  h ^= h >> 32;
  h *= 0xd6e8feb86659fd93ull;
  h ^= h >> 32;
  return h;
}

inline int64_t value(Pattern p, bool isSigned, int rank, uint64_t g) {
  uint64_t h = mix(uint64_t(rank), g);
  switch (p) {
    case Pattern::Move: {
      // The 0xA5 poison byte reads as -91 in int8 and 165 in uint8: never use those values,
      // so that an 8-bit element left unwritten cannot pass for a delivered one.
      int64_t v = isSigned ? int64_t(h % 251) - 125 : int64_t(h % 251);
      if (v == kPoisonInt8) return 126;
      if (v == kPoisonUint8) return 251;
      return v;
    }
    case Pattern::Reduce: return isSigned ? int64_t(h % 13) - 6 : int64_t(h % 13);
    case Pattern::Prod: {
      uint64_t q = h % 8;
      if (q == 0) return rank < 8 ? 2 : 1;
      if (q == 1) return isSigned ? -1 : 1;
      return 1;
    }
  }
  return 0;
}

}  // namespace

const TypeInfo& typeInfo(ridgeDataType_t t) {
  for (const auto& e : kTypes)
    if (e.type == t) return e;
  return kTypes[7];
}

bool parseType(const std::string& s, ridgeDataType_t* out) {
  for (const auto& e : kTypes) {
    if (s == e.name) {
      *out = e.type;
      return true;
    }
  }
  struct Alias {
    const char* name;
    ridgeDataType_t t;
  };
  static constexpr Alias kAliases[] = {
      {"fp16", ridgeFloat16},    {"float16", ridgeFloat16}, {"bf16", ridgeBfloat16},
      {"fp32", ridgeFloat32},    {"float32", ridgeFloat32}, {"fp64", ridgeFloat64},
      {"float64", ridgeFloat64}, {"char", ridgeInt8},       {"int", ridgeInt32},
  };
  for (const auto& a : kAliases) {
    if (s == a.name) {
      *out = a.t;
      return true;
    }
  }
  return false;
}

const char* opName(ridgeRedOp_t op) {
  switch (op) {
    case ridgeSum: return "sum";
    case ridgeProd: return "prod";
    case ridgeMax: return "max";
    case ridgeMin: return "min";
    case ridgeAvg: return "avg";
    default: return "?";
  }
}

namespace {
constexpr ridgeRedOp_t kOps[] = {ridgeSum, ridgeProd, ridgeMax, ridgeMin, ridgeAvg};
}  // namespace

std::vector<ridgeDataType_t> allTypes() {
  std::vector<ridgeDataType_t> out;
  for (const auto& e : kTypes) out.push_back(e.type);
  return out;
}

std::vector<ridgeRedOp_t> allOps() {
  return std::vector<ridgeRedOp_t>(std::begin(kOps), std::end(kOps));
}

bool parseOp(const std::string& s, ridgeRedOp_t* out) {
  for (auto op : kOps) {
    if (s == opName(op)) {
      *out = op;
      return true;
    }
  }
  return false;
}

Pattern patternFor(Coll c, ridgeRedOp_t op) {
  if (!collHasOp(c)) return Pattern::Move;
  return op == ridgeProd ? Pattern::Prod : Pattern::Reduce;
}

void fillPattern(ridgeDataType_t t, Pattern p, void* buf, size_t n, int srcRank, uint64_t g0) {
  const bool sgn = typeInfo(t).isSigned;
  dispatch(t, [&](auto acc) {
    using A = decltype(acc);
    for (size_t k = 0; k < n; ++k) A::store(buf, k, double(value(p, sgn, srcRank, g0 + k)));
    return 0;
  });
}

// Integers get 0xA5 bytes (far from every expected value except in 8 bits, see value()).
// Floating types get all-one bytes, a NaN in every width: 0xA5 bytes would read as a tiny
// number (-2.9e-16 in float) that passes the tolerance wherever the expected sum is 0.
void poison(ridgeDataType_t t, void* buf, size_t bytes) {
  std::memset(buf, typeInfo(t).isFloat ? 0xFF : kPoisonByte, bytes);
}

uint64_t countWrong(ridgeDataType_t t, Pattern p, ridgeRedOp_t op, int nranks, const void* out, size_t n,
                    const ExpectMap& m) {
  const TypeInfo& ti = typeInfo(t);
  const bool sgn = ti.isSigned;
  return dispatch(t, [&](auto acc) -> uint64_t {
    using A = decltype(acc);
    uint64_t wrong = 0;
    for (size_t k = 0; k < n; ++k) {
      int src = m.src;
      uint64_t g = m.gBase + k;
      if (m.block) {
        src = int(k / m.block);
        if (m.blockLocal) g = m.gBase + k % m.block;
      }
      double expect = 0.0, tol = 0.0;
      if (!m.reduction) {
        expect = double(value(p, sgn, src, g));
      } else {
        double r = double(value(p, sgn, 0, g));
        double mag = std::fabs(r);
        for (int q = 1; q < nranks; ++q) {
          double v = double(value(p, sgn, q, g));
          switch (op) {
            case ridgeProd: r *= v; break;
            case ridgeMax: r = v > r ? v : r; break;
            case ridgeMin: r = v < r ? v : r; break;
            default: r += v; break;  // sum, avg
          }
          mag += std::fabs(v);
        }
        if (op == ridgeAvg) {
          if (ti.isFloat) {
            expect = r / nranks;
            tol = ti.eps * nranks * (mag / nranks + 1.0);
          } else {
            expect = std::trunc(r / nranks);  // the exact average truncated toward zero
          }
        } else {
          expect = A::wrap(r);
          if (ti.isFloat && op == ridgeSum) tol = ti.eps * nranks * (mag + 1.0);
        }
      }
      double got = A::load(out, k);
      if (!(std::fabs(got - expect) <= tol)) ++wrong;  // NaN counts as wrong
    }
    return wrong;
  });
}

void divideBy(ridgeDataType_t t, void* buf, size_t n, int nranks) {
  const bool isFloat = typeInfo(t).isFloat;
  dispatch(t, [&](auto acc) {
    using A = decltype(acc);
    for (size_t k = 0; k < n; ++k) {
      double v = A::load(buf, k);
      A::store(buf, k, isFloat ? v / nranks : std::trunc(v / nranks));
    }
    return 0;
  });
}

}  // namespace rbench
