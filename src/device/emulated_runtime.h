// A device runtime without a device, for tests on machines without a GPU.
//
// Device memory: each allocation is a memfd mapped twice. The address handed out as the
// "device pointer" is a PROT_NONE mapping, so any host-side dereference by Ridge's core
// faults at once (the test dies with SIGSEGV); the read-write alias is private to this
// file and used only by the emulated copy engine and kernels. Managed memory is the same
// with a read-write first mapping (the host may touch managed memory).
//
// Streams: in-order queues, each run by one worker thread. Copies, "kernels" (closures),
// ready markers and release waits are queue entries. Every wait is bounded: a release wait
// or a gate that does not open within waitTimeout() fails the stream with an error that
// synchronize() reports, and the stream goes on (so nothing hangs forever).
//
// The opaque ridgeStream_t of an emulated stream is the address of its queue; NULL means
// the emulated legacy default stream, created on first use.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "device/runtime.h"

namespace ridge::device {

class EmulatedRuntime final : public DeviceRuntime {
 public:
  // `devices` emulated devices (ordinals 0..devices-1); the current device is per thread,
  // 0 by default.
  explicit EmulatedRuntime(int devices = 1);
  ~EmulatedRuntime() override;

  const char* name() const override { return "emulated"; }
  int deviceCount() override { return devices_; }
  int currentDevice() override;
  Status bindThread(int device) override;
  PointerInfo classify(const void* p) override;

  Status createStream(ridgeStream_t* out) override;
  void destroyStream(ridgeStream_t stream) override;
  Status synchronize(ridgeStream_t stream) override;
  Status isCapturing(ridgeStream_t stream, bool* capturing) override;

  Status createMarker(Marker** out) override;
  void destroyMarker(Marker* m) override;
  Status recordMarker(Marker* m, ridgeStream_t stream) override;
  Status queryMarker(Marker* m, bool* done) override;
  Status waitWord(ridgeStream_t stream, const ReleaseWord& word, uint32_t value) override;
  // A queue entry that waits (bounded by waitTimeout()) until the marker's last record passed.
  Status waitMarker(ridgeStream_t stream, Marker* m) override;

  Status copy(void* dst, const void* src, size_t bytes, ridgeStream_t stream) override;
  Status allocPinned(size_t bytes, void** out) override;
  void freePinned(void* p) override;
  Status launchReduce(void* dst, const void* const* srcs, int nsrcs, size_t count, ridgeDataType_t type,
                      ridgeRedOp_t op, int finalDivisor, ridgeStream_t stream) override;

  // Runs the LL collective's per-line logic (kernels/ll_collective.h) on the stream's worker:
  // phase 1 then phase 2 over every line, lines stored and loaded as two 8-byte
  // release/acquire halves through the private aliases, waits spinning with yields and
  // watching the status word and the deadline, reductions with the host kernels (the same
  // arithmetic as launchReduce here). Refused, as by CUDA, on a stream of a device that is
  // not the calling thread's current one.
  Status launchLLCollective(const ll::Launch& d, ridgeStream_t stream) override;
  bool runsDeviceFunctions() const override { return !kernelTwinsOnly_.load(); }
  bool runsDeviceFunction(DeviceFunction fn) const override {
    return !kernelTwinsOnly_.load() || kernelTwin(fn) != nullptr;
  }
  Status launchDeviceFunction(DeviceFunction fn, void* arg, const void* src, size_t bytes,
                              ridgeStream_t stream) override;
  // Stands for a GPU that runs only kernel twins (DeviceRuntime::registerKernelTwin): device
  // functions without one are refused, those with one run (their host code standing for the
  // kernel), so that a transport takes its GPU path (tests of the gdr transport's GPU post).
  void setKernelTwinsOnly(bool on) { kernelTwinsOnly_.store(on); }

  // Marks the current device's kernels loaded (see launchesBeforePreloadWhileStreamsWait).
  Status preloadKernels() override;

