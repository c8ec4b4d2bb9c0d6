// Classic GPUDirect RDMA registration: making GPU memory an RDMA memory region, so the NIC
// reads and writes it directly (no host staging).
//
// Two ways exist, tried in this order:
//   1. dma-buf. The GPU driver exports the device range as a dma-buf file descriptor
//      (CUDA driver API cuMemGetHandleForAddressRange with CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
//      CUDA 11.7+, Linux 5.12+ kernel, open GPU kernel modules) and the verbs provider
//      registers the fd (ibv_reg_dmabuf_mr in rdma-core). The range must start and end on
//      host page boundaries; the driver refuses anything else.
//   2. peer memory. With the nvidia-peermem kernel module loaded, plain ibv_reg_mr accepts
//      a GPU virtual address (the module resolves it to GPU pages for the RDMA core).
// Which one was used is logged at INFO ("net: device memory ... registered through ...").
//
// Nothing here links CUDA: the driver API is loaded at run time from libcuda.so.1, so the
// same build runs on machines with and without a GPU. Where there is no driver, nothing
// is device memory and every registration is a host one.
//
// Receive-side flush (docs/transports.md, "GPU memory"): after the NIC has written GPU
// memory and its completion has been seen, the GPU may not see the data yet; a read of
// that memory by the same NIC (an RDMA READ through a loopback QP) orders it. The net
// transport does that for receive rings in device memory (RIDGE_GDR_FLUSH,
// net_transport.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "transports/verbs/verbs.h"

namespace ridge {

// Classifies addresses and exports device memory as dma-buf. The CUDA driver one is
// cudaDriverRegistrar(); tests give their own (memfd-backed "device" buffers).
class DeviceMemoryRegistrar {
 public:
  virtual ~DeviceMemoryRegistrar() = default;
  virtual const char* name() const = 0;
  // True when `addr` is device memory; then [*base, *base + *bytes) is the allocation
  // that holds it (what a cache keys on: one registration serves every buffer inside).
  virtual bool deviceAllocation(const void* addr, uintptr_t* base, size_t* bytes) = 0;
  // A new dma-buf fd for [base, base + bytes) (both page aligned), which the caller closes;
  // an error saying why not (no dma-buf support, driver too old, ...).
  virtual Status exportDmaBuf(uintptr_t base, size_t bytes, int* fd) = 0;
};

enum class DeviceRegPath { DmaBuf, PeerMemory };
const char* deviceRegPathName(DeviceRegPath p);

// [addr, addr + bytes) rounded out to whole pages of `page` bytes (a power of two); bytes 0
// counts as 1 so the result always covers at least a page.
void pageAlignRange(uintptr_t addr, size_t bytes, size_t page, uintptr_t* start, size_t* length);

// Registers device memory [addr, addr + bytes) (rounded out to host pages) with `pd`:
// dma-buf first (the region's addresses are the device virtual addresses, so WQEs use
// them as they use host addresses), plain registration (peer memory) when there is no
// dma-buf export or the provider refuses it. Logs which one at INFO; *path says it too.
// Fails only when both fail, with both reasons.
Status registerDeviceRange(verbs::ProtectionDomain* pd, DeviceMemoryRegistrar* registrar, const void* addr,
                           size_t bytes, uint32_t access, std::unique_ptr<verbs::MemoryRegion>* out,
                           DeviceRegPath* path);

// The CUDA driver's registrar (libcuda.so.1, loaded once per process), or nullptr with
// *whyNot when there is no usable driver. Pointers are device memory when the driver says
// CU_MEMORYTYPE_DEVICE; a process that never initialised CUDA has none.
DeviceMemoryRegistrar* cudaDriverRegistrar(std::string* whyNot);

}  // namespace ridge
