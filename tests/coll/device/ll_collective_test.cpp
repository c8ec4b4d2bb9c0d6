// The LL collectives (src/coll/device/ll_path.h) on the emulated device runtime: small collectives on
// device memory launched straight onto the caller's stream, every pair of ranks exchanging
// flagged lines through each other's LL areas (opened through the emulator's IPC, a second
// PROT_NONE view: a host dereference would kill the test).
//
// Checked: every collective, several types and ops, 2, 3 and 4 ranks, in place, against the
// higher-precision host reference (random inputs, poisoned outputs); the LL path ran (the
// emulator's LL launches, no proxy started, no release wait queued) and above-threshold
// operations did not; LL and bulk P2P give the same bits (3 and 9 ranks: the fold order);
// back-to-back operations on one stream and on alternating streams (a gated stream shows the
// issue order is kept); a group over two streams waits for both; LL interleaved with proxy
// operations; abort unblocks a rank whose peer never calls; a timeout is an asynchronous
// error, not a hang; a rank with host memory beside peers with device memory ends in errors;
// RIDGE_LL=off; the flags across their 2^32 - 1 wrap; separate processes (forked).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "coll/comm.h"
#include "coll/device/device_collectives.h"
#include "coll/device/ll_path.h"
#include "coll/device/p2p.h"
#include "collective_case.h"
#include "device/emulated_runtime.h"
#include "device_ranks.h"
#include "kernels/ll_line.h"
#include "rank_launcher.h"
#include "ridge/ridge.h"
#include "scoped_env.h"
#include "time_scale.h"

