// The host collectives' ring order (placement by package and NUMA node).
#include <gtest/gtest.h>

#include <numeric>

#include "plan/host_plan.h"

namespace ridge::plan {
namespace {

TEST(HostPlan, OneNumaNodeIsTheIdentity) {
  std::vector<HostPlacement> ranks(6, HostPlacement{42, 0, 0});
  std::vector<int> identity(6);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(hostRingOrder(ranks), identity);
  // Unbound ranks (placement unknown) keep rank order too.
  EXPECT_EQ(hostRingOrder(std::vector<HostPlacement>(6, HostPlacement{42, -1, -1})), identity);
}

TEST(HostPlan, InterleavedSocketsCrossTheSocketLinkTwice) {
  // A launcher that binds ranks round-robin over two sockets: rank order would cross 8 times.
  std::vector<HostPlacement> ranks;
  for (int r = 0; r < 8; ++r) ranks.push_back({7, r % 2, r % 2});
  std::vector<int> identity(8);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(hostSocketCrossings(identity, ranks), 8);
  const std::vector<int> order = hostRingOrder(ranks);
  EXPECT_EQ(order, (std::vector<int>{0, 2, 4, 6, 1, 3, 5, 7}));
  EXPECT_EQ(hostSocketCrossings(order, ranks), 2);
}

TEST(HostPlan, HostsStayTogetherInOrderOfTheirLowestRank) {
  std::vector<HostPlacement> ranks = {{1, 0, 0}, {2, 1, 1}, {1, 1, 1}, {2, 0, 0}};
  EXPECT_EQ(hostRingOrder(ranks), (std::vector<int>{0, 2, 3, 1}));
}

}  // namespace
}  // namespace ridge::plan

// ---- host collectives run the plan --------------------------------------------------------

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "coll/comm.h"
#include "core/json.h"
#include "rank_launcher.h"

namespace ridge::plan {
namespace {

using ridgetest::LaunchResult;
using ridgetest::Reporter;

// Every rank contributes rank + 1 + i at element i: sums are small integers, exact in float
// whatever the order of the reduction.
std::vector<float> input(int rank, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>(rank + 1 + static_cast<int>(i % 7));
  return v;
}

bool checkAllReduce(ridgeComm_t comm, int me, int n, size_t count, Reporter& rep, const char* where) {
  std::vector<float> in = input(me, count), out(count, -1);
  ridgeResult_t r = ridgeAllReduce(in.data(), out.data(), count, ridgeFloat, ridgeSum, comm, nullptr);
  if (r != ridgeSuccess) {
    rep.fail(where, ridgetest::describeResult(r, comm));
    return false;
  }
  for (size_t i = 0; i < count; ++i) {
    const float want = static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 7));
    if (out[i] != want) {
      rep.fail(where, "element " + std::to_string(i) + " = " + std::to_string(out[i]) + ", want " +
                          std::to_string(want));
      return false;
    }
  }
  return true;
}

const char* algoOf(ridgeComm_t comm) {
  return comm->lastAlgo < 0 ? "none" : algoName(static_cast<Algo>(comm->lastAlgo));
}

// Runs `n` ranks that each do one small (4000 B) and one medium (400 KB) allreduce and
// report the algorithm that ran for each; returns them as "small medium" per rank.
std::vector<std::string> algorithmsThatRan(int n) {
  ridgetest::setLoopbackEnv();
  ridgeUniqueId id;
  if (!ridgetest::makeUniqueId(&id)) return {};
  std::vector<std::string> ran(static_cast<size_t>(n));
  LaunchResult res = ridgetest::launchRanks(
      n, 60,
      [&](int me, Reporter& rep) {
        ridgeComm_t comm = ridgetest::initRank(n, id, me, rep);
        if (!comm) return 2;
        bool ok = checkAllReduce(comm, me, n, 1000, rep, "small allreduce");
        const std::string small = algoOf(comm);
        ok = ok && checkAllReduce(comm, me, n, 100000, rep, "medium allreduce");
        rep.line("RAN " + small + " " + algoOf(comm) + " " +
                 std::to_string(comm->algoRuns[static_cast<int>(Algo::Tree)]));
        ridgeCommDestroy(comm);
        return ok ? 0 : 1;
      },
      [&](int rank, const std::string& line, double, ridgetest::LaunchControl&) {
        if (line.rfind("RAN ", 0) == 0) ran[static_cast<size_t>(rank)] = line.substr(4);
      });
  ridgetest::reportChildFailures(res, "ranks " + std::to_string(n));
  return ran;
}

