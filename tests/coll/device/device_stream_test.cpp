// Stream-ordered collectives on device memory, proved on the emulated device runtime
// (src/device/emulated_runtime.h): device buffers the host cannot touch (PROT_NONE), and
// in-order streams run by worker threads. Ranks are threads of this process, each with its
// own communicator and stream.
//
// What is checked: every collective on device buffers against a higher-precision host
// reference (random inputs, poisoned outputs); that a call returns before the stream
// reaches it and completes in stream order; groups as one batch; abort and timeouts
// releasing a stuck stream; host collectives unchanged beside device ones; the rejections.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "coll/comm.h"
#include "coll/device/device_collectives.h"
#include "coll/device/gpu_proxy.h"
#include "device/emulated_runtime.h"
#include "ridge/ridge.h"
#include "ridge/ridge_emulated.h"
#include "scoped_env.h"
#include "test_data.h"
#include "time_scale.h"

namespace {

using namespace ridgetest;
using ridge::Status;
using ridge::device::EmulatedRuntime;
using ridge::device::ScopedRuntimeForTesting;

// These tests are about the proxy path (P2P and staged): small collectives would take the LL
// path (src/coll/device/ll_path.h, tested in tests/coll/device/ll_collective_test.cpp), so it is off here
// unless RIDGE_LL is set. Before main, so before any communicator reads it.
[[maybe_unused]] const bool kLLOffForTheseTests = setenv("RIDGE_LL", "off", 0) == 0;
using Clock = std::chrono::steady_clock;

constexpr unsigned char kPoison = 0xA5;

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string lastError() {
  const char* e = ridgeGetLastError(nullptr);
  return e ? e : "";
}

// A device buffer of the emulated runtime, freed on scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer(EmulatedRuntime& rt, size_t bytes, int device = -1, bool managed = false)
      : rt_(rt), bytes_(bytes) {
    Status s = rt.allocDeviceOn(bytes, &p_, device, managed);
    EXPECT_TRUE(s.isOk()) << s.message();
  }
  ~DeviceBuffer() { rt_.freeDevice(p_); }
  void* get() const { return p_; }
  char* bytes() const { return static_cast<char*>(p_); }
  void upload(const std::vector<unsigned char>& host) {
    ASSERT_TRUE(rt_.copyToDevice(p_, host.data(), std::min(host.size(), bytes_)).isOk());
  }
  void poison() { upload(std::vector<unsigned char>(bytes_, kPoison)); }
  // The first `count` elements become a rank's input (tests/coll/test_data.h): of a
  // reducing collective (`ops`) or raw bits of `esz` bytes for the copying ones.
  void fillReduceInput(const TypedOps& ops, size_t count, uint32_t key) {
    std::vector<unsigned char> h(bytes_, kPoison);
    ops.fill(h.data(), count, key, 0);
    upload(h);
  }
  void fillRawInput(size_t esz, size_t count, uint32_t key) {
    std::vector<unsigned char> h(bytes_, kPoison);
    fillRawAny(esz, h.data(), count, key, 0);
    upload(h);
  }
  size_t bytesNotPoison() const {
    size_t n = 0;
    for (unsigned char b : download()) n += b != kPoison;
    return n;
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> h(bytes_);
    EXPECT_TRUE(rt_.copyToHost(h.data(), p_, bytes_).isOk());
    return h;
  }

 private:
  EmulatedRuntime& rt_;
  size_t bytes_;
  void* p_ = nullptr;
};

// A gate: a "kernel" on a stream that blocks the stream until the test opens it (bounded by
// the runtime's wait timeout).
struct Gate {
  std::atomic<bool> open{false};
  Status enqueue(EmulatedRuntime& rt, ridgeStream_t s) {
    return rt.enqueue(s, [this, &rt] {
      const auto deadline = Clock::now() + rt.waitTimeout();
      while (!open.load() && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      return open.load() ? Status::ok() : Status(ridgeTimeout, "test gate never opened");
    });
  }
};

// Runs body(rank, comm, stream) on `n` threads, each with a communicator (timeout
// `timeoutSec`) and an emulated stream; destroys both afterwards unless body returns false
// (it took care of the communicator itself, e.g. aborted it).
using RankBody = std::function<bool(int rank, ridgeComm_t comm, ridgeStream_t stream)>;
void runRanks(EmulatedRuntime& rt, int n, const RankBody& body,
              int timeoutSec = ridgetest::scaledSeconds(30)) {
  ridgeUniqueId id;
  ASSERT_EQ(ridgeGetUniqueId(&id), ridgeSuccess) << lastError();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ridgeConfig_t cfg = RIDGE_CONFIG_INITIALIZER;
      cfg.timeoutSeconds = timeoutSec;
      ridgeComm_t comm = nullptr;
      ridgeResult_t res = ridgeCommInitRankConfig(&comm, n, id, r, &cfg);
      if (res != ridgeSuccess) {
        ADD_FAILURE() << "rank " << r << " init: " << lastError();
        return;
      }
      ridgeStream_t stream = nullptr;
      EXPECT_TRUE(rt.createStream(&stream).isOk());
      if (body(r, comm, stream)) {
        EXPECT_EQ(ridgeCommDestroy(comm), ridgeSuccess) << lastError();
      }
      EXPECT_TRUE(rt.synchronize(stream).isOk());
      rt.destroyStream(stream);
    });
  }
  for (auto& t : threads) t.join();
}

// The stream ran everything queued on it and the communicator has no asynchronous error.
void expectRanClean(EmulatedRuntime& rt, ridgeStream_t stream, ridgeComm_t comm, int rank) {
  Status st = rt.synchronize(stream);
  EXPECT_TRUE(st.isOk()) << st.message();
  ridgeResult_t async = ridgeSuccess;
  EXPECT_EQ(ridgeCommGetAsyncError(comm, &async), ridgeSuccess);
  EXPECT_EQ(async, ridgeSuccess) << "rank " << rank << ": " << lastError();
}

// One rank whose stream is held by a closed gate before `body` runs; the body aborts the
// communicator (so nothing is destroyed afterwards).
using GatedBody = std::function<void(ridgeComm_t comm, ridgeStream_t stream, DeviceBuffer& buf, Gate& gate)>;
void runOneGatedRankThenAbort(EmulatedRuntime& rt, const GatedBody& body) {
  runRanks(
      rt, 1,
      [&](int, ridgeComm_t comm, ridgeStream_t stream) {
        DeviceBuffer buf(rt, 4096);
        Gate gate;
        EXPECT_TRUE(gate.enqueue(rt, stream).isOk());
        body(comm, stream, buf, gate);
        return false;
      },
      60);
}

std::vector<unsigned char> hostBytes(size_t n) {
  return std::vector<unsigned char>(n, kPoison);
}

// Tests with the emulated runtime installed for their duration.
// These tests exercise the proxy, many of them with one rank: the one-rank short-cut (one
// copy on the caller's stream, coll/device/gpu_proxy.h) is off for them, on for the test of it.
class EmulatedDeviceTest : public ::testing::Test {
 protected:
  EmulatedDeviceTest() { ridge::setOneRankDeviceCopyForTesting(false); }
  ~EmulatedDeviceTest() override { ridge::setOneRankDeviceCopyForTesting(true); }
  EmulatedRuntime rt;
  ScopedRuntimeForTesting scope{&rt};
};
class DeviceStreams : public EmulatedDeviceTest {};
class DeviceQueue : public EmulatedDeviceTest {};
class DeviceCollectivesInPlace : public EmulatedDeviceTest {};

// ---- every collective against the reference ---------------------------------------------

enum class Coll { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AlltoAll, SendRecv };
const char* collName(Coll c) {
  static const char* names[] = {"allreduce",     "broadcast", "reduce",  "allgather",
                                "reducescatter", "alltoall",  "sendrecv"};
  return names[static_cast<int>(c)];
}

struct Case {
  Coll coll;
  ridgeDataType_t dt;
  ridgeRedOp_t op;
  size_t count;
  bool managed;
};

// One rank's part of one case: fills its inputs, calls, synchronizes its stream and checks.
void runCaseOnRank(EmulatedRuntime& rt, const Case& c, int rank, int n, ridgeComm_t comm,
                   ridgeStream_t stream, uint32_t seed) {
  const size_t es = dtSize(c.dt);
  const size_t count = c.count;
  const int root = n - 1;
  std::vector<uint32_t> keys(n);
  for (int r = 0; r < n; ++r) keys[r] = rankKey(seed, r);
  const bool blocks = c.coll == Coll::AllGather || c.coll == Coll::ReduceScatter || c.coll == Coll::AlltoAll;
  const size_t sendCount = c.coll == Coll::ReduceScatter || c.coll == Coll::AlltoAll ? count * n : count;
  const size_t recvCount = c.coll == Coll::AllGather || c.coll == Coll::AlltoAll ? count * n : count;
  (void)blocks;
  DeviceBuffer send(rt, sendCount * es, -1, c.managed), recv(rt, recvCount * es, -1, c.managed);
  std::vector<unsigned char> in = hostBytes(sendCount * es);
  const TypedOps& ops = typedOps(c.dt, c.op);
  switch (c.coll) {
    case Coll::AllReduce:
    case Coll::Reduce:
    case Coll::ReduceScatter: ops.fill(in.data(), sendCount, keys[rank], 0); break;
    case Coll::AlltoAll:
      for (int j = 0; j < n; ++j) fillRawAny(es, in.data() + j * count * es, count, keys[rank], j * count);
      break;
    default: fillRawAny(es, in.data(), sendCount, keys[rank], 0); break;
  }
  send.upload(in);
  recv.poison();
  ridgeResult_t res = ridgeSuccess;
  switch (c.coll) {
    case Coll::AllReduce:
      res = ridgeAllReduce(send.get(), recv.get(), count, c.dt, c.op, comm, stream);
      break;
    case Coll::Broadcast:
      res = ridgeBroadcast(send.get(), recv.get(), count, c.dt, root, comm, stream);
      break;
    case Coll::Reduce:
      res = ridgeReduce(send.get(), recv.get(), count, c.dt, c.op, root, comm, stream);
      break;
    case Coll::AllGather: res = ridgeAllGather(send.get(), recv.get(), count, c.dt, comm, stream); break;
    case Coll::ReduceScatter:
      res = ridgeReduceScatter(send.get(), recv.get(), count, c.dt, c.op, comm, stream);
      break;
    case Coll::AlltoAll: res = ridgeAlltoAll(send.get(), recv.get(), count, c.dt, comm, stream); break;
    case Coll::SendRecv:
      ridgeGroupStart();
      ridgeSend(send.get(), count, c.dt, (rank + 1) % n, comm, stream);
      ridgeRecv(recv.get(), count, c.dt, (rank + n - 1) % n, comm, stream);
      res = ridgeGroupEnd();
      break;
  }
  const std::string what = std::string(collName(c.coll)) + " " + dtName(c.dt) + " " + opName(c.op) +
                           " count " + std::to_string(count) + (c.managed ? " managed" : "") + " rank " +
                           std::to_string(rank) + "/" + std::to_string(n);
  ASSERT_EQ(res, ridgeSuccess) << what << ": " << lastError();
  Status s = rt.synchronize(stream);
  ASSERT_TRUE(s.isOk()) << what << ": " << s.message();
  ridgeResult_t async = ridgeSuccess;
  ASSERT_EQ(ridgeCommGetAsyncError(comm, &async), ridgeSuccess);
  ASSERT_EQ(async, ridgeSuccess) << what << ": " << lastError();
  const std::vector<unsigned char> out = recv.download();
  Mismatches mm;
  switch (c.coll) {
    case Coll::AllReduce: ops.checkRed(out.data(), count, keys.data(), n, 0, 0, mm); break;
    case Coll::Reduce:
      if (rank == root)
        ops.checkRed(out.data(), count, keys.data(), n, 0, 0, mm);
      else
        mm.count += recv.bytesNotPoison();  // recvbuff is not written off-root
      break;
    case Coll::ReduceScatter: ops.checkRed(out.data(), count, keys.data(), n, rank * count, 0, mm); break;
    case Coll::Broadcast: checkRawAny(es, out.data(), count, keys[root], 0, 0, mm); break;
    case Coll::AllGather:
      for (int j = 0; j < n; ++j)
        checkRawAny(es, out.data() + j * count * es, count, keys[j], 0, j * count, mm);
      break;
    case Coll::AlltoAll:
      for (int j = 0; j < n; ++j)
        checkRawAny(es, out.data() + j * count * es, count, keys[j], rank * count, j * count, mm);
      break;
    case Coll::SendRecv: checkRawAny(es, out.data(), count, keys[(rank + n - 1) % n], 0, 0, mm); break;
  }
  EXPECT_EQ(mm.count, 0u) << what << ": " << mm.text;
}

