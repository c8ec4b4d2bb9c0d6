// The classic GPUDirect RDMA data path (docs/gpu.md) on the emulated device runtime: ranks
// are threads of this process that look like different hosts to Ridge (RIDGE_SHM=0 puts
// every pair on the net transport, over softnic), P2P is off, so device collectives either
// run on the communicator's device network (slots in emulated device memory that the host
// cannot touch, registered through the runtime's dma-buf export; the device runtime copies
// and reduces) or are staged through pinned host memory.
//
// Checked on 2 and 3 ranks: send/receive, allreduce and reduce-scatter (ring, device
// reductions), reduce (chain, device reductions), allgather, broadcast and alltoall, against
// the higher-precision host reference with random inputs and poisoned outputs; counters that
// prove the path (no staged batch, dma-buf exports, flushes under RIDGE_GDR_FLUSH=read, device
// reductions launched); a group mixing device-network collectives with sends and receives; all
// of these once more on slow emulated devices of different speeds (a settle missing before a
// slot is posted or released corrupts a slot every run, not by chance); on a slow emulated
// device, that device work is queued ahead (more than one operation in flight per device: the
// data ops do not wait for each); host collectives on the same communicator between device
// ones; a rank whose buffer is managed memory votes no and every rank stages;
// RIDGE_GDR_DATA_PATH=off and a runtime without dma-buf build no device network.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "coll/comm.h"
#include "coll/device/device_collectives.h"
#include "device/emulated_runtime.h"
#include "device_ranks.h"
#include "ridge/ridge.h"
#include "time_scale.h"
#include "transports/net/net_transport.h"

