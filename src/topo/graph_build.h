// What the topology readers (hwloc XML, NCCL XML, live discovery) share: the figures they
// put on links, in one place, and small helpers to check attribute values and build the
// parts of the graph every reader builds the same way (socket links, host bridge rates).
// Internal to src/topo; users call load.h and discover.h.
//
// Bandwidths follow NCCL's conventions (reference: topology-facts.md) so that the planner's
// numbers match what users see from NCCL: PCIe width x per-lane code / 80 GB/s per
// direction, NVLink per-lane figures by GPU architecture, inter-socket figures by CPU.
//
// Latencies are rough one-way figures per hop, good enough to rank paths and to give the
// planner an order of magnitude; a measured machine should replace them. Reasoning:
//  - kPcieLinkLatencyNs: one PCIe link, both PHYs and the data link layer of each end.
//    Serialisation of a 256 B TLP at Gen4 x16 is ~8 ns; PHY/DLL pipelines add tens of ns.
//  - kPcieSwitchPortLatencyNs: half of a switch traversal. PCIe switch vendors quote
//    100-150 ns port to port (cut-through) for Gen3-Gen5 parts; charged on each edge that
//    enters a switch port, so up one port and down another costs ~120 ns.
//  - kRootPortLatencyNs: half of a trip through the root complex. Peer-to-peer through a
//    CPU's root complex costs 200+ ns more than through a switch (it crosses the CPU's
//    internal fabric), charged on each host bridge to root port edge.
//  - kHostBridgeLatencyNs: from a host bridge to its NUMA node's memory / mesh stop.
//  - kSocketLinkLatencyNs: one UPI / xGMI / X-Bus hop; remote memory on two-socket servers
//    is ~60-150 ns slower than local, and PCIe traffic pays that plus queueing: a few 100 ns.
//  - kNvLinkLatencyNs: a GPU to GPU (or GPU to NVSwitch) NVLink hop including the GPU's
//    hub; NVSwitch adds a hop, so GPU-switch-GPU costs twice this.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "topo/model.h"
#include "topo/xml.h"

