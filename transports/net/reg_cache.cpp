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
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t start = a & ~(page - 1);
  const uintptr_t end = (a + std::max<size_t>(bytes, 1) + page - 1) & ~(page - 1);
  std::unique_ptr<verbs::MemoryRegion> mr;
  RIDGE_TRY(pd_->registerMemory(reinterpret_cast<void*>(start), end - start, access, &mr));
  if (entries_.size() >= capacity_ && !entries_.empty()) {
    auto lru = std::min_element(entries_.begin(), entries_.end(),
                                [](const Entry& x, const Entry& y) { return x.lastUse < y.lastUse; });
    entries_.erase(lru);
  }
  entries_.push_back(Entry{start, end, access, clock_, std::move(mr)});
  *out = entries_.back().mr.get();
  return Status::ok();
}

void RegistrationCache::invalidate(const void* addr, size_t bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                [&](const Entry& e) { return e.start < a + bytes && a < e.end; }),
                 entries_.end());
}

}  // namespace ridge
