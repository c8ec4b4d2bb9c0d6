// Waiting for the device on the GPUDirect RDMA data path (coll/data_ops.h, docs/gpu.md),
// without communicators: the executor's idle path while a strand waits for the device.
//
// - A strand waiting for the device is woken by no transport, and a transport may sleep
//   longer than asked (verbs: whole milliseconds), so the executor never sleeps on the
//   transport while one does (review F1); a strand waiting for a peer still does (the
//   control: the counting transport is on the idle path).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "bootstrap/bootstrap.h"
#include "coll/comm.h"
#include "coll/executor.h"
#include "coll/task.h"

namespace {

using ridge::Status;
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

}  // namespace
