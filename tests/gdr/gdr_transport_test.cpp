// The gdr transport under the collectives: forked ranks, RIDGE_SHM=0 and RIDGE_NET=softnic so
// that every byte goes through the software NIC, the host build of the device-side code as the
// "GPU". Results must be exact, no staged slot may be lost or overwritten, tiny staging must
// show credit stalls, and every run is bounded by the launcher's time limit.
#include "transports/gdr/gdr_transport.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "gdr_rank_body.h"
#include "rank_launcher.h"

namespace ridgetest {
namespace {

constexpr double kLimitSec = 50;

struct Env {
  const char* mode = "write";
  const char* slots = "4";
  const char* slotBytes = "128K";
  const char* faults = "";
  const char* model = "";
};

void applyEnv(const Env& e) {
  setLoopbackEnv();
  setenv("RIDGE_SHM", "0", 1);
  setenv("RIDGE_NET", "softnic", 1);
  setenv("RIDGE_TIMEOUT", getenv("GDR_TEST_TIMEOUT") ? getenv("GDR_TEST_TIMEOUT") : "40", 1);
  setenv("RIDGE_GDR_MODE", e.mode, 1);
  setenv("RIDGE_GDR_STAGING_SLOTS", e.slots, 1);
  setenv("RIDGE_GDR_SLOT_BYTES", e.slotBytes, 1);
  setenv("RIDGE_GDR_RECV_SLOTS", "4", 1);
  setenv("RIDGE_SOFTNIC_FAULTS", e.faults, 1);
  setenv("RIDGE_SOFTNIC_RTO_US", "1000", 1);
  setenv("RIDGE_SOFTNIC_PCIE_MODEL", e.model, 1);
}

int runRank(int n, const ridgeUniqueId& id, int me, Reporter& rep, const std::vector<size_t>& counts) {
  ridgeComm_t comm = initRank(n, id, me, rep);
  if (!comm) return 2;
  return runGdrExchanges(comm, n, me, rep, counts);
}

using RankCounters = GdrRankCounters;

std::vector<RankCounters> runCase(int n, const Env& env, const std::vector<size_t>& counts) {
  applyEnv(env);
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return {};
  LaunchResult res =
      launchRanks(n, kLimitSec, [&](int me, Reporter& rep) { return runRank(n, id, me, rep, counts); });
  reportChildFailures(res, std::string("gdr ") + env.mode);
  EXPECT_FALSE(res.timedOut) << "hang: not finished within " << kLimitSec << " s";
  return parseGdrCounters(res);
}

void expectHealthy(const std::vector<RankCounters>& ranks, const char* mode) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankCounters& c = ranks[r];
    EXPECT_EQ(c.mode, mode) << "rank " << r;
    EXPECT_GT(c.written, 0u) << "rank " << r << ": the gdr transport carried nothing";
    EXPECT_EQ(c.written, c.landed) << "rank " << r
                                   << ": every rank sends and receives the same slot count here";
    EXPECT_EQ(c.lost, 0u) << "rank " << r << ": staged data dropped or overwritten";
    EXPECT_EQ(c.errors, 0u) << "rank " << r;
  }
}

const std::vector<size_t> kCounts = {1, 1000, 70000};

TEST(GdrTransport, WriteTwoRanks) {
  auto ranks = runCase(2, Env{}, kCounts);
  ASSERT_EQ(ranks.size(), 2u);
  expectHealthy(ranks, "gdr-write");
  EXPECT_EQ(ranks[0].tier, "nic") << "the softnic's staging memory is the tier for the CPU stand-in";
}

// One staging slot of 4 KiB: every slot waits for the credit of the one before.
TEST(GdrTransport, WriteOneSlotFourRanksStalls) {
  Env e;
  e.slots = "1";
  e.slotBytes = "4K";
  auto ranks = runCase(4, e, {1, 5000, 40000});
  ASSERT_EQ(ranks.size(), 4u);
  expectHealthy(ranks, "gdr-write");
  for (const RankCounters& c : ranks) EXPECT_GT(c.stalls, 0u) << "one slot must stall on credits";
}

