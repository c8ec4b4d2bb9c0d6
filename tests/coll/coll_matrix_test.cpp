// The collective matrix: every collective x every datatype x every reduction operator x
// in-place and out-of-place x 1..4 ranks x counts {0, 1, 33, 1009, 4099, 100003, 64 MiB}.
//
// Ranks are forked processes (one fork per rank count and size class, many cases per
// launch). The parent creates the unique id first, so its rendezvous thread serves the
// children. Each case uses a fresh seed; inputs are hashes of (seed, rank, index), outputs
// are poisoned before the call, and after it every element of the output is compared with
// a reference computed in double / 64-bit wrap-around, the send buffer must be unchanged
// and the guard zones before and after both buffers must still hold their poison. One
// case of two also shifts the buffers by one element so they are not 16-byte aligned.
//
// Budget choice for the 64 MiB cases (each moves 64 MiB per rank, and the reference of a
// reduction costs nranks hashes per element): every collective x every datatype with the
// sum operator (copy collectives have no operator), plus every other operator for
// float32, int32 and bfloat16, both placements, root rotating with the case index.
// Everything below 64 MiB runs the full cross product, with every root in turn for
// Reduce/Broadcast at counts up to 4099 (rotating root at 100003).
#include <set>

#include "matrix_cases.h"

namespace ridgetest {
namespace {
using namespace matrix;

void runMatrix(int n, bool large, double budgetSec) {
  setLoopbackEnv();
  // A rank that fails stops; its peers turn that into an error within this time.
  setenv("RIDGE_TIMEOUT", "30", 1);
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  const size_t ncases = buildCases(n, large).size();
  std::printf("matrix n=%d %s: %zu cases\n", n, large ? "64MiB" : "small", ncases);
  LaunchResult res =
      launchRanks(n, budgetSec, [&](int rank, Reporter& rep) { return matrixBody(rank, n, id, large, rep); });
  std::printf("matrix n=%d %s: %.1f s\n", n, large ? "64MiB" : "small", res.elapsed);
  reportChildFailures(res, "matrix n=" + std::to_string(n));
}

// Deadlines are below the ctest TIMEOUT so a slow run fails with a readable message. The
// 64 MiB matrices get generous deadlines: a hang is caught long before by RIDGE_TIMEOUT,
// while ranks2 on a shared 2-core machine under a load of 8 once needed more than 200 s.
TEST(CollMatrix, Ranks1Small) {
  runMatrix(1, false, 100);
}
TEST(CollMatrix, Ranks2Small) {
  runMatrix(2, false, 150);
}
TEST(CollMatrix, Ranks3Small) {
  runMatrix(3, false, 200);
}
TEST(CollMatrix, Ranks4Small) {
  runMatrix(4, false, 250);
}
TEST(CollMatrix, Ranks1Large) {
  runMatrix(1, true, 400);
}
TEST(CollMatrix, Ranks2Large) {
  runMatrix(2, true, 450);
}
TEST(CollMatrix, Ranks3Large) {
  runMatrix(3, true, 500);
}
TEST(CollMatrix, Ranks4Large) {
  runMatrix(4, true, 550);
}

// The case list itself: guards against a matrix that silently shrinks.
TEST(CollMatrix, CaseListCoversTheCrossProduct) {
  if (std::getenv("RIDGE_TEST_MATRIX_EXCLUDE") != nullptr) {
    GTEST_SKIP() << "RIDGE_TEST_MATRIX_EXCLUDE is set";
  }
  for (int n = 1; n <= 4; ++n) {
    std::set<std::string> seen;
    for (const Case& c : buildCases(n, false)) {
      seen.insert(std::string(collName(c.coll)) + dtName(c.dt) + opName(c.op) + (c.alt ? "1" : "0") +
                  std::to_string(c.count) + "r" + std::to_string(c.root));
    }
    size_t expect = 0;
    for (size_t count : {0, 1, 33, 1009, 4099, 100003}) {
      const size_t roots = count <= 4099 ? n : 1;
      const size_t perDtPlacement = 5 /*AllReduce*/ + 5 * roots /*Reduce*/ + roots /*Bcast*/ +
                                    1 /*AllGather*/ + 5 /*RS*/ + 1 /*A2A*/ + (n > 1 ? 1 : 0);
      expect += perDtPlacement * 10 * 2;
    }
    EXPECT_EQ(seen.size(), expect) << "n=" << n;
    size_t large = buildCases(n, true).size();
    EXPECT_EQ(large, (7u * 10u - (n == 1 ? 10u : 0u) + 3u * 3u * 4u) * 2u) << "n=" << n;
  }
}

}  // namespace
}  // namespace ridgetest

