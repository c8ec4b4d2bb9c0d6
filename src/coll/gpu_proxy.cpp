#include "coll/gpu_proxy.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "coll/batch.h"
#include "coll/comm.h"
#include "coll/executor.h"
#include "core/log.h"
#include "reduce/reduce.h"

namespace ridge {

// Staging allocated by the proxy's setup (docs/gpu.md: batches up to this size never wait in
// the call for earlier ones).
constexpr size_t kInitialStagingBytes = size_t(4) << 20;

using device::DeviceRuntime;
using device::Marker;
using device::ReleaseWord;

class GpuProxy {
 public:
  GpuProxy(ridgeComm* comm, DeviceRuntime* rt) : comm_(comm), rt_(rt) {}
  ~GpuProxy() { (void)stop(/*abort=*/true); }

  Status start();
  Status submit(const DeviceOp* ops, size_t n);
  Status drain();
  // abort == false: the status of letting the queued batches finish (bounded by the timeout).
  Status stop(bool abort);
  DeviceRuntime* runtime() const { return rt_; }

 private:
  struct Slot {
    DeviceOp op{};
    Marker* marker = nullptr;  // created once at start, recorded on every use
    uint32_t seq = 0;          // the batch's sequence number
    bool lastOfBatch = false;
    bool skip = false;  // submission failed half-way: release without running
  };
  // Where one operation's bytes sit in the staging buffer.
  struct Staged {
    BufferUse use;
    size_t sendOff = 0, recvOff = 0;  // byte offsets into staging_
  };

  Status setupOnThread();  // device binding, markers, copy stream, P2P context
  void loop();
  Status runBatch(uint64_t first, size_t n);
  Status waitForMarkers(uint64_t first, size_t n);
  // Lays out the batch of `n` operations at `ops` in the staging buffer (into out[0..n));
  // returns the bytes it needs.
  size_t layOutStaging(const DeviceOp* ops, size_t n, Staged* out) const;
  // Waits, mutex_ held through `lock`, until the proxy has released every queued batch;
  // bounded by the timeout and by ridgeCommAbort.
  Status waitIdle(std::unique_lock<std::mutex>& lock);
  // Called by submit with mutex_ held, before anything of the batch is queued on a stream.
  Status ensureStaging(const DeviceOp* ops, size_t n, std::unique_lock<std::mutex>& lock);
  // Replaces the staging buffer by one of `bytes` (nothing may be using it).
  Status allocStaging(size_t bytes);
  // Moves the word forward to seq, never back: stop() (abort) and the proxy thread may both
  // release, in either order.
  void release(uint32_t seq) {
    uint32_t cur = __atomic_load_n(word_.host, __ATOMIC_ACQUIRE);
    while (!device::sequenceReached(cur, seq) &&
           !__atomic_compare_exchange_n(word_.host, &cur, seq, false, __ATOMIC_RELEASE, __ATOMIC_ACQUIRE)) {
    }
  }
  Status timedOut(const char* what) const;
  // A failure becomes the communicator's asynchronous error unless one is set already, and
  // its last error text when it is the first or `ranBatch` (the batch started with no error
  // set: the transports' waits may have set the code without a text meanwhile).
  void recordAsyncError(const Status& s, bool ranBatch);

  ridgeComm* comm_;
  DeviceRuntime* rt_;
  Slot ring_[kMaxDeviceBatchOps];
  Staged staged_[kMaxDeviceBatchOps];        // the running batch's layout (proxy thread)
  Staged sizing_[kMaxDeviceBatchOps];        // the submitted batch's layout (submit, mutex_ held)
  DeviceOp opsScratch_[kMaxDeviceBatchOps];  // the running batch's operations, contiguous
  CollArgs hostArgs_[kMaxDeviceBatchOps];
  size_t markersMade_ = 0;
  ReleaseWord word_{};
  bool haveWord_ = false;
  ridgeStream_t copyStream_ = nullptr;
  bool haveCopyStream_ = false;
  char* staging_ = nullptr;
  size_t stagingBytes_ = 0;

  // set by the proxy thread once setupOnThread is done; a member, so that it outlives the
  // thread's set_value (start() may return while set_value is still unwinding)
  std::promise<Status> setupDone_;
  Status drainStatus_;         // why stop() gave up on queued batches (mutex_)
  size_t droppedBatches_ = 0;  // batches shutdown released without running (mutex_)

