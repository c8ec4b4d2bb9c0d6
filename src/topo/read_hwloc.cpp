// hwloc XML (`lstopo --of xml`: hwloc 1.x, 2.x and 3.x files) into the graph, with our own
// reader (xml.h), so that files load the same with or without libhwloc and a malformed file
// can never reach a third-party parser.
//
// What is read:
//  - Package (hwloc 1.x: Socket) objects: packages, with CPUVendor/CPUModelNumber/... infos
//    pricing the socket links (full mesh between packages).
//  - NUMANode objects with a non-empty cpuset: NUMA nodes, placed under the package their
//    cpus belong to. NUMA nodes without cpus (GPU memory on POWER9/Sierra, CXL or HBM-only
//    nodes) are left out of the graph: nothing can be placed near them, and counting them
//    would make placement think a socket has more NUMA nodes than it has. (The host
//    summary still counts them, as hwloc does.) A file without NUMANode objects (hwloc 1.x
//    on non-NUMA machines) gets one NUMA node per package.
//  - I/O trees (Bridge, PCIDev, OSDev) wherever they hang (hwloc 1.x hangs them below a
//    NUMANode or a Group, 2.x below a Package or Group): each is attached to the first CPU
//    NUMA node in the nodeset of the object it hangs from. A host bridge (bridge_type 0-x)
//    is a HostBridge; PCI-PCI bridges are PciBridge nodes (switch units derived from depth
//    by finalize); PCI functions are classified by class and vendor (pci.h).
//  - OS devices name the functions: cuda<N>/nvml<N>/opencl/rsmi for GPUs (DRM card/render
//    nodes only when nothing better exists), OpenFabrics devices (mlx5_0) with their
//    Port<N>State infos become NIC ports, network interfaces (ib0, eth0) attach to the port
//    their "Port" info names or become ports of their own; block devices name NVMe drives.
//  - pci_link_speed (GB/s after encoding) is converted to NCCL's figures (graph_build.h).
//  - NVLink: hwloc 2.x's nvml backend records it as a distances matrix named
//    "NVLinkBandwidth" (<distances2hetero> when NVSwitches or CPUs are in it, <distances2>
//    when only GPUs are), objects named by gp_index ("OSDev:37" in the hetero form), values
//    the summed unidirectional bandwidth in MB/s of the links between two objects (hwloc
//    counts 20000 per NVLink 1.0 link and 25000 per later link; the diagonal is a
//    placeholder). A GPU is its nvml/cuda OS device or its PCI function; an NVIDIA PCI
//    function of class 0680 is an NVSwitch; a CPU-side object (Package, NUMANode, Group,
//    Machine: POWER's GPU-CPU NVLink) stands for the package it belongs to. Each pair
//    becomes one NvLink link with the lane count and hwloc's bandwidth.
// Unknown object types and elements are skipped (hwloc adds types over time). A bus id that
// appears twice is an error when both functions matter (GPU, NIC, bridge, NVMe); when one of
// them is another function (hwloc's own test files have such) that one loses its bus id.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "core/log.h"
#include "topo/graph_build.h"
#include "topo/pci.h"
#include "topo/sysfs.h"

namespace ridge::topo {

namespace {

// An hwloc bitmap ("0x000000ff,0xffff0000,,0x0", most significant word first; an empty word
// is 0; "0xf...f" first means all higher bits are set).
struct Bitmap {
  std::vector<uint32_t> words;  // least significant first
  bool infinite = false;
  bool empty() const {
    if (infinite) return false;
    return std::all_of(words.begin(), words.end(), [](uint32_t w) { return w == 0; });
  }
  bool test(size_t bit) const {
    const size_t w = bit / 32;
    if (w >= words.size()) return infinite;
    return (words[w] >> (bit % 32)) & 1u;
  }
  bool intersects(const Bitmap& o) const {
    const size_t n = std::max(words.size(), o.words.size());
    for (size_t i = 0; i < n; ++i) {
      const uint32_t a = i < words.size() ? words[i] : (infinite ? ~0u : 0u);
      const uint32_t b = i < o.words.size() ? o.words[i] : (o.infinite ? ~0u : 0u);
      if (a & b) return true;
    }
    return infinite && o.infinite;
  }
};

// The CPUs of a (finite part of a) bitmap in the kernel's list syntax.
std::string cpuListText(const Bitmap& b) {
  std::vector<int> cpus;
  for (size_t w = 0; w < b.words.size(); ++w)
    for (int bit = 0; bit < 32; ++bit)
      if (b.words[w] >> bit & 1u) cpus.push_back(static_cast<int>(w * 32 + bit));
  return formatCpuList(cpus);
}

// 4096 words = 131072 bits: more CPUs or NUMA nodes than any machine has.
constexpr size_t kMaxBitmapWords = 4096;

bool parseBitmap(const std::string& text, Bitmap* out) {
  *out = Bitmap();
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    parts.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
    if (parts.size() > kMaxBitmapWords) return false;
  }
  if (!parts.empty() && parts[0] == "0xf...f") {
    out->infinite = true;
    parts.erase(parts.begin());
  }
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    std::string w = *it;
    if (w.rfind("0x", 0) == 0) w = w.substr(2);
    if (w.empty()) {
      out->words.push_back(0);
      continue;
    }
    if (w.size() > 8 ||
        !std::all_of(w.begin(), w.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); }))
      return false;
    out->words.push_back(static_cast<uint32_t>(std::strtoul(w.c_str(), nullptr, 16)));
  }
  return true;
}

