#include "coll/device/gpu_proxy.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>

#include "coll/batch.h"
#include "coll/comm.h"
#include "coll/device/data_ops.h"
#include "coll/device/device_collectives.h"
#include "coll/executor.h"
#include "coll/signature.h"
#include "core/log.h"
#include "core/settings.h"
#include "reduce/reduce.h"

namespace ridge {

using device::DeviceRuntime;
using device::Marker;
using device::ReleaseWord;

namespace {

// Alignment of each buffer inside a staging piece: a page (the direct transports' bounce and
// copy paths like page-aligned memory).
constexpr size_t kCollectiveAlign = 4096;

size_t roundUp(size_t bytes, size_t align) {
  return (bytes + align - 1) / align * align;
}

// Blocks of `count` elements an operation reads from its send buffer and writes to its
// receive buffer: a chunk takes the same element range [lo, lo + n) of every block.
size_t sendBlocks(CollType t, int nranks) {
  return t == CollType::ReduceScatter || t == CollType::AlltoAll ? static_cast<size_t>(nranks) : 1;
}
size_t recvBlocks(CollType t, int nranks) {
  return t == CollType::AllGather || t == CollType::AlltoAll ? static_cast<size_t>(nranks) : 1;
}

bool rangesOverlap(const void* a, size_t an, const void* b, size_t bn) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return an > 0 && bn > 0 && x < y + bn && y < x + an;
}

// Whether the device network can run collective `op` (docs/gpu.md, "GPUDirect RDMA data
// path"): every collective, since each has a ring, chain or (alltoall) all-pairs algorithm
// that moves payload only through the data ops (coll/device/data_ops.h), on device memory (not
// managed, not host) for every buffer it uses. An empty operation touches no buffer. Sends
// and receives are never voted on (they need not line up across ranks batch by batch): they
// follow the collectives on the host connectors (runExchanges).
bool deviceNetworkCarries(const DeviceOp& op, int rank, int nranks) {
  const CollArgs& a = op.args;
  if (isExchange(a.type)) return false;
  if (a.count == 0) return true;
  const BufferUse u = bufferUse(a, rank, nranks);
  return (!u.readsSend || op.sendKind == device::PointerKind::Device) &&
         (!u.writesRecv || op.recvKind == device::PointerKind::Device);
}

// Every rank's vote on running a batch on the device network, one slot to and from every
// peer over the host connectors: all ranks then decide alike (as P2P's vote does). The vote
// also signs the batch (coll/signature.h): it carries how many collectives the batch holds and
// each one's call (packedCall; as many as fit the slot, 8 bytes each), and every rank compares
// its peers' with its own, so calls that do not match fail the batch on every rank with
// ridgeInvalidUsage instead of running the device network's algorithms on them.
struct VoteHeader {
  uint32_t vote;
  uint32_t ops;
};

size_t signedOps(size_t m, size_t slotBytes) {
  return std::min(m, (slotBytes - sizeof(VoteHeader)) / sizeof(uint64_t));
}

Task exchangeDeviceNetworkVote(ridgeComm* c, bool mine, const CollArgs* ops, size_t m, bool* all) {
  const int P = c->nranks, r = c->rank;
  const VoteHeader head{mine ? 1u : 0u, static_cast<uint32_t>(m)};
  for (int k = 1; k < P; ++k) {
    const int j = (r + k) % P;
    char* slot = static_cast<char*>(co_await AcquireSlot(c->sendTo[j]));
    std::memcpy(slot, &head, sizeof head);
    const size_t signs = signedOps(m, c->sendTo[j]->slotBytes());
    for (size_t i = 0; i < signs; ++i) {
      const CollArgs& a = ops[i];
      const uint64_t call = packedCall(deviceCallSignature(r, a.type, a.count, a.dtype, a.op, a.root));
      std::memcpy(slot + sizeof head + i * sizeof call, &call, sizeof call);
    }
    c->sendTo[j]->post(static_cast<uint32_t>(sizeof head + signs * sizeof(uint64_t)), true);
  }
  bool every = mine;
  for (int k = 1; k < P; ++k) {
    const int j = (r + P - k) % P;
    RecvConnector* rx = c->recvFrom[j];
    PeekSlot pk(rx);
    const char* slot = static_cast<const char*>(co_await pk);
    VoteHeader theirs{};
    if (pk.info.bytes >= sizeof theirs) std::memcpy(&theirs, slot, sizeof theirs);
    const size_t theirSigns = signedOps(theirs.ops, rx->slotBytes());
    if (pk.info.bytes < sizeof theirs || pk.info.bytes != sizeof theirs + theirSigns * sizeof(uint64_t))
      co_return makeError(ridgeInvalidUsage,
                          "rank %d: rank %d sent a %u-byte chunk where its device network vote was expected; "
                          "ranks queued different device operations",
                          r, j, pk.info.bytes);
    // Batches of different lengths may still line up (one rank's group, another's single
    // calls): their common start is compared.
    const size_t signs = std::min(signedOps(m, rx->slotBytes()), theirSigns);
    for (size_t i = 0; i < signs; ++i) {
      uint64_t call;
      std::memcpy(&call, slot + sizeof theirs + i * sizeof call, sizeof call);
      const CollArgs& a = ops[i];
      const OpSignature own = deviceCallSignature(r, a.type, a.count, a.dtype, a.op, a.root);
      if (call != packedCall(own))
        co_return deviceCallMismatch(r, "device network", own, j, unpackCall(call, j));
    }
    every = every && theirs.vote != 0;
    rx->release();
  }
  *all = every;
  co_return Status::ok();
}

// Whether the host connectors to every peer have a device-side producer (the gdr transport
// in write mode, docs/gdr-write.md): collectives on device buffers then run on them as on a
// device network, the device posting each slot it filled. `any`: whether one has (the same
// on every rank: the gdr transport takes every network pair, with one mode from settings).
bool hostConnectorsPostFromDevice(const ridgeComm* c, bool any) {
  bool all = c->nranks > 1, some = false;
  for (int j = 0; j < c->nranks; ++j) {
    if (j == c->rank) continue;
    const bool has = c->sendTo[j] && c->sendTo[j]->deviceProducer();
    all = all && has;
    some = some || has;
  }
  return any ? some : all;
}

Status launchOnDataOps(void* ops, DeviceProducer::Fn fn, void* arg, const void* src, size_t bytes) {
  return static_cast<DeviceDataOps*>(ops)->launch(fn, arg, src, bytes);
}

// Binds (launch set) or unbinds (null) the device-side producers of the host connectors.
void bindHostProducers(ridgeComm* c, DeviceProducer::Launch launch, void* ops) {
  for (int j = 0; j < c->nranks; ++j)
    if (DeviceProducer* dp = j != c->rank && c->sendTo[j] ? c->sendTo[j]->deviceProducer() : nullptr)
      dp->bindDeviceQueue(launch, ops);
}

// While a batch runs on the device network: the algorithms see its connectors, wait on its
// completion queue and move payload with the device data ops; everything back afterwards
// (host collectives never run meanwhile: they drain the proxy first). Without a device
// network the host connectors stay, their device-side producers bound to the data ops'
// stream.
class DeviceNetworkScope {
 public:
  DeviceNetworkScope(ridgeComm* c, DeviceDataOps* ops) : c_(c), hostWait_(c->waitTransport) {
    if (c_->device->net) {
      std::swap(c_->sendTo, c_->device->netSendTo);
      std::swap(c_->recvFrom, c_->device->netRecvFrom);
      c_->waitTransport = c_->device->net.get();
    } else {
      bindProducers(&launchOnDataOps, ops);
    }
    c_->device->data = ops;
  }
  ~DeviceNetworkScope() {
    c_->device->data = nullptr;
    c_->waitTransport = hostWait_;
    if (c_->device->net) {
      std::swap(c_->sendTo, c_->device->netSendTo);
      std::swap(c_->recvFrom, c_->device->netRecvFrom);
    } else {
      bindProducers(nullptr, nullptr);
    }
  }
  DeviceNetworkScope(const DeviceNetworkScope&) = delete;
  DeviceNetworkScope& operator=(const DeviceNetworkScope&) = delete;