  std::mutex mutex_;
  std::condition_variable changed_;  // head_, tail_ or stop_ moved
  uint64_t head_ = 0;                // next slot to fill (monotonic; slot = index % ring size)
  uint64_t tail_ = 0;                // next slot the proxy consumes
  uint32_t issued_ = 0;              // last sequence number handed out
  bool stop_ = false;
  std::thread thread_;
};

void GpuProxyDeleter::operator()(GpuProxy* p) const {
  delete p;
}

Status GpuProxy::timedOut(const char* what) const {
  return makeError(ridgeTimeout, "rank %d: %s for %d s (RIDGE_TIMEOUT)", comm_->rank, what,
                   comm_->timeoutSec);
}

Status GpuProxy::start() {
  RIDGE_TRY(rt_->takeReleaseWord(&word_));
  haveWord_ = true;
  // Sequence numbers continue from the word's value: words are recycled and must never
  // appear to go backwards to a stream still waiting on an old value.
  issued_ = __atomic_load_n(word_.host, __ATOMIC_ACQUIRE);
  // The markers and the copy stream belong to the communicator's device, which need not be
  // the caller's current one: the proxy thread binds to it and creates them there.
  // Everything that may synchronize the device implicitly (stream creation, peer access)
  // happens here, before submit queues the first wait on a user's stream.
  std::future<Status> setup = setupDone_.get_future();
  thread_ = std::thread([this] {
    Status s = setupOnThread();
    const bool ok = s.isOk();
    setupDone_.set_value(std::move(s));
    if (ok) loop();
  });
  Status s = setup.get();
  if (!s.isOk()) thread_.join();
  return s;
}

Status GpuProxy::setupOnThread() {
  if (comm_->cudaDevice >= 0) RIDGE_TRY(rt_->bindThread(comm_->cudaDevice));
  for (; markersMade_ < kMaxDeviceBatchOps; ++markersMade_)
    RIDGE_TRY(rt_->createMarker(&ring_[markersMade_].marker));
  RIDGE_TRY(rt_->createStream(&copyStream_));
  haveCopyStream_ = true;
  // A first staging buffer, so that ordinary sizes never make submit wait for earlier
  // batches to grow it (ensureStaging).
  RIDGE_TRY(allocStaging(kInitialStagingBytes));
  return p2p::prepareContext(comm_, rt_);
}

void GpuProxy::recordAsyncError(const Status& s, bool ranBatch) {
  int expected = ridgeSuccess;
  if (comm_->asyncError.compare_exchange_strong(expected, s.code()) || ranBatch) {
    std::lock_guard<std::mutex> errLock(comm_->lastErrorMutex);
    comm_->lastError = s.message();
  }
  RIDGE_WARN("rank %d: device collective failed: %s", comm_->rank, s.message().c_str());
}

size_t GpuProxy::layOutStaging(const DeviceOp* ops, size_t n, Staged* staged) const {
  // Each buffer on its own page (the direct transports' bounce and copy paths like
  // page-aligned memory). A send range inside the receive range (in place) shares the
  // receive range's staging.
  constexpr size_t kAlign = 4096;
  auto roundUp = [](size_t b) { return (b + kAlign - 1) / kAlign * kAlign; };
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    const CollArgs& a = ops[i].args;
    Staged& st = staged[i];
    st.use = bufferUse(a, comm_->rank, comm_->nranks);
    const size_t es = dataTypeSize(a.dtype);
    st.recvOff = total;
    if (st.use.writesRecv) total += roundUp(st.use.recvCount * es);
    const auto sendAddr = reinterpret_cast<uintptr_t>(a.send), recvAddr = reinterpret_cast<uintptr_t>(a.recv);
    const bool inside = st.use.writesRecv && st.use.readsSend && sendAddr >= recvAddr &&
                        sendAddr + st.use.sendCount * es <= recvAddr + st.use.recvCount * es;
    if (inside) {
      st.sendOff = st.recvOff + (sendAddr - recvAddr);
    } else {
      st.sendOff = total;
      if (st.use.readsSend) total += roundUp(st.use.sendCount * es);
    }
  }
  return total;
}

