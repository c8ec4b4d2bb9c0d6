// NCCL topology XML (`<system version="1">`, the NCCL_TOPO_FILE format) into the graph.
//
// Mapping (NCCL's own model is flatter than ours):
//  - `<cpu numaid affinity arch vendor familyid modelid>`: NCCL's cpu is a NUMA node. Each
//    becomes a Package holding one Numa node (the file never says which NUMA nodes share a
//    socket, and NCCL itself treats every cpu-to-cpu hop as SYS, so separate packages give
//    the same classes). Socket links join every pair, priced by the CPU's vendor and model.
//  - every `<pci>` directly under a cpu gets a HostBridge of its own: two of them meet in
//    the CPU, which NCCL calls PHB and nvidia-smi NODE.
//  - a `<pci>` bridge is one switch unit (pciSwitch = itself): NCCL counts every bridge it
//    crosses, and the files (virtual `ffff:ff:..` switches, collapsed dumps) do not show
//    upstream/downstream port pairs.
//  - a `<pci>` whose class is a GPU, or that holds a `<gpu>`, is a Gpu; a network class or
//    a `<nic>` child makes a Nic whose ports are its `<net>` elements (speed in Mb/s). A
//    `<nic>` straight under a cpu is a NIC with no PCI path (under the Numa node).
//  - `<nvlink target count tclass>`: an NVLink bundle of `count` lanes to the GPU with that
//    bus id, or (tclass 0x068000) to an NVSwitch; one NvSwitch node per distinct target bus
//    id. A GPU listed by both ends is linked once. Targets that are the GPU itself (written
//    by some cloud images) or absent from the file are skipped with a trace line.
//  - link_speed/link_width of a `<pci>` price the tree link into it (NCCL's convention).
//  - unknown elements are skipped with a trace line; a file without any `<cpu>` is refused
//    because it would describe no machine at all.
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <utility>

#include "core/log.h"
#include "topo/graph_build.h"
#include "topo/pci.h"
#include "topo/sysfs.h"

namespace ridge::topo {

namespace {

class NcclReader {
 public:
  NcclReader(const std::string& what, Topology* t) : what_(what), t_(t) {}

  Status read(const XmlElement& root) {
    if (root.name != "system")
      return xmlError(what_, root, "not an NCCL topology file (root element must be <system>)");
    Node machine;
    machine.kind = NodeKind::Machine;
    machine_ = t_->addNode(machine);
    for (const XmlElement& c : root.children) {
      if (c.name == "cpu") {
        RIDGE_TRY(readCpu(c));
      } else {
        RIDGE_TRACE("%s:%d: skipping <%s> (not part of a machine description)", what_.c_str(), c.line,
                    c.name.c_str());
      }
    }
    if (packages_.empty()) return xmlError(what_, root, "no <cpu> element: the file describes no machine");
    if (t_->nodes().size() > kMaxTopologyNodes)
      return xmlError(what_, root, format("more than %zu devices: not a real machine", kMaxTopologyNodes));
    RIDGE_TRY(resolveNvlinks());
    addSocketLinks(t_, packages_, socketLinkGBs(firstCpu_));
    // GPU names follow CUDA ordinals when the file gives every GPU a distinct one.
    std::set<int> devs;
    const std::vector<int> gpus = t_->nodesOfKind(NodeKind::Gpu);
    for (int g : gpus)
      if (t_->node(g).cudaIndex >= 0) devs.insert(t_->node(g).cudaIndex);
    if (devs.size() == gpus.size())
      for (int g : gpus) t_->mutableNode(g).index = t_->node(g).cudaIndex;
    // NIC names follow the order of their net devices when every NIC has a distinct one.
    std::map<long long, int> byDev;
    for (auto [nic, dev] : nicDev_) byDev.emplace(dev, nic);
    if (byDev.size() == t_->nodesOfKind(NodeKind::Nic).size() && byDev.size() == nicDev_.size()) {
      int index = 0;
      for (auto [dev, nic] : byDev) t_->mutableNode(nic).index = index++;
    }
    return Status::ok();
  }

 private:
  struct PendingNvlink {
    int gpu;
    const XmlElement* el;
    std::string target;
    long long count, tclass;
  };