TEST(HostCollectives, RidgeAlgoChangesWhatRuns) {
  unsetenv("RIDGE_PLAN_FILE");
  unsetenv("RIDGE_ALGO");
  // Defaults: all-pairs for small messages; direct (single copy) when CMA works, else ring.
  for (const std::string& r : algorithmsThatRan(3))
    EXPECT_TRUE(r == "allpairs direct 0" || r == "allpairs ring 0") << r;
  setenv("RIDGE_ALGO", "allreduce:0-64K:tree;allreduce:64K-:ring", 1);
  for (const std::string& r : algorithmsThatRan(3)) EXPECT_EQ(r, "tree ring 1");
  setenv("RIDGE_ALGO", "allreduce:0-:allpairs", 1);
  for (const std::string& r : algorithmsThatRan(3)) EXPECT_EQ(r, "allpairs allpairs 0");
  unsetenv("RIDGE_ALGO");
  // The measured crossover settings win over the cost model when set: all-pairs up to
  // 1 MiB, where the model runs direct or the ring at 400 KB.
  setenv("RIDGE_ALLPAIRS_MAX", "1M", 1);
  setenv("RIDGE_DIRECT_MIN", "2M", 1);
  for (const std::string& r : algorithmsThatRan(3)) EXPECT_EQ(r, "allpairs allpairs 0");
  unsetenv("RIDGE_ALLPAIRS_MAX");
  unsetenv("RIDGE_DIRECT_MIN");
}

TEST(HostCollectives, PlanFileSetsTheRingAndDumpShowsIt) {
  const std::string dir = ::testing::TempDir();
  const std::string file = dir + "ridge-plan-in.json", dump = dir + "ridge-plan-dump.json";
  std::ofstream(file) << R"({"format": "ridge-plan", "version": 1, "nranks": 4,
                             "channels": [{"kind": "ring", "ranks": [0, 2, 1, 3]}],
                             "algoRules": "allreduce:0-:ring;reducescatter:0-:ring;allgather:0-:ring;broadcast:0-:ring;reduce:0-:ring"})";
  std::remove(dump.c_str());
  setenv("RIDGE_PLAN_FILE", file.c_str(), 1);
  setenv("RIDGE_PLAN_DUMP", dump.c_str(), 1);
  unsetenv("RIDGE_ALGO");
  ridgetest::setLoopbackEnv();
  ridgeUniqueId id;
  ASSERT_TRUE(ridgetest::makeUniqueId(&id));
  const int n = 4;
  LaunchResult res = ridgetest::launchRanks(n, 60, [&](int me, Reporter& rep) {
    ridgeComm_t comm = ridgetest::initRank(n, id, me, rep);
    if (!comm) return 2;
    if (comm->ringOrder != std::vector<int>{0, 2, 1, 3})
      rep.fail("ring", "the plan file's ring is not in force");
    bool ok = true;
    for (size_t count : {size_t{1}, size_t{1000}, size_t{300001}}) {
      ok = ok && checkAllReduce(comm, me, n, count, rep, "allreduce");
      if (std::string(algoOf(comm)) != "ring") rep.fail("allreduce", std::string("ran ") + algoOf(comm));
      // ReduceScatter: rank r gets block r; AllGather puts block j at j; Broadcast/Reduce with
      // a root in the middle of the ring.
      std::vector<float> in = input(me, count * n), rs(count), ag(count * n), bc(count), rd(count, -1);
      ok = ok && ridgeReduceScatter(in.data(), rs.data(), count, ridgeFloat, ridgeSum, comm, nullptr) ==
                     ridgeSuccess;
      ok = ok && ridgeAllGather(rs.data(), ag.data(), count, ridgeFloat, comm, nullptr) == ridgeSuccess;
      ok = ok && ridgeBroadcast(in.data(), bc.data(), count, ridgeFloat, 1, comm, nullptr) == ridgeSuccess;
      ok = ok &&
           ridgeReduce(in.data(), rd.data(), count, ridgeFloat, ridgeSum, 2, comm, nullptr) == ridgeSuccess;
      const std::vector<float> rootInput = input(1, count * n);
      for (size_t i = 0; ok && i < count; ++i) {
        const size_t g = static_cast<size_t>(me) * count + i;
        const float sum = static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(g % 7));
        if (rs[i] != sum) rep.fail("reducescatter", "element " + std::to_string(i)), ok = false;
        if (bc[i] != rootInput[i]) rep.fail("broadcast", "element " + std::to_string(i)), ok = false;
        if (me == 2 && rd[i] != static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 7)))
          rep.fail("reduce", "element " + std::to_string(i)), ok = false;
      }
      for (size_t j = 0; ok && j < count * n; ++j)
        if (ag[j] != static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(j % 7)))
          rep.fail("allgather", "element " + std::to_string(j)), ok = false;
    }
    ridgeCommDestroy(comm);
    return ok ? 0 : 1;
  });
  ridgetest::reportChildFailures(res, "plan file");
  unsetenv("RIDGE_PLAN_FILE");
  unsetenv("RIDGE_PLAN_DUMP");
  json::Value doc;
  Status s = json::parseFile(dump, &doc);
  ASSERT_TRUE(s.isOk()) << s.message();
  const json::Value& ring = doc.get("channels")->items().front();
  ASSERT_EQ(ring.get("ranks")->size(), 4u);
  EXPECT_EQ(ring.get("ranks")->items()[1].asNumber(), 2);
  EXPECT_NE(doc.get("source")->asString().find("file"), std::string::npos);
  EXPECT_NE(doc.get("algoRules")->asString().find("allreduce:0-:ring"), std::string::npos);
}

