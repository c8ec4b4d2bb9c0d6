// Page-granular mapping of NIC rings and doorbell pages into a GPU (gpu_ring_mapping.h).
#include "transports/verbs/gpu_ring_mapping.h"

#include <unistd.h>

namespace ridge {
namespace verbs {

GpuRingMapping::~GpuRingMapping() {
  for (const Range& r : ranges_) (void)runtime_->unmapHostRange(reinterpret_cast<void*>(r.start));
}

Status GpuRingMapping::map(const void* addr, size_t bytes, device::DeviceRuntime::HostRangeKind kind,
                           uint64_t* deviceAddress) {
  if (!runtime_) return makeError(ridgeInvalidUsage, "verbs: no device runtime to map NIC memory into");
  if (!addr || bytes == 0)
    return makeError(ridgeInvalidArgument, "verbs: mapping an empty range into the GPU");
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  const uintptr_t start = a & ~(page - 1);
  const uintptr_t end = (a + bytes + page - 1) & ~(page - 1);
  for (const Range& r : ranges_) {
    const uintptr_t rEnd = r.start + r.bytes;
    if (start >= r.start && end <= rEnd) {
      if (r.kind != kind)
        return makeError(ridgeInternalError, "verbs: %p is mapped into the GPU as another kind of memory",
                         addr);
      *deviceAddress = r.deviceStart + (a - r.start);
      return Status::ok();
    }
    if (start < rEnd && end > r.start)
      return makeError(ridgeInternalError,
                       "verbs: [%p, +%zu) straddles a range already mapped into the GPU (%#lx, +%zu)", addr,
                       bytes, static_cast<unsigned long>(r.start), r.bytes);
  }
  uint64_t deviceStart = 0;
  RIDGE_TRY(runtime_->mapHostRange(reinterpret_cast<void*>(start), end - start, kind, &deviceStart));
  ranges_.push_back({start, static_cast<size_t>(end - start), deviceStart, kind});
  *deviceAddress = deviceStart + (a - start);
  return Status::ok();
}

}  // namespace verbs
}  // namespace ridge
