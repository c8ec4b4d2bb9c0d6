// Device memory for the net transport's slots, from the active device runtime
// (src/device/runtime.h): the NetRingAllocator (net_transport.h) that the device network of a
// communicator (classic GPUDirect RDMA data path, docs/gpu.md) hands its net transport, and
// the DeviceMemoryRegistrar (device_registration.h) that registers that memory with the NIC
// through the runtime's dma-buf export. With CudaRuntime the slots are cudaMalloc memory;
// with the emulator they are memfd-backed memory the host cannot touch, so tests show that
// no slot is ever read or written by the CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "device/runtime.h"
#include "transports/net/device_registration.h"
#include "transports/net/net_transport.h"

namespace ridge {

class RuntimeDeviceMemory final : public NetRingAllocator, public DeviceMemoryRegistrar {
 public:
  // Memory of `device` (the communicator's; the calling thread must have it current when
  // allocate() runs, as init's thread does).
  RuntimeDeviceMemory(device::DeviceRuntime* rt, int device) : rt_(rt), device_(device) {}

  // Whole multiples of kGranule, so that the allocation starts and ends on host page
  // boundaries, as a dma-buf export requires of the range it is given.
  static constexpr size_t kGranule = size_t(2) << 20;

  Status allocate(size_t bytes, void** out) override;
  void release(void* p, size_t bytes) override;
  DeviceMemoryRegistrar* registrar() override { return this; }
  int device() const override { return device_; }

  const char* name() const override { return rt_->name(); }
  bool deviceAllocation(const void* addr, uintptr_t* base, size_t* bytes) override;
  Status exportDmaBuf(uintptr_t base, size_t bytes, int* fd) override;

  // Whether the runtime exports device memory as dma-buf here: one small allocation,
  // exported once and freed. What a rank reports at init before its communicator builds a
  // device network (every rank must agree).
  static bool dmaBufWorks(device::DeviceRuntime* rt, std::string* whyNot);

 private:
  device::DeviceRuntime* rt_;
  int device_;
};

}  // namespace ridge