namespace ridgetest {
namespace {

// The checker itself must catch a wrong element, a value off by more than the tolerance
// and a wrong integer average; otherwise the matrix could not fail.
TEST(CollMatrixChecker, DetectsWrongResults) {
  const int n = 4;
  const size_t count = 1000;
  uint32_t keys[4];
  for (int r = 0; r < n; ++r) keys[r] = rankKey(99, r);
  // float32 sum: a correct result passes, one perturbed element is reported.
  std::vector<float> f(count);
  for (size_t i = 0; i < count; ++i) {
    double s = 0;
    for (int r = 0; r < n; ++r) s += genValue<TF32, ridgeSum>(elemHash(keys[r], i));
    f[i] = static_cast<float>(s);
  }
  Mismatches ok;
  checkReduced<TF32, ridgeSum>(f.data(), count, keys, n, 0, 0, ok);
  EXPECT_EQ(ok.count, 0u) << ok.text;
  f[517] += 0.01f;
  Mismatches bad;
  checkReduced<TF32, ridgeSum>(f.data(), count, keys, n, 0, 0, bad);
  EXPECT_EQ(bad.count, 1u);
  // int8 avg: the wrapped sum truncated toward zero; off by one is reported.
  std::vector<int8_t> a(count);
  for (size_t i = 0; i < count; ++i) {
    int8_t s = 0;
    for (int r = 0; r < n; ++r) s = static_cast<int8_t>(s + genValue<TI8, ridgeAvg>(elemHash(keys[r], i)));
    a[i] = static_cast<int8_t>(s / n);
  }
  Mismatches aok;
  checkReduced<TI8, ridgeAvg>(a.data(), count, keys, n, 0, 0, aok);
  EXPECT_EQ(aok.count, 0u) << aok.text;
  a[3] = static_cast<int8_t>(a[3] + 1);
  Mismatches abad;
  checkReduced<TI8, ridgeAvg>(a.data(), count, keys, n, 0, 0, abad);
  EXPECT_EQ(abad.count, 1u);
  // float16 max is exact; a raw copy with one flipped bit is reported.
  std::vector<uint16_t> h(count);
  for (size_t i = 0; i < count; ++i) {
    uint16_t best = genStore<TF16, ridgeMax>(elemHash(keys[0], i));
    for (int r = 1; r < n; ++r) {
      uint16_t v = genStore<TF16, ridgeMax>(elemHash(keys[r], i));
      if (halfToDouble(v) > halfToDouble(best)) best = v;
    }
    h[i] = best;
  }
  Mismatches hok;
  checkReduced<TF16, ridgeMax>(h.data(), count, keys, n, 0, 0, hok);
  EXPECT_EQ(hok.count, 0u) << hok.text;
  h[999] ^= 1;
  Mismatches hbad;
  checkReduced<TF16, ridgeMax>(h.data(), count, keys, n, 0, 0, hbad);
  EXPECT_EQ(hbad.count, 1u);
  std::vector<uint64_t> raw(count);
  fillRaw<8>(raw.data(), count, keys[2], 5);
  Mismatches rok;
  checkRaw<8>(raw.data(), count, keys[2], 5, 0, rok);
  EXPECT_EQ(rok.count, 0u);
  raw[0] ^= 1ull << 63;
  Mismatches rbad;
  checkRaw<8>(raw.data(), count, keys[2], 5, 0, rbad);
  EXPECT_EQ(rbad.count, 1u);
  // Different ranks and different seeds give different inputs.
  EXPECT_NE(elemHash(rankKey(1, 0), 7), elemHash(rankKey(1, 1), 7));
  EXPECT_NE(elemHash(rankKey(1, 0), 7), elemHash(rankKey(2, 0), 7));
}

}  // namespace
}  // namespace ridgetest
