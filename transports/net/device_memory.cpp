#include "transports/net/device_memory.h"

#include <unistd.h>

namespace ridge {

Status RuntimeDeviceMemory::allocate(size_t bytes, void** out) {
  const size_t rounded = (bytes + kGranule - 1) / kGranule * kGranule;
  return rt_->allocDevice(rounded ? rounded : kGranule, out);
}

void RuntimeDeviceMemory::release(void* p, size_t /*bytes*/) {
  rt_->freeDevice(p);
}

bool RuntimeDeviceMemory::deviceAllocation(const void* addr, uintptr_t* base, size_t* bytes) {
  if (rt_->classify(addr).kind != device::PointerKind::Device) return false;
  void* b = nullptr;
  size_t n = 0;
  if (!rt_->allocationRange(addr, &b, &n).isOk()) return false;
  *base = reinterpret_cast<uintptr_t>(b);
  *bytes = n;
  return true;
}

Status RuntimeDeviceMemory::exportDmaBuf(uintptr_t base, size_t bytes, int* fd) {
  return rt_->exportDmaBuf(reinterpret_cast<const void*>(base), bytes, fd);
}

bool RuntimeDeviceMemory::dmaBufWorks(device::DeviceRuntime* rt, std::string* whyNot) {
  void* p = nullptr;
  Status s = rt->allocDevice(kGranule, &p);
  if (s.isOk()) {
    int fd = -1;
    s = rt->exportDmaBuf(p, kGranule, &fd);
    if (fd >= 0) close(fd);
    rt->freeDevice(p);
  }
  if (!s.isOk() && whyNot) *whyNot = s.message();
  return s.isOk();
}

}  // namespace ridge