  Status ipcExport(void* devicePtr, IpcHandle* out) override;
  Status ipcOpen(const IpcHandle& handle, void** devicePtr) override;
  Status ipcClose(void* devicePtr) override;
  // P2P: emulated devices reach each other unless a test refuses it (setPeerAccess); the
  // link kind is what a test sets (default Unknown).
  PeerLink peerLink(int deviceA, int deviceB) override;
  Status enablePeerAccess(int peerDevice) override;
  Status allocationRange(const void* p, void** base, size_t* bytes) override;
  // The allocation's unique number (Region::id, counted from 1 per runtime); a view opened
  // with ipcOpen reports the exported allocation's.
  Status allocationId(const void* p, uint64_t* id) override;
  bool ipcWithinProcess() const override { return ipcWithinProcess_.load(); }
  std::string pciBusId(int device) override;
  int deviceByPciBusId(const std::string& busId) override;
  bool rdmaWritesOrdered(int /*device*/) override { return rdmaWritesOrdered_.load(); }
  // The emulated devices run on host threads: a mapped range's device address is its host
  // address. Overlaps are refused as cudaHostRegister refuses them; failHostRangeMaps makes
  // every later map of that kind fail with `why` (tests of the GDR-write ladder).
  Status mapHostRange(void* addr, size_t bytes, HostRangeKind kind, uint64_t* deviceAddress) override;
  Status unmapHostRange(void* addr) override;
  void failHostRangeMaps(HostRangeKind kind, std::string why);
  // Ranges mapped now.
  size_t mappedHostRanges();

  // Device memory of the current device (the seam's allocation, as cudaMalloc).
  Status allocDevice(size_t bytes, void** out) override { return allocDeviceOn(bytes, out, -1, false); }
  void freeDevice(void* p) override;
  // A dup of the allocation's memfd: the whole allocation, or a page-aligned range inside it
  // (the fd then still maps the whole allocation: offset 0 is the allocation's start, as
  // softnic's registration of a dma-buf expects of a range that starts at the base).
  Status exportDmaBuf(const void* base, size_t bytes, int* fd) override;

  // ---- test helpers ----
  // Device (or managed) memory of `bytes` on `device` (-1: the current device).
  Status allocDeviceOn(size_t bytes, void** out, int device, bool managed);
  // Successful exportDmaBuf calls so far.
  uint64_t dmaBufExports() const { return dmaBufExports_.load(); }
  // While set, exportDmaBuf fails (a driver without dma-buf support).
  void setDmaBufSupported(bool on) { dmaBufSupported_.store(on); }
  // Synchronous copies between host memory and emulated device memory (cudaMemcpy).
  Status copyToDevice(void* dst, const void* src, size_t bytes);
  Status copyToHost(void* dst, const void* src, size_t bytes);
  // Queues `fn` on `stream` (a "kernel"); an error it returns fails the stream.
  Status enqueue(ridgeStream_t stream, std::function<Status()> fn);

  // ---- stream progress, for tests that wait on events instead of time ----
  // A gate a test queues on a stream: the stream's worker stops there until the test opens
  // it (bounded by waitTimeout(), after which the stream fails with an error and goes on).
  // Work queued behind it is held for exactly as long as the test decides: a controllable
  // delay, where a sleep would only hope that the other threads got that far.
  class StreamGate {
   public:
    void open();
    bool isOpen();