namespace {

using namespace ridgetest;
using namespace p2ptest;
using ridge::device::ScopedRuntimeForTesting;
using Clock = std::chrono::steady_clock;

// Every test here: the ranks reach each other only through the net transport over softnic.
struct GdrEnv {
  explicit GdrEnv(const char* flush = "read", const char* dataPath = "auto") {
    setenv("RIDGE_NET", "softnic", 1);
    setenv("RIDGE_SHM", "0", 1);
    setenv("RIDGE_P2P", "off", 1);
    setenv("RIDGE_GDR_MODE", "off", 1);
    setenv("RIDGE_SOFTNIC_RTO_US", "3000", 1);
    // Small slots: messages span many chunks and every FIFO wraps.
    setenv("RIDGE_RDMA_SLOTS", "4", 1);
    setenv("RIDGE_RDMA_SLOT_BYTES", "16K", 1);
    setenv("RIDGE_GDR_FLUSH", flush, 1);
    setenv("RIDGE_GDR_DATA_PATH", dataPath, 1);
  }
  ~GdrEnv() {
    for (const char* v :
         {"RIDGE_NET", "RIDGE_SHM", "RIDGE_P2P", "RIDGE_GDR_MODE", "RIDGE_SOFTNIC_RTO_US", "RIDGE_RDMA_SLOTS",
          "RIDGE_RDMA_SLOT_BYTES", "RIDGE_GDR_FLUSH", "RIDGE_GDR_DATA_PATH"})
      unsetenv(v);
  }
};

// What the path counters of one rank must say after `deviceBatches` batches on the device
// network and `staged` staged ones.
void expectPath(const TestRank& t, uint64_t deviceBatches, uint64_t staged) {
  ridgeComm* c = t.comm;
  ASSERT_NE(c->device->net, nullptr) << "rank " << t.rank << ": no device network";
  EXPECT_EQ(c->device->netBatches, deviceBatches) << "rank " << t.rank;
  EXPECT_EQ(c->device->stagedBatches, staged) << "rank " << t.rank;
  EXPECT_EQ(c->device->netDeclined, staged) << "rank " << t.rank;
  const ridge::NetTransportStats s = ridge::netTransportStats(c->device->net.get());
  EXPECT_TRUE(s.recvRingsOnDevice) << "rank " << t.rank;
  // The send area and the rings are registered outside the registration cache (through
  // dma-buf: expectCleanRuntime counts the exports); nothing else needed one.
  EXPECT_EQ(s.registrations, 0u) << "rank " << t.rank << ": a device-network chunk went through the cache";
  EXPECT_EQ(s.directSends, 0u) << "rank " << t.rank;
  if (deviceBatches > 0) {
    EXPECT_GT(s.chunksArrived, 0u) << "rank " << t.rank;
    EXPECT_EQ(s.flushesCompleted, s.chunksArrived) << "rank " << t.rank << ": RIDGE_GDR_FLUSH=read";
  }
}

// Checks common to every run on the device network.
void expectCleanRuntime(EmulatedRuntime& rt, int n) {
  // Per rank: the trial export at init (deviceNetworkPossibleHere) and one for each of the
  // send area and the receive rings: an area registered any other way would lower it.
  EXPECT_EQ(rt.dmaBufExports(), static_cast<uint64_t>(3 * n)) << "slots not registered through dma-buf";
  EXPECT_EQ(rt.allocationsWhileStreamsWait(), 0u);
  EXPECT_EQ(rt.launchesBeforePreloadWhileStreamsWait(), 0u);
}

// Runs `body` on `n` rank threads, one emulated device each (ranks of different hosts have
// different GPUs), under GdrEnv("read", dataPath); `dmaBuf` false: the runtime cannot export
// dma-buf. Then `after` on the runtime, once the communicators are destroyed.
using GdrBody = std::function<void(EmulatedRuntime&, TestRank&)>;
void withGdrRanks(int n, const GdrBody& body, const std::function<void(EmulatedRuntime&)>& after,
                  const char* dataPath = "auto", bool dmaBuf = true) {
  GdrEnv env("read", dataPath);
  EmulatedRuntime rt(3);
  rt.setDmaBufSupported(dmaBuf);
  ScopedRuntimeForTesting scope(&rt);
  withRanks(rt, n, n, [&](TestRank& t) { body(rt, t); });
  after(rt);
}

// Slow devices: each rank's device sleeps before every copy or reduction for as long as the
// object lives (on its own device, set from the rank's thread: withGdrRanks puts rank r on
// device r). Ranks differ: rank 1, the root of every reduce (n / 2) and the receiver of rank
// 0's sends, is the slowest, so the device work it queues behind a received slot piles up
// faster than its sender can refill slots. A slot released before the device read it is then
// overwritten by the sender's next chunk every time, not by chance; a slot posted before the
// device wrote it goes out stale. Delays stay short enough that a run takes well under a
// second.
struct SlowDevices {
  EmulatedRuntime& rt;
  int device;
  SlowDevices(EmulatedRuntime& r, const TestRank& t, bool slow) : rt(r), device(t.rank) {
    static constexpr int64_t kDelayUs[3] = {50, 200, 50};
    if (slow) rt.setWorkDelay(device, std::chrono::microseconds(kDelayUs[t.rank % 3]));
  }
  ~SlowDevices() { rt.setWorkDelay(device, std::chrono::microseconds(0)); }
};

void runOnDeviceNetwork(int n, const std::vector<Call>& calls, bool expectReductions, bool slow = false) {
  withGdrRanks(
      n,
      [&](EmulatedRuntime& rt, TestRank& t) {
        SlowDevices slowDevices(rt, t, slow);
        uint32_t seed = 0x6d2b79f5u + static_cast<uint32_t>(n);
        for (const Call& c : calls) {
          runCall(rt, t, c, seed++);
          if (::testing::Test::HasFatalFailure()) return;
        }
        expectPath(t, calls.size(), 0);
      },
      [&](EmulatedRuntime& rt) {
        expectCleanRuntime(rt, n);
        if (expectReductions)
          EXPECT_GT(rt.reducesLaunched(), 0u) << "no device reduction ran";
        else
          EXPECT_EQ(rt.reducesLaunched(), 0u);
      });
}

std::vector<Call> reductions() {
  return {
      {Op::AllReduce, ridgeFloat32, ridgeSum, 40001},       {Op::AllReduce, ridgeFloat16, ridgeAvg, 1531},
      {Op::AllReduce, ridgeInt32, ridgeProd, 9000},         {Op::AllReduce, ridgeBfloat16, ridgeMax, 20011},
      {Op::AllReduce, ridgeFloat64, ridgeMin, 3001},        {Op::AllReduce, ridgeUint8, ridgeSum, 1},
      {Op::AllReduce, ridgeFloat32, ridgeSum, 12345, true}, {Op::ReduceScatter, ridgeFloat32, ridgeSum, 7001},
      {Op::ReduceScatter, ridgeInt32, ridgeMax, 5003, true}};
}

std::vector<Call> copies() {
  return {{Op::AllGather, ridgeFloat32, ridgeSum, 9001},
          {Op::AllGather, ridgeUint8, ridgeSum, 3},
          {Op::AllGather, ridgeFloat16, ridgeSum, 4097, true},
          {Op::Broadcast, ridgeFloat64, ridgeSum, 10007},
          {Op::Broadcast, ridgeInt32, ridgeSum, 1},
          {Op::Broadcast, ridgeBfloat16, ridgeSum, 30001, true}};
}

// Calls that disagree in one field (issue 19, signatures on the device network): the per-batch
// vote carries every collective's call; every rank must fail asynchronously with
// ridgeInvalidUsage naming both calls, within seconds, before any slot moves; a correct call on
// a fresh communicator then runs on the device network and is right.
void expectDeviceNetworkMismatchFailsEveryRank(const Disagreement& k) {
  std::vector<ridgeResult_t> errors(2, ridgeSuccess);
  std::vector<std::string> texts(2);
  withGdrRanks(
      2,
      [&](EmulatedRuntime& rt, TestRank& t) {
        const int r = t.rank;
        const size_t bytes = k.count[r] * dtSize(k.dt[r]);
        DevMem in(rt, bytes), out(rt, bytes);
        const auto t0 = std::chrono::steady_clock::now();
        ASSERT_EQ(issueDisagreeing(k, r, in.p, out.p, t.comm, t.stream), ridgeSuccess) << errorText();
        ASSERT_TRUE(rt.synchronize(t.stream).isOk());
        EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                  ridgetest::scaledSeconds(10.0))
            << "a rank waited for the timeout";
        ASSERT_EQ(ridgeCommGetAsyncError(t.comm, &errors[r]), ridgeSuccess);
        const char* e = ridgeGetLastError(t.comm);
        texts[r] = e ? e : "";
        EXPECT_EQ(t.comm->device->netBatches, 0u) << "a mismatched batch ran on the device network";
      },
      [](EmulatedRuntime&) {});
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], ridgeInvalidUsage) << k.name << ": rank " << r << ": " << texts[r];
    for (const char* want : k.says)
      EXPECT_NE(texts[r].find(want), std::string::npos)
          << k.name << ": rank " << r << "'s message lacks \"" << want << "\": " << texts[r];
  }
  withGdrRanks(
      2,
      [&](EmulatedRuntime& rt, TestRank& t) {
        runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 4001}, 5);
        expectPath(t, 1, 0);
      },
      [](EmulatedRuntime&) {});
}

