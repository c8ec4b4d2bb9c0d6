// Live discovery: hwloc (or /sys) for the tree, /sys for link rates and NIC ports, NVML
// for NVLink. See discover.h and docs/topology.md ("Discovery").
//
// With hwloc, the live topology is exported as XML in memory and read by the same reader
// as hwloc files (read_hwloc.cpp), so files and live machines give identical graphs; the
// export and parse cost a few milliseconds. The graph is then copied once with what only
// the live machine can tell (exact PCIe width and rate, port states and rates, NVLinks).
#include "topo/discover.h"

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <map>

#include "core/log.h"
#include "topo/graph_build.h"
#include "topo/load.h"
#include "topo/nvml_loader.h"
#include "topo/pci.h"
#include "topo/sysfs.h"

#ifdef RIDGE_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace ridge::topo {

namespace {

using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

const std::string kPciDevices = "/sys/bus/pci/devices/";

long readLong(const std::string& path, long fallback, int base = 10) {
  std::string s;
  if (!readFirstLine(path, &s) || s.empty()) return fallback;
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, base);
  return end == s.c_str() ? fallback : v;
}

std::string hostName() {
  char buf[256] = {};
  return gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string("localhost");
}

// ---- PCIe links from sysfs ------------------------------------------------------------

// The bus id of the PCI function above `busId` in the kernel's device tree ("" at a host
// bridge), from the path /sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0.
std::string sysfsParentBusId(const std::string& busId) {
  char real[PATH_MAX];
  if (!realpath((kPciDevices + busId).c_str(), real)) return "";
  std::string p = real;
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return "";
  p.resize(slash);
  const std::string parent = p.substr(p.rfind('/') + 1);
  std::string norm;
  return normalizeBusId(parent, &norm) && parent.rfind("pci", 0) != 0 ? parent : std::string();
}

struct LiveLink {
  int width = 0;
  double gts = 0;
};

// The link above a PCI function. An idle GPU or NIC may train its link down to 2.5 GT/s to
// save power and retrain on load, so when both ends can do more than the current rate, the
// rate both support (min of the two maxima) is what transfers will see; the width is the
// trained one (a x16 device in a x8 slot stays x8).
LiveLink liveLink(const std::string& busId) {
  LiveLink l;
  const std::string dir = kPciDevices + busId + "/";
  std::string s;
  l.width = static_cast<int>(readLong(dir + "current_link_width", 0));
  if (l.width < 0 || l.width > 32) l.width = 0;
  if (readFirstLine(dir + "current_link_speed", &s)) l.gts = parseGts(s);
  double maxDev = 0, maxParent = 0;
  if (readFirstLine(dir + "max_link_speed", &s)) maxDev = parseGts(s);
  const std::string parent = sysfsParentBusId(busId);
  if (!parent.empty() && readFirstLine(kPciDevices + parent + "/max_link_speed", &s)) maxParent = parseGts(s);
  if (maxDev > 0 && maxParent > 0 && std::min(maxDev, maxParent) > l.gts) l.gts = std::min(maxDev, maxParent);
  return l;
}

// ---- NIC ports from sysfs -------------------------------------------------------------

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// Network interfaces of a PCI function (virtio NICs keep theirs one level down).
std::vector<std::string> netdevsOf(const std::string& busId) {
  const std::string dir = kPciDevices + busId + "/";
  std::vector<std::string> names = listDir(dir + "net");
  for (const std::string& sub : listDir(dir))
    if (sub.rfind("virtio", 0) == 0)
      for (const std::string& n : listDir(dir + sub + "/net")) names.push_back(n);
  return names;
}