// The hwloc OS device categories we care about. hwloc 1.x and 2.x write an enum value,
// hwloc 3 a bit mask; the file's version says which.
enum class OsDevKind { Other, Block, Gpu, Network, OpenFabrics, Coproc };

struct PackageInfo {
  int node = -1;
  Bitmap cpuset;
};
struct NumaInfo {
  const XmlElement* el = nullptr;
  int osIndex = -1;
  uint64_t gpIndex = 0;  // 0: none in the file
  Bitmap cpuset;
  int node = -1;
};
// A CPU-side object a distance matrix may name (Group, Machine): resolved to a package by
// its cpuset once the packages are known.
struct CpuSideObject {
  Bitmap cpuset;
  int node = -1;  // package (or machine) node, once resolved
};
struct IoRoot {
  const XmlElement* el = nullptr;
  Bitmap nodeset, cpuset;  // of the object it hangs from
  bool haveNodeset = false;
};

class HwlocReader {
 public:
  HwlocReader(const std::string& what, Topology* t) : what_(what), t_(t) {}

  Status read(const XmlElement& root) {
    if (root.name != "topology")
      return xmlError(what_, root, "not an hwloc XML file (root must be <topology>)");
    const std::string version = stringAttribute(root, "version");
    hwloc3_ = !version.empty() && version[0] >= '3';
    const XmlElement* machineEl = nullptr;
    for (const XmlElement& c : root.children) {
      if (c.name == "object") {
        if (machineEl)
          return xmlError(what_, c, "a second top-level object (several machines are not supported)");
        machineEl = &c;
      } else if (c.name == "info") {
        rootInfo(c);
      } else if (c.name == "distances2" || c.name == "distances2hetero") {
        distances_.push_back(&c);
      }
    }
    if (!machineEl) return xmlError(what_, root, "no top-level <object>: the file describes no machine");
    const std::string type = stringAttribute(*machineEl, "type");
    if (type != "Machine")
      return xmlError(what_, *machineEl, "top-level object is a \"" + type + "\", not a Machine");
    Node machine;
    machine.kind = NodeKind::Machine;
    machine_ = t_->addNode(machine);
    RIDGE_TRY(walk(*machineEl, nullptr, 0));
    if (!hostName_.empty()) t_->name = hostName_;
    RIDGE_TRY(buildCpuSide());
    for (const IoRoot& r : ioRoots_) RIDGE_TRY(attachIoRoot(r));
    if (t_->nodes().size() > kMaxTopologyNodes)
      return xmlError(what_, root, format("more than %zu devices: not a real machine", kMaxTopologyNodes));
    RIDGE_TRY(resolveDuplicateBusIds());
    resolveCpuSideObjects();
    for (const XmlElement* d : distances_) RIDGE_TRY(readDistances(*d));
    std::vector<int> pkgs;
    for (const PackageInfo& p : packages_) pkgs.push_back(p.node);
    addSocketLinks(t_, pkgs, socketLinkGBs(cpu_));
    numberGpusByCuda();
    return Status::ok();
  }

 private:
  void rootInfo(const XmlElement& info) {
    const std::string name = stringAttribute(info, "name"), value = stringAttribute(info, "value");
    if (name == "HostName") hostName_ = value;
    if (name == "Architecture") cpu_.arch = value;
  }

  Status bitmapAttribute(const XmlElement& e, const char* key, Bitmap* out, bool* present) {
    const std::string* v = e.attribute(key);
    *present = v != nullptr;
    if (v && !parseBitmap(*v, out))
      return xmlError(what_, e, std::string("attribute ") + key + " is not an hwloc bitmap");
    return Status::ok();
  }

