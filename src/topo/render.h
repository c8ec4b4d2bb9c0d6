// Views of a Topology for people and tools: the PCIe tree, the class matrix of
// `nvidia-smi topo -m`, the hops of one path, and a Graphviz drawing. ridge-topo prints them;
// they are plain functions of a finalized Topology returning text, so tests can check them.
// Tool-only: in the static library ridge_tooling (src/topo/CMakeLists.txt), not libridge.
//
// The tree and the drawing are focused: root ports and switch downstream ports are folded
// into the host bridge or switch they belong to (a switch is one box, whatever its port
// count), and branches with no GPU, NIC, NVMe drive or switch are summarized as a count of
// other PCI functions. NVSwitches are summarized (one fabric with lanes per GPU) instead of
// drawing every GPU-switch edge.
#pragma once

#include <string>
#include <vector>

#include "topo/model.h"

namespace ridge::topo {

struct RenderOptions {
  bool color = false;  ///< ANSI colours (only for a terminal)
  bool nccl = false;   ///< matrix: NCCL's class names instead of nvidia-smi's
};

/// Packages, NUMA nodes, host bridges, switches and devices with their links, then the
/// NVLink fabric and the socket links. Ends with a newline.
std::string renderTree(const Topology& t, const RenderOptions& o = {});

/// GPUs and NICs in rows and columns with their path class, the socket and NUMA node of each
/// row, a legend, and the OS names of the NICs. Ends with a newline.
std::string renderMatrix(const Topology& t, const RenderOptions& o = {});

/// The same as JSON: {"devices": [{name, kind, busId, osNames, package, numa}], "smi":
/// [[...]], "nccl": [[...]], "bandwidthGBs": [[...]]}.
std::string matrixJson(const Topology& t);

/// Hops between nodes a and b: each link's kind, PCIe generation/width or lanes, bandwidth
/// and latency, then the bottleneck, total latency and both classes. Ends with a newline.
std::string renderPath(const Topology& t, int a, int b, const RenderOptions& o = {});

/// One path as JSON: {from, to, smi, nccl, bandwidthGBs, latencyNs, bridges,
/// crossesHostBridge, crossesSocket, bottleneckHop, hops: [{from, to, kind, ...}]}.
std::string pathJson(const Topology& t, int a, int b);

/// A GPU-NIC pair to highlight in the drawing, with a short note ("gdr-write", "PIX").
struct DataPathMark {
  int gpu = -1;
  int nic = -1;
  std::string note;
};

/// For every GPU the NIC with the best path class (fewest hops on a tie, then the lower
/// index), noted with its nvidia-smi class. Empty when there are no NICs.
std::vector<DataPathMark> nearestNics(const Topology& t);

/// Graphviz source: one cluster per package with its NUMA nodes, host bridges, switches and
/// devices (GPUs, NICs, NVMe, NVSwitch fabric distinguished by shape and colour), link
/// labels with speeds, the socket link, NVLink summarized per GPU, and the route of each
/// marked GPU-NIC pair drawn thick and red.
std::string renderDot(const Topology& t, const std::vector<DataPathMark>& marks);

/// "Gen5 x16 48 GB/s", "NV18 370.8 GB/s", "22 GB/s", "" for a link without figures.
std::string linkLabel(const Link& l);

/// "48", "370.8", "0.3": a bandwidth or latency without trailing zeros.
std::string number(double v);

}  // namespace ridge::topo
