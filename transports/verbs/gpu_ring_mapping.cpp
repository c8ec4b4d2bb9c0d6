// Page-granular mapping of NIC rings and doorbell pages into a GPU (gpu_ring_mapping.h).
#include "transports/verbs/gpu_ring_mapping.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <mutex>

namespace ridge {
namespace verbs {
namespace {

// Every page range mapped into a runtime by any GpuRingMapping of this process, with how many
// map() calls hold it. Process-wide because the pages are: two communicators (ranks as threads,
// or two links of one rank) get doorbell records from the same allocator, so their records can
// share a page (libmlx5 carves doorbell records of one context out of shared pages; the test NIC
// takes them from malloc), and CUDA refuses to register a page twice. Whether two ranks' records
// landed in one page depended on which malloc arena each thread got, so the second rank's
// mapping failed only sometimes, under load (issue 23) — and then it fell down the ladder.
struct SharedRange {
  uintptr_t start;
  size_t bytes;
  uint64_t deviceStart;
  device::DeviceRuntime::HostRangeKind kind;
  int holders;
};
std::mutex gRangesMutex;
std::map<device::DeviceRuntime*, std::vector<SharedRange>> gRanges;

}  // namespace

GpuRingMapping::~GpuRingMapping() {
  std::lock_guard<std::mutex> g(gRangesMutex);
  auto it = gRanges.find(runtime_);
  if (it == gRanges.end()) return;
  std::vector<SharedRange>& ranges = it->second;
  for (uintptr_t start : held_) {
    auto r =
        std::find_if(ranges.begin(), ranges.end(), [&](const SharedRange& s) { return s.start == start; });
    if (r == ranges.end() || --r->holders > 0) continue;
    (void)runtime_->unmapHostRange(reinterpret_cast<void*>(r->start));
    ranges.erase(r);
  }
  if (ranges.empty()) gRanges.erase(it);
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
  std::lock_guard<std::mutex> g(gRangesMutex);
  std::vector<SharedRange>& ranges = gRanges[runtime_];
  for (SharedRange& r : ranges) {
    const uintptr_t rEnd = r.start + r.bytes;
    if (start >= r.start && end <= rEnd) {
      if (r.kind != kind)
        return makeError(ridgeInternalError, "verbs: %p is mapped into the GPU as another kind of memory",
                         addr);
      if (std::find(held_.begin(), held_.end(), r.start) == held_.end()) {
        ++r.holders;
        held_.push_back(r.start);
      }
      *deviceAddress = r.deviceStart + (a - r.start);
      return Status::ok();
    }
    if (start < rEnd && end > r.start)
      return makeError(ridgeInternalError,
                       "verbs: [%p, +%zu) straddles a range already mapped into the GPU (%#lx, +%zu)", addr,
                       bytes, static_cast<unsigned long>(r.start), r.bytes);
  }
  uint64_t deviceStart = 0;
  const Status st = runtime_->mapHostRange(reinterpret_cast<void*>(start), end - start, kind, &deviceStart);
  if (!st.isOk()) {
    if (ranges.empty()) gRanges.erase(runtime_);
    return st;
  }
  ranges.push_back({start, static_cast<size_t>(end - start), deviceStart, kind, 1});
  held_.push_back(start);
  *deviceAddress = deviceStart + (a - start);
  return Status::ok();
}

}  // namespace verbs
}  // namespace ridge