// The binary tree with 7 ranks (depth 2, inner ranks with two children) and messages of
// several chunks: allreduce (sum and avg), reduce and broadcast with roots inside the ring,
// all forced to the tree; every rank counts the tree runs.
TEST(HostCollectives, TreeAllReduceReduceAndBroadcastOverSevenRanks) {
  unsetenv("RIDGE_PLAN_FILE");
  setenv("RIDGE_ALGO", "allreduce:0-:tree;reduce:0-:tree;broadcast:0-:tree", 1);
  ridgetest::setLoopbackEnv();
  ridgeUniqueId id;
  ASSERT_TRUE(ridgetest::makeUniqueId(&id));
  const int n = 7;
  LaunchResult res = ridgetest::launchRanks(n, 90, [&](int me, Reporter& rep) {
    ridgeComm_t comm = ridgetest::initRank(n, id, me, rep);
    if (!comm) return 2;
    bool ok = true;
    int calls = 0;
    for (size_t count : {size_t{1}, size_t{1000}, size_t{300001}}) {
      ok = ok && checkAllReduce(comm, me, n, count, rep, "tree allreduce");
      std::vector<float> in = input(me, count), avg(count, -1), bc(count, -1), rd(count, -1);
      ok = ok &&
           ridgeAllReduce(in.data(), avg.data(), count, ridgeFloat, ridgeAvg, comm, nullptr) == ridgeSuccess;
      ok = ok && ridgeBroadcast(in.data(), bc.data(), count, ridgeFloat, 5, comm, nullptr) == ridgeSuccess;
      ok = ok &&
           ridgeReduce(in.data(), rd.data(), count, ridgeFloat, ridgeSum, 3, comm, nullptr) == ridgeSuccess;
      calls += 4;
      const std::vector<float> rootInput = input(5, count);
      for (size_t i = 0; ok && i < count; ++i) {
        const int sum = n * (n + 1) / 2 + n * static_cast<int>(i % 7);
        if (avg[i] != static_cast<float>(sum) / static_cast<float>(n))
          rep.fail("tree avg", "element " + std::to_string(i)), ok = false;
        if (bc[i] != rootInput[i]) rep.fail("tree broadcast", "element " + std::to_string(i)), ok = false;
        if (me == 3 && rd[i] != static_cast<float>(sum))
          rep.fail("tree reduce", "element " + std::to_string(i)), ok = false;
        if (me != 3 && rd[i] != -1) rep.fail("tree reduce", "a non-root's output was written"), ok = false;
      }
    }
    if (comm->algoRuns[static_cast<int>(Algo::Tree)] != static_cast<uint64_t>(calls))
      rep.fail("tree", std::to_string(comm->algoRuns[static_cast<int>(Algo::Tree)]) + " tree runs of " +
                           std::to_string(calls));
    ridgeCommDestroy(comm);
    return ok ? 0 : 1;
  });
  ridgetest::reportChildFailures(res, "tree, 7 ranks");
  unsetenv("RIDGE_ALGO");
}

}  // namespace
}  // namespace ridge::plan
