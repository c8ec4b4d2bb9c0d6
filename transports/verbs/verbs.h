// The verbs subset Ridge drives: just what an RDMA-write data path needs (device, protection
// domain, memory registration, on-NIC device memory, RC queue pairs, RDMA WRITE / WRITE
// WITH IMMEDIATE / SEND / RECV, completion queues), plus RDMA READ (the receive-side GPU
// flush reads a few bytes back through a loopback QP), as an abstract interface with two
// providers: "verbs" (rdma-core's libibverbs, built when RIDGE_WITH_VERBS is on) and
// "softnic" (a NIC emulated in user space, always built).
//
// Work requests and completions handed to postSend / returned by poll use the plain-data
// structs of verbs_layout.h (as ibv_send_wr / ibv_wc do); the queues themselves are in the
// mlx5 wire format (kernels/gdr/mlx5_wire.h), which a provider that exposes them (mlx5Sq(),
// mlx5Cq()) lets a GPU thread write and poll directly.
//
// Object lifetimes nest: a Device outlives its ProtectionDomains, which outlive their
// regions, device memory, CQs and QPs; a CQ outlives the QPs that use it. Calls on one
// object are not thread safe (one poster per QP, one poller per CQ), except where said.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/gdr/mlx5_wire.h"
#include "transports/verbs/gdr_ladder.h"
#include "transports/verbs/verbs_layout.h"

namespace ridge::device {
class DeviceRuntime;
}

namespace ridge {
namespace verbs {

// RC queue pair states of the subset. SQD and SQE are left out: nothing here drains a
// send queue without an error.
enum class QpState : uint8_t { Reset, Init, Rtr, Rts, Error };
const char* qpStateName(QpState s);
// The transitions both providers accept: RESET->INIT, INIT->RTR, RTR->RTS, any->ERROR,
// any->RESET. Anything else is refused with ridgeInvalidUsage before the provider acts.
bool qpTransitionAllowed(QpState from, QpState to);

enum Access : uint32_t {
  kAccessLocalWrite = 1,
  kAccessRemoteWrite = 2,
  kAccessRemoteRead = 4,
};

struct DeviceAttributes {
  std::string name;      // e.g. "mlx5_0" or "softnic0"
  std::string provider;  // "verbs" or "softnic"
  uint64_t maxMrBytes = 0;
  uint32_t maxQpWr = 0;
  uint32_t maxCqe = 0;
  uint64_t maxDeviceMemoryBytes = 0;  // on-NIC memory (0: none)
  uint32_t portCount = 0;
  bool portActive = false;  // port 1 is ACTIVE
  uint32_t mtuBytes = 0;
};

// A QP's connection address, exchanged out of band (bootstrap) before RTR. Opaque to
// users; each provider fills the bytes with what its peer needs (engine endpoint and QP
// number; LID/GID/QPN/PSN).
struct QpAddress {
  uint8_t bytes[96];
};

struct QpCaps {
  uint32_t maxSendWr = 64;  // rounded up to a power of two
  uint32_t maxRecvWr = 64;
  // Create the QP through mlx5 direct verbs and expose its hardware rings (mlx5Sq(): the
  // NIC's own send queue, doorbell record and UAR, no proxy in between):
  // rdma-core provider only, an error naming why where the device is not an mlx5 one or
  // libmlx5 is missing. The software NIC ignores it (its rings are always exposed).
  bool mlx5Direct = false;
};

class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  uint64_t addr() const { return addr_; }  // 0 for device memory (zero-based)
  size_t length() const { return length_; }
  uint32_t lkey() const { return lkey_; }
  uint32_t rkey() const { return rkey_; }

 protected:
  uint64_t addr_ = 0;
  size_t length_ = 0;
  uint32_t lkey_ = 0;
  uint32_t rkey_ = 0;
};

// Memory on the NIC (staging for GDR-write). Registered zero-based: WQEs address it by
// offset with region()->lkey().
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual size_t size() const = 0;
  virtual Status copyTo(size_t offset, const void* src, size_t bytes) = 0;
  virtual Status copyFrom(void* dst, size_t offset, size_t bytes) = 0;
  virtual MemoryRegion* region() = 0;
  // A CPU mapping of the memory, or nullptr where the provider cannot map it (then only
  // copyTo/copyFrom reach it). rdma-core: mlx5dv_init_obj(MLX5DV_OBJ_DM); a GPU maps that
  // with DeviceRuntime::mapHostRange(I/O memory), see gdr_ladder.h.
  virtual void* mapped() { return nullptr; }
};

class CompletionQueue {
 public:
  virtual ~CompletionQueue() = default;
  // Copies up to `max` completions out; returns how many (0 when empty), or -1 on a
  // provider failure.
  virtual int poll(Cqe* out, int max) = 0;
  // Returns when a completion may be ready, after at most maxWaitNs, or at once when
  // `stillIdle(arg)` (re-checked after announcing the sleep) says there is other work.
  // May return early spuriously. Thread safe against the NIC, not against other pollers.
  virtual void wait(int64_t maxWaitNs, bool (*stillIdle)(void*), void* arg) = 0;
  // The mlx5 CQ (kernels/gdr/mlx5_wire.h) for pollers that bypass the provider, or nullptr.
  // Polling it directly and through poll() must not be mixed on one CQ.
  virtual const mlx5::CqView* mlx5Cq() const { return nullptr; }
};