// Runs `cases` one after the other on n ranks of `rt` (installed by the caller).
void runCases(EmulatedRuntime& rt, int n, const std::vector<Case>& cases, uint32_t firstSeed) {
  runRanks(rt, n, [&](int rank, ridgeComm_t comm, ridgeStream_t stream) {
    uint32_t seed = firstSeed;
    for (const Case& c : cases) {
      runCaseOnRank(rt, c, rank, n, comm, stream, seed++);
      if (::testing::Test::HasFatalFailure()) break;
    }
    return true;
  });
}

void runMatrix(int n, const std::vector<Case>& cases) {
  EmulatedRuntime rt;
  ScopedRuntimeForTesting scope(&rt);
  runCases(rt, n, cases, 0x1234u + static_cast<uint32_t>(n));
}

std::vector<Case> matrixCases() {
  std::vector<Case> v;
  const Coll colls[] = {Coll::AllReduce,     Coll::Broadcast, Coll::Reduce,  Coll::AllGather,
                        Coll::ReduceScatter, Coll::AlltoAll,  Coll::SendRecv};
  // Types and ops chosen so every element size and every op appears; two sizes: one below a
  // slot, one spanning several chunks with an odd tail.
  const struct {
    ridgeDataType_t dt;
    ridgeRedOp_t op;
  } typed[] = {{ridgeFloat32, ridgeSum}, {ridgeInt32, ridgeProd},  {ridgeFloat16, ridgeAvg},
               {ridgeUint8, ridgeMax},   {ridgeFloat64, ridgeMin}, {ridgeBfloat16, ridgeSum},
               {ridgeInt64, ridgeSum}};
  for (Coll c : colls) {
    for (size_t i = 0; i < sizeof typed / sizeof typed[0]; ++i) {
      const size_t count = i % 2 == 0 ? 1531 : 70001;
      v.push_back({c, typed[i].dt, typed[i].op, count, false});
    }
  }
  v.push_back({Coll::AllReduce, ridgeFloat32, ridgeSum, 4099, /*managed=*/true});
  return v;
}

TEST(DeviceCollectives, EveryCollectiveTwoRanks) {
  runMatrix(2, matrixCases());
}

TEST(DeviceCollectives, EveryCollectiveThreeRanks) {
  runMatrix(3, matrixCases());
}

TEST(DeviceCollectives, AllReduceAndAllGatherFourRanks) {
  runMatrix(4, {{Coll::AllReduce, ridgeFloat32, ridgeSum, 100003, false},
                {Coll::AllGather, ridgeInt8, ridgeSum, 777, false},
                {Coll::ReduceScatter, ridgeBfloat16, ridgeMax, 5000, false}});
}

TEST_F(DeviceCollectivesInPlace, AllReduceAndAllGather) {
  const int n = 2;
  const size_t count = 3001;
  runRanks(rt, n, [&](int rank, ridgeComm_t comm, ridgeStream_t stream) {
    uint32_t keys[n] = {rankKey(77, 0), rankKey(77, 1)};
    const TypedOps& ops = typedOps(ridgeFloat32, ridgeSum);
    DeviceBuffer buf(rt, count * 4 * n);
    std::vector<unsigned char> in = hostBytes(count * 4 * n);
    ops.fill(in.data(), count, keys[rank], 0);
    buf.upload(in);
    EXPECT_EQ(ridgeAllReduce(buf.get(), buf.get(), count, ridgeFloat32, ridgeSum, comm, stream),
              ridgeSuccess);
    EXPECT_TRUE(rt.synchronize(stream).isOk());
    Mismatches mm;
    std::vector<unsigned char> out = buf.download();
    ops.checkRed(out.data(), count, keys, n, 0, 0, mm);
    EXPECT_EQ(mm.count, 0u) << "in-place allreduce: " << mm.text;
    // In-place all-gather: this rank's block already sits at its place in recvbuff.
    fillRawAny(4, in.data() + rank * count * 4, count, keys[rank], 0);
    buf.upload(in);
    EXPECT_EQ(ridgeAllGather(buf.bytes() + rank * count * 4, buf.get(), count, ridgeFloat32, comm, stream),
              ridgeSuccess);
    EXPECT_TRUE(rt.synchronize(stream).isOk());
    out = buf.download();
    Mismatches mg;
    for (int j = 0; j < n; ++j) checkRawAny(4, out.data() + j * count * 4, count, keys[j], 0, j * count, mg);
    EXPECT_EQ(mg.count, 0u) << "in-place allgather: " << mg.text;
    return true;
  });
}

// ---- stream semantics -------------------------------------------------------------------

TEST_F(DeviceStreams, CallReturnsBeforeTheStreamReachesItAndCompletesInOrder) {
  const int n = 2;
  const size_t count = 20000;
  runRanks(rt, n, [&](int rank, ridgeComm_t comm, ridgeStream_t stream) {
    uint32_t keys[n] = {rankKey(5, 0), rankKey(5, 1)};
    const TypedOps& ops = typedOps(ridgeFloat32, ridgeSum);
    DeviceBuffer send(rt, count * 4), recv(rt, count * 4);
    send.fillReduceInput(ops, count, keys[rank]);
    recv.poison();
    Gate gate;
    EXPECT_TRUE(gate.enqueue(rt, stream).isOk());
    const uint64_t waitsBefore = rt.releaseWaitsQueued();
    const auto t0 = Clock::now();
    // Zero elements on device buffers: a stream-ordered no-op, not a wait for the stream.
    EXPECT_EQ(ridgeAllReduce(send.get(), recv.get(), 0, ridgeFloat32, ridgeSum, comm, stream), ridgeSuccess)
        << lastError();
    EXPECT_EQ(ridgeAllReduce(send.get(), recv.get(), count, ridgeFloat32, ridgeSum, comm, stream),
              ridgeSuccess)
        << lastError();
    EXPECT_LT(secondsSince(t0), ridgetest::scaledSeconds(2.0)) << "the call waited for the stream";
    EXPECT_GT(rt.releaseWaitsQueued(), waitsBefore);
    // Work queued after the collective: sees its result.
    std::vector<unsigned char> seenAfter(count * 4, 0);
    EXPECT_TRUE(
        rt.enqueue(stream, [&] { return rt.copyToHost(seenAfter.data(), recv.get(), count * 4); }).isOk());
    // The gate is closed: nothing may have been written yet, however long we look.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(recv.bytesNotPoison(), 0u) << "output written before the stream reached the collective";
    gate.open.store(true);
    Status s = rt.synchronize(stream);
    EXPECT_TRUE(s.isOk()) << s.message();
    Mismatches mm;
    ops.checkRed(seenAfter.data(), count, keys, n, 0, 0, mm);
    EXPECT_EQ(mm.count, 0u) << "work queued after the collective saw: " << mm.text;
    return true;
  });
}

TEST_F(DeviceStreams, GroupRunsAsOneBatchWithOneRelease) {
  const int n = 2;
  const size_t count = 4096;
  runRanks(rt, n, [&](int rank, ridgeComm_t comm, ridgeStream_t stream) {
    uint32_t keys[n] = {rankKey(9, 0), rankKey(9, 1)};
    const TypedOps& ops = typedOps(ridgeInt32, ridgeSum);
    DeviceBuffer a(rt, count * 4), ar(rt, count * 4), p2pIn(rt, count * 4), p2pOut(rt, count * 4),
        bc(rt, count * 4);
    a.fillReduceInput(ops, count, keys[rank]);
    p2pIn.fillRawInput(4, count, keys[rank]);
    bc.fillRawInput(4, count, keys[rank]);
    ar.poison();
    p2pOut.poison();
    Gate gate;  // holds the stream so that the whole group is queued before any of it runs
    EXPECT_TRUE(gate.enqueue(rt, stream).isOk());
    ridgeGroupStart();
    ridgeAllReduce(a.get(), ar.get(), count, ridgeInt32, ridgeSum, comm, stream);
    // Both directions of an exchange: deadlocks unless the group's operations run together.
    ridgeSend(p2pIn.get(), count, ridgeInt32, 1 - rank, comm, stream);
    ridgeRecv(p2pOut.get(), count, ridgeInt32, 1 - rank, comm, stream);
    ridgeBroadcast(bc.get(), bc.get(), count, ridgeInt32, 0, comm, stream);
    EXPECT_EQ(ridgeGroupEnd(), ridgeSuccess) << lastError();
    gate.open.store(true);
    EXPECT_TRUE(rt.synchronize(stream).isOk());
    Mismatches mm;
    std::vector<unsigned char> out = ar.download();
    ops.checkRed(out.data(), count, keys, n, 0, 0, mm);
    out = p2pOut.download();
    checkRawAny(4, out.data(), count, keys[1 - rank], 0, 0, mm);
    out = bc.download();
    checkRawAny(4, out.data(), count, keys[0], 0, 0, mm);
    EXPECT_EQ(mm.count, 0u) << mm.text;
    return true;
  });
  // One batch per rank, one stream: one release wait per rank, not one per operation (4).
  EXPECT_EQ(rt.releaseWaitsQueued(), static_cast<uint64_t>(n));
}

TEST_F(DeviceStreams, GroupOverTwoStreamsWaitsForBothAndReleasesBoth) {
  const int n = 2;
  const size_t count = 3000;
  runRanks(rt, n, [&](int rank, ridgeComm_t comm, ridgeStream_t streamA) {
    ridgeStream_t streamB = nullptr;
    EXPECT_TRUE(rt.createStream(&streamB).isOk());
    uint32_t keys[n] = {rankKey(41, 0), rankKey(41, 1)};
    const TypedOps& ops = typedOps(ridgeFloat32, ridgeMax);
    DeviceBuffer a(rt, count * 4), ar(rt, count * 4), b(rt, count * 4);
    a.fillReduceInput(ops, count, keys[rank]);
    b.fillRawInput(4, count, keys[rank]);
    ar.poison();
    Gate gateB;  // only stream B is held: the batch must wait for it too
    EXPECT_TRUE(gateB.enqueue(rt, streamB).isOk());
    ridgeGroupStart();
    ridgeAllReduce(a.get(), ar.get(), count, ridgeFloat32, ridgeMax, comm, streamA);
    ridgeBroadcast(b.get(), b.get(), count, ridgeFloat32, 1, comm, streamB);
    EXPECT_EQ(ridgeGroupEnd(), ridgeSuccess) << lastError();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(ar.bytesNotPoison(), 0u) << "the batch ran before every stream reached it";
    gateB.open.store(true);
    EXPECT_TRUE(rt.synchronize(streamA).isOk());
    EXPECT_TRUE(rt.synchronize(streamB).isOk());
    Mismatches mm;
    std::vector<unsigned char> out = ar.download();
    ops.checkRed(out.data(), count, keys, n, 0, 0, mm);
    out = b.download();
    checkRawAny(4, out.data(), count, keys[1], 0, 0, mm);
    EXPECT_EQ(mm.count, 0u) << mm.text;
    rt.destroyStream(streamB);
    return true;
  });
  EXPECT_EQ(rt.releaseWaitsQueued(), 2u * n);  // one per stream per rank
}

TEST_F(DeviceStreams, AbortReleasesAStreamStuckOnAPeerThatNeverCalls) {
  const size_t count = 1000;
  std::atomic<bool> rank0Done{false};
  runRanks(
      rt, 2,
      [&](int rank, ridgeComm_t comm, ridgeStream_t stream) {
        if (rank == 1) {  // never calls the collective; leaves once rank 0 is done
          const auto t0 = Clock::now();
          while (!rank0Done.load() && secondsSince(t0) < 20)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          return true;
        }
        DeviceBuffer send(rt, count * 4), recv(rt, count * 4);
        send.poison();
        EXPECT_EQ(ridgeAllReduce(send.get(), recv.get(), count, ridgeFloat32, ridgeSum, comm, stream),
                  ridgeSuccess);
        std::this_thread::sleep_for(
            std::chrono::milliseconds(200));  // the proxy is now stuck in the collective
        const auto t0 = Clock::now();
        EXPECT_EQ(ridgeCommAbort(comm), ridgeSuccess) << lastError();
        Status s = rt.synchronize(stream);
        EXPECT_TRUE(s.isOk()) << s.message();
        EXPECT_LT(secondsSince(t0), ridgetest::scaledSeconds(5.0))
            << "abort did not release the stream promptly";
        rank0Done.store(true);
        return false;  // aborted: nothing to destroy
      },
      /*timeoutSec=*/60);
}

TEST_F(DeviceStreams, AbortReleasesAStreamThatHasNotReachedTheCollective) {
  runOneGatedRankThenAbort(rt, [&](ridgeComm_t comm, ridgeStream_t stream, DeviceBuffer& buf, Gate& gate) {
    EXPECT_EQ(ridgeAllReduce(buf.get(), buf.get(), 1024, ridgeFloat32, ridgeSum, comm, stream), ridgeSuccess);
    const auto t0 = Clock::now();
    EXPECT_EQ(ridgeCommAbort(comm), ridgeSuccess) << lastError();
    EXPECT_LT(secondsSince(t0), ridgetest::scaledSeconds(5.0));
    gate.open.store(true);  // the stream reaches the marker and the (released) wait
    EXPECT_TRUE(rt.synchronize(stream).isOk());
  });
}

