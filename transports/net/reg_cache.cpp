#include "transports/net/reg_cache.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace ridge {

namespace {

// The mapping of this process that holds [a, a + bytes), from /proc/self/maps; false when
// none holds all of it (the range spans mappings, or the file cannot be read).
bool mappingHolding(uintptr_t a, size_t bytes, uintptr_t* lo, uintptr_t* hi) {
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (!f) return false;
  bool found = false;
  char line[512];
  while (!found && std::fgets(line, sizeof line, f)) {
    unsigned long s = 0, e = 0;
    if (std::sscanf(line, "%lx-%lx", &s, &e) == 2 && s <= a && a + bytes <= e) {
      *lo = s;
      *hi = e;
      found = true;
    }
  }
  std::fclose(f);
  return found;
}

}  // namespace

Status RegistrationCache::get(const void* addr, size_t bytes, uint32_t access, verbs::MemoryRegion** out,
                              bool* onDevice, bool mayEvict) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  ++clock_;
  for (Entry& e : entries_) {
    if (e.start <= a && a + bytes <= e.end && (e.access & access) == access) {
      e.lastUse = clock_;
      ++hits_;
      *out = e.mr.get();
      if (onDevice) *onDevice = e.device;
      return Status::ok();
    }
  }
  ++misses_;
  if (entries_.size() >= capacity_ && !entries_.empty() && !mayEvict)
    return makeError(ridgeInternalError,
                     "net: registration cache full (%zu regions) while direct transfers may still use them",
                     capacity_);
  uintptr_t start = 0, end = 0;
  std::unique_ptr<verbs::MemoryRegion> mr;
  bool device = false;
  RIDGE_TRY(registerRange(addr, bytes, access, &start, &end, &mr, &device));
  if (entries_.size() >= capacity_ && !entries_.empty()) {
    auto lru = std::min_element(entries_.begin(), entries_.end(),
                                [](const Entry& x, const Entry& y) { return x.lastUse < y.lastUse; });
    entries_.erase(lru);
  }
  entries_.push_back(Entry{start, end, access, clock_, std::move(mr), device});
  *out = entries_.back().mr.get();
  if (onDevice) *onDevice = device;
  return Status::ok();
}

Status RegistrationCache::registerRange(const void* addr, size_t bytes, uint32_t access, uintptr_t* start,
                                        uintptr_t* end, std::unique_ptr<verbs::MemoryRegion>* mr,
                                        bool* device) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  uintptr_t allocBase = 0;
  size_t allocBytes = 0;
  if (registrar_ && registrar_->deviceAllocation(addr, &allocBase, &allocBytes)) {
    if (a < allocBase || a + bytes > allocBase + allocBytes)
      return makeError(
          ridgeInvalidArgument, "net: [0x%lx, +%zu) runs past the end of its device allocation [0x%lx, +%zu)",
          static_cast<unsigned long>(a), bytes, static_cast<unsigned long>(allocBase), allocBytes);
    *device = true;
    DeviceRegPath path = DeviceRegPath::DmaBuf;
    RIDGE_TRY(registerDeviceRange(pd_, registrar_, reinterpret_cast<const void*>(allocBase), allocBytes,
                                  access, mr, &path));
    ++(path == DeviceRegPath::DmaBuf ? dmaBufRegs_ : peerMemRegs_);
    size_t length = 0;
    pageAlignRange(allocBase, allocBytes, page, start, &length);
    *end = *start + length;
    return Status::ok();
  }
  size_t length = 0;
  pageAlignRange(a, bytes, page, start, &length);
  *end = *start + length;
  uintptr_t lo = 0, hi = 0;
  if (hostWindow_ && mappingHolding(a, bytes, &lo, &hi)) {
    const uintptr_t w = hostWindow_;
    *start = std::max(lo, a / w * w);
    *end = std::min(hi, (a + bytes + w - 1) / w * w);
  }
  return pd_->registerMemory(reinterpret_cast<void*>(*start), *end - *start, access, mr);
}

void RegistrationCache::invalidate(const void* addr, size_t bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                [&](const Entry& e) { return e.start < a + bytes && a < e.end; }),
                 entries_.end());
}

}  // namespace ridge
