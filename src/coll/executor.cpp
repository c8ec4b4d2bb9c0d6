#include "coll/executor.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <chrono>

#include "coll/comm.h"
#include "coll/device/device_collectives.h"
#include "coll/signature.h"
#include "core/log.h"
#include "core/per_thread.h"
#include "core/settings.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RIDGE_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define RIDGE_CPU_RELAX() asm volatile("yield")
#else
#define RIDGE_CPU_RELAX() ((void)0)
#endif

namespace ridge {

// ---- coroutine frame pool -------------------------------------------------------------
// Frames are recycled per thread in size classes of 256 bytes; a frame freed on another
// thread simply joins that thread's lists.
namespace {
constexpr size_t kFrameClass = 256;
constexpr size_t kFrameClasses = 32;  // up to 8 KiB pooled; larger frames use malloc
struct FreeFrame {
  FreeFrame* next;
};
struct FramePool {
  FreeFrame* lists[kFrameClasses] = {};
  ~FramePool() {
    for (FreeFrame*& head : lists) {
      while (head) {
        FreeFrame* n = head->next;
        ::operator delete(head);
        head = n;
      }
    }
  }
};
// This thread's pool (core/per_thread.h: no __tls_get_addr per frame).
FramePool& framePool() {
  return perThread<FramePool>();
}
}  // namespace

void* allocateFrame(size_t bytes) {
  size_t cls = (bytes + kFrameClass - 1) / kFrameClass;
  if (cls < kFrameClasses) {
    FramePool& pool = framePool();
    if (FreeFrame* f = pool.lists[cls]) {
      pool.lists[cls] = f->next;
      return f;
    }
    const size_t classBytes = cls * kFrameClass;
    return ::operator new(classBytes);
  }
  return ::operator new(bytes);
}

void freeFrame(void* p, size_t bytes) noexcept {
  size_t cls = (bytes + kFrameClass - 1) / kFrameClass;
  if (cls < kFrameClasses) {
    auto* f = static_cast<FreeFrame*>(p);
    FramePool& pool = framePool();
    f->next = pool.lists[cls];
    pool.lists[cls] = f;
    return;
  }
  ::operator delete(p);
}

// ---- executor -------------------------------------------------------------------------

// How long an idle executor sleeps while a strand waits for the device (checkIdle).
constexpr long kDeviceWaitSliceNs = 20000;

static int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Executor& Executor::forThisThread() {
  Executor& ex = perThread<Executor>();  // core/per_thread.h: no __tls_get_addr per call
  ex.reset();
  return ex;
}

void Executor::reset() {
  for (size_t i = 0; i < used_; ++i) {
    entries_[i]->task = Task();
    entries_[i]->strand = Strand();
  }
  used_ = 0;
  comms_.clear();
}

void Executor::spawn(ridgeComm* comm, Task task) {
  if (used_ == entries_.size()) entries_.push_back(std::make_unique<Entry>());
  Entry& e = *entries_[used_++];
  e.comm = comm;
  e.strand = Strand();
  e.strand.executor = this;
  e.strand.leaf = task.handle();
  task.handle().promise().strand = &e.strand;
  e.task = std::move(task);
  bool known = false;
  for (ridgeComm* c : comms_) known = known || c == comm;
  if (!known) comms_.push_back(comm);
}

bool Executor::anyReady() {
  for (size_t i = 0; i < used_; ++i) {
    Strand& s = entries_[i]->strand;
    if (!s.done && (!s.blocked || s.blocked->ready(s.blocked))) return true;
  }
  return false;
}

Status Executor::checkIdle(int64_t idleNs) {
  for (ridgeComm* c : comms_) {
    if (c->aborted.load(std::memory_order_relaxed))
      return Status(ridgeAborted, format("rank %d: communicator aborted while waiting", c->rank));
  }
  int64_t spinNs = INT64_MAX, timeoutNs = INT64_MAX, yieldNs = INT64_MAX;
  for (ridgeComm* c : comms_) {
    spinNs = std::min(spinNs, c->spinNs);
    yieldNs = std::min(yieldNs, c->yieldNs);
    timeoutNs = std::min<int64_t>(timeoutNs, int64_t{c->timeoutSec} * 1000000000);
  }
  if (idleNs < spinNs) return Status::ok();
  // A peer's operation header may sit behind a FIFO this rank is not reading now (a rank
  // blocked on a full FIFO to a peer that called something else): check what has arrived.
  for (ridgeComm* c : comms_) RIDGE_TRY(pollHeaders(c));
  if (idleNs > timeoutNs) {
    ridgeComm* c = comms_.front();
    std::vector<int> waitingOn;
    for (size_t i = 0; i < used_; ++i) {
      const Strand& s = entries_[i]->strand;
      if (s.done || !s.blocked || s.blocked->peer < 0 || entries_[i]->comm != c) continue;
      if (std::find(waitingOn.begin(), waitingOn.end(), s.blocked->peer) == waitingOn.end())
        waitingOn.push_back(s.blocked->peer);
    }
    return makeError(ridgeTimeout,
                     "rank %d: no progress from any peer for %d s (RIDGE_TIMEOUT) in %s; a peer is "
                     "stuck, dead, or called a different operation",
                     c->rank, static_cast<int>(timeoutNs / 1000000000), describeStall(c, waitingOn).c_str());
  }
  // Yield first (a peer on the same core gets to run), then sleep until a peer posts.
  // Sleeping is only possible when one transport's futex covers every strand.
  if (idleNs < spinNs + yieldNs || comms_.size() != 1 || !comms_.front()->waitTransport) {
    sched_yield();
    return Status::ok();
  }
  ridgeComm* comm = comms_.front();
  Transport* t = comm->waitTransport;
  int64_t slice = std::min<int64_t>(100000000, timeoutNs - idleNs + 1000000);
  // With several transports (shm within a host, a network transport between hosts) only
  // the first one's wake-ups reach this sleep: poll the others every 200 us.
  if (comm->transports.size() > 1) slice = std::min<int64_t>(slice, 200000);
  // A strand waiting for the device (coll/device/data_ops.h) is woken by no transport, and a
  // transport may sleep longer than asked (a millisecond timeout rounds 20 us up to 1 ms):
  // while one waits, sleep kDeviceWaitSliceNs here and poll again. A copy or reduction of
  // one chunk takes microseconds; a peer's post is seen at most one slice later.
  bool deviceWait = false;
  for (size_t i = 0; i < used_ && !deviceWait; ++i) {
    const Strand& s = entries_[i]->strand;
    deviceWait = !s.done && s.blocked && s.blocked->onDevice;
  }
  if (deviceWait) {
    timespec nap{0, kDeviceWaitSliceNs};
    nanosleep(&nap, nullptr);
  } else {
    t->waitForActivity(
        slice, [](void* self) { return !static_cast<Executor*>(self)->anyReady(); }, this);
  }
  // A peer may post its last data and exit at once, or finish everything it had with us
  // and leave: only a peer that a blocked strand still waits for is checked.
  if (anyReady()) return Status::ok();
  // During a device-network batch only the device network's connections are checked: a
  // peer that finished and destroyed its communicator closes its host connections while
  // the device network may still deliver (review M3 of the GPUDirect RDMA path).
  const bool onDeviceNetwork = comm->device->net && comm->waitTransport == comm->device->net.get();
  for (size_t i = 0; i < used_; ++i) {
    const Strand& s = entries_[i]->strand;
    if (s.done || !s.blocked || s.blocked->peer < 0) continue;
    if (onDeviceNetwork) {
      RIDGE_TRY(comm->device->net->checkPeer(s.blocked->peer));
      continue;
    }
    for (auto& transport : comm->transports) {
      Status st = transport->checkPeer(s.blocked->peer);
      if (st.isOk()) continue;
      // What the peer sent before it left may have arrived (and our last chunk to it may have
      // been handed back) after anyReady() above looked: a transport reports a peer failed
      // only after publishing everything that came before, so look again before failing.
      if (anyReady()) return Status::ok();
      // A peer that left after finding a mismatch: report the mismatch where its header is here.
      RIDGE_TRY(pollHeaders(comm));
      return st;
    }
  }
  return Status::ok();
}

Status Executor::run() {
  size_t remaining = used_;
  int64_t idleSince = 0;
  uint32_t idleSpins = 0;
  Status failure;
  while (remaining > 0) {
    bool progressed = false;
    for (size_t i = 0; i < used_; ++i) {  // used_ may grow while we resume
      Entry& e = *entries_[i];
      Strand& s = e.strand;
      if (s.done) continue;
      if (s.blocked) {
        if (!s.blocked->ready(s.blocked)) continue;
        s.blocked = nullptr;
      }
      s.leaf.resume();
      progressed = true;
      if (s.done && !s.result.isOk()) {
        failure = std::move(s.result);
        break;
      }
    }
    if (!failure.isOk()) break;
    // Strands spawned during this pass are counted here.
    remaining = 0;
    for (size_t i = 0; i < used_; ++i) remaining += entries_[i]->strand.done ? 0 : 1;
    if (progressed) {
      idleSpins = 0;
      continue;
    }
    // Nothing could move. Reading the clock costs ~20 ns, so only every 64 idle polls.
    if ((idleSpins++ & 63) == 0) {
      int64_t now = nowNs();
      if (idleSpins == 1) {
        idleSince = now;
        // About to wait: what this thread posted and a transport's progress thread has not
        // written yet leaves from here (Transport::flushSends).
        for (ridgeComm* c : comms_)
          for (auto& t : c->transports) t->flushSends();
      }
      failure = checkIdle(now - idleSince);
      if (!failure.isOk()) break;
    } else {
      RIDGE_CPU_RELAX();
    }
  }
  if (!failure.isOk()) {
    for (ridgeComm* c : comms_) {
      int expected = ridgeSuccess;
      c->asyncError.compare_exchange_strong(expected, failure.code());
    }
  }
  // Destroy finished and unfinished frames now (an unfinished one holds slots of a
  // connector that is broken anyway: the communicator has recorded the error).
  reset();
  return failure;
}

}  // namespace ridge