TEST_F(DeviceStreams, PeerTimeoutIsAnAsyncErrorAndStillReleasesTheStream) {
  std::atomic<bool> rank0Done{false};
  runRanks(
      rt, 2,
      [&](int rank, ridgeComm_t comm, ridgeStream_t stream) {
        if (rank == 1) {
          const auto t0 = Clock::now();
          while (!rank0Done.load() && secondsSince(t0) < 20)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          return true;
        }
        DeviceBuffer buf(rt, 4096);
        EXPECT_EQ(ridgeAllReduce(buf.get(), buf.get(), 1024, ridgeFloat32, ridgeSum, comm, stream),
                  ridgeSuccess);
        const auto t0 = Clock::now();
        Status s = rt.synchronize(stream);  // released after the 1 s timeout
        EXPECT_TRUE(s.isOk()) << s.message();
        EXPECT_LT(secondsSince(t0), ridgetest::scaledSeconds(8.0));
        ridgeResult_t async = ridgeSuccess;
        EXPECT_EQ(ridgeCommGetAsyncError(comm, &async), ridgeSuccess);
        EXPECT_EQ(async, ridgeTimeout);
        EXPECT_NE(lastError().find("no progress"), std::string::npos) << lastError();
        // The communicator is now unusable, with a clear message.
        EXPECT_EQ(ridgeAllReduce(buf.get(), buf.get(), 1024, ridgeFloat32, ridgeSum, comm, stream),
                  ridgeTimeout);
        EXPECT_NE(lastError().find("unusable"), std::string::npos) << lastError();
        rank0Done.store(true);
        return true;
      },
      /*timeoutSec=*/1);
}

// ---- host memory beside device memory -----------------------------------------------------

TEST_F(DeviceStreams, HostCollectivesUnchangedBesideDeviceOnes) {
  const int n = 2;
  const size_t count = 50000;
  runRanks(rt, n, [&](int rank, ridgeComm_t comm, ridgeStream_t stream) {
    uint32_t keys[n] = {rankKey(21, 0), rankKey(21, 1)};
    const TypedOps& ops = typedOps(ridgeFloat64, ridgeSum);
    DeviceBuffer dsend(rt, count * 8), drecv(rt, count * 8);
    std::vector<unsigned char> in = hostBytes(count * 8), hostOut = hostBytes(count * 8);
    ops.fill(in.data(), count, keys[rank], 0);
    dsend.fillReduceInput(ops, count, keys[rank]);
    drecv.poison();
    // A device call still in flight, then a host call on the same communicator: the host
    // call waits for the proxy, then runs on this thread as it always did.
    EXPECT_EQ(ridgeAllReduce(dsend.get(), drecv.get(), count, ridgeFloat64, ridgeSum, comm, stream),
              ridgeSuccess);
    EXPECT_EQ(ridgeAllReduce(in.data(), hostOut.data(), count, ridgeFloat64, ridgeSum, comm, nullptr),
              ridgeSuccess)
        << lastError();
    Mismatches mm;
    ops.checkRed(hostOut.data(), count, keys, n, 0, 0, mm);
    EXPECT_EQ(mm.count, 0u) << "host allreduce: " << mm.text;
    // Host buffers with a stream: ordered after the stream's work, completed on return.
    std::fill(hostOut.begin(), hostOut.end(), kPoison);
    EXPECT_EQ(ridgeAllReduce(in.data(), hostOut.data(), count, ridgeFloat64, ridgeSum, comm, stream),
              ridgeSuccess)
        << lastError();
    ops.checkRed(hostOut.data(), count, keys, n, 0, 0, mm);
    EXPECT_TRUE(rt.synchronize(stream).isOk());
    std::vector<unsigned char> out = drecv.download();
    ops.checkRed(out.data(), count, keys, n, 0, 0, mm);
    EXPECT_EQ(mm.count, 0u) << mm.text;
    return true;
  });
}

TEST(DeviceStreamsDeathTest, EmulatedDeviceMemoryFaultsOnHostAccess) {
  // What makes the other tests able to fail: had Ridge's core dereferenced a device
  // pointer on the host (rather than staging it through copies), the process would die.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        EmulatedRuntime rt;
        void* p = nullptr;
        if (!rt.allocDevice(4096, &p).isOk()) std::_Exit(0);
        volatile char c = *static_cast<volatile char*>(p);
        (void)c;
        std::_Exit(0);
      },
      "");
}

// ---- rejections -------------------------------------------------------------------------

TEST(DeviceRejections, ClearErrorsForWhatCannotWork) {
  EmulatedRuntime rt(/*devices=*/2);
  ScopedRuntimeForTesting scope(&rt);
  runRanks(rt, 1, [&](int, ridgeComm_t comm, ridgeStream_t stream) {
    int dev = -2;
    EXPECT_EQ(ridgeCommCuDevice(comm, &dev), ridgeSuccess);
    EXPECT_EQ(dev, 0);
    DeviceBuffer d(rt, 4096), other(rt, 4096, /*device=*/1);
    std::vector<float> host(1024);
    // Mixed host and device buffers.
    EXPECT_EQ(ridgeAllReduce(d.get(), host.data(), 1024, ridgeFloat32, ridgeSum, comm, stream),
              ridgeInvalidUsage);
    EXPECT_NE(lastError().find("sendbuff is device memory but recvbuff is host memory"), std::string::npos)
        << lastError();
    // Memory of another device than the communicator's.
    EXPECT_EQ(ridgeAllReduce(other.get(), other.get(), 1024, ridgeFloat32, ridgeSum, comm, stream),
              ridgeInvalidUsage);
    EXPECT_NE(lastError().find("device 1 but the communicator serves device 0"), std::string::npos)
        << lastError();
    // A stream the runtime does not know.
    int notAStream = 0;
    EXPECT_EQ(ridgeAllReduce(d.get(), d.get(), 1024, ridgeFloat32, ridgeSum, comm,
                             reinterpret_cast<ridgeStream_t>(&notAStream)),
              ridgeInvalidArgument);
    EXPECT_NE(lastError().find("not a live stream"), std::string::npos) << lastError();
    // A group mixing host and device memory on one communicator.
    ridgeGroupStart();
    ridgeAllReduce(d.get(), d.get(), 1024, ridgeFloat32, ridgeSum, comm, stream);
    ridgeAllReduce(host.data(), host.data(), 1024, ridgeFloat32, ridgeSum, comm, nullptr);
    EXPECT_EQ(ridgeGroupEnd(), ridgeInvalidUsage);
    EXPECT_NE(lastError().find("mixes host-memory and device-memory"), std::string::npos) << lastError();
    // After all that the communicator still works, on the legacy default stream too (NULL).
    std::vector<unsigned char> ones(4096);
    for (size_t i = 0; i < 1024; ++i) {
      float v = 1.5f;
      std::memcpy(ones.data() + i * 4, &v, 4);
    }
    d.upload(ones);
    EXPECT_EQ(ridgeAllReduce(d.get(), d.get(), 1024, ridgeFloat32, ridgeSum, comm, nullptr), ridgeSuccess)
        << lastError();
    EXPECT_TRUE(rt.synchronize(nullptr).isOk());
    EXPECT_EQ(d.download(), ones);  // one rank: the sum is the input
    return true;
  });
}

// Review M1: a stream being captured into a CUDA graph is refused before anything is queued
// (a captured marker and release wait would never run, so the collective would not either).
TEST_F(DeviceStreams, CapturingStreamIsRefusedAndNothingIsQueued) {
  runRanks(rt, 1, [&](int, ridgeComm_t comm, ridgeStream_t stream) {
    ridgeStream_t other = nullptr;
    EXPECT_TRUE(rt.createStream(&other).isOk());
    const size_t count = 1024;
    DeviceBuffer d(rt, count * 4), e(rt, count * 4);
    d.fillRawInput(4, count, rankKey(91, 0));
    e.poison();
    const std::vector<unsigned char> before = d.download();
    std::vector<float> host(count, 1.0f);
    EXPECT_TRUE(rt.setCapturing(stream, true).isOk());
    const uint64_t waitsBefore = rt.releaseWaitsQueued();
    const std::string refusal = "stream capture (CUDA graphs) is not supported yet";
    // One call.
    EXPECT_EQ(ridgeAllReduce(d.get(), e.get(), count, ridgeFloat32, ridgeSum, comm, stream),
              ridgeInvalidUsage);
    EXPECT_NE(lastError().find(refusal), std::string::npos) << lastError();
    // A group whose other stream is not capturing: none of it is queued.
    ridgeGroupStart();
    ridgeBroadcast(e.get(), e.get(), count, ridgeFloat32, 0, comm, other);
    ridgeAllReduce(d.get(), d.get(), count, ridgeFloat32, ridgeSum, comm, stream);
    EXPECT_EQ(ridgeGroupEnd(), ridgeInvalidUsage);
    EXPECT_NE(lastError().find(refusal), std::string::npos) << lastError();
    // A host-memory call with the stream (it would synchronize a capturing stream).
    EXPECT_EQ(ridgeAllReduce(host.data(), host.data(), count, ridgeFloat32, ridgeSum, comm, stream),
              ridgeInvalidUsage);
    EXPECT_NE(lastError().find(refusal), std::string::npos) << lastError();
    EXPECT_EQ(rt.releaseWaitsQueued(), waitsBefore) << "a refused call queued a release wait";
    EXPECT_TRUE(rt.synchronize(stream).isOk());
    EXPECT_TRUE(rt.synchronize(other).isOk());
    EXPECT_EQ(e.bytesNotPoison(), 0u) << "a refused call wrote its output";
    // Capture over: the same call runs (one rank: the sum is the input).
    EXPECT_TRUE(rt.setCapturing(stream, false).isOk());
    EXPECT_EQ(ridgeAllReduce(d.get(), e.get(), count, ridgeFloat32, ridgeSum, comm, stream), ridgeSuccess)
        << lastError();
    EXPECT_TRUE(rt.synchronize(stream).isOk());
    EXPECT_EQ(e.download(), before);
    EXPECT_GT(rt.releaseWaitsQueued(), waitsBefore);
    rt.destroyStream(other);
    return true;
  });
}

// Regression (review H2): a non-blocking init connects on a thread of its own, whose current
// device is the default (0); the communicator must still serve the caller's device.
TEST(DeviceInit, NonBlockingInitServesTheCallersDevice) {
  EmulatedRuntime rt(/*devices=*/2);
  ScopedRuntimeForTesting scope(&rt);
  ridgeUniqueId id;
  ASSERT_EQ(ridgeGetUniqueId(&id), ridgeSuccess) << lastError();
  std::thread caller([&] {
    ASSERT_TRUE(rt.bindThread(1).isOk());
    ridgeConfig_t cfg = RIDGE_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ridgeComm_t comm = nullptr;
    ASSERT_EQ(ridgeCommInitRankConfig(&comm, 1, id, 0, &cfg), ridgeInProgress) << lastError();
    ridgeResult_t async = ridgeInProgress;
    const auto t0 = Clock::now();
    while (async == ridgeInProgress && secondsSince(t0) < 30) {
      ASSERT_EQ(ridgeCommGetAsyncError(comm, &async), ridgeSuccess);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_EQ(async, ridgeSuccess) << lastError();
    int dev = -2;
    EXPECT_EQ(ridgeCommCuDevice(comm, &dev), ridgeSuccess);
    EXPECT_EQ(dev, 1);
    ridgeStream_t stream = nullptr;
    ASSERT_TRUE(rt.createStream(&stream).isOk());
    {
      const size_t count = 3001;
      const uint32_t key = rankKey(77, 0);
      const TypedOps& ops = typedOps(ridgeFloat32, ridgeSum);
      DeviceBuffer send(rt, count * 4), recv(rt, count * 4);  // on device 1, the current one
      ASSERT_EQ(rt.classify(send.get()).device, 1);
      send.fillReduceInput(ops, count, key);
      recv.poison();
      EXPECT_EQ(ridgeAllReduce(send.get(), recv.get(), count, ridgeFloat32, ridgeSum, comm, stream),
                ridgeSuccess)
          << lastError();
      Status s = rt.synchronize(stream);
      EXPECT_TRUE(s.isOk()) << s.message();
      Mismatches mm;
      std::vector<unsigned char> out = recv.download();
      ops.checkRed(out.data(), count, &key, 1, 0, 0, mm);
      EXPECT_EQ(mm.count, 0u) << mm.text;
    }
    EXPECT_EQ(ridgeCommDestroy(comm), ridgeSuccess) << lastError();
    rt.destroyStream(stream);
  });
  caller.join();
}

}  // namespace