   private:
    friend class EmulatedRuntime;
    std::mutex mutex_;
    std::condition_variable opened_;
    bool open_ = false;
  };
  // Queues a closed gate on `stream`; `gate` is shared with the queued entry.
  Status enqueueGate(ridgeStream_t stream, std::shared_ptr<StreamGate> gate);
  // What a stream's worker is doing now.
  enum class Waiting { Nothing, Marker, Gate, Word };
  struct StreamState {
    bool idle = false;                   // nothing queued and nothing running
    Waiting waiting = Waiting::Nothing;  // the entry running now, when it is a wait
    uint64_t llLaunchesRun = 0;          // LL launches this stream has finished running
  };
  // Waits until `stuck(state)` holds for `stream` (checked at every change of the stream's
  // state, no polling) or `timeout` passes; false then, or when `stream` is not a stream.
  // "The stream can go no further" is `idle`, or a wait that only the test can release.
  // The stream must not be destroyed meanwhile.
  bool waitForStream(ridgeStream_t stream, const std::function<bool(const StreamState&)>& stuck,
                     std::chrono::milliseconds timeout);
  // How long a queued wait (release word, test gate) may block before it fails the stream.
  void setWaitTimeout(std::chrono::milliseconds t) { waitTimeoutMs_.store(t.count()); }
  std::chrono::milliseconds waitTimeout() const { return std::chrono::milliseconds(waitTimeoutMs_.load()); }
  // Marks `stream` as being captured into a graph (true) or not (false): what isCapturing
  // then reports. Nothing else changes: the emulator has no graphs.
  Status setCapturing(ridgeStream_t stream, bool capturing);
  // Number of release waits queued so far (tests check that the stream-ordered path used one).
  uint64_t releaseWaitsQueued() const { return releaseWaits_.load(); }
  // Calls that CUDA may turn into an implicit device synchronization (allocPinned,
  // freePinned, createStream, enablePeerAccess, ipcClose) made while a release wait queued on
  // a stream of the caller's current device had not been released yet. Each such call could
  // deadlock on a GPU: the driver waits for the parked stream, which waits for Ridge's proxy
  // (docs/gpu.md). Streams belong to the device current when they were created (the default
  // stream to device 0).
  uint64_t allocationsWhileStreamsWait() const { return allocationsWhileStreamsWait_.load(); }
  // Devices whose kernels preloadKernels has loaded so far (each counts once).
  size_t kernelPreloads();
  // launchReduce calls on a device whose kernels were not preloaded, made while a release
  // wait queued on a stream of that device had not been released: each would be a kernel's
  // first launch under CUDA's lazy loading, which may wait for the parked stream (a hang
  // inside the launch on a GPU; docs/gpu.md).
  uint64_t launchesBeforePreloadWhileStreamsWait() const { return launchesBeforePreload_.load(); }
  // While on, copy() first waits (bounded by waitTimeout()) until no release wait of the
  // caller's device is pending: a runtime call stuck the way an implicitly synchronizing CUDA
  // call would be, for tests that abort a communicator whose proxy is blocked inside it.
  void setCopiesWaitForReleases(bool on) { copiesWaitForReleases_.store(on); }
  // While on, freeDevice (and ipcClose) first waits, as cudaFree does, until every stream of
  // the allocation's device is idle: bounded by waitTimeout(), after which it frees anyway
  // and counts the free in freesStalledByStreams(). A test whose rank frees while a peer's
  // launch on the same device waits for that rank (a hang on a GPU) then shows a count.
  void setFreesWaitForStreams(bool on) { freesWaitForStreams_.store(on); }
  uint64_t freesStalledByStreams() const { return freesStalled_.load(); }
  // Every copy and reduction queued on a stream of `device` from now on first sleeps `delay`
  // on the stream's worker (0: no delay): a slow device, so that tests can show that work
  // of another rank never runs ahead of what it depends on.
  void setWorkDelay(int device, std::chrono::microseconds delay);
  // Copies and reductions queued on streams of `device` that have not finished running: the
  // most there were at once since the last reset (a caller that waited for each before
  // queueing the next never exceeds 1 on one device). Evidence that work is queued ahead.
  int64_t workInFlightPeak(int device);
  void resetWorkInFlightPeak(int device);
  // Of those, how many there are now (0 once the device has run everything queued).
  int64_t workInFlight(int device);
  // ---- P2P test helpers ----
  void setPeerAccess(bool allowed, PeerLinkKind kind = PeerLinkKind::Unknown) {
    peerAccess_.store(allowed);
    peerKind_.store(static_cast<int>(kind));
  }
  void setIpcWithinProcess(bool v) { ipcWithinProcess_.store(v); }
  // Whether ipcOpen opens handles of another process's emulated runtime (through
  // /proc/PID/fd of the exporter's memfd, as a GPU driver maps another process's memory).
  // Off by default: tests of one runtime per process rely on the refusal. RIDGE_DEVICE=emulated
  // turns it on, so ranks that are processes (ridge-bench -np) reach each other's devices.
  void setIpcAcrossProcesses(bool v) { ipcAcrossProcesses_.store(v); }
  // What rdmaWritesOrdered reports for every device (default false: a device that does not
  // order inbound RDMA writes, so GDR receivers flush).
  void setRdmaWritesOrdered(bool ordered) { rdmaWritesOrdered_.store(ordered); }
  // The next `n` ipcOpen calls fail (a failure on one rank, for error-path tests).
  void failNextIpcOpens(int n) { ipcOpenFailures_.store(n); }
  // PCI bus ids the emulated devices report (by ordinal; default none), so that tests can
  // place them in a topology. Set before communicators are created.
  void setPciBusIds(std::vector<std::string> ids) {
    std::lock_guard<std::mutex> lock(regionsMutex_);
    busIds_ = std::move(ids);
  }
  // What a thread bound to `device` finds with deviceByPciBusId: only `visible` (as a
  // process with its own CUDA_VISIBLE_DEVICES list would). Default: every device.
  void setVisibleDevices(int device, std::vector<int> visible) {
    std::lock_guard<std::mutex> lock(regionsMutex_);
    visibleFrom_[device] = std::move(visible);
  }
  // ipcOpen calls that succeeded, ipcOpen views still open, reductions launched (counters
  // the P2P tests read to tell which path ran and what the mapping cache did).
  uint64_t ipcOpens() const { return ipcOpenCount_.load(); }
  // ipcExport calls that succeeded (the P2P tests check that cached exports are not redone).
  uint64_t ipcExports() const { return ipcExportCount_.load(); }
  // While off, allocationId fails (a runtime that cannot name allocations): P2P then exports
  // every buffer per call and its peers compare handles.
  void setAllocationIdsSupported(bool on) { allocationIdsSupported_.store(on); }
  // Frees the device allocation whose base is `base` and makes a new one of the same size
  // and device at the same address (a new id, new memory holding zeros), as a driver may
  // hand a freed address out again. In one step, so no other thread's mapping can land there
  // in between. Views opened with ipcOpen keep the old memory. Nothing may be queued on it.
  Status reallocateInPlace(void* base);
  size_t ipcViewsOpen();
  // Device (and managed) allocations not yet freed, ipcOpen views not counted.
  size_t liveDeviceAllocations();
  uint64_t reducesLaunched() const { return reduceCount_.load(); }
  // Those launched on streams of `device` (tests that run several ranks in one runtime).
  uint64_t reducesLaunchedOn(int device) const {
    return device >= 0 && static_cast<size_t>(device) < reduceCountByDevice_.size()
               ? reduceCountByDevice_[device].load()
               : 0;
  }
  // Device (and managed) allocations so far, through allocDevice or allocDeviceOn.
  uint64_t deviceAllocations() const { return deviceAllocCount_.load(); }
  // launchLLCollective calls so far (tests tell the LL path from the proxy path by it).
  uint64_t llLaunches() const { return llLaunchCount_.load(); }
  // Reductions launched with a destination or source not 16-byte aligned: the GPU kernel's
  // scalar path (a P2P slice cut where the vector path cannot follow it).
  uint64_t misalignedReduces() const { return misalignedReduceCount_.load(); }
  // classify() calls so far (tests check that a buffer is classified once per call).
  uint64_t classifyCalls() const { return classifyCount_.load(); }
  // Pinned host memory: the largest single allocation, the most held at once, and what is
  // held now (tests check the staging bound).
  size_t largestPinnedAllocation();
  size_t pinnedBytesPeak();
  size_t pinnedBytesNow();
  // ---- copy ordering evidence ----
  // One copy(): its order among all recorded events when it was issued and when the stream
  // ran it (one counter for both, so "issued before that one ran" is a comparison).
  struct CopyRecord {
    uint64_t issued = 0, ran = 0;  // ran: 0 until the stream ran it
    const void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
  };
  // While on, every copy() is recorded (clears the log when turned on).
  void setRecordCopies(bool on);
  std::vector<CopyRecord> copyLog();