  // Walks the CPU side of the tree, collecting packages, NUMA nodes and I/O roots with the
  // nodeset/cpuset of the object they hang from (`ctx`).
  Status walk(const XmlElement& e, const XmlElement* ctx, int depth) {
    const std::string type = stringAttribute(e, "type");
    if (type == "Package" || type == "Socket") {
      PackageInfo p;
      bool have = false;
      RIDGE_TRY(bitmapAttribute(e, "cpuset", &p.cpuset, &have));
      Node n;
      n.kind = NodeKind::Package;
      long long os = -1;
      RIDGE_TRY(intAttribute(what_, e, "os_index", 0, 1 << 24, &os));
      n.index = static_cast<int>(os);
      CpuIdentity cpu;
      for (const XmlElement& c : e.children) {
        if (c.name != "info") continue;
        const std::string k = stringAttribute(c, "name"), v = stringAttribute(c, "value");
        if (k == "CPUVendor") cpu.vendor = v;
        if (k == "CPUModel") cpu.modelName = v;
        if (k == "CPUFamilyNumber") cpu.family = std::atoi(v.c_str());
        if (k == "CPUModelNumber") cpu.model = std::atoi(v.c_str());
      }
      n.model = cpu.modelName;
      if (packages_.empty()) {
        cpu.arch = cpu_.arch;
        cpu_ = cpu;
      }
      if (packages_.size() >= kMaxPackages)
        return xmlError(what_, e, format("more than %zu packages: not a real machine", kMaxPackages));
      p.node = t_->addNode(n);
      packages_.push_back(p);
      RIDGE_TRY(recordGpIndex(e, p.node));
    } else if (type == "NUMANode") {
      NumaInfo info;
      info.el = &e;
      bool have = false;
      RIDGE_TRY(bitmapAttribute(e, "cpuset", &info.cpuset, &have));
      long long os = -1;
      RIDGE_TRY(intAttribute(what_, e, "os_index", 0, 1 << 24, &os));
      info.osIndex = static_cast<int>(os);
      RIDGE_TRY(gpIndexOf(e, &info.gpIndex));
      numas_.push_back(info);
    } else if (type == "Bridge" || type == "PCIDev") {
      IoRoot r;
      r.el = &e;
      if (ctx) {
        bool have = false;
        RIDGE_TRY(bitmapAttribute(*ctx, "nodeset", &r.nodeset, &r.haveNodeset));
        RIDGE_TRY(bitmapAttribute(*ctx, "cpuset", &r.cpuset, &have));
      }
      ioRoots_.push_back(r);
      return Status::ok();  // its subtree is read when it is attached
    } else if (type == "OSDev" || type == "Misc") {
      return Status::ok();  // OS devices outside PCI (memory, DAX) name nothing we model
    }
    if (type == "Machine") {
      for (const XmlElement& c : e.children)
        if (c.name == "info") rootInfo(c);
      RIDGE_TRY(recordGpIndex(e, machine_));
    } else if (type == "Group") {
      uint64_t gp = 0;
      RIDGE_TRY(gpIndexOf(e, &gp));
      bool have = false;
      CpuSideObject o;
      RIDGE_TRY(bitmapAttribute(e, "cpuset", &o.cpuset, &have));
      if (gp) cpuSideObjects_[gp] = o;
    }
    // Objects with a cpuset (everything on the CPU side) give locality to what hangs below.
    const XmlElement* next = e.attribute("nodeset") || e.attribute("cpuset") ? &e : ctx;
    for (const XmlElement& c : e.children)
      if (c.name == "object") RIDGE_TRY(walk(c, next, depth + 1));
    return Status::ok();
  }

