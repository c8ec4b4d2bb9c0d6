// The net transport's direct extension under the collectives, over softnic (RIDGE_NET=softnic,
// RIDGE_SHM=0) with forked ranks: the ring and chain algorithms with the smallest slots
// (4 KiB, 2 per FIFO) so that messages span many chunks, with every rank direct, with one
// rank on slots only (RIDGE_NET_DIRECT=0: each rank decides alone), and under wire faults;
// a send buffer reused as soon as ridgeSend returned; and a receive that timed out, whose
// declared destinations must stay untouched when the sender sends after all. Each rank prints
// its net transport stats so that the parent can prove the direct paths ran.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "matrix_cases.h"
#include "rank_launcher.h"
#include "transports/net/net_transport.h"
#include "transports/softnic/softnic.h"

namespace ridgetest {
namespace {

// The settings of every test here, in the parent (the unique id) and in each rank.
void directEnv(const char* faults) {
  setLoopbackEnv();
  setenv("RIDGE_NET", "softnic", 1);
  setenv("RIDGE_SHM", "0", 1);
  setenv("RIDGE_TIMEOUT", "60", 1);
  setenv("RIDGE_SOFTNIC_RTO_US", "3000", 1);
  setenv("RIDGE_RDMA_SLOTS", "2", 1);
  setenv("RIDGE_RDMA_SLOT_BYTES", "4K", 1);
  setenv("RIDGE_SOFTNIC_FAULTS", faults ? faults : "", 1);
}

std::map<std::string, uint64_t> rankStats(const RankResult& rr, const char* prefix) {
  auto lines = linesWith(rr, prefix);
  return lines.empty() ? std::map<std::string, uint64_t>{} : parseNameValues(lines.back());
}

void printStats(Reporter& rep) {
  rep.line("NETSTATS " + ridge::netStatsToString(ridge::netProcessStats()));
  rep.line("NICSTATS " + ridge::softnic::countersToString(ridge::softnic::processCounters()));
}

constexpr const char* kRingAndChain =
    "allreduce:0-:ring;reducescatter:0-:ring;allgather:0-:ring;broadcast:0-:ring;reduce:0-:ring";

// The small matrix (every collective, type, operator, placement, count up to 100003) through
// the ring and chain algorithms. `slotsOnlyRank` keeps to slots (-1: none).
LaunchResult runDirectMatrix(int n, int slotsOnlyRank, const char* faults) {
  directEnv(faults);
  setenv("RIDGE_ALGO", kRingAndChain, 1);
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return {};
  LaunchResult res = launchRanks(n, 150, [&](int rank, Reporter& rep) {
    if (rank == slotsOnlyRank) setenv("RIDGE_NET_DIRECT", "0", 1);
    ridgeComm_t comm = initRank(n, id, rank, rep);
    if (!comm) return 2;
    const int rc = matrix::runCases(comm, rank, n, false, rep);  // destroys the communicator
    printStats(rep);
    return rc;
  });
  unsetenv("RIDGE_ALGO");
  std::printf("net direct matrix n=%d slots-only rank %d%s: %.1f s\n", n, slotsOnlyRank,
              faults ? " with faults" : "", res.elapsed);
  reportChildFailures(res, "net direct matrix n=" + std::to_string(n));
  return res;
}

TEST(NetDirectColl, RingMatrixRanks2AllDirect) {
  LaunchResult res = runDirectMatrix(2, -1, nullptr);
  ASSERT_EQ(res.ranks.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    auto s = rankStats(res.ranks[r], "NETSTATS ");
    EXPECT_GT(s["directSends"], 0u) << r;
    EXPECT_GT(s["chunksLandedDirect"], 0u) << r;
    EXPECT_GT(s["chunksToAdvertised"], 0u) << r;
    EXPECT_EQ(s["withdrawals"], 0u) << r;
    // Caller buffers are registered per mapping, not per chunk.
    EXPECT_LT(s["registrations"] * 20, s["directSends"]) << r;
  }
}

TEST(NetDirectColl, RingMatrixRanks3OneRankSlotsOnly) {
  LaunchResult res = runDirectMatrix(3, 1, nullptr);
  ASSERT_EQ(res.ranks.size(), 3u);
  auto off = rankStats(res.ranks[1], "NETSTATS ");
  EXPECT_EQ(off["directSends"], 0u);
  EXPECT_EQ(off["advertsSent"], 0u);
  EXPECT_EQ(off["chunksLandedDirect"], 0u);
  // Its successor declares destinations, and its slot posts land there.
  EXPECT_GT(off["chunksToAdvertised"], 0u);
  for (int r : {0, 2}) {
    auto s = rankStats(res.ranks[r], "NETSTATS ");
    EXPECT_GT(s["directSends"], 0u) << r;
    EXPECT_GT(s["advertsSent"], 0u) << r;
  }
}

TEST(NetDirectColl, RingMatrixRanks2UnderFaults) {
  LaunchResult res = runDirectMatrix(2, -1, "drop=0.01,dup=0.01,reorder=0.01,delay=0.01:200us,seed=17");
  ASSERT_EQ(res.ranks.size(), 2u);
  uint64_t drops = 0, dups = 0, reorders = 0, landed = 0;
  for (const RankResult& rr : res.ranks) {
    auto nic = rankStats(rr, "NICSTATS ");
    drops += nic["injectedDrops"];
    dups += nic["injectedDups"];
    reorders += nic["injectedReorders"];
    landed += rankStats(rr, "NETSTATS ")["chunksLandedDirect"];
  }
  EXPECT_GT(drops, 0u);
  EXPECT_GT(dups, 0u);
  EXPECT_GT(reorders, 0u);
  EXPECT_GT(landed, 0u);
}

// ridgeSend of whole chunks sends from the caller's buffer and returns once the NIC has it
// all; the sender overwrites the buffer at once, tail first, and the receiver must still get
// what was sent. Loss on the wire keeps chunks unacknowledged for a while, so a send that
// returned early would lose them.
TEST(NetDirectColl, SendBufferReusableAfterReturn) {
  directEnv("drop=0.02,seed=29");
  setenv("RIDGE_RDMA_SLOT_BYTES", "256K", 1);
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  constexpr size_t kBytes = 8u << 20;
  auto value = [](size_t i) { return static_cast<uint8_t>((i * 2246822519u) >> 25); };
  LaunchResult res = launchRanks(2, 90, [&](int rank, Reporter& rep) {
    ridgeComm_t comm = initRank(2, id, rank, rep);
    if (!comm) return 2;
    std::vector<uint8_t> buf(kBytes);
    if (rank == 0) {
      for (size_t i = 0; i < kBytes; ++i) buf[i] = value(i);
      ridgeResult_t r = ridgeSend(buf.data(), kBytes, ridgeUint8, 1, comm, nullptr);
      for (size_t i = kBytes; i-- > 0;) buf[i] = 0xEE;
      if (r != ridgeSuccess) rep.fail("send", describeResult(r, comm));
    } else {
      ridgeResult_t r = ridgeRecv(buf.data(), kBytes, ridgeUint8, 0, comm, nullptr);
      if (r != ridgeSuccess) rep.fail("recv", describeResult(r, comm));
      size_t wrong = 0;
      for (size_t i = 0; i < kBytes; ++i) wrong += buf[i] != value(i);
      if (wrong) rep.fail("recv", std::to_string(wrong) + " bytes differ from what was sent");
    }
    ridgeCommDestroy(comm);
    printStats(rep);
    return 0;
  });
  reportChildFailures(res, "net direct send buffer reuse");
  ASSERT_EQ(res.ranks.size(), 2u);
  EXPECT_EQ(rankStats(res.ranks[0], "NETSTATS ")["directSends"], kBytes / (256 << 10));
  EXPECT_GT(rankStats(res.ranks[1], "NETSTATS ")["chunksLandedDirect"], 0u);
}

// A receive that times out while its sender is stopped: once ridgeRecv returned, nothing may
// land in its buffer, although the stopped sender holds adverts for it and sends when it
// resumes.
TEST(NetDirectColl, RecvDestinationsWithdrawnAfterTimeout) {
  directEnv(nullptr);
  setenv("RIDGE_TIMEOUT", "3", 1);
  setenv("RIDGE_RDMA_SLOT_BYTES", "64K", 1);
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  constexpr size_t kBytes = 1 << 20;
  bool resumed = false;
  LaunchResult res = launchRanks(
      2, 40,
      [&](int rank, Reporter& rep) {
        ridgeComm_t comm = initRank(2, id, rank, rep);
        if (!comm) return 2;
        if (rank == 1) {
          usleep(300 * 1000);  // rank 0's adverts arrive meanwhile
          rep.line("STOPPING");
          raise(SIGSTOP);
          std::vector<uint8_t> msg(kBytes, 0x11);
          ridgeSend(msg.data(), msg.size(), ridgeUint8, 0, comm, nullptr);
          usleep(500 * 1000);
          printStats(rep);
          ridgeCommAbort(comm);
          return 0;
        }
        std::vector<uint8_t> buf(kBytes, 0);
        ridgeResult_t r = ridgeRecv(buf.data(), kBytes, ridgeUint8, 1, comm, nullptr);
        rep.line("RESULT " + std::to_string(r));
        poisonAndReportChanges(buf, rep);
        printStats(rep);
        ridgeCommAbort(comm);
        return 0;
      },
      [&](int rank, const std::string& line, double, LaunchControl& ctl) {
        if (rank == 0 && line == "POISONED") {
          ctl.killRank(1, SIGCONT);
          resumed = true;
        }
      });
  reportChildFailures(res, "net direct recv withdrawn", false);
  ASSERT_TRUE(resumed) << "rank 0 never returned from the receive";
  auto result = linesWith(res.ranks[0], "RESULT ");
  ASSERT_EQ(result.size(), 1u);
  EXPECT_EQ(result[0], std::to_string(ridgeTimeout));
  auto changed = linesWith(res.ranks[0], "CHANGED ");
  ASSERT_EQ(changed.size(), 1u);
  EXPECT_EQ(changed[0], "0") << "bytes landed in the receive buffer after ridgeRecv returned";
  EXPECT_EQ(rankStats(res.ranks[0], "NETSTATS ")["withdrawals"], 1u);
  // The sender did aim at the withdrawn destinations (else this test proves nothing).
  EXPECT_GT(rankStats(res.ranks[1], "NETSTATS ")["chunksToAdvertised"], 0u);
}

}  // namespace
}  // namespace ridgetest