TEST(GdrDataPath, MismatchedRootCountTypeOrOpFailsEveryRankNamingBothCalls) {
  const Disagreement cases[] = {
      {"root",
       {Op::Broadcast, Op::Broadcast},
       {ridgeFloat32, ridgeFloat32},
       {ridgeSum, ridgeSum},
       {3000, 3000},
       {0, 1},
       {"broadcast(root 0, 3000 x float", "broadcast(root 1, 3000 x float"}},
      {"count",
       {Op::AllReduce, Op::AllReduce},
       {ridgeFloat32, ridgeFloat32},
       {ridgeSum, ridgeSum},
       {3000, 3004},
       {0, 0},
       {"allreduce(3000 x float", "allreduce(3004 x float"}},
      {"datatype (same bytes)",
       {Op::AllReduce, Op::AllReduce},
       {ridgeFloat32, ridgeInt32},
       {ridgeSum, ridgeSum},
       {3000, 3000},
       {0, 0},
       {"3000 x float", "3000 x int32"}},
      {"op",
       {Op::AllReduce, Op::AllReduce},
       {ridgeFloat32, ridgeFloat32},
       {ridgeSum, ridgeMax},
       {3000, 3000},
       {0, 0},
       {"float, sum)", "float, max)"}},
  };
  for (const Disagreement& k : cases) {
    SCOPED_TRACE(k.name);
    expectDeviceNetworkMismatchFailsEveryRank(k);
  }
}

TEST(GdrDataPath, AllReduceAndReduceScatterTwoRanks) {
  runOnDeviceNetwork(2, reductions(), true);
}

TEST(GdrDataPath, AllReduceAndReduceScatterThreeRanks) {
  runOnDeviceNetwork(3, reductions(), true);
}

TEST(GdrDataPath, AllReduceAndReduceScatterOnSlowDevices) {
  runOnDeviceNetwork(3, reductions(), true, /*slow=*/true);
}

TEST(GdrDataPath, AllGatherAndBroadcastTwoRanks) {
  runOnDeviceNetwork(2, copies(), false);
}

TEST(GdrDataPath, AllGatherAndBroadcastThreeRanks) {
  runOnDeviceNetwork(3, copies(), false);
}

TEST(GdrDataPath, AllGatherAndBroadcastOnSlowDevices) {
  runOnDeviceNetwork(3, copies(), false, /*slow=*/true);
}