  Status buildCpuSide() {
    // CPU NUMA nodes: those with cpus, unless none has any (then every node counts).
    std::vector<NumaInfo*> cpuNumas;
    for (NumaInfo& n : numas_)
      if (!n.cpuset.empty()) cpuNumas.push_back(&n);
    if (cpuNumas.empty())
      for (NumaInfo& n : numas_) cpuNumas.push_back(&n);
    for (const NumaInfo& n : numas_)
      if (std::find(cpuNumas.begin(), cpuNumas.end(), &n) == cpuNumas.end())
        RIDGE_TRACE("%s:%d: NUMA node %d has no cpus (GPU or device memory); not a placement target",
                    what_.c_str(), n.el->line, n.osIndex);
    for (const PackageInfo& p : packages_) t_->connect(machine_, p.node, LinkKind::Internal, 0, 0);
    if (cpuNumas.empty()) {
      // No NUMANode objects (hwloc 1.x on a non-NUMA machine): one per package, or one.
      if (packages_.empty()) {
        implicitNuma(machine_, Bitmap{{}, true});
      } else {
        for (const PackageInfo& p : packages_) implicitNuma(p.node, p.cpuset);
      }
      return Status::ok();
    }
    for (NumaInfo* n : cpuNumas) {
      int parent = machine_;
      for (const PackageInfo& p : packages_) {
        if (p.cpuset.intersects(n->cpuset)) {
          parent = p.node;
          break;
        }
      }
      Node numa;
      numa.kind = NodeKind::Numa;
      numa.index = n->osIndex;
      numa.cpus = cpuListText(n->cpuset);
      n->node = t_->addNode(numa);
      t_->connect(parent, n->node, LinkKind::Internal, 0, 0);
      placeable_.push_back(*n);
      // In a distance matrix a NUMA node stands for its package: NVLink ends at a CPU.
      if (n->gpIndex) gpNode_[n->gpIndex] = parent;
    }
    return Status::ok();
  }

  void implicitNuma(int parent, const Bitmap& cpuset) {
    Node numa;
    numa.kind = NodeKind::Numa;
    NumaInfo info;
    info.cpuset = cpuset;
    info.osIndex = static_cast<int>(placeable_.size());
    numa.index = info.osIndex;
    numa.cpus = cpuListText(cpuset);
    info.node = t_->addNode(numa);
    t_->connect(parent, info.node, LinkKind::Internal, 0, 0);
    placeable_.push_back(info);
  }

  // The NUMA node an I/O tree belongs to: the first CPU NUMA node in the nodeset of the
  // object it hangs from, else one sharing its cpus, else the first.
  int numaFor(const IoRoot& r) const {
    if (r.haveNodeset)
      for (const NumaInfo& n : placeable_)
        if (n.osIndex >= 0 && r.nodeset.test(static_cast<size_t>(n.osIndex))) return n.node;
    for (const NumaInfo& n : placeable_)
      if (n.cpuset.intersects(r.cpuset)) return n.node;
    return placeable_.front().node;
  }

  Status attachIoRoot(const IoRoot& r) {
    const int numa = numaFor(r);
    const XmlElement& e = *r.el;
    const std::string type = stringAttribute(e, "type");
    double unused = 0;
    if (type == "Bridge" && stringAttribute(e, "bridge_type").rfind("0-", 0) == 0)
      return readIo(e, numa, &unused);
    // A PCI function or PCI-PCI bridge with no host bridge above it (some hwloc 1.x files):
    // give it one so that every PCIe tree starts at a root complex.
    Node hb;
    hb.kind = NodeKind::HostBridge;
    const int hbId = t_->addNode(hb);
    double childGBs = 0;
    RIDGE_TRY(readIo(e, hbId, &childGBs));
    t_->connect(numa, hbId, LinkKind::Pcie, childGBs, kHostBridgeLatencyNs);
    return Status::ok();
  }

  OsDevKind osDevKind(const XmlElement& e) const {
    long long type = -1;
    const std::string* v = e.attribute("osdev_type");
    if (v) type = std::atoll(v->c_str());
    const std::string subtype = stringAttribute(e, "subtype");
    if (subtype == "OpenFabrics") return OsDevKind::OpenFabrics;
    if (hwloc3_) {
      if (type & 32) return OsDevKind::OpenFabrics;
      if (type & 16) return OsDevKind::Network;
      if (type & 4) return OsDevKind::Gpu;
      if (type & 8) return OsDevKind::Coproc;
      if (type & 1) return OsDevKind::Block;
      return OsDevKind::Other;
    }
    switch (type) {
      case 0: return OsDevKind::Block;
      case 1: return OsDevKind::Gpu;
      case 2: return OsDevKind::Network;
      case 3: return OsDevKind::OpenFabrics;
      case 5: return OsDevKind::Coproc;
      default: return OsDevKind::Other;
    }
  }

