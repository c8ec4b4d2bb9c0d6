// Single-copy send and receive on one host (src/coll/p2p_copy.h): messages of at least the
// communicator's threshold go from the sender's buffer straight into the receiver's (one CMA
// read), smaller ones through the slot FIFO. Every case checks the received bytes, poisoned
// guard zones around every receive buffer and untouched receive bytes beyond the message, and
// the per-path counters of the communicator, so that each path is shown to run: random sizes
// across the threshold, several messages to one peer in one group (order kept across the two
// paths), a send to self beside a peer exchange, mixed pairs on 3 ranks, ranks as threads of
// one process, the fallback when CMA is off or not permitted, and a size mismatch.
// Ranks are forked processes (tests/coll/rank_launcher.h) unless said otherwise; links the
// static library to read the counters.
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "coll/comm.h"
#include "coll/signature.h"
#include "rank_launcher.h"

namespace ridgetest {
namespace {

constexpr size_t kGuard = 64;
constexpr uint8_t kPoison = 0xC3;

// The byte at `i` of message `msg` from `src` to `dst`: different for every message, pair and
// offset, and never the poison at every offset.
uint8_t patternByte(int src, int dst, uint32_t msg, size_t i) {
  uint64_t x = (uint64_t(src) * 1000003u + uint64_t(dst) * 10007u + msg * 101u + i) * 0x9E3779B97F4A7C15ull;
  return static_cast<uint8_t>(x >> 56);
}

// A message buffer with poisoned guards on both sides; `room` may exceed the message.
class Buffer {
 public:
  explicit Buffer(size_t room) : room_(room), mem_(room + 2 * kGuard, kPoison) {}
  uint8_t* data() { return mem_.data() + kGuard; }
  void fill(int src, int dst, uint32_t msg, size_t bytes) {
    for (size_t i = 0; i < bytes; ++i) data()[i] = patternByte(src, dst, msg, i);
  }
  // Empty when the first `bytes` hold message `msg` and everything else is still poison.
  std::string check(int src, int dst, uint32_t msg, size_t bytes) const {
    const uint8_t* d = mem_.data() + kGuard;
    for (size_t i = 0; i < bytes; ++i)
      if (d[i] != patternByte(src, dst, msg, i))
        return "byte " + std::to_string(i) + " of " + std::to_string(bytes) + " wrong";
    for (size_t i = bytes; i < room_; ++i)
      if (d[i] != kPoison) return "byte " + std::to_string(i) + " past the message written";
    for (size_t i = 0; i < kGuard; ++i)
      if (mem_[i] != kPoison || mem_[kGuard + room_ + i] != kPoison) return "guard zone overwritten";
    return "";
  }