// Reduce (the chain, reductions on the device; off the root the output stays poisoned) and
// alltoall (all-pairs, device copies). Roots are n / 2 (runCall).
std::vector<Call> reduceAndAlltoAll() {
  return {
      {Op::Reduce, ridgeFloat32, ridgeSum, 40001},       {Op::Reduce, ridgeFloat16, ridgeAvg, 1531},
      {Op::Reduce, ridgeInt32, ridgeProd, 9000},         {Op::Reduce, ridgeBfloat16, ridgeMax, 20011},
      {Op::Reduce, ridgeFloat64, ridgeMin, 3001},        {Op::Reduce, ridgeUint8, ridgeSum, 1},
      {Op::Reduce, ridgeFloat32, ridgeSum, 12345, true}, {Op::AlltoAll, ridgeFloat32, ridgeSum, 9001},
      {Op::AlltoAll, ridgeUint8, ridgeSum, 3},           {Op::AlltoAll, ridgeFloat64, ridgeSum, 6007},
      {Op::AlltoAll, ridgeBfloat16, ridgeSum, 1},        {Op::AlltoAll, ridgeInt32, ridgeSum, 7001, true}};
}

TEST(GdrDataPath, ReduceAndAlltoAllTwoRanks) {
  runOnDeviceNetwork(2, reduceAndAlltoAll(), true);
}

TEST(GdrDataPath, ReduceAndAlltoAllThreeRanks) {
  runOnDeviceNetwork(3, reduceAndAlltoAll(), true);
}

// With a long reduce too: the root (rank 1, the slowest device) releases each received slot
// only after its device reduced it; dozens of chunks make a missing settle there overwrite a
// slot every run.
TEST(GdrDataPath, ReduceAndAlltoAllOnSlowDevices) {
  std::vector<Call> calls = reduceAndAlltoAll();
  calls.push_back({Op::Reduce, ridgeFloat32, ridgeSum, 200003});
  runOnDeviceNetwork(3, calls, true, /*slow=*/true);
}

// Random bytes of `rank`'s message.
std::vector<unsigned char> messageOf(int rank, size_t bytes, uint32_t salt = 0) {
  std::vector<unsigned char> v(bytes);
  std::mt19937 gen(0xC0FFEEu + salt + static_cast<uint32_t>(rank));
  for (auto& b : v) b = static_cast<unsigned char>(gen());
  return v;
}

// One collective of a mixed group (runGroups).
struct GroupPart {
  Op op;
  ridgeDataType_t dt;
  ridgeRedOp_t red;
  size_t count;
};

// One group per round on every rank: a send of `bytes` random bytes to the next rank and a
// receive from the previous one (host connectors, chunk by chunk copied by the copy engine:
// runExchanges), and `parts` (voted onto the device network), all on device memory. Exact
// outputs (reference in higher precision, outputs poisoned, off-root reduce output untouched).
// Without collectives nothing is voted on (sends and receives never are) and each group is a
// staged batch; with them every group runs on the device network and nothing is staged.
void runGroups(int n, size_t bytes, const std::vector<GroupPart>& parts, bool slow = false) {
  constexpr int kRounds = 3;
  withGdrRanks(
      n,
      [&](EmulatedRuntime& rt, TestRank& t) {
        SlowDevices slowDevices(rt, t, slow);
        const int r = t.rank, root = n / 2, next = (r + 1) % n, prev = (r + n - 1) % n;
        for (int round = 0; round < kRounds; ++round) {
          std::vector<std::unique_ptr<DevMem>> ins, outs;
          std::vector<std::vector<uint32_t>> keys;
          for (size_t i = 0; i < parts.size(); ++i) {
            const GroupPart& p = parts[i];
            const size_t es = dtSize(p.dt);
            std::vector<uint32_t> k(n);
            for (int j = 0; j < n; ++j) k[j] = rankKey(900u + 10u * uint32_t(round) + uint32_t(i), j);
            std::vector<unsigned char> in(inputElems(p.op, p.count, n) * es);
            fillRankInput(p.op, p.dt, p.red, in.data(), p.count, n, k[r]);
            ins.push_back(std::make_unique<DevMem>(rt, in.size()));
            ins.back()->put(in);
            outs.push_back(std::make_unique<DevMem>(rt, outputElems(p.op, p.count, n) * es));
            outs.back()->put(std::vector<unsigned char>(outs.back()->bytes, kPoison));
            keys.push_back(std::move(k));
          }
          DevMem send(rt, bytes), recv(rt, bytes);
          send.put(messageOf(r, bytes, uint32_t(round)));
          recv.put(std::vector<unsigned char>(bytes, kPoison));
          ASSERT_EQ(ridgeGroupStart(), ridgeSuccess);
          ASSERT_EQ(ridgeSend(send.p, bytes, ridgeUint8, next, t.comm, t.stream), ridgeSuccess)
              << errorText();
          for (size_t i = 0; i < parts.size(); ++i) {
            const GroupPart& p = parts[i];
            ASSERT_EQ(issue(p.op, ins[i]->p, outs[i]->p, p.count, p.dt, p.red, root, t.comm, t.stream),
                      ridgeSuccess)
                << errorText();
          }
          ASSERT_EQ(ridgeRecv(recv.p, bytes, ridgeUint8, prev, t.comm, t.stream), ridgeSuccess)
              << errorText();
          ASSERT_EQ(ridgeGroupEnd(), ridgeSuccess) << errorText();
          expectStreamDone(rt, t);
          if (::testing::Test::HasFatalFailure()) return;
          for (size_t i = 0; i < parts.size(); ++i) {
            const GroupPart& p = parts[i];
            Mismatches mm;
            const std::vector<unsigned char> got = outs[i]->get(0, outs[i]->bytes);
            checkRankOutput(p.op, p.dt, p.red, got.data(), p.count, keys[i], r, root, kPoison, mm);
            EXPECT_EQ(mm.count, 0u) << opText(p.op) << " rank " << r << " round " << round << ": " << mm.text;
          }
          EXPECT_TRUE(recv.get(0, bytes) == messageOf(prev, bytes, uint32_t(round)))
              << "rank " << r << " round " << round;
        }
        if (!parts.empty()) {
          expectPath(t, kRounds, 0);
          return;
        }
        EXPECT_EQ(t.comm->device->netBatches, 0u) << "rank " << r;
        EXPECT_EQ(t.comm->device->netDeclined, 0u) << "rank " << r << ": a send/receive batch was voted on";
        EXPECT_EQ(t.comm->device->stagedBatches, uint64_t(kRounds)) << "rank " << r;
      },
      [&](EmulatedRuntime& rt) {
        expectCleanRuntime(rt, n);
        if (parts.empty())
          EXPECT_EQ(rt.reducesLaunched(), 0u);
        else
          EXPECT_GT(rt.reducesLaunched(), 0u);
      });
}

