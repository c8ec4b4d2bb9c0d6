#include "device/emulated_runtime.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>

#include "reduce/reduce.h"

namespace ridge::device {

namespace {

thread_local int tCurrentDevice = 0;

constexpr size_t kPageBytes = 4096;

size_t roundToPage(size_t bytes) {
  return (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
}

// What an emulated ready marker records: how many times it was recorded and how many of
// those records the stream has passed. Shared with the queued entries, so destroying a
// marker that a stream has yet to reach is safe.
struct MarkerState {
  std::atomic<uint64_t> recorded{0};
  std::atomic<uint64_t> completed{0};
};
struct EmulatedMarker {
  std::shared_ptr<MarkerState> state = std::make_shared<MarkerState>();
};

EmulatedMarker* asEmulated(Marker* m) {
  return reinterpret_cast<EmulatedMarker*>(m);
}

// Polls `done` until it holds or `timeout` passes: spin a little, then sleep in short slices.
template <class Pred>
bool boundedWait(Pred done, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int spins = 0;; ++spins) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return done();
    if (spins < 100)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// What an IPC handle of the emulator carries: the process and the exported allocation's
// device address, and for an opener in another process (setIpcAcrossProcesses) the
// exporter's memfd number, its inode (a reused fd number is told apart), size and device.
struct EmulatedIpcHandle {
  uint64_t magic;
  int64_t pid;
  uint64_t base;
  uint64_t id;  // the allocation's unique id (Region::id)
  uint64_t bytes;
  uint64_t inode;
  int32_t fd;
  int32_t device;
};
static_assert(sizeof(EmulatedIpcHandle) <= DeviceRuntime::kIpcHandleBytes, "IPC handle too large");
constexpr uint64_t kIpcMagic = 0x454d55495043ull;  // "EMUIPC"

}  // namespace

struct EmulatedRuntime::Queue {
  struct Entry {
    EntryKind kind;
    std::function<Status()> fn;
  };
  std::mutex mutex;
  // wake: the worker (an entry queued); idle: synchronize; changed: waitForStream (any
  // change of busy, running or llRun).
  std::condition_variable wake, idle, changed;
  std::deque<Entry> items;
  bool busy = false;
  EntryKind running = EntryKind::Work;  // what busy runs
  uint64_t llRun = 0;                   // LL launches finished
  bool stop = false;
  int device = 0;  // the device current on the thread that created the stream
  Status error;    // the first failure since the last synchronize
  std::thread worker;
  std::atomic<bool> capturing{false};  // what a test set with setCapturing
};

EmulatedRuntime::EmulatedRuntime(int devices) : devices_(devices) {}

EmulatedRuntime::~EmulatedRuntime() {
  std::vector<Queue*> queues;
  {
    std::lock_guard<std::mutex> lock(queuesMutex_);
    queues.assign(queues_.begin(), queues_.end());
  }
  for (Queue* q : queues) destroyStream(reinterpret_cast<ridgeStream_t>(q));
  std::lock_guard<std::mutex> lock(regionsMutex_);
  for (auto& [base, r] : regions_) {
    munmap(reinterpret_cast<void*>(base), r.bytes);
    munmap(r.alias, r.bytes);
    close(r.fd);
  }
  // Release-word pages are deliberately not freed (see ReleaseWord): a test process ends soon.
}

int EmulatedRuntime::currentDevice() {
  return tCurrentDevice;
}

Status EmulatedRuntime::bindThread(int device) {
  if (device < 0 || device >= devices_)
    return makeError(ridgeInvalidArgument, "emulated runtime: device %d out of range [0, %d)", device,
                     devices_);
  tCurrentDevice = device;
  return Status::ok();
}

PointerInfo EmulatedRuntime::classify(const void* p) {
  classifyCount_.fetch_add(1);
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(regionsMutex_);
  auto it = regions_.upper_bound(addr);
  if (it == regions_.begin()) return {};
  --it;
  if (addr >= it->first + it->second.bytes) return {};
  return {it->second.managed ? PointerKind::Managed : PointerKind::Device, it->second.device};
}

char* EmulatedRuntime::translate(const void* p, size_t bytes, Status* error) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(regionsMutex_);
  auto it = regions_.upper_bound(addr);
  if (it != regions_.begin()) {
    --it;
    if (addr < it->first + it->second.bytes) {
      if (bytes > it->first + it->second.bytes - addr) {
        *error =
            makeError(ridgeInvalidArgument,
                      "emulated runtime: %zu bytes at %p run past the end of their allocation", bytes, p);
        return nullptr;
      }
      return it->second.alias + (addr - it->first);
    }
  }
  return const_cast<char*>(static_cast<const char*>(p));  // host memory
}

Status EmulatedRuntime::allocDeviceOn(size_t bytes, void** out, int device, bool managed) {
  *out = nullptr;
  if (device < 0) device = tCurrentDevice;
  if (device >= devices_)
    return makeError(ridgeInvalidArgument, "emulated runtime: device %d out of range [0, %d)", device,
                     devices_);
  const size_t len = roundToPage(bytes ? bytes : 1);
  int fd = memfd_create("ridge-emulated-device", MFD_CLOEXEC);
  if (fd < 0) return systemError("memfd_create");
  if (ftruncate(fd, static_cast<off_t>(len)) != 0) {
    Status s = systemError("ftruncate");
    close(fd);
    return s;
  }
  // The "device" view: no access from the host unless the memory is managed.
  void* view = mmap(nullptr, len, managed ? PROT_READ | PROT_WRITE : PROT_NONE, MAP_SHARED, fd, 0);
  void* alias = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (view == MAP_FAILED || alias == MAP_FAILED) {
    Status s = systemError("mmap of emulated device memory");
    if (view != MAP_FAILED) munmap(view, len);
    if (alias != MAP_FAILED) munmap(alias, len);
    close(fd);
    return s;
  }
  deviceAllocCount_.fetch_add(1);
  std::lock_guard<std::mutex> lock(regionsMutex_);
  regions_[reinterpret_cast<uintptr_t>(view)] =
      Region{len, device, managed, static_cast<char*>(alias), fd, 0, nextAllocationId_++};
  *out = view;
  return Status::ok();
}

bool EmulatedRuntime::streamsIdle(int device) {
  std::lock_guard<std::mutex> lock(queuesMutex_);
  for (Queue* q : queues_) {
    if (q->device != device) continue;
    std::lock_guard<std::mutex> ql(q->mutex);
    if (q->busy || !q->items.empty()) return false;
  }
  return true;
}

void EmulatedRuntime::freeDevice(void* p) {
  if (freesWaitForStreams_.load()) {
    int device = -1;
    {
      std::lock_guard<std::mutex> lock(regionsMutex_);
      auto it = regions_.find(reinterpret_cast<uintptr_t>(p));
      if (it != regions_.end()) device = it->second.device;
    }
    if (device >= 0 && !boundedWait([&] { return streamsIdle(device); }, waitTimeout()))
      freesStalled_.fetch_add(1);
  }
  std::lock_guard<std::mutex> lock(regionsMutex_);
  auto it = regions_.find(reinterpret_cast<uintptr_t>(p));
  if (it == regions_.end()) return;
  munmap(p, it->second.bytes);
  munmap(it->second.alias, it->second.bytes);
  close(it->second.fd);
  regions_.erase(it);
}

Status EmulatedRuntime::exportDmaBuf(const void* base, size_t bytes, int* fd) {
  *fd = -1;
  if (!dmaBufSupported_.load())
    return makeError(ridgeSystemError, "emulated runtime: dma-buf export turned off by the test");
  std::lock_guard<std::mutex> lock(regionsMutex_);
  auto it = regionHolding(base);
  // The dup maps the whole allocation from offset 0, so only a range that starts at the
  // allocation's base is a buffer whose offset 0 is the range's start (what a registration
  // of the fd assumes); the range must end inside the allocation.
  if (it == regions_.end() || it->second.managed || reinterpret_cast<uintptr_t>(base) != it->first ||
      bytes == 0 || bytes > it->second.bytes || bytes % 4096 != 0)
    return makeError(
        ridgeInvalidArgument,
        "emulated runtime: exportDmaBuf(%p, %zu): not a page-aligned range that starts at the base "
        "of an emulated device allocation",
        base, bytes);
  *fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (*fd < 0) return systemError("emulated runtime: dup of a device allocation's memfd");
  dmaBufExports_.fetch_add(1);
  return Status::ok();
}

Status EmulatedRuntime::copyToDevice(void* dst, const void* src, size_t bytes) {
  Status s;
  char* d = translate(dst, bytes, &s);
  if (!d) return s;
  std::memcpy(d, src, bytes);
  return Status::ok();
}

Status EmulatedRuntime::copyToHost(void* dst, const void* src, size_t bytes) {
  Status s;
  const char* from = translate(src, bytes, &s);
  if (!from) return s;
  std::memcpy(dst, from, bytes);
  return Status::ok();
}

// ---- streams ---------------------------------------------------------------------------

Status EmulatedRuntime::createStream(ridgeStream_t* out) {
  noteSynchronizingCall();
  auto* q = new Queue();
  q->device = tCurrentDevice;
  q->worker = std::thread([this, q] { workerLoop(q); });
  std::lock_guard<std::mutex> lock(queuesMutex_);
  queues_.insert(q);
  *out = reinterpret_cast<ridgeStream_t>(q);
  return Status::ok();
}

void EmulatedRuntime::destroyStream(ridgeStream_t stream) {
  auto* q = reinterpret_cast<Queue*>(stream);
  {
    std::lock_guard<std::mutex> lock(queuesMutex_);
    if (!queues_.erase(q)) return;
    if (q == defaultQueue_) defaultQueue_ = nullptr;
  }
  {
    // The worker finishes what is queued (every entry is bounded) and leaves.
    std::lock_guard<std::mutex> lock(q->mutex);
    q->stop = true;
  }
  q->wake.notify_all();
  q->worker.join();
  delete q;
}

EmulatedRuntime::Queue* EmulatedRuntime::queueOf(ridgeStream_t stream, Status* error) {
  std::lock_guard<std::mutex> lock(queuesMutex_);
  if (!stream) {
    if (!defaultQueue_) {
      defaultQueue_ = new Queue();
      Queue* q = defaultQueue_;
      q->worker = std::thread([this, q] { workerLoop(q); });
      queues_.insert(q);
    }
    return defaultQueue_;
  }
  auto* q = reinterpret_cast<Queue*>(stream);
  if (!queues_.count(q)) {
    *error = makeError(ridgeInvalidArgument, "stream %p is not a live stream of the emulated runtime",
                       static_cast<void*>(stream));
    return nullptr;
  }
  return q;
}

void EmulatedRuntime::workerLoop(Queue* q) {
  std::unique_lock<std::mutex> lock(q->mutex);
  for (;;) {
    q->wake.wait(lock, [q] { return q->stop || !q->items.empty(); });
    if (q->items.empty()) return;  // stop requested and nothing left
    Queue::Entry entry = std::move(q->items.front());
    q->items.pop_front();
    q->busy = true;
    q->running = entry.kind;
    q->changed.notify_all();
    lock.unlock();
    Status s = entry.fn();
    lock.lock();
    q->busy = false;
    if (entry.kind == EntryKind::LLLaunch) ++q->llRun;
    if (!s.isOk() && q->error.isOk()) q->error = s;
    if (q->items.empty()) q->idle.notify_all();
    q->changed.notify_all();
  }
}

Status EmulatedRuntime::enqueue(ridgeStream_t stream, std::function<Status()> fn) {
  return enqueueAs(stream, EntryKind::Work, std::move(fn));
}

Status EmulatedRuntime::enqueueAs(ridgeStream_t stream, EntryKind kind, std::function<Status()> fn) {
  Status s;
  Queue* q = queueOf(stream, &s);
  if (!q) return s;
  {
    std::lock_guard<std::mutex> lock(q->mutex);
    q->items.push_back(Queue::Entry{kind, std::move(fn)});
  }
  q->wake.notify_one();
  return Status::ok();
}

void EmulatedRuntime::StreamGate::open() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
  }
  opened_.notify_all();
}

