// Waiting for the device on the GPUDirect RDMA data path (coll/device/data_ops.h, docs/gpu.md),
// without communicators: the executor's idle path while a strand waits for the device, and
// the settles of DeviceDataOps on a slow emulated device.
//
// - A strand waiting for the device is woken by no transport, and a transport may sleep
//   longer than asked (a millisecond timeout), so the executor never sleeps on the
//   transport while one does (review F1); a strand waiting for a peer still does (the
//   control: the counting transport is on the idle path).
// - A settle is never moved behind later settles of other strands (review F2): with more
//   settles pending than pooled markers, the first is ready as soon as its own copy ran;
//   and no settle is ever ready before the copies queued ahead of it ran.
#include "coll/device/data_ops.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "coll/comm.h"
#include "coll/executor.h"
#include "coll/task.h"
#include "device/emulated_runtime.h"

namespace {

using ridge::Status;
using ridge::device::EmulatedRuntime;
using Clock = std::chrono::steady_clock;

// A transport that connects nobody and counts the executor's sleeps on it; each sleep
// lasts 1 ms whatever is asked (at least that, as a wait on a verbs completion channel did;
// at most that, which a transport may: its wake-ups may come early).
class CountingTransport final : public ridge::Transport {
 public:
  const char* name() const override { return "counting"; }
  ridge::SendConnector* sendTo(int) override { return nullptr; }
  ridge::RecvConnector* recvFrom(int) override { return nullptr; }
  void waitForActivity(int64_t maxWaitNs, bool (*stillIdle)(void*), void* arg) override {
    waits.fetch_add(1);
    if (stillIdle && !stillIdle(arg)) return;
    (void)maxWaitNs;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  Status checkPeer(int) override { return Status::ok(); }
  std::atomic<int> waits{0};
};

// Ready once `until` has passed; `onDevice` as a settle of the data ops, or a peer's post.
struct ReadyAt : ridge::WaitCondition {
  Clock::time_point until;
  ReadyAt(Clock::time_point t, bool device) : until(t) {
    onDevice = device;
    ready = [](ridge::WaitCondition* self) { return Clock::now() >= static_cast<ReadyAt*>(self)->until; };
  }
  bool await_ready() { return ready(this); }
  void await_suspend(std::coroutine_handle<ridge::Task::promise_type> h) {
    h.promise().strand->blocked = this;
  }
  void await_resume() const {}
};

ridge::Task waitOnce(Clock::time_point until, bool onDevice, int* resumed) {
  co_await ReadyAt(until, onDevice);
  ++*resumed;
  co_return Status::ok();
}

// One communicator of one rank whose only transport is `t`, sleeping at once when idle (as
// on a network transport of an oversubscribed host: no spin, no yield).
struct IdleComm {
  ridgeComm comm;
  CountingTransport* transport;
  IdleComm() {
    auto t = std::make_unique<CountingTransport>();
    transport = t.get();
    comm.rank = 0;
    comm.nranks = 1;
    comm.timeoutSec = 10;
    comm.spinNs = 0;
    comm.yieldNs = 0;
    comm.transports.push_back(std::move(t));
    comm.waitTransport = transport;
  }
};

// Runs strands that each wait `waitFor` (onDevice or not) on `c`; returns how many resumed.
int runWaits(IdleComm& c, int strands, std::chrono::microseconds waitFor, bool onDevice) {
  int resumed = 0;
  ridge::Executor& ex = ridge::Executor::forThisThread();
  const auto until = Clock::now() + waitFor;
  for (int i = 0; i < strands; ++i) ex.spawn(&c.comm, waitOnce(until, onDevice, &resumed));
  Status s = ex.run();
  EXPECT_TRUE(s.isOk()) << s.message();
  return resumed;
}

// Strands waiting only for the device: the executor sleeps between polls (the wait lasts
// long enough for many idle checks) but never on the transport.
TEST(ExecutorDeviceWait, NeverSleepsOnTheTransport) {
  IdleComm c;
  EXPECT_EQ(runWaits(c, 3, std::chrono::microseconds(5000), /*onDevice=*/true), 3);
  EXPECT_EQ(c.transport->waits.load(), 0) << "a device wait slept on the transport";
}

// The control: strands waiting for a peer do sleep on the transport (so the test above
// watches the path the executor takes when it sleeps).
TEST(ExecutorDeviceWait, PeerWaitsSleepOnTheTransport) {
  IdleComm c;
  EXPECT_EQ(runWaits(c, 2, std::chrono::microseconds(5000), /*onDevice=*/false), 2);
  EXPECT_GT(c.transport->waits.load(), 0);
}

// A device wait and a peer wait at once: the device wait decides (no transport sleep).
TEST(ExecutorDeviceWait, ADeviceWaitAmongPeerWaitsKeepsSlicesShort) {
  IdleComm c;
  int resumed = 0;
  ridge::Executor& ex = ridge::Executor::forThisThread();
  const auto until = Clock::now() + std::chrono::milliseconds(5);
  ex.spawn(&c.comm, waitOnce(until, /*onDevice=*/false, &resumed));
  ex.spawn(&c.comm, waitOnce(until, /*onDevice=*/true, &resumed));
  Status s = ex.run();
  EXPECT_TRUE(s.isOk()) << s.message();
  EXPECT_EQ(resumed, 2);
  EXPECT_EQ(c.transport->waits.load(), 0);
}

// One emulated device, a stream on it and two device buffers of `kBytes`.
struct SlowDevice {
  static constexpr size_t kBytes = 4096;
  EmulatedRuntime rt{1};
  ridgeStream_t stream = nullptr;
  void* a = nullptr;
  void* b = nullptr;
  explicit SlowDevice(std::chrono::microseconds perOp) {
    EXPECT_TRUE(rt.bindThread(0).isOk());
    EXPECT_TRUE(rt.createStream(&stream).isOk());
    EXPECT_TRUE(rt.allocDevice(kBytes, &a).isOk());
    EXPECT_TRUE(rt.allocDevice(kBytes, &b).isOk());
    rt.setWorkDelay(0, perOp);
    rt.setRecordCopies(true);
  }
  ~SlowDevice() {
    EXPECT_TRUE(rt.synchronize(stream).isOk());
    rt.setWorkDelay(0, std::chrono::microseconds(0));
    rt.freeDevice(a);
    rt.freeDevice(b);
    rt.destroyStream(stream);
  }
};

// The reviewer's case: copy 1 and settle A, then copies 2..9 each with its own settle, more
// settles than pooled markers, on a device taking 10 ms per copy. A is ready once copy 1
// ran, before copy 9 did; and each settle, when first seen ready, has its own copy behind
// it (never too short, the pool's overflow included).
TEST(DeviceDataOps, ASettleIsNotMovedBehindLaterOnes) {
  constexpr int kCopies = 9;
  static_assert(kCopies > static_cast<int>(ridge::DeviceDataOps::kMarkers));
  SlowDevice dev(std::chrono::milliseconds(10));
  ridge::DeviceDataOps ops(&dev.rt, dev.stream);
  ASSERT_TRUE(ops.createMarkers().isOk());
  std::vector<ridge::DataSettled> settles;
  settles.reserve(kCopies);
  for (int i = 0; i < kCopies; ++i) {
    ASSERT_TRUE(ops.copy(i % 2 ? dev.a : dev.b, i % 2 ? dev.b : dev.a, SlowDevice::kBytes).isOk());
    settles.push_back(ops.settle());
    ASSERT_TRUE(settles.back().status.isOk()) << settles.back().status.message();
  }
  std::vector<bool> seen(kCopies, false);
  int ready = 0;
  for (const auto t0 = Clock::now(); ready < kCopies && Clock::now() - t0 < std::chrono::seconds(10);) {
    for (int i = 0; i < kCopies; ++i) {
      if (seen[i] || !settles[i].ready(&settles[i])) continue;
      seen[i] = true;
      ++ready;
      ASSERT_TRUE(settles[i].status.isOk()) << settles[i].status.message();
      const std::vector<EmulatedRuntime::CopyRecord> log = dev.rt.copyLog();
      ASSERT_EQ(log.size(), static_cast<size_t>(kCopies));
      EXPECT_NE(log[i].ran, 0u) << "settle " << i + 1 << " ready before its copy ran";
      if (i == 0)
        EXPECT_EQ(log[kCopies - 1].ran, 0u)
            << "the first settle waited for the last copy: moved behind later settles";
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  EXPECT_EQ(ready, kCopies);
}

// Nothing queued: ready at once; a settle with nothing queued since the last one shares it;
// after synchronize every settle is done without a query.
TEST(DeviceDataOps, SettlesShareAndSynchronizeCompletes) {
  SlowDevice dev(std::chrono::milliseconds(50));
  ridge::DeviceDataOps ops(&dev.rt, dev.stream);
  ASSERT_TRUE(ops.createMarkers().isOk());
  ridge::DataSettled none = ops.settle();
  EXPECT_TRUE(none.await_ready());
  ASSERT_TRUE(ops.copy(dev.a, dev.b, SlowDevice::kBytes).isOk());
  ridge::DataSettled first = ops.settle();
  ridge::DataSettled again = ops.settle();
  EXPECT_EQ(first.seq, again.seq);
  EXPECT_FALSE(first.await_ready()) << "ready before a 50 ms copy ran";
  ASSERT_TRUE(ops.synchronize().isOk());
  EXPECT_NE(dev.rt.copyLog().at(0).ran, 0u);
  EXPECT_TRUE(first.await_ready());
  EXPECT_TRUE(again.await_ready());
}

}  // namespace