 private:
  void bindProducers(DeviceProducer::Launch launch, void* ops) { bindHostProducers(c_, launch, ops); }
  ridgeComm* c_;
  Transport* hostWait_;
};

}  // namespace

Status readStagingBytes(size_t* out) {
  const std::string text = settingString(Setting::STAGING_BYTES);
  int64_t v = 0;
  if (!parseSize(text, &v) || v < static_cast<int64_t>(kMinStagingBytes) ||
      v > static_cast<int64_t>(kMaxStagingBytes))
    return makeError(ridgeInvalidArgument, "RIDGE_STAGING_BYTES=%s: expected a size from 64K to 1G",
                     text.c_str());
  *out = static_cast<size_t>(v);
  return Status::ok();
}

class GpuProxy {
 public:
  GpuProxy(ridgeComm* comm, DeviceRuntime* rt)
      : comm_(comm),
        rt_(rt),
        // Two pieces: one is copied while the host collective runs on the other.
        pieceBytes_(comm->device->stagingBytes / 2 / kCollectiveAlign * kCollectiveAlign) {}
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
    size_t chunkElems = 0;     // elements of each block per staged chunk (planChunks)
    Marker* marker = nullptr;  // created once at start, recorded on every use
    uint32_t seq = 0;          // the batch's sequence number
    bool lastOfBatch = false;
    bool skip = false;  // submission failed half-way: release without running
  };
  // What runs on one staging piece: one chunk of one collective, elements [lo, lo + n) of
  // each of its blocks, and `args`, the host operation on the piece.
  struct Step {
    size_t op = 0;  // index in the running batch
    size_t lo = 0, n = 0;
    CollArgs args{};
  };
  // Where the staged walk through a batch's collectives stands: one by one, chunk by chunk,
  // in call order (as a host group runs them); the sends and receives follow (runExchanges).
  struct StepCursor {
    size_t op = 0, chunk = 0;
  };

  Status setupOnThread();  // device binding, markers, copy stream, staging, P2P context
  void loop();
  Status runBatch(uint64_t first, size_t n);
  Status runStaged(size_t n);
  // The device network (comm->device->net): *ran when every rank voted the batch onto it.
  Status runOnDeviceNetwork(size_t n, bool* ran);
  Status runStagedSteps(size_t n);
  // The batch's sends and receives, all at once as a host group runs them (one chain per
  // peer and direction, each in order), on the device buffers themselves: each chunk is
  // copied between device memory and a connector slot by the copy engine (the device data
  // ops on the copy stream, coll/device/data_ops.h).
  // Nothing is staged, so no chain waits for another's room, and the chunks on the wire are
  // those of the same sends and receives on host memory (so ranks may group them
  // differently, or use host memory on one side).
  Status runExchanges(size_t n);
  // Fills `step` (laid out on `piece`) with the next step of the running batch; false when
  // none is left.
  bool nextStep(StepCursor& cur, size_t n, Step& step, char* piece);
  // Queues the copies of a step's inputs (device to its piece) or outputs (back).
  Status copyStep(const Step& step, bool inputs);
  // Whether `next` reads device memory that `cur` writes (a group whose later collective
  // consumes an earlier one's output): its inputs must then be copied in after cur's outputs.
  bool readsWhatItWrites(const Step& next, const Step& cur) const;
  Status waitForMarkers(uint64_t first, size_t n);
  // Polls `done` (spin, then every 50 us), bounded by the timeout and by ridgeCommAbort.
  template <class Done>
  Status pollUntil(Done done, const char* abortedWhile, const char* timedOutWhat);
  // Elements of each block per chunk, for every operation of a batch, from what every rank
  // knows alike (the staging bound, the counts, types and ranks), so that all ranks cut it
  // into the same sequence of smaller collectives and matching sends and receives.
  Status planChunks(const DeviceOp* ops, size_t n, size_t* chunkElems) const;
  // Waits, mutex_ held through `lock`, until the proxy has released every queued batch;
  // bounded by the timeout and by ridgeCommAbort.
  Status waitIdle(std::unique_lock<std::mutex>& lock);
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
  const size_t pieceBytes_;
  Slot ring_[kMaxDeviceBatchOps];
  // The running batch (proxy thread): its operations contiguous, their chunking and use.
  DeviceOp batch_[kMaxDeviceBatchOps];
  size_t chunkOf_[kMaxDeviceBatchOps];
  BufferUse useOf_[kMaxDeviceBatchOps];
  size_t planScratch_[kMaxDeviceBatchOps];    // submit's plan (mutex_ held)
  Step steps_[2];                             // by staging piece
  CollArgs exchanges_[kMaxDeviceBatchOps];    // the running batch's sends and receives
  Marker* copiedIn_[2] = {nullptr, nullptr};  // recorded after each piece's input copies
  size_t markersMade_ = 0;
  ReleaseWord word_{};                        // word_.host: null until taken
  ridgeStream_t copyStream_ = nullptr;        // an internal stream, never the legacy default (null)
  char* staging_ = nullptr;                   // 2 * pieceBytes_, pinned
  std::unique_ptr<DeviceDataOps> deviceOps_;  // on copyStream_, for the device network
  CollArgs deviceArgs_[kMaxDeviceBatchOps];   // the running batch as the algorithms take it

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
  // Sequence numbers continue from the word's value: words are recycled and must never
  // appear to go backwards to a stream still waiting on an old value.
  issued_ = __atomic_load_n(word_.host, __ATOMIC_ACQUIRE);
  // The markers and the copy stream belong to the communicator's device, which need not be
  // the caller's current one: the proxy thread binds to it and creates them there.
  // Everything that may synchronize the device implicitly (stream creation, pinned
  // allocation, peer access) happens here, before submit queues the first wait on a user's
  // stream; nothing of the kind happens later.
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
  for (Marker*& m : copiedIn_) RIDGE_TRY(rt_->createMarker(&m));
  // Kernels loaded now, while no stream of this communicator waits: a lazily loaded kernel's
  // first launch by P2P could otherwise wait for the very stream it is to release. A failure
  // (a device this build has no code for, say) is not the staged path's concern: P2P's
  // launch then reports it, as it did before there was a preload.
  const Status preload = rt_->preloadKernels();
  if (!preload.isOk())
    RIDGE_WARN("rank %d: %s: the kernels load at their first launch instead (docs/gpu.md)", comm_->rank,
               preload.message().c_str());
  RIDGE_TRY(rt_->createStream(&copyStream_));
  deviceOps_ = std::make_unique<DeviceDataOps>(rt_, copyStream_);
  RIDGE_TRY(deviceOps_->createMarkers());
  // The whole staging buffer, once: it never grows (a batch larger than a piece runs in
  // chunks), so no pinned allocation can meet a parked stream.
  void* p = nullptr;
  RIDGE_TRY(rt_->allocPinned(2 * pieceBytes_, &p));
  staging_ = static_cast<char*>(p);
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

