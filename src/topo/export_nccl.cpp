// topologyToNcclXml (export_nccl.h). Written so that Ridge's reader (read_nccl.cpp) gives
// back the same path classes, bandwidths and NVLinks, and NCCL's reader finds every
// attribute it requires (arch and vendor for x86 CPUs, family and model for Intel).
#include "topo/export_nccl.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>

#include "core/status.h"
#include "topo/pci.h"
#include "topo/sysfs.h"

namespace ridge::topo {

namespace {

bool contains(const std::string& text, const char* what) {
  std::string a = text, b = what;
  std::transform(a.begin(), a.end(), a.begin(), [](unsigned char c) { return std::tolower(c); });
  std::transform(b.begin(), b.end(), b.begin(), [](unsigned char c) { return std::tolower(c); });
  return a.find(b) != std::string::npos;
}

// NCCL's CPU attributes from what the graph keeps: the package's model text and the
// socket link's rate (which Ridge derived from the family and model in the first place, so
// inverting it gives a model that prices the link the same again).
std::string cpuAttributes(const Topology& t, int package) {
  const std::string model = package >= 0 ? t.node(package).model : "";
  double socketGBs = 0;
  for (const Link& l : t.links())
    if (l.kind == LinkKind::Socket) socketGBs = std::max(socketGBs, l.bandwidthGBs);
  if (contains(model, "power") || contains(model, "ppc")) return "arch=\"ppc64\"";
  if (contains(model, "neoverse") || contains(model, "grace") || contains(model, "arm") ||
      contains(model, "aarch64"))
    return "arch=\"arm64\"";
  if (contains(model, "amd") || contains(model, "epyc") || contains(model, "hygon"))
    return "arch=\"x86_64\" vendor=\"AuthenticAMD\"";
  int family = 6, modelId = 0;
  size_t at = model.find("family ");
  if (at == std::string::npos ||
      std::sscanf(model.c_str() + at, "family %d model %d", &family, &modelId) != 2) {
    family = 6;
    modelId = socketGBs >= 40 ? 0xcf : socketGBs >= 22 ? 0x8f : socketGBs >= 10 ? 0x55 : 0x4f;
  }
  return format("arch=\"x86_64\" vendor=\"GenuineIntel\" familyid=\"%d\" modelid=\"%d\"", family, modelId);
}

std::string linkSpeedText(int gen) {
  static const char* kSpeeds[] = {"", "2.5 GT/s", "5 GT/s", "8 GT/s", "16 GT/s", "32 GT/s", "64 GT/s"};
  return gen >= 1 && gen <= 6 ? kSpeeds[gen] : "";
}

class Writer {
 public:
  explicit Writer(const Topology& t) : t_(t) {
    int virtualId = 0;
    for (int s : t.nodesOfKind(NodeKind::NvSwitch))
      switchBus_[s] = t.node(s).busId.empty() ? format("ffff:fe:%02x.0", virtualId++) : t.node(s).busId;
    // NCCL numbers net devices as the network plugin lists them: NIC order, then port.
    int dev = 0;
    for (int n : t.nics()) {
      firstNetDev_[n] = dev;
      dev += std::max<int>(1, static_cast<int>(t.node(n).ports.size()));
    }
  }

  std::string run() {
    o_ << "<system version=\"1\">\n";
    for (int numa : t_.nodesOfKind(NodeKind::Numa)) {
      const Node& n = t_.node(numa);
      o_ << "  <cpu numaid=\"" << std::max(n.index, 0) << "\"";
      if (!n.cpus.empty()) o_ << " affinity=\"" << formatCpuMask(parseCpuList(n.cpus)) << "\"";
      o_ << " " << cpuAttributes(t_, n.package) << ">\n";
      for (int c : n.children) device(c, 2);
      o_ << "  </cpu>\n";
    }
    o_ << "</system>\n";
    return o_.str();
  }

 private:
  bool holdsGpuOrNic(int id) const {
    const Node& n = t_.node(id);
    if (n.kind == NodeKind::Gpu || n.kind == NodeKind::Nic) return true;
    for (int c : n.children)
      if (holdsGpuOrNic(c)) return true;
    return false;
  }

  // The PCIe link into `id` from its parent (generation, width); 0 when not physical.
  std::pair<int, int> linkInto(int id) const {
    const int l = t_.linkBetween(t_.node(id).parent, id);
    return l >= 0 ? std::make_pair(t_.link(l).pcieGen, t_.link(l).pcieWidth) : std::make_pair(0, 0);
  }

  // Host bridges are implied by the cpu; a switch's downstream ports are folded into the
  // element of its upstream port, so that there is one element per switch unit (root ports
  // are units of their own, in Ridge's model as in NCCL's count of bridges).
  bool folded(int id) const {
    const Node& n = t_.node(id);
    if (n.kind == NodeKind::HostBridge) return true;
    return n.kind == NodeKind::PciBridge && n.pciSwitch >= 0 && n.pciSwitch != id;
  }

