// A first, small view of a host's topology: how many packages, NUMA nodes, cores, hardware
// threads, GPUs and NICs it has, and which PCI devices the GPUs and NICs are.
//
// It has three sources, tried in this order for the machine we run on:
//   1. hwloc (when Ridge was built with libhwloc), with I/O discovery limited to the
//      "important" devices (GPUs, NICs, storage controllers);
//   2. /proc and /sys, when hwloc is not built in (or fails): enough for the counts and the
//      PCI devices, without cache levels or PCI bridges.
// and, for a machine described in a file:
//   3. an hwloc XML file (`lstopo --of xml`, hwloc 1.x, 2.x and 3.x), or an NCCL topology file
//      (`<system version="1">`, as given to NCCL_TOPO_FILE), so that users can pass the file
//      they already have.
//
// The summary is what every rank shares with the others during bootstrap (the compact
// one-line form), and what `ridge-topo summary` prints. The full topology graph (PCI tree,
// NVLink, path classes) is a separate, later structure; the classification helpers here
// (which PCI classes are GPUs and NICs) are meant to be shared with it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "topo/model.h"

namespace ridge {

/// Counts and device lists of one host. A count of -1 means "the source does not say"
/// (an NCCL topology file names NUMA nodes but neither packages nor cores).
struct HostSummary {
  std::string hostname;  ///< Empty when the source does not say (most files).
  int packages = 0;      ///< Processor packages (sockets).
  int numaNodes = 0;  ///< NUMA nodes that hold memory (GPU-memory nodes included when the file lists them).
  int cores = 0;      ///< Physical cores.
  int pus = 0;        ///< Processing units (hardware threads) that this process may use.
  int gpus = 0;       ///< PCI display-class (0x03xx) compute devices; board-management VGA excluded.
  int nics = 0;       ///< PCI network-class (0x02xx) functions (each port function counts).
  /// One line per GPU/NIC: "<busid> <vendor> <device> [<os names>] (PCIe ...)", e.g.
  /// "0000:3b:00.0 NVIDIA 20b0 [cuda0] (PCIe x16 Gen4)". Parts the source lacks are left out.
  std::vector<std::string> gpuNames, nicNames;
  /// Where the numbers came from: "hwloc 2.9.0 (this machine)", "hwloc XML <file>",
  /// "NCCL topology XML <file>", "sysfs fallback (hwloc not built)".
  std::string source;
  double discoveryMs = 0;  ///< Wall time the discovery (or file load) took.
};

/// Describes the machine this process runs on (hwloc when built in, else /proc and /sys).
Status summarizeThisHost(HostSummary* out);

/// Describes the machine in an hwloc XML file. NCCL topology files (`<system>`) are
/// recognised by their root element and read too; NCCL graph files (`<graphs>`) are refused
/// with ridgeInvalidArgument because they describe channels, not a machine. In ridge_tooling
/// (summary_files.cpp).
Status summarizeHwlocXml(const std::string& path, HostSummary* out);

/// Describes a machine already loaded as a graph (a preset, Ridge JSON, a captured folder):
/// packages, NUMA nodes, GPUs and NICs from the graph, PUs from the NUMA nodes' CPU lists
/// (unknown, -1, when they have none), cores unknown. In ridge_tooling (summary_text.cpp).
HostSummary summarizeTopology(const topo::Topology& t);

/// The /proc + /sys reader on its own (also what summarizeThisHost falls back to); public so
/// that tests can compare it with hwloc.
Status summarizeThisHostSysfs(HostSummary* out);

/// A few human-readable lines (no trailing newline), ending with "discovered in X ms". In
/// ridge_tooling (summary_text.cpp), not libridge.
std::string formatSummary(const HostSummary& s);

/// One line of at most kCompactSummaryMax bytes, for the bootstrap all-gather of every rank's
/// summary: "ridge-topo1 host=<name> pkg=2 numa=2 core=48 pu=96 gpu=8 nic=4". Device names are
/// left out; a hostname that would overflow is cut.
std::string summaryToCompactString(const HostSummary& s);
constexpr size_t kCompactSummaryMax = 200;

/// Reads a string made by summaryToCompactString back (counts and hostname only).
Status parseCompactSummary(const std::string& text, HostSummary* out);

}  // namespace ridge