Status GpuProxy::planChunks(const DeviceOp* ops, size_t n, size_t* chunkElems) const {
  for (size_t i = 0; i < n; ++i) {
    const CollArgs& a = ops[i].args;
    const size_t es = dataTypeSize(a.dtype);
    size_t elems = 0;
    if (isExchange(a.type)) {
      // Sends and receives are not staged: they move between device memory and the
      // connectors' slots (runExchanges), so they need no room here.
      chunkElems[i] = a.count;
      continue;
    }
    // One collective per step: its send and receive blocks, each rounded up to the
    // alignment. Counted as if every rank read and wrote both (the root-only ones and in
    // place too), so that the chunk is the same on every rank.
    const size_t perElement = (sendBlocks(a.type, comm_->nranks) + recvBlocks(a.type, comm_->nranks)) * es;
    elems = pieceBytes_ > 2 * kCollectiveAlign ? (pieceBytes_ - 2 * kCollectiveAlign) / perElement : 0;
    if (elems == 0 && a.count > 0)
      return makeError(ridgeInvalidUsage,
                       "rank %d: %s of %zu-byte elements on %d ranks: RIDGE_STAGING_BYTES=%zu (the "
                       "smallest of the ranks') leaves no room for one element per chunk; raise it",
                       comm_->rank, collTypeName(a.type), es, comm_->nranks, comm_->device->stagingBytes);
    chunkElems[i] = std::min(elems, a.count);
  }
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
  // The chunking, once per batch: the proxy runs it as planned here (P2P ignores it).
  RIDGE_TRY(planChunks(ops, n, planScratch_));
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
  const uint32_t seq = issued_ + 1;
  Status failure;
  size_t waited = 0;  // streams told to wait for seq
  for (size_t i = 0; i < n; ++i) {
    Slot& s = ring_[(head_ + i) % kMaxDeviceBatchOps];
    s.op = ops[i];
    s.chunkElems = planScratch_[i];
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
    if (abort && word_.host) release(issued_);
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (word_.host) {
    release(issued_);  // whatever is still queued: no stream may wait forever
    rt_->returnReleaseWord(word_);
    word_ = ReleaseWord{};
  }
  for (size_t i = 0; i < markersMade_; ++i) rt_->destroyMarker(ring_[i].marker);
  markersMade_ = 0;
  for (Marker*& m : copiedIn_) {
    if (m) rt_->destroyMarker(m);
    m = nullptr;
  }
  deviceOps_.reset();  // its markers
  if (copyStream_) {
    (void)rt_->synchronize(copyStream_);
    rt_->destroyStream(copyStream_);
    copyStream_ = nullptr;
  }
  if (staging_) rt_->freePinned(staging_);
  staging_ = nullptr;
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

template <class Done>
Status GpuProxy::pollUntil(Done done, const char* abortedWhile, const char* timedOutWhat) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(comm_->timeoutSec);
  for (int polls = 0;; ++polls) {
    bool ok = false;
    RIDGE_TRY(done(&ok));
    if (ok) return Status::ok();
    if (comm_->aborted.load())
      return makeError(ridgeAborted, "rank %d: communicator aborted while %s", comm_->rank, abortedWhile);
    if (std::chrono::steady_clock::now() > deadline) return timedOut(timedOutWhat);
    // The awaited work may take long: spin briefly, then poll every 50 us.
    if (polls < 200)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

Status GpuProxy::waitForMarkers(uint64_t first, size_t n) {
  return pollUntil(
      [&](bool* all) {
        *all = true;
        for (size_t i = 0; i < n && *all; ++i)
          RIDGE_TRY(rt_->queryMarker(ring_[(first + i) % kMaxDeviceBatchOps].marker, all));
        return Status::ok();
      },
      "waiting for the user's stream", "the user's stream did not reach the collective");
}

Status GpuProxy::runBatch(uint64_t first, size_t n) {
  RIDGE_TRY(waitForMarkers(first, n));
  for (size_t i = 0; i < n; ++i) {
    const Slot& s = ring_[(first + i) % kMaxDeviceBatchOps];
    batch_[i] = s.op;
    chunkOf_[i] = s.chunkElems;
  }
  // ---- P2P engine hook (src/coll/device/p2p.h): device to device when every rank's
  // batch allows it; otherwise the staged path below, unchanged.
  bool ranP2p = false;
  RIDGE_TRY(p2p::runBatch(comm_, rt_, batch_, n, &ranP2p));
  if (ranP2p) return Status::ok();
  // ---- end of the P2P hook
  bool ranDeviceNetwork = false;
  RIDGE_TRY(runOnDeviceNetwork(n, &ranDeviceNetwork));
  if (ranDeviceNetwork) return Status::ok();
  ++comm_->device->stagedBatches;
  return runStaged(n);
}

Status GpuProxy::runOnDeviceNetwork(size_t n, bool* ran) {
  *ran = false;
  // Alike on every rank: the device network is decided at init, the connectors' producers by
  // the settings.
  const bool hostProducers = !comm_->device->net && hostConnectorsPostFromDevice(comm_, /*any=*/true);
  if (!comm_->device->net && !hostProducers) return Status::ok();
  // Only the collectives are voted on and carried: every rank's batch holds the same ones in
  // the same order, while sends and receives involve some ranks only and may be grouped
  // differently at the two ends (a vote over them would pair one rank's send batch with
  // another's collective).
  bool mine = true;
  size_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    if (isExchange(batch_[i].args.type)) continue;
    mine = mine && deviceNetworkCarries(batch_[i], comm_->rank, comm_->nranks);
    deviceArgs_[m++] = batch_[i].args;
  }
  if (m == 0) return Status::ok();  // sends and receives only: staged (no vote)
  if (hostProducers) mine = mine && hostConnectorsPostFromDevice(comm_, /*any=*/false);
  bool all = false;
  Executor& ex = Executor::forThisThread();
  ex.spawn(comm_, exchangeDeviceNetworkVote(comm_, mine, deviceArgs_, m, &all));
  RIDGE_TRY(ex.run());
  if (!all) {
    ++comm_->device->netDeclined;
    return Status::ok();
  }
  *ran = true;
  ++comm_->device->netBatches;
  {
    DeviceNetworkScope scope(comm_, deviceOps_.get());
    spawnBatch(ex, comm_, deviceArgs_, m);
    Status s = ex.run();
    // Outputs that no settle covered (an allgather's or alltoall's own block) are written,
    // and nothing queued touches a slot any more, before the batch goes on or ends; after a
    // failure too (the stream holds only bounded copies and reductions).
    const Status synced = deviceOps_->synchronize();
    RIDGE_TRY(s);
    RIDGE_TRY(synced);
  }
  // Then the batch's sends and receives, as a host group runs them after its collectives.
  return runExchanges(n);
}

Status GpuProxy::runStaged(size_t n) {
  for (size_t i = 0; i < n; ++i) useOf_[i] = bufferUse(batch_[i].args, comm_->rank, comm_->nranks);
  Status s = runStagedSteps(n);
  // Copies queued on the pieces must be over before the next batch reuses them.
  if (!s.isOk()) (void)rt_->synchronize(copyStream_);
  return s.isOk() ? runExchanges(n) : s;
}

bool GpuProxy::nextStep(StepCursor& cur, size_t n, Step& step, char* piece) {
  // Sends and receives run after the collectives (runExchanges), as a host group runs them.
  while (cur.op < n && (isExchange(batch_[cur.op].args.type) || batch_[cur.op].args.count == 0)) ++cur.op;
  if (cur.op >= n) return false;
  const CollArgs& a = batch_[cur.op].args;
  const BufferUse& u = useOf_[cur.op];
  const size_t es = dataTypeSize(a.dtype), lo = cur.chunk * chunkOf_[cur.op];
  step.op = cur.op;
  step.lo = lo;
  step.n = std::min(chunkOf_[cur.op], a.count - lo);
  // The piece holds the chunk's send blocks, then (page aligned) its receive blocks.
  const size_t recvOff =
      u.readsSend ? roundUp(sendBlocks(a.type, comm_->nranks) * step.n * es, kCollectiveAlign) : 0;
  step.args = a;
  step.args.count = step.n;
  step.args.send = u.readsSend ? piece : nullptr;
  step.args.recv = u.writesRecv ? piece + recvOff : nullptr;
  if (lo + chunkOf_[cur.op] >= a.count) {
    ++cur.op;
    cur.chunk = 0;
  } else {
    ++cur.chunk;
  }
  return true;
}

Status GpuProxy::copyStep(const Step& step, bool inputs) {
  const CollArgs& a = batch_[step.op].args;
  if (!(inputs ? useOf_[step.op].readsSend : useOf_[step.op].writesRecv)) return Status::ok();
  const size_t es = dataTypeSize(a.dtype), bytes = step.n * es;
  // Block b of the chunk: elements [lo, lo + n) of the device buffer's block b, and the
  // b-th run of n elements on the piece.
  char* device = static_cast<char*>(const_cast<void*>(inputs ? a.send : a.recv)) + step.lo * es;
  char* staged = static_cast<char*>(const_cast<void*>(inputs ? step.args.send : step.args.recv));
  const size_t blocks = inputs ? sendBlocks(a.type, comm_->nranks) : recvBlocks(a.type, comm_->nranks);
  // A chunk that covers the whole operation is one contiguous range on both sides: one
  // copy instead of one per block (review M4: a small allgather on P ranks issued P + 1).
  const bool whole = step.n == a.count;
  const size_t runs = whole ? 1 : blocks, runBytes = whole ? blocks * bytes : bytes;
  for (size_t b = 0; b < runs; ++b) {
    char* d = device + b * a.count * es;
    char* h = staged + b * bytes;
    RIDGE_TRY(inputs ? rt_->copy(h, d, runBytes, copyStream_) : rt_->copy(d, h, runBytes, copyStream_));
  }
  return Status::ok();
}

bool GpuProxy::readsWhatItWrites(const Step& next, const Step& cur) const {
  // Chunks of one operation touch disjoint ranges (in place too).
  if (next.op == cur.op || !useOf_[next.op].readsSend || !useOf_[cur.op].writesRecv) return false;
  const CollArgs& r = batch_[next.op].args;
  const CollArgs& w = batch_[cur.op].args;
  return rangesOverlap(r.send, useOf_[next.op].sendCount * dataTypeSize(r.dtype), w.recv,
                       useOf_[cur.op].recvCount * dataTypeSize(w.dtype));
}

Status GpuProxy::runStagedSteps(size_t n) {
  // Two pieces, one copy stream (in order). While the host collective of step k runs on one
  // piece, the stream copies step k+1's inputs into the other, behind step k-1's outputs
  // out of it (stream order keeps a piece's outputs leaving before new inputs land on it);
  // a marker after each piece's inputs tells when step k+1 may start.
  StepCursor cursor;
  char* piece[2] = {staging_, staging_ + pieceBytes_};
  if (!nextStep(cursor, n, steps_[0], piece[0])) return Status::ok();  // nothing to move
  RIDGE_TRY(copyStep(steps_[0], true));
  RIDGE_TRY(rt_->recordMarker(copiedIn_[0], copyStream_));
  Executor& ex = Executor::forThisThread();
  for (size_t k = 0;; ++k) {
    const size_t now = k % 2, next = 1 - now;
    RIDGE_TRY(pollUntil([&](bool* done) { return rt_->queryMarker(copiedIn_[now], done); },
                        "copying a chunk to host staging", "a copy to host staging did not finish"));
    const bool more = nextStep(cursor, n, steps_[next], piece[next]);
    const bool early = more && !readsWhatItWrites(steps_[next], steps_[now]);
    if (early) {
      RIDGE_TRY(copyStep(steps_[next], true));
      RIDGE_TRY(rt_->recordMarker(copiedIn_[next], copyStream_));
    }
    // The host algorithms and transports, unchanged, on this thread's executor.
    spawnBatch(ex, comm_, &steps_[now].args, 1);
    RIDGE_TRY(ex.run());
    RIDGE_TRY(copyStep(steps_[now], false));
    if (!more) break;
    if (!early) {
      RIDGE_TRY(copyStep(steps_[next], true));
      RIDGE_TRY(rt_->recordMarker(copiedIn_[next], copyStream_));
    }
  }
  return rt_->synchronize(copyStream_);
}

Status GpuProxy::runExchanges(size_t n) {
  size_t m = 0;
  for (size_t i = 0; i < n; ++i)
    if (isExchange(batch_[i].args.type)) exchanges_[m++] = batch_[i].args;
  if (m == 0) return Status::ok();
  // Only this thread runs the communicator's operations while the batch runs (host calls
  // drain the proxy first), so the device data ops are seen by these sends and receives
  // alone.
  comm_->device->data = deviceOps_.get();
  // Connectors with a device-side producer post the chunks the copies filled as device code,
  // the host taking each slot's credits, as in collectives (sendMessage: a whole message as
  // device code only where it cannot wait for the peer).
  bindHostProducers(comm_, &launchOnDataOps, deviceOps_.get());
  Executor& ex = Executor::forThisThread();
  spawnBatch(ex, comm_, exchanges_, m);
  Status s = ex.run();
  bindHostProducers(comm_, nullptr, nullptr);
  comm_->device->data = nullptr;
  const Status synced = deviceOps_->synchronize();
  return s.isOk() ? synced : s;
}

// ---- entry points ----------------------------------------------------------------------

namespace {
std::atomic<bool> gOneRankDeviceCopy{true};
}  // namespace

void setOneRankDeviceCopyForTesting(bool on) {
  gOneRankDeviceCopy.store(on);
}

// Through the proxy a one-rank call was a staged round trip: 35 us at 1 KiB and 9 GB/s at
// 32 MiB on the first GPU run (docs/gpu.md, "First GPU run"), where NCCL's is one 7 us copy.
bool oneRankDeviceCopyTakes(const ridgeComm* comm, const DeviceOp& op) {
  return comm->nranks == 1 && !isExchange(op.args.type) && gOneRankDeviceCopy.load(std::memory_order_relaxed);
}

Status runOneRankDeviceCopy(ridgeComm* comm, DeviceRuntime* rt, const DeviceOp& op) {
  const CollArgs& a = op.args;
  const size_t bytes = bufferUse(a, 0, 1).recvCount * dataTypeSize(a.dtype);
  if (bytes == 0 || a.send == a.recv) return Status::ok();
  // Queued with the communicator's device current, as its stream's work is.
  const int previous = rt->currentDevice();
  if (previous != comm->cudaDevice) RIDGE_TRY(rt->bindThread(comm->cudaDevice));
  Status s = rt->copy(a.recv, a.send, bytes, op.stream);
  if (previous >= 0 && previous != comm->cudaDevice) (void)rt->bindThread(previous);
  if (!s.isOk()) return Status(s.code(), "rank 0 of 1: the one-rank device copy: " + s.message());
  return Status::ok();
}

Status submitDeviceBatch(ridgeComm* comm, DeviceRuntime* rt, const DeviceOp* ops, size_t n) {
  {
    std::lock_guard<std::mutex> lock(comm->device->proxyMutex);
    if (!comm->device->proxy) {
      std::unique_ptr<GpuProxy, GpuProxyDeleter> proxy(new GpuProxy(comm, rt));
      RIDGE_TRY(proxy->start());
      comm->device->proxy = std::move(proxy);
    } else if (comm->device->proxy->runtime() != rt) {
      return makeError(ridgeInternalError, "rank %d: the device runtime changed under a live communicator",
                       comm->rank);
    }
  }
  return comm->device->proxy->submit(ops, n);
}

Status drainDeviceOps(ridgeComm* comm) {
  return comm->device->proxy ? comm->device->proxy->drain() : Status::ok();
}

namespace {
// Stops the proxy (draining queued batches first unless `abort`), then the P2P context: its
// mappings and stream outlive the proxy thread that used them.
Status endProxy(ridgeComm* comm, bool abort) {
  Status s = comm->device->proxy ? comm->device->proxy->stop(abort) : Status::ok();
  comm->device->proxy.reset();
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