// Ports of a NIC: one per InfiniBand/RoCE port (with the netdev whose dev_port matches),
// then one per remaining network interface. Empty when sysfs has nothing for it.
std::vector<NicPort> sysfsPorts(const std::string& busId, std::vector<std::string>* names) {
  std::vector<NicPort> ports;
  std::vector<std::string> netdevs = netdevsOf(busId);
  std::vector<bool> used(netdevs.size(), false);
  for (const std::string& ib : listDir(kPciDevices + busId + "/infiniband")) {
    names->push_back(ib);
    const std::string portsDir = "/sys/class/infiniband/" + ib + "/ports/";
    for (const std::string& num : listDir(portsDir)) {
      NicPort p;
      p.name = ib + ":" + num;
      std::string s;
      // "4: ACTIVE", "400 Gb/sec (4X NDR)", "InfiniBand"
      if (readFirstLine(portsDir + num + "/state", &s))
        p.state = s.find(": ") != std::string::npos ? s.substr(s.find(": ") + 2) : s;
      if (readFirstLine(portsDir + num + "/rate", &s)) p.rateGbps = std::strtod(s.c_str(), nullptr);
      if (readFirstLine(portsDir + num + "/link_layer", &s)) p.linkLayer = s;
      const long portNo = std::strtol(num.c_str(), nullptr, 10);
      for (size_t i = 0; i < netdevs.size(); ++i) {
        if (used[i]) continue;
        if (readLong("/sys/class/net/" + netdevs[i] + "/dev_port", 0) + 1 == portNo) {
          p.netdev = netdevs[i];
          used[i] = true;
          break;
        }
      }
      ports.push_back(p);
    }
  }
  for (size_t i = 0; i < netdevs.size(); ++i) {
    names->push_back(netdevs[i]);
    if (used[i]) continue;
    NicPort p;
    p.name = p.netdev = netdevs[i];
    std::string s;
    if (readFirstLine("/sys/class/net/" + netdevs[i] + "/operstate", &s))
      p.state = s == "up" ? "ACTIVE" : upper(s);
    const long mbps = readLong("/sys/class/net/" + netdevs[i] + "/speed", -1);  // -1 when down
    if (mbps > 0) p.rateGbps = static_cast<double>(mbps) / 1000.0;
    const long type = readLong("/sys/class/net/" + netdevs[i] + "/type", 1);
    p.linkLayer = type == 32 ? "InfiniBand" : "Ethernet";  // ARPHRD_INFINIBAND = 32
    ports.push_back(p);
  }
  return ports;
}

// ---- The graph without hwloc ----------------------------------------------------------