namespace {

using namespace ridgetest;
using namespace p2ptest;
using ridge::Status;
using ridge::device::EmulatedRuntime;
using ridge::device::ScopedRuntimeForTesting;
using Clock = std::chrono::steady_clock;

// RIDGE_LL=on unless set: these tests put several ranks (threads) on one emulated device,
// which auto refuses (docs/gpu.md, "LL collectives"). Before main, so before any communicator
// reads it; the tests of auto and off set it themselves.
[[maybe_unused]] const bool kLLOnForTheseTests = setenv("RIDGE_LL", "on", 0) == 0;

// The emulator's gate: work queued on a stream behind it waits until the test opens it
// (bounded by the emulator's wait timeout).
struct Gate {
  std::shared_ptr<EmulatedRuntime::StreamGate> gate = std::make_shared<EmulatedRuntime::StreamGate>();
  Status enqueue(EmulatedRuntime& rt, ridgeStream_t s) { return rt.enqueueGate(s, gate); }
  void open() { gate->open(); }
};

// Waits until stream `s` has run `llLaunches` LL launches and can go no further by itself:
// it is idle, or it waits (for a marker, a gate) on something the test still holds. Then what
// the stream has done is all it will do until the test opens a gate: an event, where a sleep
// would only hope that the stream's thread got that far (the thread may wait for a CPU
// longer than any sleep).
void waitUntilStreamStops(EmulatedRuntime& rt, ridgeStream_t s, uint64_t llLaunches) {
  const bool stopped = rt.waitForStream(
      s,
      [llLaunches](const EmulatedRuntime::StreamState& st) {
        return st.llLaunchesRun >= llLaunches && (st.idle || st.waiting != EmulatedRuntime::Waiting::Nothing);
      },
      scaled(std::chrono::seconds(20)));
  ASSERT_TRUE(stopped) << "the stream neither finished nor stopped at a wait within 20 s (times "
                       << timeScale() << ")";
}

// A closure queued on `s` that sets `ran` when the stream reaches it.
Status enqueueMark(EmulatedRuntime& rt, ridgeStream_t s, std::atomic<bool>& ran) {
  return rt.enqueue(s, [&ran] {
    ran.store(true);
    return Status::ok();
  });
}

// `count` int32 elements of value rank + 1 into `m`; and the last int32 of `count` in `m`.
void putRankPlusOne(DevMem& m, size_t count, int rank) {
  std::vector<unsigned char> bytes(count * 4);
  for (size_t e = 0; e < count; ++e) {
    const int32_t v = rank + 1;
    std::memcpy(bytes.data() + e * 4, &v, 4);
  }
  m.put(bytes);
}
int32_t lastInt32(const DevMem& m, size_t count) {
  const std::vector<unsigned char> got = m.get(0, count * 4);
  int32_t v;
  std::memcpy(&v, got.data() + (count - 1) * 4, 4);
  return v;
}

// Waits (bounded: 10 s times RIDGE_TEST_TIME_SCALE) until `flag` is set: a rank that stays out
// of a collective until its peer is done with it.
void waitFor(const std::atomic<bool>& flag) {
  const auto deadline = Clock::now() + scaled(std::chrono::seconds(10));
  while (!flag.load() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

// Two ranks on one device whose rank 1 never calls a collective: rank 0 runs `rankZero`,
// which ends by aborting its communicator; then rank 1, told rank 0 is done, aborts its own.
void rankOneNeverCalls(EmulatedRuntime& rt, int timeoutSeconds,
                       const std::function<void(TestRank&)>& rankZero) {
  std::atomic<bool> rank0Done{false};
  withRanks(
      rt, 2, 1,
      [&](TestRank& t) {
        if (t.rank == 0) {
          rankZero(t);
          rank0Done.store(true);
          return;
        }
        waitFor(rank0Done);
        EXPECT_EQ(ridgeCommAbort(t.comm), ridgeSuccess);
      },
      /*destroy=*/false, timeoutSeconds);
}

std::vector<Call> smallCalls() {
  std::vector<Call> v;
  int i = 0;
  for (Op op : kEveryOp) {
    for (const TypedCase& t : kTypedCases) {
      // One element, a partial last line, several hundred lines.
      const size_t counts[] = {1, 13, 1531};
      v.push_back({op, t.dt, t.red, counts[i++ % 3]});
    }
  }
  v.push_back({Op::AllReduce, ridgeFloat32, ridgeSum, 999, true});
  v.push_back({Op::AllReduce, ridgeBfloat16, ridgeAvg, 77, true});
  v.push_back({Op::ReduceScatter, ridgeFloat16, ridgeSum, 301, true});
  v.push_back({Op::AllGather, ridgeInt64, ridgeSum, 45, true});
  v.push_back({Op::Broadcast, ridgeInt8, ridgeSum, 33, true});
  return v;
}

// Every call went LL: launches counted, no proxy started (so no batch, no host connector byte,
// no release wait).
void expectAllLL(const TestRank& t, uint64_t calls) {
  const ridge::LLStats s = ridge::llStats(t.comm);
  EXPECT_TRUE(s.enabled) << "rank " << t.rank;
  EXPECT_EQ(s.launches, calls) << "rank " << t.rank;
  EXPECT_EQ(t.comm->device->proxy, nullptr) << "rank " << t.rank << ": the proxy was started";
}

// Buffers are allocated once per rank, at the largest size: a free waits for the device's
// streams, as cudaFree does, and a peer's next launch may already spin on this device
// waiting for this rank (the emulator counts such a free: freesStalledByStreams).
void runAllLL(int n, int devices) {
  EmulatedRuntime rt(devices);
  ScopedRuntimeForTesting scope(&rt);
  rt.setFreesWaitForStreams(true);
  const std::vector<Call> calls = smallCalls();
  size_t sendBytes = 0, recvBytes = 0;
  for (const Call& c : calls) {
    sendBytes = std::max(sendBytes, inputElems(c.op, c.count, n) * dtSize(c.dt));
    recvBytes = std::max(recvBytes, outputElems(c.op, c.count, n) * dtSize(c.dt));
  }
  withRanks(rt, n, devices, [&](TestRank& t) {
    DevMem send(rt, sendBytes), recv(rt, recvBytes);
    uint32_t seed = 0x11u + static_cast<uint32_t>(n);
    for (const Call& c : calls) {
      runCall(rt, t, c, seed++, &send, &recv);
      if (::testing::Test::HasFatalFailure()) return;
    }
    expectAllLL(t, calls.size());
  });
  EXPECT_EQ(rt.freesStalledByStreams(), 0u)
      << "a rank freed while a peer's launch on its device waited for it";
  EXPECT_EQ(rt.llLaunches(), uint64_t(n) * calls.size());
  EXPECT_EQ(rt.releaseWaitsQueued(), 0u);
  EXPECT_EQ(rt.ipcViewsOpen(), 0u) << "LL areas left mapped after destroy";
  EXPECT_EQ(rt.launchesBeforePreloadWhileStreamsWait(), 0u);
}

TEST(LLCollectives, EveryCollectiveTwoRanks) {
  runAllLL(2, 1);
}

TEST(LLCollectives, EveryCollectiveThreeRanks) {
  runAllLL(3, 1);
}

TEST(LLCollectives, FourRanksOnTwoDevices) {
  runAllLL(4, 2);
}

// The outputs of `calls` (same seeds) on n ranks: out[rank][call] bytes.
using Outputs = std::vector<std::vector<std::vector<unsigned char>>>;
Outputs outputsOf(int n, const std::vector<Call>& calls, bool expectLL) {
  EmulatedRuntime rt(1);
  ScopedRuntimeForTesting scope(&rt);
  Outputs out(n);
  withRanks(rt, n, 1, [&](TestRank& t) {
    uint32_t seed = 0x77u;
    for (const Call& c : calls) {
      const size_t es = dtSize(c.dt);
      DevMem send(rt, inputElems(c.op, c.count, n) * es), recv(rt, outputElems(c.op, c.count, n) * es);
      runCall(rt, t, c, seed++, &send, &recv);
      out[t.rank].push_back(recv.get(0, recv.bytes));
    }
    EXPECT_EQ(ridge::llStats(t.comm).launches, expectLL ? calls.size() : 0u);
    if (!expectLL) {
      EXPECT_EQ(ridge::p2p::stats(t.comm).p2pOps, calls.size());
    }
  });
  return out;
}

void expectSameBitsAsBulk(int n) {
  // Float sums depend on the order of the operands: only the bulk path's order gives its bits.
  const std::vector<Call> calls = {
      {Op::AllReduce, ridgeFloat32, ridgeSum, 2000},    {Op::AllReduce, ridgeFloat16, ridgeSum, 1500},
      {Op::AllReduce, ridgeBfloat16, ridgeAvg, 999},    {Op::AllReduce, ridgeFloat64, ridgeSum, 777},
      {Op::ReduceScatter, ridgeFloat32, ridgeSum, 500}, {Op::Reduce, ridgeFloat16, ridgeAvg, 1001}};
  const Outputs ll = outputsOf(n, calls, true);
  Outputs bulk;
  {
    ScopedEnv off("RIDGE_LL", "off");
    bulk = outputsOf(n, calls, false);
  }
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < calls.size(); ++i)
      EXPECT_TRUE(ll[r][i] == bulk[r][i])
          << opText(calls[i].op) << " " << dtName(calls[i].dt) << " rank " << r << ": LL and bulk P2P differ";
}

TEST(LLCollectives, SameBitsAsBulkP2pThreeRanks) {
  expectSameBitsAsBulk(3);
}

TEST(LLCollectives, SameBitsAsBulkP2pNineRanksFoldInRounds) {
  expectSameBitsAsBulk(9);
}

TEST(LLCollectives, AboveTheThresholdTakesTheProxy) {
  ScopedEnv max("RIDGE_LL_MAX_BYTES", "1K");
  EmulatedRuntime rt(1);
  ScopedRuntimeForTesting scope(&rt);
  withRanks(rt, 2, 1, [&](TestRank& t) {
    runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 256}, 1);      // 1 KiB per peer: LL
    runCall(rt, t, {Op::AllGather, ridgeFloat32, ridgeSum, 257}, 2);      // 1028 bytes: proxy
    runCall(rt, t, {Op::ReduceScatter, ridgeFloat64, ridgeSum, 128}, 3);  // 1 KiB per peer: LL
    runCall(rt, t, {Op::AlltoAll, ridgeFloat64, ridgeSum, 129}, 4);       // proxy
    const ridge::LLStats s = ridge::llStats(t.comm);
    EXPECT_EQ(s.maxBytes, 1024u);
    EXPECT_EQ(s.launches, 2u);
    EXPECT_EQ(ridge::p2p::stats(t.comm).p2pOps, 2u);
  });
  EXPECT_EQ(rt.llLaunches(), 4u);
}

