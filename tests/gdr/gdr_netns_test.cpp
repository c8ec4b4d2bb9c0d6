// gdr-write between "hosts": ranks in two network namespaces (tests/net/netns_helper.h), so
// the software NICs cannot reach each other's memory and every slot crosses the TCP wire
// between the engines. Staging is as small as it gets (one slot; 4 KiB in all) so that every
// send waits for a credit, and the wire drops, duplicates, reorders and delays packets. The
// results must be exact, stagedLost must stay 0 while the fault counters show faults were
// injected, and every run must finish within a few seconds. Ranks of one namespace talk
// through shared memory; the pairs between namespaces are the gdr transport's.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gdr_rank_body.h"
#include "netns_helper.h"

namespace ridgetest {
namespace {

// A hang must end long before ctest's limit; a healthy run takes a few seconds.
constexpr double kLimitSec = 40;

struct Case {
  int ranks;
  const char* slots;
  const char* slotBytes;
  const char* shmSlotBytes;  // pairs inside a namespace
  // One staging slot: the next send must wait for the previous one's acknowledgement, a
  // round trip over the wire, so credit stalls must show. (With more slots whether the
  // producer catches up with the NIC depends on the machine's timing.)
  bool oneSlot() const { return slots[0] == '1' && slots[1] == '\0'; }
};

void runNetns(const Case& c) {
  NETNS_SKIP_WITHOUT_PRIVILEGE();
  netns::Fabric fabric;
  std::string err;
  ASSERT_TRUE(fabric.create(2, &err)) << err;
  const netns::EnvList env = {
      {"RIDGE_TIMEOUT", "30"},
      {"RIDGE_NET", "softnic"},
      {"RIDGE_GDR_MODE", "write"},
      {"RIDGE_GDR_STAGING_SLOTS", c.slots},
      {"RIDGE_GDR_SLOT_BYTES", c.slotBytes},
      {"RIDGE_GDR_RECV_SLOTS", "2"},
      {"RIDGE_SOFTNIC_RTO_US", "1000"},
      {"RIDGE_SOFTNIC_FAULTS", "drop=0.02,dup=0.02,reorder=0.02,delay=0.03:300us,seed=5"},
      {"RIDGE_SHM_SLOT_BYTES", c.shmSlotBytes},
  };
  const std::vector<size_t> counts = {1, 3000, 20000};
  LaunchResult res =
      fabric.launch(c.ranks, netns::blockPlacement(c.ranks, 2), env, kLimitSec, [&](int rank, Reporter& rep) {
        ridgeComm_t comm = netns::initFromEnv(rank, rep);
        if (!comm) return 2;
        return runGdrExchanges(comm, c.ranks, rank, rep, counts);
      });
  std::printf("gdr-write netns n=%d, %s slots of %s, faults: %.1f s\n", c.ranks, c.slots, c.slotBytes,
              res.elapsed);
  reportChildFailures(res, "gdr netns n=" + std::to_string(c.ranks));
  ASSERT_FALSE(res.timedOut) << "not finished within " << kLimitSec << " s";

  const std::vector<GdrRankCounters> ranks = parseGdrCounters(res);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(c.ranks));
  unsigned long long written = 0, landed = 0, stalls = 0, faults = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const GdrRankCounters& k = ranks[r];
    EXPECT_EQ(k.mode, "gdr-write") << "rank " << r;
    EXPECT_GT(k.written, 0u) << "rank " << r << ": no slot went between the namespaces";
    EXPECT_EQ(k.lost, 0u) << "rank " << r << ": staged data dropped or overwritten";
    EXPECT_EQ(k.errors, 0u) << "rank " << r;
    written += k.written;
    landed += k.landed;
    stalls += k.stalls;
    faults += k.faults;
  }
  // With shared memory inside a namespace a rank may send more slots than it receives; over
  // all ranks every slot written must have landed once.
  EXPECT_EQ(written, landed);
  if (c.oneSlot()) {
    EXPECT_GT(stalls, 0u) << "staging this small must run out of credits";
  }
  EXPECT_GT(faults, 0u) << "the software NICs injected no fault";
}

// One staging slot of 4 KiB: each send waits for the previous one's completion.
TEST(GdrNetns, WriteOneSlotTwoRanksWithFaults) {
  runNetns({2, "1", "4K", "256K"});
}

// 4 KiB of staging in four 1 KiB slots.
TEST(GdrNetns, WriteFourKiBStagingTwoRanksWithFaults) {
  runNetns({2, "4", "1K", "256K"});
}

// Two ranks per namespace (shared memory between them, gdr-write between the namespaces), one
// staging slot of 4 KiB per peer: where shared memory carries some pairs the gdr slot is shm's
// (every rank must cut messages alike), so RIDGE_SHM_SLOT_BYTES sets it.
TEST(GdrNetns, WriteOneSlotFourRanksWithFaults) {
  runNetns({4, "1", "1K", "4K"});
}

// Regression: RIDGE_GDR_SLOT_BYTES differing from shm's slot made the ranks of one namespace
// cut a message differently ("peer 3 sent a 1024-byte chunk where 12000 bytes were
// expected"), and a chunk cut for shm overran the smaller gdr slot.
TEST(GdrNetns, SlotSizeFollowsSharedMemoryBesideIt) {
  runNetns({4, "4", "1K", "256K"});
}

}  // namespace
}  // namespace ridgetest