Status sysfsGraph(Topology* t) {
  Node m;
  m.kind = NodeKind::Machine;
  const int machine = t->addNode(m);
  // Packages from the CPUs' topology, NUMA nodes from /sys/devices/system/node.
  std::map<int, int> packageNode;  // physical_package_id -> node
  std::map<int, int> cpuPackage;   // cpu -> physical_package_id
  std::string online;
  readFirstLine("/sys/devices/system/cpu/online", &online);
  for (int c : parseCpuList(online)) {
    const int pkg = static_cast<int>(
        readLong("/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/physical_package_id", 0));
    cpuPackage[c] = pkg;
    if (packageNode.count(pkg)) continue;
    Node p;
    p.kind = NodeKind::Package;
    p.index = pkg;
    packageNode[pkg] = t->addNode(p);
    t->connect(machine, packageNode[pkg], LinkKind::Internal, 0, 0);
  }
  std::map<int, int> numaNode;  // os index -> node
  for (const std::string& n : listDir("/sys/devices/system/node")) {
    if (n.size() < 5 || n.rfind("node", 0) != 0 || !std::isdigit(static_cast<unsigned char>(n[4]))) continue;
    std::string cpus;
    readFirstLine("/sys/devices/system/node/" + n + "/cpulist", &cpus);
    const std::vector<int> list = parseCpuList(cpus);
    if (list.empty()) continue;  // memory-only node: not a placement target (as for files)
    Node numa;
    numa.kind = NodeKind::Numa;
    numa.index = std::atoi(n.c_str() + 4);
    numa.cpus = cpus;
    const int id = t->addNode(numa);
    auto pkg = cpuPackage.find(list.front());
    t->connect(pkg != cpuPackage.end() ? packageNode[pkg->second] : machine, id, LinkKind::Internal, 0, 0);
    numaNode[numa.index] = id;
  }
  if (numaNode.empty()) {
    Node numa;
    numa.kind = NodeKind::Numa;
    numa.index = 0;
    const int id = t->addNode(numa);
    t->connect(packageNode.empty() ? machine : packageNode.begin()->second, id, LinkKind::Internal, 0, 0);
    numaNode[0] = id;
  }
  // PCI: the devices that matter and every bridge on their way up.
  std::map<std::string, int> byKey;  // "pci0000:00" or bus id -> node
  std::vector<int> hostBridges;
  for (const std::string& bus : listDir(kPciDevices)) {
    const long cls = readLong(kPciDevices + bus + "/class", 0, 16);
    const long vendor = readLong(kPciDevices + bus + "/vendor", 0, 16);
    const long device = readLong(kPciDevices + bus + "/device", 0, 16);
    const NodeKind kind =
        kindForPciClass(static_cast<uint32_t>(cls) & 0xffffff, static_cast<uint16_t>(vendor));
    if (kind == NodeKind::PciDevice || kind == NodeKind::PciBridge) continue;
    char real[PATH_MAX];
    if (!realpath((kPciDevices + bus).c_str(), real)) continue;
    // /sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0 -> the components after /sys/devices.
    std::vector<std::string> chain;
    std::string p = real;
    const size_t at = p.find("/pci");
    if (at == std::string::npos) continue;
    for (size_t s = at + 1; s < p.size();) {
      const size_t e = p.find('/', s);
      chain.push_back(p.substr(s, e == std::string::npos ? std::string::npos : e - s));
      if (e == std::string::npos) break;
      s = e + 1;
    }
    if (chain.size() < 2) continue;
    int parent = -1;
    for (size_t i = 0; i < chain.size(); ++i) {
      auto found = byKey.find(chain[i]);
      if (found != byKey.end()) {
        parent = found->second;
        continue;
      }
      Node n;
      if (i == 0) {
        n.kind = NodeKind::HostBridge;
        n.name = "HostBridge " + chain[i];
      } else {
        std::string norm;
        if (!normalizeBusId(chain[i], &norm)) break;
        n.busId = norm;
        const bool last = i + 1 == chain.size();
        n.kind = last ? kind : NodeKind::PciBridge;
        n.pciClass = static_cast<uint32_t>(readLong(kPciDevices + chain[i] + "/class", 0, 16));
        n.vendor = static_cast<uint16_t>(last ? vendor : readLong(kPciDevices + chain[i] + "/vendor", 0, 16));
        n.device = static_cast<uint16_t>(last ? device : readLong(kPciDevices + chain[i] + "/device", 0, 16));
        if (last && kind == NodeKind::Nvme)
          for (const std::string& d : listDir(kPciDevices + chain[i] + "/nvme")) n.osNames.push_back(d);
      }
      const int id = t->addNode(n);
      byKey[chain[i]] = id;
      if (i == 0) {
        hostBridges.push_back(id);
        const long numa = readLong(kPciDevices + bus + "/numa_node", -1);
        auto nn = numaNode.find(static_cast<int>(numa));
        t->mutableNode(id).parent = nn != numaNode.end() ? nn->second : numaNode.begin()->second;
      } else {
        const LiveLink l = liveLink(chain[i]);
        t->connect(parent, id, LinkKind::Pcie, pcieBandwidthGBs(l.width, l.gts),
                   treeEdgeLatencyNs(*t, parent, id), pcieGenFromGts(l.gts), l.width);
      }
      parent = id;
    }
  }
  for (int hb : hostBridges)
    t->connect(t->node(hb).parent, hb, LinkKind::Pcie, fastestChildLinkGBs(*t, hb), kHostBridgeLatencyNs);
  std::vector<int> pkgs;
  for (const auto& [id, node] : packageNode) pkgs.push_back(node);
  CpuIdentity cpu;
  // /proc/cpuinfo's vendor and model identify the socket link as hwloc's infos do.
  if (FILE* f = std::fopen("/proc/cpuinfo", "r")) {
    char line[512];
    for (int i = 0; i < 64 && std::fgets(line, sizeof line, f); ++i) {
      std::string s = line;
      const size_t colon = s.find(':');
      if (colon == std::string::npos) continue;
      std::string key = s.substr(0, colon), value = s.substr(colon + 1);
      while (!key.empty() && (key.back() == '\t' || key.back() == ' ')) key.pop_back();
      while (!value.empty() && (value.front() == ' ')) value.erase(0, 1);
      while (!value.empty() && (value.back() == '\n')) value.pop_back();
      if (key == "vendor_id") cpu.vendor = value;
      if (key == "cpu family") cpu.family = std::atoi(value.c_str());
      if (key == "model") cpu.model = std::atoi(value.c_str());
      if (key == "model name" || key == "cpu") cpu.modelName = value;
    }
    std::fclose(f);
  }
  addSocketLinks(t, pkgs, socketLinkGBs(cpu));
  return Status::ok();
}

// ---- hwloc ----------------------------------------------------------------------------

#ifdef RIDGE_HAVE_HWLOC
Status hwlocGraph(Topology* t, std::string* version) {
  std::string text;
  RIDGE_TRY(exportHwlocXml(&text, version));
  return parseHwlocXmlText(text, "hwloc export (this machine)", t);
}
#endif