class QueuePair {
 public:
  virtual ~QueuePair() = default;
  virtual uint32_t qpn() const = 0;
  virtual QpState state() const = 0;
  virtual Status localAddress(QpAddress* out) const = 0;
  // Moves to `to`; `remote` is required for RTR (the peer's localAddress()). After a move to
  // ERROR the NIC reads no more send payload and lands nothing more for this QP (softnic:
  // synchronously with its engine; rdma-core: as the HCA stops the QP).
  virtual Status modify(QpState to, const QpAddress* remote = nullptr) = 0;
  // Posts one send WQE (qpn and index are filled in). ridgeInvalidUsage when the QP is not
  // in RTS, ridgeInternalError "send queue full" when every slot is in use.
  virtual Status postSend(const Wqe& wqe) = 0;
  virtual Status postRecv(const RecvWqe& wqe) = 0;
  // Free send-queue slots right now.
  virtual uint32_t sendSlotsFree() const = 0;
  // The mlx5 send queue (kernels/gdr/mlx5_wire.h) for producers that bypass postSend (GPU
  // threads), or nullptr. A QP is driven either through it or through postSend, not both.
  virtual const mlx5::SqView* mlx5Sq() const { return nullptr; }
};

class ProtectionDomain {
 public:
  virtual ~ProtectionDomain() = default;
  // Registers host memory with `access` (Access bits).
  virtual Status registerMemory(void* addr, size_t bytes, uint32_t access,
                                std::unique_ptr<MemoryRegion>* out) = 0;
  // GPU memory: registration of a dma-buf (exported by the GPU driver) at `offset` of the
  // buffer, mapped at `iova` in WQEs. rdma-core: ibv_reg_dmabuf_mr. softnic: mmap of the fd
  // (works for mappable buffers such as memfd; see transports/net/device_registration.h for
  // the export and the peer-memory fallback). The default refuses with ridgeInvalidUsage.
  virtual Status registerDmaBuf(int fd, uint64_t offset, size_t bytes, uint64_t iova, uint32_t access,
                                std::unique_ptr<MemoryRegion>* out);
  virtual Status allocDeviceMemory(size_t bytes, uint32_t access, std::unique_ptr<DeviceMemory>* out) = 0;
  virtual Status createCq(uint32_t entries, std::unique_ptr<CompletionQueue>* out) = 0;
  // A CQ whose hardware mlx5 ring a producer may poll itself (mlx5Cq()): rdma-core creates it with
  // mlx5dv_create_cq, 64-byte CQEs and no CQE compression. The default refuses, naming why.
  virtual Status createMlx5Cq(uint32_t entries, std::unique_ptr<CompletionQueue>* out);
  virtual Status createQp(CompletionQueue* sendCq, CompletionQueue* recvCq, const QpCaps& caps,
                          std::unique_ptr<QueuePair>* out) = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual const DeviceAttributes& attributes() const = 0;
  virtual Status allocPd(std::unique_ptr<ProtectionDomain>* out) = 0;
};

class Provider {
 public:
  virtual ~Provider() = default;
  virtual const char* name() const = 0;
  virtual Status listDevices(std::vector<DeviceAttributes>* out) = 0;
  // Opens device `index` of listDevices().
  virtual Status open(int index, std::unique_ptr<Device>* out) = 0;
};

// "softnic", or "verbs" (ridgeInvalidUsage naming the reason when this build has no
// rdma-core provider; ridgeSystemError "verbs: rdma-core not found: ..." when this machine has
// no libibverbs.so.1: rdma-core is loaded at run time, see ibv_api.h).
Status openProvider(const std::string& name, std::unique_ptr<Provider>* out);

// The facts the GDR-write ladder (gdr_ladder.h) decides on, probed on `device` (rdma-core:
// mlx5 direct queues created and torn down again, their rings and UAR page and on-NIC memory
// of `stagingBytes` mapped into the GPU through `runtime` and unmapped; null runtime: no GPU).
// A device of another provider reports that it is not an rdma-core device.
GdrLadderFacts probeGdrLadder(Device* device, device::DeviceRuntime* runtime, uint64_t stagingBytes);
// The facts without a device: rdma-core loads or not (with the reason); the rest unknown.
GdrLadderFacts gdrLadderFactsWithoutDevice();
// The facts a topology tells about a GPU-NIC pair (`ridge-topo gdr`): the NIC by its OS names
// ("mlx5_0") and model ("ConnectX-7"); `thisHost` when the topology is this machine's (then
// whether rdma-core and libmlx5 load here counts). What only init can try stays unknown.
GdrLadderFacts predictGdrLadderFacts(const std::vector<std::string>& nicOsNames, const std::string& nicModel,
                                     bool thisHost);
// Whether this build includes the rdma-core provider.
bool verbsProviderBuilt();

const char* cqeStatusName(uint8_t status);

// Smallest power of two >= v (v >= 1), and its log2.
uint32_t roundUpPow2(uint32_t v, uint32_t* log2Out = nullptr);

}  // namespace verbs
}  // namespace ridge
