// NIC memory that a GPU producer writes (mlx5 send queue, doorbell records, CQ buffer, the UAR
// doorbell page, on-NIC staging memory), mapped into the GPU through the device-runtime seam
// (DeviceRuntime::mapHostRange: cudaHostRegister, with the I/O-memory flag for the UAR page and
// on-NIC memory). Ranges are widened to whole pages, as the registration works on pages, and a
// range whose pages this mapping already holds (the QP's and CQ's doorbell records usually share
// one page) reuses that mapping instead of registering the page twice, which CUDA refuses.
// Everything mapped is unmapped when the object goes, before the NIC objects themselves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "device/runtime.h"

namespace ridge {
namespace verbs {

class GpuRingMapping {
 public:
  explicit GpuRingMapping(device::DeviceRuntime* runtime) : runtime_(runtime) {}
  ~GpuRingMapping();
  GpuRingMapping(const GpuRingMapping&) = delete;
  GpuRingMapping& operator=(const GpuRingMapping&) = delete;

  // The device address of `addr` once [addr, addr + bytes) is mapped. A range that overlaps
  // pages mapped before without lying inside one mapping is refused (ridgeInternalError).
  Status map(const void* addr, size_t bytes, device::DeviceRuntime::HostRangeKind kind,
             uint64_t* deviceAddress);
  size_t rangesMapped() const { return ranges_.size(); }

 private:
  struct Range {
    uintptr_t start;
    size_t bytes;
    uint64_t deviceStart;
    device::DeviceRuntime::HostRangeKind kind;
  };
  device::DeviceRuntime* runtime_;
  std::vector<Range> ranges_;
};

}  // namespace verbs
}  // namespace ridge