bool EmulatedRuntime::StreamGate::isOpen() {
  std::lock_guard<std::mutex> lock(mutex_);
  return open_;
}

Status EmulatedRuntime::enqueueGate(ridgeStream_t stream, std::shared_ptr<StreamGate> gate) {
  return enqueueAs(stream, EntryKind::Gate, [this, gate] {
    std::unique_lock<std::mutex> lock(gate->mutex_);
    if (gate->opened_.wait_for(lock, waitTimeout(), [&] { return gate->open_; })) return Status::ok();
    return makeError(ridgeTimeout, "emulated stream: a test's gate stayed closed for %lld ms",
                     static_cast<long long>(waitTimeout().count()));
  });
}

bool EmulatedRuntime::waitForStream(ridgeStream_t stream,
                                    const std::function<bool(const StreamState&)>& stuck,
                                    std::chrono::milliseconds timeout) {
  Status ignored;
  Queue* q = queueOf(stream, &ignored);
  if (!q) return false;
  auto state = [q] {
    StreamState st;
    st.idle = !q->busy && q->items.empty();
    st.llLaunchesRun = q->llRun;
    if (q->busy) {
      switch (q->running) {
        case EntryKind::MarkerWait: st.waiting = Waiting::Marker; break;
        case EntryKind::Gate: st.waiting = Waiting::Gate; break;
        case EntryKind::WordWait: st.waiting = Waiting::Word; break;
        default: break;
      }
    }
    return st;
  };
  std::unique_lock<std::mutex> lock(q->mutex);
  return q->changed.wait_for(lock, timeout, [&] { return stuck(state()); });
}