namespace {

TEST_F(DeviceQueue, FullRingWaitsAndAbortUnblocksTheCaller) {
  // The gate keeps the proxy waiting on the first marker, so nothing leaves the ring.
  runOneGatedRankThenAbort(rt, [&](ridgeComm_t comm, ridgeStream_t stream, DeviceBuffer& buf, Gate& gate) {
    int accepted = 0;
    for (; accepted < 256; ++accepted)
      if (ridgeAllReduce(buf.get(), buf.get(), 16, ridgeFloat32, ridgeSum, comm, stream) != ridgeSuccess)
        break;
    EXPECT_EQ(accepted, 256) << lastError();
    // The ring is full: the next call waits, until ridgeCommAbort from another thread.
    std::atomic<ridgeResult_t> blocked{ridgeInProgress};
    std::thread caller(
        [&] { blocked = ridgeAllReduce(buf.get(), buf.get(), 16, ridgeFloat32, ridgeSum, comm, stream); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(blocked.load(), ridgeInProgress) << "a call into a full ring did not wait";
    EXPECT_EQ(ridgeCommAbort(comm), ridgeSuccess) << lastError();
    caller.join();
    EXPECT_EQ(blocked.load(), ridgeAborted);
    gate.open.store(true);
    EXPECT_TRUE(rt.synchronize(stream).isOk());  // every queued wait was released
  });
}

TEST_F(DeviceQueue, GroupLargerThanTheRingIsRefused) {
  runRanks(rt, 1, [&](int, ridgeComm_t comm, ridgeStream_t stream) {
    DeviceBuffer buf(rt, 4096);
    ridgeGroupStart();
    for (int i = 0; i < 257; ++i)
      ridgeAllReduce(buf.get(), buf.get(), 16, ridgeFloat32, ridgeSum, comm, stream);
    EXPECT_EQ(ridgeGroupEnd(), ridgeInvalidUsage);
    EXPECT_NE(lastError().find("at most 256"), std::string::npos) << lastError();
    return true;
  });
}

TEST(EmulatedRuntime, ReleaseWaitIsBoundedAndReported) {
  EmulatedRuntime rt;
  rt.setWaitTimeout(std::chrono::milliseconds(100));
  ridgeStream_t s = nullptr;
  ASSERT_TRUE(rt.createStream(&s).isOk());
  ridge::device::ReleaseWord w;
  ASSERT_TRUE(rt.takeReleaseWord(&w).isOk());
  const uint32_t v = *w.host;
  ASSERT_TRUE(rt.waitWord(s, w, v + 1).isOk());
  const auto t0 = Clock::now();
  Status st = rt.synchronize(s);
  EXPECT_EQ(st.code(), ridgeTimeout) << st.message();
  EXPECT_LT(secondsSince(t0), ridgetest::scaledSeconds(2.0));
  // Reached (cyclically: a word past 2^32 wraps) waits pass at once.
  *w.host = v + 1;
  ASSERT_TRUE(rt.waitWord(s, w, v + 1).isOk());
  EXPECT_TRUE(rt.synchronize(s).isOk());
  EXPECT_TRUE(ridge::device::sequenceReached(5u, 0xfffffff0u));
  EXPECT_FALSE(ridge::device::sequenceReached(0xfffffff0u, 5u));
  rt.returnReleaseWord(w);
  rt.destroyStream(s);
}

TEST(EmulatedRuntime, IpcOpensTheSameMemory) {
  EmulatedRuntime rt;
  DeviceBuffer a(rt, 8192);
  std::vector<unsigned char> in(8192);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 31 + 7);
  a.upload(in);
  ridge::device::DeviceRuntime::IpcHandle h;
  ASSERT_TRUE(rt.ipcExport(a.get(), &h).isOk());
  void* view = nullptr;
  ASSERT_TRUE(rt.ipcOpen(h, &view).isOk());
  EXPECT_NE(view, a.get());
  EXPECT_EQ(rt.classify(view).kind, ridge::device::PointerKind::Device);
  std::vector<unsigned char> out(8192);
  ASSERT_TRUE(rt.copyToHost(out.data(), view, out.size()).isOk());
  EXPECT_EQ(out, in);
  EXPECT_TRUE(rt.ipcClose(view).isOk());
  EXPECT_FALSE(rt.ipcClose(view).isOk());                 // closed once only
  EXPECT_FALSE(rt.ipcExport(a.bytes() + 64, &h).isOk());  // not an allocation's base
}

// allocationId names the allocation (any address inside it, and the views ipcOpen gives of
// it), and an allocation made at a freed one's address (reallocateInPlace) gets a new id,
// new memory, and a handle that opens the new memory while the old one's handle fails.
TEST(EmulatedRuntime, AllocationIdsNameAllocationsNotAddresses) {
  EmulatedRuntime rt;
  DeviceBuffer a(rt, 8192), b(rt, 4096);
  uint64_t idA = 0, idInside = 0, idB = 0;
  ASSERT_TRUE(rt.allocationId(a.get(), &idA).isOk());
  ASSERT_TRUE(rt.allocationId(a.bytes() + 5000, &idInside).isOk());
  ASSERT_TRUE(rt.allocationId(b.get(), &idB).isOk());
  EXPECT_NE(idA, 0u);
  EXPECT_EQ(idInside, idA);
  EXPECT_NE(idB, idA);
  int host = 0;
  uint64_t id = 0;
  EXPECT_FALSE(rt.allocationId(&host, &id).isOk());  // host memory has none

  ridge::device::DeviceRuntime::IpcHandle oldHandle, newHandle;
  ASSERT_TRUE(rt.ipcExport(a.get(), &oldHandle).isOk());
  void* view = nullptr;
  ASSERT_TRUE(rt.ipcOpen(oldHandle, &view).isOk());
  ASSERT_TRUE(rt.allocationId(view, &id).isOk());
  EXPECT_EQ(id, idA);
  EXPECT_FALSE(rt.reallocateInPlace(view).isOk()) << "a view is not an allocation of this process";
  EXPECT_TRUE(rt.ipcClose(view).isOk());

  std::vector<unsigned char> in(8192, 0x5a);
  a.upload(in);
  ASSERT_TRUE(rt.reallocateInPlace(a.get()).isOk());
  ASSERT_TRUE(rt.allocationId(a.get(), &id).isOk());
  EXPECT_NE(id, idA);
  EXPECT_NE(id, idB);
  std::vector<unsigned char> out(8192, 1);
  ASSERT_TRUE(rt.copyToHost(out.data(), a.get(), out.size()).isOk());
  EXPECT_EQ(out, std::vector<unsigned char>(8192, 0)) << "the new allocation kept the old memory";
  EXPECT_FALSE(rt.ipcOpen(oldHandle, &view).isOk()) << "the freed allocation's handle opened its successor";
  ASSERT_TRUE(rt.ipcExport(a.get(), &newHandle).isOk());
  EXPECT_NE(std::memcmp(oldHandle.bytes, newHandle.bytes, sizeof oldHandle.bytes), 0);
  EXPECT_EQ(rt.ipcExports(), 2u);

  rt.setAllocationIdsSupported(false);
  EXPECT_FALSE(rt.allocationId(a.get(), &id).isOk());
}

TEST(EmulatedRuntime, DeviceReduceKernelMatchesTheReference) {
  EmulatedRuntime rt;
  const size_t count = 10007;
  const int n = 3;
  uint32_t keys[n] = {rankKey(3, 0), rankKey(3, 1), rankKey(3, 2)};
  const TypedOps& ops = typedOps(ridgeFloat16, ridgeSum);
  std::vector<std::unique_ptr<DeviceBuffer>> src;
  const void* srcs[n];
  for (int r = 0; r < n; ++r) {
    src.push_back(std::make_unique<DeviceBuffer>(rt, count * 2));
    std::vector<unsigned char> in(count * 2);
    ops.fill(in.data(), count, keys[r], 0);
    src.back()->upload(in);
    srcs[r] = src.back()->get();
  }
  DeviceBuffer dst(rt, count * 2);
  dst.poison();
  ridgeStream_t s = nullptr;
  ASSERT_TRUE(rt.createStream(&s).isOk());
  ASSERT_TRUE(rt.launchReduce(dst.get(), srcs, n, count, ridgeFloat16, ridgeSum, 1, s).isOk());
  ASSERT_TRUE(rt.synchronize(s).isOk());
  rt.destroyStream(s);
  Mismatches mm;
  std::vector<unsigned char> out = dst.download();
  ops.checkRed(out.data(), count, keys, n, 0, 0, mm);
  EXPECT_EQ(mm.count, 0u) << mm.text;
}

// A communicator keeps the RIDGE_DEVICE of its init: its operations classify their buffers
// with that runtime and never read the environment again (issue 21: the lookup was a fixed
// cost of every operation). Made under RIDGE_DEVICE=emulated, a call after the variable was
// removed still finds its emulated device buffers and runs on the stream; reading the
// setting per call took them for host memory and refused the stream (or touched device
// memory from the host).
TEST(DeviceSetting, ReadOnceWhenTheCommunicatorIsMade) {
  constexpr size_t count = 16;
  ridgeComm_t comm = nullptr;
  void* in = nullptr;
  void* out = nullptr;
  ridgeStream_t stream = nullptr;
  std::vector<float> host(count), back(count, -1.0f);
  for (size_t i = 0; i < count; ++i) host[i] = 0.5f + static_cast<float>(i);
  {
    ridgetest::ScopedEnv emulated("RIDGE_DEVICE", "emulated");
    ridgeUniqueId id;
    ASSERT_EQ(ridgeGetUniqueId(&id), ridgeSuccess) << lastError();
    ASSERT_EQ(ridgeEmulatedSetDevice(0), ridgeSuccess) << lastError();
    ASSERT_EQ(ridgeCommInitRank(&comm, 1, id, 0), ridgeSuccess) << lastError();
    ASSERT_EQ(ridgeMemAlloc(&in, count * sizeof(float)), ridgeSuccess) << lastError();
    ASSERT_EQ(ridgeMemAlloc(&out, count * sizeof(float)), ridgeSuccess) << lastError();
    ASSERT_EQ(ridgeEmulatedMemcpy(in, host.data(), count * sizeof(float)), ridgeSuccess) << lastError();
    ASSERT_EQ(ridgeEmulatedMemcpy(out, back.data(), count * sizeof(float)), ridgeSuccess) << lastError();
    ASSERT_EQ(ridgeEmulatedStreamCreate(&stream), ridgeSuccess) << lastError();
  }
  ASSERT_EQ(std::getenv("RIDGE_DEVICE"), nullptr);
  EXPECT_EQ(ridgeAllReduce(in, out, count, ridgeFloat32, ridgeSum, comm, stream), ridgeSuccess) << lastError();
  ridgetest::ScopedEnv emulated("RIDGE_DEVICE", "emulated");  // the emulated API checks it per call
  EXPECT_EQ(ridgeEmulatedStreamSynchronize(stream), ridgeSuccess) << lastError();
  EXPECT_EQ(ridgeEmulatedMemcpy(back.data(), out, count * sizeof(float)), ridgeSuccess) << lastError();
  EXPECT_EQ(back, host);
  EXPECT_EQ(ridgeCommDestroy(comm), ridgeSuccess) << lastError();
  EXPECT_EQ(ridgeEmulatedStreamDestroy(stream), ridgeSuccess) << lastError();
  EXPECT_EQ(ridgeMemFree(in), ridgeSuccess) << lastError();
  EXPECT_EQ(ridgeMemFree(out), ridgeSuccess) << lastError();
}

#ifndef RIDGE_HAVE_CUDA
TEST(HostOnlyBuild, StreamIsRefusedWithoutARuntime) {
  // No runtime installed in a build without CUDA: as before, a stream is an error.
  ridgeUniqueId id;
  ASSERT_EQ(ridgeGetUniqueId(&id), ridgeSuccess);
  ridgeComm_t comm = nullptr;
  ASSERT_EQ(ridgeCommInitRank(&comm, 1, id, 0), ridgeSuccess) << lastError();
  std::vector<float> v(16, 1.0f);
  int fake = 0;
  EXPECT_EQ(ridgeAllReduce(v.data(), v.data(), 16, ridgeFloat32, ridgeSum, comm,
                           reinterpret_cast<ridgeStream_t>(&fake)),
            ridgeInvalidArgument);
  EXPECT_NE(lastError().find("stream must be NULL in a build without CUDA"), std::string::npos)
      << lastError();
  int dev = 0;
  EXPECT_EQ(ridgeCommCuDevice(comm, &dev), ridgeSuccess);
  EXPECT_EQ(dev, -1);
  EXPECT_EQ(ridgeCommDestroy(comm), ridgeSuccess);
}
#endif

}  // namespace

#ifdef RIDGE_HAVE_CUDA
namespace {
TEST(CudaBuild, NoDeviceMeansHostMemoryAndNoCrash) {
  // The CUDA runtime is the active one unless a test installs another. On a machine
  // without a GPU (or driver) it reports no device, every pointer is host memory, and host
  // collectives run as in a build without CUDA.
  ridge::device::DeviceRuntime* rt = ridge::device::activeRuntime();
  ASSERT_NE(rt, nullptr);
  EXPECT_STREQ(rt->name(), "cuda");
  if (rt->deviceCount() > 0) GTEST_SKIP() << "a CUDA device is present: tests/gpu covers it";
  std::vector<float> v(1024, 2.0f);
  EXPECT_EQ(rt->classify(v.data()).kind, ridge::device::PointerKind::Host);
  EXPECT_EQ(rt->currentDevice(), -1);
  ridgeUniqueId id;
  ASSERT_EQ(ridgeGetUniqueId(&id), ridgeSuccess);
  ridgeComm_t comm = nullptr;
  ASSERT_EQ(ridgeCommInitRank(&comm, 1, id, 0), ridgeSuccess) << lastError();
  int dev = 0;
  EXPECT_EQ(ridgeCommCuDevice(comm, &dev), ridgeSuccess);
  EXPECT_EQ(dev, -1);
  EXPECT_EQ(ridgeAllReduce(v.data(), v.data(), v.size(), ridgeFloat32, ridgeSum, comm, nullptr),
            ridgeSuccess);
  EXPECT_EQ(v[1023], 2.0f);
  EXPECT_EQ(ridgeCommDestroy(comm), ridgeSuccess);
}
}  // namespace
#endif

namespace {
TEST_F(DeviceStreams, FinalizeCompletesQueuedDeviceOperations) {
  const int n = 2;
  const size_t count = 30000;
  runRanks(rt, n, [&](int rank, ridgeComm_t comm, ridgeStream_t stream) {
    uint32_t keys[n] = {rankKey(61, 0), rankKey(61, 1)};
    const TypedOps& ops = typedOps(ridgeInt64, ridgeMin);
    DeviceBuffer send(rt, count * 8), recv(rt, count * 8);
    send.fillReduceInput(ops, count, keys[rank]);
    recv.poison();
    Gate gate;  // opened shortly after finalize started waiting
    EXPECT_TRUE(gate.enqueue(rt, stream).isOk());
    EXPECT_EQ(ridgeAllReduce(send.get(), recv.get(), count, ridgeInt64, ridgeMin, comm, stream),
              ridgeSuccess);
    std::thread opener([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      gate.open.store(true);
    });
    EXPECT_EQ(ridgeCommFinalize(comm), ridgeSuccess) << lastError();
    opener.join();
    EXPECT_TRUE(rt.synchronize(stream).isOk());
    Mismatches mm;
    std::vector<unsigned char> out = recv.download();
    ops.checkRed(out.data(), count, keys, n, 0, 0, mm);
    EXPECT_EQ(mm.count, 0u) << "after finalize: " << mm.text;
    return true;  // destroyed after finalize
  });
}
}  // namespace

// ---- no implicitly synchronizing runtime call while a stream is parked (review H1) -------

namespace {
// Allreduces of growing sizes queued back to back on one rank's stream (so earlier calls'
// release waits are still pending when a later call needs more than the staging holds),
// checked against the reference; the sizes pass the staging bound, so they run in chunks.
void runGrowingAllReduces(EmulatedRuntime& rt, ridgeComm_t comm, ridgeStream_t stream) {
  const TypedOps& ops = typedOps(ridgeFloat32, ridgeSum);
  const size_t counts[] = {1000, 70001, 600000, 1500000, 3000000};
  std::vector<std::unique_ptr<DeviceBuffer>> sends, recvs;
  for (size_t i = 0; i < std::size(counts); ++i) {
    sends.push_back(std::make_unique<DeviceBuffer>(rt, counts[i] * 4));
    recvs.push_back(std::make_unique<DeviceBuffer>(rt, counts[i] * 4));
    sends.back()->fillReduceInput(ops, counts[i], rankKey(71 + static_cast<uint32_t>(i), 0));
    recvs.back()->poison();
  }
  for (size_t i = 0; i < std::size(counts); ++i)
    ASSERT_EQ(
        ridgeAllReduce(sends[i]->get(), recvs[i]->get(), counts[i], ridgeFloat32, ridgeSum, comm, stream),
        ridgeSuccess)
        << lastError();
  Status s = rt.synchronize(stream);
  ASSERT_TRUE(s.isOk()) << s.message();
  for (size_t i = 0; i < std::size(counts); ++i) {
    const uint32_t key = rankKey(71 + static_cast<uint32_t>(i), 0);
    Mismatches mm;
    ops.checkRed(recvs[i]->download().data(), counts[i], &key, 1, 0, 0, mm);
    EXPECT_EQ(mm.count, 0u) << "count " << counts[i] << ": " << mm.text;
  }
}
}  // namespace

// One rank, so every release wait on the (only) emulated device is this communicator's: the
// staging buffer is allocated once by the proxy's setup, before any wait is queued, and the
// growing batches run in chunks through it instead of growing it while one is parked.
TEST_F(DeviceStreams, StagingIsNeverAllocatedWhileAStreamWaits) {
  runRanks(rt, 1, [&](int, ridgeComm_t comm, ridgeStream_t stream) {
    runGrowingAllReduces(rt, comm, stream);
    return true;
  });
  EXPECT_GT(rt.releaseWaitsQueued(), 0u);
  EXPECT_EQ(rt.allocationsWhileStreamsWait(), 0u);
  EXPECT_EQ(rt.kernelPreloads(), 1u) << "the proxy's setup did not preload the device's kernels";
}

// The proxy blocked inside a runtime call that waits for the parked stream (as a CUDA call
// that synchronizes the device implicitly would): abort must release the stream first, or
// the join never returns (here: not before the emulator's wait timeout).
TEST_F(DeviceStreams, AbortReleasesTheStreamWhileTheProxyIsStuckInARuntimeCall) {
  rt.setWaitTimeout(std::chrono::seconds(10));
  rt.setCopiesWaitForReleases(true);
  runRanks(
      rt, 1,
      [&](int, ridgeComm_t comm, ridgeStream_t stream) {
        DeviceBuffer buf(rt, 4096);
        buf.poison();
        EXPECT_EQ(ridgeAllReduce(buf.get(), buf.get(), 1024, ridgeFloat32, ridgeSum, comm, stream),
                  ridgeSuccess)
            << lastError();
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the proxy is in copy() now
        const auto t0 = Clock::now();
        EXPECT_EQ(ridgeCommAbort(comm), ridgeSuccess) << lastError();
        EXPECT_LT(secondsSince(t0), ridgetest::scaledSeconds(5.0))
            << "abort waited for the stuck proxy before releasing";
        Status s = rt.synchronize(stream);
        EXPECT_TRUE(s.isOk()) << s.message();  // released, not timed out
        EXPECT_LT(secondsSince(t0), ridgetest::scaledSeconds(5.0));
        return false;  // aborted
      },
      60);
  rt.setCopiesWaitForReleases(false);
}

// ---- finalize that gives up on queued batches (review M2) ----------------------------------

namespace {
// On one rank's stream: gate `first`, `early` (its calls), gate `second`, `late` (its calls);
// then stops the proxy as finalize does (finishGpuProxy, what ridgeCommFinalize runs first:
// its status is finalize's to report) while another thread opens `first` after
// `firstOpensMs` and `second` `secondOpensMs` later (both times RIDGE_TEST_TIME_SCALE, as the
// communicator's timeout they are placed around). Returns the stop's status.
Status finishWhileGatesOpen(EmulatedRuntime& rt, ridgeComm_t comm, ridgeStream_t stream,
                            const std::function<void()>& early, const std::function<void()>& late,
                            int firstOpensMs, int secondOpensMs) {
  Gate first, second;
  EXPECT_TRUE(first.enqueue(rt, stream).isOk());
  early();
  EXPECT_TRUE(second.enqueue(rt, stream).isOk());
  late();
  std::thread opener([&] {
    std::this_thread::sleep_for(ridgetest::scaled(std::chrono::milliseconds(firstOpensMs)));
    first.open.store(true);
    std::this_thread::sleep_for(ridgetest::scaled(std::chrono::milliseconds(secondOpensMs)));
    second.open.store(true);
  });
  Status stopped = ridge::finishGpuProxy(comm);
  opener.join();
  EXPECT_TRUE(rt.synchronize(stream).isOk());
  return stopped;
}

ridgeResult_t asyncErrorOf(ridgeComm_t comm) {
  ridgeResult_t async = ridgeInProgress;
  EXPECT_EQ(ridgeCommGetAsyncError(comm, &async), ridgeSuccess);
  return async;
}
}  // namespace

// One rank, timeout 3 s: an allreduce behind gate `first`, then behind gate `second` an
// allreduce b and, with `thirdBatch`, an allreduce c; stopped as finalize does while the
// gates open (finishWhileGatesOpen). b is taken by the proxy before the drain gives up (at
// 3 s) and must complete; c, reached after shutdown began, must be dropped, reported by the
// stop, as the asynchronous error and its text, and leave its output unwritten.
namespace {
void runFinishWhileGated(EmulatedRuntime& rt, int firstOpensMs, int secondOpensMs, bool thirdBatch) {
  runRanks(
      rt, 1,
      [&](int, ridgeComm_t comm, ridgeStream_t stream) {
        const TypedOps& ops = typedOps(ridgeFloat32, ridgeSum);
        const uint32_t key = rankKey(83, 0);
        DeviceBuffer a(rt, 4096), bIn(rt, 4096), b(rt, 4096), cIn(rt, 4096), c(rt, 4096);
        a.poison();
        bIn.fillReduceInput(ops, 1024, key);
        cIn.fillReduceInput(ops, 1024, key);
        b.poison();
        c.poison();
        auto allReduce = [&](const DeviceBuffer& in, const DeviceBuffer& out) {
          EXPECT_EQ(ridgeAllReduce(in.get(), out.get(), 1024, ridgeFloat32, ridgeSum, comm, stream),
                    ridgeSuccess);
        };
        const Status stopped = finishWhileGatesOpen(
            rt, comm, stream, [&] { allReduce(a, a); },
            [&] {
              allReduce(bIn, b);
              if (thirdBatch) allReduce(cIn, c);
            },
            firstOpensMs, secondOpensMs);
        if (thirdBatch) {
          EXPECT_EQ(stopped.code(), ridgeTimeout) << stopped.message();
          EXPECT_EQ(asyncErrorOf(comm), ridgeTimeout);
          EXPECT_NE(lastError().find("shut down before a queued device collective ran"), std::string::npos)
              << lastError();
          EXPECT_EQ(c.bytesNotPoison(), 0u) << "the dropped batch wrote its output";
        } else {
          EXPECT_TRUE(stopped.isOk()) << "nothing was dropped: " << stopped.message();
          EXPECT_EQ(asyncErrorOf(comm), ridgeSuccess) << lastError();
        }
        Mismatches mm;
        ops.checkRed(b.download().data(), 1024, &key, 1, 0, 0, mm);
        EXPECT_EQ(mm.count, 0u) << "the batch running when finalize gave up: " << mm.text;
        return true;
      },
      /*timeoutSec=*/ridgetest::scaledSeconds(3));
}
}  // namespace

// `first` opens at 2 s (before the proxy's own 3 s wait for it ends, so b's wait starts
// then), `second` at 4 s: inside b's wait, after the drain gave up.
TEST_F(DeviceStreams, FinalizeThatDropsAQueuedBatchReportsIt) {
  runFinishWhileGated(rt, 2000, 2000, /*thirdBatch=*/true);
}

// The drain gives up while the proxy waits for b, but b was taken before shutdown and runs
// once `second` opens (3.75 s): nothing was dropped, so stopping reports success.
TEST_F(DeviceStreams, FinalizeWhoseDrainGaveUpButNothingWasDroppedSucceeds) {
  runFinishWhileGated(rt, 1500, 2250, /*thirdBatch=*/false);
}

// ---- bounded, chunked, pipelined staging (RIDGE_STAGING_BYTES) ----------------------------

namespace {

// The smallest bound: pieces of 32 KiB, so that modest counts take many chunks.
constexpr const char* kSmallStaging = "64K";
constexpr size_t kSmallStagingBytes = size_t(64) << 10;

// Runs `cases` on n ranks through the staged path (P2P off) with RIDGE_STAGING_BYTES=bound,
// and checks that no pinned allocation passed the bound and that the ranks together never
// held more than n bounds.
void runStagedMatrix(int n, const std::vector<Case>& cases, const char* bound, size_t boundBytes) {
  ScopedEnv p2p("RIDGE_P2P", "off"), staging("RIDGE_STAGING_BYTES", bound);
  EmulatedRuntime rt;
  ScopedRuntimeForTesting scope(&rt);
  runCases(rt, n, cases, 0x5151u + static_cast<uint32_t>(n));
  EXPECT_GT(rt.largestPinnedAllocation(), 0u) << "nothing was staged";
  EXPECT_LE(rt.largestPinnedAllocation(), boundBytes);
  EXPECT_LE(rt.pinnedBytesPeak(), size_t(n) * boundBytes);
  EXPECT_EQ(rt.pinnedBytesNow(), 0u) << "staging left allocated after destroy";
}

// Counts chosen against 32 KiB pieces: every collective takes several chunks with a short
// last one (the chunk is (32K - 8K) / (blocks x element size) elements).
std::vector<Case> chunkedCases() {
  return {{Coll::AllReduce, ridgeFloat32, ridgeSum, 20011, false},
          {Coll::AllReduce, ridgeFloat16, ridgeAvg, 33333, false},
          {Coll::Reduce, ridgeInt64, ridgeMin, 9001, false},
          {Coll::Broadcast, ridgeUint8, ridgeSum, 100003, false},
          {Coll::AllGather, ridgeFloat64, ridgeSum, 5003, false},
          {Coll::ReduceScatter, ridgeBfloat16, ridgeMax, 17001, false},
          {Coll::ReduceScatter, ridgeInt32, ridgeProd, 7777, false},
          {Coll::AlltoAll, ridgeInt32, ridgeSum, 6007, false},
          {Coll::SendRecv, ridgeFloat64, ridgeSum, 12345, false},
          {Coll::AllReduce, ridgeFloat32, ridgeMax, 15000, /*managed=*/true}};
}

// One rank on device memory: each collective is one device-to-device copy of the output's
// bytes on the caller's stream, and nothing when in place; never the proxy (no proxy thread,
// no pinned staging, no host round trip), never a kernel. Groups on one stream likewise.
// Results equal the input bit for bit (sum, avg, max of one rank; gathers of one block).
TEST_F(DeviceStreams, OneRankIsOneDeviceCopyOnTheCallersStream) {
  ridge::setOneRankDeviceCopyForTesting(true);
  runRanks(rt, 1, [&](int, ridgeComm_t comm, ridgeStream_t stream) {
    const size_t count = 4099;
    DeviceBuffer send(rt, count * 8), recv(rt, count * 8);
    std::vector<unsigned char> input(count * 8);
    for (size_t i = 0; i < input.size(); ++i) input[i] = static_cast<unsigned char>(i * 131 + 7);
    send.upload(input);
    struct Call {
      const char* what;
      std::function<ridgeResult_t(void*)> run;  // the output buffer
      size_t bytes;
    };
    const Call calls[] = {
        {"allreduce sum float32",
         [&](void* out) {
           return ridgeAllReduce(send.get(), out, count, ridgeFloat32, ridgeSum, comm, stream);
         },
         count * 4},
        {"allreduce avg float16",
         [&](void* out) {
           return ridgeAllReduce(send.get(), out, count, ridgeFloat16, ridgeAvg, comm, stream);
         },
         count * 2},
        {"broadcast int64",
         [&](void* out) { return ridgeBroadcast(send.get(), out, count, ridgeInt64, 0, comm, stream); },
         count * 8},
        {"reduce max int8",
         [&](void* out) { return ridgeReduce(send.get(), out, count, ridgeInt8, ridgeMax, 0, comm, stream); },
         count},
        {"allgather uint32",
         [&](void* out) { return ridgeAllGather(send.get(), out, count, ridgeUint32, comm, stream); },
         count * 4},
        {"reducescatter prod float64",
         [&](void* out) {
           return ridgeReduceScatter(send.get(), out, count, ridgeFloat64, ridgeProd, comm, stream);
         },
         count * 8},
        {"alltoall bfloat16",
         [&](void* out) { return ridgeAlltoAll(send.get(), out, count, ridgeBfloat16, comm, stream); },
         count * 2},
    };
    const uint64_t reducesBefore = rt.reducesLaunched();
    for (const Call& c : calls) {
      recv.poison();
      rt.setRecordCopies(true);
      EXPECT_EQ(c.run(recv.get()), ridgeSuccess) << c.what << ": " << lastError();
      EXPECT_TRUE(rt.synchronize(stream).isOk());
      rt.setRecordCopies(false);
      const std::vector<EmulatedRuntime::CopyRecord> log = rt.copyLog();
      EXPECT_EQ(log.size(), 1u) << c.what << ": one copy expected";
      if (log.size() != 1) continue;
      EXPECT_EQ(log[0].dst, recv.get()) << c.what;
      EXPECT_EQ(log[0].src, send.get()) << c.what;
      EXPECT_EQ(log[0].bytes, c.bytes) << c.what;
      EXPECT_NE(log[0].ran, 0u) << c.what;
      const std::vector<unsigned char> out = recv.download();
      EXPECT_EQ(std::memcmp(out.data(), input.data(), c.bytes), 0) << c.what;
      size_t past = 0;
      for (size_t i = c.bytes; i < out.size(); ++i) past += out[i] != kPoison;
      EXPECT_EQ(past, 0u) << c.what << " wrote past its output";
    }
    // In place: nothing at all. A group on one stream: its copies, in call order.
    rt.setRecordCopies(true);
    EXPECT_EQ(ridgeAllReduce(send.get(), send.get(), count, ridgeFloat32, ridgeSum, comm, stream),
              ridgeSuccess);
    EXPECT_TRUE(rt.synchronize(stream).isOk());
    EXPECT_TRUE(rt.copyLog().empty()) << "an in-place one-rank call copied";
    ridgeGroupStart();
    ridgeAllReduce(send.get(), recv.get(), count, ridgeFloat32, ridgeSum, comm, stream);
    ridgeAllGather(send.get(), recv.get(), 16, ridgeInt8, comm, stream);
    EXPECT_EQ(ridgeGroupEnd(), ridgeSuccess) << lastError();
    EXPECT_TRUE(rt.synchronize(stream).isOk());
    rt.setRecordCopies(false);
    const std::vector<EmulatedRuntime::CopyRecord> log = rt.copyLog();
    EXPECT_EQ(log.size(), 2u);
    if (log.size() == 2) {
      EXPECT_EQ(log[0].bytes, count * 4);
      EXPECT_EQ(log[1].bytes, 16u);
      EXPECT_LT(log[0].ran, log[1].ran);
    }
    EXPECT_EQ(rt.reducesLaunched(), reducesBefore) << "a one-rank call launched a reduction";
    EXPECT_EQ(comm->device->proxy, nullptr) << "a one-rank device call started the proxy (host staging)";
    expectRanClean(rt, stream, comm, 0);
    return true;
  });
}

}  // namespace

TEST(DeviceStagedChunks, EveryCollectiveInManyChunksTwoRanks) {
  runStagedMatrix(2, chunkedCases(), kSmallStaging, kSmallStagingBytes);
}

TEST(DeviceStagedChunks, EveryCollectiveInManyChunksThreeRanks) {
  runStagedMatrix(3, chunkedCases(), kSmallStaging, kSmallStagingBytes);
}

TEST(DeviceStagedChunks, FourRanks) {
  runStagedMatrix(4,
                  {{Coll::AllReduce, ridgeFloat64, ridgeSum, 10007, false},
                   {Coll::AllGather, ridgeInt8, ridgeSum, 20001, false},
                   {Coll::AlltoAll, ridgeFloat16, ridgeSum, 3001, false},
                   {Coll::SendRecv, ridgeInt32, ridgeSum, 9999, false}},
                  kSmallStaging, kSmallStagingBytes);
}

// The default bound (4 MiB) against a batch of 24 MiB: the staging no longer grows to the
// batch (before: one buffer of send + receive bytes, doubled).
TEST(DeviceStagedChunks, StagingNeverExceedsTheDefaultBound) {
  runStagedMatrix(2, {{Coll::AllReduce, ridgeFloat32, ridgeSum, 3000000, false}}, "4M", size_t(4) << 20);
}

// A group mixing collectives and several sends/receives per peer, on 3 ranks with 32 KiB
// pieces: every rank must cut each operation alike (chains of unequal length, counts not a
// multiple of any chunk). The broadcast reads the first allreduce's output: a group's
// collectives run in call order, so it must see the reduced values (its inputs are copied in
// only after the allreduce's outputs are out).
TEST(DeviceStagedChunks, GroupMixingOperations) {
  ScopedEnv p2p("RIDGE_P2P", "off"), staging("RIDGE_STAGING_BYTES", kSmallStaging);
  EmulatedRuntime rt;
  ScopedRuntimeForTesting scope(&rt);
  const int n = 3;
  const size_t arCount = 3001, agCount = 4099, sendA = 21001, sendB = 777, sendC = 9000;
  runRanks(rt, n, [&](int rank, ridgeComm_t comm, ridgeStream_t stream) {
    std::vector<uint32_t> keys(n);
    for (int r = 0; r < n; ++r) keys[r] = rankKey(97, r);
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    const TypedOps& sum = typedOps(ridgeFloat32, ridgeSum);
    DeviceBuffer arIn(rt, arCount * 4), arOut(rt, arCount * 4), bcOut(rt, arCount * 4);
    DeviceBuffer agIn(rt, agCount * 8), agOut(rt, agCount * 8 * n);
    DeviceBuffer sA(rt, sendA * 4), sB(rt, sendB * 4), sC(rt, sendC * 4);
    DeviceBuffer rA(rt, sendA * 4), rB(rt, sendB * 4), rC(rt, sendC * 4);
    arIn.fillReduceInput(sum, arCount, keys[rank]);
    agIn.fillRawInput(8, agCount, keys[rank]);
    sA.fillRawInput(4, sendA, keys[rank] + 1);
    sB.fillRawInput(4, sendB, keys[rank] + 2);
    sC.fillRawInput(4, sendC, keys[rank] + 3);
    for (DeviceBuffer* b : {&arOut, &bcOut, &agOut, &rA, &rB, &rC}) b->poison();
    Gate gate;  // the whole group is queued before any of it runs
    EXPECT_TRUE(gate.enqueue(rt, stream).isOk());
    ridgeGroupStart();
    ridgeAllReduce(arIn.get(), arOut.get(), arCount, ridgeFloat32, ridgeSum, comm, stream);
    ridgeSend(sA.get(), sendA, ridgeFloat32, next, comm, stream);  // two sends to next: a chain of 2
    ridgeRecv(rC.get(), sendC, ridgeFloat32, next, comm, stream);  // and one receive from it
    ridgeBroadcast(arOut.get(), bcOut.get(), arCount, ridgeFloat32, 0, comm, stream);
    ridgeSend(sB.get(), sendB, ridgeFloat32, next, comm, stream);
    ridgeRecv(rA.get(), sendA, ridgeFloat32, prev, comm, stream);
    ridgeRecv(rB.get(), sendB, ridgeFloat32, prev, comm, stream);
    ridgeSend(sC.get(), sendC, ridgeFloat32, prev, comm, stream);
    ridgeAllGather(agIn.get(), agOut.get(), agCount, ridgeFloat64, comm, stream);
    EXPECT_EQ(ridgeGroupEnd(), ridgeSuccess) << lastError();
    gate.open.store(true);
    Status s = rt.synchronize(stream);
    EXPECT_TRUE(s.isOk()) << s.message();
    ridgeResult_t async = ridgeSuccess;
    EXPECT_EQ(ridgeCommGetAsyncError(comm, &async), ridgeSuccess);
    EXPECT_EQ(async, ridgeSuccess) << lastError();
    Mismatches mm;
    sum.checkRed(arOut.download().data(), arCount, keys.data(), n, 0, 0, mm);
    sum.checkRed(bcOut.download().data(), arCount, keys.data(), n, 0, 0, mm);
    const std::vector<unsigned char> ag = agOut.download();
    for (int j = 0; j < n; ++j) checkRawAny(8, ag.data() + j * agCount * 8, agCount, keys[j], 0, 0, mm);
    checkRawAny(4, rA.download().data(), sendA, keys[prev] + 1, 0, 0, mm);
    checkRawAny(4, rB.download().data(), sendB, keys[prev] + 2, 0, 0, mm);
    checkRawAny(4, rC.download().data(), sendC, keys[next] + 3, 0, 0, mm);
    EXPECT_EQ(mm.count, 0u) << "rank " << rank << ": " << mm.text;
    return true;
  });
  EXPECT_LE(rt.largestPinnedAllocation(), kSmallStagingBytes);
}

// Ordering evidence from the emulator's copy log: the input copy of chunk k+1 is issued
// before the output copy of chunk k (which can only be issued once chunk k's host
// collective has finished), so the copy stream may run it during that collective. Without
// pipelining, each chunk's inputs would follow the previous chunk's outputs.
TEST(DeviceStagedChunks, NextChunkIsCopiedInWhileTheCollectiveRuns) {
  ScopedEnv p2p("RIDGE_P2P", "off"), staging("RIDGE_STAGING_BYTES", kSmallStaging);
  EmulatedRuntime rt;
  ScopedRuntimeForTesting scope(&rt);
  const int n = 2;
  const size_t count = 100000;  // 3072 floats per chunk: 33 chunks
  std::vector<std::pair<uintptr_t, uintptr_t>> sendRange(n), recvRange(n);
  rt.setRecordCopies(true);
  runRanks(rt, n, [&](int rank, ridgeComm_t comm, ridgeStream_t stream) {
    const TypedOps& ops = typedOps(ridgeFloat32, ridgeSum);
    uint32_t keys[n] = {rankKey(13, 0), rankKey(13, 1)};
    DeviceBuffer send(rt, count * 4), recv(rt, count * 4);
    send.fillReduceInput(ops, count, keys[rank]);
    recv.poison();
    sendRange[rank] = {reinterpret_cast<uintptr_t>(send.get()),
                       reinterpret_cast<uintptr_t>(send.get()) + count * 4};
    recvRange[rank] = {reinterpret_cast<uintptr_t>(recv.get()),
                       reinterpret_cast<uintptr_t>(recv.get()) + count * 4};
    EXPECT_EQ(ridgeAllReduce(send.get(), recv.get(), count, ridgeFloat32, ridgeSum, comm, stream),
              ridgeSuccess)
        << lastError();
    EXPECT_TRUE(rt.synchronize(stream).isOk());
    Mismatches mm;
    ops.checkRed(recv.download().data(), count, keys, n, 0, 0, mm);
    EXPECT_EQ(mm.count, 0u) << mm.text;
    return true;
  });
  rt.setRecordCopies(false);
  const std::vector<EmulatedRuntime::CopyRecord> log = rt.copyLog();
  for (int r = 0; r < n; ++r) {
    auto within = [](const void* p, const std::pair<uintptr_t, uintptr_t>& range) {
      const auto a = reinterpret_cast<uintptr_t>(p);
      return a >= range.first && a < range.second;
    };
    std::vector<EmulatedRuntime::CopyRecord> in, out;  // in device-offset order = chunk order
    for (const auto& c : log) {
      if (within(c.src, sendRange[r])) in.push_back(c);
      if (within(c.dst, recvRange[r])) out.push_back(c);
    }
    auto byOffset = [](bool src) {
      return [src](const EmulatedRuntime::CopyRecord& a, const EmulatedRuntime::CopyRecord& b) {
        return (src ? a.src : a.dst) < (src ? b.src : b.dst);
      };
    };
    std::sort(in.begin(), in.end(), byOffset(true));
    std::sort(out.begin(), out.end(), byOffset(false));
    ASSERT_EQ(in.size(), out.size()) << "rank " << r;
    ASSERT_GE(in.size(), 30u) << "rank " << r << ": the allreduce was not cut into chunks";
    size_t ranDuringCollective = 0;
    for (size_t k = 0; k + 1 < in.size(); ++k) {
      EXPECT_LT(in[k + 1].issued, out[k].issued)
          << "rank " << r << ": chunk " << k + 1 << "'s input copied only after chunk " << k
          << "'s collective";
      ranDuringCollective += in[k + 1].ran != 0 && in[k + 1].ran < out[k].issued;
    }
    // Whether the stream ran them that early depends on the scheduler (on 2 busy cores a
    // rank whose peer is ahead finishes each chunk at once): shown, not asserted.
    std::printf(
        "rank %d: %zu chunks; %zu next-chunk input copies ran before the previous chunk's collective ended\n",
        r, in.size(), ranDuringCollective);
  }
}

// A staged collective that fits one chunk moves each buffer with one copy, not one per
// block (review M4 of the chunked staging: an allgather on P ranks issued P + 1 copies).
TEST(DeviceStagedChunks, AWholeOperationIsOneCopyPerBuffer) {
  ScopedEnv p2p("RIDGE_P2P", "off");
  EmulatedRuntime rt;
  ScopedRuntimeForTesting scope(&rt);
  const int n = 3;
  const size_t count = 1000;
  std::vector<std::pair<uintptr_t, uintptr_t>> sendRange(n), recvRange(n);
  rt.setRecordCopies(true);
  runRanks(rt, n, [&](int rank, ridgeComm_t comm, ridgeStream_t stream) {
    DeviceBuffer send(rt, count * 4), recv(rt, count * 4 * n);
    send.fillRawInput(4, count, rankKey(41, rank));
    recv.poison();
    sendRange[rank] = {reinterpret_cast<uintptr_t>(send.get()),
                       reinterpret_cast<uintptr_t>(send.get()) + count * 4};
    recvRange[rank] = {reinterpret_cast<uintptr_t>(recv.get()),
                       reinterpret_cast<uintptr_t>(recv.get()) + count * 4 * n};
    EXPECT_EQ(ridgeAllGather(send.get(), recv.get(), count, ridgeFloat32, comm, stream), ridgeSuccess)
        << lastError();
    expectRanClean(rt, stream, comm, rank);
    Mismatches mm;
    const std::vector<unsigned char> got = recv.download();
    for (int j = 0; j < n; ++j)
      checkRawAny(4, got.data() + size_t(j) * count * 4, count, rankKey(41, j), 0, 0, mm);
    EXPECT_EQ(mm.count, 0u) << "rank " << rank << ": " << mm.text;
    return true;
  });
  rt.setRecordCopies(false);
  const std::vector<EmulatedRuntime::CopyRecord> log = rt.copyLog();
  for (int r = 0; r < n; ++r) {
    size_t in = 0, out = 0;
    for (const auto& c : log) {
      const auto src = reinterpret_cast<uintptr_t>(c.src), dst = reinterpret_cast<uintptr_t>(c.dst);
      in += src >= sendRange[r].first && src < sendRange[r].second;
      out += dst >= recvRange[r].first && dst < recvRange[r].second;
    }
    EXPECT_EQ(in, 1u) << "rank " << r;
    EXPECT_EQ(out, 1u) << "rank " << r << ": one copy per block of the output";
  }
}

// RIDGE_STAGING_BYTES is checked at init: out of range or not a size fails every rank with
// the variable named; the ends of the range are accepted.
TEST(DeviceStagedChunks, TheBoundSettingIsValidated) {
  EmulatedRuntime rt;
  ScopedRuntimeForTesting scope(&rt);
  for (const char* bad : {"1K", "65535", "2G", "lots", "-4M", ""}) {
    ScopedEnv staging("RIDGE_STAGING_BYTES", bad);
    const bool emptyIsUnset = *bad == 0;  // empty counts as unset: the default
    ridgeUniqueId id;
    ASSERT_EQ(ridgeGetUniqueId(&id), ridgeSuccess);
    ridgeComm_t comm = nullptr;
    const ridgeResult_t res = ridgeCommInitRank(&comm, 1, id, 0);
    if (emptyIsUnset) {
      EXPECT_EQ(res, ridgeSuccess) << lastError();
      if (res == ridgeSuccess) {
        EXPECT_EQ(comm->device->stagingBytes, size_t(4) << 20);
      }
    } else {
      EXPECT_EQ(res, ridgeInvalidArgument) << "RIDGE_STAGING_BYTES=" << bad;
      EXPECT_NE(
          lastError().find(std::string("RIDGE_STAGING_BYTES=") + bad + ": expected a size from 64K to 1G"),
          std::string::npos)
          << lastError();
    }
    if (comm) {
      EXPECT_EQ(ridgeCommDestroy(comm), ridgeSuccess);
    }
  }
  for (const char* good : {"64K", "1G", "65536"}) {
    ScopedEnv staging("RIDGE_STAGING_BYTES", good);
    ridgeUniqueId id;
    ASSERT_EQ(ridgeGetUniqueId(&id), ridgeSuccess);
    ridgeComm_t comm = nullptr;
    ASSERT_EQ(ridgeCommInitRank(&comm, 1, id, 0), ridgeSuccess) << good << ": " << lastError();
    EXPECT_EQ(ridgeCommDestroy(comm), ridgeSuccess);
  }
}

// ---- staged sends and receives (review of the chunked staging: B1, M1, M2, M3) ----------
// Sends and receives on device memory are not staged: each chunk moves between the device
// buffer and a connector slot (the copy engine), so each chain progresses on its own, the
// chunks on the wire are those of host sends and receives, and no staging bound limits them.

// Receives `count` raw elements of `esz` bytes keyed `key` into a fresh device buffer and
// checks them; the buffer is compared after the stream ran.
void expectRaw(EmulatedRuntime& rt, const DeviceBuffer& b, size_t esz, size_t count, uint32_t key, int rank,
               const char* what) {
  (void)rt;
  Mismatches mm;
  checkRawAny(esz, b.download().data(), count, key, 0, 0, mm);
  EXPECT_EQ(mm.count, 0u) << what << ", rank " << rank << ": " << mm.text;
}

// Rank 0 groups a send larger than the staging bound with a receive from the same peer;
// rank 1 first receives all of it, then sends (separate calls). Cutting the group into
// lockstep chunk steps made rank 0 wait for the receive's first chunk before sending its
// send's second, which rank 1 sends only after the whole first message: both hung until
// the timeout.
TEST(DeviceStagedExchanges, AChainDoesNotWaitForAnother) {
  ScopedEnv p2p("RIDGE_P2P", "off"), staging("RIDGE_STAGING_BYTES", kSmallStaging);
  EmulatedRuntime rt;
  ScopedRuntimeForTesting scope(&rt);
  const size_t big = 300001, small = 5000;  // big: 1.2 MB, many times a 32 KiB piece
  runRanks(
      rt, 2,
      [&](int rank, ridgeComm_t comm, ridgeStream_t stream) {
        DeviceBuffer x(rt, big * 4), y(rt, small * 4);
        if (rank == 0) {
          x.fillRawInput(4, big, 11);
          y.poison();
          ridgeGroupStart();
          ridgeSend(x.get(), big, ridgeFloat32, 1, comm, stream);
          ridgeRecv(y.get(), small, ridgeFloat32, 1, comm, stream);
          EXPECT_EQ(ridgeGroupEnd(), ridgeSuccess) << lastError();
        } else {
          x.poison();
          y.fillRawInput(4, small, 12);
          EXPECT_EQ(ridgeRecv(x.get(), big, ridgeFloat32, 0, comm, stream), ridgeSuccess) << lastError();
          EXPECT_EQ(ridgeSend(y.get(), small, ridgeFloat32, 0, comm, stream), ridgeSuccess) << lastError();
        }
        expectRanClean(rt, stream, comm, rank);
        if (rank == 0) expectRaw(rt, y, 4, small, 12, rank, "the grouped receive");
        if (rank == 1) expectRaw(rt, x, 4, big, 11, rank, "the large send");
        return true;
      },
      10);
  EXPECT_LE(rt.largestPinnedAllocation(), kSmallStagingBytes);
}

// The ranks group differently and name the bytes with other types: rank 0 sends two
// messages to rank 1 in one group (floats), rank 1 receives them with two calls, as bytes
// and as doubles, and 256 sends to one peer in one group go too (the staged chunking had
// cut each by the group's per-peer count, so the two ends disagreed, and refused 256).
TEST(DeviceStagedExchanges, GroupingAndTypesMayDifferBetweenTheEnds) {
  ScopedEnv p2p("RIDGE_P2P", "off"), staging("RIDGE_STAGING_BYTES", kSmallStaging);
  EmulatedRuntime rt;
  ScopedRuntimeForTesting scope(&rt);
  const size_t a = 40000, b = 9000, many = 256, each = 64;  // a, b in floats; b even
  runRanks(
      rt, 2,
      [&](int rank, ridgeComm_t comm, ridgeStream_t stream) {
        DeviceBuffer ba(rt, a * 4), bb(rt, b * 4), bm(rt, many * each * 4);
        if (rank == 0) {
          ba.fillRawInput(4, a, 21);
          bb.fillRawInput(4, b, 22);
          bm.fillRawInput(4, many * each, 23);
          ridgeGroupStart();
          ridgeSend(ba.get(), a, ridgeFloat32, 1, comm, stream);
          ridgeSend(bb.get(), b, ridgeFloat32, 1, comm, stream);
          EXPECT_EQ(ridgeGroupEnd(), ridgeSuccess) << lastError();
          ridgeGroupStart();
          for (size_t i = 0; i < many; ++i)
            ridgeSend(static_cast<char*>(bm.get()) + i * each * 4, each, ridgeFloat32, 1, comm, stream);
          EXPECT_EQ(ridgeGroupEnd(), ridgeSuccess) << lastError();
        } else {
          for (DeviceBuffer* d : {&ba, &bb, &bm}) d->poison();
          EXPECT_EQ(ridgeRecv(ba.get(), a * 4, ridgeUint8, 0, comm, stream), ridgeSuccess) << lastError();
          EXPECT_EQ(ridgeRecv(bb.get(), b / 2, ridgeFloat64, 0, comm, stream), ridgeSuccess) << lastError();
          for (size_t i = 0; i < many; ++i)
            EXPECT_EQ(
                ridgeRecv(static_cast<char*>(bm.get()) + i * each * 4, each, ridgeFloat32, 0, comm, stream),
                ridgeSuccess)
                << lastError();
        }
        expectRanClean(rt, stream, comm, rank);
        if (rank == 1) {
          expectRaw(rt, ba, 4, a, 21, rank, "floats received as bytes");
          expectRaw(rt, bb, 4, b, 22, rank, "floats received as doubles");
          expectRaw(rt, bm, 4, many * each, 23, rank, "256 sends of one group");
        }
        return true;
      },
      10);
}

// A zero-count send on device memory against a zero-count receive into a null (so host)
// buffer, then a real message: both paths send and expect one empty message for a
// zero-count operation (the staged path had skipped it, so the host receive waited for it,
// or a stray empty message failed the next receive).
TEST(DeviceStagedExchanges, ZeroCountSendMeetsAHostReceive) {
  ScopedEnv p2p("RIDGE_P2P", "off");
  EmulatedRuntime rt;
  ScopedRuntimeForTesting scope(&rt);
  const size_t n = 3000;
  runRanks(
      rt, 2,
      [&](int rank, ridgeComm_t comm, ridgeStream_t stream) {
        DeviceBuffer d(rt, n * 4);
        if (rank == 0) {
          d.fillRawInput(4, n, 31);
          EXPECT_EQ(ridgeSend(d.get(), 0, ridgeFloat32, 1, comm, stream), ridgeSuccess) << lastError();
          EXPECT_EQ(ridgeSend(d.get(), n, ridgeFloat32, 1, comm, stream), ridgeSuccess) << lastError();
        } else {
          d.poison();
          EXPECT_EQ(ridgeRecv(nullptr, 0, ridgeFloat32, 0, comm, stream), ridgeSuccess) << lastError();
          EXPECT_EQ(ridgeRecv(d.get(), n, ridgeFloat32, 0, comm, stream), ridgeSuccess) << lastError();
        }
        expectRanClean(rt, stream, comm, rank);
        if (rank == 1) expectRaw(rt, d, 4, n, 31, rank, "the message after the empty one");
        return true;
      },
      10);
}

// A message above the single-copy threshold (src/coll/p2p_copy.h) between host memory and
// device memory, both ways: a host send posts a descriptor, which the device receive reads
// through the bounce chunk and copies to the device; a device send stays staged, which the
// host receive (that would take a descriptor) recognises and receives from the slots.
TEST(DeviceStagedExchanges, SingleCopyHostSendMeetsADeviceReceive) {
  ScopedEnv p2p("RIDGE_P2P", "off");
  EmulatedRuntime rt;
  ScopedRuntimeForTesting scope(&rt);
  runRanks(
      rt, 2,
      [&](int rank, ridgeComm_t comm, ridgeStream_t stream) {
        if (comm->p2pCopy.minBytes == SIZE_MAX) return true;  // no CMA here: nothing to show
        const size_t n = 3 * comm->p2pCopy.minBytes / 4 + 5;  // float32: 3x the threshold in bytes
        DeviceBuffer dIn(rt, n * 4), dOut(rt, n * 4);
        std::vector<unsigned char> host(n * 4, kPoison);
        const uint64_t bouncedBefore = comm->p2pCopy.bouncedRecvs, stagedBefore = comm->p2pCopy.stagedRecvs;
        if (rank == 0) {
          fillRawAny(4, host.data(), n, 41, 0);
          EXPECT_EQ(ridgeSend(host.data(), n, ridgeFloat32, 1, comm, stream), ridgeSuccess) << lastError();
          host.assign(n * 4, kPoison);
          EXPECT_EQ(ridgeRecv(host.data(), n, ridgeFloat32, 1, comm, stream), ridgeSuccess) << lastError();
        } else {
          dIn.poison();
          dOut.fillRawInput(4, n, 42);
          EXPECT_EQ(ridgeRecv(dIn.get(), n, ridgeFloat32, 0, comm, stream), ridgeSuccess) << lastError();
          EXPECT_EQ(ridgeSend(dOut.get(), n, ridgeFloat32, 0, comm, stream), ridgeSuccess) << lastError();
        }
        expectRanClean(rt, stream, comm, rank);
        if (rank == 1) {
          expectRaw(rt, dIn, 4, n, 41, rank, "device receive of a single-copy host send");
          EXPECT_EQ(comm->p2pCopy.bouncedRecvs - bouncedBefore, 1u)
              << "the device receive took no descriptor";
        } else {
          Mismatches mm;
          checkRawAny(4, host.data(), n, 42, 0, 0, mm);
          EXPECT_EQ(mm.count, 0u) << "host receive of a device send: " << mm.text;
          EXPECT_EQ(comm->p2pCopy.stagedRecvs - stagedBefore, 1u) << "the host receive was not staged";
        }
        return true;
      },
      10);
}

// ridgeGroupEnd finds a host/device mix on one communicator however far apart the two
// operations are, and whatever other communicator's operations lie between (one pass over
// the group, review item).
TEST_F(DeviceStreams, GroupMixFoundAcrossALongGroup) {
  runRanks(rt, 1, [&](int, ridgeComm_t comm, ridgeStream_t stream) {
    DeviceBuffer d(rt, 4096);
    std::vector<float> host(16, 2.0f);
    const std::vector<float> before = host;
    for (bool deviceFirst : {false, true}) {
      ridgeGroupStart();
      if (deviceFirst) ridgeAllReduce(d.get(), d.get(), 16, ridgeFloat32, ridgeSum, comm, stream);
      for (int i = 0; i < 2000; ++i)
        ridgeAllReduce(host.data(), host.data(), 16, ridgeFloat32, ridgeSum, comm, nullptr);
      if (!deviceFirst) ridgeAllReduce(d.get(), d.get(), 16, ridgeFloat32, ridgeSum, comm, stream);
      EXPECT_EQ(ridgeGroupEnd(), ridgeInvalidUsage);
      EXPECT_NE(lastError().find("mixes host-memory and device-memory"), std::string::npos) << lastError();
    }
    EXPECT_EQ(host, before);
    // A group of host operations only still runs.
    ridgeGroupStart();
    for (int i = 0; i < 100; ++i)
      ridgeAllReduce(host.data(), host.data(), 16, ridgeFloat32, ridgeSum, comm, nullptr);
    EXPECT_EQ(ridgeGroupEnd(), ridgeSuccess) << lastError();
    EXPECT_EQ(host, before);  // one rank: the sum is the input
    return true;
  });
}

// ---- send and receive to self ------------------------------------------------------------

// A word that names who sent it to whom and where: block checks need no reference data.
uint32_t selfTestWord(int from, int to, size_t i) {
  return (static_cast<uint32_t>(from) << 24) | (static_cast<uint32_t>(to) << 20) | static_cast<uint32_t>(i);
}

// All-to-all as nccl-tests writes it (each rank sends to and receives from every rank, itself
// included) on device buffers: the self block is a stream-ordered copy, so nothing lands
// before a gate ahead of the group on the stream opens, and every block is right after.
void allToAllWithSelfOnDevice(EmulatedRuntime& rt, int n) {
  const size_t count = 3000;
  runRanks(rt, n, [&](int rank, ridgeComm_t comm, ridgeStream_t stream) {
    DeviceBuffer send(rt, n * count * 4), recv(rt, n * count * 4);
    std::vector<uint32_t> words(n * count);
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < count; ++i) words[p * count + i] = selfTestWord(rank, p, i);
    std::vector<unsigned char> host(words.size() * 4);
    std::memcpy(host.data(), words.data(), host.size());
    send.upload(host);
    recv.poison();
    Gate gate;
    EXPECT_TRUE(gate.enqueue(rt, stream).isOk());
    EXPECT_EQ(ridgeGroupStart(), ridgeSuccess);
    for (int p = 0; p < n; ++p) {
      EXPECT_EQ(ridgeSend(send.bytes() + p * count * 4, count, ridgeUint32, p, comm, stream), ridgeSuccess)
          << lastError();
      EXPECT_EQ(ridgeRecv(recv.bytes() + p * count * 4, count, ridgeUint32, p, comm, stream), ridgeSuccess)
          << lastError();
    }
    EXPECT_EQ(ridgeGroupEnd(), ridgeSuccess) << lastError();
    EXPECT_EQ(recv.bytesNotPoison(), 0u) << "rank " << rank << ": the group ran before its stream reached it";
    gate.open.store(true);
    expectRanClean(rt, stream, comm, rank);
    const std::vector<unsigned char> out = recv.download();
    size_t wrong = 0;
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < count; ++i) {
        uint32_t w;
        std::memcpy(&w, out.data() + (p * count + i) * 4, 4);
        wrong += w != selfTestWord(p, rank, i);
      }
    EXPECT_EQ(wrong, 0u) << "rank " << rank << " of " << n;
    return true;
  });
}

