// Deterministic test data for the collective tests and the reference reductions.
//
// Every element of every rank's input is a hash of (seed, rank, index), so any rank can
// regenerate any peer's input without communication. The reference is computed in higher
// precision (double for floating types, 64-bit wrap-around for integers) one block of
// elements at a time, with the element type and operator as template parameters so that
// the inner loops have no indirect calls.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "ridge/ridge.h"

namespace ridgetest {

inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}
/** Key of one rank's input in one case. */
inline uint32_t rankKey(uint32_t seed, int rank) {
  return mix32(seed ^ mix32(static_cast<uint32_t>(rank) + 0x51ED270Bu));
}
inline uint32_t elemHash(uint32_t key, size_t idx) {
  return mix32((static_cast<uint32_t>(idx) * 0x9E3779B9u) ^ key);
}

// ---- 16-bit floating formats ---------------------------------------------------------
inline float bitsToFloat(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline uint32_t floatToBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
inline double halfToDouble(uint16_t h) {
  const uint32_t sign = h >> 15, exp = (h >> 10) & 31u, man = h & 1023u;
  if (exp != 0 && exp != 31) {  // normal: rebias the exponent, no libm call
    return bitsToFloat((sign << 31) | ((exp + 112u) << 23) | (man << 13));
  }
  double v;
  if (exp == 0) {
    v = std::ldexp(static_cast<double>(man), -24);
  } else if (exp == 31) {
    v = man ? std::nan("") : INFINITY;
  } else {
    v = std::ldexp(static_cast<double>(man | 1024u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}
/** Exact for zero and for normal fp16 values with at most 11 significant bits (all we make). */
inline uint16_t floatToHalfExact(float f) {
  const uint32_t b = floatToBits(f);
  const uint32_t sign = (b >> 16) & 0x8000u;
  if ((b & 0x7fffffffu) == 0) return static_cast<uint16_t>(sign);
  const uint32_t e = (b >> 23) & 255u;
  return static_cast<uint16_t>(sign | ((e - 112u) << 10) | ((b >> 13) & 0x3ffu));
}
inline double bf16ToDouble(uint16_t h) {
  return bitsToFloat(static_cast<uint32_t>(h) << 16);
}
/** Exact for floats with at most 8 significant bits (all we make). */
inline uint16_t floatToBf16Exact(float f) {
  return static_cast<uint16_t>(floatToBits(f) >> 16);
}

// ---- Type traits -----------------------------------------------------------------------
enum class Kind { Int, Float, Half, Bf16 };
template <class S_, Kind K, int DT>
struct TypeTag {
  using S = S_;  // storage type
  static constexpr Kind kind = K;
  static constexpr int dt = DT;
};
using TI8 = TypeTag<int8_t, Kind::Int, ridgeInt8>;
using TU8 = TypeTag<uint8_t, Kind::Int, ridgeUint8>;
using TI32 = TypeTag<int32_t, Kind::Int, ridgeInt32>;
using TU32 = TypeTag<uint32_t, Kind::Int, ridgeUint32>;
using TI64 = TypeTag<int64_t, Kind::Int, ridgeInt64>;
using TU64 = TypeTag<uint64_t, Kind::Int, ridgeUint64>;
using TF16 = TypeTag<uint16_t, Kind::Half, ridgeFloat16>;
using TF32 = TypeTag<float, Kind::Float, ridgeFloat32>;
using TF64 = TypeTag<double, Kind::Float, ridgeFloat64>;
using TBF16 = TypeTag<uint16_t, Kind::Bf16, ridgeBfloat16>;

inline size_t dtSize(int dt) {
  switch (dt) {
    case ridgeInt8:
    case ridgeUint8: return 1;
    case ridgeFloat16:
    case ridgeBfloat16: return 2;
    case ridgeInt32:
    case ridgeUint32:
    case ridgeFloat32: return 4;
    default: return 8;
  }
}
inline const char* dtName(int dt) {
  static const char* names[] = {"int8",   "uint8",   "int32",   "uint32",  "int64",
                                "uint64", "float16", "float32", "float64", "bfloat16"};
  return (dt >= 0 && dt < 10) ? names[dt] : "?";
}
inline const char* opName(int op) {
  static const char* names[] = {"sum", "prod", "max", "min", "avg"};
  return (op >= 0 && op < 5) ? names[op] : "?";
}
/** Machine epsilon of the storage type. */
template <class T>
constexpr double typeEps() {
  if constexpr (T::kind == Kind::Half)
    return 0x1p-10;
  else if constexpr (T::kind == Kind::Bf16)
    return 0x1p-7;
  else if constexpr (sizeof(typename T::S) == 4)
    return 0x1p-23;
  else
    return 0x1p-52;
}

// ---- Input values for reducing collectives ------------------------------------------------
// Integers: full-range random bits (prod: from {1,-1,2} so products stay meaningful).
// Floating: uniform in [-1,1) on a grid that the type represents exactly (prod: from
// {0.5,1,2,-1}, so every product of up to 4 is exact in every type).
template <class T, int OP>
inline auto genValue(uint32_t h) {
  using S = typename T::S;
  if constexpr (T::kind == Kind::Int) {
    if constexpr (OP == ridgeProd) {
      const uint32_t m = h % 3u;
      return static_cast<S>(m == 0 ? 1 : (m == 1 ? -1 : 2));
    } else if constexpr (sizeof(S) == 8) {
      return static_cast<S>((static_cast<uint64_t>(mix32(h ^ 0x68E31DA4u)) << 32) | h);
    } else {
      return static_cast<S>(h);
    }
  } else {
    if constexpr (OP == ridgeProd) {
      constexpr double tbl[4] = {0.5, 1.0, 2.0, -1.0};
      return tbl[h >> 30];
    } else if constexpr (T::kind == Kind::Half) {
      return static_cast<double>(static_cast<int>(h >> 21) - 1024) * 0x1p-10;
    } else if constexpr (T::kind == Kind::Bf16) {
      return static_cast<double>(static_cast<int>(h >> 24) - 128) * 0x1p-7;
    } else if constexpr (sizeof(S) == 4) {
      return static_cast<double>(h >> 8) * 0x1p-23 - 1.0;
    } else {
      return static_cast<double>(h) * 0x1p-31 - 1.0;
    }
  }
}
template <class T, int OP>
inline typename T::S genStore(uint32_t h) {
  using S = typename T::S;
  if constexpr (T::kind == Kind::Int)
    return genValue<T, OP>(h);
  else if constexpr (T::kind == Kind::Half)
    return floatToHalfExact(static_cast<float>(genValue<T, OP>(h)));
  else if constexpr (T::kind == Kind::Bf16)
    return floatToBf16Exact(static_cast<float>(genValue<T, OP>(h)));
  else
    return static_cast<S>(genValue<T, OP>(h));
}
template <class T>
inline double decode(typename T::S s) {
  if constexpr (T::kind == Kind::Half)
    return halfToDouble(s);
  else if constexpr (T::kind == Kind::Bf16)
    return bf16ToDouble(s);
  else
    return static_cast<double>(s);
}

/** Collects the first few mismatches of a check. */
struct Mismatches {
  size_t count = 0;
  std::string text;
  /** Counts one mismatch; true when its text should be recorded (the first three). */
  bool note() { return ++count <= 3; }
  void add(size_t idx, const std::string& got, const std::string& want) {
    if (!text.empty()) text += "; ";
    text += "[" + std::to_string(idx) + "] got " + got + " want " + want;
  }
};
inline std::string fmtD(double v) {
  char b[48];
  std::snprintf(b, sizeof b, "%.10g", v);
  return b;
}
template <class S>
inline std::string fmtInt(S v) {
  if constexpr (std::is_signed_v<S>)
    return std::to_string(static_cast<long long>(v));
  else
    return std::to_string(static_cast<unsigned long long>(v));
}
inline std::string fmtHex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

template <class T, int OP>
void fillInput(void* dst, size_t count, uint32_t key, size_t base) {
  using S = typename T::S;
  S* p = static_cast<S*>(dst);
  for (size_t i = 0; i < count; ++i) p[i] = genStore<T, OP>(elemHash(key, base + i));
}

template <class T, int OP>
void checkInput(const void* src, size_t count, uint32_t key, size_t base, size_t reportBase, Mismatches& mm) {
  using S = typename T::S;
  const S* p = static_cast<const S*>(src);
  for (size_t i = 0; i < count; ++i) {
    S want = genStore<T, OP>(elemHash(key, base + i));
    if (std::memcmp(&want, &p[i], sizeof(S)) != 0) {
      if (!mm.note()) continue;
      if constexpr (T::kind == Kind::Int)
        mm.add(reportBase + i, fmtInt(p[i]), fmtInt(want));
      else
        mm.add(reportBase + i, fmtD(decode<T>(p[i])), fmtD(decode<T>(want)));
    }
  }
}

/**
 * Checks `count` reduced elements against the reference over ranks 0..n-1, whose inputs
 * start at element `base` of each rank's generated sequence.
 */
template <class T, int OP>
void checkReduced(const void* out, size_t count, const uint32_t* keys, int n, size_t base, size_t reportBase,
                  Mismatches& mm) {
  using S = typename T::S;
  constexpr size_t B = 256;
  const S* p = static_cast<const S*>(out);
  for (size_t b0 = 0; b0 < count; b0 += B) {
    const size_t len = std::min(B, count - b0);
    if constexpr (T::kind == Kind::Int) {
      // sum/prod/avg: 64-bit wrap-around, truncated to S at the end (equal to S arithmetic);
      // max/min: native comparisons.
      using Acc = std::conditional_t<(OP == ridgeMax || OP == ridgeMin), S, uint64_t>;
      Acc acc[B];
      for (size_t j = 0; j < len; ++j)
        acc[j] = static_cast<Acc>(genValue<T, OP>(elemHash(keys[0], base + b0 + j)));
      for (int r = 1; r < n; ++r) {
        const uint32_t k = keys[r];
        for (size_t j = 0; j < len; ++j) {
          const S v = genValue<T, OP>(elemHash(k, base + b0 + j));
          if constexpr (OP == ridgeSum || OP == ridgeAvg)
            acc[j] += static_cast<uint64_t>(v);
          else if constexpr (OP == ridgeProd)
            acc[j] *= static_cast<uint64_t>(v);
          else if constexpr (OP == ridgeMax)
            acc[j] = std::max<S>(acc[j], v);
          else
            acc[j] = std::min<S>(acc[j], v);
        }
      }
      for (size_t j = 0; j < len; ++j) {
        S want = static_cast<S>(acc[j]);
        // avg: the wrapped sum divided by nranks with truncation toward zero.
        if constexpr (OP == ridgeAvg) want = static_cast<S>(want / static_cast<S>(n));
        if (p[b0 + j] != want && mm.note()) mm.add(reportBase + b0 + j, fmtInt(p[b0 + j]), fmtInt(want));
      }
    } else {
      double acc[B], sabs[B];
      for (size_t j = 0; j < len; ++j) {
        acc[j] = genValue<T, OP>(elemHash(keys[0], base + b0 + j));
        sabs[j] = std::fabs(acc[j]);
      }
      for (int r = 1; r < n; ++r) {
        const uint32_t k = keys[r];
        for (size_t j = 0; j < len; ++j) {
          const double v = genValue<T, OP>(elemHash(k, base + b0 + j));
          if constexpr (OP == ridgeSum || OP == ridgeAvg) {
            acc[j] += v;
            sabs[j] += std::fabs(v);
          } else if constexpr (OP == ridgeProd) {
            acc[j] *= v;
          } else if constexpr (OP == ridgeMax) {
            acc[j] = std::max(acc[j], v);
          } else {
            acc[j] = std::min(acc[j], v);
          }
        }
      }
      constexpr double eps = typeEps<T>();
      for (size_t j = 0; j < len; ++j) {
        double want = acc[j], tol = 0.0;
        // Sums: every partial sum may be rounded (to fp32, or to the 16-bit type when a
        // step stores it), each rounding bounded by eps * sum|x|; n ranks -> n+1 roundings.
        if constexpr (OP == ridgeSum) {
          tol = (n + 1) * eps * sabs[j];
        } else if constexpr (OP == ridgeAvg) {
          want = acc[j] / n;
          tol = (n + 1) * eps * sabs[j] / n + eps * std::fabs(want);
        }
        // prod (powers of two and -1), max and min are exact.
        const double got = decode<T>(p[b0 + j]);
        if (!(std::fabs(got - want) <= tol) && mm.note()) {
          mm.add(reportBase + b0 + j, fmtD(got), fmtD(want) + " (tol " + fmtD(tol) + ")");
        }
      }
    }
  }
}

// ---- Raw bytes for the copying collectives (broadcast, gathers, all-to-all, send/recv) --
// Full-range bits, NaN patterns included: a copy must move them unchanged.
template <size_t ESZ>
struct RawT;
template <>
struct RawT<1> {
  using U = uint8_t;
};
template <>
struct RawT<2> {
  using U = uint16_t;
};
template <>
struct RawT<4> {
  using U = uint32_t;
};
template <>
struct RawT<8> {
  using U = uint64_t;
};

template <size_t ESZ>
inline typename RawT<ESZ>::U rawValue(uint32_t h) {
  if constexpr (ESZ == 8)
    return (static_cast<uint64_t>(mix32(h ^ 0x2545F491u)) << 32) | h;
  else
    return static_cast<typename RawT<ESZ>::U>(h);
}
template <size_t ESZ>
void fillRaw(void* dst, size_t count, uint32_t key, size_t base) {
  auto* p = static_cast<typename RawT<ESZ>::U*>(dst);
  for (size_t i = 0; i < count; ++i) p[i] = rawValue<ESZ>(elemHash(key, base + i));
}
template <size_t ESZ>
void checkRaw(const void* src, size_t count, uint32_t key, size_t base, size_t reportBase, Mismatches& mm) {
  const auto* p = static_cast<const typename RawT<ESZ>::U*>(src);
  for (size_t i = 0; i < count; ++i) {
    const auto want = rawValue<ESZ>(elemHash(key, base + i));
    if (p[i] != want && mm.note()) mm.add(reportBase + i, fmtHex(p[i]), fmtHex(want));
  }
}
inline void fillRawAny(size_t esz, void* dst, size_t count, uint32_t key, size_t base) {
  switch (esz) {
    case 1: fillRaw<1>(dst, count, key, base); break;
    case 2: fillRaw<2>(dst, count, key, base); break;
    case 4: fillRaw<4>(dst, count, key, base); break;
    default: fillRaw<8>(dst, count, key, base); break;
  }
}
inline void checkRawAny(size_t esz, const void* src, size_t count, uint32_t key, size_t base,
                        size_t reportBase, Mismatches& mm) {
  switch (esz) {
    case 1: checkRaw<1>(src, count, key, base, reportBase, mm); break;
    case 2: checkRaw<2>(src, count, key, base, reportBase, mm); break;
    case 4: checkRaw<4>(src, count, key, base, reportBase, mm); break;
    default: checkRaw<8>(src, count, key, base, reportBase, mm); break;
  }
}

// ---- Dispatch table: one set of function pointers per (datatype, op) ------------------
struct TypedOps {
  void (*fill)(void*, size_t, uint32_t, size_t);
  void (*checkIn)(const void*, size_t, uint32_t, size_t, size_t, Mismatches&);
  void (*checkRed)(const void*, size_t, const uint32_t*, int, size_t, size_t, Mismatches&);
};
template <class T, int OP>
constexpr TypedOps makeOps() {
  return {&fillInput<T, OP>, &checkInput<T, OP>, &checkReduced<T, OP>};
}
template <class T>
constexpr void fillRow(TypedOps* row) {
  row[0] = makeOps<T, 0>();
  row[1] = makeOps<T, 1>();
  row[2] = makeOps<T, 2>();
  row[3] = makeOps<T, 3>();
  row[4] = makeOps<T, 4>();
}
inline const TypedOps& typedOps(int dt, int op) {
  static TypedOps table[10][5];
  static bool init = [] {
    fillRow<TI8>(table[ridgeInt8]);
    fillRow<TU8>(table[ridgeUint8]);
    fillRow<TI32>(table[ridgeInt32]);
    fillRow<TU32>(table[ridgeUint32]);
    fillRow<TI64>(table[ridgeInt64]);
    fillRow<TU64>(table[ridgeUint64]);
    fillRow<TF16>(table[ridgeFloat16]);
    fillRow<TF32>(table[ridgeFloat32]);
    fillRow<TF64>(table[ridgeFloat64]);
    fillRow<TBF16>(table[ridgeBfloat16]);
    return true;
  }();
  (void)init;
  return table[dt][op];
}

}  // namespace ridgetest
