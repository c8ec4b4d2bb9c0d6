// The device-runtime seam: everything the stream-ordered collective path needs from a GPU
// runtime, and nothing else. Two implementations:
//
//  - CudaRuntime (CUDA builds only, cuda_runtime.cpp): the CUDA runtime API, events for
//    ready markers, cuStreamWaitValue32 (through cudaGetDriverEntryPoint, so Ridge does not
//    link libcuda at build time) for the release wait. With no device or driver it reports
//    zero devices and every pointer is host memory.
//  - EmulatedRuntime (always built, emulated_runtime.h): device memory that the host cannot
//    touch (a PROT_NONE mapping; only the emulated copy engine uses a private alias) and
//    in-order streams run by worker threads. Tests install it to prove the stream semantics
//    on machines without a GPU.
//
// The core never dereferences a device pointer: it classifies it here, and moves its bytes
// only through copy() on an internal stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/ll_collective.h"
#include "ridge/ridge.h"

namespace ridge::device {

enum class PointerKind { Host, Device, Managed };

struct PointerInfo {
  PointerKind kind = PointerKind::Host;
  int device = -1;  // device ordinal for device and managed memory
};

const char* pointerKindName(PointerKind kind);
const char* peerLinkKindName(int kind);  // DeviceRuntime::PeerLinkKind as text

// A "ready marker": recorded on a stream, completed when the stream reaches it (a CUDA
// event). Created once (pools), recorded many times; never allocated per call.
struct Marker;

// A 32-bit word in host memory that a stream can wait on. `host` is what the CPU writes;
// `deviceAddress` is what the runtime hands to the device (CUDA: the mapped device pointer
// of pinned host memory). Words only grow (cyclically, see waitWord) and are never freed
// while the runtime lives, so a stream still waiting on one after its communicator is gone
// reads valid memory.
struct ReleaseWord {
  volatile uint32_t* host = nullptr;
  uint64_t deviceAddress = 0;
};

// Cyclic "a >= b" on 32-bit sequence numbers, the comparison cuStreamWaitValue32 makes with
// CU_STREAM_WAIT_VALUE_GEQ: true when (int32_t)(a - b) >= 0.
inline bool sequenceReached(uint32_t a, uint32_t b) {
  return static_cast<int32_t>(a - b) >= 0;
}

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime();
  virtual const char* name() const = 0;

  // Devices this process sees; 0 means "no device": every pointer is host memory.
  virtual int deviceCount() = 0;
  // The calling thread's current device (0 when unknown but a device exists, -1 without).
  virtual int currentDevice() = 0;
  // Makes `device` current on the calling thread (the proxy thread calls it once).
  virtual Status bindThread(int device) = 0;
  virtual PointerInfo classify(const void* p) = 0;

  // ---- streams ----
  // Internal streams (copies of the staged path); never the user's stream.
  virtual Status createStream(ridgeStream_t* out) = 0;
  virtual void destroyStream(ridgeStream_t stream) = 0;
  // Waits until every operation queued on `stream` has completed (NULL: the legacy default
  // stream). Used for host-memory collectives called with a stream, and for internal copies.
  virtual Status synchronize(ridgeStream_t stream) = 0;
  // *capturing: `stream` is being captured into a graph (CUDA: cudaStreamBeginCapture, also
  // a capture already invalidated). A captured collective would not run: the ready marker
  // and the release wait are recorded into the graph, not queued, so the proxy never sees
  // the stream reach them and a replay would wait for a batch number issued only once. The
  // API refuses such calls (docs/gpu.md).
  virtual Status isCapturing(ridgeStream_t stream, bool* capturing) = 0;