Status GpuProxy::ensureStaging(const DeviceOp* ops, size_t n, std::unique_lock<std::mutex>& lock) {
  const size_t bytes = layOutStaging(ops, n, sizing_);
  if (bytes <= stagingBytes_) return Status::ok();
  // Pinned allocation and free may synchronize the device implicitly (CUDA Programming
  // Guide, "Implicit Synchronization"); a user's stream parked on this proxy's release word
  // would then never move. So the buffer grows only here, on the caller's thread, once every
  // batch queued before has been released (no stream waits on this communicator) and before
  // this batch's wait is queued. The proxy thread is idle meanwhile (head_ == tail_, and
  // mutex_ stays held), so the buffer is not in use.
  RIDGE_TRY(waitIdle(lock));
  // At least doubled, so that a workload of growing sizes waits here only a few times.
  return allocStaging(std::max(bytes, 2 * stagingBytes_));
}

Status GpuProxy::allocStaging(size_t bytes) {
  if (staging_) rt_->freePinned(staging_);
  staging_ = nullptr;
  stagingBytes_ = 0;
  void* p = nullptr;
  RIDGE_TRY(rt_->allocPinned(bytes, &p));
  staging_ = static_cast<char*>(p);
  stagingBytes_ = bytes;
  return Status::ok();
}

Status GpuProxy::submit(const DeviceOp* ops, size_t n) {
  if (n == 0) return Status::ok();
  if (n > kMaxDeviceBatchOps)
    return makeError(ridgeInvalidUsage,
                     "a group holds %zu operations on device memory for one communicator; at most %zu", n,
                     kMaxDeviceBatchOps);
  std::unique_lock<std::mutex> lock(mutex_);
  if (stop_) return makeError(ridgeInvalidUsage, "rank %d: the communicator is shutting down", comm_->rank);
  // Wait for room, in short slices so that ridgeCommAbort is noticed.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(comm_->timeoutSec);
  for (;;) {
    // Abort first: once aborted, room made by the proxy releasing batches is no invitation.
    if (comm_->aborted.load())
      return makeError(ridgeAborted,
                       "rank %d: communicator aborted while waiting for room in the device queue",
                       comm_->rank);
    if (head_ - tail_ + n <= kMaxDeviceBatchOps) break;
    if (std::chrono::steady_clock::now() > deadline)
      return timedOut("the device operation queue stayed full");
    changed_.wait_for(lock, std::chrono::milliseconds(10));
  }
  // Staging for this batch, even if it goes P2P: the proxy must never allocate once the
  // batch's wait is queued, and only the proxy's vote decides whether it is staged.
  RIDGE_TRY(ensureStaging(ops, n, lock));
  const uint32_t seq = issued_ + 1;
  Status failure;
  size_t waited = 0;  // streams told to wait for seq
  for (size_t i = 0; i < n; ++i) {
    Slot& s = ring_[(head_ + i) % kMaxDeviceBatchOps];
    s.op = ops[i];
    s.seq = seq;
    s.lastOfBatch = i + 1 == n;
    s.skip = false;
    if (failure.isOk()) failure = rt_->recordMarker(s.marker, ops[i].stream);
  }
  if (failure.isOk()) {
    for (size_t i = 0; i < n && failure.isOk(); ++i) {
      bool seen = false;  // one wait per distinct stream
      for (size_t j = 0; j < i; ++j) seen = seen || ops[j].stream == ops[i].stream;
      if (seen) continue;
      failure = rt_->waitWord(ops[i].stream, word_, seq);
      if (failure.isOk()) ++waited;
    }
  }
  if (!failure.isOk() && waited == 0) return failure;  // nothing refers to seq: forget it
  // Streams may wait for seq: publish the batch either way; a failed one is only released.
  for (size_t i = 0; i < n; ++i) ring_[(head_ + i) % kMaxDeviceBatchOps].skip = !failure.isOk();
  issued_ = seq;
  head_ += n;
  lock.unlock();
  changed_.notify_all();
  return failure;
}

Status GpuProxy::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  return waitIdle(lock);
}