Status EmulatedRuntime::synchronize(ridgeStream_t stream) {
  Status s;
  Queue* q = queueOf(stream, &s);
  if (!q) return s;
  // Each queued wait gives up after waitTimeout(); a stream holding several may take a few.
  const auto bound = waitTimeout() * 4 + std::chrono::seconds(1);
  std::unique_lock<std::mutex> lock(q->mutex);
  if (!q->idle.wait_for(lock, bound, [q] { return q->items.empty() && !q->busy; }))
    return makeError(ridgeInternalError, "emulated stream %p did not drain within %lld ms",
                     static_cast<void*>(stream), static_cast<long long>(bound.count()));
  Status error = std::move(q->error);
  q->error = Status();
  return error;
}

Status EmulatedRuntime::isCapturing(ridgeStream_t stream, bool* capturing) {
  Status s;
  Queue* q = queueOf(stream, &s);
  if (!q) return s;
  *capturing = q->capturing.load();
  return Status::ok();
}

Status EmulatedRuntime::setCapturing(ridgeStream_t stream, bool capturing) {
  Status s;
  Queue* q = queueOf(stream, &s);
  if (!q) return s;
  q->capturing.store(capturing);
  return Status::ok();
}

// ---- markers and release words ---------------------------------------------------------

Status EmulatedRuntime::createMarker(Marker** out) {
  *out = reinterpret_cast<Marker*>(new EmulatedMarker());
  return Status::ok();
}

void EmulatedRuntime::destroyMarker(Marker* m) {
  delete asEmulated(m);
}

Status EmulatedRuntime::recordMarker(Marker* m, ridgeStream_t stream) {
  std::shared_ptr<MarkerState> state = asEmulated(m)->state;
  const uint64_t generation = state->recorded.fetch_add(1) + 1;
  return enqueue(stream, [state, generation] {
    state->completed.store(generation, std::memory_order_release);
    return Status::ok();
  });
}

Status EmulatedRuntime::queryMarker(Marker* m, bool* done) {
  const MarkerState& st = *asEmulated(m)->state;
  *done = st.completed.load(std::memory_order_acquire) >= st.recorded.load(std::memory_order_relaxed);
  return Status::ok();
}

Status EmulatedRuntime::waitWord(ridgeStream_t stream, const ReleaseWord& word, uint32_t value) {
  Status s;
  Queue* q = queueOf(stream, &s);
  if (!q) return s;
  releaseWaits_.fetch_add(1);
  volatile uint32_t* w = word.host;
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(pendingMutex_);
    id = nextPendingId_++;
    pending_[id] = PendingWait{q->device, w, value};
  }
  s = enqueueAs(stream, EntryKind::WordWait, [this, w, value, id] {
    auto reached = [w, value] { return sequenceReached(__atomic_load_n(w, __ATOMIC_ACQUIRE), value); };
    const bool ok = boundedWait(reached, waitTimeout());
    {
      std::lock_guard<std::mutex> lock(pendingMutex_);
      pending_.erase(id);
    }
    if (ok) return Status::ok();
    return makeError(ridgeTimeout, "emulated stream: release word stayed at %u, below %u, for %lld ms", *w,
                     value, static_cast<long long>(waitTimeout().count()));
  });
  if (!s.isOk()) {
    std::lock_guard<std::mutex> lock(pendingMutex_);
    pending_.erase(id);
  }
  return s;
}