  Status readCpu(const XmlElement& e) {
    long long numaId = -1, family = -1, model = -1;
    RIDGE_TRY(intAttribute(what_, e, "numaid", -1, 1 << 20, &numaId));
    RIDGE_TRY(intAttribute(what_, e, "familyid", 0, 1 << 20, &family));
    RIDGE_TRY(intAttribute(what_, e, "modelid", 0, 1 << 20, &model));
    if (numaId >= 0 && !numaIds_.insert(static_cast<int>(numaId)).second)
      return xmlError(what_, e, format("numaid %lld appears twice", numaId));
    CpuIdentity cpu;
    cpu.vendor = stringAttribute(e, "vendor");
    cpu.arch = stringAttribute(e, "arch");
    cpu.family = static_cast<int>(family);
    cpu.model = static_cast<int>(model);
    if (packages_.empty()) firstCpu_ = cpu;

    Node pkg;
    pkg.kind = NodeKind::Package;
    if (!cpu.vendor.empty())
      pkg.model = cpu.vendor + (family >= 0 ? format(" family %lld model %lld", family, model) : "");
    else
      pkg.model = cpu.arch;  // ppc64, arm64: what the file says about the CPU
    if (packages_.size() >= kMaxPackages)
      return xmlError(what_, e, format("more than %zu <cpu> elements: not a real machine", kMaxPackages));
    const int pkgId = t_->addNode(pkg);
    t_->connect(machine_, pkgId, LinkKind::Internal, 0, 0);
    packages_.push_back(pkgId);
    Node numa;
    numa.kind = NodeKind::Numa;
    numa.index = static_cast<int>(numaId);
    std::vector<int> cpus;
    const std::string affinity = stringAttribute(e, "affinity");
    if (!affinity.empty() && !parseCpuMask(affinity, &cpus))
      return xmlError(what_, e, "affinity \"" + affinity + "\" is not a CPU mask");
    numa.cpus = formatCpuList(cpus);
    const int numaId_ = t_->addNode(numa);
    t_->connect(pkgId, numaId_, LinkKind::Internal, 0, 0);

    for (const XmlElement& c : e.children) {
      if (c.name == "pci") {
        RIDGE_TRY(readPci(c, numaId_, true));
      } else if (c.name == "nic") {
        RIDGE_TRY(readNic(c, numaId_, 0));
      } else {
        RIDGE_TRACE("%s:%d: skipping <%s> under <cpu>", what_.c_str(), c.line, c.name.c_str());
      }
    }
    return Status::ok();
  }

  static bool hasChild(const XmlElement& e, const char* name) {
    for (const XmlElement& c : e.children)
      if (c.name == name) return true;
    return false;
  }

  Status readPci(const XmlElement& e, int parent, bool underCpu) {
    if (t_->nodes().size() > kMaxTopologyNodes)
      return xmlError(what_, e, format("more than %zu devices: not a real machine", kMaxTopologyNodes));
    const std::string rawBus = stringAttribute(e, "busid");
    std::string busId;
    if (rawBus.empty()) return xmlError(what_, e, "has no busid");
    if (!normalizeBusId(rawBus, &busId))
      return xmlError(what_, e, "busid \"" + rawBus + "\" is not a PCI bus id");
    long long cls = 0, vendor = 0, device = 0, width = 0;
    RIDGE_TRY(intAttribute(what_, e, "class", 0, 0xffffff, &cls));
    RIDGE_TRY(intAttribute(what_, e, "vendor", 0, 0xffff, &vendor));
    RIDGE_TRY(intAttribute(what_, e, "device", 0, 0xffff, &device));
    RIDGE_TRY(intAttribute(what_, e, "link_width", 0, 32, &width));
    double gts = 0;
    RIDGE_TRY(linkSpeed(e, &gts));

    Node n;
    n.busId = busId;
    n.pciClass = static_cast<uint32_t>(cls);
    n.vendor = static_cast<uint16_t>(vendor);
    n.device = static_cast<uint16_t>(device);
    n.kind = kindForPciClass(n.pciClass, n.vendor);
    if (hasChild(e, "gpu")) n.kind = NodeKind::Gpu;
    if (hasChild(e, "nic")) n.kind = NodeKind::Nic;
    if (n.kind == NodeKind::PciDevice && hasChild(e, "pci")) n.kind = NodeKind::PciBridge;
    // A virtual bridge (vendor 0xffff) is how cloud images write "these devices share a
    // switch"; keep that in the name so that trees read as the file meant.
    if (n.kind == NodeKind::PciBridge)
      n.name = (busId.rfind("ffff:", 0) == 0 ? "Virtual switch " : "PCIe switch ") + busId;

    auto [it, fresh] = byBusId_.emplace(busId, std::make_pair(-1, e.line));
    if (!fresh)
      return xmlError(what_, e,
                      format("busid %s appears twice (first at line %d)", busId.c_str(), it->second.second));

    if (underCpu) {
      // Each top-level device hangs from its own host bridge (see the file comment).
      Node hb;
      hb.kind = NodeKind::HostBridge;
      hb.name = "HostBridge for " + busId;
      const int hbId = t_->addNode(hb);
      t_->connect(parent, hbId, LinkKind::Pcie, pcieBandwidthGBs(static_cast<int>(width), gts),
                  kHostBridgeLatencyNs, pcieGenFromGts(gts), static_cast<int>(width));
      parent = hbId;
    }
    const int id = t_->addNode(n);
    it->second.first = id;
    t_->connect(parent, id, LinkKind::Pcie, pcieBandwidthGBs(static_cast<int>(width), gts),
                treeEdgeLatencyNs(*t_, parent, id), pcieGenFromGts(gts), static_cast<int>(width));
    if (n.kind == NodeKind::PciBridge) t_->mutableNode(id).pciSwitch = id;

    for (const XmlElement& c : e.children) {
      if (c.name == "pci") {
        RIDGE_TRY(readPci(c, id, false));
      } else if (c.name == "gpu") {
        RIDGE_TRY(readGpu(c, id));
      } else if (c.name == "nic") {
        RIDGE_TRY(readNicPorts(c, id, static_cast<uint32_t>(cls)));
      } else {
        RIDGE_TRACE("%s:%d: skipping <%s> under <pci>", what_.c_str(), c.line, c.name.c_str());
      }
    }
    return Status::ok();
  }

