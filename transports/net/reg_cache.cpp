#include "transports/net/reg_cache.h"

#include <unistd.h>

#include <algorithm>

namespace ridge {

Status RegistrationCache::get(const void* addr, size_t bytes, uint32_t access, verbs::MemoryRegion** out) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  ++clock_;
  for (Entry& e : entries_) {
    if (e.start <= a && a + bytes <= e.end && (e.access & access) == access) {
      e.lastUse = clock_;
      ++hits_;
      *out = e.mr.get();
      return Status::ok();
    }
  }
  ++misses_;
  uintptr_t start = 0, end = 0;
  std::unique_ptr<verbs::MemoryRegion> mr;
  RIDGE_TRY(registerRange(addr, bytes, access, &start, &end, &mr));
  if (entries_.size() >= capacity_ && !entries_.empty()) {
    auto lru = std::min_element(entries_.begin(), entries_.end(),
                                [](const Entry& x, const Entry& y) { return x.lastUse < y.lastUse; });
    entries_.erase(lru);
  }
  entries_.push_back(Entry{start, end, access, clock_, std::move(mr)});
  *out = entries_.back().mr.get();
  return Status::ok();
}

Status RegistrationCache::registerRange(const void* addr, size_t bytes, uint32_t access, uintptr_t* start,
                                        uintptr_t* end, std::unique_ptr<verbs::MemoryRegion>* mr) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  uintptr_t allocBase = 0;
  size_t allocBytes = 0;
  if (registrar_ && registrar_->deviceAllocation(addr, &allocBase, &allocBytes)) {
    if (a < allocBase || a + bytes > allocBase + allocBytes)
      return makeError(
          ridgeInvalidArgument, "net: [0x%lx, +%zu) runs past the end of its device allocation [0x%lx, +%zu)",
          static_cast<unsigned long>(a), bytes, static_cast<unsigned long>(allocBase), allocBytes);
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
  return pd_->registerMemory(reinterpret_cast<void*>(*start), length, access, mr);
}

void RegistrationCache::invalidate(const void* addr, size_t bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                [&](const Entry& e) { return e.start < a + bytes && a < e.end; }),
                 entries_.end());
}

}  // namespace ridge