// ---- What only the live machine tells -------------------------------------------------

// Copies `src` with live link rates, NIC ports and NVML's NVLinks, then finalizes.
Status enrich(const Topology& src, Topology* out, std::string* nvmlNote) {
  Topology t;
  t.name = src.name;
  t.source = src.source;
  for (Node n : src.nodes()) {
    if (n.kind == NodeKind::Nic && !n.busId.empty()) {
      std::vector<std::string> names;
      std::vector<NicPort> ports = sysfsPorts(n.busId, &names);
      if (!ports.empty()) n.ports = std::move(ports);
      for (const std::string& name : names)
        if (std::find(n.osNames.begin(), n.osNames.end(), name) == n.osNames.end()) n.osNames.push_back(name);
    }
    t.addNode(std::move(n));
  }
  for (Link l : src.links()) {
    const Node& child = src.node(l.b);
    if (l.kind == LinkKind::Pcie && child.parent == l.a && !child.busId.empty()) {
      const LiveLink live = liveLink(child.busId);
      if (live.width > 0 && live.gts > 0) {
        l.pcieWidth = live.width;
        l.pcieGen = pcieGenFromGts(live.gts);
        l.bandwidthGBs = pcieBandwidthGBs(live.width, live.gts);
      }
    }
    t.addLink(l);
  }
  // GPUs in PCI bus order, the order nvidia-smi and CUDA_DEVICE_ORDER=PCI_BUS_ID use.
  std::vector<int> gpus;
  for (int i = 0; i < static_cast<int>(t.nodes().size()); ++i)
    if (t.node(i).kind == NodeKind::Gpu) gpus.push_back(i);
  std::sort(gpus.begin(), gpus.end(), [&](int a, int b) { return t.node(a).busId < t.node(b).busId; });
  for (size_t i = 0; i < gpus.size(); ++i) t.mutableNode(gpus[i]).index = static_cast<int>(i);

  std::vector<NvmlGpu> nvml;
  std::string why;
  if (!readNvmlGpus(&nvml, &why)) {
    RIDGE_INFO("topology: no NVLink information: %s", why.c_str());
    *nvmlNote = "";
  } else {
    *nvmlNote = " + NVML";
    addNvLinksFromNvml(&t, src.root(), nvml);
  }
  RIDGE_TRY(t.finalize());
  *out = std::move(t);
  return Status::ok();
}

}  // namespace

#ifdef RIDGE_HAVE_HWLOC
Status exportHwlocXml(std::string* xmlOut, std::string* version) {
  hwloc_topology_t topo = nullptr;
  if (hwloc_topology_init(&topo) != 0) return systemError("hwloc_topology_init");
  // Devices that matter (GPUs, NICs, storage, co-processors) and the bridges above them;
  // caches say nothing about I/O paths and only make the export longer.
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  hwloc_topology_set_cache_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_NONE);
  hwloc_topology_set_icache_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_NONE);
  // Components that cost time and add nothing here: cuda initializes the CUDA runtime
  // (hundreds of ms on a GPU machine), nvml is read by us with NVLink detail, opencl/gl/
  // levelzero start other runtimes, and x86 runs CPUID on every PU (slow under a
  // hypervisor) for vendor/model infos the linux component reads from /proc/cpuinfo too.
  // Blacklisting a component this hwloc lacks fails harmlessly.
  for (const char* name : {"cuda", "nvml", "opencl", "gl", "levelzero", "x86"})
    hwloc_topology_set_components(topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, name);
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    return systemError("hwloc_topology_load");
  }
  char* xml = nullptr;
  int len = 0;
  if (hwloc_topology_export_xmlbuffer(topo, &xml, &len, 0) != 0) {
    hwloc_topology_destroy(topo);
    return systemError("hwloc_topology_export_xmlbuffer");
  }
  xmlOut->assign(xml, len > 0 ? static_cast<size_t>(len - 1) : 0);
  hwloc_free_xmlbuffer(topo, xml);
  const char* ver = hwloc_obj_get_info_by_name(hwloc_get_root_obj(topo), "hwlocVersion");
  *version = ver ? ver : HWLOC_VERSION;
  hwloc_topology_destroy(topo);
  return Status::ok();
}
#else
Status exportHwlocXml(std::string*, std::string*) {
  return Status(ridgeInvalidUsage, "built without hwloc");
}
#endif