// Ranks with different RIDGE_LL_MAX_BYTES use the smallest.
TEST(LLCollectives, RanksAgreeOnTheSmallestThreshold) {
  EmulatedRuntime rt(1);
  ScopedRuntimeForTesting scope(&rt);
  ridgeUniqueId id;
  ASSERT_EQ(ridgeGetUniqueId(&id), ridgeSuccess);
  std::vector<size_t> seen(2);
  std::vector<std::thread> threads;
  // Settings are read per process; the init of rank 1 starts after rank 0 read its own.
  setenv("RIDGE_LL_MAX_BYTES", "2K", 1);
  std::atomic<bool> rank0Read{false};
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      if (r == 1) {
        while (!rank0Read.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      ridgeComm_t comm = nullptr;
      ASSERT_EQ(ridgeCommInitRank(&comm, 2, id, r), ridgeSuccess) << errorText();
      seen[r] = ridge::llStats(comm).maxBytes;
      EXPECT_EQ(ridgeCommDestroy(comm), ridgeSuccess);
    });
  // Rank 0 reads the setting during its init, which waits for rank 1 in the exchange.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  setenv("RIDGE_LL_MAX_BYTES", "512", 1);
  rank0Read.store(true);
  for (auto& t : threads) t.join();
  unsetenv("RIDGE_LL_MAX_BYTES");
  EXPECT_EQ(seen[0], 512u);
  EXPECT_EQ(seen[1], 512u);
}

// An invalid LL setting (`name`=`value`) fails init on every rank, with a text naming it.
void expectInitFailsOnEveryRank(const char* name, const char* value) {
  ScopedEnv bad(name, value);
  EmulatedRuntime rt(1);
  ScopedRuntimeForTesting scope(&rt);
  ridgeUniqueId id;
  ASSERT_EQ(ridgeGetUniqueId(&id), ridgeSuccess);
  std::vector<ridgeResult_t> res(2, ridgeSuccess);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      ridgeComm_t comm = nullptr;
      res[r] = ridgeCommInitRank(&comm, 2, id, r);
      if (res[r] == ridgeSuccess)
        ridgeCommDestroy(comm);
      else
        // Named, whichever layer words the rest (the settings registry's validation or the LL
        // path's own check, which a peer reports as "rank r's NAME is not ...").
        EXPECT_NE(errorText().find(name), std::string::npos) << errorText();
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(res[0], ridgeInvalidArgument) << name << "=" << value;
  EXPECT_EQ(res[1], ridgeInvalidArgument) << name << "=" << value;
}

TEST(LLCollectives, InvalidThresholdFailsInitOnEveryRank) {
  expectInitFailsOnEveryRank("RIDGE_LL_MAX_BYTES", "2M");
  // Not a size at all: refused too (it used to fall back to 64K with a warning).
  expectInitFailsOnEveryRank("RIDGE_LL_MAX_BYTES", "abc");
}

// RIDGE_LL that is not auto, on or off (in any case) fails init rather than turn LL on.
TEST(LLCollectives, InvalidModeFailsInitOnEveryRank) {
  expectInitFailsOnEveryRank("RIDGE_LL", "false");
}

// RIDGE_LL is read whatever its case: OFF is off (it used to be taken for auto, which takes
// LL for one rank per device, as here).
TEST(LLCollectives, ModeIsCaseInsensitive) {
  ScopedEnv off("RIDGE_LL", "OFF");
  EmulatedRuntime rt(2);
  ScopedRuntimeForTesting scope(&rt);
  withRanks(rt, 2, 2, [&](TestRank& t) {
    runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 100}, 1);
    EXPECT_FALSE(ridge::llStats(t.comm).enabled);
  });
  EXPECT_EQ(rt.llLaunches(), 0u);
}

// auto refuses two ranks on one device even within one process (a device-synchronizing call
// on one rank's thread would wait for a peer's spinning launch; two ranks on the NULL stream
// would wait for each other), and takes one rank per device.
TEST(LLCollectives, AutoRefusesTwoRanksOnOneDeviceInOneProcess) {
  ScopedEnv autoMode("RIDGE_LL", "auto");
  for (int devices : {1, 2}) {
    EmulatedRuntime rt(devices);
    ScopedRuntimeForTesting scope(&rt);
    withRanks(rt, 2, devices, [&](TestRank& t) {
      runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 100}, 1);
      EXPECT_EQ(ridge::llStats(t.comm).enabled, devices == 2) << devices << " devices, rank " << t.rank;
    });
    EXPECT_EQ(rt.llLaunches(), devices == 2 ? 2u : 0u) << devices << " devices";
  }
}

TEST(LLCollectives, OffTakesTheProxy) {
  ScopedEnv off("RIDGE_LL", "off");
  EmulatedRuntime rt(1);
  ScopedRuntimeForTesting scope(&rt);
  withRanks(rt, 2, 1, [&](TestRank& t) {
    runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 100}, 1);
    EXPECT_FALSE(ridge::llStats(t.comm).enabled);
    EXPECT_EQ(ridge::p2p::stats(t.comm).p2pOps, 1u);
  });
  EXPECT_EQ(rt.llLaunches(), 0u);
}

// Issues `k` allreduces back to back (no synchronization between them) on streams[i % size],
// each reading the previous output, then checks the last: sum of n inputs, then times n per
// further step (integers: exact).
void backToBack(int n, int k, bool alternate) {
  EmulatedRuntime rt(1);
  ScopedRuntimeForTesting scope(&rt);
  withRanks(rt, n, 1, [&](TestRank& t) {
    ridgeStream_t other = nullptr;
    ASSERT_TRUE(rt.createStream(&other).isOk());
    const size_t count = 333;
    std::vector<DevMem*> bufs;
    for (int i = 0; i <= k; ++i) bufs.push_back(new DevMem(rt, count * 8));
    std::vector<int64_t> in(count);
    for (size_t e = 0; e < count; ++e) in[e] = int64_t(e) * 7 + t.rank;
    std::vector<unsigned char> bytes(count * 8);
    std::memcpy(bytes.data(), in.data(), bytes.size());
    bufs[0]->put(bytes);
    for (int i = 0; i < k; ++i) {
      ridgeStream_t s = alternate && i % 2 ? other : t.stream;
      ASSERT_EQ(ridgeAllReduce(bufs[i]->p, bufs[i + 1]->p, count, ridgeInt64, ridgeSum, t.comm, s),
                ridgeSuccess)
          << errorText();
    }
    ASSERT_TRUE(rt.synchronize(t.stream).isOk());
    ASSERT_TRUE(rt.synchronize(other).isOk());
    const std::vector<unsigned char> got = bufs[k]->get(0, count * 8);
    size_t bad = 0;
    for (size_t e = 0; e < count; ++e) {
      int64_t want = 0;
      for (int r = 0; r < n; ++r) want += int64_t(e) * 7 + r;
      for (int i = 1; i < k; ++i) want *= n;
      int64_t v;
      std::memcpy(&v, got.data() + e * 8, 8);
      bad += v != want;
    }
    EXPECT_EQ(bad, 0u) << "rank " << t.rank;
    EXPECT_EQ(ridge::llStats(t.comm).launches, uint64_t(k));
    for (DevMem* b : bufs) delete b;
    rt.destroyStream(other);
  });
}