  // NCCL writes sysfs's text ("16.0 GT/s PCIe", "8 GT/s"), or "" when unknown.
  Status linkSpeed(const XmlElement& e, double* gts) {
    const std::string s = stringAttribute(e, "link_speed");
    *gts = 0;
    if (s.empty() || s.rfind("Unknown", 0) == 0) return Status::ok();
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (end == s.c_str() || !std::isfinite(v) || v < 0 || v > 256)
      return xmlError(what_, e, "link_speed \"" + s + "\" is not a PCIe rate in GT/s");
    *gts = v;
    return Status::ok();
  }

  Status readGpu(const XmlElement& e, int gpu) {
    long long dev = -1, sm = 0;
    RIDGE_TRY(intAttribute(what_, e, "dev", 0, 4095, &dev));
    RIDGE_TRY(intAttribute(what_, e, "sm", 0, 10000, &sm));
    Node& g = t_->mutableNode(gpu);
    g.cudaIndex = static_cast<int>(dev);
    g.smVersion = static_cast<int>(sm);
    if (dev >= 0) g.osNames.push_back("cuda" + std::to_string(dev));
    for (const XmlElement& c : e.children) {
      if (c.name != "nvlink") {
        RIDGE_TRACE("%s:%d: skipping <%s> under <gpu>", what_.c_str(), c.line, c.name.c_str());
        continue;
      }
      const std::string raw = stringAttribute(c, "target");
      std::string target;
      if (!normalizeBusId(raw, &target))
        return xmlError(what_, c, "target \"" + raw + "\" is not a PCI bus id");
      long long count = 1, tclass = 0;
      RIDGE_TRY(intAttribute(what_, c, "count", 0, 1024, &count));
      RIDGE_TRY(intAttribute(what_, c, "tclass", 0, 0xffffff, &tclass));
      nvlinks_.push_back({gpu, &c, target, count, tclass});
    }
    return Status::ok();
  }

  Status readNic(const XmlElement& e, int parent, uint32_t cls) {
    Node n;
    n.kind = NodeKind::Nic;
    const int id = t_->addNode(n);
    t_->connect(parent, id, LinkKind::Pcie, 0, treeEdgeLatencyNs(*t_, parent, id));
    return readNicPorts(e, id, cls);
  }

  Status readNicPorts(const XmlElement& e, int nic, uint32_t cls) {
    const uint16_t cls16 = pciClassId16(cls);
    for (const XmlElement& c : e.children) {
      if (c.name != "net") {
        RIDGE_TRACE("%s:%d: skipping <%s> under <nic>", what_.c_str(), c.line, c.name.c_str());
        continue;
      }
      const std::string name = stringAttribute(c, "name");
      if (name.empty()) return xmlError(what_, c, "has no name");
      long long port = 0, speed = 0, dev = -1;
      RIDGE_TRY(intAttribute(what_, c, "port", 0, 255, &port));
      // 10 Tb/s per port bounds anything real; NCCL writes Mb/s.
      RIDGE_TRY(intAttribute(what_, c, "speed", 0, 10'000'000, &speed));
      RIDGE_TRY(intAttribute(what_, c, "dev", 0, 1 << 20, &dev));
      if (dev >= 0) {
        auto [slot, fresh] = nicDev_.emplace(nic, dev);
        if (!fresh) slot->second = std::min(slot->second, dev);
      }
      double latency = 0;
      RIDGE_TRY(realAttribute(what_, c, "latency", 0, 1e9, &latency));
      NicPort p;
      p.name = port > 0 ? name + ":" + std::to_string(port) : name;
      if (cls16 == 0x0207) p.linkLayer = "InfiniBand";
      if (cls16 == 0x0200) p.linkLayer = "Ethernet";
      p.rateGbps = static_cast<double>(speed) / 1000.0;
      Node& n = t_->mutableNode(nic);
      bool known = false;
      for (const std::string& os : n.osNames) known = known || os == name;
      if (!known) n.osNames.push_back(name);
      n.ports.push_back(p);
    }
    return Status::ok();
  }

