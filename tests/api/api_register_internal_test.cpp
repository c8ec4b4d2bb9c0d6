// ridgeCommRegister seen from inside: the single-copy (direct, CMA) path consults the
// registrations and counts the collectives whose buffers were all registered. Links the
// static library to read the communicator's counters.
#include "coll/comm.h"
#include "rank_launcher.h"

namespace ridgetest {
namespace {

TEST(CommRegisterInternal, DirectPathCountsRegisteredBuffersOnly) {
  constexpr int n = 2;
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(n, 60, [&](int me, Reporter& rep) {
    ridgeComm_t comm = initRank(n, id, me, rep);
    if (!comm) return 2;
    const size_t count = 1 << 18;  // 1 MiB of int32 per rank: the direct algorithm's range
    std::vector<int32_t> in(count, me + 1), out(count * n, -1);
    auto allGather = [&](const char* what) {
      std::fill(out.begin(), out.end(), -1);
      ridgeResult_t r = ridgeAllGather(in.data(), out.data(), count, ridgeInt32, comm, nullptr);
      if (r != ridgeSuccess) rep.fail(what, describeResult(r));
      for (size_t i = 0; i < out.size(); ++i)
        if (out[i] != static_cast<int32_t>(i / count) + 1) {
          rep.fail(what, "wrong at " + std::to_string(i));
          break;
        }
    };
    allGather("unregistered");
    const uint64_t directRuns = comm->algoRuns[static_cast<int>(ridge::Algo::Direct)];
    if (directRuns == 0) {
      rep.line("SKIP the direct (CMA) algorithm is not available here");
      ridgeCommDestroy(comm);
      return 0;
    }
    if (comm->registeredDirectCalls.load() != 0) rep.fail("unregistered", "counted as registered");
    void *hIn = nullptr, *hOut = nullptr;
    if (ridgeCommRegister(comm, in.data(), in.size() * 4, &hIn) != ridgeSuccess ||
        ridgeCommRegister(comm, out.data(), out.size() * 4, &hOut) != ridgeSuccess)
      rep.fail("register", ridgeGetLastError(nullptr));
    allGather("registered");
    if (comm->registeredDirectCalls.load() != 1)
      rep.fail("registered",
               "counter " + std::to_string(comm->registeredDirectCalls.load()) + ", expected 1");
    // Only the input registered: the output is not covered, so the call does not count.
    ridgeCommDeregister(comm, hOut);
    allGather("half registered");
    if (comm->registeredDirectCalls.load() != 1) rep.fail("half registered", "counted");
    ridgeCommDeregister(comm, hIn);
    ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, "register internal");
  for (const RankResult& rr : res.ranks)
    if (!linesWith(rr, "SKIP ").empty()) GTEST_SKIP() << linesWith(rr, "SKIP ").front();
}

}  // namespace
}  // namespace ridgetest

#include "api_test_main.h"