TEST_F(DeviceStreams, AllToAllWithSelfOneRank) {
  allToAllWithSelfOnDevice(rt, 1);
}
TEST_F(DeviceStreams, AllToAllWithSelfTwoRanks) {
  allToAllWithSelfOnDevice(rt, 2);
}
TEST_F(DeviceStreams, AllToAllWithSelfThreeRanks) {
  allToAllWithSelfOnDevice(rt, 3);
}

// A send to self on one stream and its receive on another: the copy waits for the send's
// stream (held by a gate) and that stream's later work waits for the copy.
TEST_F(DeviceStreams, SelfPairOverTwoStreamsJoinsBoth) {
  const size_t count = 5000;
  runRanks(rt, 1, [&](int rank, ridgeComm_t comm, ridgeStream_t streamA) {
    ridgeStream_t streamB = nullptr;
    EXPECT_TRUE(rt.createStream(&streamB).isOk());
    DeviceBuffer send(rt, count * 4), recv(rt, count * 4), after(rt, count * 4);
    send.fillRawInput(4, count, rankKey(51, 0));
    recv.poison();
    after.poison();
    Gate gateB;
    EXPECT_TRUE(gateB.enqueue(rt, streamB).isOk());
    EXPECT_EQ(ridgeGroupStart(), ridgeSuccess);
    EXPECT_EQ(ridgeRecv(recv.get(), count, ridgeFloat32, 0, comm, streamA), ridgeSuccess) << lastError();
    EXPECT_EQ(ridgeSend(send.get(), count, ridgeFloat32, 0, comm, streamB), ridgeSuccess) << lastError();
    EXPECT_EQ(ridgeGroupEnd(), ridgeSuccess) << lastError();
    // Later work on the send's stream: a copy of what the receive got.
    EXPECT_TRUE(rt.copy(after.get(), recv.get(), count * 4, streamB).isOk());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(recv.bytesNotPoison(), 0u) << "the self copy ran before the send's stream reached it";
    gateB.open.store(true);
    EXPECT_TRUE(rt.synchronize(streamB).isOk());
    expectRanClean(rt, streamA, comm, rank);
    Mismatches mm;
    std::vector<unsigned char> out = recv.download();
    checkRawAny(4, out.data(), count, rankKey(51, 0), 0, 0, mm);
    out = after.download();
    checkRawAny(4, out.data(), count, rankKey(51, 0), 0, 0, mm);
    EXPECT_EQ(mm.count, 0u) << mm.text;
    rt.destroyStream(streamB);
    return true;
  });
}