Status GpuProxy::waitIdle(std::unique_lock<std::mutex>& lock) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(comm_->timeoutSec);
  while (tail_ != head_) {
    if (comm_->aborted.load())
      return makeError(ridgeAborted, "rank %d: communicator aborted while device operations were in flight",
                       comm_->rank);
    if (std::chrono::steady_clock::now() > deadline)
      return timedOut("device operations queued earlier on this communicator did not finish");
    changed_.wait_for(lock, std::chrono::milliseconds(10));
  }
  return Status::ok();
}

Status GpuProxy::stop(bool abort) {
  const Status drained = abort ? Status::ok() : drain();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!drained.isOk() && drainStatus_.isOk()) drainStatus_ = drained;
    stop_ = true;
    // Abort frees every stream now, before the join: the proxy may be stuck inside a runtime
    // call that itself waits for a parked stream, and would then never return.
    if (abort && haveWord_) release(issued_);
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (haveWord_) {
    release(issued_);  // whatever is still queued: no stream may wait forever
    rt_->returnReleaseWord(word_);
    haveWord_ = false;
  }
  for (size_t i = 0; i < markersMade_; ++i) rt_->destroyMarker(ring_[i].marker);
  markersMade_ = 0;
  if (haveCopyStream_) {
    (void)rt_->synchronize(copyStream_);
    rt_->destroyStream(copyStream_);
    haveCopyStream_ = false;
  }
  if (staging_) rt_->freePinned(staging_);
  staging_ = nullptr;
  stagingBytes_ = 0;
  // The drain gave up, but the batches it waited for may all have run meanwhile (the join
  // waited for them): only a dropped one is a failure.
  std::lock_guard<std::mutex> lock(mutex_);
  return droppedBatches_ > 0 ? drained : Status::ok();
}

void GpuProxy::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return stop_ || head_ != tail_; });
    if (head_ == tail_) return;  // stopping and nothing left
    // One batch: from tail_ to the slot that ends it (always published whole).
    const uint64_t first = tail_;
    size_t n = 1;
    while (!ring_[(first + n - 1) % kMaxDeviceBatchOps].lastOfBatch) ++n;
    const Slot& last = ring_[(first + n - 1) % kMaxDeviceBatchOps];
    const uint32_t seq = last.seq;
    const bool skip = last.skip || stop_;
    // A batch dropped by shutdown never wrote its outputs: that is the communicator's error.
    Status dropped;
    if (stop_ && !last.skip && !comm_->aborted.load())
      dropped = makeError(drainStatus_.isOk() ? ridgeTimeout : drainStatus_.code(),
                          "rank %d: the communicator was shut down before a queued device collective ran "
                          "(its outputs are not written): %s",
                          comm_->rank, drainStatus_.isOk() ? "shutdown" : drainStatus_.message().c_str());
    if (!dropped.isOk()) ++droppedBatches_;
    lock.unlock();
    if (!dropped.isOk()) recordAsyncError(dropped, /*ranBatch=*/false);
    // After an abort, an earlier failure or during shutdown, batches are only released.
    if (!skip && !comm_->aborted.load() && comm_->asyncError.load() == ridgeSuccess) {
      Status s = runBatch(first, n);
      if (!s.isOk()) recordAsyncError(s, /*ranBatch=*/true);
    }
    release(seq);
    lock.lock();
    tail_ = first + n;
    // Nothing queued after this batch: no stream waits on this communicator, so closing
    // peers' IPC mappings (which may synchronize the device) is safe now. mutex_ keeps
    // submit from queueing a wait meanwhile.
    if (head_ == tail_) p2p::closeDeferred(comm_);
    changed_.notify_all();
  }
}