bool EmulatedRuntime::releaseWaitPending(int device) {
  std::lock_guard<std::mutex> lock(pendingMutex_);
  for (const auto& [id, p] : pending_)
    if (p.device == device && !sequenceReached(__atomic_load_n(p.word, __ATOMIC_ACQUIRE), p.value))
      return true;
  return false;
}

void EmulatedRuntime::noteSynchronizingCall() {
  if (releaseWaitPending(tCurrentDevice)) allocationsWhileStreamsWait_.fetch_add(1);
}

Status EmulatedRuntime::mapHostRange(void* addr, size_t bytes, HostRangeKind kind, uint64_t* deviceAddress) {
  std::lock_guard<std::mutex> g(hostRangesMutex_);
  auto fail = hostRangeFailures_.find(kind);
  if (fail != hostRangeFailures_.end())
    return makeError(ridgeUnhandledCudaError, "emulated mapHostRange(%p, %zu bytes): %s", addr, bytes,
                     fail->second.c_str());
  const uintptr_t start = reinterpret_cast<uintptr_t>(addr);
  if (!addr || bytes == 0) return makeError(ridgeInvalidArgument, "emulated mapHostRange: empty range");
  auto next = hostRanges_.lower_bound(start);
  const bool overlapsNext = next != hostRanges_.end() && next->first < start + bytes;
  const bool overlapsPrev =
      next != hostRanges_.begin() && std::prev(next)->first + std::prev(next)->second > start;
  if (overlapsNext || overlapsPrev)
    return makeError(ridgeUnhandledCudaError, "emulated mapHostRange(%p, %zu bytes): overlaps a mapped range",
                     addr, bytes);
  hostRanges_[start] = bytes;
  *deviceAddress = start;
  return Status::ok();
}

Status EmulatedRuntime::unmapHostRange(void* addr) {
  std::lock_guard<std::mutex> g(hostRangesMutex_);
  if (hostRanges_.erase(reinterpret_cast<uintptr_t>(addr)) == 0)
    return makeError(ridgeInvalidArgument, "emulated unmapHostRange(%p): not mapped", addr);
  return Status::ok();
}

void EmulatedRuntime::failHostRangeMaps(HostRangeKind kind, std::string why) {
  std::lock_guard<std::mutex> g(hostRangesMutex_);
  hostRangeFailures_[kind] = std::move(why);
}

size_t EmulatedRuntime::mappedHostRanges() {
  std::lock_guard<std::mutex> g(hostRangesMutex_);
  return hostRanges_.size();
}

Status EmulatedRuntime::allocWordPage(size_t bytes, void** host, uint64_t* deviceAddress) {
  void* p = std::aligned_alloc(kPageBytes, roundToPage(bytes));
  if (!p) return makeError(ridgeSystemError, "emulated runtime: no memory for release words");
  std::memset(p, 0, roundToPage(bytes));
  *host = p;
  *deviceAddress = reinterpret_cast<uintptr_t>(p);
  return Status::ok();
}

// ---- data movement ---------------------------------------------------------------------

void EmulatedRuntime::setWorkDelay(int device, std::chrono::microseconds delay) {
  if (device >= 0 && static_cast<size_t>(device) < workDelayUs_.size())
    workDelayUs_[device].store(delay.count());
}

int64_t EmulatedRuntime::workDelayOf(ridgeStream_t stream) {
  Status ignored;
  Queue* q = queueOf(stream, &ignored);
  if (!q || q->device < 0 || static_cast<size_t>(q->device) >= workDelayUs_.size()) return 0;
  return workDelayUs_[q->device].load();
}

int EmulatedRuntime::workQueued(ridgeStream_t stream) {
  Status ignored;
  Queue* q = queueOf(stream, &ignored);
  if (!q || q->device < 0 || static_cast<size_t>(q->device) >= workInFlight_.size()) return -1;
  const int64_t now = workInFlight_[q->device].fetch_add(1) + 1;
  int64_t peak = workInFlightPeak_[q->device].load();
  while (now > peak && !workInFlightPeak_[q->device].compare_exchange_weak(peak, now)) {
  }
  return q->device;
}

void EmulatedRuntime::workFinished(int device) {
  if (device >= 0) workInFlight_[device].fetch_sub(1);
}

int64_t EmulatedRuntime::workInFlightPeak(int device) {
  return device >= 0 && static_cast<size_t>(device) < workInFlightPeak_.size()
             ? workInFlightPeak_[device].load()
             : 0;
}

int64_t EmulatedRuntime::workInFlight(int device) {
  return device >= 0 && static_cast<size_t>(device) < workInFlight_.size() ? workInFlight_[device].load() : 0;
}

void EmulatedRuntime::resetWorkInFlightPeak(int device) {
  if (device >= 0 && static_cast<size_t>(device) < workInFlightPeak_.size())
    workInFlightPeak_[device].store(workInFlight_[device].load());
}

Status EmulatedRuntime::copy(void* dst, const void* src, size_t bytes, ridgeStream_t stream) {
  if (copiesWaitForReleases_.load()) {
    const int device = tCurrentDevice;
    (void)boundedWait([this, device] { return !releaseWaitPending(device); }, waitTimeout());
  }
  Status s;
  char* d = translate(dst, bytes, &s);
  const char* from = d ? translate(src, bytes, &s) : nullptr;
  if (!from) return s;
  const int64_t delayUs = workDelayOf(stream);
  size_t index = SIZE_MAX;  // this copy's record in the log; SIZE_MAX: not recorded
  if (recordCopies_.load()) {
    std::lock_guard<std::mutex> lock(copyLogMutex_);
    index = copyLog_.size();
    copyLog_.push_back(CopyRecord{++eventCount_, 0, dst, src, bytes});
  }
  const int counted = workQueued(stream);
  s = enqueue(stream, [this, d, from, bytes, index, delayUs, counted] {
    if (delayUs) std::this_thread::sleep_for(std::chrono::microseconds(delayUs));
    std::memmove(d, from, bytes);
    if (index != SIZE_MAX) {
      std::lock_guard<std::mutex> lock(copyLogMutex_);
      if (index < copyLog_.size()) copyLog_[index].ran = ++eventCount_;
    }
    workFinished(counted);
    return Status::ok();
  });
  if (!s.isOk()) workFinished(counted);
  return s;
}