TEST(LLCollectives, BackToBackOnOneStream) {
  backToBack(3, 24, false);
}

TEST(LLCollectives, BackToBackOnAlternatingStreams) {
  backToBack(3, 24, true);
}

// Every rank: operation 1 on a gated stream A, operation 2 on stream B. Operation 2 must not
// run before operation 1 (issue order), although every rank's operation 2 could complete on
// its own: without the marker chaining, B would finish while A is held.
TEST(LLCollectives, AlternatingStreamsKeepIssueOrder) {
  EmulatedRuntime rt(1);
  ScopedRuntimeForTesting scope(&rt);
  withRanks(rt, 2, 1, [&](TestRank& t) {
    ridgeStream_t b = nullptr;
    ASSERT_TRUE(rt.createStream(&b).isOk());
    const size_t count = 64;
    DevMem in1(rt, count * 4), out1(rt, count * 4), in2(rt, count * 4), out2(rt, count * 4);
    putRankPlusOne(in1, count, t.rank);
    putRankPlusOne(in2, count, t.rank);
    Gate gate;
    ASSERT_TRUE(gate.enqueue(rt, t.stream).isOk());
    ASSERT_EQ(ridgeAllReduce(in1.p, out1.p, count, ridgeInt32, ridgeSum, t.comm, t.stream), ridgeSuccess);
    ASSERT_EQ(ridgeAllReduce(in2.p, out2.p, count, ridgeInt32, ridgeSum, t.comm, b), ridgeSuccess);
    std::atomic<bool> bDone{false};
    ASSERT_TRUE(enqueueMark(rt, b, bDone).isOk());
    // B either ran to its end (operation 2 did not wait) or waits for operation 1.
    waitUntilStreamStops(rt, b, 0);
    EXPECT_FALSE(bDone.load()) << "rank " << t.rank << ": operation 2 ran before operation 1";
    gate.open();
    ASSERT_TRUE(rt.synchronize(t.stream).isOk());
    ASSERT_TRUE(rt.synchronize(b).isOk());
    EXPECT_TRUE(bDone.load());
    for (const DevMem* m : {&out1, &out2}) {
      EXPECT_EQ(lastInt32(*m, count), 3);
    }
    rt.destroyStream(b);
  });
}

// A group's LL operations start only once every stream of the group reached it, as a proxy
// batch does.
TEST(LLCollectives, GroupOverTwoStreamsWaitsForBoth) {
  EmulatedRuntime rt(1);
  ScopedRuntimeForTesting scope(&rt);
  withRanks(rt, 2, 1, [&](TestRank& t) {
    ridgeStream_t b = nullptr;
    ASSERT_TRUE(rt.createStream(&b).isOk());
    const size_t count = 500;
    DevMem a(rt, count * 4), ar(rt, count * 4), bc(rt, count * 4);
    const uint32_t keys[2] = {rankKey(41, 0), rankKey(41, 1)};
    std::vector<unsigned char> in(count * 4);
    fillRankInput(Op::AllReduce, ridgeFloat32, ridgeMax, in.data(), count, 2, keys[t.rank]);
    a.put(in);
    fillRankInput(Op::Broadcast, ridgeFloat32, ridgeSum, in.data(), count, 2, keys[t.rank]);
    bc.put(in);
    ar.put(std::vector<unsigned char>(count * 4, kPoison));
    Gate gateB;
    ASSERT_TRUE(gateB.enqueue(rt, b).isOk());
    ridgeGroupStart();
    ridgeAllReduce(a.p, ar.p, count, ridgeFloat32, ridgeMax, t.comm, t.stream);
    ridgeBroadcast(bc.p, bc.p, count, ridgeFloat32, 1, t.comm, b);
    ASSERT_EQ(ridgeGroupEnd(), ridgeSuccess) << errorText();
    // Stream A either ran the allreduce (it did not wait for B) or waits for B's gate.
    waitUntilStreamStops(rt, t.stream, 0);
    const std::vector<unsigned char> early = ar.get(0, count * 4);
    size_t written = 0;
    for (unsigned char c : early) written += c != kPoison;
    EXPECT_EQ(written, 0u) << "the group's LL operations ran before every stream reached the group";
    gateB.open();
    ASSERT_TRUE(rt.synchronize(t.stream).isOk());
    ASSERT_TRUE(rt.synchronize(b).isOk());
    Mismatches mm;
    std::vector<unsigned char> got = ar.get(0, count * 4);
    checkRankOutput(Op::AllReduce, ridgeFloat32, ridgeMax, got.data(), count, {keys[0], keys[1]}, t.rank, 1,
                    -1, mm);
    got = bc.get(0, count * 4);
    checkRankOutput(Op::Broadcast, ridgeFloat32, ridgeSum, got.data(), count, {keys[0], keys[1]}, t.rank, 1,
                    -1, mm);
    EXPECT_EQ(mm.count, 0u) << mm.text;
    EXPECT_EQ(ridge::llStats(t.comm).launches, 2u);
    rt.destroyStream(b);
  });
  EXPECT_EQ(rt.releaseWaitsQueued(), 0u);
}