 protected:
  Status allocWordPage(size_t bytes, void** host, uint64_t* deviceAddress) override;

 private:
  struct Region {
    size_t bytes;
    int device;
    bool managed;
    char* alias;  // the read-write view
    int fd;
    int ipcOpens;  // how many ipcOpen views exist of it
    uint64_t id;   // unique per allocation: a handle of a freed one never opens its successor
  };
  struct Queue;
  // One queue entry: what it is (StreamState::waiting while it runs; LL launches counted).
  enum class EntryKind { Work, LLLaunch, MarkerWait, Gate, WordWait };
  Status enqueueAs(ridgeStream_t stream, EntryKind kind, std::function<Status()> fn);
  // A release wait queued and not finished: on which device, for which word and value.
  struct PendingWait {
    int device;
    volatile uint32_t* word;
    uint32_t value;
  };
  // Whether a pending wait on `device` still waits for its word (the word not yet reached).
  bool releaseWaitPending(int device);
  // Counts a call in allocationsWhileStreamsWait() if one is pending on the caller's device.
  void noteSynchronizingCall();
  Queue* queueOf(ridgeStream_t stream, Status* error);
  // setWorkDelay's delay for the device of `stream` (0 when none or not a stream).
  int64_t workDelayOf(ridgeStream_t stream);
  // The read-write address behind a device, managed or host pointer (host: itself).
  char* translate(const void* p, size_t bytes, Status* error);
  void workerLoop(Queue* q);
  // ipcOpen of a handle another process exported (setIpcAcrossProcesses).
  Status openOfAnotherProcess(const IpcHandle& handle, void** devicePtr);
  // The region whose device view holds `p`, or regions_.end(); regionsMutex_ held.
  std::map<uintptr_t, Region>::iterator regionHolding(const void* p);