  int nvSwitchFor(const std::string& busId) {
    auto it = switches_.find(busId);
    if (it != switches_.end()) return it->second;
    Node s;
    s.kind = NodeKind::NvSwitch;
    s.busId = busId;
    s.pciClass = 0x068000;
    s.vendor = 0x10de;
    const int id = t_->addNode(s);
    // NVSwitches are PCI functions somewhere on the host, but the file does not say where;
    // hanging them from the machine keeps them out of every PCIe route.
    t_->connect(machine_, id, LinkKind::Internal, 0, 0);
    switches_[busId] = id;
    return id;
  }

  Status resolveNvlinks() {
    std::map<std::pair<int, int>, size_t> gpuPairs;  // (min, max) -> index in links_
    std::map<std::pair<int, int>, size_t> toSwitch;  // (gpu, switch) -> index
    for (const PendingNvlink& p : nvlinks_) {
      if (p.count == 0) continue;
      int target = -1;
      auto it = byBusId_.find(p.target);
      if (it != byBusId_.end()) target = it->second.first;
      const bool switchClass = (p.tclass >> 8) == 0x0680;
      if (target == p.gpu) {
        RIDGE_TRACE("%s:%d: nvlink to the GPU itself ignored", what_.c_str(), p.el->line);
        continue;
      }
      if (switchClass && (target < 0 || t_->node(target).kind == NodeKind::NvSwitch)) {
        const int sw = nvSwitchFor(p.target);
        auto [slot, fresh] = toSwitch.emplace(std::make_pair(p.gpu, sw), links_.size());
        if (fresh)
          links_.push_back({p.gpu, sw, p.count});
        else
          links_[slot->second].count += p.count;  // the same switch listed twice: more lanes
        continue;
      }
      if (target < 0 || t_->node(target).kind != NodeKind::Gpu) {
        RIDGE_TRACE("%s:%d: nvlink target %s is not a GPU of this file; ignored", what_.c_str(), p.el->line,
                    p.target.c_str());
        continue;
      }
      const std::pair<int, int> key(std::min(p.gpu, target), std::max(p.gpu, target));
      auto [slot, fresh] = gpuPairs.emplace(key, links_.size());
      if (fresh)
        links_.push_back({key.first, key.second, p.count});
      else if (links_[slot->second].count < p.count)
        links_[slot->second].count = p.count;  // both ends list it; they should agree
    }
    for (const NvBundle& b : links_) {
      int sm = t_->node(b.a).smVersion;
      if (sm == 0 && t_->node(b.b).kind == NodeKind::Gpu) sm = t_->node(b.b).smVersion;
      Link l;
      l.kind = LinkKind::NvLink;
      l.a = b.a;
      l.b = b.b;
      l.nvlinkCount = static_cast<int>(b.count);
      l.bandwidthGBs = static_cast<double>(b.count) * nvlinkLaneGBs(sm);
      l.latencyNs = kNvLinkLatencyNs;
      t_->addLink(l);
    }
    return Status::ok();
  }

  struct NvBundle {
    int a, b;
    long long count;
  };
  const std::string& what_;
  Topology* t_;
  int machine_ = -1;
  std::vector<int> packages_;
  std::set<int> numaIds_;
  CpuIdentity firstCpu_;
  std::map<std::string, std::pair<int, int>> byBusId_;  // bus id -> (node id, line)
  std::map<std::string, int> switches_;
  std::map<int, long long> nicDev_;  // NIC node -> its lowest net dev
  std::vector<PendingNvlink> nvlinks_;
  std::vector<NvBundle> links_;
};

}  // namespace

Status buildFromNcclXml(const XmlElement& root, const std::string& what, Topology* out) {
  *out = Topology();
  out->name = baseName(what);
  out->source = "NCCL topology XML " + what;
  NcclReader reader(what, out);
  RIDGE_TRY(reader.read(root));
  return out->finalize();
}

}  // namespace ridge::topo