// After a group, every stream of the group waits for the whole group, as after a proxy batch:
// rank 0 groups {op 1 on stream A, op 2 on stream B}, rank 1 issues the same operations
// ungrouped with a closed gate before op 2, so rank 0's op 2 cannot finish while the gate is
// closed. Work rank 0 queues on A after the group must wait for it: without the wait at the
// group's exit (leaveLLGroup), A goes on as soon as op 1 finished.
//
// Rank 0 opens rank 1's gate itself, once its stream A has run op 1 and stopped (idle, or
// waiting at the group's exit). This test used to sleep 300 ms on both ranks, then look
// (rank 0) and open the gate (rank 1): when rank 0's thread ran more than a few ms behind
// rank 1's (a loaded machine), the gate opened first, the group finished, A legitimately went
// on and the test failed, with group exit correct all along.
TEST(LLCollectives, GroupExitEveryStreamWaitsForTheWholeGroup) {
  EmulatedRuntime rt(1);
  ScopedRuntimeForTesting scope(&rt);
  Gate gate;  // on rank 1's stream B
  withRanks(rt, 2, 1, [&](TestRank& t) {
    ridgeStream_t b = nullptr;
    ASSERT_TRUE(rt.createStream(&b).isOk());
    const size_t count = 64;
    DevMem in(rt, count * 4), out1(rt, count * 4), out2(rt, count * 4);
    putRankPlusOne(in, count, t.rank);
    std::atomic<bool> afterGroupRan{false};
    if (t.rank == 0) {
      ridgeGroupStart();
      ridgeAllReduce(in.p, out1.p, count, ridgeInt32, ridgeSum, t.comm, t.stream);
      ridgeAllReduce(in.p, out2.p, count, ridgeInt32, ridgeSum, t.comm, b);
      ASSERT_EQ(ridgeGroupEnd(), ridgeSuccess) << errorText();
      ASSERT_TRUE(enqueueMark(rt, t.stream, afterGroupRan).isOk());
      // Op 1 needs rank 1's op 1 only; op 2 on either rank cannot end before the gate opens.
      waitUntilStreamStops(rt, t.stream, 1);
      EXPECT_FALSE(afterGroupRan.load())
          << "stream A went past the group before its operation on stream B ended";
      gate.open();
    } else {
      ASSERT_EQ(ridgeAllReduce(in.p, out1.p, count, ridgeInt32, ridgeSum, t.comm, t.stream), ridgeSuccess);
      ASSERT_TRUE(gate.enqueue(rt, b).isOk());
      ASSERT_EQ(ridgeAllReduce(in.p, out2.p, count, ridgeInt32, ridgeSum, t.comm, b), ridgeSuccess);
    }
    ASSERT_TRUE(rt.synchronize(t.stream).isOk());
    ASSERT_TRUE(rt.synchronize(b).isOk());
    if (t.rank == 0) {
      EXPECT_TRUE(afterGroupRan.load());
    }
    for (const DevMem* m : {&out1, &out2}) {
      EXPECT_EQ(lastInt32(*m, count), 3) << "rank " << t.rank;
    }
    rt.destroyStream(b);
  });
}

// One thread drives a communicator of device 0 while device 1 is current (as a thread that
// drives communicators on several devices without cudaSetDevice between calls): the LL
// launches, group joins and exits bind the communicator's device (the emulator, like CUDA,
// refuses a launch on another device's stream) and give the caller's device back.
TEST(LLCollectives, LaunchBindsTheCommunicatorsDevice) {
  EmulatedRuntime rt(2);
  ScopedRuntimeForTesting scope(&rt);
  withRanks(rt, 2, 1, [&](TestRank& t) {
    ridgeStream_t b = nullptr;
    ASSERT_TRUE(rt.createStream(&b).isOk());
    const size_t count = 64;
    DevMem in(rt, count * 4), out1(rt, count * 4), out2(rt, count * 4), out3(rt, count * 4);
    putRankPlusOne(in, count, t.rank);
    ASSERT_TRUE(rt.bindThread(1).isOk());
    EXPECT_EQ(ridgeAllReduce(in.p, out1.p, count, ridgeInt32, ridgeSum, t.comm, t.stream), ridgeSuccess)
        << errorText();
    EXPECT_EQ(rt.currentDevice(), 1) << "the caller's device was not given back";
    ridgeGroupStart();
    ridgeAllReduce(in.p, out2.p, count, ridgeInt32, ridgeSum, t.comm, t.stream);
    ridgeAllReduce(in.p, out3.p, count, ridgeInt32, ridgeSum, t.comm, b);
    EXPECT_EQ(ridgeGroupEnd(), ridgeSuccess) << errorText();
    EXPECT_EQ(rt.currentDevice(), 1) << "the caller's device was not given back";
    ASSERT_TRUE(rt.bindThread(0).isOk());
    ASSERT_TRUE(rt.synchronize(t.stream).isOk());
    ASSERT_TRUE(rt.synchronize(b).isOk());
    ridgeResult_t async = ridgeSuccess;
    ASSERT_EQ(ridgeCommGetAsyncError(t.comm, &async), ridgeSuccess);
    EXPECT_EQ(async, ridgeSuccess) << errorText();
    for (const DevMem* m : {&out1, &out2, &out3}) EXPECT_EQ(lastInt32(*m, count), 3) << "rank " << t.rank;
    EXPECT_EQ(ridge::llStats(t.comm).launches, 3u);
    rt.destroyStream(b);
  });
}

// Small (LL) and large (proxy) operations in one sequence, without synchronization between
// them, on one stream and on two: each reads the previous output.
void interleaved(bool twoStreams) {
  ScopedEnv max("RIDGE_LL_MAX_BYTES", "4K");
  EmulatedRuntime rt(1);
  ScopedRuntimeForTesting scope(&rt);
  withRanks(rt, 2, 1, [&](TestRank& t) {
    ridgeStream_t other = nullptr;
    ASSERT_TRUE(rt.createStream(&other).isOk());
    const size_t small = 100, large = 5000;  // int32: 400 B (LL), 20000 B (proxy)
    DevMem s0(rt, large * 4), s1(rt, large * 4), s2(rt, large * 4), s3(rt, large * 4), s4(rt, large * 4);
    std::vector<unsigned char> bytes(large * 4);
    for (size_t e = 0; e < large; ++e) {
      const int32_t v = static_cast<int32_t>(e % 97) + t.rank;
      std::memcpy(bytes.data() + e * 4, &v, 4);
    }
    s0.put(bytes);
    ridgeStream_t second = twoStreams ? other : t.stream;
    ASSERT_EQ(ridgeAllReduce(s0.p, s1.p, small, ridgeInt32, ridgeSum, t.comm, t.stream), ridgeSuccess);
    ASSERT_EQ(ridgeAllReduce(s0.p, s2.p, large, ridgeInt32, ridgeSum, t.comm, t.stream), ridgeSuccess);
    if (twoStreams) {
      // The caller orders its own streams; Ridge orders its LL operations among themselves.
      ASSERT_TRUE(rt.synchronize(t.stream).isOk());
    }
    ASSERT_EQ(ridgeAllReduce(s2.p, s3.p, small, ridgeInt32, ridgeSum, t.comm, second), ridgeSuccess);
    ASSERT_EQ(ridgeAllReduce(s1.p, s4.p, small, ridgeInt32, ridgeSum, t.comm, t.stream), ridgeSuccess);
    ASSERT_TRUE(rt.synchronize(t.stream).isOk());
    ASSERT_TRUE(rt.synchronize(other).isOk());
    size_t bad = 0;
    const std::vector<unsigned char> g2 = s2.get(0, large * 4), g3 = s3.get(0, small * 4),
                                     g4 = s4.get(0, small * 4);
    for (size_t e = 0; e < large; ++e) {
      const int32_t base = 2 * static_cast<int32_t>(e % 97) + 1;
      int32_t v;
      std::memcpy(&v, g2.data() + e * 4, 4);
      bad += v != base;
      if (e >= small) continue;
      std::memcpy(&v, g3.data() + e * 4, 4);
      bad += v != 2 * base;
      std::memcpy(&v, g4.data() + e * 4, 4);
      bad += v != 2 * base;
    }
    EXPECT_EQ(bad, 0u) << "rank " << t.rank;
    EXPECT_EQ(ridge::llStats(t.comm).launches, 3u);
    EXPECT_EQ(ridge::p2p::stats(t.comm).p2pOps, 1u);
    rt.destroyStream(other);
  });
}