  // ---- ordering primitives on the user's stream ----
  virtual Status createMarker(Marker** out) = 0;
  virtual void destroyMarker(Marker* m) = 0;
  virtual Status recordMarker(Marker* m, ridgeStream_t stream) = 0;
  // *done: the stream has passed the last recordMarker. Never blocks.
  virtual Status queryMarker(Marker* m, bool* done) = 0;
  // Makes `stream` wait (without blocking the caller) until sequenceReached(*word, value).
  virtual Status waitWord(ridgeStream_t stream, const ReleaseWord& word, uint32_t value) = 0;
  // Makes `stream` wait (without blocking the caller) until the stream `m` was last recorded
  // on has passed that record (CUDA: cudaStreamWaitEvent). How the LL collectives of one
  // communicator keep their issue order when the caller alternates streams.
  virtual Status waitMarker(ridgeStream_t stream, Marker* m) = 0;

  // ---- data movement on an internal stream ----
  // Asynchronous on `stream` (an internal stream): `dst`/`src` may each be device, managed
  // or pinned host memory.
  virtual Status copy(void* dst, const void* src, size_t bytes, ridgeStream_t stream) = 0;
  // Page-locked host memory that copies read and write at full speed.
  virtual Status allocPinned(size_t bytes, void** out) = 0;
  virtual void freePinned(void* p) = 0;
  // Device memory owned by Ridge (CUDA: cudaMalloc/cudaFree), for the GPUDirect RDMA data
  // path's receive rings and send areas (transports/net/device_memory.h). Both may
  // synchronize the device implicitly, so they are called only at communicator init and
  // destroy, never while a stream waits on one of the communicator's release words.
  virtual Status allocDevice(size_t bytes, void** out) = 0;
  virtual void freeDevice(void* p) = 0;
  // A new dma-buf file descriptor (the caller closes it) for device memory [base, base +
  // bytes), both host-page aligned and inside one allocation: how a NIC registers GPU memory
  // for GPUDirect RDMA (CUDA: cuMemGetHandleForAddressRange with
  // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD). An error saying why not otherwise.
  virtual Status exportDmaBuf(const void* base, size_t bytes, int* fd) = 0;
  // The device reduction kernel (kernels/device_reduce.h) on `stream`; for the device-side
  // reduction of later transports (the host-staged path reduces on the host).
  virtual Status launchReduce(void* dst, const void* const* srcs, int nsrcs, size_t count,
                              ridgeDataType_t type, ridgeRedOp_t op, int finalDivisor,
                              ridgeStream_t stream) = 0;

  // One LL collective (kernels/ll_collective.h: every rank's launch sends its lines into its
  // peers' LL areas and waits for theirs) on `stream`, the caller's stream. Never blocks the
  // caller. A wait that passes d.timeoutNs, or finds the status word set, gives up; a timeout
  // writes ll::kTimedOut into the status word (the host turns it into the communicator's
  // asynchronous error). CUDA: the fused kernel of kernels/ll_protocol.cu; the emulator runs
  // the same per-line logic on the stream's worker thread.
  virtual Status launchLLCollective(const ll::Launch& d, ridgeStream_t stream) = 0;

  // Device code a transport brings (the gdr transport's device-side producer, docs/gdr-write.md)
  // on `stream`: fn(arg, src, bytes) with `src` (device memory) as the device sees it. The
  // emulator runs it on the stream's worker with `src` translated to its alias. A runtime that
  // cannot run host-compiled device code refuses with ridgeInvalidUsage (CUDA: a GPU runs the
  // transport's own kernel, kernels/gdr, once its queues are mapped into the GPU); the caller
  // then takes its copy path.
  using DeviceFunction = void (*)(void* arg, const void* src, size_t bytes);
  virtual Status launchDeviceFunction(DeviceFunction /*fn*/, void* /*arg*/, const void* /*src*/,
                                      size_t /*bytes*/, ridgeStream_t /*stream*/) {
    return Status(ridgeInvalidUsage, "this device runtime does not run transport device code");
  }
  // Whether launchDeviceFunction runs (asked at set-up: a transport offers its device-side
  // producer only then, so that nothing routes device buffers to it that would be refused).
  virtual bool runsDeviceFunctions() const { return false; }
  // A GPU cannot run host-compiled code: a transport that has the same device code as a real
  // kernel registers its launcher as the function's kernel twin (once, at set-up), and the
  // CUDA runtime's launchDeviceFunction runs twin(arg, src, bytes, stream) for that function,
  // which queues the kernel on `stream`. Lookups are lock-free (one per launch).
  using KernelTwin = Status (*)(void* arg, const void* src, size_t bytes, ridgeStream_t stream);
  static void registerKernelTwin(DeviceFunction fn, KernelTwin twin);
  static KernelTwin kernelTwin(DeviceFunction fn);
  // Whether launchDeviceFunction runs `fn` here: every function where runsDeviceFunctions()
  // (the emulator), a function with a kernel twin on a runtime that launches twins (CUDA with
  // a device).
  virtual bool runsDeviceFunction(DeviceFunction /*fn*/) const { return runsDeviceFunctions(); }

