// The topology as an NCCL topology file (NCCL_TOPO_FILE, `<system version="1">`), for
// feeding a machine Ridge discovered (or a preset, or another file) to NCCL: useful in VMs
// that hide the PCIe tree, where NCCL's own detection sees a flat machine. Tool-only: in the
// static library ridge_tooling, not libridge.
#pragma once

#include <string>

#include "topo/model.h"

namespace ridge::topo {

/// NCCL's schema: one `<cpu numaid affinity arch vendor [familyid modelid]>` per NUMA node;
/// below it nested `<pci busid class vendor device link_speed link_width>` for the PCIe
/// switches (one element per switch unit; root ports and host bridges are implied by the
/// cpu, as in NCCL's own dumps) and the GPUs and NICs; a GPU holds `<gpu dev sm rank gdr>`
/// with one `<nvlink target count tclass>` per NVLink peer or NVSwitch; a NIC holds `<nic>`
/// with one `<net name dev speed port latency guid maxconn gdr>` per port. Subtrees holding
/// no GPU or NIC are left out (NCCL ignores them).
std::string topologyToNcclXml(const Topology& t);

}  // namespace ridge::topo