TEST(GdrDataPath, SendRecvTwoRanks) {
  runGroups(2, 200003, {});
}

TEST(GdrDataPath, SendRecvThreeRanks) {
  runGroups(3, 70001, {});
}

TEST(GdrDataPath, SendRecvOnSlowDevices) {
  runGroups(3, 200003, {}, /*slow=*/true);
}

// A reduce, an alltoall and an allreduce in one group with a send and a receive.
std::vector<GroupPart> mixedCollectives() {
  return {{Op::Reduce, ridgeFloat32, ridgeSum, 20011},
          {Op::AlltoAll, ridgeInt32, ridgeSum, 3001},
          {Op::AllReduce, ridgeBfloat16, ridgeSum, 9001}};
}

TEST(GdrDataPath, MixedGroupWithSendsAndReceivesTwoRanks) {
  runGroups(2, 70001, mixedCollectives());
}

TEST(GdrDataPath, MixedGroupWithSendsAndReceivesThreeRanks) {
  runGroups(3, 70001, mixedCollectives());
}

TEST(GdrDataPath, MixedGroupWithSendsAndReceivesOnSlowDevices) {
  runGroups(3, 70001, mixedCollectives(), /*slow=*/true);
}

// A slow device (every copy and reduction sleeps first on the stream's worker): the proxy
// must not wait for each device operation before queueing the next where nothing depends on
// it (data_ops.h: one settle per step), so each rank's device holds at least two operations
// at once; with a synchronize after each, the peak stays 1. Results still exact.
TEST(GdrDataPath, DeviceWorkIsQueuedAheadOnASlowDevice) {
  constexpr int n = 3;
  withGdrRanks(
      n,
      [&](EmulatedRuntime& rt, TestRank& t) {
        // Every rank's device slow from its own thread: each call covers one device only.
        rt.setWorkDelay(t.rank, std::chrono::microseconds(300));
        rt.resetWorkInFlightPeak(t.rank);
        uint32_t seed = 4242;
        for (const Call& c : {Call{Op::AllReduce, ridgeFloat32, ridgeSum, 30011},
                              Call{Op::Broadcast, ridgeInt32, ridgeSum, 20011},
                              Call{Op::AlltoAll, ridgeFloat64, ridgeSum, 5003}}) {
          runCall(rt, t, c, seed++);
          if (::testing::Test::HasFatalFailure()) return;
        }
        expectPath(t, 3, 0);
        EXPECT_GE(rt.workInFlightPeak(t.rank), 2)
            << "rank " << t.rank << ": the device never held two operations at once";
        rt.setWorkDelay(t.rank, std::chrono::microseconds(0));
      },
      [&](EmulatedRuntime& rt) { expectCleanRuntime(rt, n); });
}

