#include "transports/net/device_registration.h"

#include <dlfcn.h>
#include <unistd.h>

#include <mutex>

#include "core/log.h"

namespace ridge {

const char* deviceRegPathName(DeviceRegPath p) {
  return p == DeviceRegPath::DmaBuf ? "dma-buf" : "peer memory (nvidia-peermem)";
}

void pageAlignRange(uintptr_t addr, size_t bytes, size_t page, uintptr_t* start, size_t* length) {
  const uintptr_t mask = static_cast<uintptr_t>(page) - 1;
  *start = addr & ~mask;
  const uintptr_t end = (addr + (bytes ? bytes : 1) + mask) & ~mask;
  *length = static_cast<size_t>(end - *start);
}

Status registerDeviceRange(verbs::ProtectionDomain* pd, DeviceMemoryRegistrar* registrar, const void* addr,
                           size_t bytes, uint32_t access, std::unique_ptr<verbs::MemoryRegion>* out,
                           DeviceRegPath* path) {
  if (!pd || !registrar || !addr)
    return makeError(ridgeInvalidArgument, "net: device registration without a range");
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  uintptr_t start = 0;
  size_t length = 0;
  pageAlignRange(reinterpret_cast<uintptr_t>(addr), bytes, page, &start, &length);
  int fd = -1;
  Status dmabuf = registrar->exportDmaBuf(start, length, &fd);
  if (dmabuf.isOk()) {
    // Offset 0 of a buffer that is exactly the range; iova = the device address.
    dmabuf = pd->registerDmaBuf(fd, 0, length, start, access, out);
    close(fd);  // the registration holds its own reference to the buffer
    if (dmabuf.isOk()) {
      *path = DeviceRegPath::DmaBuf;
      RIDGE_INFO("net: device memory [0x%lx, +%zu) registered through dma-buf (%s)",
                 static_cast<unsigned long>(start), length, registrar->name());
      return Status::ok();
    }
  }
  Status peer = pd->registerMemory(reinterpret_cast<void*>(start), length, access, out);
  if (!peer.isOk())
    return makeError(peer.code(),
                     "net: cannot register device memory [0x%lx, +%zu): dma-buf: %s; peer memory "
                     "(needs nvidia-peermem): %s",
                     static_cast<unsigned long>(start), length, dmabuf.message().c_str(),
                     peer.message().c_str());
  *path = DeviceRegPath::PeerMemory;
  RIDGE_INFO(
      "net: device memory [0x%lx, +%zu) registered through peer memory (nvidia-peermem): no dma-buf: %s",
      static_cast<unsigned long>(start), length, dmabuf.message().c_str());
  return Status::ok();
}

namespace {

// The few driver API declarations used, from the public ABI of cuda.h (CUresult and the
// enums are ints, CUdeviceptr is an unsigned 64-bit integer on 64-bit hosts).
using CUresult = int;
using CUdeviceptr = unsigned long long;
constexpr int kPointerAttributeMemoryType = 2;   // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kPointerAttributeRangeStart = 11;  // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
constexpr int kPointerAttributeRangeSize = 12;   // CU_POINTER_ATTRIBUTE_RANGE_SIZE
constexpr unsigned kMemoryTypeDevice = 2;        // CU_MEMORYTYPE_DEVICE
constexpr int kRangeHandleDmaBufFd = 1;          // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD

class CudaDriverRegistrar final : public DeviceMemoryRegistrar {
 public:
  const char* name() const override { return "CUDA driver, cuMemGetHandleForAddressRange"; }

  // Loads the library and the entry points; "" or why not.
  std::string load() {
    lib_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib_) {
      const char* e = dlerror();
      return std::string("cannot load libcuda.so.1: ") + (e ? e : "dlopen failed");
    }
    pointerGetAttribute_ =
        reinterpret_cast<CUresult (*)(void*, int, CUdeviceptr)>(dlsym(lib_, "cuPointerGetAttribute"));
    getErrorString_ = reinterpret_cast<CUresult (*)(CUresult, const char**)>(dlsym(lib_, "cuGetErrorString"));
    // Absent before CUDA 11.7: then there is no dma-buf, only peer memory.
    getHandleForAddressRange_ =
        reinterpret_cast<CUresult (*)(void*, CUdeviceptr, size_t, int, unsigned long long)>(
            dlsym(lib_, "cuMemGetHandleForAddressRange"));
    if (!pointerGetAttribute_) return "libcuda.so.1 has no cuPointerGetAttribute";
    return {};
  }

  bool deviceAllocation(const void* addr, uintptr_t* base, size_t* bytes) override {
    const CUdeviceptr p = reinterpret_cast<CUdeviceptr>(addr);
    unsigned type = 0;
    // Fails (CUDA_ERROR_NOT_INITIALIZED, INVALID_VALUE) for host memory and in processes
    // that never used CUDA: both mean "not device memory".
    if (pointerGetAttribute_(&type, kPointerAttributeMemoryType, p) != 0 || type != kMemoryTypeDevice)
      return false;
    CUdeviceptr start = 0;
    size_t size = 0;
    if (pointerGetAttribute_(&start, kPointerAttributeRangeStart, p) != 0 ||
        pointerGetAttribute_(&size, kPointerAttributeRangeSize, p) != 0 || size == 0)
      return false;
    *base = static_cast<uintptr_t>(start);
    *bytes = size;
    return true;
  }

  Status exportDmaBuf(uintptr_t base, size_t bytes, int* fd) override {
    if (!getHandleForAddressRange_)
      return makeError(ridgeSystemError,
                       "this CUDA driver has no cuMemGetHandleForAddressRange (CUDA < 11.7)");
    int handle = -1;
    const CUresult r =
        getHandleForAddressRange_(&handle, static_cast<CUdeviceptr>(base), bytes, kRangeHandleDmaBufFd, 0);
    if (r != 0) {
      const char* text = nullptr;
      if (getErrorString_) getErrorString_(r, &text);
      return makeError(ridgeSystemError, "cuMemGetHandleForAddressRange(DMA_BUF_FD): %s (CUresult %d)",
                       text ? text : "unknown error", r);
    }
    *fd = handle;
    return Status::ok();
  }

 private:
  void* lib_ = nullptr;  // kept loaded for the life of the process
  CUresult (*pointerGetAttribute_)(void*, int, CUdeviceptr) = nullptr;
  CUresult (*getErrorString_)(CUresult, const char**) = nullptr;
  CUresult (*getHandleForAddressRange_)(void*, CUdeviceptr, size_t, int, unsigned long long) = nullptr;
};

}  // namespace

DeviceMemoryRegistrar* cudaDriverRegistrar(std::string* whyNot) {
  static std::once_flag once;
  static CudaDriverRegistrar* registrar = nullptr;
  static std::string failure;
  std::call_once(once, [] {
    auto* r = new CudaDriverRegistrar();  // process lifetime: callers hold the pointer
    failure = r->load();
    if (failure.empty())
      registrar = r;
    else
      delete r;
  });
  if (!registrar && whyNot) *whyNot = failure;
  return registrar;
}

}  // namespace ridge