void EmulatedRuntime::setRecordCopies(bool on) {
  std::lock_guard<std::mutex> lock(copyLogMutex_);
  if (on) copyLog_.clear();
  recordCopies_.store(on);
}

std::vector<EmulatedRuntime::CopyRecord> EmulatedRuntime::copyLog() {
  std::lock_guard<std::mutex> lock(copyLogMutex_);
  return std::vector<CopyRecord>(copyLog_.begin(), copyLog_.end());
}

Status EmulatedRuntime::allocPinned(size_t bytes, void** out) {
  noteSynchronizingCall();
  *out = std::aligned_alloc(kPageBytes, roundToPage(bytes ? bytes : 1));
  if (!*out) return makeError(ridgeSystemError, "emulated runtime: no memory for %zu pinned bytes", bytes);
  std::lock_guard<std::mutex> lock(pinnedMutex_);
  pinned_[*out] = bytes;
  pinnedNow_ += bytes;
  pinnedPeak_ = std::max(pinnedPeak_, pinnedNow_);
  pinnedLargest_ = std::max(pinnedLargest_, bytes);
  return Status::ok();
}

void EmulatedRuntime::freePinned(void* p) {
  noteSynchronizingCall();
  {
    std::lock_guard<std::mutex> lock(pinnedMutex_);
    auto it = pinned_.find(p);
    if (it != pinned_.end()) {
      pinnedNow_ -= it->second;
      pinned_.erase(it);
    }
  }
  std::free(p);
}

size_t EmulatedRuntime::largestPinnedAllocation() {
  std::lock_guard<std::mutex> lock(pinnedMutex_);
  return pinnedLargest_;
}

size_t EmulatedRuntime::pinnedBytesPeak() {
  std::lock_guard<std::mutex> lock(pinnedMutex_);
  return pinnedPeak_;
}

size_t EmulatedRuntime::pinnedBytesNow() {
  std::lock_guard<std::mutex> lock(pinnedMutex_);
  return pinnedNow_;
}

Status EmulatedRuntime::launchDeviceFunction(DeviceFunction fn, void* arg, const void* src, size_t bytes,
                                             ridgeStream_t stream) {
  if (!runsDeviceFunction(fn))
    return Status(ridgeInvalidUsage,
                  "emulated runtime (kernel twins only): this device function has no twin");
  Status s;
  const char* from = translate(src, bytes, &s);
  if (!from) return s;
  return enqueue(stream, [fn, arg, from, bytes] {
    fn(arg, from, bytes);
    return Status::ok();
  });
}

Status EmulatedRuntime::launchReduce(void* dst, const void* const* srcs, int nsrcs, size_t count,
                                     ridgeDataType_t type, ridgeRedOp_t op, int finalDivisor,
                                     ridgeStream_t stream) {
  constexpr int kMaxSources = 8;  // as kernels/device_reduce.h
  if (nsrcs < 1 || nsrcs > kMaxSources)
    return makeError(ridgeInvalidArgument, "emulated reduce: %d sources (1..%d)", nsrcs, kMaxSources);
  const size_t bytes = count * dataTypeSize(type);
  Status s;
  char* d = translate(dst, bytes, &s);
  if (!d) return s;
  std::array<const void*, kMaxSources> from{};
  for (int i = 0; i < nsrcs; ++i)
    if (!(from[i] = translate(srcs[i], bytes, &s))) return s;
  reduceCount_.fetch_add(1);
  bool aligned = reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  for (int i = 0; i < nsrcs; ++i) aligned = aligned && reinterpret_cast<uintptr_t>(srcs[i]) % 16 == 0;
  if (!aligned) misalignedReduceCount_.fetch_add(1);
  bool loaded;
  {
    std::lock_guard<std::mutex> lock(preloadMutex_);
    loaded = preloaded_.count(tCurrentDevice) > 0;
  }
  if (!loaded && releaseWaitPending(tCurrentDevice)) launchesBeforePreload_.fetch_add(1);
  const int64_t delayUs = workDelayOf(stream);
  const int counted = workQueued(stream);
  if (counted >= 0) reduceCountByDevice_[counted].fetch_add(1);
  s = enqueue(stream, [=, this] {
    if (delayUs) std::this_thread::sleep_for(std::chrono::microseconds(delayUs));
    reduceMany(d, from.data(), nsrcs, count, type, op, finalDivisor);
    workFinished(counted);
    return Status::ok();
  });
  if (!s.isOk()) workFinished(counted);
  return s;
}

Status EmulatedRuntime::preloadKernels() {
  std::lock_guard<std::mutex> lock(preloadMutex_);
  preloaded_.insert(tCurrentDevice);
  return Status::ok();
}

size_t EmulatedRuntime::kernelPreloads() {
  std::lock_guard<std::mutex> lock(preloadMutex_);
  return preloaded_.size();
}

// ---- IPC -------------------------------------------------------------------------------