// 4 KiB of staging in four slots, with loss, duplication, reordering and delay on the wire.
TEST(GdrTransport, WriteFourKiBStagingWithFaults) {
  Env e;
  e.slots = "4";
  e.slotBytes = "1K";
  e.faults = "drop=0.02,dup=0.02,reorder=0.02,delay=0.03:300us,seed=11";
  auto ranks = runCase(3, e, {1, 3000, 30000});
  ASSERT_EQ(ranks.size(), 3u);
  expectHealthy(ranks, "gdr-write");
  unsigned long long faults = 0;
  for (const RankCounters& c : ranks) {
    EXPECT_GT(c.stalls, 0u);
    faults += c.faults;
  }
  EXPECT_GT(faults, 0u) << "the software NIC injected no fault";
}

TEST(GdrTransport, ReadAndStagedModes) {
  auto read = runCase(2, Env{"read"}, {1000, 70000});
  expectHealthy(read, "gdr-read");
  auto staged = runCase(2, Env{"staged", "2", "16K"}, {1000, 70000});
  expectHealthy(staged, "host-staged");
}

// auto with the cross-rc model: the advisor picks the mode and the data path is paced.
TEST(GdrTransport, AutoModePacedByCrossRcModel) {
  Env e;
  e.mode = "auto";
  e.model = "cross-rc";
  auto ranks = runCase(2, e, {1000, 70000});
  ASSERT_EQ(ranks.size(), 2u);
  for (const RankCounters& c : ranks) {
    EXPECT_EQ(c.paced, "paced");
    EXPECT_EQ(c.lost, 0u);
  }
  // The model decides; record what it decided so a change in the advisor shows up here.
  std::printf("cross-rc auto mode: %s\n", ranks[0].mode.c_str());
  EXPECT_TRUE(ranks[0].mode == "gdr-write" || ranks[0].mode == "host-staged" || ranks[0].mode == "gdr-read");
}

}  // namespace
}  // namespace ridgetest