  // Reads one Bridge or PCIDev element (and its subtree) under `parent`; `*upGBs` gets the
  // bandwidth of the link it adds up to `parent`.
  Status readIo(const XmlElement& e, int parent, double* upGBs) {
    if (t_->nodes().size() > kMaxTopologyNodes)
      return xmlError(what_, e, format("more than %zu devices: not a real machine", kMaxTopologyNodes));
    const std::string type = stringAttribute(e, "type");
    Node n;
    const bool hostBridge = type == "Bridge" && stringAttribute(e, "bridge_type").rfind("0-", 0) == 0;
    double hwlocGBs = 0;
    if (hostBridge) {
      n.kind = NodeKind::HostBridge;
      const std::string range = stringAttribute(e, "bridge_pci");
      if (!range.empty()) n.name = "HostBridge " + range;
    } else {
      const std::string raw = stringAttribute(e, "pci_busid");
      if (raw.empty()) return xmlError(what_, e, type + " without pci_busid");
      if (!normalizeBusId(raw, &n.busId))
        return xmlError(what_, e, "pci_busid \"" + raw + "\" is not a PCI bus id");
      // pci_type: "0302 [10de:1db1] [10de:1212] a1"
      const std::string pciType = stringAttribute(e, "pci_type");
      unsigned cls = 0, vendor = 0, device = 0;
      if (!pciType.empty() && std::sscanf(pciType.c_str(), "%x [%x:%x]", &cls, &vendor, &device) != 3)
        return xmlError(what_, e, "pci_type \"" + pciType + "\" is not \"class [vendor:device] ...\"");
      if (cls > 0xffff || vendor > 0xffff || device > 0xffff)
        return xmlError(what_, e, "pci_type \"" + pciType + "\" has out-of-range ids");
      n.pciClass = cls;
      n.vendor = static_cast<uint16_t>(vendor);
      n.device = static_cast<uint16_t>(device);
      n.kind = type == "Bridge" ? NodeKind::PciBridge : kindForPciClass(cls, n.vendor);
      RIDGE_TRY(realAttribute(what_, e, "pci_link_speed", 0, 10000, &hwlocGBs));
      // hwloc 1.x writes the device name as an attribute, 2.x as PCIVendor/PCIDevice infos.
      n.model = stringAttribute(e, "name");
      for (const XmlElement& c : e.children)
        if (c.name == "info" && stringAttribute(c, "name") == "PCIDevice")
          n.model = stringAttribute(c, "value");
    }
    const int id = t_->addNode(n);
    lines_[id] = e.line;
    RIDGE_TRY(recordGpIndex(e, id));
    if (!hostBridge) {
      int gen = 0, width = 0;
      const double bw = pcieBandwidthFromHwlocGBs(hwlocGBs, &gen, &width);
      t_->connect(parent, id, LinkKind::Pcie, bw, treeEdgeLatencyNs(*t_, parent, id), gen, width);
      *upGBs = bw;
    }
    double fastestChild = 0;
    std::vector<const XmlElement*> osdevs;
    for (const XmlElement& c : e.children) {
      if (c.name != "object") continue;
      const std::string ct = stringAttribute(c, "type");
      if (ct == "Bridge" || ct == "PCIDev") {
        double childGBs = 0;
        RIDGE_TRY(readIo(c, id, &childGBs));
        fastestChild = std::max(fastestChild, childGBs);
      } else if (ct == "OSDev") {
        osdevs.push_back(&c);
        RIDGE_TRY(recordGpIndex(c, id));  // nvml0 in a distance matrix is its GPU
      } else {
        RIDGE_TRACE("%s:%d: skipping %s object under PCI", what_.c_str(), c.line, ct.c_str());
      }
    }
    if (hostBridge) {
      // Priced once the root ports below are known.
      t_->connect(parent, id, LinkKind::Pcie, fastestChild, kHostBridgeLatencyNs);
      *upGBs = fastestChild;
    }
    nameFromOsDevices(id, osdevs);
    return Status::ok();
  }

