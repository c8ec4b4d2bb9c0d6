// Groups: several collectives fused in one ridgeGroupStart/End, nested groups (only the
// outermost end runs the queued calls), and point-to-point patterns inside groups: ring
// shift in both directions at once, all-pairs exchange with per-pair sizes from 0 to
// > 1 MiB, two messages to the same peer matched in posting order, and blocking send/recv
// outside a group. Every rank is a forked process; every receive buffer has poisoned
// guard zones that must survive. The harness deadline turns a deadlock into a failure.
#include <memory>
#include <vector>

#include "rank_launcher.h"
#include "test_data.h"

namespace ridgetest {
namespace {

constexpr size_t kG = 256;
constexpr uint8_t kPoison = 0xC3;

/** A buffer with poisoned guard zones on both sides. */
class GBuf {
 public:
  explicit GBuf(size_t bytes) : bytes_(bytes), mem_(new uint8_t[bytes + 2 * kG]) {
    std::memset(mem_.get(), kPoison, bytes + 2 * kG);
  }
  uint8_t* data() { return mem_.get() + kG; }
  size_t bytes() const { return bytes_; }
  bool guardsOk() const {
    for (size_t i = 0; i < kG; ++i) {
      if (mem_[i] != kPoison || mem_[kG + bytes_ + i] != kPoison) return false;
    }
    return true;
  }
  bool allPoison() const {
    for (size_t i = 0; i < bytes_; ++i) {
      if (mem_[kG + i] != kPoison) return false;
    }
    return true;
  }

