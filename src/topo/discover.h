// Live discovery of the machine this process runs on, as a topology graph (model.h).
//
// Sources, in order (docs/topology.md, "Discovery"):
//  1. hwloc 2.x (when Ridge is built with it): packages, NUMA nodes, and the PCI tree with
//     every bridge level that leads to a GPU, NIC or NVMe drive, plus OS device names
//     (cuda0, mlx5_0, ib0, nvme0n1). Without hwloc, /sys gives the same tree (less names).
//  2. sysfs: the width and rate of every PCIe link, InfiniBand/RoCE ports
//     (/sys/class/infiniband) and Ethernet interfaces (/sys/class/net).
//  3. NVML, opened with dlopen at run time: NVLink peers of each GPU (GPUs and NVSwitches)
//     and the GPUs' compute capability. Missing library or no GPU: one INFO line.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "topo/model.h"
#include "topo/nvml_loader.h"

namespace ridge::topo {

/// Discovers this machine into `out` (finalized; name = hostname; loadMs = time taken).
Status discoverThisMachine(Topology* out);

/// This machine as hwloc XML (lstopo --of xml with the filters discovery uses) and hwloc's
/// version; an error when Ridge is built without hwloc.
Status exportHwlocXml(std::string* xml, std::string* version);

/// The same without hwloc, from /sys only (what a build without hwloc does); public so that
/// tests can compare the two.
Status discoverThisMachineSysfs(Topology* out);

/// Adds NVML's view of NVLink to a graph being built (not finalized): for each GPU of `t`
/// found by bus id, its SM version, and one NvLink per peer GPU or NVSwitch with the number
/// of active lanes to it (a GPU pair counted once; one NvSwitch node per distinct remote bus
/// id, under `machine`). Public for tests, which feed it made-up NVML answers.
void addNvLinksFromNvml(Topology* t, int machine, const std::vector<NvmlGpu>& gpus);

}  // namespace ridge::topo
