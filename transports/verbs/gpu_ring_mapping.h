// NIC memory that a GPU producer writes (mlx5 send queue, doorbell records, CQ buffer, the UAR
// doorbell page, on-NIC staging memory), mapped into the GPU through the device-runtime seam
// (DeviceRuntime::mapHostRange: cudaHostRegister, with the I/O-memory flag for the UAR page and
// on-NIC memory). Ranges are widened to whole pages, as the registration works on pages, and a
// range whose pages this mapping already holds (the QP's and CQ's doorbell records usually share
// one page) reuses that mapping instead of registering the page twice, which CUDA refuses.
// The reuse is process-wide: another GpuRingMapping over the same runtime (another link, or
// another rank's communicator in this process) that needs a page already mapped shares that
// registration; a page is unmapped when the last mapping holding it goes, before the NIC objects
// themselves.
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
  // How many registrations this mapping holds (shared ones included).
  size_t rangesMapped() const { return held_.size(); }

 private:
  device::DeviceRuntime* runtime_;
  std::vector<uintptr_t> held_;  // start of each process-wide range this mapping holds once
};

}  // namespace verbs
}  // namespace ridge
