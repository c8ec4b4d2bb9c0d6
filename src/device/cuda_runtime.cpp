// The CUDA implementation of the device-runtime seam (CUDA builds only).
//
// Release waits use cuStreamWaitValue32 with CU_STREAM_WAIT_VALUE_GEQ on pinned, mapped host
// memory: the stream's front end polls the word and nothing runs on the CPU. The driver
// entry point comes from cudaGetDriverEntryPointByVersion (cudaGetDriverEntryPoint before
// CUDA 12.5), so Ridge links only the runtime and still loads on machines without libcuda.
// Since CUDA 12 stream memory operations are supported on every device (the
// CAN_USE_STREAM_MEM_OPS attribute exists only as a deprecated _V1 for the old API), so
// support is decided by the entry point being there and by the first call's result.
//
// Without it (entry point missing, or the call answers CUDA_ERROR_NOT_SUPPORTED) collectives
// on device memory are refused with an error. There is deliberately no cudaLaunchHostFunc
// fallback: CUDA forbids a host function to wait on outstanding CUDA work (the proxy's
// copies are such work), and a bounded poll there would release the stream before the
// collective finished if the bound ran out first.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cctype>
#include <cstring>
#include <mutex>
#include <set>

#include "core/log.h"
#include "device/runtime.h"
#include "kernels/device_reduce.h"
#include "kernels/ll_protocol.h"