// Host-memory collectives between device ones keep to the host connectors and stay exact
// (random int32 inputs of every rank, reference summed in int64).
TEST(GdrDataPath, HostCollectivesInterleaved) {
  constexpr int n = 3;
  constexpr size_t kCount = 30001;
  auto hostInput = [](int rank, int round) {
    std::vector<int32_t> v(kCount);
    std::mt19937 gen(1000u * static_cast<uint32_t>(round) + static_cast<uint32_t>(rank));
    for (auto& x : v) x = static_cast<int32_t>(gen() % 2000001) - 1000000;
    return v;
  };
  withGdrRanks(
      n,
      [&](EmulatedRuntime& rt, TestRank& t) {
        uint32_t seed = 77;
        for (int round = 0; round < 3; ++round) {
          runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 20000}, seed++);
          if (::testing::Test::HasFatalFailure()) return;
          const std::vector<int32_t> in = hostInput(t.rank, round);
          std::vector<int32_t> out(kCount, -1);
          ASSERT_EQ(ridgeAllReduce(in.data(), out.data(), kCount, ridgeInt32, ridgeSum, t.comm, nullptr),
                    ridgeSuccess)
              << errorText();
          std::vector<int64_t> want(kCount, 0);
          for (int r = 0; r < n; ++r) {
            const std::vector<int32_t> other = hostInput(r, round);
            for (size_t i = 0; i < kCount; ++i) want[i] += other[i];
          }
          size_t wrong = 0;
          for (size_t i = 0; i < kCount; ++i) wrong += out[i] != want[i];
          EXPECT_EQ(wrong, 0u) << "rank " << t.rank << " round " << round;
          runCall(rt, t, {Op::AllGather, ridgeInt32, ridgeSum, 5000}, seed++);
          if (::testing::Test::HasFatalFailure()) return;
        }
        expectPath(t, 6, 0);
      },
      [&](EmulatedRuntime& rt) { expectCleanRuntime(rt, n); });
}

// A rank whose output is managed memory votes no: every rank stages that batch, and the next
// batch (device memory everywhere) is on the device network again, a reduce as well.
TEST(GdrDataPath, ManagedMemoryOnOneRankStagesEveryone) {
  withGdrRanks(
      3,
      [&](EmulatedRuntime& rt, TestRank& t) {
        const Call c{Op::AllReduce, ridgeFloat32, ridgeSum, 10001};
        DevMem managed(rt, c.count * 4, /*managed=*/t.rank == 1);
        runCall(rt, t, c, 5, nullptr, &managed);
        if (::testing::Test::HasFatalFailure()) return;
        runCall(rt, t, c, 6);
        if (::testing::Test::HasFatalFailure()) return;
        runCall(rt, t, {Op::Reduce, ridgeFloat32, ridgeSum, 3001}, 7);
        if (::testing::Test::HasFatalFailure()) return;
        expectPath(t, 2, 1);
      },
      [](EmulatedRuntime&) {});
}

// ridgeCommAbort while the proxy is inside a device-network batch (its data phase, not the
// vote): rank 1 queues two allreduces in a group, rank 0 only one, so after the first rank
// 1 waits in the second for a peer that never comes. The abort must release rank 1's
// stream at once, with the error.
TEST(GdrDataPath, AbortInsideADeviceNetworkBatchReleasesTheStream) {
  GdrEnv env;
  EmulatedRuntime rt(3);
  ScopedRuntimeForTesting scope(&rt);
  const size_t count = 50000;
  std::atomic<bool> rank0Done{false}, rank1Done{false};
  std::atomic<uint64_t> rank1DeviceBatches{0};
  withRanks(
      rt, 2, 2,
      [&](TestRank& t) {
        DevMem a(rt, count * 4), b(rt, count * 4);
        if (t.rank == 0) {
          EXPECT_EQ(ridgeAllReduce(a.p, a.p, count, ridgeFloat32, ridgeSum, t.comm, t.stream), ridgeSuccess)
              << errorText();
          expectStreamDone(rt, t);
          rank0Done.store(true);
          for (const auto t0 = Clock::now();
               !rank1Done.load() && Clock::now() - t0 < std::chrono::seconds(20);)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          EXPECT_EQ(ridgeCommAbort(t.comm), ridgeSuccess) << errorText();
          return;
        }
        ASSERT_EQ(ridgeGroupStart(), ridgeSuccess);
        ASSERT_EQ(ridgeAllReduce(a.p, a.p, count, ridgeFloat32, ridgeSum, t.comm, t.stream), ridgeSuccess);
        ASSERT_EQ(ridgeAllReduce(b.p, b.p, count, ridgeFloat32, ridgeSum, t.comm, t.stream), ridgeSuccess);
        ASSERT_EQ(ridgeGroupEnd(), ridgeSuccess) << errorText();
        for (const auto t0 = Clock::now(); !rank0Done.load() && Clock::now() - t0 < std::chrono::seconds(20);)
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the second allreduce waits now
        expectAbortReleasesTheStream(rt, t);
        rank1DeviceBatches.store(t.comm->device->netBatches);  // read after the proxy stopped
        rank1Done.store(true);
      },
      /*destroy=*/false);
  EXPECT_EQ(rank1DeviceBatches.load(), 1u) << "the batch did not reach the device network's data phase";
}