Status EmulatedRuntime::ipcExport(void* devicePtr, IpcHandle* out) {
  std::lock_guard<std::mutex> lock(regionsMutex_);
  auto it = regions_.find(reinterpret_cast<uintptr_t>(devicePtr));
  if (it == regions_.end() || it->second.managed)
    return makeError(ridgeInvalidArgument, "ipcExport: %p is not the base of an emulated device allocation",
                     devicePtr);
  struct stat st {};
  const uint64_t inode = fstat(it->second.fd, &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
  EmulatedIpcHandle h{kIpcMagic,        getpid(), it->first,     it->second.id,
                      it->second.bytes, inode,    it->second.fd, it->second.device};
  std::memset(out, 0, sizeof *out);
  std::memcpy(out->bytes, &h, sizeof h);
  ipcExportCount_.fetch_add(1);
  return Status::ok();
}

Status EmulatedRuntime::ipcOpen(const IpcHandle& handle, void** devicePtr) {
  EmulatedIpcHandle h;
  std::memcpy(&h, handle.bytes, sizeof h);
  if (h.magic != kIpcMagic) return makeError(ridgeInvalidArgument, "ipcOpen: not an emulated IPC handle");
  int failuresLeft = ipcOpenFailures_.load();
  while (failuresLeft > 0 && !ipcOpenFailures_.compare_exchange_weak(failuresLeft, failuresLeft - 1)) {
  }
  if (failuresLeft > 0)
    return makeError(ridgeSystemError, "ipcOpen: failure injected by the test (failNextIpcOpens)");
  if (h.pid != getpid() && !ipcAcrossProcesses_.load())
    return makeError(ridgeInvalidUsage,
                     "ipcOpen: the emulated runtime shares memory within one process only");
  if (h.pid != getpid()) return openOfAnotherProcess(handle, devicePtr);
  std::lock_guard<std::mutex> lock(regionsMutex_);
  auto it = regions_.find(h.base);
  if (it == regions_.end() || it->second.id != h.id)
    return makeError(ridgeInvalidArgument, "ipcOpen: the exported allocation was freed");
  Region r = it->second;
  // A second device view and alias of the same memory, as another process would map it.
  void* view = mmap(nullptr, r.bytes, PROT_NONE, MAP_SHARED, r.fd, 0);
  void* alias = mmap(nullptr, r.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd, 0);
  int fd = dup(r.fd);
  if (view == MAP_FAILED || alias == MAP_FAILED || fd < 0) {
    Status s = systemError("ipcOpen: mapping the exported allocation");
    if (view != MAP_FAILED) munmap(view, r.bytes);
    if (alias != MAP_FAILED) munmap(alias, r.bytes);
    if (fd >= 0) close(fd);
    return s;
  }
  regions_[reinterpret_cast<uintptr_t>(view)] =
      Region{r.bytes, r.device, false, static_cast<char*>(alias), fd, 1, r.id};
  ipcOpenCount_.fetch_add(1);
  *devicePtr = view;
  return Status::ok();
}

Status EmulatedRuntime::openOfAnotherProcess(const IpcHandle& handle, void** devicePtr) {
  EmulatedIpcHandle h;
  std::memcpy(&h, handle.bytes, sizeof h);
  const std::string path = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return systemError(("ipcOpen: opening the exporter's memory " + path).c_str());
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_ino) != h.inode ||
      static_cast<uint64_t>(st.st_size) < h.bytes) {
    close(fd);
    return makeError(ridgeInvalidArgument, "ipcOpen: the exported allocation of process %lld was freed",
                     static_cast<long long>(h.pid));
  }
  void* view = mmap(nullptr, h.bytes, PROT_NONE, MAP_SHARED, fd, 0);
  void* alias = mmap(nullptr, h.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (view == MAP_FAILED || alias == MAP_FAILED) {
    Status s = systemError("ipcOpen: mapping another process's allocation");
    if (view != MAP_FAILED) munmap(view, h.bytes);
    if (alias != MAP_FAILED) munmap(alias, h.bytes);
    close(fd);
    return s;
  }
  std::lock_guard<std::mutex> lock(regionsMutex_);
  // The id is the exporter's; it only has to be unique among this runtime's regions for the
  // P2P cache, which keys on the opener's view address.
  regions_[reinterpret_cast<uintptr_t>(view)] =
      Region{h.bytes, h.device, false, static_cast<char*>(alias), fd, 1, nextAllocationId_++};
  ipcOpenCount_.fetch_add(1);
  *devicePtr = view;
  return Status::ok();
}

Status EmulatedRuntime::ipcClose(void* devicePtr) {
  noteSynchronizingCall();
  {
    std::lock_guard<std::mutex> lock(regionsMutex_);
    auto it = regions_.find(reinterpret_cast<uintptr_t>(devicePtr));
    if (it == regions_.end() || it->second.ipcOpens == 0)
      return makeError(ridgeInvalidArgument, "ipcClose: %p was not opened with ipcOpen", devicePtr);
  }
  freeDevice(devicePtr);
  return Status::ok();
}

// ---- P2P -------------------------------------------------------------------------------

std::map<uintptr_t, EmulatedRuntime::Region>::iterator EmulatedRuntime::regionHolding(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = regions_.upper_bound(addr);
  if (it == regions_.begin()) return regions_.end();
  --it;
  return addr < it->first + it->second.bytes ? it : regions_.end();
}

DeviceRuntime::PeerLink EmulatedRuntime::peerLink(int deviceA, int deviceB) {
  if (deviceA < 0 || deviceB < 0 || deviceA >= devices_ || deviceB >= devices_) return {};
  if (deviceA == deviceB) return {true, PeerLinkKind::SameDevice};
  return {peerAccess_.load(), static_cast<PeerLinkKind>(peerKind_.load())};
}

