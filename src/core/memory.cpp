#include "core/memory.h"

#ifdef RIDGE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ridge {

#ifdef RIDGE_HAVE_CUDA
static bool cudaDevicePresent() {
  // Asked once: on a machine without a GPU (or driver) CUDA reports an error and every
  // pointer is host memory.
  static const bool present = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return n > 0;
  }();
  return present;
}
#endif

MemoryKind classifyMemory(const void* ptr) {
#ifdef RIDGE_HAVE_CUDA
  if (ptr && cudaDevicePresent()) {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, ptr) == cudaSuccess) {
      if (attr.type == cudaMemoryTypeDevice) return MemoryKind::Device;
      if (attr.type == cudaMemoryTypeManaged) return MemoryKind::Managed;
    } else {
      (void)cudaGetLastError();
    }
  }
#else
  (void)ptr;
#endif
  return MemoryKind::Host;
}

const char* memoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::Host: return "host";
    case MemoryKind::Device: return "device";
    case MemoryKind::Managed: return "managed";
  }
  return "?";
}

}  // namespace ridge