  // Loads every kernel launchReduce may run into the calling thread's current device, once
  // per device (later calls for that device return at once). The proxy calls it in its setup,
  // before it queues any wait: with lazy module loading (CUDA's default) a kernel's first
  // launch loads it, which may wait for the device to synchronize, so a first launch while a
  // user's stream is parked on a release word could hang inside the launch (docs/gpu.md).
  // After an error the device is not marked loaded: a later call tries again.
  virtual Status preloadKernels() = 0;

  // ---- IPC (for the P2P transport) ----
  static constexpr size_t kIpcHandleBytes = 64;
  struct IpcHandle {
    unsigned char bytes[kIpcHandleBytes];
  };
  virtual Status ipcExport(void* devicePtr, IpcHandle* out) = 0;
  virtual Status ipcOpen(const IpcHandle& handle, void** devicePtr) = 0;
  virtual Status ipcClose(void* devicePtr) = 0;

  // ---- P2P (src/coll/device/p2p.cpp): what the device-direct path asks before using IPC ----
  // How device `a` reaches device `b`'s memory. SameDevice: always allowed (several ranks
  // on one GPU); otherwise what the runtime says (CUDA: cudaDeviceCanAccessPeer). The kind
  // is for logs and the planner; Unknown when the runtime cannot tell NVLink from PCIe.
  enum class PeerLinkKind { SameDevice, NvLink, Pcie, Unknown };
  struct PeerLink {
    bool allowed = false;
    PeerLinkKind kind = PeerLinkKind::Unknown;
  };
  virtual PeerLink peerLink(int deviceA, int deviceB) = 0;
  // Lets kernels of the calling thread's current device read and write `peerDevice`'s memory
  // through its own pointers (CUDA: cudaDeviceEnablePeerAccess; already enabled is fine).
  // Needed for ranks that are threads of one process on different devices; handles opened
  // with ipcOpen enable it themselves.
  virtual Status enablePeerAccess(int peerDevice) = 0;
  // The allocation that holds `p` (ipcExport takes an allocation's base).
  virtual Status allocationRange(const void* p, void** base, size_t* bytes) = 0;
  // A number naming the allocation that holds `p` (Ridge passes the base allocationRange
  // gave), unique within this process for its whole life: an allocation made after another
  // was freed gets a new number even at the same address (CUDA: the driver's
  // CU_POINTER_ATTRIBUTE_BUFFER_ID). The P2P transport keys its cache of exported handles on
  // it, where an address would name a freed allocation's successor. Never 0; an error when
  // the runtime cannot tell (the caller then does without caching).
  virtual Status allocationId(const void* p, uint64_t* id) = 0;
  // Whether ranks that are threads of one process must still exchange IPC handles (the
  // emulator: yes, so tests go through ipcOpen) or use each other's pointers directly (CUDA:
  // a process cannot open its own handles, and its device pointers are valid on every
  // thread).
  virtual bool ipcWithinProcess() const = 0;
  // The device's PCI bus id in lower case ("0000:3b:00.0"), or "" when unknown: how the P2P
  // transport finds the device in the topology (src/topo) to tell NVLink from PCIe.
  virtual std::string pciBusId(int device) = 0;
  // The ordinal under which this process sees the device with that bus id, or -1 (not
  // visible here, e.g. another CUDA_VISIBLE_DEVICES list, or unknown). Ordinals are per
  // process; bus ids are how ranks of one host name devices to each other.
  virtual int deviceByPciBusId(const std::string& busId) = 0;