namespace ridge::device {
namespace {

using WaitValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using AddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

// A driver entry point by name (CUDA 12 ABI), or null.
void* driverEntryPoint(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
#else
  cudaError_t e = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &q);
#endif
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return fn;
}

Status cudaError(const char* what, cudaError_t e) {
  (void)cudaGetLastError();  // clear the sticky-free error so later calls are not confused
  return makeError(ridgeUnhandledCudaError, "%s: %s", what, cudaGetErrorString(e));
}

#define RIDGE_CUDA_TRY(call)                  \
  do {                                        \
    cudaError_t ridge_e_ = (call);            \
    if (ridge_e_ != cudaSuccess) [[unlikely]] \
      return cudaError(#call, ridge_e_);      \
  } while (0)

cudaStream_t asCuda(ridgeStream_t s) {
  return reinterpret_cast<cudaStream_t>(s);
}

// The refusal of every stream-ordered collective where streams cannot wait on a word.
Status streamWaitUnavailable(const char* why) {
  return makeError(ridgeInvalidUsage,
                   "collectives on device memory need cuStreamWaitValue32, and %s; Ridge has no other way to "
                   "make the stream wait (docs/gpu.md): use host buffers, or a driver and device that "
                   "support stream memory operations",
                   why);
}

class CudaRuntime final : public DeviceRuntime {
 public:
  CudaRuntime() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      n = 0;
    }
    devices_ = n;
    if (devices_ == 0) return;
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
    cudaError_t e =
        cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault, &q);
#else
    cudaError_t e = cudaGetDriverEntryPoint("cuStreamWaitValue32", &fn, cudaEnableDefault, &q);
#endif
    if (e == cudaSuccess && q == cudaDriverEntryPointSuccess && fn) {
      waitValue32_ = reinterpret_cast<WaitValue32Fn>(fn);
    } else {
      (void)cudaGetLastError();
      RIDGE_INFO(
          "cuStreamWaitValue32 unavailable: collectives on device memory will be refused (docs/gpu.md)");
    }
  }

  const char* name() const override {
    return "cuda";
  }
  int deviceCount() override {
    return devices_;
  }

  int currentDevice() override {
    if (devices_ == 0) return -1;
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess) {
      (void)cudaGetLastError();
      return -1;  // unknown: the communicator serves no device rather than a guessed one
    }
    return d;
  }

  Status bindThread(int device) override {
    RIDGE_CUDA_TRY(cudaSetDevice(device));
    return Status::ok();
  }

  PointerInfo classify(const void* p) override {
    if (!p || devices_ == 0) return {};
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return {};
    }
    if (attr.type == cudaMemoryTypeDevice) return {PointerKind::Device, attr.device};
    if (attr.type == cudaMemoryTypeManaged) return {PointerKind::Managed, attr.device};
    return {};  // unregistered or pinned host memory
  }

  Status createStream(ridgeStream_t* out) override {
    cudaStream_t s = nullptr;
    RIDGE_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *out = reinterpret_cast<ridgeStream_t>(s);
    return Status::ok();
  }
  void destroyStream(ridgeStream_t stream) override {
    if (cudaStreamDestroy(asCuda(stream)) != cudaSuccess) (void)cudaGetLastError();
  }
  Status synchronize(ridgeStream_t stream) override {
    RIDGE_CUDA_TRY(cudaStreamSynchronize(asCuda(stream)));
    return Status::ok();
  }
  Status isCapturing(ridgeStream_t stream, bool* capturing) override {
    *capturing = false;
    if (devices_ == 0) return Status::ok();
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(asCuda(stream), &status);
    if (e == cudaErrorStreamCaptureImplicit) {
      // The legacy default stream while a blocking stream of the device captures: it is
      // unusable until that capture ends (using it would join the capture), so it counts.
      (void)cudaGetLastError();
      *capturing = true;
      return Status::ok();
    }
    RIDGE_CUDA_TRY(e);
    *capturing = status != cudaStreamCaptureStatusNone;
    return Status::ok();
  }

  Status createMarker(Marker** out) override {
    cudaEvent_t ev = nullptr;
    RIDGE_CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    *out = reinterpret_cast<Marker*>(ev);
    return Status::ok();
  }
  void destroyMarker(Marker* m) override {
    if (cudaEventDestroy(reinterpret_cast<cudaEvent_t>(m)) != cudaSuccess) (void)cudaGetLastError();
  }
  Status recordMarker(Marker* m, ridgeStream_t stream) override {
    RIDGE_CUDA_TRY(cudaEventRecord(reinterpret_cast<cudaEvent_t>(m), asCuda(stream)));
    return Status::ok();
  }
  Status queryMarker(Marker* m, bool* done) override {
    cudaError_t e = cudaEventQuery(reinterpret_cast<cudaEvent_t>(m));
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();
      *done = false;
      return Status::ok();
    }
    RIDGE_CUDA_TRY(e);
    *done = true;
    return Status::ok();
  }

  Status waitWord(ridgeStream_t stream, const ReleaseWord& word, uint32_t value) override {
    if (waitNotSupported_.load(std::memory_order_relaxed))
      return streamWaitUnavailable("the driver answered CUDA_ERROR_NOT_SUPPORTED for it");
    const WaitValue32Fn waitValue32 = waitValue32_;
    if (!waitValue32) return streamWaitUnavailable("the driver does not provide it");
    CUresult r = waitValue32(reinterpret_cast<CUstream>(stream), static_cast<CUdeviceptr>(word.deviceAddress),
                             value, CU_STREAM_WAIT_VALUE_GEQ);
    if (r == CUDA_SUCCESS) return Status::ok();
    if (r == CUDA_ERROR_NOT_SUPPORTED) {
      waitNotSupported_.store(true, std::memory_order_relaxed);
      RIDGE_WARN("cuStreamWaitValue32 is not supported here: collectives on device memory are refused");
      return streamWaitUnavailable("the driver answered CUDA_ERROR_NOT_SUPPORTED for it");
    }
    return makeError(ridgeUnhandledCudaError, "cuStreamWaitValue32: CUresult %d", static_cast<int>(r));
  }

  Status waitMarker(ridgeStream_t stream, Marker* m) override {
    RIDGE_CUDA_TRY(cudaStreamWaitEvent(asCuda(stream), reinterpret_cast<cudaEvent_t>(m), 0));
    return Status::ok();
  }

  Status copy(void* dst, const void* src, size_t bytes, ridgeStream_t stream) override {
    RIDGE_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, asCuda(stream)));
    return Status::ok();
  }
  Status allocPinned(size_t bytes, void** out) override {
    RIDGE_CUDA_TRY(cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocPortable));
    return Status::ok();
  }
  void freePinned(void* p) override {
    if (cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
  }
  Status allocDevice(size_t bytes, void** out) override {
    RIDGE_CUDA_TRY(cudaMalloc(out, bytes ? bytes : 1));
    return Status::ok();
  }
  void freeDevice(void* p) override {
    if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
  }
  Status exportDmaBuf(const void* base, size_t bytes, int* fd) override {
    using HandleFn = CUresult (*)(void*, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long);
    static const auto handle = reinterpret_cast<HandleFn>(driverEntryPoint("cuMemGetHandleForAddressRange"));
    *fd = -1;
    if (!handle)
      return makeError(
          ridgeSystemError,
          "dma-buf export needs cuMemGetHandleForAddressRange (CUDA 11.7+ driver); it is missing");
    int out = -1;
    const CUresult r =
        handle(&out, reinterpret_cast<CUdeviceptr>(base), bytes, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (r != CUDA_SUCCESS)
      return makeError(
          ridgeSystemError,
          "cuMemGetHandleForAddressRange(dma-buf) of [%p, +%zu) failed with CUresult %d (needs the "
          "open GPU kernel modules and a Linux 5.12+ kernel)",
          base, bytes, static_cast<int>(r));
    *fd = out;
    return Status::ok();
  }
  Status launchReduce(void* dst, const void* const* srcs, int nsrcs, size_t count, ridgeDataType_t type,
                      ridgeRedOp_t op, int finalDivisor, ridgeStream_t stream) override {
    return gpu::launchReduce(dst, srcs, nsrcs, count, type, op, finalDivisor, stream);
  }

  Status launchLLCollective(const ll::Launch& d, ridgeStream_t stream) override {
    return gpu::launchLLCollective(d, stream);
  }

  Status preloadKernels() override {
    int dev = 0;
    RIDGE_CUDA_TRY(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lock(preloadMutex_);
    if (preloaded_.count(dev)) return Status::ok();
    RIDGE_TRY(gpu::preloadKernels());
    preloaded_.insert(dev);
    return Status::ok();
  }

  Status ipcExport(void* devicePtr, IpcHandle* out) override {
    static_assert(sizeof(cudaIpcMemHandle_t) <= kIpcHandleBytes, "IPC handle does not fit");
    cudaIpcMemHandle_t h;
    RIDGE_CUDA_TRY(cudaIpcGetMemHandle(&h, devicePtr));
    std::memset(out, 0, sizeof *out);
    std::memcpy(out->bytes, &h, sizeof h);
    return Status::ok();
  }
  Status ipcOpen(const IpcHandle& handle, void** devicePtr) override {
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.bytes, sizeof h);
    RIDGE_CUDA_TRY(cudaIpcOpenMemHandle(devicePtr, h, cudaIpcMemLazyEnablePeerAccess));
    return Status::ok();
  }
  Status ipcClose(void* devicePtr) override {
    RIDGE_CUDA_TRY(cudaIpcCloseMemHandle(devicePtr));
    return Status::ok();
  }

  PeerLink peerLink(int deviceA, int deviceB) override {
    if (deviceA < 0 || deviceB < 0 || deviceA >= devices_ || deviceB >= devices_) return {};
    if (deviceA == deviceB) return {true, PeerLinkKind::SameDevice};
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, deviceA, deviceB) != cudaSuccess) {
      (void)cudaGetLastError();
      return {};
    }
    // The runtime does not say which link carries P2P; the topology (src/topo) does.
    return {can != 0, PeerLinkKind::Unknown};
  }
  Status enablePeerAccess(int peerDevice) override {
    int current = 0;
    RIDGE_CUDA_TRY(cudaGetDevice(&current));
    if (current == peerDevice) return Status::ok();
    cudaError_t e = cudaDeviceEnablePeerAccess(peerDevice, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
      return Status::ok();
    }
    RIDGE_CUDA_TRY(e);
    return Status::ok();
  }
  Status allocationRange(const void* p, void** base, size_t* bytes) override {
    static const auto range = reinterpret_cast<AddressRangeFn>(driverEntryPoint("cuMemGetAddressRange"));
    if (!range) return makeError(ridgeUnhandledCudaError, "cuMemGetAddressRange: no driver entry point");
    CUdeviceptr b = 0;
    size_t n = 0;
    CUresult r = range(&b, &n, reinterpret_cast<CUdeviceptr>(p));
    if (r != CUDA_SUCCESS)
      return makeError(ridgeUnhandledCudaError, "cuMemGetAddressRange(%p): CUresult %d", p,
                       static_cast<int>(r));
    *base = reinterpret_cast<void*>(b);
    *bytes = n;
    return Status::ok();
  }
  Status allocationId(const void* p, uint64_t* id) override {
    using AttributeFn = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);
    static const auto attribute = reinterpret_cast<AttributeFn>(driverEntryPoint("cuPointerGetAttribute"));
    if (!attribute) return makeError(ridgeUnhandledCudaError, "cuPointerGetAttribute: no driver entry point");
    // The driver's buffer id: unique within the process for its whole life, never reused
    // by a later allocation (cuda.h, CU_POINTER_ATTRIBUTE_BUFFER_ID).
    unsigned long long v = 0;
    const CUresult r = attribute(&v, CU_POINTER_ATTRIBUTE_BUFFER_ID, reinterpret_cast<CUdeviceptr>(p));
    if (r != CUDA_SUCCESS)
      return makeError(ridgeUnhandledCudaError, "cuPointerGetAttribute(BUFFER_ID, %p): CUresult %d", p,
                       static_cast<int>(r));
    if (v == 0) return makeError(ridgeUnhandledCudaError, "cuPointerGetAttribute(BUFFER_ID, %p): id 0", p);
    *id = v;
    return Status::ok();
  }
  bool ipcWithinProcess() const override {
    return false;
  }
  bool rdmaWritesOrdered(int device) override {
    using AttributeFn = CUresult (*)(int*, CUdevice_attribute, CUdevice);
    static const auto attribute = reinterpret_cast<AttributeFn>(driverEntryPoint("cuDeviceGetAttribute"));
    int scope = 0;
    if (!attribute || device < 0 ||
        attribute(&scope, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING, device) != CUDA_SUCCESS)
      return false;
    // OWNER: the device that owns the memory sees the writes in order (that device is the
    // consumer here); ALL_DEVICES orders them for every device.
    return scope >= CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER;
  }
  // Transport device code runs as its kernel twin (the gdr transport's device-side post,
  // transports/gdr/gdr_kernels.cu); host-compiled functions without one are refused.
  bool runsDeviceFunction(DeviceFunction fn) const override {
    return devices_ > 0 && kernelTwin(fn) != nullptr;
  }
  Status launchDeviceFunction(DeviceFunction fn, void* arg, const void* src, size_t bytes,
                              ridgeStream_t stream) override {
    const KernelTwin twin = devices_ > 0 ? kernelTwin(fn) : nullptr;
    if (!twin)
      return Status(ridgeInvalidUsage, "the CUDA runtime runs transport device code only as a kernel twin");
    return twin(arg, src, bytes, stream);
  }
  Status mapHostRange(void* addr, size_t bytes, HostRangeKind kind, uint64_t* deviceAddress) override {
    if (devices_ == 0)
      return makeError(ridgeInvalidUsage, "mapping host memory into a device needs a CUDA device");
    unsigned flags = cudaHostRegisterPortable | cudaHostRegisterMapped;
    if (kind == HostRangeKind::IoMemory) flags |= cudaHostRegisterIoMemory;
    const cudaError_t e = cudaHostRegister(addr, bytes, flags);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return makeError(ridgeUnhandledCudaError, "cudaHostRegister(%p, %zu bytes%s): %s%s", addr, bytes,
                       kind == HostRangeKind::IoMemory ? ", IoMemory" : "", cudaGetErrorString(e),
                       kind == HostRangeKind::IoMemory && e == cudaErrorNotPermitted
                           ? " (I/O memory as a non-root user needs the NVIDIA driver option "
                             "NVreg_RegistryDwords=\"PeerMappingOverride=1\")"
                           : "");
    }
    void* dev = nullptr;
    const cudaError_t g = cudaHostGetDevicePointer(&dev, addr, 0);
    if (g != cudaSuccess) {
      (void)cudaGetLastError();
      (void)cudaHostUnregister(addr);
      return makeError(ridgeUnhandledCudaError, "cudaHostGetDevicePointer(%p): %s", addr,
                       cudaGetErrorString(g));
    }
    *deviceAddress = reinterpret_cast<uintptr_t>(dev);
    return Status::ok();
  }
  Status unmapHostRange(void* addr) override {
    RIDGE_CUDA_TRY(cudaHostUnregister(addr));
    return Status::ok();
  }
  int deviceByPciBusId(const std::string& busId) override {
    int device = -1;
    if (busId.empty() || cudaDeviceGetByPCIBusId(&device, busId.c_str()) != cudaSuccess) {
      (void)cudaGetLastError();
      return -1;
    }
    return device;
  }
  std::string pciBusId(int device) override {
    char id[32] = {0};
    if (cudaDeviceGetPCIBusId(id, sizeof id, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return "";
    }
    std::string s(id);
    for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  }

 protected:
  Status allocWordPage(size_t bytes, void** host, uint64_t* deviceAddress) override {
    if (devices_ == 0) return makeError(ridgeInvalidUsage, "release words need a CUDA device");
    RIDGE_CUDA_TRY(cudaHostAlloc(host, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    std::memset(*host, 0, bytes);
    void* dev = nullptr;
    RIDGE_CUDA_TRY(cudaHostGetDevicePointer(&dev, *host, 0));
    *deviceAddress = reinterpret_cast<uintptr_t>(dev);
    return Status::ok();
  }

 private:
  int devices_ = 0;
  WaitValue32Fn waitValue32_ = nullptr;        // set once by the constructor; null: not provided
  std::atomic<bool> waitNotSupported_{false};  // the first call answered CUDA_ERROR_NOT_SUPPORTED
  std::mutex preloadMutex_;
  std::set<int> preloaded_;  // devices whose kernels preloadKernels loaded (preloadMutex_)
};

}  // namespace

DeviceRuntime* cudaRuntime() {
  // Created on first use and never destroyed: user streams may wait on its release words
  // until the process ends.
  static CudaRuntime* rt = new CudaRuntime();
  return rt;
}

}  // namespace ridge::device