  void nameFromOsDevices(int id, const std::vector<const XmlElement*>& osdevs) {
    Node& n = t_->mutableNode(id);
    std::vector<std::string> drm;
    struct Fabric {
      std::string name;
      std::vector<std::pair<int, std::string>> ports;  // port number, state
    };
    std::vector<Fabric> fabrics;
    std::vector<std::pair<std::string, int>> netdevs;  // name, port (0 unknown)
    for (const XmlElement* o : osdevs) {
      const std::string name = stringAttribute(*o, "name");
      if (name.empty()) continue;
      const OsDevKind k = osDevKind(*o);
      if (n.kind == NodeKind::Gpu && isDrmDeviceName(name)) {
        drm.push_back(name);
        continue;
      }
      n.osNames.push_back(name);
      if (n.kind == NodeKind::Gpu) {
        if (name.rfind("cuda", 0) == 0 && name.size() > 4 &&
            std::all_of(name.begin() + 4, name.end(),
                        [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }) &&
            name.size() < 9)
          n.cudaIndex = std::atoi(name.c_str() + 4);
        for (const XmlElement& c : o->children)
          if (c.name == "info" && stringAttribute(c, "name") == "GPUModel")
            n.model = stringAttribute(c, "value");
      }
      if (n.kind != NodeKind::Nic) continue;
      if (k == OsDevKind::OpenFabrics) {
        Fabric f;
        f.name = name;
        for (const XmlElement& c : o->children) {
          if (c.name != "info") continue;
          const std::string key = stringAttribute(c, "name");
          // Port<N>State: the verbs port state number (1 DOWN ... 4 ACTIVE).
          if (key.size() > 9 && key.rfind("Port", 0) == 0 && key.compare(key.size() - 5, 5, "State") == 0) {
            const int port = std::atoi(key.c_str() + 4);
            if (port > 0 && port < 256 && f.ports.size() < 256)
              f.ports.push_back({port, stringAttribute(c, "value")});
          }
        }
        fabrics.push_back(f);
      } else if (k == OsDevKind::Network) {
        int port = 0;
        for (const XmlElement& c : o->children)
          if (c.name == "info" && stringAttribute(c, "name") == "Port")
            port = std::atoi(stringAttribute(c, "value").c_str());
        netdevs.push_back({name, port});
      }
    }
    if (n.osNames.empty()) n.osNames = drm;
    if (n.kind != NodeKind::Nic) return;
    const uint16_t cls = pciClassId16(n.pciClass);
    const std::string layer = cls == 0x0207 ? "InfiniBand" : (cls == 0x0200 ? "Ethernet" : "");
    static const char* const kStates[] = {"", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"};
    std::vector<bool> netUsed(netdevs.size(), false);
    for (const Fabric& f : fabrics) {
      std::vector<std::pair<int, std::string>> ports = f.ports;
      if (ports.empty()) ports.push_back({1, ""});
      for (const auto& [num, state] : ports) {
        NicPort p;
        p.name = f.name + ":" + std::to_string(num);
        const int s = std::atoi(state.c_str());
        if (s > 0 && s <= 5) p.state = kStates[s];
        p.linkLayer = layer;
        for (size_t i = 0; i < netdevs.size(); ++i) {
          if (!netUsed[i] && (netdevs[i].second == num ||
                              (netdevs[i].second == 0 && fabrics.size() == 1 && ports.size() == 1))) {
            p.netdev = netdevs[i].first;
            netUsed[i] = true;
            break;
          }
        }
        n.ports.push_back(p);
      }
    }
    for (size_t i = 0; i < netdevs.size(); ++i) {
      if (netUsed[i]) continue;
      NicPort p;
      p.name = netdevs[i].first;
      p.netdev = netdevs[i].first;
      p.linkLayer = layer;
      n.ports.push_back(p);
    }
  }

  // gp_index (hwloc 2.x: every object's global persistent index; 0 or absent in 1.x files).
  Status gpIndexOf(const XmlElement& e, uint64_t* gp) {
    *gp = 0;
    const std::string* v = e.attribute("gp_index");
    if (!v) return Status::ok();
    char* end = nullptr;
    const unsigned long long x = std::strtoull(v->c_str(), &end, 10);
    if (v->empty() || *end != '\0' || (*v)[0] == '-')
      return xmlError(what_, e, "gp_index \"" + *v + "\" is not a number");
    *gp = x;
    return Status::ok();
  }

  Status recordGpIndex(const XmlElement& e, int node) {
    uint64_t gp = 0;
    RIDGE_TRY(gpIndexOf(e, &gp));
    if (gp) gpNode_[gp] = node;
    return Status::ok();
  }

  // Groups (and anything else on the CPU side named only by cpuset) stand for the package
  // their cpus belong to; a group spanning no single package stands for the machine.
  void resolveCpuSideObjects() {
    for (auto& [gp, o] : cpuSideObjects_) {
      o.node = machine_;
      for (const PackageInfo& p : packages_)
        if (!o.cpuset.empty() && p.cpuset.intersects(o.cpuset)) {
          o.node = p.node;
          break;
        }
      gpNode_.emplace(gp, o.node);
    }
  }

  // What an end of an NVLink is: a GPU, an NVSwitch or a CPU (package or machine node).
  enum class NvEnd { Gpu, Switch, Cpu, Other };
  NvEnd nvEndKind(int node) const {
    switch (t_->node(node).kind) {
      case NodeKind::Gpu: return NvEnd::Gpu;
      case NodeKind::NvSwitch: return NvEnd::Switch;
      case NodeKind::Package:
      case NodeKind::Machine: return NvEnd::Cpu;
      default: return NvEnd::Other;
    }
  }

  // Splits whitespace-separated tokens of every child named `tag` (hwloc may cut a long list
  // into several elements), up to `limit` tokens.
  static bool tokens(const XmlElement& d, const char* tag, size_t limit, std::vector<std::string>* out) {
    for (const XmlElement& c : d.children) {
      if (c.name != tag) continue;
      size_t i = 0;
      const std::string& s = c.text;
      while (i < s.size()) {
        while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
        size_t j = i;
        while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
        if (j > i) {
          if (out->size() >= limit) return false;
          out->push_back(s.substr(i, j - i));
        }
        i = j;
      }
    }
    return true;
  }

  // One <distances2> or <distances2hetero> element. Only "NVLinkBandwidth" matters here;
  // other matrices (NUMALatency, XGMIBandwidth, ...) are skipped.
  Status readDistances(const XmlElement& d) {
    if (stringAttribute(d, "name") != "NVLinkBandwidth") return Status::ok();
    long long nbobjs = 0;
    RIDGE_TRY(intAttribute(what_, d, "nbobjs", 0, kMaxNvlinkMatrixObjects, &nbobjs));
    const std::string indexing = stringAttribute(d, "indexing");
    const bool hetero = d.name == "distances2hetero";
    if (indexing != "gp" && !(hetero && indexing.empty())) {
      // os indexing names NUMA nodes and PUs only; GPUs need gp indexes.
      RIDGE_TRACE("%s:%d: NVLinkBandwidth with indexing \"%s\" skipped", what_.c_str(), d.line,
                  indexing.c_str());
      return Status::ok();
    }
    const size_t n = static_cast<size_t>(nbobjs);
    std::vector<std::string> idx, vals;
    if (!tokens(d, "indexes", n, &idx) || idx.size() != n)
      return xmlError(what_, d, format("NVLinkBandwidth lists %zu indexes for nbobjs=%zu", idx.size(), n));
    if (!tokens(d, "u64values", n * n, &vals) || vals.size() != n * n)
      return xmlError(what_, d,
                      format("NVLinkBandwidth has %zu values for a %zux%zu matrix", vals.size(), n, n));
    std::vector<int> nodes(n, -1);
    for (size_t i = 0; i < n; ++i) {
      std::string tok = idx[i];
      if (hetero) {
        const size_t colon = tok.find(':');
        if (colon == std::string::npos)
          return xmlError(what_, d, "NVLinkBandwidth index \"" + tok + "\" is not \"Type:gp_index\"");
        tok = tok.substr(colon + 1);
      }
      char* end = nullptr;
      const unsigned long long gp = std::strtoull(tok.c_str(), &end, 10);
      if (tok.empty() || *end != '\0')
        return xmlError(what_, d, "NVLinkBandwidth index \"" + idx[i] + "\" is not a gp_index");
      auto it = gpNode_.find(gp);
      if (it == gpNode_.end())
        RIDGE_TRACE(
            "%s:%d: NVLinkBandwidth names gp_index %llu, which is no object of the file; its links are "
            "left out",
            what_.c_str(), d.line, gp);
      else
        nodes[i] = it->second;
    }
    std::map<std::pair<int, int>, uint64_t> mbs;  // (low node, high node) -> MB/s
    for (size_t i = 0; i < n; ++i)
      for (size_t j = i + 1; j < n; ++j) {
        uint64_t v = 0;
        for (size_t k : {i * n + j, j * n + i}) {
          char* end = nullptr;
          const unsigned long long x = std::strtoull(vals[k].c_str(), &end, 0);
          if (*end != '\0' || vals[k][0] == '-')
            return xmlError(what_, d, "NVLinkBandwidth value \"" + vals[k] + "\" is not a number");
          v = std::max<uint64_t>(v, x);  // hwloc writes both directions alike; take either
        }
        const int a = nodes[i], b = nodes[j];
        if (v == 0 || a < 0 || b < 0 || a == b) continue;
        const NvEnd ka = nvEndKind(a), kb = nvEndKind(b);
        // NVLink always has a GPU at one end at least (GPU-GPU, GPU-NVSwitch, GPU-CPU).
        if (ka != NvEnd::Gpu && kb != NvEnd::Gpu) continue;
        if (ka == NvEnd::Other || kb == NvEnd::Other) {
          RIDGE_TRACE(
              "%s:%d: NVLinkBandwidth joins %s and %s; only GPUs, NVSwitches and CPUs are NVLink ends",
              what_.c_str(), d.line, nodeKindName(t_->node(a).kind), nodeKindName(t_->node(b).kind));
          continue;
        }
        // A GPU named twice (nvml OS device and PCI function) adds up, as separate links would.
        mbs[{std::min(a, b), std::max(a, b)}] += v;
      }
    for (const auto& [ends, total] : mbs) {
      if (total > kMaxNvlinkMBs)
        return xmlError(what_, d,
                        format("NVLinkBandwidth value %llu MB/s is beyond any NVLink",
                               static_cast<unsigned long long>(total)));
      Link l;
      l.kind = LinkKind::NvLink;
      // Tree-link convention: a CPU end is `a`, as a parent would be.
      const bool cpuFirst = nvEndKind(ends.second) == NvEnd::Cpu;
      l.a = cpuFirst ? ends.second : ends.first;
      l.b = cpuFirst ? ends.first : ends.second;
      l.nvlinkCount = nvlinkLanesFromHwlocMBs(total);
      l.bandwidthGBs = static_cast<double>(total) / 1000.0;
      l.latencyNs = kNvLinkLatencyNs;
      t_->addLink(l);
    }
    return Status::ok();
  }

  static bool matters(NodeKind k) {
    return k == NodeKind::Gpu || k == NodeKind::Nic || k == NodeKind::PciBridge || k == NodeKind::Nvme ||
           k == NodeKind::NvSwitch;
  }

  int lineOf(int id) const {
    auto it = lines_.find(id);
    return it == lines_.end() ? 0 : it->second;
  }

  Status resolveDuplicateBusIds() {
    std::map<std::string, int> seen;
    for (int i = 0; i < static_cast<int>(t_->nodes().size()); ++i) {
      const std::string bus = t_->node(i).busId;
      if (bus.empty()) continue;
      auto [it, fresh] = seen.emplace(bus, i);
      if (fresh) continue;
      const int first = it->second;
      const bool firstMatters = matters(t_->node(first).kind), thisMatters = matters(t_->node(i).kind);
      if (firstMatters && thisMatters)
        return makeError(ridgeInvalidArgument, "%s:%d: bus id %s appears twice (first at line %d)",
                         what_.c_str(), lineOf(i), bus.c_str(), lineOf(first));
      const int loser = thisMatters ? first : i;
      RIDGE_WARN("%s:%d: bus id %s appears twice; the other PCI function keeps it", what_.c_str(),
                 lineOf(loser), bus.c_str());
      Node& l = t_->mutableNode(loser);
      l.name = "PCI " + bus + " (duplicate bus id)";
      l.busId.clear();
      it->second = loser == first ? i : first;
    }
    return Status::ok();
  }

  // GPU names follow CUDA ordinals when hwloc gave every GPU a distinct cuda<N>.
  void numberGpusByCuda() {
    const std::vector<int> gpus = t_->nodesOfKind(NodeKind::Gpu);
    std::vector<int> seen;
    for (int g : gpus) {
      const int c = t_->node(g).cudaIndex;
      if (c < 0 || std::find(seen.begin(), seen.end(), c) != seen.end()) return;
      seen.push_back(c);
    }
    for (int g : gpus) t_->mutableNode(g).index = t_->node(g).cudaIndex;
  }

  const std::string& what_;
  Topology* t_;
  bool hwloc3_ = false;
  int machine_ = -1;
  std::string hostName_;
  CpuIdentity cpu_;
  std::vector<PackageInfo> packages_;
  std::vector<NumaInfo> numas_, placeable_;
  std::vector<IoRoot> ioRoots_;
  std::map<int, int> lines_;        // node id -> line of its element
  std::map<uint64_t, int> gpNode_;  // gp_index -> graph node it stands for
  std::map<uint64_t, CpuSideObject> cpuSideObjects_;
  std::vector<const XmlElement*> distances_;
};

}  // namespace

Status buildFromHwlocXml(const XmlElement& root, const std::string& what, Topology* out) {
  *out = Topology();
  out->name = baseName(what);
  out->source = "hwloc XML " + what;
  HwlocReader reader(what, out);
  RIDGE_TRY(reader.read(root));
  return out->finalize();
}

}  // namespace ridge::topo