TEST(LLCollectives, InterleavedWithProxyOperationsOnOneStream) {
  interleaved(false);
}

TEST(LLCollectives, InterleavedWithProxyOperationsOnTwoStreams) {
  interleaved(true);
}

// Rank 0 calls, rank 1 never does: rank 0's launch spins until the abort stops it.
TEST(LLCollectives, AbortUnblocksARankWhosePeerNeverCalls) {
  EmulatedRuntime rt(1);
  ScopedRuntimeForTesting scope(&rt);
  rankOneNeverCalls(rt, 30, [&](TestRank& t) {
    DevMem in(rt, 400), out(rt, 400);
    ASSERT_EQ(ridgeAllReduce(in.p, out.p, 100, ridgeFloat32, ridgeSum, t.comm, t.stream), ridgeSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    bool done = false;
    ridge::device::Marker* m = nullptr;
    ASSERT_TRUE(rt.createMarker(&m).isOk());
    ASSERT_TRUE(rt.recordMarker(m, t.stream).isOk());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(rt.queryMarker(m, &done).isOk());
    EXPECT_FALSE(done) << "the LL launch did not wait for the peer";
    rt.destroyMarker(m);
    expectAbortReleasesTheStream(rt, t);
  });
}

// After an abort, a peer's launch queued earlier still stores its lines into this rank's area
// when it starts: the aborted rank must not free the area (ranks of one process address each
// other's areas by pointer, as under CUDA). Rank 1 queues operation 1 behind a closed gate,
// rank 0 aborts and allocates memory of the area's size (which may take its freed place),
// then rank 1's launch runs: the area is still allocated and the new memory untouched.
TEST(LLCollectives, AbortNeverFreesTheAreaAPeerMayStillWrite) {
  EmulatedRuntime rt(1);
  rt.setIpcWithinProcess(false);
  ScopedRuntimeForTesting scope(&rt);
  Gate gate;
  std::atomic<bool> queued{false}, rank0Aborted{false}, rank1Ran{false};
  withRanks(
      rt, 2, 1,
      [&](TestRank& t) {
        runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 300}, 1);
        if (t.rank == 1) {
          DevMem in(rt, 4096), out(rt, 4096);
          ASSERT_TRUE(gate.enqueue(rt, t.stream).isOk());
          ASSERT_EQ(ridgeAllReduce(in.p, out.p, 1000, ridgeFloat32, ridgeSum, t.comm, t.stream),
                    ridgeSuccess);
          queued.store(true);
          waitFor(rank0Aborted);
          gate.open();
          (void)rt.synchronize(t.stream);  // its wait for rank 0 times out
          rank1Ran.store(true);
        } else {
          waitFor(queued);
          const size_t live = rt.liveDeviceAllocations();
          EXPECT_EQ(ridgeCommAbort(t.comm), ridgeSuccess);
          EXPECT_EQ(rt.liveDeviceAllocations(), live) << "the aborted rank freed its LL area";
          const size_t areaBytes = 2 * 2 * (ridge::ll::linesFor(ridge::llStats(t.comm).maxBytes) + 1) * 16;
          std::vector<DevMem*> fresh;
          for (int i = 0; i < 4; ++i) {
            fresh.push_back(new DevMem(rt, areaBytes));
            fresh.back()->put(std::vector<unsigned char>(areaBytes, kPoison));
          }
          rank0Aborted.store(true);
          waitFor(rank1Ran);
          for (DevMem* m : fresh) {
            const std::vector<unsigned char> got = m->get(0, areaBytes);
            size_t changed = 0;
            for (unsigned char c : got) changed += c != kPoison;
            EXPECT_EQ(changed, 0u) << "a peer's launch wrote into memory allocated after the abort";
            delete m;
          }
        }
        if (t.rank == 1) {
          EXPECT_EQ(ridgeCommAbort(t.comm), ridgeSuccess);
        }
      },
      /*destroy=*/false, /*timeoutSeconds=*/1);
}

// Abort returns promptly although this rank's LL launch is still queued behind other work on
// the stream (a closed gate): it leaks what the launch may touch instead of waiting for it.
TEST(LLCollectives, AbortReturnsPromptlyWithALaunchQueuedBehindAGate) {
  EmulatedRuntime rt(1);
  ScopedRuntimeForTesting scope(&rt);
  Gate gate;
  rankOneNeverCalls(rt, 30, [&](TestRank& t) {
    DevMem in(rt, 400), out(rt, 400);
    ASSERT_TRUE(gate.enqueue(rt, t.stream).isOk());
    ASSERT_EQ(ridgeAllReduce(in.p, out.p, 100, ridgeFloat32, ridgeSum, t.comm, t.stream), ridgeSuccess);
    const auto t0 = Clock::now();
    EXPECT_EQ(ridgeCommAbort(t.comm), ridgeSuccess);
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), scaledSeconds(5.0));
    gate.open();
    (void)rt.synchronize(t.stream);  // the launch starts, sees the abort and ends
  });
}

