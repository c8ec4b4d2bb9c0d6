// Reduce on host ranks (issue 21: reduce at 64 KiB on 2 ranks at Open MPI's time). A reduce whose
// message fits one slot beside the collective's header carries the header in that slot (the
// all-pairs reduce's inline header, src/coll/algorithms.cpp): one slot per non-root and call to
// the root, a slot with the header alone back. Checked here: what a peer posts (the slots),
// results on 1-4 and 8 forked ranks over shared memory (tagged slots) and TCP (the header leads the
// slot) for every root, datatype, operator and placement around the size where the inline form
// ends (hashed inputs, poisoned outputs and guard zones, a higher-precision reference:
// matrix_cases.h), and that calls that do not match fail on every rank naming both calls.
// Links the static library to look at the slots a peer posted.
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "coll/comm.h"
#include "coll/signature.h"
#include "matrix_cases.h"

namespace ridgetest {
namespace {
using namespace matrix;

enum class Wire { Shm, Tcp };

void wireEnv(Wire w) {
  setLoopbackEnv();
  setenv("RIDGE_TIMEOUT", "20", 1);
  unsetenv("RIDGE_ALGO");
  if (w == Wire::Tcp) {
    setenv("RIDGE_SHM", "0", 1);
    setenv("RIDGE_NET", "socket", 1);
  } else {
    unsetenv("RIDGE_SHM");
    unsetenv("RIDGE_NET");
  }
}

void clearWireEnv() {
  unsetenv("RIDGE_SHM");
  unsetenv("RIDGE_NET");
  unsetenv("RIDGE_ALGO");
}

// Waits (bounded) for the next slot from `peer` without taking it.
const void* peekFirstSlot(ridgeComm_t comm, int peer, ridge::SlotInfo* info) {
  const double until = nowSec() + scaledSeconds(20);
  const void* slot = nullptr;
  while (!(slot = comm->recvFrom[peer]->tryPeek(info)) && nowSec() < until) {
  }
  return slot;
}

// Two ranks on shared memory, root 0, 16 KiB of float, two reduces. Before the first, the root
// looks at rank 1's first slot: the payload alone, tagged with the digest of rank 1's reduce #1,
// the full header in the slot's last line (no header slot ahead of it). Before the second,
// rank 1 looks at the root's: empty and tagged (the root's header of reduce #2 alone). The
// root's outputs are checked, the non-root's stays untouched. Before the inline form rank 1
// posted a 64-byte header slot ahead of its data.
TEST(CollReduceInline, ShmNonRootPostsOneTaggedSlotWithTheData) {
  wireEnv(Wire::Shm);
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  constexpr size_t n = 4096;
  LaunchResult res = launchRanks(2, 60.0, [&](int me, Reporter& rep) {
    ridgeComm_t comm = initRank(2, id, me, rep);
    if (!comm) return 2;
    auto value = [](int rank, size_t i) {
      return static_cast<float>((i * 7 + size_t(rank) * 3) % 1000) / 4.0f;
    };
    std::vector<float> in(n), out(n, -7.5f);
    for (size_t i = 0; i < n; ++i) in[i] = value(me, i);
    const int peer = 1 - me;
    if (!comm->recvFrom[peer]->carriesTags()) {
      rep.line("SKIP the connector is not shared memory");
      ridgeCommDestroy(comm);
      return 0;
    }
    for (uint64_t call = 1; call <= 2; ++call) {
      if (int(call) - 1 == me) {  // call 1: the root looks; call 2: rank 1
        ridge::SlotInfo info;
        const void* slot = peekFirstSlot(comm, peer, &info);
        if (!slot) {
          rep.fail("peek", "nothing arrived from rank " + std::to_string(peer));
        } else {
          rep.line("BYTES " + std::to_string(info.bytes));
          if (info.tag == 0) rep.fail("tag", "the slot was posted without a tag");
          ridge::HeaderWire h;
          std::memcpy(&h, static_cast<const char*>(slot) + comm->recvFrom[peer]->slotBytes() - sizeof h,
                      sizeof h);
          if (h.sig.magic != ridge::kSignatureMagic || h.sig.rank != peer || h.sig.seq != call ||
              h.sig.count != n || h.sig.root != 0 ||
              h.sig.kind != static_cast<uint8_t>(ridge::CollType::Reduce))
            rep.fail("cold header", "the slot's last line does not hold rank " + std::to_string(peer) +
                                        "'s reduce #" + std::to_string(call) + " header");
          if (h.digest != info.tag) rep.fail("cold header", "its digest differs from the post's tag");
          float first = 0;
          if (me == 0) std::memcpy(&first, slot, sizeof first);
          if (me == 0 && first != value(1, 0))
            rep.fail("payload", "the slot does not start with rank 1's input");
        }
      }
      ridgeResult_t r = ridgeReduce(in.data(), out.data(), n, ridgeFloat32, ridgeSum, 0, comm, nullptr);
      if (r != ridgeSuccess) rep.fail("reduce", describeResult(r, comm));
      for (size_t i = 0; i < n && me == 0; ++i) {
        const double want = static_cast<double>(value(0, i)) + static_cast<double>(value(1, i));
        if (static_cast<double>(out[i]) != want) {
          rep.fail("reduce", "element " + std::to_string(i) + " is " + std::to_string(out[i]));
          break;
        }
      }
      if (me == 1 && out[0] != -7.5f) rep.fail("reduce", "the non-root's output was written");
      std::fill(out.begin(), out.end(), -7.5f);
    }
    ridgeCommDestroy(comm);
    return 0;
  });
  clearWireEnv();
  reportChildFailures(res, "inline reduce slots");
  const auto skipped = linesWith(res.ranks[0], "SKIP ");
  if (!skipped.empty()) GTEST_SKIP() << skipped[0];
  const auto rootSaw = linesWith(res.ranks[0], "BYTES "), leafSaw = linesWith(res.ranks[1], "BYTES ");
  ASSERT_EQ(rootSaw.size(), 1u);
  ASSERT_EQ(leafSaw.size(), 1u);
  EXPECT_EQ(std::atoi(rootSaw[0].c_str()), static_cast<int>(n * sizeof(float)))
      << "rank 1's first slot is not the payload alone";
  EXPECT_EQ(std::atoi(leafSaw[0].c_str()), 0) << "the root's first slot is not its header alone";
}

// Roots of the results cases: every rank up to 4 ranks, else the first, a middle and the last.
std::vector<int> rootsOf(int n) {
  std::vector<int> roots;
  for (int r = 0; r < n; ++r)
    if (n <= 4 || r == 0 || r == n / 2 + 1 || r == n - 1) roots.push_back(r);
  return roots;
}

// Every root, datatype, operator and placement at counts around the end of the inline form
// (the largest float count whose bytes fit a 256 KiB slot beside the 64-byte header, and one
// more), on `n` ranks over `w`.
void reduceResults(int n, Wire w) {
  wireEnv(w);
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(n, 200, [&](int rank, Reporter& rep) {
    ridgeComm_t comm = initRank(n, id, rank, rep);
    if (!comm) return 2;
    const size_t slotFloats = comm->nranks > 1 ? comm->sendTo[(rank + 1) % n]->slotBytes() / 4 : 65536;
    const size_t lastInline = slotFloats - ridge::kInlineHeaderBytes / 4;
    CaseRunner runner(comm, rank, n, rep);
    if (!runner.ok()) {
      rep.fail("rank " + std::to_string(rank), "cannot map test buffers");
      return 3;
    }
    std::vector<Case> cases;
    uint32_t seed = 0x2ed00000u + static_cast<uint32_t>(n) * 1000u + (w == Wire::Tcp ? 500u : 0u);
    for (int root : rootsOf(n))
      for (int alt = 0; alt < 2; ++alt) {
        for (size_t count : {size_t(1), size_t(4099), lastInline, lastInline + 1})
          for (int op = 0; op < ridgeNumOps; ++op)
            cases.push_back(
                Case{kReduce, ridgeFloat32, op, alt == 1, count, root, ++seed, count % 2 ? 4u : 0u, false});
        for (int dt = 0; dt < ridgeNumTypes; ++dt)
          for (int op = 0; op < ridgeNumOps; ++op)
            cases.push_back(Case{kReduce, dt, op, alt == 1, 1009, root, ++seed, 0, false});
      }
    size_t done = 0;
    for (const Case& c : cases) {
      if (!runner.run(c)) break;
      ++done;
    }
    rep.line("DONE " + std::to_string(done));
    if (done != cases.size())
      rep.fail("rank " + std::to_string(rank),
               "stopped after " + std::to_string(done) + " of " + std::to_string(cases.size()) + " cases");
    ridgeCommDestroy(comm);
    return 0;
  });
  clearWireEnv();
  reportChildFailures(
      res, std::string("reduce results n=") + std::to_string(n) + (w == Wire::Tcp ? " tcp" : " shm"));
  // Every rank ran every case: the roots x 2 placements x (4 counts x every operator + every
  // datatype x every operator).
  const size_t want = rootsOf(n).size() * 2 * (4 + ridgeNumTypes) * ridgeNumOps;
  for (const RankResult& rr : res.ranks) {
    const auto done = linesWith(rr, "DONE ");
    ASSERT_EQ(done.size(), 1u) << "rank " << rr.rank;
    EXPECT_EQ(std::strtoull(done[0].c_str(), nullptr, 10), want) << "rank " << rr.rank;
  }
}

// Ranks and wire of one results case: 1-4 and 8 ranks on shared memory, 2-3 over TCP.
class CollReduceResults : public ::testing::TestWithParam<std::pair<int, Wire>> {};
TEST_P(CollReduceResults, EveryRootTypeOpPlacement) {
  reduceResults(GetParam().first, GetParam().second);
}
INSTANTIATE_TEST_SUITE_P(Ranks, CollReduceResults,
                         ::testing::Values(std::pair{1, Wire::Shm}, std::pair{2, Wire::Shm},
                                           std::pair{3, Wire::Shm}, std::pair{4, Wire::Shm},
                                           std::pair{8, Wire::Shm}, std::pair{2, Wire::Tcp},
                                           std::pair{3, Wire::Tcp}),
                         [](const ::testing::TestParamInfo<std::pair<int, Wire>>& p) {
                           return std::to_string(p.param.first) +
                                  (p.param.second == Wire::Tcp ? "Tcp" : "Shm");
                         });

// One rank's call in a mismatch case.
struct Call {
  bool allReduce = false;  // else a reduce
  size_t count = 4096;
  int root = 0;
  ridgeRedOp_t op = ridgeSum;
  ridgeDataType_t dtype = ridgeFloat32;
};

// Rank 0 calls `first`, every other rank `others`: every rank must fail with
// ridgeInvalidUsage (never succeed or time out) and its message name a reduce; the
// communicator is then broken.
void mismatch(Wire w, int n, const Call& first, const Call& others, const std::string& what) {
  wireEnv(w);
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(n, 60, [&](int me, Reporter& rep) {
    ridgeComm_t comm = initRank(n, id, me, rep);
    if (!comm) return 2;
    const Call& c = me == 0 ? first : others;
    std::vector<double> in(c.count, 1.0), out(c.count, 0.0);  // room for any datatype used here
    const ridgeResult_t r =
        c.allReduce ? ridgeAllReduce(in.data(), out.data(), c.count, c.dtype, c.op, comm, nullptr)
                    : ridgeReduce(in.data(), out.data(), c.count, c.dtype, c.op, c.root, comm, nullptr);
    const std::string err = r == ridgeSuccess ? std::string() : ridgeGetLastError(comm);
    if (r != ridgeInvalidUsage)
      rep.fail(what, "rank " + std::to_string(me) + " returned " + describeResult(r) + ": " + err);
    else if (err.find("reduce") == std::string::npos)
      rep.fail(what, "rank " + std::to_string(me) + "'s error names no reduce: " + err);
    ridgeResult_t async = ridgeSuccess;
    ridgeCommGetAsyncError(comm, &async);
    if (async == ridgeSuccess) rep.fail(what, "the communicator is not broken after the mismatch");
    ridgeCommDestroy(comm);
    return 0;
  });
  clearWireEnv();
  reportChildFailures(res, what + (w == Wire::Tcp ? " (tcp)" : " (shm)"));
}

// The root's header alone meets a non-root's data, a header alone meets a header alone (both
// think they are the root), counts within and beyond the inline form, the same bytes with
// another operator, datatype or collective (only the digest tells them apart).
void mismatches(Wire w) {
  Call base;
  Call rootDiffers = base;
  rootDiffers.root = 1;
  mismatch(w, 2, base, rootDiffers, "roots differ");
  Call countDiffers = base;
  countDiffers.count = 2048;
  mismatch(w, 2, base, countDiffers, "counts differ");
  Call notInline = base;
  notInline.count = 70000;  // beyond one slot: the header alone, then the data
  mismatch(w, 2, base, notInline, "one count inline, the other not");
  mismatch(w, 2, notInline, base, "the root's count not inline");
  Call opDiffers = base;
  opDiffers.op = ridgeMax;
  mismatch(w, 2, base, opDiffers, "operators differ");
  Call dtypeDiffers = base;
  dtypeDiffers.dtype = ridgeInt32;
  mismatch(w, 2, base, dtypeDiffers, "datatypes differ");
  Call allReduce = base;
  allReduce.allReduce = true;
  mismatch(w, 2, base, allReduce, "reduce against allreduce");
  mismatch(w, 3, base, opDiffers, "operators differ, 3 ranks");
}

TEST(CollReduceInline, MismatchedCallsFailEveryRankShm) {
  mismatches(Wire::Shm);
}
TEST(CollReduceInline, MismatchedCallsFailEveryRankTcp) {
  mismatches(Wire::Tcp);
}

}  // namespace
}  // namespace ridgetest

#include "api_test_main.h"