  // ---- GPUDirect RDMA (transports/net: the receive-side flush) ----
  // Whether `device` itself orders inbound RDMA writes: once the NIC reports a write into
  // its memory complete, work the device then runs sees the data (CUDA: the driver's
  // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING is at least OWNER). False when the
  // runtime cannot tell, so that a receiver that must be sure flushes (RIDGE_GDR_FLUSH).
  virtual bool rdmaWritesOrdered(int /*device*/) { return false; }

  // ---- GDR-write on real NICs (transports/verbs/gdr_ladder.h) ----
  // What a range of this process's address space is: ordinary host memory (a NIC's send
  // queue, doorbell record or CQ buffer allocated by its driver library) or I/O memory (a
  // NIC's UAR doorbell page, on-NIC memory mapped by its driver).
  enum class HostRangeKind { Memory, IoMemory };
  // Makes [addr, addr + bytes) (page-aligned, overlapping no range mapped before) readable
  // and writable by kernels of every device, and gives the address they use (CUDA:
  // cudaHostRegister with Portable | Mapped, plus IoMemory for I/O memory, then
  // cudaHostGetDevicePointer). An error saying why otherwise: the GDR-write ladder falls a
  // rung (I/O memory for a non-root user needs the driver's PeerMappingOverride=1). The
  // default refuses: a runtime without devices has nothing to map into.
  virtual Status mapHostRange(void* addr, size_t bytes, HostRangeKind kind, uint64_t* deviceAddress);
  // Undoes mapHostRange (addr as given to it). Called before the memory itself goes away.
  virtual Status unmapHostRange(void* addr);

  // ---- release words (shared implementation) ----
  // A word from this runtime's pool; it keeps the value it had when last returned.
  Status takeReleaseWord(ReleaseWord* out);
  void returnReleaseWord(const ReleaseWord& w);

 protected:
  // Host memory the device can read, `bytes` long and zeroed; never freed by the pool.
  virtual Status allocWordPage(size_t bytes, void** host, uint64_t* deviceAddress) = 0;

 private:
  std::mutex wordMutex_;
  std::vector<ReleaseWord> freeWords_;
};

// The runtime the API uses: the one installed for testing, else the emulated runtime when
// RIDGE_DEVICE=emulated (one per process, its devices the GPUs of RIDGE_TOPO_FILE with their
// bus ids), else the CUDA runtime in CUDA builds, else null (a host-only build: every
// pointer is host memory, streams are refused).
DeviceRuntime* activeRuntime();
// The same for a communicator, with RIDGE_DEVICE as read when it was made (emulatedAtInit,
// from emulatedBySettings() then) instead of read again: every operation classifies its
// buffers, and the environment lookup was one of a 64 KiB send/recv's fixed costs (issue 21).
// A runtime installed for testing still comes first.
DeviceRuntime* runtimeOf(bool emulatedAtInit);

// RIDGE_DEVICE in lower case ("auto" when unset), whether it asks for the emulated runtime,
// and an error naming the accepted values when it is neither (init fails with it).
std::string deviceSettingValue();
bool emulatedBySettings();
Status checkDeviceSetting();

// Tests install an emulated runtime for a scope. Not thread-safe against running
// collectives: install before creating communicators, remove after destroying them.
class ScopedRuntimeForTesting {
 public:
  explicit ScopedRuntimeForTesting(DeviceRuntime* rt);
  ~ScopedRuntimeForTesting();
  ScopedRuntimeForTesting(const ScopedRuntimeForTesting&) = delete;
  ScopedRuntimeForTesting& operator=(const ScopedRuntimeForTesting&) = delete;

 private:
  DeviceRuntime* previous_;
};

#ifdef RIDGE_HAVE_CUDA
// The process's CUDA runtime (cuda_runtime.cpp).
DeviceRuntime* cudaRuntime();
#endif

}  // namespace ridge::device
