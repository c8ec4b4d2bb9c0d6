// Every collective at the counts around the host algorithms' thresholds and chunk sizes, on
// 2 and 3 ranks, with the default choice (the cost model) and with each algorithm forced by
// RIDGE_ALGO, in place, out of place and (all-to-all, whose direct form changes with the
// placement) mixed: rank 0 in place, the others not. The checks are the matrix's
// (matrix_cases.h): hashed inputs, poisoned outputs and guard zones, a reference in double.
//
// Thresholds (bytes per rank as the selector counts them: docs/algorithms.md):
// RIDGE_ALLPAIRS_MAX 64 KiB, RIDGE_DIRECT_MIN 256 KiB, RIDGE_DIRECT_MAX 8 MiB; chunks: the
// shared-memory slot (256 KiB) and the CMA bounce chunk (128 KiB), whose even and odd
// chunks the two ranks of an in-place direct all-to-all pair split between them.
#include "matrix_cases.h"

namespace ridgetest {
namespace {
using namespace matrix;

constexpr size_t kFloats[] = {
    1,  // below every threshold
    16383,
    16385,          // around 64 KiB
    32768 * 3 + 7,  // three and a bit bounce chunks: both parities, a short last chunk
    65535,
    65537,  // around 256 KiB
    2097151,
    2097153,  // around 8 MiB
};

// The cases of one run: every collective at every count above, in place and out of
// place (mixed too for all-to-all); float32 sum, bfloat16 sum at one count (its rounding
// of partial sums differs between the algorithms).
std::vector<Case> thresholdCases(int rank, int n) {
  std::vector<Case> cases;
  uint32_t seed = 0x5eed0000;
  for (int coll = 0; coll < kNumColl; ++coll)
    for (size_t count : kFloats)
      for (int placement = 0; placement < 3; ++placement) {
        if (placement == 2 && coll != kAlltoAll) continue;
        // Mixed: rank 0 in place, the others out of place.
        const bool alt = placement == 1 || (placement == 2 && rank == 0);
        // Bound the 3-rank reductions' reference time: the largest counts at 2 ranks only.
        if (n > 2 && count > 1000000 && isReducing(coll)) continue;
        // Odd counts also move the buffers off their alignment by one element.
        cases.push_back(Case{coll, ridgeFloat32, ridgeSum, alt, count, int(count % n), ++seed,
                             count % 2 ? 4u : 0u, false});
        if (count == 65537 && isReducing(coll))
          cases.push_back(Case{coll, ridgeBfloat16, ridgeSum, alt, count, 0, ++seed, 0, false});
      }
  return cases;
}

int thresholdBody(int rank, int n, const ridgeUniqueId& id, Reporter& rep) {
  ridgeComm_t comm = initRank(n, id, rank, rep);
  if (!comm) return 2;
  CaseRunner runner(comm, rank, n, rep);
  if (!runner.ok()) {
    rep.fail("rank " + std::to_string(rank), "cannot map test buffers");
    return 3;
  }
  const std::vector<Case> cases = thresholdCases(rank, n);
  size_t done = 0;
  for (const Case& c : cases) {
    rep.line("CASE " + caseName(c, n));
    if (!runner.run(c)) break;
    ++done;
  }
  if (done != cases.size())
    rep.fail("rank " + std::to_string(rank),
             "stopped after " + std::to_string(done) + " of " + std::to_string(cases.size()) + " cases");
  const ridgeResult_t r = ridgeCommDestroy(comm);
  if (r != ridgeSuccess) rep.fail("rank " + std::to_string(rank), "ridgeCommDestroy: " + describeResult(r));
  return 0;
}

// `algo` empty: the default choice; else RIDGE_ALGO forcing it for every collective (one
// that lacks it runs its ring, all-to-all its all-pairs form: src/coll/algo_select.cpp).
void runThresholds(int n, const std::string& algo) {
  setLoopbackEnv();
  setenv("RIDGE_TIMEOUT", "30", 1);
  std::string rules;
  if (!algo.empty())
    for (const char* coll : {"allreduce", "broadcast", "reduce", "allgather", "reducescatter", "alltoall"})
      rules += std::string(rules.empty() ? "" : ";") + coll + ":0-:" + algo;
  if (rules.empty())
    unsetenv("RIDGE_ALGO");
  else
    setenv("RIDGE_ALGO", rules.c_str(), 1);
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res =
      launchRanks(n, 240, [&](int rank, Reporter& rep) { return thresholdBody(rank, n, id, rep); });
  unsetenv("RIDGE_ALGO");
  std::printf("thresholds n=%d algo=%s: %.1f s\n", n, algo.empty() ? "default" : algo.c_str(), res.elapsed);
  reportChildFailures(res, "thresholds n=" + std::to_string(n) + " " + (algo.empty() ? "default" : algo));
}

TEST(CollThresholds, TwoRanksDefault) {
  runThresholds(2, "");
}
TEST(CollThresholds, TwoRanksDirect) {
  runThresholds(2, "direct");
}
TEST(CollThresholds, TwoRanksAllPairs) {
  runThresholds(2, "allpairs");
}
TEST(CollThresholds, ThreeRanksDefault) {
  runThresholds(3, "");
}
TEST(CollThresholds, ThreeRanksDirect) {
  runThresholds(3, "direct");
}

}  // namespace
}  // namespace ridgetest