  void device(int id, int depth) {
    const Node& n = t_.node(id);
    if (!holdsGpuOrNic(id)) return;
    if (folded(id)) {
      for (int c : n.children) device(c, depth);
      return;
    }
    const std::string pad(size_t(depth) * 2, ' ');
    if (n.busId.empty() && n.kind == NodeKind::Nic) {  // a NIC with no PCI path
      nic(id, depth);
      return;
    }
    if (n.busId.empty()) {
      for (int c : n.children) device(c, depth);
      return;
    }
    // A link folded away (root port, downstream port) carries the rate into this element.
    auto [gen, width] = linkInto(id);
    for (int up = n.parent; gen == 0 && up >= 0 && folded(up) && t_.node(up).kind != NodeKind::HostBridge;
         up = t_.node(up).parent)
      std::tie(gen, width) = linkInto(up);
    uint32_t cls = n.pciClass;
    if (cls && cls <= 0xffff) cls <<= 8;  // 16-bit class: NCCL writes base, sub and interface
    if (!cls) cls = n.kind == NodeKind::Gpu ? 0x030200 : n.kind == NodeKind::Nic ? 0x020700 : 0x060400;
    o_ << pad << "<pci busid=\"" << n.busId << "\" class=\"" << format("0x%06x", cls) << "\"";
    if (n.vendor) o_ << " vendor=\"" << format("0x%04x", n.vendor) << "\"";
    if (n.device) o_ << " device=\"" << format("0x%04x", n.device) << "\"";
    if (gen > 0) o_ << " link_speed=\"" << linkSpeedText(gen) << "\"";
    if (width > 0) o_ << " link_width=\"" << width << "\"";
    o_ << ">\n";
    if (n.kind == NodeKind::Gpu) gpu(id, depth + 1);
    if (n.kind == NodeKind::Nic) nic(id, depth + 1);
    for (int c : n.children) device(c, depth + 1);
    o_ << pad << "</pci>\n";
  }

  void gpu(int id, int depth) {
    const Node& n = t_.node(id);
    const std::string pad(size_t(depth) * 2, ' ');
    const int dev = n.cudaIndex >= 0 ? n.cudaIndex : std::max(n.index, 0);
    o_ << pad << "<gpu dev=\"" << dev << "\" sm=\"" << n.smVersion << "\" rank=\"" << dev << "\" gdr=\"1\"";
    std::vector<std::string> lines;
    for (int l : n.links) {
      const Link& k = t_.link(l);
      if (k.kind != LinkKind::NvLink) continue;
      const int peer = k.other(id);
      const Node& p = t_.node(peer);
      const bool sw = p.kind == NodeKind::NvSwitch;
      if (!sw && p.busId.empty()) continue;
      lines.push_back(format("<nvlink target=\"%s\" count=\"%d\" tclass=\"0x%06x\"/>",
                             sw ? switchBus_[peer].c_str() : p.busId.c_str(), std::max(k.nvlinkCount, 1),
                             sw ? 0x068000u : 0x030200u));
    }
    if (lines.empty()) {
      o_ << "/>\n";
      return;
    }
    o_ << ">\n";
    for (const std::string& s : lines) o_ << pad << "  " << s << "\n";
    o_ << pad << "</gpu>\n";
  }

  void nic(int id, int depth) {
    const Node& n = t_.node(id);
    int netDev = firstNetDev_[id];
    const std::string pad(size_t(depth) * 2, ' ');
    o_ << pad << "<nic>\n";
    std::vector<NicPort> ports = n.ports;
    if (ports.empty()) {  // NCCL needs a net per NIC: name it after the device
      NicPort p;
      p.name = n.osNames.empty() ? n.name : n.osNames.front();
      ports.push_back(p);
    }
    for (const NicPort& p : ports) {
      // "mlx5_0:1" is device mlx5_0, port 1 (read_nccl.cpp writes ports that way).
      std::string name = p.name;
      int port = 1;
      const size_t colon = name.rfind(':');
      if (colon != std::string::npos && colon + 1 < name.size() &&
          std::all_of(name.begin() + long(colon) + 1, name.end(),
                      [](unsigned char c) { return std::isdigit(c); })) {
        port = std::atoi(name.c_str() + colon + 1);
        name = name.substr(0, colon);
      }
      o_ << pad << "  <net name=\"" << name << "\" dev=\"" << netDev++ << "\"";
      if (p.rateGbps > 0) o_ << " speed=\"" << static_cast<long long>(p.rateGbps * 1000 + 0.5) << "\"";
      o_ << " port=\"" << port << "\" latency=\"0.000000\" guid=\"" << format("0x%x", netDev)
         << "\" maxconn=\"131072\" gdr=\"1\"/>\n";
    }
    o_ << pad << "</nic>\n";
  }

  const Topology& t_;
  std::map<int, std::string> switchBus_;
  std::map<int, int> firstNetDev_;
  std::ostringstream o_;
};

}  // namespace

std::string topologyToNcclXml(const Topology& t) {
  return Writer(t).run();
}

}  // namespace ridge::topo
