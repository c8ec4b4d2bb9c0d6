// Message authentication for the rendezvous: SipHash-2-4 (Aumasson and Bernstein), a keyed
// pseudo-random function with a 128-bit key and a 64-bit tag, made for short messages such
// as a hello. A rank proves that it knows the job's secret by tagging the root's random
// challenge with it; the secret itself never travels. Written from the published
// algorithm description; tests/bootstrap checks it against the paper's test vector.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace ridge::auth {

struct Key {
  uint64_t k0 = 0, k1 = 0;
};

inline uint64_t rotl(uint64_t x, int b) {
  return (x << b) | (x >> (64 - b));
}

inline uint64_t sipHash24(const Key& key, const void* data, size_t n) {
  uint64_t v0 = 0x736f6d6570736575ull ^ key.k0;
  uint64_t v1 = 0x646f72616e646f6dull ^ key.k1;
  uint64_t v2 = 0x6c7967656e657261ull ^ key.k0;
  uint64_t v3 = 0x7465646279746573ull ^ key.k1;
  auto round = [&] {
    v0 += v1;
    v1 = rotl(v1, 13);
    v1 ^= v0;
    v0 = rotl(v0, 32);
    v2 += v3;
    v3 = rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = rotl(v1, 17);
    v1 ^= v2;
    v2 = rotl(v2, 32);
  };
  const auto* p = static_cast<const uint8_t*>(data);
  const size_t whole = n & ~size_t{7};
  for (size_t i = 0; i < whole; i += 8) {
    uint64_t m = 0;
    for (int b = 0; b < 8; ++b) m |= static_cast<uint64_t>(p[i + b]) << (8 * b);  // little-endian words
    v3 ^= m;
    round();
    round();
    v0 ^= m;
  }
  uint64_t last = static_cast<uint64_t>(n & 0xff) << 56;
  for (size_t i = whole; i < n; ++i) last |= static_cast<uint64_t>(p[i]) << (8 * (i - whole));
  v3 ^= last;
  round();
  round();
  v0 ^= last;
  v2 ^= 0xff;
  for (int i = 0; i < 4; ++i) round();
  return v0 ^ v1 ^ v2 ^ v3;
}

// The key of a job from its 64-bit secret (the unique id's secret, or one derived from
// RIDGE_JOB_KEY / the launcher's job id).
inline Key keyFromSecret(uint64_t secret) {
  static const Key kDerive{0x52696467654a6f62ull, 0x4b65794465726976ull};  // "RidgeJob", "KeyDeriv"
  Key k;
  k.k0 = sipHash24(kDerive, &secret, sizeof secret);
  const uint64_t other = ~secret;
  k.k1 = sipHash24(kDerive, &other, sizeof other);
  return k;
}

// Incremental message builder: append fields, then tag.
class Tagger {
 public:
  explicit Tagger(const char label[4]) { append(label, 4); }
  Tagger& append(const void* p, size_t n) {
    buf_.append(static_cast<const char*>(p), n);
    return *this;
  }
  template <typename T>
  Tagger& field(const T& v) {
    return append(&v, sizeof v);
  }
  uint64_t tag(const Key& k) const { return sipHash24(k, buf_.data(), buf_.size()); }

 private:
  std::string buf_;
};

}  // namespace ridge::auth