Status GpuProxy::waitForMarkers(uint64_t first, size_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(comm_->timeoutSec);
  for (int polls = 0;; ++polls) {
    bool all = true;
    for (size_t i = 0; i < n && all; ++i) {
      bool done = false;
      RIDGE_TRY(rt_->queryMarker(ring_[(first + i) % kMaxDeviceBatchOps].marker, &done));
      all = done;
    }
    if (all) return Status::ok();
    if (comm_->aborted.load())
      return makeError(ridgeAborted, "rank %d: communicator aborted while waiting for the user's stream",
                       comm_->rank);
    if (std::chrono::steady_clock::now() > deadline)
      return timedOut("the user's stream did not reach the collective");
    // The stream's earlier work may take long: spin briefly, then poll every 50 us.
    if (polls < 200)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

Status GpuProxy::runBatch(uint64_t first, size_t n) {
  RIDGE_TRY(waitForMarkers(first, n));
  // ---- P2P transport hook (transports/p2p/p2p.h): device to device when every rank's
  // batch allows it; otherwise the staged path below, unchanged.
  for (size_t i = 0; i < n; ++i) hostArgs_[i] = ring_[(first + i) % kMaxDeviceBatchOps].op.args;
  bool ranP2p = false;
  RIDGE_TRY(p2p::runBatch(comm_, rt_, hostArgs_, n, &ranP2p));
  if (ranP2p) return Status::ok();
  // ---- end of the P2P hook
  // Staged: the layout submit sized the buffer with (ensureStaging grew it then).
  DeviceOp* batch = opsScratch_;
  for (size_t i = 0; i < n; ++i) batch[i] = ring_[(first + i) % kMaxDeviceBatchOps].op;
  const size_t total = layOutStaging(batch, n, staged_);
  if (total > stagingBytes_)
    return makeError(ridgeInternalError, "rank %d: staging holds %zu bytes, the batch needs %zu", comm_->rank,
                     stagingBytes_, total);
  for (size_t i = 0; i < n; ++i) {
    const CollArgs& a = ring_[(first + i) % kMaxDeviceBatchOps].op.args;
    const Staged& st = staged_[i];
    const size_t es = dataTypeSize(a.dtype);
    if (st.use.readsSend && st.use.sendCount)
      RIDGE_TRY(rt_->copy(staging_ + st.sendOff, a.send, st.use.sendCount * es, copyStream_));
    hostArgs_[i] = a;
    hostArgs_[i].send = st.use.readsSend ? staging_ + st.sendOff : nullptr;
    hostArgs_[i].recv = st.use.writesRecv ? staging_ + st.recvOff : nullptr;
  }
  RIDGE_TRY(rt_->synchronize(copyStream_));
  // The host algorithms and transports, unchanged, on this thread's executor.
  Executor& ex = Executor::forThisThread();
  spawnBatch(ex, comm_, hostArgs_, n);
  RIDGE_TRY(ex.run());
  for (size_t i = 0; i < n; ++i) {
    const CollArgs& a = ring_[(first + i) % kMaxDeviceBatchOps].op.args;
    const Staged& st = staged_[i];
    if (st.use.writesRecv && st.use.recvCount)
      RIDGE_TRY(
          rt_->copy(a.recv, staging_ + st.recvOff, st.use.recvCount * dataTypeSize(a.dtype), copyStream_));
  }
  return rt_->synchronize(copyStream_);
}

// ---- entry points ----------------------------------------------------------------------

Status submitDeviceBatch(ridgeComm* comm, DeviceRuntime* rt, const DeviceOp* ops, size_t n) {
  {
    std::lock_guard<std::mutex> lock(comm->gpuProxyMutex);
    if (!comm->gpuProxy) {
      std::unique_ptr<GpuProxy, GpuProxyDeleter> proxy(new GpuProxy(comm, rt));
      RIDGE_TRY(proxy->start());
      comm->gpuProxy = std::move(proxy);
    } else if (comm->gpuProxy->runtime() != rt) {
      return makeError(ridgeInternalError, "rank %d: the device runtime changed under a live communicator",
                       comm->rank);
    }
  }
  return comm->gpuProxy->submit(ops, n);
}

Status drainDeviceOps(ridgeComm* comm) {
  return comm->gpuProxy ? comm->gpuProxy->drain() : Status::ok();
}

namespace {
// Stops the proxy (draining queued batches first unless `abort`), then the P2P context: its
// mappings and stream outlive the proxy thread that used them.
Status endProxy(ridgeComm* comm, bool abort) {
  Status s = comm->gpuProxy ? comm->gpuProxy->stop(abort) : Status::ok();
  comm->gpuProxy.reset();
  p2p::releaseContext(comm);
  return s;
}
}  // namespace

Status finishGpuProxy(ridgeComm* comm) {
  return endProxy(comm, /*abort=*/false);
}

void stopGpuProxy(ridgeComm* comm, bool abort) {
  (void)endProxy(comm, abort);  // a batch it had to drop is the communicator's async error
}

}  // namespace ridge
