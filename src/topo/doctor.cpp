// The doctor's checks (doctor.h). Each check reads kernel files through the SysRoot only,
// so the same code runs on this machine and on a captured folder, and `capture` records
// exactly what it read.
#include "topo/doctor.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>

#include "core/json.h"
#include "core/status.h"
#include "topo/gdr_advisor.h"
#include "topo/gdr_placement.h"
#include "topo/pci.h"
#include "topo/render.h"

namespace ridge::topo {

const char* severityName(Severity s) {
  switch (s) {
    case Severity::Fault: return "fault";
    case Severity::Limit: return "limit";
    case Severity::Info: return "info";
  }
  return "?";
}

int DoctorReport::count(Severity s) const {
  int n = 0;
  for (const DoctorFinding& f : findings) n += f.severity == s;
  for (const DoctorPair& p : pairs)
    for (const DoctorFinding& f : p.findings) n += f.severity == s;
  return n;
}

namespace {

std::string pciDir(const std::string& busId) {
  return "/sys/bus/pci/devices/" + busId;
}

// A full PCI function address (dddd:bb:dd.f): only those have a sysfs directory.
bool isFunctionAddress(const std::string& busId) {
  return busId.size() == 12 && busId[4] == ':' && busId[7] == ':' && busId[10] == '.';
}

std::string subjectOf(const Topology& t, int id) {
  const Node& n = t.node(id);
  return n.busId.empty() ? n.name : n.name + " (" + n.busId + ")";
}

// ---- machine-wide facts -----------------------------------------------------------------

// Major and minor of a "6.1.0-18-amd64" style release; 0 when unparsable.
int kernelVersionCode(const std::string& release) {
  int major = 0, minor = 0;
  if (std::sscanf(release.c_str(), "%d.%d", &major, &minor) < 1) return 0;
  return major * 1000 + minor;
}

struct Platform {
  std::string kernel;
  bool nvidiaDriver = false, openModule = false;
  std::string driverVersion;
  bool peermem = false;  // nvidia_peermem (or the older nv_peer_mem) loaded
  bool dmabuf = false;   // kernel >= 5.12 and the open kernel module >= 515
  bool peerMappingOverride = false;
  bool iommuPresent = false;
  std::string cmdline;
  std::vector<int> processCpus;
};

Platform readPlatform(const SysRoot& root) {
  Platform p;
  root.line("/proc/sys/kernel/osrelease", &p.kernel);
  std::string modules;
  root.bytes("/proc/modules", &modules);
  std::istringstream ms(modules);
  for (std::string line; std::getline(ms, line);) {
    const std::string name = line.substr(0, line.find(' '));
    if (name == "nvidia_peermem" || name == "nv_peer_mem") p.peermem = true;
  }
  std::string version;
  if (root.line("/proc/driver/nvidia/version", &version)) {
    p.nvidiaDriver = true;
    p.openModule = version.find("Open Kernel Module") != std::string::npos;
    // "NVRM version: NVIDIA UNIX ... Kernel Module  550.54.15  Tue Mar  5 ..." : the first
    // token shaped like a version number.
    std::istringstream vs(version);
    for (std::string tok; vs >> tok;)
      if (tok.find('.') != std::string::npos && std::isdigit(static_cast<unsigned char>(tok[0])) &&
          tok.find(':') == std::string::npos) {
        p.driverVersion = tok;
        break;
      }
  }
  const int driverMajor = std::atoi(p.driverVersion.c_str());
  p.dmabuf = p.nvidiaDriver && p.openModule && driverMajor >= 515 && kernelVersionCode(p.kernel) >= 5012;
  std::string params;
  if (root.bytes("/proc/driver/nvidia/params", &params)) {
    std::istringstream ps(params);
    for (std::string line; std::getline(ps, line);)
      if (line.rfind("RegistryDwords", 0) == 0 && line.find("PeerMappingOverride=1") != std::string::npos)
        p.peerMappingOverride = true;
  }
  p.iommuPresent = !root.list("/sys/class/iommu").empty();
  root.line("/proc/cmdline", &p.cmdline);
  std::string status;
  if (root.bytes("/proc/self/status", &status)) {
    const size_t at = status.find("Cpus_allowed_list:");
    if (at != std::string::npos) {
      size_t b = at + std::strlen("Cpus_allowed_list:");
      while (b < status.size() && (status[b] == ' ' || status[b] == '\t')) ++b;
      p.processCpus = parseCpuList(status.substr(b, status.find('\n', b) - b));
    }
  }
  return p;
}

std::string cpuListText(const std::vector<int>& cpus) {
  return cpus.empty() ? "?" : formatCpuList(cpus);
}

// ---- per device -------------------------------------------------------------------------

struct LinkAttrs {
  double speed = 0, maxSpeed = 0;  // GT/s per lane
  int width = 0, maxWidth = 0;
  bool known = false;
};

LinkAttrs readLink(const SysRoot& root, const std::string& busId) {
  LinkAttrs l;
  if (!isFunctionAddress(busId)) return l;
  std::string v;
  const std::string d = pciDir(busId);
  if (root.line(d + "/current_link_speed", &v)) l.speed = parseGts(v);
  if (root.line(d + "/max_link_speed", &v)) l.maxSpeed = parseGts(v);
  if (root.line(d + "/current_link_width", &v)) l.width = std::atoi(v.c_str());
  if (root.line(d + "/max_link_width", &v)) l.maxWidth = std::atoi(v.c_str());
  l.known = l.speed > 0 && l.width > 0;
  return l;
}

std::string linkText(double gts, int width) {
  return format("%g GT/s x%d", gts, width);
}

// The ACS control register of a bridge from its config space, -1 when the extended config
// space is not readable (only root sees past the first 64 bytes) or has no ACS capability.
int acsControl(const SysRoot& root, const std::string& busId, bool* readable) {
  std::string cfg;
  *readable = false;
  if (!root.bytes(pciDir(busId) + "/config", &cfg, 4096) || cfg.size() < 0x104) return -1;
  *readable = true;
  auto u32 = [&](size_t off) {
    return off + 4 <= cfg.size()
               ? uint32_t(uint8_t(cfg[off])) | uint32_t(uint8_t(cfg[off + 1])) << 8 |
                     uint32_t(uint8_t(cfg[off + 2])) << 16 | uint32_t(uint8_t(cfg[off + 3])) << 24
               : 0u;
  };
  size_t off = 0x100;
  for (int guard = 0; guard < 64 && off >= 0x100 && off + 8 <= cfg.size(); ++guard) {
    const uint32_t header = u32(off);
    if (header == 0 || header == 0xffffffffu) break;
    if ((header & 0xffff) == 0x000d) return int(u32(off + 4) >> 16);  // ACS: capability, control
    off = (header >> 20) & 0xffc;
  }
  return -1;
}

// Size of BAR1 (the window peers and NICs map GPU memory through), 0 when unknown.
uint64_t bar1Bytes(const SysRoot& root, const std::string& busId) {
  std::string res;
  if (!root.bytes(pciDir(busId) + "/resource", &res)) return 0;
  std::istringstream rs(res);
  std::string line;
  for (int i = 0; i <= 1 && std::getline(rs, line); ++i) {
    if (i != 1) continue;
    unsigned long long start = 0, end = 0;
    if (std::sscanf(line.c_str(), "%llx %llx", &start, &end) == 2 && end > start) return end - start + 1;
  }
  return 0;
}

std::string bytesText(uint64_t b) {
  if (b >= (uint64_t{1} << 30)) return format("%g GiB", double(b) / double(uint64_t{1} << 30));
  return format("%g MiB", double(b) / double(1 << 20));
}

struct NicState {
  std::vector<std::string> rdmaDevices;  // mlx5_0
  std::vector<std::string> downPorts;    // "mlx5_0 port 1: DOWN" / "eth0: down"
  std::vector<std::string> activePorts;
};

NicState readNic(const SysRoot& root, const std::string& busId) {
  NicState s;
  if (!isFunctionAddress(busId)) return s;
  s.rdmaDevices = root.list(pciDir(busId) + "/infiniband");
  for (const std::string& dev : s.rdmaDevices) {
    for (const std::string& port : root.list("/sys/class/infiniband/" + dev + "/ports")) {
      std::string state;
      root.line("/sys/class/infiniband/" + dev + "/ports/" + port + "/state", &state);
      // "4: ACTIVE"
      const std::string word = state.substr(state.find(':') == std::string::npos ? 0 : state.find(':') + 1);
      const std::string trimmed = word.substr(
          word.find_first_not_of(' ') == std::string::npos ? word.size() : word.find_first_not_of(' '));
      (trimmed == "ACTIVE" ? s.activePorts : s.downPorts)
          .push_back(dev + " port " + port + ": " + (trimmed.empty() ? "unknown" : trimmed));
    }
  }
  if (s.rdmaDevices.empty()) {
    for (const std::string& ifname : root.list(pciDir(busId) + "/net")) {
      std::string state;
      root.line("/sys/class/net/" + ifname + "/operstate", &state);
      (state == "up" ? s.activePorts : s.downPorts)
          .push_back(ifname + ": " + (state.empty() ? "unknown" : state));
    }
  }
  return s;
}

std::string joined(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

// ---- the doctor ---------------------------------------------------------------------------

class Doctor {
 public:
  Doctor(const Topology& t, const SysRoot& root) : t_(t), root_(root), p_(readPlatform(root)) {}

  void machine(DoctorReport* r) {
    r->machine = t_.name;
    if (!kernel()) {
      r->facts.push_back({"kernel files",
                          "none (a preset or a topology file): only the paths are examined; "
                          "'ridge-topo capture' records a machine with them"});
      return;
    }
    r->facts.push_back({"kernel", p_.kernel.empty() ? "unknown" : p_.kernel});
    const bool gpus = !t_.gpus().empty();
    r->facts.push_back({"NVIDIA driver",
                        p_.nvidiaDriver ? p_.driverVersion + (p_.openModule ? " (open kernel module)"
                                                                            : " (proprietary kernel module)")
                                        : "not loaded"});
    if (gpus && !p_.nvidiaDriver)
      r->findings.push_back({Severity::Fault, "no-nvidia-driver", "machine",
                             "the machine has GPUs but no NVIDIA driver is loaded (/proc/driver/nvidia "
                             "absent): nothing can use them"});
    r->facts.push_back({"GPU memory for NICs", registrationText()});
    r->facts.push_back({"IOMMU", iommuText()});
    r->facts.push_back(
        {"GPU doorbells", p_.peerMappingOverride
                              ? "PeerMappingOverride=1: GPUs may map NIC doorbell pages"
                              : "PeerMappingOverride not set: GPUs cannot map NIC doorbell pages"});
    r->facts.push_back({"process CPUs", cpuListText(p_.processCpus)});
  }

  DoctorPair pair(int a, int b) {
    DoctorPair out;
    out.a = a;
    out.b = b;
    const Path path = t_.path(a, b);
    out.smi = smiClassName(path.smi, path.nvlinks);
    out.nccl = ncclClassName(path.nccl);
    out.bandwidthGBs = path.bandwidthGBs;
    const bool toNic = t_.node(b).kind == NodeKind::Nic;
    pathClass(path, a, b, toNic, &out.findings);
    if (path.nccl != NcclClass::NVL && path.nccl != NcclClass::NVB) {
      links(path, &out.findings);
      acs(path, &out.findings);
    }
    iommu(a, &out.findings);
    iommu(b, &out.findings);
    bar1(a, &out.findings);
    if (!toNic) bar1(b, &out.findings);
    numa(a, &out.findings);
    if (toNic && kernel()) nic(a, b, &out);
    return out;
  }

 private:
  // Whether kernel files were found at all (not for a preset or a plain topology file).
  bool kernel() const { return !p_.kernel.empty(); }

  std::string registrationText() const {
    std::string s = p_.peermem ? "nvidia-peermem loaded" : "nvidia-peermem not loaded";
    s += p_.dmabuf ? "; dma-buf possible (kernel >= 5.12, open kernel module >= 515)"
                   : "; dma-buf not possible (" +
                         std::string(!p_.nvidiaDriver                      ? "no NVIDIA driver"
                                     : !p_.openModule                      ? "needs the open kernel module"
                                     : kernelVersionCode(p_.kernel) < 5012 ? "needs kernel 5.12 or newer"
                                                                           : "needs driver 515 or newer") +
                         ")";
    return s;
  }

  std::string iommuText() const {
    if (!p_.iommuPresent) return "off (no /sys/class/iommu entries)";
    std::string s = "on";
    if (p_.cmdline.find("iommu=pt") != std::string::npos) s += ", iommu=pt on the kernel command line";
    return s + " (per-device translation below)";
  }

  void pathClass(const Path& path, int a, int b, bool toNic, std::vector<DoctorFinding>* out) const {
    const std::string pairName = t_.node(a).name + " and " + t_.node(b).name;
    const std::string cls = ncclClassName(path.nccl);
    std::string text;
    switch (path.nccl) {
      case NcclClass::PHB:
        text = pairName + " meet in the CPU's root complex (" + cls + ", nvidia-smi " +
               smiClassName(path.smi, path.nvlinks) + "): peer traffic is forwarded by the CPU, which many " +
               "CPUs do at a fraction of link speed, reads especially" +
               (toNic ? "; NCCL would not use GPUDirect RDMA here (it needs PXB or better)" : "");
        break;
      case NcclClass::SYS:
        text = pairName +
               " are on different NUMA nodes or sockets (SYS): traffic crosses the inter-socket link" +
               std::string(toNic ? "; NCCL would stage through host memory" : "");
        break;
      default: return;
    }
    out->push_back({Severity::Limit, "path-through-cpu", "path", text});
  }

  // Every PCIe link of the route whose both ends are on it: trained below what both ends
  // can do (a fault) or a device faster than its slot (a limit).
  void links(const Path& path, std::vector<DoctorFinding>* out) const {
    const std::set<int> on(path.nodes.begin(), path.nodes.end());
    for (int id : path.nodes) {
      const Node& n = t_.node(id);
      if (!isFunctionAddress(n.busId) || n.parent < 0 || !on.count(n.parent)) continue;
      // A switch's downstream port reports the link below it, which its child reports too;
      // paired with the upstream port's maximum (the link above) it would compare two links.
      if (n.kind == NodeKind::PciBridge && n.pciSwitch >= 0 && n.pciSwitch != id) continue;
      const LinkAttrs l = readLink(root_, n.busId);
      if (!l.known) continue;
      const LinkAttrs up = readLink(root_, t_.node(n.parent).busId);
      double capSpeed = l.maxSpeed > 0 ? l.maxSpeed : l.speed;
      int capWidth = l.maxWidth > 0 ? l.maxWidth : l.width;
      if (up.known && up.maxSpeed > 0 && up.maxSpeed < capSpeed) capSpeed = up.maxSpeed;
      if (up.known && up.maxWidth > 0 && up.maxWidth < capWidth) capWidth = up.maxWidth;
      const std::string subject = subjectOf(t_, id);
      if (l.width < capWidth) {
        out->push_back(
            {Severity::Fault, "link-downtrained", subject,
             format("PCIe link trained at %s, both ends can do x%d: %.0f%% of the bandwidth; reseat "
                    "the card, check the slot, riser and BIOS lane settings (lspci -vv: LnkSta)",
                    linkText(l.speed, l.width).c_str(), capWidth, 100.0 * l.width / capWidth)});
      }
      if (l.speed < capSpeed) {
        // GPUs lower their link speed when idle to save power; a NIC or switch does not.
        const bool gpu = n.kind == NodeKind::Gpu;
        out->push_back({gpu ? Severity::Info : Severity::Fault, "link-downtrained", subject,
                        format("PCIe link runs at %s, both ends can do %g GT/s%s",
                               linkText(l.speed, l.width).c_str(), capSpeed,
                               gpu ? ": idle GPUs lower their link speed, check again under load"
                                   : ": check the slot, riser and BIOS PCIe generation setting")});
      }
      if (up.known &&
          ((l.maxSpeed > up.maxSpeed && up.maxSpeed > 0) || (l.maxWidth > up.maxWidth && up.maxWidth > 0)))
        out->push_back(
            {Severity::Limit, "slot-slower-than-device", subject,
             format("the device can do %s but its slot only %s", linkText(l.maxSpeed, l.maxWidth).c_str(),
                    linkText(up.maxSpeed, up.maxWidth).c_str())});
    }
  }

  // ACS redirect on a switch port makes peer traffic that should turn around in the switch
  // go up to the root complex: half the bandwidth, or hangs where the CPU drops it.
  void acs(const Path& path, std::vector<DoctorFinding>* out) const {
    if (path.nccl != NcclClass::PIX && path.nccl != NcclClass::PXB) return;
    for (int id : path.nodes) {
      const Node& n = t_.node(id);
      if (n.kind != NodeKind::PciBridge || !isFunctionAddress(n.busId)) continue;
      bool readable = false;
      const int ctrl = acsControl(root_, n.busId, &readable);
      if (!readable) {
        out->push_back(
            {Severity::Info, "acs-unknown", subjectOf(t_, id),
             "ACS not checked: the extended config space is readable by root only (run the doctor or "
             "capture as root)"});
        continue;
      }
      if (ctrl < 0) continue;
      std::vector<std::string> on;
      if (ctrl & 0x4) on.push_back("P2P request redirect");
      if (ctrl & 0x8) on.push_back("P2P completion redirect");
      if (ctrl & 0x20) on.push_back("P2P egress control");
      if (on.empty()) continue;
      out->push_back(
          {Severity::Fault, "acs-redirect", subjectOf(t_, id),
           "ACS " + joined(on) +
               " enabled: peer traffic that should turn around in the switch goes up to the root "
               "complex (half the bandwidth, or hangs); on bare metal disable ACS in the BIOS or with "
               "setpci (in a VM it may be needed for isolation)"});
    }
  }

  void iommu(int id, std::vector<DoctorFinding>* out) const {
    const Node& n = t_.node(id);
    if (!isFunctionAddress(n.busId)) return;
    std::string type;
    if (!root_.line(pciDir(n.busId) + "/iommu_group/type", &type)) return;
    if (type == "identity") return;
    out->push_back(
        {Severity::Fault, "iommu-translating", subjectOf(t_, id),
         "the IOMMU translates this device's DMA (group type " + type +
             "): peer-to-peer and GPUDirect RDMA traffic is translated or redirected through the root "
             "complex, or fails; boot with iommu=pt (passthrough) or turn the IOMMU off"});
  }

  void bar1(int id, std::vector<DoctorFinding>* out) const {
    const Node& n = t_.node(id);
    if (n.kind != NodeKind::Gpu || !isFunctionAddress(n.busId)) return;
    const uint64_t bytes = bar1Bytes(root_, n.busId);
    if (bytes == 0 || bytes >= (uint64_t{1} << 30)) return;
    out->push_back(
        {Severity::Fault, "small-bar1", subjectOf(t_, id),
         "BAR1 is " + bytesText(bytes) +
             ": peers and NICs can map at most that much of its memory at once (registrations fail "
             "beyond it); enable Resizable BAR / large BAR in the BIOS"});
  }

  void numa(int gpu, std::vector<DoctorFinding>* out) const {
    const Node& n = t_.node(gpu);
    if (!isFunctionAddress(n.busId) || p_.processCpus.empty()) return;
    std::string v;
    if (!root_.line(pciDir(n.busId) + "/numa_node", &v)) return;
    const int node = std::atoi(v.c_str());
    if (node < 0) return;
    std::string cpus;
    if (!root_.line("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist", &cpus)) return;
    const std::vector<int> local = parseCpuList(cpus);
    const std::set<int> localSet(local.begin(), local.end());
    size_t near = 0;
    for (int c : p_.processCpus) near += localSet.count(c);
    if (near == p_.processCpus.size()) return;
    if (near == 0)
      out->push_back(
          {Severity::Fault, "numa-remote", subjectOf(t_, gpu),
           "the process runs on CPUs " + cpuListText(p_.processCpus) + ", none on NUMA node " +
               std::to_string(node) + " (CPUs " + cuListOr(cpus) +
               ") where this GPU sits: its host buffers and proxy cross the socket link; bind the rank "
               "there (numactl --cpunodebind=" +
               std::to_string(node) + ")"});
    else
      out->push_back({Severity::Info, "numa-unbound", subjectOf(t_, gpu),
                      "the process may run on CPUs outside NUMA node " + std::to_string(node) +
                          " where this GPU sits; binding each rank to its GPU's node keeps buffers local"});
  }

  static std::string cuListOr(const std::string& s) { return s.empty() ? "?" : s; }

  void nic(int gpu, int nicId, DoctorPair* out) const {
    const Node& n = t_.node(nicId);
    const std::string subject = subjectOf(t_, nicId);
    const bool sysfs = isFunctionAddress(n.busId);
    const NicState s = sysfs ? readNic(root_, n.busId) : NicState{};
    const bool rdma = !s.rdmaDevices.empty();
    if (sysfs && !rdma)
      out->findings.push_back(
          {Severity::Fault, "nic-not-rdma", subject,
           "no RDMA device (no infiniband/ entry): traffic through this NIC goes over TCP "
           "sockets from host memory, no GPUDirect RDMA (load the NIC's RDMA driver, e.g. "
           "mlx5_ib, or use an RDMA-capable NIC)"});
    if (!s.downPorts.empty())
      out->findings.push_back(
          {Severity::Fault, "nic-link-down", subject,
           "link not active: " + joined(s.downPorts) +
               (s.activePorts.empty() ? "" : " (active: " + joined(s.activePorts) + ")")});
    const bool registration = p_.peermem || p_.dmabuf;
    if (rdma && !registration)
      out->findings.push_back(
          {Severity::Fault, "no-gpu-memory-registration", subject,
           "the NIC cannot read or write GPU memory: nvidia-peermem is not loaded and dma-buf "
           "is not possible (" +
               registrationText() +
               "); modprobe nvidia-peermem, or use the open kernel module on kernel 5.12+"});
    if (rdma && !p_.peerMappingOverride)
      out->findings.push_back(
          {Severity::Fault, "no-gpu-doorbell", subject,
           "GPUs cannot map this NIC's doorbell page (the NVIDIA driver's RegistryDwords lack "
           "PeerMappingOverride=1): gdr-write falls back to a CPU-rung doorbell; set "
           "options nvidia NVreg_RegistryDwords=\"PeerMappingOverride=1;\" and reload the driver"});
    // The GDR-write ladder from what sysfs shows: GPU doorbell when the GPU may map the NIC's
    // doorbell, else the CPU rings it, else (no RDMA) host staging over sockets. The doctor is
    // in the topology layer, below the transports, so it cannot call the verbs transport's
    // decideGdrLadder (which also needs live queues); `ridge-topo gdr` prints that prediction.
    out->rung = !rdma && sysfs ? "host-staged" : p_.peerMappingOverride ? "gpu-doorbell" : "cpu-doorbell";
    GdrPlacement placement;
    if (gdrPlacementFor(t_, gpu, nicId, &placement).isOk()) {
      placement.nicReadsGpuMemory = registration;
      placement.gpuRingsNicDoorbell = p_.peerMappingOverride;
      const GdrAdvice advice = adviseGdr(placement, PcieConstants{});
      out->advisorChoice = (!rdma && sysfs) ? "host-staged" : gdrOptionName(advice.chosen);
    }
  }

  const Topology& t_;
  const SysRoot& root_;
  Platform p_;
};

}  // namespace

DoctorReport runDoctor(const Topology& t, const SysRoot& root, const DoctorOptions& options) {
  DoctorReport r;
  Doctor d(t, root);
  d.machine(&r);
  std::vector<std::pair<int, int>> pairs;
  if (options.onlyA >= 0 && options.onlyB >= 0) {
    pairs.push_back({options.onlyA, options.onlyB});
  } else {
    const std::vector<int> gpus = t.gpus();
    for (size_t i = 0; i < gpus.size(); ++i)
      for (size_t j = i + 1; j < gpus.size(); ++j) pairs.push_back({gpus[i], gpus[j]});
    if (options.allPairs) {
      for (int g : gpus)
        for (int n : t.nics()) pairs.push_back({g, n});
    } else {
      // Each GPU with every NIC of its best class (the NICs its traffic would use).
      for (int g : gpus) {
        int best = 99;
        for (int n : t.nics()) best = std::min(best, int(t.path(g, n).nccl));
        for (int n : t.nics())
          if (int(t.path(g, n).nccl) == best) pairs.push_back({g, n});
      }
    }
  }
  for (auto [a, b] : pairs) r.pairs.push_back(d.pair(a, b));
  return r;
}

std::string doctorText(const DoctorReport& r, const Topology& t, bool color) {
  const char* red = color ? "\033[31m" : "";
  const char* yellow = color ? "\033[33m" : "";
  const char* off = color ? "\033[0m" : "";
  std::ostringstream o;
  o << "doctor: " << r.machine << " (" << t.source << ")\n\nmachine\n";
  size_t w = 0;
  for (const auto& [k, v] : r.facts) w = std::max(w, k.size());
  for (const auto& [k, v] : r.facts) o << "  " << k << std::string(w + 2 - k.size(), ' ') << v << "\n";
  auto finding = [&](const DoctorFinding& f, const char* indent) {
    const char* c = f.severity == Severity::Fault ? red : f.severity == Severity::Limit ? yellow : "";
    o << indent << c << severityName(f.severity) << off << "  " << f.code << "  " << f.subject << ": "
      << f.text << "\n";
  };
  for (const DoctorFinding& f : r.findings) finding(f, "  ");
  o << "\npairs\n";
  if (r.pairs.empty())
    o << "  no GPU pairs and no GPU-NIC pairs: " << t.gpus().size() << " GPUs, " << t.nics().size()
      << " NICs\n";
  for (const DoctorPair& p : r.pairs) {
    o << t.node(p.a).name << " - " << t.node(p.b).name << "  " << p.smi << " (NCCL " << p.nccl << ")  "
      << number(p.bandwidthGBs) << " GB/s";
    if (!p.rung.empty()) o << "  rung " << p.rung << ", advisor " << p.advisorChoice;
    bool any = false;
    for (const DoctorFinding& f : p.findings) any = any || f.severity != Severity::Info;
    o << (any ? "\n" : "  nothing in the way\n");
    for (const DoctorFinding& f : p.findings) finding(f, "  ");
  }
  o << "\n"
    << r.count(Severity::Fault) << " faults (fixable), " << r.count(Severity::Limit)
    << " limits (where the devices sit), " << r.count(Severity::Info) << " notes\n";
  return o.str();
}

std::string doctorJson(const DoctorReport& r, const Topology& t) {
  auto findings = [](const std::vector<DoctorFinding>& v) {
    json::Value arr = json::Value::array();
    for (const DoctorFinding& f : v) {
      json::Value o = json::Value::object();
      o.set("severity", severityName(f.severity));
      o.set("code", f.code);
      o.set("subject", f.subject);
      o.set("text", f.text);
      arr.push(std::move(o));
    }
    return arr;
  };
  json::Value doc = json::Value::object();
  doc.set("machine", r.machine);
  json::Value facts = json::Value::object();
  for (const auto& [k, v] : r.facts) facts.set(k, v);
  doc.set("facts", std::move(facts));
  doc.set("findings", findings(r.findings));
  json::Value pairs = json::Value::array();
  for (const DoctorPair& p : r.pairs) {
    json::Value o = json::Value::object();
    o.set("a", t.node(p.a).name);
    o.set("b", t.node(p.b).name);
    o.set("smi", p.smi);
    o.set("nccl", p.nccl);
    o.set("bandwidthGBs", p.bandwidthGBs);
    if (!p.rung.empty()) {
      o.set("rung", p.rung);
      o.set("advisor", p.advisorChoice);
    }
    o.set("findings", findings(p.findings));
    pairs.push(std::move(o));
  }
  doc.set("pairs", std::move(pairs));
  doc.set("faults", r.count(Severity::Fault));
  doc.set("limits", r.count(Severity::Limit));
  return json::write(doc) + "\n";
}

}  // namespace ridge::topo