 private:
  size_t room_;
  std::vector<uint8_t> mem_;
};

struct Counters {
  uint64_t singleSends = 0, singleRecvs = 0, stagedSends = 0, stagedRecvs = 0;
};
Counters counters(ridgeComm_t c) {
  return {c->p2pCopy.singleCopySends, c->p2pCopy.singleCopyRecvs, c->p2pCopy.stagedSends,
          c->p2pCopy.stagedRecvs};
}
std::string describe(const Counters& c) {
  return "single-copy sends " + std::to_string(c.singleSends) + ", receives " +
         std::to_string(c.singleRecvs) + "; staged sends " + std::to_string(c.stagedSends) + ", receives " +
         std::to_string(c.stagedRecvs);
}
// Empty when `now - before` equals the expected counts.
std::string counted(const Counters& before, const Counters& now, uint64_t singleSends, uint64_t singleRecvs,
                    uint64_t stagedSends, uint64_t stagedRecvs) {
  Counters d{now.singleSends - before.singleSends, now.singleRecvs - before.singleRecvs,
             now.stagedSends - before.stagedSends, now.stagedRecvs - before.stagedRecvs};
  if (d.singleSends == singleSends && d.singleRecvs == singleRecvs && d.stagedSends == stagedSends &&
      d.stagedRecvs == stagedRecvs)
    return "";
  Counters want{singleSends, singleRecvs, stagedSends, stagedRecvs};
  return "counted " + describe(d) + "; expected " + describe(want);
}

// One message of a group: to or from `peer`.
struct Message {
  bool send;
  int peer;
  size_t bytes;
  uint32_t id;  // the pattern's message number (the same at both ends)
};

// Runs `msgs` of rank `me` in one group (or one call per message outside a group when
// `grouped` is false and there is a single message), then checks every receive.
std::string exchange(ridgeComm_t comm, int me, const std::vector<Message>& msgs) {
  std::vector<Buffer> bufs;
  bufs.reserve(msgs.size());
  for (const Message& m : msgs) {
    // Receive buffers have room beyond the message: the tail must stay poisoned.
    bufs.emplace_back(m.send ? m.bytes : m.bytes + 64);
    if (m.send) bufs.back().fill(me, m.peer, m.id, m.bytes);
  }
  if (ridgeGroupStart() != ridgeSuccess) return "ridgeGroupStart failed";
  for (size_t i = 0; i < msgs.size(); ++i) {
    const Message& m = msgs[i];
    ridgeResult_t r = m.send ? ridgeSend(bufs[i].data(), m.bytes, ridgeUint8, m.peer, comm, nullptr)
                             : ridgeRecv(bufs[i].data(), m.bytes, ridgeUint8, m.peer, comm, nullptr);
    if (r != ridgeSuccess) {
      ridgeGroupEnd();
      return std::string(m.send ? "ridgeSend: " : "ridgeRecv: ") + describeResult(r, comm);
    }
  }
  ridgeResult_t r = ridgeGroupEnd();
  if (r != ridgeSuccess) return "ridgeGroupEnd: " + describeResult(r, comm);
  for (size_t i = 0; i < msgs.size(); ++i) {
    const Message& m = msgs[i];
    if (m.send) continue;
    std::string bad = bufs[i].check(m.peer, me, m.id, m.bytes);
    if (!bad.empty())
      return "message " + std::to_string(m.id) + " from rank " + std::to_string(m.peer) + ": " + bad;
  }
  return "";
}

// The sizes of the random case: both ends draw the same sequence. Around the threshold, the
// threshold itself and its neighbours, zero and one byte, and up to 4x the threshold.
std::vector<size_t> randomSizes(size_t threshold, int count) {
  std::mt19937_64 rng(21);
  std::vector<size_t> sizes = {threshold - 1, threshold, threshold + 1, 0, 1};
  std::uniform_int_distribution<size_t> below(2, threshold - 1), above(threshold, 4 * threshold);
  while (static_cast<int>(sizes.size()) < count) sizes.push_back(rng() % 2 ? below(rng) : above(rng));
  return sizes;
}

// Random sizes across `threshold` between ranks 0 and 1, each a send and a receive in one
// group on both ranks; checks data and that each message took the path its size says.
void randomExchange(ridgeComm_t comm, int me, size_t threshold, bool singleCopyExpected, Reporter& rep) {
  const int peer = 1 - me;
  const std::vector<size_t> sizes = randomSizes(threshold, 40);
  uint64_t above = 0;
  const Counters before = counters(comm);
  for (size_t k = 0; k < sizes.size(); ++k) {
    const uint32_t id = static_cast<uint32_t>(k);
    std::string bad = exchange(comm, me, {{true, peer, sizes[k], id}, {false, peer, sizes[k], id}});
    if (!bad.empty()) rep.fail("size " + std::to_string(sizes[k]), bad);
    above += sizes[k] >= threshold ? 1 : 0;
  }
  const uint64_t single = singleCopyExpected ? above : 0, n = sizes.size();
  std::string bad = counted(before, counters(comm), single, single, n - single, n - single);
  if (!bad.empty()) rep.fail("paths", bad);
}

// A threshold to test around when the communicator has none (CMA off): the default's place.
size_t thresholdOf(ridgeComm_t comm) {
  return comm->p2pCopy.minBytes == SIZE_MAX ? size_t(64) << 10 : comm->p2pCopy.minBytes;
}

// Skips the test (in the parent) when a rank reported that CMA is unavailable here.
void skipIfReported(const LaunchResult& res) {
  for (const RankResult& rr : res.ranks)
    if (!linesWith(rr, "SKIP ").empty()) GTEST_SKIP() << linesWith(rr, "SKIP ").front();
}

// Runs body(comm, rank, reporter) on `n` forked ranks whose communicator has the single copy
// (CMA); the test is skipped where it has not. The communicator is destroyed afterwards
// unless the body returns false (it aborted it).
void onRanksWithSingleCopy(int n, double limitSec, const std::string& what,
                           const std::function<bool(ridgeComm_t, int, Reporter&)>& body) {
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(n, limitSec, [&](int me, Reporter& rep) {
    ridgeComm_t comm = initRank(n, id, me, rep);
    if (!comm) return 2;
    if (comm->p2pCopy.minBytes == SIZE_MAX) {
      rep.line("SKIP single-copy (CMA) is not available here");
      ridgeCommDestroy(comm);
      return 0;
    }
    if (body(comm, me, rep)) ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, what);
  skipIfReported(res);
}

TEST(P2pSingleCopy, RandomSizesAcrossTheThreshold) {
  onRanksWithSingleCopy(2, 90, "random sizes", [](ridgeComm_t comm, int me, Reporter& rep) {
    rep.info("threshold " + std::to_string(comm->p2pCopy.minBytes) + " bytes");
    randomExchange(comm, me, comm->p2pCopy.minBytes, true, rep);
    return true;
  });
}

// Several messages to one peer in one group, alternating the paths: they must be matched in
// posting order (a staged message queued behind a single-copy one and the reverse), and the
// other direction runs at the same time.
TEST(P2pSingleCopy, OrderInAGroupAcrossBothPaths) {
  onRanksWithSingleCopy(2, 60, "order", [](ridgeComm_t comm, int me, Reporter& rep) {
    const size_t t = comm->p2pCopy.minBytes;
    const int peer = 1 - me;
    const size_t sizes[] = {100, 3 * t + 5, 0, t, t - 1, 2 * t, 7};
    std::vector<Message> msgs;
    uint64_t above = 0;
    for (uint32_t k = 0; k < 7; ++k) {
      above += sizes[k] >= t ? 1 : 0;
      msgs.push_back({true, peer, sizes[k], k});
    }
    for (uint32_t k = 0; k < 7; ++k) msgs.push_back({false, peer, sizes[k], k});
    const Counters before = counters(comm);
    std::string bad = exchange(comm, me, msgs);
    if (!bad.empty()) rep.fail("group of 14", bad);
    bad = counted(before, counters(comm), above, above, 7 - above, 7 - above);
    if (!bad.empty()) rep.fail("paths", bad);
    return true;
  });
}

// A send to self (a local copy) and a single-copy exchange with the peer in one group, and a
// blocking single-copy ping-pong outside any group.
TEST(P2pSingleCopy, SelfSendBesidePeerAndBlockingPingPong) {
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(2, 60, [&](int me, Reporter& rep) {
    ridgeComm_t comm = initRank(2, id, me, rep);
    if (!comm) return 2;
    const size_t big = 2 * thresholdOf(comm) + 3;
    const int peer = 1 - me;
    std::string bad = exchange(
        comm, me, {{true, me, big, 1}, {true, peer, big, 2}, {false, peer, big, 2}, {false, me, big, 1}});
    if (!bad.empty()) rep.fail("self and peer", bad);
    // Outside a group: rank 0 sends first, rank 1 receives first.
    Buffer out(big), in(big + 64);
    out.fill(me, peer, 3, big);
    for (int step = 0; step < 2; ++step) {
      ridgeResult_t r = (step == me) ? ridgeSend(out.data(), big, ridgeUint8, peer, comm, nullptr)
                                     : ridgeRecv(in.data(), big, ridgeUint8, peer, comm, nullptr);
      if (r != ridgeSuccess) rep.fail("ping-pong", describeResult(r, comm));
    }
    bad = in.check(peer, me, 3, big);
    if (!bad.empty()) rep.fail("ping-pong", bad);
    if (comm->p2pCopy.minBytes != SIZE_MAX) {
      // The peer exchange and the ping-pong (the self copy never reaches the transport).
      bad = counted(Counters{}, counters(comm), 2, 2, 0, 0);
      if (!bad.empty()) rep.fail("paths", bad);
    }
    ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, "self send");
}

// A single-copy send returns only once the receiver has read the buffer (the release of the
// descriptor's slot, SendConnector::unreleasedChunks): rank 0 overwrites its buffer the moment
// ridgeSend returns, and rank 1, which posts its receive late, must still get the original
// bytes. Correct code passes however the ranks are scheduled; the delay only makes an early
// return (which would let rank 1 read the overwritten buffer) show every time.
TEST(P2pSingleCopy, SenderReturnsOnlyAfterTheReceiverRead) {
  onRanksWithSingleCopy(2, 60, "sender waits", [](ridgeComm_t comm, int me, Reporter& rep) {
    const size_t bytes = 3 * comm->p2pCopy.minBytes;
    Buffer buf(bytes + 64);
    if (me == 0) {
      buf.fill(0, 1, 5, bytes);
      ridgeResult_t r = ridgeSend(buf.data(), bytes, ridgeUint8, 1, comm, nullptr);
      std::memset(buf.data(), 0, bytes);  // the caller owns its buffer again
      if (r != ridgeSuccess) rep.fail("send", describeResult(r, comm));
      if (comm->p2pCopy.singleCopySends != 1) rep.fail("send", "not single copy");
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      ridgeResult_t r = ridgeRecv(buf.data(), bytes, ridgeUint8, 0, comm, nullptr);
      if (r != ridgeSuccess) rep.fail("recv", describeResult(r, comm));
      std::string bad = buf.check(0, 1, 5, bytes);
      if (!bad.empty()) rep.fail("recv", "the sender returned before the receiver read its buffer: " + bad);
    }
    return true;
  });
}

// A signed single-copy send is one slot: the send's signature (coll/signature.h) followed by
// the descriptor, marked last, so that the receiver takes one slot and the pair makes one
// hand-off per message (a header slot ahead of the descriptor cost 1.1-1.35x of Open MPI's
// time at 64 KiB-1 MiB, docs/performance.md issue 21). Rank 1 looks at what rank 0 posted
// before it receives; the first message of the communicator (its ledger not set up yet) may
// carry its header alone, the later ones may not. A collective after the messages checks that
// both ledgers counted them alike (its header carries the pair's send and receive counts).
TEST(P2pSingleCopy, SignatureRidesInTheDescriptorSlot) {
  onRanksWithSingleCopy(2, 60, "signed descriptor", [](ridgeComm_t comm, int me, Reporter& rep) {
    const size_t t = comm->p2pCopy.minBytes;
    for (uint32_t msg = 0; msg < 4; ++msg) {
      const size_t bytes = t + msg * 4093;  // odd sizes from the threshold up
      Buffer buf(bytes + 64);
      if (me == 0) {
        buf.fill(0, 1, msg, bytes);
        if (ridgeSend(buf.data(), bytes, ridgeUint8, 1, comm, nullptr) != ridgeSuccess)
          rep.fail("send", ridgeGetLastError(comm));
        continue;
      }
      ridge::SlotInfo info{};
      const void* slot = nullptr;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!(slot = comm->recvFrom[0]->tryPeek(&info)) && std::chrono::steady_clock::now() < deadline) {
      }
      if (!slot) {
        rep.fail("message " + std::to_string(msg), "nothing arrived from rank 0");
        return false;
      }
      ridge::HeaderWire wire;  // the digest, then the signature
      std::memcpy(&wire, slot, sizeof wire);
      const ridge::OpSignature& head = wire.sig;
      if (wire.digest == 0 || head.magic != ridge::kSignatureMagic ||
          head.kind != static_cast<uint8_t>(ridge::CollType::Send) || head.count != bytes)
        rep.fail("message " + std::to_string(msg), "the first slot does not start with the send's signature");
      if (msg > 0 && (info.bytes <= sizeof(ridge::HeaderWire) || !info.lastOfMessage))
        rep.fail("message " + std::to_string(msg), "the signature came in a slot of its own (" +
                                                       std::to_string(info.bytes) +
                                                       " bytes): the single copy takes two slots");
      if (ridgeRecv(buf.data(), bytes, ridgeUint8, 0, comm, nullptr) != ridgeSuccess)
        rep.fail("recv", ridgeGetLastError(comm));
      std::string bad = buf.check(0, 1, msg, bytes);
      if (!bad.empty()) rep.fail("message " + std::to_string(msg), bad);
    }
    // The pair's counts agree (else the allreduce fails on both ranks as a mismatch).
    std::vector<double> v(5, 1.0 + me);
    if (ridgeAllReduce(v.data(), v.data(), v.size(), ridgeFloat64, ridgeSum, comm, nullptr) != ridgeSuccess)
      rep.fail("allreduce after the messages", ridgeGetLastError(comm));
    else if (v[4] != 3.0)
      rep.fail("allreduce after the messages", "wrong sum");
    if (me == 0 && comm->p2pCopy.singleCopySends != 4)
      rep.fail("paths", "not every send took the single copy");
    if (me == 1 && comm->p2pCopy.singleCopyRecvs != 4)
      rep.fail("paths", "not every receive took the single copy");
    return true;
  });
}

// A sender that stages a message the receiver could take single copy (as the GPU proxy's
// sends from device memory do): the receiver finds the send's signature in a slot of its own,
// checks it, sees no descriptor behind it and receives the slots (the branch of
// recvSingleCopy for a header that did not come with a descriptor). Rank 0 is made to stage
// by raising its own threshold, before and after a single-copy message.
TEST(P2pSingleCopy, StagedSenderMeetsASingleCopyReceiver) {
  onRanksWithSingleCopy(2, 60, "staged sender", [](ridgeComm_t comm, int me, Reporter& rep) {
    const size_t t = comm->p2pCopy.minBytes;
    const size_t sizes[] = {2 * t + 3, t, 3 * t + 1};
    const bool staged[] = {true, false, true};
    for (uint32_t k = 0; k < 3; ++k) {
      if (me == 0) comm->p2pCopy.minBytes = staged[k] ? SIZE_MAX : t;
      const Counters before = counters(comm);
      std::string bad = exchange(comm, me, {{me == 0, 1 - me, sizes[k], k}});
      if (!bad.empty()) rep.fail("message " + std::to_string(k), bad);
      const uint64_t single = staged[k] ? 0 : 1;
      bad = me == 0 ? counted(before, counters(comm), single, 0, 1 - single, 0)
                    : counted(before, counters(comm), 0, single, 0, 1 - single);
      if (!bad.empty()) rep.fail("message " + std::to_string(k) + " paths", bad);
    }
    if (me == 0) comm->p2pCopy.minBytes = t;
    return true;
  });
}

// 3 ranks, every rank sends to and receives from both others in one group, each ordered pair
// with its own size: some pairs single copy, some staged, at the same time.
TEST(P2pSingleCopy, MixedPairsOnThreeRanks) {
  constexpr int n = 3;
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(n, 60, [&](int me, Reporter& rep) {
    ridgeComm_t comm = initRank(n, id, me, rep);
    if (!comm) return 2;
    const size_t t = thresholdOf(comm);
    const bool cma = comm->p2pCopy.minBytes != SIZE_MAX;
    // size[src][dst]: rank 0 sends large to both, rank 1 large to 2 only, rank 2 small to both.
    const size_t size[n][n] = {{0, 3 * t, t + 11}, {t / 2, 0, 2 * t}, {t - 1, 999, 0}};
    std::vector<Message> msgs;
    uint64_t sendsAbove = 0, recvsAbove = 0;
    for (int k = 1; k < n; ++k) {
      const int to = (me + k) % n, from = (me + n - k) % n;
      msgs.push_back({true, to, size[me][to], 7});
      msgs.push_back({false, from, size[from][me], 7});
      sendsAbove += size[me][to] >= t ? 1 : 0;
      recvsAbove += size[from][me] >= t ? 1 : 0;
    }
    const Counters before = counters(comm);
    std::string bad = exchange(comm, me, msgs);
    if (!bad.empty()) rep.fail("mixed pairs", bad);
    if (!cma) sendsAbove = recvsAbove = 0;
    bad = counted(before, counters(comm), sendsAbove, recvsAbove, 2 - sendsAbove, 2 - recvsAbove);
    if (!bad.empty()) rep.fail("paths", bad);
    ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, "mixed pairs");
}

// Ranks as threads of one process (ridgeCommInitAll): the peer's address space is this one.
TEST(P2pSingleCopy, RanksAsThreadsOfOneProcess) {
  constexpr int n = 2;
  ridgeComm_t comms[n] = {};
  ASSERT_EQ(ridgeCommInitAll(comms, n, nullptr), ridgeSuccess) << ridgeGetLastError(nullptr);
  const bool cma = comms[0]->p2pCopy.minBytes != SIZE_MAX;
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      const size_t t = thresholdOf(comms[r]);
      const Counters before = counters(comms[r]);
      for (size_t bytes : {t / 3, t, 5 * t + 1}) {
        std::string bad = exchange(comms[r], r, {{true, 1 - r, bytes, 4}, {false, 1 - r, bytes, 4}});
        if (!bad.empty()) errors[r] += "size " + std::to_string(bytes) + ": " + bad + "; ";
      }
      const uint64_t single = cma ? 2 : 0;
      errors[r] += counted(before, counters(comms[r]), single, single, 3 - single, 3 - single);
    });
  for (auto& th : threads) th.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  for (int r = 0; r < n; ++r) EXPECT_EQ(ridgeCommDestroy(comms[r]), ridgeSuccess);
  if (!cma) GTEST_SKIP() << "single-copy (CMA) is not available here: only the staged path ran";
}

// RIDGE_CMA=0: no single copy at any size, every message staged, the same bytes.
TEST(P2pSingleCopy, CmaOffStagesEverything) {
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(2, 90, [&](int me, Reporter& rep) {
    setenv("RIDGE_CMA", "0", 1);
    ridgeComm_t comm = initRank(2, id, me, rep);
    if (!comm) return 2;
    if (comm->p2pCopy.minBytes != SIZE_MAX) rep.fail("RIDGE_CMA=0", "single copy still enabled");
    randomExchange(comm, me, thresholdOf(comm), false, rep);
    ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, "RIDGE_CMA=0");
}

// Drops CAP_SYS_PTRACE from this process's effective capabilities; false if it cannot.
bool dropPtraceCapability() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &header, data) != 0) return false;
  data[CAP_SYS_PTRACE / 32].effective &= ~(1u << (CAP_SYS_PTRACE % 32));
  return syscall(SYS_capset, &header, data) == 0;
}