Status EmulatedRuntime::enablePeerAccess(int peerDevice) {
  noteSynchronizingCall();
  if (!peerLink(tCurrentDevice, peerDevice).allowed)
    return makeError(ridgeInvalidUsage, "emulated runtime: device %d cannot access device %d", tCurrentDevice,
                     peerDevice);
  return Status::ok();
}

Status EmulatedRuntime::allocationRange(const void* p, void** base, size_t* bytes) {
  std::lock_guard<std::mutex> lock(regionsMutex_);
  auto it = regionHolding(p);
  if (it != regions_.end()) {
    *base = reinterpret_cast<void*>(it->first);
    *bytes = it->second.bytes;
    return Status::ok();
  }
  return makeError(ridgeInvalidArgument, "allocationRange: %p is not emulated device memory", p);
}

Status EmulatedRuntime::allocationId(const void* p, uint64_t* id) {
  if (!allocationIdsSupported_.load())
    return makeError(ridgeSystemError, "allocationId: turned off by the test (setAllocationIdsSupported)");
  std::lock_guard<std::mutex> lock(regionsMutex_);
  auto it = regionHolding(p);
  if (it == regions_.end())
    return makeError(ridgeInvalidArgument, "allocationId: %p is not emulated device memory", p);
  *id = it->second.id;
  return Status::ok();
}

Status EmulatedRuntime::reallocateInPlace(void* base) {
  std::lock_guard<std::mutex> lock(regionsMutex_);
  auto it = regions_.find(reinterpret_cast<uintptr_t>(base));
  if (it == regions_.end() || it->second.ipcOpens > 0)
    return makeError(ridgeInvalidArgument, "reallocateInPlace: %p is not the base of an allocation", base);
  Region& r = it->second;
  int fd = memfd_create("ridge-emulated-device", MFD_CLOEXEC);
  if (fd < 0) return systemError("memfd_create");
  if (ftruncate(fd, static_cast<off_t>(r.bytes)) != 0) {
    Status s = systemError("ftruncate");
    close(fd);
    return s;
  }
  void* alias = mmap(nullptr, r.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  // MAP_FIXED over the old view: the old mapping goes and the new one takes its place at once.
  void* view = alias == MAP_FAILED ? MAP_FAILED
                                   : mmap(base, r.bytes, r.managed ? PROT_READ | PROT_WRITE : PROT_NONE,
                                          MAP_SHARED | MAP_FIXED, fd, 0);
  if (view != base) {
    Status s = systemError("reallocateInPlace: mapping the new allocation");
    if (alias != MAP_FAILED) munmap(alias, r.bytes);
    close(fd);
    return s;
  }
  munmap(r.alias, r.bytes);
  close(r.fd);
  r.alias = static_cast<char*>(alias);
  r.fd = fd;
  r.id = nextAllocationId_++;
  return Status::ok();
}

std::string EmulatedRuntime::pciBusId(int device) {
  std::lock_guard<std::mutex> lock(regionsMutex_);
  return device >= 0 && static_cast<size_t>(device) < busIds_.size() ? busIds_[static_cast<size_t>(device)]
                                                                     : "";
}

int EmulatedRuntime::deviceByPciBusId(const std::string& busId) {
  std::lock_guard<std::mutex> lock(regionsMutex_);
  for (size_t i = 0; i < busIds_.size(); ++i) {
    if (busId.empty() || busIds_[i] != busId) continue;
    auto v = visibleFrom_.find(tCurrentDevice);
    const int device = static_cast<int>(i);
    if (v != visibleFrom_.end() && std::find(v->second.begin(), v->second.end(), device) == v->second.end())
      return -1;
    return device;
  }
  return -1;
}

size_t EmulatedRuntime::ipcViewsOpen() {
  std::lock_guard<std::mutex> lock(regionsMutex_);
  size_t n = 0;
  for (const auto& [base, r] : regions_) n += r.ipcOpens > 0 ? 1 : 0;
  return n;
}

size_t EmulatedRuntime::liveDeviceAllocations() {
  std::lock_guard<std::mutex> lock(regionsMutex_);
  size_t n = 0;
  for (const auto& [base, r] : regions_) n += r.ipcOpens == 0 ? 1 : 0;
  return n;
}

}  // namespace ridge::device

// ---- LL collectives ---------------------------------------------------------------------

namespace ridge::device {

namespace {

// The emulator's environment for the LL per-line logic (kernels/ll_collective.h). Lines
// move as two 8-byte halves, each {4 data bytes, flag}, with release stores and acquire
// loads: the 8-byte unit a peer sees whole, as on the GPU.
struct EmulatedLLEnv {
  ridgeDataType_t type;
  ridgeRedOp_t op;
  volatile uint32_t* status;
  uint32_t statusBase;
  std::chrono::steady_clock::time_point deadline;

  static uint64_t half(uint32_t data, uint32_t flag) { return uint64_t(data) | (uint64_t(flag) << 32); }

  void store(ll::Line* p, const ll::Line& l) const {
    auto* w = reinterpret_cast<uint64_t*>(p);
    __atomic_store_n(w, half(l.data0, l.flag0), __ATOMIC_RELEASE);
    __atomic_store_n(w + 1, half(l.data1, l.flag1), __ATOMIC_RELEASE);
  }