namespace ridge::topo {

constexpr double kPcieLinkLatencyNs = 30;
constexpr double kPcieSwitchPortLatencyNs = 60;
constexpr double kRootPortLatencyNs = 100;
constexpr double kHostBridgeLatencyNs = 100;
constexpr double kSocketLinkLatencyNs = 250;
constexpr double kNvLinkLatencyNs = 150;

/// Bounds on what a file may describe. No machine has more than a few dozen sockets or
/// tens of thousands of PCI functions; a file that claims more is garbage, and the bounds
/// keep the full mesh of socket links and every later graph walk cheap.
constexpr size_t kMaxPackages = 64;
constexpr size_t kMaxTopologyNodes = 1u << 16;

/// Inter-socket bandwidth when the CPU is not recognised: the lowest figure of the table
/// (Broadwell, Arm), so an unknown CPU is never assumed faster than it may be.
constexpr double kDefaultSocketLinkGBs = 6;
/// NVLink per-lane bandwidth when the GPU architecture is unknown (A100's figure, the most
/// common NVLink GPU in files that leave `sm` out).
constexpr double kDefaultNvLinkLaneGBs = 20;

/// NCCL's per-lane code for a PCIe rate (15, 30, 60, 120, 240, 480 for 2.5 ... 64 GT/s); a
/// rate between generations gets a proportional code. 0 when the rate is unknown (<= 0).
double pcieLaneCode(double gtPerSec);

/// Per-direction PCIe bandwidth in NCCL's convention: width x code / 80 GB/s. 0 unknown.
double pcieBandwidthGBs(int width, double gtPerSec);

/// Converts hwloc's link speed (GB/s, after line encoding) to NCCL's convention. Sets
/// `gen`/`width` only when one generation and width explain the value (Gen3 x16 and Gen4 x8
/// give the same figure, so usually they stay 0).
double pcieBandwidthFromHwlocGBs(double hwlocGBs, int* gen, int* width);

/// NVLink bandwidth of one lane (GB/s per direction) for a GPU's SM version (80, 90 ...).
double nvlinkLaneGBs(int smVersion);

/// hwloc's NVLinkBandwidth matrix counts 20000 MB/s per NVLink 1.0 link and 25000 per later
/// link. The lane count behind a value: a multiple of 25000 is read as NVLink 2+ (by far the
/// more common; 100000 is both 4 x 25000 and 5 x 20000), else a multiple of 20000 as NVLink 1,
/// else the nearest count of 25000 (at least 1).
int nvlinkLanesFromHwlocMBs(uint64_t mbs);
/// Bounds on a file's NVLink matrix: objects (GPUs, switches, CPUs) and MB/s of one pair
/// (1024 lanes of 50 GB/s is beyond any machine).
constexpr long long kMaxNvlinkMatrixObjects = 4096;
constexpr uint64_t kMaxNvlinkMBs = uint64_t{1024} * 50000;

/// What identifies a CPU for its inter-socket link.
struct CpuIdentity {
  std::string vendor;     ///< "GenuineIntel", "AuthenticAMD", "" unknown
  int family = -1;        ///< x86 family number
  int model = -1;         ///< x86 model number
  std::string modelName;  ///< "POWER9, altivec supported", "Intel(R) Xeon(R) ..."
  std::string arch;       ///< "x86_64", "ppc64", "aarch64", "arm64"
};

/// Inter-socket bandwidth per direction (GB/s) by vendor and model, per topology-facts.md.
double socketLinkGBs(const CpuIdentity& cpu);

/// Joins every pair of packages with a Socket link (full mesh: right for two sockets and for
/// four-socket Intel parts; larger glueless systems are rarer and not modelled better).
void addSocketLinks(Topology* t, const std::vector<int>& packages, double bandwidthGBs);

/// Latency of the tree edge into `child` (kind of parent and child decide which hop it is).
double treeEdgeLatencyNs(const Topology& t, int parent, int child);

/// The fastest of the tree links from `parent` down to its children (0 when none has a
/// rate): a host bridge's link to its NUMA node is priced at its fastest root port.
double fastestChildLinkGBs(const Topology& t, int parent);

/// 16-bit base class + subclass of a 24- or 16-bit class code.
inline uint16_t pciClassId16(uint32_t pciClass) {
  return static_cast<uint16_t>(pciClass > 0xffff ? pciClass >> 8 : pciClass);
}

/// Node kind for a PCI function from its class (and vendor, which tells BMC displays from
/// GPUs and NVSwitches from other bridges).
NodeKind kindForPciClass(uint32_t pciClass, uint16_t vendor);

/// Normalizes a bus id to "dddd:bb:dd.f" (lower case, 4-digit domain; "bb:dd.f" means
/// domain 0). False when it is not a bus id.
bool normalizeBusId(const std::string& in, std::string* out);

// ---- Attribute checks: errors name the file and line (`what:line: <el> ...`). ----------

/// ridgeInvalidArgument "<what>:<line>: <element>: <message>".
Status xmlError(const std::string& what, const XmlElement& e, const std::string& message);

/// Reads an integer attribute (decimal, or hex with 0x) in [lo, hi]. Absent: `*out`
/// unchanged and `*present` false (when given). Present but not a number or out of range:
/// error naming the attribute.
Status intAttribute(const std::string& what, const XmlElement& e, const char* key, long long lo, long long hi,
                    long long* out, bool* present = nullptr);
/// Same for a real number in [lo, hi] (NaN and infinities refused).
Status realAttribute(const std::string& what, const XmlElement& e, const char* key, double lo, double hi,
                     double* out, bool* present = nullptr);
/// The attribute's value, or "" when absent.
std::string stringAttribute(const XmlElement& e, const char* key);

/// Base name of a path ("/a/b/c.xml" -> "c.xml"), used to name topologies read from files.
std::string baseName(const std::string& path);

/// Builders used by load.cpp (and discovery, which exports hwloc's live topology as XML).
Status buildFromHwlocXml(const XmlElement& root, const std::string& what, Topology* out);
Status buildFromNcclXml(const XmlElement& root, const std::string& what, Topology* out);

}  // namespace ridge::topo