void addNvLinksFromNvml(Topology* tp, int machine, const std::vector<NvmlGpu>& nvml) {
  Topology& t = *tp;
  std::map<std::string, int> byBus;
  for (int i = 0; i < static_cast<int>(t.nodes().size()); ++i)
    if (!t.node(i).busId.empty()) byBus[t.node(i).busId] = i;
  std::map<std::pair<int, int>, int> lanes;  // (gpu, peer) -> lanes; GPU pairs keyed low-high, CPU ends first
  for (const NvmlGpu& g : nvml) {
    auto it = byBus.find(g.busId);
    if (it == byBus.end() || t.node(it->second).kind != NodeKind::Gpu) continue;
    const int gpu = it->second;
    Node& gn = t.mutableNode(gpu);
    if (g.smVersion > 0) gn.smVersion = g.smVersion;
    if (gn.model.empty()) gn.model = g.name;
    for (const NvmlLink& l : g.activeLinks) {
      if (l.remote == NvmlRemote::Cpu) {
        // POWER's GPU-CPU NVLink: a link to the GPU's package (the CPU end first, as a
        // parent would be), as the hwloc XML reader records it.
        const int pkg = gn.package >= 0 ? gn.package : machine;
        ++lanes[{pkg, gpu}];
        continue;
      }
      if (l.remoteBusId.empty()) continue;
      auto peer = byBus.find(l.remoteBusId);
      const bool peerIsGpu = peer != byBus.end() && t.node(peer->second).kind == NodeKind::Gpu;
      if (peerIsGpu && peer->second == gpu) continue;
      if (peerIsGpu || l.remote == NvmlRemote::Gpu) {
        // Each end reports the link; count it from the lower-numbered end only. A GPU peer
        // outside the tree (hidden from this container) is left out.
        if (peerIsGpu && gpu < peer->second) ++lanes[{gpu, peer->second}];
        continue;
      }
      // Anything else at the far end of an NVLink is an NVSwitch, one node per bus id.
      int sw = peer != byBus.end() && t.node(peer->second).kind == NodeKind::NvSwitch ? peer->second : -1;
      if (sw < 0) {
        Node s;
        s.kind = NodeKind::NvSwitch;
        s.busId = l.remoteBusId;
        s.pciClass = 0x068000;
        s.vendor = 0x10de;
        sw = t.addNode(s);
        // The switch's place on the host's PCIe tree is not where traffic goes; hanging it
        // from the machine keeps it out of every PCIe route.
        t.connect(machine, sw, LinkKind::Internal, 0, 0);
        byBus[l.remoteBusId] = sw;
      }
      ++lanes[{gpu, sw}];
    }
  }
  for (const auto& [ends, count] : lanes) {
    int sm = t.node(ends.first).smVersion;
    if (sm == 0 && t.node(ends.second).kind == NodeKind::Gpu) sm = t.node(ends.second).smVersion;
    Link l;
    l.kind = LinkKind::NvLink;
    l.a = ends.first;
    l.b = ends.second;
    l.nvlinkCount = count;
    l.bandwidthGBs = count * nvlinkLaneGBs(sm);
    l.latencyNs = kNvLinkLatencyNs;
    t.addLink(l);
  }
}

Status discoverThisMachineSysfs(Topology* out) {
  const auto start = Clock::now();
  Topology raw;
  raw.name = hostName();
  raw.source = "sysfs";
  RIDGE_TRY(sysfsGraph(&raw));
  RIDGE_TRY(raw.finalize());
  std::string nvml;
  RIDGE_TRY(enrich(raw, out, &nvml));
  out->source = "sysfs" + nvml + " (this machine)";
  out->loadMs = msSince(start);
  return Status::ok();
}

Status discoverThisMachine(Topology* out) {
#ifdef RIDGE_HAVE_HWLOC
  const auto start = Clock::now();
  Topology raw;
  std::string version;
  Status s = hwlocGraph(&raw, &version);
  if (!s.isOk()) {
    RIDGE_WARN("hwloc discovery failed (%s); reading /sys instead", s.message().c_str());
    return discoverThisMachineSysfs(out);
  }
  raw.name = hostName();
  std::string nvml;
  RIDGE_TRY(enrich(raw, out, &nvml));
  out->source = "hwloc " + version + " + sysfs" + nvml + " (this machine)";
  out->loadMs = msSince(start);
  RIDGE_INFO("topology: %s discovered in %.1f ms", out->source.c_str(), out->loadMs);
  return Status::ok();
#else
  return discoverThisMachineSysfs(out);
#endif
}

}  // namespace ridge::topo