// An abort while the proxy waits for its device inside a device-network batch: rank 1's device
// takes 500 ms per copy or reduction, and rank 1 raises the abort flag 100 ms after its device
// began a reduction (the proxy has queued the step's reduction and copy and waits in their
// settle; rank 0 stays in the allreduce). The flag is the one ridgeCommAbort raises first, set
// here directly so that the communicator (which ridgeCommAbort frees) can be watched while the
// proxy reacts: the batch must fail with ridgeAborted within 300 ms, while the device still
// works on that step. An executor that did not check for abort while a strand waits for the
// device (review F3) would see it only once the settle is done (>= 900 ms, nothing in
// flight). Then ridgeCommAbort releases the stream, with the batch on the device network.
TEST(GdrDataPath, AbortWhileTheDeviceWorksReleasesTheStream) {
  GdrEnv env;
  EmulatedRuntime rt(3);
  ScopedRuntimeForTesting scope(&rt);
  const size_t count = 60000;
  constexpr int kSlowDevice = 1;  // rank 1's (withRanks: device rank % 2)
  std::atomic<bool> rank1Done{false};
  std::atomic<uint64_t> rank1DeviceBatches{0}, rank1Reductions{0};
  std::atomic<int64_t> inFlightAtAbort{0}, inFlightWhenFailed{-1};
  std::atomic<int> failure{ridgeSuccess};
  std::atomic<double> reactionSeconds{-1};
  withRanks(
      rt, 2, 2,
      [&](TestRank& t) {
        DevMem a(rt, count * 4);
        if (t.rank == 1) rt.setWorkDelay(kSlowDevice, std::chrono::milliseconds(500));
        ASSERT_EQ(ridgeAllReduce(a.p, a.p, count, ridgeFloat32, ridgeSum, t.comm, t.stream), ridgeSuccess)
            << errorText();
        if (t.rank == 0) {
          for (const auto t0 = Clock::now();
               !rank1Done.load() && Clock::now() - t0 < std::chrono::seconds(30);)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          expectAbortReleasesTheStream(rt, t);
          return;
        }
        for (const auto t0 = Clock::now(); Clock::now() - t0 < std::chrono::seconds(20);) {
          if (rt.reducesLaunchedOn(kSlowDevice) > 0 && rt.workInFlight(kSlowDevice) > 0) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        rank1Reductions.store(rt.reducesLaunchedOn(kSlowDevice));
        inFlightAtAbort.store(rt.workInFlight(kSlowDevice));
        const auto abortedAt = Clock::now();
        t.comm->aborted.store(true);
        while (Clock::now() - abortedAt < std::chrono::seconds(10)) {
          const int e = t.comm->asyncError.load();
          if (e != ridgeSuccess) {
            inFlightWhenFailed.store(rt.workInFlight(kSlowDevice));
            reactionSeconds.store(std::chrono::duration<double>(Clock::now() - abortedAt).count());
            failure.store(e);
            break;
          }
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        expectAbortReleasesTheStream(rt, t);
        rank1DeviceBatches.store(t.comm->device->netBatches);  // read after the proxy stopped
        rt.setWorkDelay(kSlowDevice, std::chrono::microseconds(0));
        rank1Done.store(true);
      },
      /*destroy=*/false);
  EXPECT_EQ(rank1DeviceBatches.load(), 1u) << "the batch did not reach the device network's data phase";
  EXPECT_GT(rank1Reductions.load(), 0u) << "rank 1's device had run no reduction at the abort";
  EXPECT_GT(inFlightAtAbort.load(), 0) << "rank 1's device was idle at the abort";
  EXPECT_EQ(failure.load(), ridgeAborted) << "the batch did not fail with ridgeAborted";
  EXPECT_LT(reactionSeconds.load(), ridgetest::scaledSeconds(0.3))
      << "the proxy saw the abort only after its device wait";
  EXPECT_GT(inFlightWhenFailed.load(), 0) << "the batch failed only once the device had finished the step";
}

// Sends and receives are never voted on (review B1): with a device network, a send between
// two of three ranks followed by an allreduce of all three must not pair rank 2's
// allreduce vote with the send; and a group {send big, receive small} on one rank against
// separate calls on the other must not wait chunk by chunk. Exact results, no timeout.
TEST(GdrDataPath, SendsAndReceivesNeverMeetTheVote) {
  constexpr int n = 3;
  const size_t count = 30000, big = 300001, small = 7000;
  withGdrRanks(
      n,
      [&](EmulatedRuntime& rt, TestRank& t) {
        DevMem x(rt, big), y(rt, small), in(rt, count * 4), out(rt, count * 4);
        std::vector<unsigned char> bigPattern(big), smallPattern(small);
        for (size_t i = 0; i < big; ++i) bigPattern[i] = static_cast<unsigned char>(i * 31 + 7);
        for (size_t i = 0; i < small; ++i) smallPattern[i] = static_cast<unsigned char>(i * 17 + 3);
        std::vector<int32_t> mine(count);
        for (size_t i = 0; i < count; ++i)
          mine[i] = static_cast<int32_t>((i * 13 + size_t(t.rank) * 101) % 1999) - 999;
        std::vector<unsigned char> raw(count * 4);
        std::memcpy(raw.data(), mine.data(), raw.size());
        in.put(raw);
        out.put(std::vector<unsigned char>(count * 4, kPoison));
        if (t.rank == 0) {
          x.put(bigPattern);
          y.put(std::vector<unsigned char>(small, kPoison));
          ASSERT_EQ(ridgeGroupStart(), ridgeSuccess);
          ASSERT_EQ(ridgeSend(x.p, big, ridgeUint8, 1, t.comm, t.stream), ridgeSuccess) << errorText();
          ASSERT_EQ(ridgeRecv(y.p, small, ridgeUint8, 1, t.comm, t.stream), ridgeSuccess) << errorText();
          ASSERT_EQ(ridgeGroupEnd(), ridgeSuccess) << errorText();
        } else if (t.rank == 1) {
          x.put(std::vector<unsigned char>(big, kPoison));
          y.put(smallPattern);
          ASSERT_EQ(ridgeRecv(x.p, big, ridgeUint8, 0, t.comm, t.stream), ridgeSuccess) << errorText();
          ASSERT_EQ(ridgeSend(y.p, small, ridgeUint8, 0, t.comm, t.stream), ridgeSuccess) << errorText();
        }
        ASSERT_EQ(ridgeAllReduce(in.p, out.p, count, ridgeInt32, ridgeSum, t.comm, t.stream), ridgeSuccess)
            << errorText();
        expectStreamDone(rt, t);
        if (::testing::Test::HasFatalFailure()) return;
        if (t.rank == 0) EXPECT_TRUE(y.get(0, small) == smallPattern) << "the grouped receive";
        if (t.rank == 1) EXPECT_TRUE(x.get(0, big) == bigPattern) << "the large send";
        const std::vector<unsigned char> got = out.get(0, count * 4);
        size_t bad = 0;
        for (size_t i = 0; i < count; ++i) {
          int64_t want = 0;
          for (int r = 0; r < n; ++r) want += static_cast<int32_t>((i * 13 + size_t(r) * 101) % 1999) - 999;
          int32_t v;
          std::memcpy(&v, got.data() + i * 4, 4);
          bad += v != want;
        }
        EXPECT_EQ(bad, 0u) << "rank " << t.rank;
        EXPECT_EQ(t.comm->device->netBatches, 1u)
            << "rank " << t.rank << ": the allreduce left the device network";
      },
      [&](EmulatedRuntime& rt) { expectCleanRuntime(rt, n); });
}

// No device network: RIDGE_GDR_DATA_PATH=off, or a runtime that cannot export dma-buf. The
// device collectives stage, exactly.
void expectNoDeviceNetwork(const char* dataPath, bool dmaBuf) {
  withGdrRanks(
      2,
      [&](EmulatedRuntime& rt, TestRank& t) {
        runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 4000}, 9);
        EXPECT_EQ(t.comm->device->net, nullptr);
        EXPECT_EQ(t.comm->device->stagedBatches, 1u);
      },
      [](EmulatedRuntime&) {}, dataPath, dmaBuf);
}

TEST(GdrDataPath, OffBuildsNoDeviceNetwork) {
  expectNoDeviceNetwork("off", true);
}

TEST(GdrDataPath, NoDmaBufBuildsNoDeviceNetwork) {
  expectNoDeviceNetwork("auto", false);
}

}  // namespace