// A peer that never calls: the launch gives up at the timeout, the stream moves on, and the
// communicator reports ridgeTimeout asynchronously and refuses later calls.
TEST(LLCollectives, TimeoutIsAnAsyncErrorNotAHang) {
  EmulatedRuntime rt(1);
  ScopedRuntimeForTesting scope(&rt);
  rankOneNeverCalls(rt, 1, [&](TestRank& t) {
    DevMem in(rt, 400), out(rt, 400);
    const auto t0 = Clock::now();
    ASSERT_EQ(ridgeAllReduce(in.p, out.p, 100, ridgeFloat32, ridgeSum, t.comm, t.stream), ridgeSuccess);
    ASSERT_TRUE(rt.synchronize(t.stream).isOk());
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_GE(waited, 0.9);
    EXPECT_LT(waited, scaledSeconds(5.0));
    ridgeResult_t async = ridgeSuccess;
    ASSERT_EQ(ridgeCommGetAsyncError(t.comm, &async), ridgeSuccess);
    EXPECT_EQ(async, ridgeTimeout);
    EXPECT_NE(errorText().find("LL collective"), std::string::npos) << errorText();
    EXPECT_EQ(ridgeAllReduce(in.p, out.p, 100, ridgeFloat32, ridgeSum, t.comm, t.stream), ridgeTimeout);
    EXPECT_EQ(ridgeCommAbort(t.comm), ridgeSuccess);
  });
}

// Calls that disagree in one field (issue 19, signatures on the LL path): every launch sends
// its call on the slots' signature line and checks every peer's before any data line. Every
// rank must fail asynchronously with ridgeInvalidUsage within seconds (not the 30 s timeout),
// even where the lengths differ; a correct call on a fresh communicator is then right and LL.
void expectLLMismatchFailsEveryRank(const Disagreement& k) {
  EmulatedRuntime rt(1);
  ScopedRuntimeForTesting scope(&rt);
  std::vector<ridgeResult_t> errors(2, ridgeSuccess);
  std::vector<std::string> texts(2);
  withRanks(
      rt, 2, 1,
      [&](TestRank& t) {
        const int r = t.rank;
        const size_t bytes = k.count[r] * dtSize(k.dt[r]);
        DevMem in(rt, bytes), out(rt, bytes);
        const auto t0 = Clock::now();
        ASSERT_EQ(issueDisagreeing(k, r, in.p, out.p, t.comm, t.stream), ridgeSuccess) << errorText();
        ASSERT_TRUE(rt.synchronize(t.stream).isOk());
        EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), scaledSeconds(10.0))
            << "a rank waited for the timeout";
        EXPECT_EQ(ridge::llStats(t.comm).launches, 1u) << "the call did not go LL";
        ASSERT_EQ(ridgeCommGetAsyncError(t.comm, &errors[r]), ridgeSuccess);
        const char* e = ridgeGetLastError(t.comm);
        texts[r] = e ? e : "";
        EXPECT_NE(ridgeAllReduce(in.p, out.p, 1, ridgeFloat32, ridgeSum, t.comm, t.stream), ridgeSuccess)
            << "a broken communicator ran a call";
        EXPECT_EQ(ridgeCommAbort(t.comm), ridgeSuccess);
      },
      /*destroy=*/false);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], ridgeInvalidUsage) << k.name << ": rank " << r << ": " << texts[r];
    EXPECT_NE(texts[r].find("mismatched calls (LL path)"), std::string::npos) << texts[r];
  }
  withRanks(rt, 2, 1, [&](TestRank& t) {
    runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 301}, 91);
    expectStreamDone(rt, t);
    expectAllLL(t, 1);
  });
}

TEST(LLCollectives, MismatchedRootCountTypeOrOpFailsEveryRank) {
  const Disagreement cases[] = {
      {"root",
       {Op::Broadcast, Op::Broadcast},
       {ridgeFloat32, ridgeFloat32},
       {ridgeSum, ridgeSum},
       {100, 100},
       {0, 1}},
      {"count",
       {Op::AllReduce, Op::AllReduce},
       {ridgeFloat32, ridgeFloat32},
       {ridgeSum, ridgeSum},
       {100, 140},
       {0, 0}},
      {"datatype (same bytes)",
       {Op::AllReduce, Op::AllReduce},
       {ridgeFloat32, ridgeInt32},
       {ridgeSum, ridgeSum},
       {100, 100},
       {0, 0}},
      {"op",
       {Op::AllReduce, Op::AllReduce},
       {ridgeFloat32, ridgeFloat32},
       {ridgeSum, ridgeMax},
       {100, 100},
       {0, 0}},
      {"kind",
       {Op::AllReduce, Op::Broadcast},
       {ridgeFloat32, ridgeFloat32},
       {ridgeSum, ridgeSum},
       {100, 100},
       {0, 0}},
  };
  for (const Disagreement& k : cases) {
    SCOPED_TRACE(k.name);
    expectLLMismatchFailsEveryRank(k);
  }
}

// A mix the ranks cannot see without talking: rank 0 passes host memory (host path), rank 1
// device memory (LL). Both end in errors within the timeout; nothing hangs or crashes.
TEST(LLCollectives, HostMemoryOnOneRankEndsInErrorsNotAHang) {
  EmulatedRuntime rt(1);
  ScopedRuntimeForTesting scope(&rt);
  const auto t0 = Clock::now();
  withRanks(
      rt, 2, 1,
      [&](TestRank& t) {
        const size_t count = 100;
        if (t.rank == 0) {
          std::vector<float> in(count, 1.0f), out(count, 0.0f);
          EXPECT_NE(ridgeAllReduce(in.data(), out.data(), count, ridgeFloat32, ridgeSum, t.comm, nullptr),
                    ridgeSuccess);
        } else {
          DevMem in(rt, count * 4), out(rt, count * 4);
          ASSERT_EQ(ridgeAllReduce(in.p, out.p, count, ridgeFloat32, ridgeSum, t.comm, t.stream),
                    ridgeSuccess);
          ASSERT_TRUE(rt.synchronize(t.stream).isOk());
          ridgeResult_t async = ridgeSuccess;
          ASSERT_EQ(ridgeCommGetAsyncError(t.comm, &async), ridgeSuccess);
          EXPECT_EQ(async, ridgeTimeout);
        }
        EXPECT_EQ(ridgeCommAbort(t.comm), ridgeSuccess);
      },
      /*destroy=*/false, /*timeoutSeconds=*/2);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), scaledSeconds(15.0));
}

