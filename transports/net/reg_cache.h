// Registration cache: memory registration is expensive (on hardware it pins pages and
// programs the NIC's translation table), so a transport registers a range once and looks
// it up afterwards. Ranges are rounded out to whole pages; a lookup is satisfied by any
// cached region that covers it with at least the requested access. When more than
// `capacity` regions are cached, the least recently used one is deregistered.
//
// Device (GPU) memory, when a DeviceMemoryRegistrar is set: a miss on device memory
// registers the whole device allocation that holds the range (dma-buf, else peer memory;
// see device_registration.h), so that every later buffer inside the same allocation hits.
// Such entries are keyed by the allocation's range; invalidate() before freeing it.
//
// Not thread safe: one per transport, used from the thread that drives it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "transports/net/device_registration.h"
#include "transports/verbs/verbs.h"

namespace ridge {

class RegistrationCache {
 public:
  RegistrationCache(verbs::ProtectionDomain* pd, size_t capacity) : pd_(pd), capacity_(capacity) {}
  // The region covering [addr, addr + bytes) with `access`; registers one if none does. The
  // pointer stays valid until the region is evicted (capacity) or invalidated. *onDevice
  // (when given): the region is device memory (decided when it was registered).
  // `mayEvict` false: when the cache is full, a miss fails instead of deregistering the least
  // recently used region (which a posted WQE or an advert may still name); callers then fall
  // back to their slot path.
  Status get(const void* addr, size_t bytes, uint32_t access, verbs::MemoryRegion** out,
             bool* onDevice = nullptr, bool mayEvict = true);
  // Drops every cached region overlapping the range (call before freeing memory).
  void invalidate(const void* addr, size_t bytes);
  // Lets the cache recognise and register device memory (nullptr: everything is host).
  void setDeviceRegistrar(DeviceMemoryRegistrar* r) { registrar_ = r; }
  // Host memory, when `window` > 0: a miss registers the whole mapping that holds the range
  // (from /proc/self/maps), clipped to the `window`-aligned span around it, so that later
  // chunks of the same caller buffer hit instead of registering each chunk. 0 (default):
  // exactly the page-rounded range.
  void setHostWindow(size_t window) { hostWindow_ = window; }
  uint64_t dmaBufRegistrations() const { return dmaBufRegs_; }
  uint64_t peerMemoryRegistrations() const { return peerMemRegs_; }
  size_t size() const { return entries_.size(); }
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }

 private:
  struct Entry {
    uintptr_t start;
    uintptr_t end;
    uint32_t access;
    uint64_t lastUse;
    std::unique_ptr<verbs::MemoryRegion> mr;
    bool device;
  };
  Status registerRange(const void* addr, size_t bytes, uint32_t access, uintptr_t* start, uintptr_t* end,
                       std::unique_ptr<verbs::MemoryRegion>* mr, bool* device);
  verbs::ProtectionDomain* pd_;
  size_t capacity_;
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
  DeviceMemoryRegistrar* registrar_ = nullptr;
  size_t hostWindow_ = 0;
  uint64_t dmaBufRegs_ = 0;
  uint64_t peerMemRegs_ = 0;
};

}  // namespace ridge