// A mismatched self pair fails the group on every rank, with the reason, and queues nothing.
TEST_F(DeviceStreams, MismatchedSelfPairIsRefusedOnEveryRank) {
  const int n = 2;
  const size_t count = 64;
  runRanks(rt, n, [&](int rank, ridgeComm_t comm, ridgeStream_t stream) {
    DeviceBuffer send(rt, count * 4), recv(rt, count * 4), peerRecv(rt, count * 4);
    send.fillRawInput(4, count, rankKey(61, rank));
    recv.poison();
    peerRecv.poison();
    EXPECT_EQ(ridgeGroupStart(), ridgeSuccess);
    EXPECT_EQ(ridgeSend(send.get(), count, ridgeFloat32, 1 - rank, comm, stream), ridgeSuccess);
    EXPECT_EQ(ridgeRecv(peerRecv.get(), count, ridgeFloat32, 1 - rank, comm, stream), ridgeSuccess);
    EXPECT_EQ(ridgeSend(send.get(), count, ridgeFloat32, rank, comm, stream), ridgeSuccess);
    EXPECT_EQ(ridgeRecv(recv.get(), count / 2, ridgeFloat32, rank, comm, stream), ridgeSuccess);
    EXPECT_EQ(ridgeGroupEnd(), ridgeInvalidUsage);
    EXPECT_NE(lastError().find("does not match receive from self"), std::string::npos) << lastError();
    expectRanClean(rt, stream, comm, rank);
    EXPECT_EQ(recv.bytesNotPoison(), 0u);
    EXPECT_EQ(peerRecv.bytesNotPoison(), 0u);
    return true;
  });
}
