// The gdr transport: network sends in one of three modes, chosen per GPU-NIC pair.
//
//   gdr-read     the producer writes its slot in (GPU) memory the NIC can read; the NIC reads it
//                (classic GPUDirect RDMA).
//   gdr-write    the producer writes the payload straight into a staging slot in NIC-side
//                memory (posted writes), builds the WQE and rings the doorbell itself through
//                the device-side verbs subset (transports/gdr/gdr_device.h); it may only write a
//                slot it holds a credit for, and the NIC gives credits back as sends complete.
//   host-staged  the producer's slot is copied into pinned host memory and a CPU proxy posts
//                the send.
//
// Every mode lands data at the receiver with RDMA WRITE WITH IMMEDIATE into a ring of landing
// slots, and the receiver returns landing credits with plain RDMA writes. On a machine without
// a GPU the "GPU" is the calling thread running the host build of the device-side code.
// docs/gdr-write.md has the protocol, the state machines and what is verified where.
#pragma once

#include <string>

#include "transports/gdr/gdr_device.h"
#include "transports/gdr/gdr_model.h"
#include "transports/transport.h"

namespace ridge::gdr {

extern const TransportTable kGdrTransportTable;

// Sum of the counters of every gdr channel this process has had, open or closed.
Counters processCounters();
std::string countersToString(const Counters& c);

// What set-up decided, for tests and benchmarks (the last gdr transport created).
struct SetupReport {
  Mode mode = Mode::Write;
  std::string modeReason;
  std::string stagingTier;  // "nic-gpu", "nic", "host" or "" (read/staged)
  std::string stagingReason;
  // read: where the producer's slots are and how the NIC got them: "device memory (dma-buf)",
  // "device memory (peer memory)" or "host memory".
  std::string readSlots;
  // write over RIDGE_NET=verbs: the ladder's rung ("" elsewhere), whether the data queues are
  // the NIC's own mlx5 rings (doorbell rungs) and whether they were mapped into the GPU.
  std::string rung;
  bool directQueues = false;
  bool queuesMappedForGpu = false;
  bool paced = false;
  std::string model;  // the advisor's text when RIDGE_SOFTNIC_PCIE_MODEL is set
};
SetupReport lastSetupReport();
// UAR doorbells a CPU thread rang for a producer on the cpu-doorbell rung (process-wide).
uint64_t cpuDoorbellsRung();
// Tests only (process-wide): released slots are never credited back to their sender, as if this
// rank left before its credit writes went out. Lets a test order a peer's credit wait before
// this rank's exit without timing.
void withholdCreditsForTesting(bool withhold);

}  // namespace ridge::gdr
