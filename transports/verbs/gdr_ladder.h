// The GDR-write fallback ladder on real NICs: which rung a GPU-NIC pair takes, from facts
// about the host, the NIC and the GPU, as a pure function (no rdma-core, no CUDA), so that
// the transport's set-up, `ridge-topo gdr` and the unit tests all decide the same way.
//
//   gpu-doorbell  the GPU writes the payload, the WQE and the doorbell record into memory it
//                 has mapped (the send queue's ring, staging), then stores to the NIC's UAR
//                 page mapped into it (cudaHostRegister with the I/O-memory flag).
//   cpu-doorbell  as above, but the UAR page cannot be mapped into the GPU: a CPU thread sees
//                 the doorbell record move and writes the UAR for the GPU.
//   host-staged   a copy engine moves the payload to pinned host memory and a CPU proxy posts
//                 through plain verbs (ibv_post_send): works on any rdma-core device.
//   unavailable   rdma-core itself is missing (no libibverbs.so.1): RIDGE_NET=verbs fails.
//
// Each fact is Yes, No (with the reason in words) or Unknown (not probed, e.g. `ridge-topo gdr`
// judging a preset topology): an unknown fact is taken as the rung above would need it and the
// decision is marked predicted, with what still has to hold.
#pragma once

#include <cstdint>
#include <string>

namespace ridge {
namespace verbs {

enum class Fact : uint8_t { Unknown, Yes, No };

struct FactWhy {
  Fact value = Fact::Unknown;
  std::string why;  // for No: what failed; for Yes/Unknown: optional detail
  static FactWhy yes(std::string why = "") { return {Fact::Yes, std::move(why)}; }
  static FactWhy no(std::string why) { return {Fact::No, std::move(why)}; }
  static FactWhy unknown(std::string why = "") { return {Fact::Unknown, std::move(why)}; }
};

struct GdrLadderFacts {
  // libibverbs.so.1 loaded and every symbol Ridge needs resolved.
  FactWhy rdmaCore;
  // libmlx5.so.1 loaded, the NIC is an mlx5 device (mlx5dv_is_supported) and a send queue,
  // completion queue and their doorbell records were created and exposed through mlx5 direct
  // verbs (mlx5dv_create_qp, mlx5dv_create_cq, mlx5dv_init_obj).
  FactWhy directQueues;
  // A GPU in this process that will produce (a CUDA device through the device runtime).
  FactWhy gpu;
  // The rings (send queue buffer, doorbell record, CQ buffer) registered for the GPU
  // (cudaHostRegister mapped): the GPU can write WQEs and poll completions.
  FactWhy ringsMappedForGpu;
  // The UAR page registered for the GPU as I/O memory (cudaHostRegister IoMemory): the GPU can
  // ring the doorbell itself. Non-root use needs NVreg_RegistryDwords="PeerMappingOverride=1".
  FactWhy uarMappedForGpu;
  // On-NIC memory (ibv_alloc_dm): how much the NIC offers (max_dm_size), how much the staging
  // slots need, and whether its mapping could be registered for the GPU.
  bool nicMemoryProbed = true;  // false: size and mapping unknown (no staging decision)
  uint64_t nicMemoryBytes = 0;
  uint64_t stagingBytesNeeded = 0;
  FactWhy nicMemoryMappedForGpu;
};

enum class GdrRung : uint8_t { GpuDoorbell, CpuDoorbell, HostStaged, Unavailable };
const char* gdrRungName(GdrRung r);  // "gpu-doorbell", "cpu-doorbell", "host-staged", "unavailable"

// Where the GPU writes the payload for the two doorbell rungs.
enum class GdrStagingPlace : uint8_t { NicMemory, HostMemory, None };
const char* gdrStagingPlaceName(GdrStagingPlace p);  // "nic-gpu", "host", "none"

struct GdrLadderDecision {
  GdrRung rung = GdrRung::Unavailable;
  std::string reason;  // why this rung and not the one above, in words
  GdrStagingPlace staging = GdrStagingPlace::None;
  std::string stagingReason;
  bool predicted = false;  // an Unknown fact was taken as holding: `reason` says which
};

GdrLadderDecision decideGdrLadder(const GdrLadderFacts& facts);

// One line for logs and tools: "cpu-doorbell (predicted): <reason>; staging host: <why>".
std::string gdrLadderLine(const GdrLadderDecision& d);

}  // namespace verbs
}  // namespace ridge