 private:
  size_t bytes_;
  std::unique_ptr<uint8_t[]> mem_;
};

#define GCHECK(call, where)                                                    \
  do {                                                                         \
    ridgeResult_t _r = (call);                                                 \
    if (_r != ridgeSuccess) {                                                  \
      rep.fail(where, std::string(#call) + " -> " + describeResult(_r, comm)); \
      return false;                                                            \
    }                                                                          \
  } while (0)

void checkRawBuf(Reporter& rep, const std::string& where, GBuf& b, size_t esz, size_t count, uint32_t key,
                 size_t base) {
  Mismatches mm;
  checkRawAny(esz, b.data(), count, key, base, 0, mm);
  if (mm.count) rep.fail(where, std::to_string(mm.count) + " wrong elements: " + mm.text);
  if (!b.guardsOk()) rep.fail(where, "guard zone around the receive buffer overwritten");
}

/** Several collectives in one group, then the same inside a nested group. */
bool fusedCollectives(ridgeComm_t comm, int me, int n, Reporter& rep, uint32_t seed, bool nested) {
  const std::string where = nested ? "nested group" : "fused group";
  rep.line("STEP " + where);
  uint32_t keys[8];
  for (int r = 0; r < n; ++r) keys[r] = rankKey(seed, r);
  const int root = 1 % n;
  // AllReduce float sum 1009
  const size_t c1 = 1009;
  GBuf s1(c1 * 4), r1(c1 * 4);
  typedOps(ridgeFloat32, ridgeSum).fill(s1.data(), c1, keys[me], 0);
  // Broadcast int32 4099 from root
  const size_t c2 = 4099;
  GBuf b2(c2 * 4);
  if (me == root) fillRawAny(4, b2.data(), c2, keys[me], 0);
  // AllGather uint8 33
  const size_t c3 = 33;
  GBuf s3(c3), r3(c3 * n);
  fillRawAny(1, s3.data(), c3, keys[me], 0);
  // ReduceScatter double max 100 per rank
  const size_t c4 = 100;
  GBuf s4(c4 * n * 8), r4(c4 * 8);
  typedOps(ridgeFloat64, ridgeMax).fill(s4.data(), c4 * n, keys[me], 0);
  // AlltoAll int64 17 per rank
  const size_t c5 = 17;
  GBuf s5(c5 * n * 8), r5(c5 * n * 8);
  fillRawAny(8, s5.data(), c5 * n, keys[me], 0);
  // Reduce bfloat16 sum 1009 to root 0
  GBuf s6(c1 * 2), r6(c1 * 2);
  typedOps(ridgeBfloat16, ridgeSum).fill(s6.data(), c1, keys[me], 0);

  GCHECK(ridgeGroupStart(), where);
  if (nested) GCHECK(ridgeGroupStart(), where);
  GCHECK(ridgeAllReduce(s1.data(), r1.data(), c1, ridgeFloat32, ridgeSum, comm, nullptr), where);
  GCHECK(ridgeBroadcast(b2.data(), b2.data(), c2, ridgeInt32, root, comm, nullptr), where);
  GCHECK(ridgeAllGather(s3.data(), r3.data(), c3, ridgeUint8, comm, nullptr), where);
  if (nested) {
    GCHECK(ridgeGroupEnd(), where);
    // Inner end: nothing may have run yet.
    if (!r1.allPoison() || !r3.allPoison()) {
      rep.fail(where, "an inner ridgeGroupEnd ran queued operations (receive buffer written)");
    }
    GCHECK(ridgeGroupStart(), where);
  }
  GCHECK(ridgeReduceScatter(s4.data(), r4.data(), c4, ridgeFloat64, ridgeMax, comm, nullptr), where);
  GCHECK(ridgeAlltoAll(s5.data(), r5.data(), c5, ridgeInt64, comm, nullptr), where);
  GCHECK(ridgeReduce(s6.data(), r6.data(), c1, ridgeBfloat16, ridgeSum, 0, comm, nullptr), where);
  if (nested) GCHECK(ridgeGroupEnd(), where);
  GCHECK(ridgeGroupEnd(), where);

  Mismatches m1;
  typedOps(ridgeFloat32, ridgeSum).checkRed(r1.data(), c1, keys, n, 0, 0, m1);
  if (m1.count) rep.fail(where + " AllReduce", m1.text);
  checkRawBuf(rep, where + " Broadcast", b2, 4, c2, keys[root], 0);
  for (int j = 0; j < n; ++j) {
    Mismatches mm;
    checkRawAny(1, r3.data() + j * c3, c3, keys[j], 0, j * c3, mm);
    if (mm.count) rep.fail(where + " AllGather", mm.text);
  }
  Mismatches m4;
  typedOps(ridgeFloat64, ridgeMax).checkRed(r4.data(), c4, keys, n, me * c4, 0, m4);
  if (m4.count) rep.fail(where + " ReduceScatter", m4.text);
  for (int j = 0; j < n; ++j) {
    Mismatches mm;
    checkRawAny(8, r5.data() + j * c5 * 8, c5, keys[j], me * c5, j * c5, mm);
    if (mm.count) rep.fail(where + " AlltoAll", mm.text);
  }
  if (me == 0) {
    Mismatches m6;
    typedOps(ridgeBfloat16, ridgeSum).checkRed(r6.data(), c1, keys, n, 0, 0, m6);
    if (m6.count) rep.fail(where + " Reduce", m6.text);
  } else if (!r6.allPoison()) {
    rep.fail(where + " Reduce", "non-root recvbuff written");
  }
  for (GBuf* b : {&s1, &r1, &s3, &r3, &s4, &r4, &s5, &r5, &s6, &r6}) {
    if (!b->guardsOk()) rep.fail(where, "guard zone overwritten");
  }
  return true;
}

/** Ring shift to both neighbours at once, one group. */
bool ringBothWays(ridgeComm_t comm, int me, int n, Reporter& rep, uint32_t seed, size_t count) {
  const std::string where = "ring both ways count=" + std::to_string(count);
  rep.line("STEP " + where);
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  // Messages are keyed by (source, direction) so the two directions carry different data.
  GBuf sFwd(count * 4), sBwd(count * 4), rFromPrev(count * 4), rFromNext(count * 4);
  fillRawAny(4, sFwd.data(), count, rankKey(seed, me * 2), 0);
  fillRawAny(4, sBwd.data(), count, rankKey(seed, me * 2 + 1), 0);
  GCHECK(ridgeGroupStart(), where);
  GCHECK(ridgeSend(sFwd.data(), count, ridgeFloat32, next, comm, nullptr), where);
  GCHECK(ridgeSend(sBwd.data(), count, ridgeFloat32, prev, comm, nullptr), where);
  GCHECK(ridgeRecv(rFromPrev.data(), count, ridgeFloat32, prev, comm, nullptr), where);
  GCHECK(ridgeRecv(rFromNext.data(), count, ridgeFloat32, next, comm, nullptr), where);
  GCHECK(ridgeGroupEnd(), where);
  if (n == 2) {
    // prev == next: two messages each way between the same pair, matched in posting order.
    checkRawBuf(rep, where + " first from peer", rFromPrev, 4, count, rankKey(seed, prev * 2), 0);
    checkRawBuf(rep, where + " second from peer", rFromNext, 4, count, rankKey(seed, next * 2 + 1), 0);
  } else {
    checkRawBuf(rep, where + " from prev", rFromPrev, 4, count, rankKey(seed, prev * 2), 0);
    checkRawBuf(rep, where + " from next", rFromNext, 4, count, rankKey(seed, next * 2 + 1), 0);
  }
  return true;
}

size_t pairSize(int src, int dst, int iter) {
  static const size_t sizes[] = {0, 1, 33, 4099, 300007 /* 1.2 MB of int32 */, 17, 0, 65536};
  return sizes[(src * 5 + dst * 3 + iter) % 8];
}

/** Every rank exchanges with every other rank, sizes differ per pair and per iteration. */
bool allPairs(ridgeComm_t comm, int me, int n, Reporter& rep, uint32_t seed, int iter) {
  const std::string where = "all-pairs iter " + std::to_string(iter);
  rep.line("STEP " + where);
  std::vector<std::unique_ptr<GBuf>> sb(n), rb(n);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    sb[p] = std::make_unique<GBuf>(pairSize(me, p, iter) * 4);
    fillRawAny(4, sb[p]->data(), pairSize(me, p, iter), rankKey(seed, me * 16 + p), 0);
    rb[p] = std::make_unique<GBuf>(pairSize(p, me, iter) * 4);
  }
  GCHECK(ridgeGroupStart(), where);
  // Receives first on odd ranks, sends first on even ones: order inside a group must not matter.
  for (int k = 0; k < 2; ++k) {
    const bool sends = (k == 0) == (me % 2 == 0);
    for (int i = 1; i < n; ++i) {
      const int p = (me + i) % n;
      if (sends)
        GCHECK(ridgeSend(sb[p]->data(), pairSize(me, p, iter), ridgeInt32, p, comm, nullptr), where);
      else
        GCHECK(ridgeRecv(rb[p]->data(), pairSize(p, me, iter), ridgeInt32, p, comm, nullptr), where);
    }
  }
  GCHECK(ridgeGroupEnd(), where);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    checkRawBuf(rep, where + " from " + std::to_string(p), *rb[p], 4, pairSize(p, me, iter),
                rankKey(seed, p * 16 + me), 0);
    if (!sb[p]->guardsOk()) rep.fail(where, "send guard overwritten");
  }
  return true;
}

/** Two messages of different sizes (one of them > 1 MiB) to the same peer in one group. */
bool sameePeerOrdered(ridgeComm_t comm, int me, int n, Reporter& rep, uint32_t seed) {
  const std::string where = "two messages to one peer";
  rep.line("STEP " + where);
  const int peer = me ^ 1;
  if (peer >= n) return true;
  const size_t ca = 5000, cb = 400000;  // uint8 and uint64 (3.2 MB)
  GBuf sa(ca), sb2(cb * 8), ra(ca), rb2(cb * 8);
  fillRawAny(1, sa.data(), ca, rankKey(seed, me * 2), 0);
  fillRawAny(8, sb2.data(), cb, rankKey(seed, me * 2 + 1), 0);
  GCHECK(ridgeGroupStart(), where);
  GCHECK(ridgeSend(sa.data(), ca, ridgeUint8, peer, comm, nullptr), where);
  GCHECK(ridgeSend(sb2.data(), cb, ridgeUint64, peer, comm, nullptr), where);
  GCHECK(ridgeRecv(ra.data(), ca, ridgeUint8, peer, comm, nullptr), where);
  GCHECK(ridgeRecv(rb2.data(), cb, ridgeUint64, peer, comm, nullptr), where);
  GCHECK(ridgeGroupEnd(), where);
  checkRawBuf(rep, where + " first", ra, 1, ca, rankKey(seed, peer * 2), 0);
  checkRawBuf(rep, where + " second", rb2, 8, cb, rankKey(seed, peer * 2 + 1), 0);
  return true;
}

/** Blocking send/recv outside a group: even ranks send first, odd ranks receive first. */
bool blockingPingPong(ridgeComm_t comm, int me, int n, Reporter& rep, uint32_t seed) {
  const std::string where = "blocking ping-pong";
  rep.line("STEP " + where);
  const int peer = me ^ 1;
  if (peer >= n) return true;
  for (size_t count : {size_t(0), size_t(1), size_t(70001), size_t(600000)}) {
    GBuf s(count * 2), r(count * 2);
    fillRawAny(2, s.data(), count, rankKey(seed + static_cast<uint32_t>(count), me), 0);
    if (me % 2 == 0) {
      GCHECK(ridgeSend(s.data(), count, ridgeFloat16, peer, comm, nullptr), where);
      GCHECK(ridgeRecv(r.data(), count, ridgeFloat16, peer, comm, nullptr), where);
    } else {
      GCHECK(ridgeRecv(r.data(), count, ridgeFloat16, peer, comm, nullptr), where);
      GCHECK(ridgeSend(s.data(), count, ridgeFloat16, peer, comm, nullptr), where);
    }
    checkRawBuf(rep, where + " count=" + std::to_string(count), r, 2, count,
                rankKey(seed + static_cast<uint32_t>(count), peer), 0);
  }
  return true;
}

/** A collective and a ring exchange in one group: the exchange's chains start once the
 *  collective is done. Regression: this crashed (GCC 12 destroyed the task held by a
 *  temporary SpawnTask awaiter twice). */
bool collectiveWithExchange(ridgeComm_t comm, int me, int n, Reporter& rep, uint32_t seed) {
  const std::string where = "allreduce and ring exchange in one group";
  rep.line("STEP " + where);
  const size_t count = 4099;
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  std::vector<uint32_t> keys(n);
  for (int r = 0; r < n; ++r) keys[r] = rankKey(seed, r);
  const TypedOps& ops = typedOps(ridgeInt32, ridgeSum);
  GBuf in(count * 4), out(count * 4), s(count * 4), r(count * 4);
  ops.fill(in.data(), count, keys[me], 0);
  fillRawAny(4, s.data(), count, keys[me], 0);
  GCHECK(ridgeGroupStart(), where);
  GCHECK(ridgeAllReduce(in.data(), out.data(), count, ridgeInt32, ridgeSum, comm, nullptr), where);
  if (n > 1) {
    GCHECK(ridgeSend(s.data(), count, ridgeInt32, next, comm, nullptr), where);
    GCHECK(ridgeRecv(r.data(), count, ridgeInt32, prev, comm, nullptr), where);
  }
  GCHECK(ridgeGroupEnd(), where);
  Mismatches mm;
  ops.checkRed(out.data(), count, keys.data(), n, 0, 0, mm);
  if (mm.count) rep.fail(where, std::to_string(mm.count) + " wrong reduced elements: " + mm.text);
  if (n > 1) checkRawBuf(rep, where + " exchange", r, 4, count, keys[prev], 0);
  return true;
}

/** All-to-all as nccl-tests writes it: every rank sends to and receives from every rank,
 *  itself included (a send to self is a local copy matched with the receive from self), plus
 *  a second, smaller self pair in the same group, matched with the first by issue order. */
bool allPairsWithSelf(ridgeComm_t comm, int me, int n, Reporter& rep, uint32_t seed) {
  const std::string where = "all-to-all with self";
  rep.line("STEP " + where);
  const size_t count = 4099, extra = 33;
  std::vector<std::unique_ptr<GBuf>> sb(n), rb(n);
  for (int p = 0; p < n; ++p) {
    sb[p] = std::make_unique<GBuf>(count * 4);
    fillRawAny(4, sb[p]->data(), count, rankKey(seed, me * 16 + p), 0);
    rb[p] = std::make_unique<GBuf>(count * 4);
  }
  GBuf se(extra * 8), re(extra * 8);
  fillRawAny(8, se.data(), extra, rankKey(seed + 1, me), 0);
  GCHECK(ridgeGroupStart(), where);
  // Receives first on odd ranks, sends first on even ones; the second self pair comes after
  // the first in both directions, so issue order must pair the counts.
  for (int k = 0; k < 2; ++k) {
    const bool sends = (k == 0) == (me % 2 == 0);
    for (int p = 0; p < n; ++p) {
      if (sends)
        GCHECK(ridgeSend(sb[p]->data(), count, ridgeInt32, p, comm, nullptr), where);
      else
        GCHECK(ridgeRecv(rb[p]->data(), count, ridgeInt32, p, comm, nullptr), where);
    }
    if (sends)
      GCHECK(ridgeSend(se.data(), extra, ridgeFloat64, me, comm, nullptr), where);
    else
      GCHECK(ridgeRecv(re.data(), extra, ridgeFloat64, me, comm, nullptr), where);
  }
  GCHECK(ridgeGroupEnd(), where);
  for (int p = 0; p < n; ++p) {
    checkRawBuf(rep, where + " from " + std::to_string(p), *rb[p], 4, count, rankKey(seed, p * 16 + me), 0);
    if (!sb[p]->guardsOk()) rep.fail(where, "send guard overwritten");
  }
  checkRawBuf(rep, where + " second self pair", re, 8, extra, rankKey(seed + 1, me), 0);
  return true;
}

/** Only self pairs, one after the other, each group checked (one rank: sendrecv_perf). */
bool selfOnlyGroups(ridgeComm_t comm, int me, Reporter& rep, uint32_t seed) {
  const std::string where = "send/recv to self only";
  rep.line("STEP " + where);
  for (size_t count : {size_t(0), size_t(1), size_t(70001)}) {
    GBuf s(count * 2), r(count * 2);
    fillRawAny(2, s.data(), count, rankKey(seed + static_cast<uint32_t>(count), me), 0);
    GCHECK(ridgeGroupStart(), where);
    GCHECK(ridgeSend(s.data(), count, ridgeBfloat16, me, comm, nullptr), where);
    GCHECK(ridgeRecv(r.data(), count, ridgeBfloat16, me, comm, nullptr), where);
    GCHECK(ridgeGroupEnd(), where);
    checkRawBuf(rep, where + " count=" + std::to_string(count), r, 2, count,
                rankKey(seed + static_cast<uint32_t>(count), me), 0);
    if (count == 0 && !r.guardsOk()) rep.fail(where, "zero-count copy wrote");
  }
  return true;
}

void runSelfExchanges(int n) {
  setLoopbackEnv();
  setenv("RIDGE_TIMEOUT", "20", 1);
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(n, 90, [&](int me, Reporter& rep) {
    ridgeComm_t comm = initRank(n, id, me, rep);
    if (!comm) return 2;
    bool ok = selfOnlyGroups(comm, me, rep, 31);
    for (uint32_t iter = 0; ok && iter < 3; ++iter) ok = allPairsWithSelf(comm, me, n, rep, 40 + iter);
    ok = ok && fusedCollectives(comm, me, n, rep, 32, false);
    ridgeResult_t r = ridgeCommDestroy(comm);
    if (r != ridgeSuccess) rep.fail("destroy", describeResult(r));
    return ok ? 0 : 1;
  });
  std::printf("self exchange tests n=%d: %.2f s\n", n, res.elapsed);
  reportChildFailures(res, "self exchanges n=" + std::to_string(n));
}

TEST(CollGroupSelf, Ranks1) {
  runSelfExchanges(1);
}
TEST(CollGroupSelf, Ranks2) {
  runSelfExchanges(2);
}
TEST(CollGroupSelf, Ranks3) {
  runSelfExchanges(3);
}

void runGroups(int n) {
  setLoopbackEnv();
  setenv("RIDGE_TIMEOUT", "20", 1);
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(n, 90, [&](int me, Reporter& rep) {
    ridgeComm_t comm = initRank(n, id, me, rep);
    if (!comm) return 2;
    bool ok = fusedCollectives(comm, me, n, rep, 11, false) && fusedCollectives(comm, me, n, rep, 12, true) &&
              ringBothWays(comm, me, n, rep, 13, 1009) && ringBothWays(comm, me, n, rep, 14, 300001) &&
              ringBothWays(comm, me, n, rep, 15, 0);
    for (int iter = 0; ok && iter < 16; ++iter) ok = allPairs(comm, me, n, rep, 100 + iter, iter);
    ok = ok && sameePeerOrdered(comm, me, n, rep, 20) && blockingPingPong(comm, me, n, rep, 21) &&
         collectiveWithExchange(comm, me, n, rep, 23);
    // A collective after all of it still works.
    ok = ok && fusedCollectives(comm, me, n, rep, 22, false);
    ridgeResult_t r = ridgeCommDestroy(comm);
    if (r != ridgeSuccess) rep.fail("destroy", describeResult(r));
    return ok ? 0 : 1;
  });
  std::printf("group tests n=%d: %.2f s\n", n, res.elapsed);
  reportChildFailures(res, "groups n=" + std::to_string(n));
}

TEST(CollGroup, Ranks2) {
  runGroups(2);
}
TEST(CollGroup, Ranks3) {
  runGroups(3);
}
TEST(CollGroup, Ranks4) {
  runGroups(4);
}

}  // namespace
}  // namespace ridgetest
