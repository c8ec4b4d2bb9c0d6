// `ridge-topo doctor`: for each GPU-GPU and GPU-NIC pair, what stands between it and full
// speed, in words. It reads the topology graph (where the devices sit) and, through a
// SysRoot, the kernel's view of the live machine or of a folder `ridge-topo capture` wrote:
// PCIe link attributes, config space (ACS), IOMMU groups, BARs, NIC RDMA devices and ports,
// loaded modules, the NVIDIA driver's parameters and the process's CPU placement.
// Tool-only, like capture: in the static library ridge_tooling, not libridge.
//
// Findings have a severity: a fault is something an operator can fix (a link trained below
// its capability, ACS redirecting peer traffic, a missing module, a NIC port down); a limit
// is where the devices sit (a path through the CPU) or what the hardware is; info is context.
#pragma once

#include <string>
#include <vector>

#include "topo/model.h"
#include "topo/sysfs.h"

namespace ridge::topo {

enum class Severity { Fault, Limit, Info };
const char* severityName(Severity s);  ///< "fault", "limit", "info"

struct DoctorFinding {
  Severity severity = Severity::Info;
  std::string code;     ///< stable key: "link-downtrained", "acs-redirect", "nic-not-rdma", ...
  std::string subject;  ///< what it is about: "GPU0 (0000:18:00.0)", "machine"
  std::string text;     ///< the reason and what to do, in words
};

struct DoctorPair {
  int a = -1, b = -1;  ///< node ids (a GPU; b a GPU or a NIC)
  std::string smi, nccl;
  double bandwidthGBs = 0;
  /// GPU-NIC pairs: the GDR-write ladder rung it would take ("gpu-doorbell", "cpu-doorbell",
  /// "host-staged") and the GDR advisor's option given what the platform allows.
  std::string rung, advisorChoice;
  std::vector<DoctorFinding> findings;
};

struct DoctorReport {
  std::string machine;                                     ///< topology name
  std::vector<std::pair<std::string, std::string>> facts;  ///< machine-wide: kernel, driver, ...
  std::vector<DoctorFinding> findings;                     ///< machine-wide findings
  std::vector<DoctorPair> pairs;
  int count(Severity s) const;  ///< over machine and pair findings
};

struct DoctorOptions {
  /// Every GPU-NIC pair; otherwise each GPU with the NICs of its best path class.
  bool allPairs = false;
  /// Only this pair (node ids), when both are >= 0.
  int onlyA = -1, onlyB = -1;
};

/// Examines `t` with the kernel files under `root`.
DoctorReport runDoctor(const Topology& t, const SysRoot& root, const DoctorOptions& options);

std::string doctorText(const DoctorReport& r, const Topology& t, bool color);
std::string doctorJson(const DoctorReport& r, const Topology& t);

/// `ridge-topo capture DIR`: discovers this machine and writes into `dir` (created) its
/// topology (topology.json, Ridge's format, and hwloc.xml when hwloc is built in), every
/// kernel file the doctor reads (same paths below `dir`), /proc/modules, the kernel version
/// and command line and a README naming what is there. `*summary` says what was written.
Status captureMachine(const std::string& dir, std::string* summary);

/// The topology of a captured folder (topology.json); the SysRoot is the folder itself.
Status loadCapturedTopology(const std::string& dir, Topology* t);

}  // namespace ridge::topo