  const int devices_;
  std::atomic<int64_t> waitTimeoutMs_{10000};
  std::atomic<uint64_t> releaseWaits_{0};
  std::atomic<uint64_t> allocationsWhileStreamsWait_{0};
  std::atomic<bool> copiesWaitForReleases_{false};
  std::atomic<bool> freesWaitForStreams_{false};
  std::atomic<uint64_t> freesStalled_{0};
  // Whether every stream of `device` has nothing queued and nothing running.
  bool streamsIdle(int device);
  std::mutex pendingMutex_;
  std::map<uint64_t, PendingWait> pending_;  // by a serial number; under pendingMutex_
  uint64_t nextPendingId_ = 0;               // under pendingMutex_
  std::atomic<bool> peerAccess_{true};
  std::atomic<int> peerKind_{static_cast<int>(PeerLinkKind::Unknown)};
  std::atomic<bool> ipcWithinProcess_{true};
  std::atomic<bool> kernelTwinsOnly_{false};
  std::atomic<bool> ipcAcrossProcesses_{false};
  std::atomic<bool> rdmaWritesOrdered_{false};
  std::atomic<uint64_t> ipcOpenCount_{0};
  std::atomic<uint64_t> ipcExportCount_{0};
  std::atomic<bool> allocationIdsSupported_{true};
  std::atomic<int> ipcOpenFailures_{0};
  std::mutex hostRangesMutex_;
  std::map<uintptr_t, size_t> hostRanges_;                  // start -> bytes (hostRangesMutex_)
  std::map<HostRangeKind, std::string> hostRangeFailures_;  // kind -> why (hostRangesMutex_)
  std::atomic<uint64_t> reduceCount_{0};
  std::atomic<uint64_t> llLaunchCount_{0};
  std::atomic<uint64_t> deviceAllocCount_{0};
  std::atomic<uint64_t> misalignedReduceCount_{0};
  std::mutex preloadMutex_;
  std::set<int> preloaded_;  // devices preloadKernels has loaded (preloadMutex_)
  std::atomic<uint64_t> launchesBeforePreload_{0};
  std::array<std::atomic<int64_t>, 16> workDelayUs_{};  // by device (setWorkDelay)
  // By device: copies and reductions queued and not finished, and the most at once.
  std::array<std::atomic<int64_t>, 16> workInFlight_{}, workInFlightPeak_{};
  std::array<std::atomic<uint64_t>, 16> reduceCountByDevice_{};  // reducesLaunchedOn
  // Counts one more piece of work in flight on the device of `stream`; its index for
  // workFinished (-1: not counted).
  int workQueued(ridgeStream_t stream);
  void workFinished(int device);
  std::atomic<uint64_t> classifyCount_{0};
  std::mutex pinnedMutex_;
  std::map<void*, size_t> pinned_;  // under pinnedMutex_, as the next three
  size_t pinnedNow_ = 0, pinnedPeak_ = 0, pinnedLargest_ = 0;
  std::atomic<uint64_t> dmaBufExports_{0};
  std::atomic<bool> dmaBufSupported_{true};
  std::atomic<bool> recordCopies_{false};
  std::mutex copyLogMutex_;
  std::deque<CopyRecord> copyLog_;  // under copyLogMutex_, as eventCount_
  uint64_t eventCount_ = 0;
  uint64_t nextAllocationId_ = 1;                // under regionsMutex_
  std::vector<std::string> busIds_;              // under regionsMutex_
  std::map<int, std::vector<int>> visibleFrom_;  // under regionsMutex_
  std::mutex regionsMutex_;
  std::map<uintptr_t, Region> regions_;  // by device base address
  std::mutex queuesMutex_;
  std::set<Queue*> queues_;
  Queue* defaultQueue_ = nullptr;
};

}  // namespace ridge::device