namespace ridgetest {
namespace {

// A rank leaves as soon as its own part of a collective is done: rank 0 destroys its
// communicator right after the allreduce returns, while its last chunk may still be queued
// (paced: a doorbell not yet due; unpaced: a send on the wire) and rank 1 is still waiting
// for it. The transport must deliver what was posted before closing, and rank 1 must be able
// to consume a slot that landed before the peer's queue pairs went away. Before the fix rank
// 1 failed with "the queue pair to rank 0 failed" in about one run of three (paced).
int leaveEarlyRank(int n, const ridgeUniqueId& id, int me, Reporter& rep, int rounds) {
  ridgeComm_t comm = initRank(n, id, me, rep);
  if (!comm) return 2;
  const size_t count = 48000;  // several slots per ring step
  std::vector<int32_t> in(count), out(count);
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<int32_t>(elemHash(rankKey(round, me), i));
    ridgeResult_t r = ridgeAllReduce(in.data(), out.data(), count, ridgeInt32, ridgeSum, comm, nullptr);
    if (r != ridgeSuccess) {
      rep.fail("allreduce", "round " + std::to_string(round) + ": " + describeResult(r, comm));
      return 1;
    }
    for (size_t i = 0; i < count; ++i) {
      uint32_t want = 0;
      for (int k = 0; k < n; ++k) want += elemHash(rankKey(round, k), i);
      if (static_cast<uint32_t>(out[i]) != want) {
        rep.fail("allreduce", "round " + std::to_string(round) + ": wrong sum at " + std::to_string(i));
        return 1;
      }
    }
  }
  // No finalize: the rank leaves without waiting for its peers.
  ridgeCommDestroy(comm);
  return 0;
}

void runLeaveEarly(const Env& env) {
  // Each run is a new pair of processes; a few rounds and runs make the race likely.
  for (int run = 0; run < 4; ++run) {
    applyEnv(env);
    setenv("RIDGE_GDR_PACE_SCALE", "200", 1);
    ridgeUniqueId id;
    ASSERT_TRUE(makeUniqueId(&id));
    LaunchResult res =
        launchRanks(2, kLimitSec, [&](int me, Reporter& rep) { return leaveEarlyRank(2, id, me, rep, 3); });
    unsetenv("RIDGE_GDR_PACE_SCALE");
    reportChildFailures(res, std::string("leave early, run ") + std::to_string(run));
    ASSERT_FALSE(res.timedOut);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(GdrTransport, RankLeavingAfterItsLastSendPaced) {
  Env e;
  e.model = "cross-rc";
  e.slotBytes = "16K";
  runLeaveEarly(e);
}

TEST(GdrTransport, RankLeavingAfterItsLastSend) {
  Env e;
  e.slotBytes = "16K";
  runLeaveEarly(e);
}

// Rank 0 peeks the slot rank 1 sent (its NIC acknowledged it) and then waits for a send
// credit from rank 1, which has left without consuming anything: the 2-rank ring's every
// step looks like this. The peeked slot used to count as "data still to consume" in
// checkPeer, which hid the failed queue pair until RIDGE_TIMEOUT (8 s here): a remote error
// must come well before that.
TEST(GdrTransport, PeerGoneWhileASlotIsPeekedAndACreditIsAwaited) {
  Env e;
  e.slots = "1";
  e.slotBytes = "16K";
  applyEnv(e);
  setenv("RIDGE_TIMEOUT", "8", 1);
  setenv("RIDGE_ALGO", "allreduce:0-:ring", 1);
  setenv("RIDGE_GDR_RECV_SLOTS", "1", 1);
  ridgeUniqueId id;
  const bool haveId = makeUniqueId(&id);
  unsetenv("RIDGE_ALGO");
  ASSERT_TRUE(haveId);
  LaunchResult res = launchRanks(2, kLimitSec, [&](int me, Reporter& rep) {
    setenv("RIDGE_ALGO", "allreduce:0-:ring", 1);
    ridgeComm_t comm = initRank(2, id, me, rep);
    if (!comm) return 2;
    std::vector<int32_t> in(2000, me), out(2000);
    if (me == 1) {
      // One slot to rank 0, then leave without a word (no destroy, no credit returned).
      ridgeResult_t r = ridgeSend(in.data(), 1000, ridgeInt32, 0, comm, nullptr);
      usleep(1000 * 1000);
      _exit(r == ridgeSuccess ? 0 : 1);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const ridgeResult_t r = ridgeAllReduce(in.data(), out.data(), 2000, ridgeInt32, ridgeSum, comm, nullptr);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rep.line("RESULT " + std::to_string(r) + " " + std::to_string(waited));
    // Since operations carry signatures (issue 19) rank 0 may first see that rank 1 called a
    // send, not the allreduce: a mismatch, reported at once. Either way it must not wait.
    const bool mismatch =
        r == ridgeInvalidUsage && std::string(ridgeGetLastError(comm)).find("send #1") != std::string::npos;
    if (r != ridgeRemoteError && !mismatch)
      rep.fail("rank 0", "expected ridgeRemoteError, got " + describeResult(r, comm));
    if (waited > 4.0)
      rep.fail("rank 0", "the dead peer was noticed only after " + std::to_string(waited) + " s");
    ridgeCommAbort(comm);
    return 0;
  });
  unsetenv("RIDGE_GDR_RECV_SLOTS");
  reportChildFailures(res, "peer gone while a slot is peeked", /*expectCleanExit=*/false);
  ASSERT_EQ(res.ranks.size(), 2u);
  EXPECT_TRUE(res.ranks[1].exited && res.ranks[1].exitCode == 0) << "rank 1: its send failed";
}

}  // namespace
}  // namespace ridgetest