// CMA not permitted (as under a Yama ptrace scope or in a container that forbids it): each
// rank makes itself non-dumpable and gives up CAP_SYS_PTRACE, so the init probe's
// process_vm_readv fails with EPERM. The communicator still works, every message staged.
TEST(P2pSingleCopy, CmaNotPermittedFallsBackToStaging) {
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(2, 90, [&](int me, Reporter& rep) {
    if (!dropPtraceCapability() || prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
      rep.line("SKIP cannot drop CAP_SYS_PTRACE or dumpability here");
      return 0;
    }
    ridgeComm_t comm = initRank(2, id, me, rep);
    if (!comm) return 2;
    if (comm->p2pCopy.minBytes != SIZE_MAX) {
      rep.line("SKIP process_vm_readv still permitted between non-dumpable processes here");
    } else {
      randomExchange(comm, me, thresholdOf(comm), false, rep);
    }
    ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, "CMA not permitted");
  skipIfReported(res);
}

// The receiver of a single-copy message expecting another size reports it (ridgeInvalidUsage,
// naming both sizes) instead of reading past its buffer; the sender, never acknowledged,
// times out instead of hanging.
TEST(P2pSingleCopy, SizeMismatchIsReported) {
  setenv("RIDGE_TIMEOUT", "2", 1);  // the forked ranks inherit it; the sender times out soon
  onRanksWithSingleCopy(2, 60, "size mismatch", [](ridgeComm_t comm, int me, Reporter& rep) {
    const size_t t = comm->p2pCopy.minBytes;
    Buffer buf(2 * t + 64);
    if (me == 0) {
      buf.fill(0, 1, 9, 2 * t);
      ridgeResult_t r = ridgeSend(buf.data(), 2 * t, ridgeUint8, 1, comm, nullptr);
      if (r == ridgeSuccess) rep.fail("sender", "completed although the receiver refused the message");
    } else {
      ridgeResult_t r = ridgeRecv(buf.data(), 2 * t + 8, ridgeUint8, 0, comm, nullptr);
      const std::string err = ridgeGetLastError(comm);
      if (r != ridgeInvalidUsage || err.find(std::to_string(2 * t)) == std::string::npos)
        rep.fail("receiver", describeResult(r, comm) + ": " + err);
      if (buf.check(0, 1, 9, 0) != "") rep.fail("receiver", "the buffer was written");
    }
    ridgeCommAbort(comm);
    return false;
  });
  setenv("RIDGE_TIMEOUT", "10", 1);  // api_test_main.h's
}

}  // namespace
}  // namespace ridgetest

#include "api_test_main.h"
