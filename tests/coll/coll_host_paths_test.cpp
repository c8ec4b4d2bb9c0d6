// Host paths of issue 21 (every host collective at Open MPI's time on 2 ranks): how many slots
// and hand-offs the single-copy (direct) algorithms cost, and their results. Each case runs
// on forked ranks (tests/coll/rank_launcher.h) with random inputs, poisoned outputs, odd
// counts, in place and out of place, against a reference in double precision. Links the
// static library to look at the slots a peer posted.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "coll/comm.h"
#include "coll/signature.h"
#include "rank_launcher.h"

namespace ridgetest {
namespace {

// Rank `r`'s input element `i` of a call: random, different per rank and call, exact in float
// (multiples of 1/8 below 2^10), so sums of a few ranks are exact too.
std::vector<float> inputOf(int r, uint32_t call, size_t n) {
  std::mt19937 rng(1000u * static_cast<uint32_t>(r) + call);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng() % 8192) / 8.0f;
  return v;
}

constexpr float kPoison = -12345.75f;

// One collective of the cases below, out of place or in place, checked on every rank.
struct Case {
  const char* name;
  ridgeResult_t (*call)(float* send, float* recv, size_t count, int root, ridgeComm_t comm);
  bool blocks;   // the output is nranks blocks of `count` (allgather, alltoall)
  bool inPlace;  // send == recv (allgather: send == recv + rank * count)
};

ridgeResult_t allGather(float* s, float* r, size_t n, int, ridgeComm_t c) {
  return ridgeAllGather(s, r, n, ridgeFloat32, c, nullptr);
}
ridgeResult_t broadcast(float* s, float* r, size_t n, int root, ridgeComm_t c) {
  return ridgeBroadcast(s, r, n, ridgeFloat32, root, c, nullptr);
}
ridgeResult_t alltoAll(float* s, float* r, size_t n, int, ridgeComm_t c) {
  return ridgeAlltoAll(s, r, n, ridgeFloat32, c, nullptr);
}
ridgeResult_t allReduce(float* s, float* r, size_t n, int, ridgeComm_t c) {
  return ridgeAllReduce(s, r, n, ridgeFloat32, ridgeSum, c, nullptr);
}

// Runs case `k` (call number `call`) on rank `me` of `P` and checks the output against the
// reference; empty when right.
std::string runAndCheck(const Case& k, uint32_t call, size_t count, int root, ridgeComm_t comm, int me,
                        int P) {
  const std::string what = std::string(k.name) + (k.inPlace ? " in place" : "") + ": ";
  const size_t outCount = k.blocks ? count * static_cast<size_t>(P) : count;
  const size_t inCount = std::string(k.name) == "alltoall" ? outCount : count;
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < P; ++r) inputs.push_back(inputOf(r, call, inCount));
  std::vector<float> out(outCount, kPoison), in = inputs[static_cast<size_t>(me)];
  float* send = in.data();
  if (k.inPlace) {
    // The input where the API reads it in place; the rest of the output stays poisoned.
    const size_t at = std::string(k.name) == "allgather" ? size_t(me) * count : 0;
    std::memcpy(out.data() + at, in.data(), in.size() * sizeof(float));
    send = out.data() + at;
  }
  const ridgeResult_t rc = k.call(send, out.data(), count, root, comm);
  if (rc != ridgeSuccess) return what + describeResult(rc, comm) + ": " + ridgeGetLastError(comm);
  for (size_t i = 0; i < outCount; ++i) {
    double want = 0;
    const size_t block = i / count, at = i % count;
    if (std::string(k.name) == "allgather") want = inputs[block][at];
    if (std::string(k.name) == "broadcast") want = inputs[static_cast<size_t>(root)][i];
    if (std::string(k.name) == "alltoall") want = inputs[block][size_t(me) * count + at];
    if (std::string(k.name) == "allreduce")
      for (int r = 0; r < P; ++r) want += inputs[static_cast<size_t>(r)][i];
    if (static_cast<double>(out[i]) != want)
      return what + "element " + std::to_string(i) + " is " + std::to_string(out[i]) + ", expected " +
             std::to_string(want);
  }
  return "";
}

// Every one of the `calls` collectives of `comm` ran its direct algorithm.
void expectAllDirect(ridgeComm_t comm, uint32_t calls, Reporter& rep) {
  const uint64_t directRuns = comm->algoRuns[static_cast<int>(ridge::Algo::Direct)];
  if (directRuns != calls)
    rep.fail("paths", std::to_string(directRuns) + " of " + std::to_string(calls) + " calls direct");
}

// The children's failures, or the skip one of them reported (no CMA here).
void reportOrSkip(const LaunchResult& res, const char* what) {
  reportChildFailures(res, what);
  for (const RankResult& rr : res.ranks)
    if (!linesWith(rr, "SKIP ").empty()) GTEST_SKIP() << linesWith(rr, "SKIP ").front();
}