  // Spins (yielding) until the line carries `flag`; false when the status word is set or
  // the deadline passed (then it sets the word to base + kTimedOut, as the kernel does).
  bool wait(const ll::Line* p, uint32_t flag, ll::Line* out) const {
    const auto* w = reinterpret_cast<const uint64_t*>(p);
    constexpr uint64_t kPollsPerCheck = 64;
    constexpr uint64_t kMaxPolls = uint64_t(1) << 40;  // a bound in count too
    for (uint64_t polls = 1; polls <= kMaxPolls; ++polls) {
      const uint64_t lo = __atomic_load_n(w, __ATOMIC_ACQUIRE), hi = __atomic_load_n(w + 1, __ATOMIC_ACQUIRE);
      ll::Line l{uint32_t(lo), uint32_t(lo >> 32), uint32_t(hi), uint32_t(hi >> 32)};
      if (ll::ready(l, flag)) {
        *out = l;
        return true;
      }
      if (polls % kPollsPerCheck == 0) {
        if (__atomic_load_n(status, __ATOMIC_ACQUIRE) != statusBase) return false;
        if (std::chrono::steady_clock::now() >= deadline) break;
      }
      std::this_thread::yield();
    }
    uint32_t expected = statusBase;
    __atomic_compare_exchange_n(status, &expected, statusBase + ll::kTimedOut, false, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
    return false;
  }

  // Stops the launch with statusBase + `code` (unless the word already left statusBase).
  void fail(uint32_t code) const {
    uint32_t expected = statusBase;
    __atomic_compare_exchange_n(status, &expected, statusBase + code, false, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
  }

  uint64_t reduce(const uint64_t* srcs, int n, int elems, int divisor) const {
    const void* from[ll::kMaxRanks];
    for (int k = 0; k < n; ++k) from[k] = &srcs[k];
    uint64_t out = 0;
    reduceMany(&out, from, n, static_cast<size_t>(elems), type, op, divisor);
    return out;
  }
};

}  // namespace

Status EmulatedRuntime::waitMarker(ridgeStream_t stream, Marker* m) {
  std::shared_ptr<MarkerState> state = asEmulated(m)->state;
  const uint64_t generation = state->recorded.load();
  return enqueueAs(stream, EntryKind::MarkerWait, [this, state, generation] {
    auto passed = [&] { return state->completed.load(std::memory_order_acquire) >= generation; };
    if (boundedWait(passed, waitTimeout())) return Status::ok();
    return makeError(ridgeTimeout, "emulated stream: a marker wait did not pass within %lld ms",
                     static_cast<long long>(waitTimeout().count()));
  });
}

Status EmulatedRuntime::launchLLCollective(const ll::Launch& d, ridgeStream_t stream) {
  if (d.nranks < 2 || d.nranks > ll::kMaxRanks || d.rank < 0 || d.rank >= d.nranks || d.flag == 0 ||
      d.statusWord == 0 || d.elemBytes <= 0 || d.elemBytes > 8)
    return makeError(ridgeInvalidArgument, "emulated LL launch: bad descriptor (rank %d of %d, flag %u)",
                     d.rank, d.nranks, d.flag);
  // As CUDA: a launch on a stream of another device than the current one fails (the NULL
  // stream is the current device's own).
  if (stream) {
    Status bad;
    Queue* q = queueOf(stream, &bad);
    if (!q) return bad;
    if (q->device != tCurrentDevice)
      return makeError(ridgeInvalidUsage,
                       "emulated LL launch: the stream belongs to device %d but device %d is current",
                       q->device, tCurrentDevice);
  }
  // The private aliases of every pointer the launch touches, for the extent it touches.
  ll::Launch x = d;
  // Lines up to the signature line (the slot's last).
  const size_t bytes = ll::messageBytes(d),
               lineBytes = (std::max<size_t>(ll::messageLines(d), d.sigLine + size_t(1))) * sizeof(ll::Line);
  const bool blocks = d.kind == ll::CollKind::ReduceScatter || d.kind == ll::CollKind::AlltoAll;
  const bool gathers = d.kind == ll::CollKind::AllGather || d.kind == ll::CollKind::AlltoAll;
  const bool readsSend = d.kind != ll::CollKind::Broadcast || d.rank == d.root;
  const bool writesRecv = d.kind != ll::CollKind::Reduce || d.rank == d.root;
  Status s;
  if (readsSend && !(x.send = translate(d.send, blocks ? bytes * size_t(d.nranks) : bytes, &s))) return s;
  if (writesRecv && !(x.recv = translate(d.recv, gathers ? bytes * size_t(d.nranks) : bytes, &s))) return s;
  for (int j = 0; j < d.nranks; ++j) {
    if (j == d.rank) continue;
    if (!(x.peerSlot[j] = reinterpret_cast<ll::Line*>(translate(d.peerSlot[j], lineBytes, &s)))) return s;
    if (!(x.mySlot[j] = reinterpret_cast<ll::Line*>(translate(d.mySlot[j], lineBytes, &s)))) return s;
  }
  llLaunchCount_.fetch_add(1);
  bool loaded;
  {
    std::lock_guard<std::mutex> lock(preloadMutex_);
    loaded = preloaded_.count(tCurrentDevice) > 0;
  }
  if (!loaded && releaseWaitPending(tCurrentDevice)) launchesBeforePreload_.fetch_add(1);
  const int64_t delayUs = workDelayOf(stream);
  return enqueueAs(stream, EntryKind::LLLaunch, [x, delayUs] {
    if (delayUs) std::this_thread::sleep_for(std::chrono::microseconds(delayUs));
    EmulatedLLEnv env{static_cast<ridgeDataType_t>(x.type), static_cast<ridgeRedOp_t>(x.op),
                      reinterpret_cast<volatile uint32_t*>(static_cast<uintptr_t>(x.statusWord)),
                      x.statusBase, std::chrono::steady_clock::now() + std::chrono::nanoseconds(x.timeoutNs)};
    const size_t lines = ll::messageLines(x);
    for (size_t i = 0; i < lines; ++i) ll::sendLine(x, i, env);
    for (size_t i = 0; i < lines; ++i)
      if (!ll::receiveLine(x, i, env)) break;  // the host reads why in the status word
    return Status::ok();
  });
}

}  // namespace ridge::device
