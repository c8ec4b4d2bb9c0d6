// The GDR-write ladder decision (gdr_ladder.h): top rung first, each fact that fails names
// the rung below and why.
#include "transports/verbs/gdr_ladder.h"

#include <vector>

#include "core/status.h"

namespace ridge {
namespace verbs {

const char* gdrRungName(GdrRung r) {
  switch (r) {
    case GdrRung::GpuDoorbell: return "gpu-doorbell";
    case GdrRung::CpuDoorbell: return "cpu-doorbell";
    case GdrRung::HostStaged: return "host-staged";
    case GdrRung::Unavailable: return "unavailable";
  }
  return "?";
}

const char* gdrStagingPlaceName(GdrStagingPlace p) {
  switch (p) {
    case GdrStagingPlace::NicMemory: return "nic-gpu";
    case GdrStagingPlace::HostMemory: return "host";
    case GdrStagingPlace::None: return "none";
  }
  return "?";
}

namespace {

// Walks the facts in ladder order, remembering which unknowns were assumed.
struct Walk {
  std::vector<std::string> assumed;
  // True when the fact holds or is unknown (then assumed, named by `what`).
  bool holds(const FactWhy& f, const char* what) {
    if (f.value == Fact::No) return false;
    if (f.value == Fact::Unknown)
      assumed.push_back(f.why.empty() ? what : std::string(what) + " (" + f.why + ")");
    return true;
  }
};

std::string withWhy(const char* what, const FactWhy& f) {
  return f.why.empty() ? std::string(what) : std::string(what) + ": " + f.why;
}

void decideStaging(const GdrLadderFacts& f, bool gpuProduces, Walk* walk, GdrLadderDecision* d) {
  if (!f.nicMemoryProbed) {
    d->staging = GdrStagingPlace::None;
    d->stagingReason = "on-NIC memory not probed: decided at init from max_dm_size";
    return;
  }
  if (f.nicMemoryBytes == 0) {
    d->staging = GdrStagingPlace::HostMemory;
    d->stagingReason = "the NIC offers no on-NIC memory (max_dm_size 0): pinned host memory on its NUMA node";
    return;
  }
  if (f.stagingBytesNeeded > f.nicMemoryBytes) {
    d->staging = GdrStagingPlace::HostMemory;
    d->stagingReason = format(
        "the staging slots need %llu bytes, the NIC offers %llu (max_dm_size): pinned host "
        "memory on its NUMA node",
        static_cast<unsigned long long>(f.stagingBytesNeeded),
        static_cast<unsigned long long>(f.nicMemoryBytes));
    return;
  }
  if (gpuProduces && !walk->holds(f.nicMemoryMappedForGpu, "on-NIC memory mapped into the GPU")) {
    d->staging = GdrStagingPlace::HostMemory;
    d->stagingReason = withWhy("on-NIC memory could not be mapped into the GPU", f.nicMemoryMappedForGpu) +
                       ": pinned host memory on its NUMA node";
    return;
  }
  d->staging = GdrStagingPlace::NicMemory;
  // No size yet (the probe at device open): what the NIC offers.
  const std::string size =
      f.stagingBytesNeeded
          ? format("%llu of %llu bytes", static_cast<unsigned long long>(f.stagingBytesNeeded),
                   static_cast<unsigned long long>(f.nicMemoryBytes))
          : format("max_dm_size %llu bytes", static_cast<unsigned long long>(f.nicMemoryBytes));
  d->stagingReason =
      format("on-NIC memory (%s)%s", size.c_str(),
             gpuProduces ? ", mapped into the GPU" : ", written by the CPU through its mapping");
}

}  // namespace

GdrLadderDecision decideGdrLadder(const GdrLadderFacts& f) {
  GdrLadderDecision d;
  Walk walk;
  if (!walk.holds(f.rdmaCore, "rdma-core loadable")) {
    d.rung = GdrRung::Unavailable;
    d.reason = withWhy("rdma-core not found", f.rdmaCore);
    return d;
  }
  bool gpuProduces = true;
  if (!walk.holds(f.directQueues, "mlx5 direct queues")) {
    d.rung = GdrRung::HostStaged;
    d.reason = withWhy("no mlx5 direct queues", f.directQueues) +
               ": the NIC's rings stay with its driver, so a CPU proxy posts through plain verbs";
  } else if (!walk.holds(f.gpu, "a GPU in this process")) {
    d.rung = GdrRung::CpuDoorbell;
    d.reason =
        withWhy("no GPU in this process", f.gpu) + ": the CPU writes the WQEs and rings the UAR itself";
    gpuProduces = false;
  } else if (!walk.holds(f.ringsMappedForGpu, "rings mapped into the GPU")) {
    d.rung = GdrRung::HostStaged;
    d.reason =
        withWhy("the send and completion rings could not be mapped into the GPU", f.ringsMappedForGpu) +
        ": a CPU proxy posts through plain verbs";
  } else if (!walk.holds(f.uarMappedForGpu, "UAR mapped into the GPU")) {
    d.rung = GdrRung::CpuDoorbell;
    d.reason = withWhy("the UAR page could not be mapped into the GPU", f.uarMappedForGpu) +
               ": the GPU writes WQEs and the doorbell record, a CPU thread rings the UAR for it";
  } else {
    d.rung = GdrRung::GpuDoorbell;
    d.reason = "mlx5 direct queues, rings and UAR mapped into the GPU: the GPU posts and rings by itself";
  }
  if (d.rung == GdrRung::HostStaged) {
    d.staging = GdrStagingPlace::HostMemory;
    d.stagingReason = "host-staged: a copy engine fills pinned host slots";
  } else {
    decideStaging(f, gpuProduces, &walk, &d);
  }
  if (!walk.assumed.empty()) {
    d.predicted = true;
    std::string list;
    for (size_t i = 0; i < walk.assumed.size(); ++i) list += (i ? ", " : "") + walk.assumed[i];
    d.reason += "; holds if at init: " + list;
  }
  return d;
}

std::string gdrLadderLine(const GdrLadderDecision& d) {
  std::string s = gdrRungName(d.rung);
  if (d.predicted) s += " (predicted)";
  s += ": " + d.reason;
  if (d.staging != GdrStagingPlace::None)
    s += std::string("; staging ") + gdrStagingPlaceName(d.staging) + ": " + d.stagingReason;
  return s;
}

}  // namespace verbs
}  // namespace ridge