// The direct (single-copy) form of every collective that has one carries the collective's
// signature (coll/signature.h) in the slot of its address exchange: one slot per peer and
// direction before the copies, not a header slot and then a descriptor slot (the extra
// hand-off was a measurable part of a 64 KiB broadcast or all-to-all, docs/performance.md
// issue 21). The last rank looks at rank 0's first slot of every call before it makes the
// call itself; every rank checks its output.
void directHeaderInline(int P) {
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(P, 120, [&](int me, Reporter& rep) {
    setenv("RIDGE_ALGO", "allreduce:0-:direct;allgather:0-:direct;broadcast:0-:direct;alltoall:0-:direct", 1);
    ridgeComm_t comm = initRank(P, id, me, rep);
    if (!comm) return 2;
    if (comm->p2pCopy.minBytes == SIZE_MAX) {
      rep.line("SKIP single-copy (CMA) is not available here: no direct algorithms");
      ridgeCommDestroy(comm);
      return 0;
    }
    const Case cases[] = {{"allgather", allGather, true, false},  {"allgather", allGather, true, true},
                          {"broadcast", broadcast, false, false}, {"broadcast", broadcast, false, true},
                          {"alltoall", alltoAll, true, false},    {"alltoall", alltoAll, true, true},
                          {"allreduce", allReduce, false, false}, {"allreduce", allReduce, false, true}};
    uint32_t call = 0;
    for (const Case& k : cases)
      for (size_t count : {size_t(1), size_t(4099), size_t(70001)}) {  // odd counts, one above a bounce chunk
        ++call;
        if (me == P - 1) {
          ridge::SlotInfo info{};
          const void* slot = nullptr;
          const double deadline = nowSec() + 20;
          while (!(slot = comm->recvFrom[0]->tryPeek(&info)) && nowSec() < deadline) {
          }
          if (!slot) {
            rep.fail(k.name, "nothing arrived from rank 0");
            return 1;
          }
          ridge::HeaderWire wire;  // the digest, then the signature
          std::memcpy(&wire, slot, sizeof wire);
          if (wire.digest == 0 || wire.sig.magic != ridge::kSignatureMagic)
            rep.fail(k.name, "rank 0's first slot does not start with its signature");
          else if (info.bytes <= sizeof(ridge::HeaderWire))
            rep.fail(std::string(k.name) + " count " + std::to_string(count),
                     "the signature came in a slot of its own (" + std::to_string(info.bytes) +
                         " bytes) ahead of the direct algorithm's descriptor");
        }
        std::string bad = runAndCheck(k, call, count, P - 1, comm, me, P);
        if (!bad.empty()) rep.fail("count " + std::to_string(count), bad);
      }
    expectAllDirect(comm, call, rep);
    ridgeCommDestroy(comm);
    return 0;
  });
  reportOrSkip(res, "direct header");
}

TEST(HostDirect, HeaderRidesInTheDescriptorSlotTwoRanks) {
  directHeaderInline(2);
}
TEST(HostDirect, HeaderRidesInTheDescriptorSlotThreeRanks) {
  directHeaderInline(3);
}

// The direct broadcast splits the copy (src/coll/algorithms.cpp, broadcastPushedBytes): the
// root writes the head of every non-root's output with process_vm_writev while each non-root
// reads the rest, by the model's share (plan::hostBroadcastRootShare). Every root, in place
// and out of place, odd counts from one element to past a CMA chunk, random inputs, poisoned
// outputs: a byte neither side copies (a gap or overlap at the split) or a split the two
// sides disagree on shows as a wrong element. The root counts the bytes it pushed: exactly
// the share of every peer's output the selector gives, and some at 64 KiB and up on 2 and 3
// ranks (the copy ran on the non-roots alone before).
void directBroadcastSplit(int P) {
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(P, 120, [&](int me, Reporter& rep) {
    setenv("RIDGE_ALGO", "broadcast:0-:direct", 1);
    ridgeComm_t comm = initRank(P, id, me, rep);
    if (!comm) return 2;
    if (comm->p2pCopy.minBytes == SIZE_MAX) {
      rep.line("SKIP single-copy (CMA) is not available here: no direct broadcast");
      ridgeCommDestroy(comm);
      return 0;
    }
    uint32_t call = 0;
    uint64_t pushedAtLarge = 0;
    for (bool inPlace : {false, true})
      for (int root = 0; root < P; ++root)
        for (size_t count : {size_t(1), size_t(4099), size_t(16411), size_t(70001), size_t(262147)}) {
          ++call;
          const Case k{"broadcast", broadcast, false, inPlace};
          const uint64_t before = comm->broadcastPushedBytes;
          std::string bad = runAndCheck(k, call, count, root, comm, me, P);
          const std::string where = std::string(inPlace ? "in place" : "out of place") + " root " +
                                    std::to_string(root) + " count " + std::to_string(count);
          if (!bad.empty()) rep.fail(where, bad);
          const size_t bytes = count * sizeof(float);
          const double share = comm->algos.broadcastRootShare(bytes, !inPlace);
          const uint64_t expected =
              me != root ? 0
                         : uint64_t(P - 1) *
                               (std::min(bytes, static_cast<size_t>(double(bytes) * share) & ~size_t{63}));
          const uint64_t pushed = comm->broadcastPushedBytes - before;
          if (pushed != expected)
            rep.fail(where, "the root pushed " + std::to_string(pushed) + " bytes, the share gives " +
                                std::to_string(expected));
          if (me == root && bytes >= 65536) pushedAtLarge += pushed;
        }
    // Every rank was root of calls of 64 KiB and up, in and out of place.
    if (pushedAtLarge == 0) rep.fail("split", "the root never wrote into a peer's output at 64 KiB and up");
    expectAllDirect(comm, call, rep);
    ridgeCommDestroy(comm);
    return 0;
  });
  reportOrSkip(res, "direct broadcast split");
}

TEST(HostDirect, BroadcastSplitsTheCopyBetweenRootAndPeersTwoRanks) {
  directBroadcastSplit(2);
}
TEST(HostDirect, BroadcastSplitsTheCopyBetweenRootAndPeersThreeRanks) {
  directBroadcastSplit(3);
}

}  // namespace
}  // namespace ridgetest

#include "api_test_main.h"