// Flags are flagForStep(operation number): across the 2^32 - 1 wrap they stay non-zero and
// differ from the previous use of each slot.
TEST(LLCollectives, FlagsAcrossTheWrap) {
  EmulatedRuntime rt(1);
  ScopedRuntimeForTesting scope(&rt);
  withRanks(rt, 3, 1, [&](TestRank& t) {
    // Used first at small numbers (0 and 1), so the slots hold lines with small flags; the
    // jump keeps the parity alternating (2 and 0xFFFFFFFA are even).
    runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 300}, 1);
    runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 300}, 2);
    ridge::setNextLLOpForTesting(t.comm, 0xFFFFFFFFull - 5);
    uint32_t seed = 10;
    for (int i = 0; i < 8; ++i) {
      runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 300}, seed++);
      runCall(rt, t, {Op::AllGather, ridgeInt32, ridgeSum, 100}, seed++);
    }
    EXPECT_EQ(ridge::llStats(t.comm).nextOp, 0xFFFFFFFFull - 5 + 16);
  });
}

// A slot line left from long ago must not look ready when the flags come round again:
// operation 1 (parity 1, flag 2) fills 150 lines of each slot; the counter then jumps to
// 2^33 - 2 (flag 1, parity 0: a small allgather), so operation 2^33 - 1 has parity 1 and flag
// 2 again. Rank 1 holds that operation behind a closed gate: rank 0 must wait for rank 1's
// new lines, not finish with operation 1's lines still in its slot (without the receivers'
// zeroing of consumed lines its output is operation 1's sum, not this one's).
TEST(LLCollectives, StaleLineFromBeforeTheFlagWrapIsNotReady) {
  EmulatedRuntime rt(1);
  ScopedRuntimeForTesting scope(&rt);
  Gate gate;
  withRanks(rt, 2, 1, [&](TestRank& t) {
    runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 300}, 1);
    runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 300}, 2);
    ridge::setNextLLOpForTesting(t.comm, (uint64_t(1) << 33) - 3);
    ASSERT_EQ(ridge::llStats(t.comm).nextOp, (uint64_t(1) << 33) - 2);
    runCall(rt, t, {Op::AllGather, ridgeInt32, ridgeSum, 50}, 3);
    const size_t count = 300;
    DevMem in(rt, count * 4), out(rt, count * 4);
    const uint32_t keys[2] = {rankKey(4, 0), rankKey(4, 1)};
    std::vector<unsigned char> bytes(count * 4);
    fillRankInput(Op::AllReduce, ridgeFloat32, ridgeSum, bytes.data(), count, 2, keys[t.rank]);
    in.put(bytes);
    out.put(std::vector<unsigned char>(count * 4, kPoison));
    if (t.rank == 1) {
      ASSERT_TRUE(gate.enqueue(rt, t.stream).isOk());
    }
    ASSERT_EQ(ridgeAllReduce(in.p, out.p, count, ridgeFloat32, ridgeSum, t.comm, t.stream), ridgeSuccess);
    if (t.rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      gate.open();
    }
    ASSERT_TRUE(rt.synchronize(t.stream).isOk());
    Mismatches mm;
    const std::vector<unsigned char> got = out.get(0, count * 4);
    checkRankOutput(Op::AllReduce, ridgeFloat32, ridgeSum, got.data(), count, {keys[0], keys[1]}, t.rank, 1,
                    kPoison, mm);
    EXPECT_EQ(mm.count, 0u) << "rank " << t.rank << ": " << mm.text;
  });
}

// Separate processes: the emulator's IPC works within one process only. With auto, ranks in
// separate processes on one device (no bus ids) do not use LL: no LL area is even allocated;
// with on, each rank allocates its area, opening the peer's fails on every rank and the
// confirmation turns LL off everywhere. Either way the collective is right (on managed memory,
// which the proxy stages: the emulator's P2P cannot cross processes either).
void forkedRanks(const char* mode, uint64_t areasAtInit) {
  ridgeUniqueId id;
  ASSERT_TRUE(makeUniqueId(&id));
  const LaunchResult res = launchRanks(2, 60, [&](int rank, Reporter& rep) {
    setenv("RIDGE_LL", mode, 1);
    setLoopbackEnv();
    EmulatedRuntime rt(1);
    ScopedRuntimeForTesting scope(&rt);
    ridgeComm_t comm = initRank(2, id, rank, rep);
    if (!comm) return 1;
    if (ridge::llStats(comm).enabled) rep.fail("ll", "LL enabled between processes the emulator cannot map");
    if (rt.deviceAllocations() != areasAtInit)
      rep.fail("ll", std::to_string(rt.deviceAllocations()) + " device allocations at init, expected " +
                         std::to_string(areasAtInit));
    ridgeStream_t s = nullptr;
    if (!rt.createStream(&s).isOk()) return 1;
    const size_t count = 200;
    void *in = nullptr, *out = nullptr;
    if (!rt.allocDeviceOn(count * 4, &in, -1, true).isOk() ||
        !rt.allocDeviceOn(count * 4, &out, -1, true).isOk())
      return 1;
    std::vector<int32_t> h(count, rank + 1);
    (void)rt.copyToDevice(in, h.data(), count * 4);
    const ridgeResult_t r = ridgeAllReduce(in, out, count, ridgeInt32, ridgeSum, comm, s);
    if (r != ridgeSuccess) rep.fail("allreduce", describeResult(r, comm));
    if (!rt.synchronize(s).isOk()) rep.fail("sync", "stream failed");
    (void)rt.copyToHost(h.data(), out, count * 4);
    for (size_t e = 0; e < count; ++e)
      if (h[e] != 3) {
        rep.fail("result", "element " + std::to_string(e) + " is " + std::to_string(h[e]));
        break;
      }
    if (ridgeCommDestroy(comm) != ridgeSuccess) rep.fail("destroy", "failed");
    rt.destroyStream(s);
    rt.freeDevice(in);
    rt.freeDevice(out);
    return rep.failures() ? 1 : 0;
  });
  reportChildFailures(res, std::string("RIDGE_LL=") + mode);
}

TEST(LLCollectives, SeparateProcessesOnOneDeviceAutoIsOff) {
  forkedRanks("auto", 0);
}

TEST(LLCollectives, SeparateProcessesOnAgreeWhenAnAreaCannotOpen) {
  forkedRanks("on", 1);
}

}  // namespace
