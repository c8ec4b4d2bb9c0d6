#include "topo/model.h"

#include <strings.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ridge::topo {

const char* nodeKindName(NodeKind k) {
  switch (k) {
    case NodeKind::Machine: return "machine";
    case NodeKind::Package: return "package";
    case NodeKind::Numa: return "numa";
    case NodeKind::HostBridge: return "hostbridge";
    case NodeKind::PciBridge: return "bridge";
    case NodeKind::Gpu: return "gpu";
    case NodeKind::Nic: return "nic";
    case NodeKind::NvSwitch: return "nvswitch";
    case NodeKind::Nvme: return "nvme";
    case NodeKind::PciDevice: return "pci";
  }
  return "?";
}

const char* linkKindName(LinkKind k) {
  switch (k) {
    case LinkKind::Internal: return "internal";
    case LinkKind::Pcie: return "pcie";
    case LinkKind::Socket: return "socket";
    case LinkKind::NvLink: return "nvlink";
    case LinkKind::Net: return "net";
  }
  return "?";
}

const char* ncclClassName(NcclClass c) {
  static const char* const names[] = {"LOC", "NVL", "NVB", "PIX", "PXB", "PHB", "SYS", "NET"};
  return names[static_cast<int>(c)];
}

std::string smiClassName(SmiClass c, int nvlinks) {
  switch (c) {
    case SmiClass::X: return "X";
    case SmiClass::NV: return "NV" + std::to_string(nvlinks);
    case SmiClass::PIX: return "PIX";
    case SmiClass::PXB: return "PXB";
    case SmiClass::PHB: return "PHB";
    case SmiClass::NODE: return "NODE";
    case SmiClass::SYS: return "SYS";
  }
  return "?";
}

int Topology::addNode(Node n) {
  finalized_ = false;
  nodes_.push_back(std::move(n));
  return static_cast<int>(nodes_.size()) - 1;
}

int Topology::addLink(Link l) {
  finalized_ = false;
  links_.push_back(l);
  return static_cast<int>(links_.size()) - 1;
}

int Topology::connect(int parent, int child, LinkKind kind, double bandwidthGBs, double latencyNs,
                      int pcieGen, int pcieWidth) {
  if (child >= 0 && child < static_cast<int>(nodes_.size()))
    nodes_[static_cast<size_t>(child)].parent = parent;
  Link l;
  l.kind = kind;
  l.a = parent;
  l.b = child;
  l.bandwidthGBs = bandwidthGBs;
  l.latencyNs = latencyNs;
  l.pcieGen = pcieGen;
  l.pcieWidth = pcieWidth;
  return addLink(l);
}

static bool sane(double v, double max) {
  return std::isfinite(v) && v >= 0 && v <= max;
}

bool isVerbsPort(const NicPort& p) {
  const size_t colon = p.name.rfind(':');
  return colon != std::string::npos && colon > 0 && colon + 1 < p.name.size() && p.name != p.netdev;
}

bool nicHasRdma(const Node& nic) {
  if (nic.kind != NodeKind::Nic) return false;
  if (!nic.ports.empty())
    return std::any_of(nic.ports.begin(), nic.ports.end(), [](const NicPort& p) { return isVerbsPort(p); });
  constexpr uint16_t kVendorMellanox = 0x15b3, kVendorAmazon = 0x1d0f;
  const uint16_t cls = (nic.pciClass > 0xffff ? nic.pciClass >> 8 : nic.pciClass) & 0xffff;
  if (cls == 0x0207) return true;  // InfiniBand
  if (nic.vendor == kVendorMellanox) return true;
  return nic.vendor == kVendorAmazon && (nic.device & 0xfff0) == 0xefa0;  // EFA
}

std::vector<int> Topology::rdmaNicsOrAll() const {
  std::vector<int> all = nics(), rdma;
  for (int n : all)
    if (nicHasRdma(node(n))) rdma.push_back(n);
  return rdma.empty() ? all : rdma;
}

Status Topology::finalize() {
  const int n = static_cast<int>(nodes_.size());
  const std::string what = "topology '" + name + "'";
  root_ = -1;
  for (int i = 0; i < n; ++i) {
    Node& nd = nodes_[static_cast<size_t>(i)];
    if (nd.parent == -1) {
      if (nd.kind != NodeKind::Machine)
        return makeError(ridgeInvalidArgument, "%s: %s node %d ('%s') has no parent", what.c_str(),
                         nodeKindName(nd.kind), i, nd.name.c_str());
      if (root_ >= 0) return makeError(ridgeInvalidArgument, "%s: more than one machine node", what.c_str());
      root_ = i;
    } else if (nd.parent < 0 || nd.parent >= n || nd.parent == i) {
      return makeError(ridgeInvalidArgument, "%s: node %d ('%s') has invalid parent %d", what.c_str(), i,
                       nd.name.c_str(), nd.parent);
    }
    nd.children.clear();
    nd.links.clear();
  }
  if (root_ < 0) return makeError(ridgeInvalidArgument, "%s: no machine node", what.c_str());
  // Cycle check: every walk up must reach the root within n steps.
  for (int i = 0; i < n; ++i) {
    int cur = i, steps = 0;
    while (cur != root_ && steps <= n) cur = nodes_[static_cast<size_t>(cur)].parent, ++steps;
    if (cur != root_)
      return makeError(ridgeInvalidArgument, "%s: the parents of node %d form a cycle", what.c_str(), i);
  }
  for (size_t li = 0; li < links_.size(); ++li) {
    const Link& l = links_[li];
    if (l.a < 0 || l.a >= n || l.b < 0 || l.b >= n || l.a == l.b)
      return makeError(ridgeInvalidArgument, "%s: link %zu joins invalid nodes %d and %d", what.c_str(), li,
                       l.a, l.b);
    // 100 TB/s and 1 s bound what any real link has; larger values are typos or garbage.
    if (!sane(l.bandwidthGBs, 1e5) || !sane(l.latencyNs, 1e9))
      return makeError(ridgeInvalidArgument, "%s: link %zu has absurd bandwidth %g GB/s or latency %g ns",
                       what.c_str(), li, l.bandwidthGBs, l.latencyNs);
    if (l.nvlinkCount < 0 || l.nvlinkCount > 1024 || l.pcieGen < 0 || l.pcieGen > 8 || l.pcieWidth < 0 ||
        l.pcieWidth > 32)
      return makeError(ridgeInvalidArgument, "%s: link %zu has absurd lane counts", what.c_str(), li);
    nodes_[static_cast<size_t>(l.a)].links.push_back(static_cast<int>(li));
    nodes_[static_cast<size_t>(l.b)].links.push_back(static_cast<int>(li));
  }
  // Tree edges without a link are containment the reader did not price. Look from the
  // child's side: a parent may have tens of thousands of children (and links), a child has
  // few links, so this stays linear where searching the parent's list was quadratic.
  auto childLinkTo = [this](int child, int parent) {
    for (int li : nodes_[static_cast<size_t>(child)].links)
      if (links_[static_cast<size_t>(li)].other(child) == parent) return li;
    return -1;
  };
  for (int i = 0; i < n; ++i) {
    const int p = nodes_[static_cast<size_t>(i)].parent;
    if (p < 0) continue;
    nodes_[static_cast<size_t>(p)].children.push_back(i);
    if (childLinkTo(i, p) < 0) {
      Link l;
      l.kind = LinkKind::Internal;
      l.a = p;
      l.b = i;
      links_.push_back(l);
      const int li = static_cast<int>(links_.size()) - 1;
      nodes_[static_cast<size_t>(p)].links.push_back(li);
      nodes_[static_cast<size_t>(i)].links.push_back(li);
    }
  }
  // Ancestors of interest, and switch units. Parents precede children in the order
  // readers add nodes, but do not rely on it: walk up explicitly.
  for (int i = 0; i < n; ++i) {
    Node& nd = nodes_[static_cast<size_t>(i)];
    nd.package = nd.numa = nd.hostBridge = -1;
    for (int cur = nd.parent; cur >= 0; cur = nodes_[static_cast<size_t>(cur)].parent) {
      const NodeKind k = nodes_[static_cast<size_t>(cur)].kind;
      if (k == NodeKind::Package && nd.package < 0) nd.package = cur;
      if (k == NodeKind::Numa && nd.numa < 0) nd.numa = cur;
      if (k == NodeKind::HostBridge && nd.hostBridge < 0) nd.hostBridge = cur;
    }
    if (nd.kind == NodeKind::Package && nd.package < 0) nd.package = i;
    if (nd.kind == NodeKind::Numa && nd.numa < 0) nd.numa = i;
  }
  for (int i = 0; i < n; ++i) {
    Node& nd = nodes_[static_cast<size_t>(i)];
    if (nd.kind != NodeKind::PciBridge || nd.pciSwitch >= 0) continue;
    // Below a root port, PCIe alternates upstream ports (one per switch) and the
    // downstream ports of that switch, so a bridge at an even depth >= 2 below the host
    // bridge belongs to its parent's switch; every other bridge starts a unit of its own.
    int depth = 0;
    for (int cur = nd.parent; cur >= 0 && nodes_[static_cast<size_t>(cur)].kind == NodeKind::PciBridge;
         cur = nodes_[static_cast<size_t>(cur)].parent)
      ++depth;
    nd.pciSwitch = (depth >= 2 && depth % 2 == 0) ? nodes_[static_cast<size_t>(nd.parent)].pciSwitch : i;
    if (nd.pciSwitch < 0) nd.pciSwitch = i;
  }
  // Per-kind indices and names where the reader left them out.
  int counters[16] = {0};
  for (int i = 0; i < n; ++i) {
    Node& nd = nodes_[static_cast<size_t>(i)];
    int& next = counters[static_cast<int>(nd.kind)];
    if (nd.index < 0) nd.index = next;
    next = std::max(next, nd.index) + 1;
    if (!nd.name.empty()) continue;
    switch (nd.kind) {
      case NodeKind::Machine: nd.name = name.empty() ? "Machine" : name; break;
      case NodeKind::Package: nd.name = "Package" + std::to_string(nd.index); break;
      case NodeKind::Numa: nd.name = "NUMA" + std::to_string(nd.index); break;
      case NodeKind::HostBridge: nd.name = "HostBridge " + nd.busId; break;
      case NodeKind::PciBridge: nd.name = "Bridge " + nd.busId; break;
      case NodeKind::Gpu: nd.name = "GPU" + std::to_string(nd.index); break;
      case NodeKind::Nic: nd.name = "NIC" + std::to_string(nd.index); break;
      case NodeKind::NvSwitch: nd.name = "NVSwitch" + std::to_string(nd.index); break;
      case NodeKind::Nvme: nd.name = "NVMe" + std::to_string(nd.index); break;
      case NodeKind::PciDevice: nd.name = "PCI " + nd.busId; break;
    }
  }
  finalized_ = true;
  return Status::ok();
}

std::vector<int> Topology::nodesOfKind(NodeKind k) const {
  std::vector<int> out;
  for (int i = 0; i < static_cast<int>(nodes_.size()); ++i)
    if (nodes_[static_cast<size_t>(i)].kind == k) out.push_back(i);
  std::stable_sort(out.begin(), out.end(), [&](int x, int y) { return node(x).index < node(y).index; });
  return out;
}

// "0000:3b:00.0" and "3b:00.0" name the same function in domain 0.
static bool busIdMatches(const std::string& full, const std::string& query) {
  if (full.empty() || query.empty()) return false;
  if (strcasecmp(full.c_str(), query.c_str()) == 0) return true;
  return full.size() > query.size() && full[full.size() - query.size() - 1] == ':' &&
         strcasecmp(full.c_str() + full.size() - query.size(), query.c_str()) == 0;
}

int Topology::find(const std::string& what) const {
  for (int i = 0; i < static_cast<int>(nodes_.size()); ++i)
    if (strcasecmp(nodes_[static_cast<size_t>(i)].name.c_str(), what.c_str()) == 0) return i;
  for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) {
    const Node& nd = nodes_[static_cast<size_t>(i)];
    for (const std::string& os : nd.osNames)
      if (os == what) return i;
    for (const NicPort& p : nd.ports)
      if (p.name == what || (!p.netdev.empty() && p.netdev == what)) return i;
  }
  for (int i = 0; i < static_cast<int>(nodes_.size()); ++i)
    if (busIdMatches(nodes_[static_cast<size_t>(i)].busId, what)) return i;
  return -1;
}

int Topology::linkBetween(int a, int b) const {
  if (a < 0 || a >= static_cast<int>(nodes_.size())) return -1;
  for (int li : nodes_[static_cast<size_t>(a)].links)
    if (link(li).other(a) == b) return li;
  if (!finalized_)
    for (size_t li = 0; li < links_.size(); ++li)
      if ((links_[li].a == a && links_[li].b == b) || (links_[li].a == b && links_[li].b == a))
        return static_cast<int>(li);
  return -1;
}

static void addPathTotals(const Topology& t, Path* p) {
  p->bandwidthGBs = 0;
  p->latencyNs = 0;
  double bw = 0;
  bool any = false;
  for (int li : p->links) {
    const Link& l = t.link(li);
    p->latencyNs += l.latencyNs;
    if (l.bandwidthGBs > 0) {
      bw = any ? std::min(bw, l.bandwidthGBs) : l.bandwidthGBs;
      any = true;
    }
  }
  p->bandwidthGBs = bw;
}

Path Topology::treePath(int a, int b) const {
  Path p;
  std::vector<int> upA, upB;
  for (int cur = a; cur >= 0; cur = node(cur).parent) upA.push_back(cur);
  for (int cur = b; cur >= 0; cur = node(cur).parent) upB.push_back(cur);
  // Lowest common ancestor: strip the common tail of the two chains.
  size_t ia = upA.size(), ib = upB.size();
  while (ia > 0 && ib > 0 && upA[ia - 1] == upB[ib - 1]) --ia, --ib;
  const int lca = upA[ia];  // ia < size because both chains end at the root
  std::vector<int> down(upB.begin(), upB.begin() + static_cast<long>(ib));
  std::reverse(down.begin(), down.end());

  const int pkgA = node(a).package, pkgB = node(b).package;
  const int socketLink = (pkgA >= 0 && pkgB >= 0 && pkgA != pkgB) ? linkBetween(pkgA, pkgB) : -1;
  if (socketLink >= 0 && node(lca).kind == NodeKind::Machine) {
    // Across packages the data takes the socket link, not the machine node.
    for (size_t i = 0; i < upA.size() && upA[i] != pkgA; ++i) p.nodes.push_back(upA[i]);
    p.nodes.push_back(pkgA);
    p.nodes.push_back(pkgB);
    size_t from = 0;
    while (from < down.size() && down[from] != pkgB) ++from;
    for (size_t i = from + 1; i < down.size(); ++i) p.nodes.push_back(down[i]);
  } else {
    p.nodes.assign(upA.begin(), upA.begin() + static_cast<long>(ia) + 1);
    p.nodes.insert(p.nodes.end(), down.begin(), down.end());
  }
  for (size_t i = 0; i + 1 < p.nodes.size(); ++i) p.links.push_back(linkBetween(p.nodes[i], p.nodes[i + 1]));
  addPathTotals(*this, &p);

  // Classes: the worst hop decides.
  const int numaA = node(a).numa, numaB = node(b).numa;
  p.crossesSocket = (pkgA >= 0 && pkgB >= 0 && pkgA != pkgB) || (numaA >= 0 && numaB >= 0 && numaA != numaB);
  bool throughCpu = false;  // passes a NUMA, package or machine node: different host bridges
  std::vector<int> units;
  for (size_t i = 1; i + 1 < p.nodes.size(); ++i) {
    const Node& nd = node(p.nodes[i]);
    if (nd.kind == NodeKind::HostBridge) p.crossesHostBridge = true;
    if (nd.kind == NodeKind::Numa || nd.kind == NodeKind::Package || nd.kind == NodeKind::Machine)
      throughCpu = true;
    if (nd.kind == NodeKind::PciBridge && std::find(units.begin(), units.end(), nd.pciSwitch) == units.end())
      units.push_back(nd.pciSwitch);
  }
  if (throughCpu) p.crossesHostBridge = true;
  p.bridges = static_cast<int>(units.size());
  if (p.crossesSocket) {
    p.nccl = NcclClass::SYS;
    p.smi = SmiClass::SYS;
  } else if (throughCpu) {
    p.nccl = NcclClass::PHB;
    p.smi = SmiClass::NODE;
  } else if (p.crossesHostBridge) {
    p.nccl = NcclClass::PHB;
    p.smi = SmiClass::PHB;
  } else if (p.bridges <= 1) {
    p.nccl = NcclClass::PIX;
    p.smi = SmiClass::PIX;
  } else {
    p.nccl = NcclClass::PXB;
    p.smi = SmiClass::PXB;
  }
  return p;
}

Path Topology::path(int a, int b) const {
  Path p;
  if (a == b) {
    p.nodes = {a};
    return p;
  }
  const bool gpus = node(a).kind == NodeKind::Gpu && node(b).kind == NodeKind::Gpu;
  if (gpus) {
    const int direct = linkBetween(a, b);
    if (direct >= 0 && link(direct).kind == LinkKind::NvLink) {
      p.nodes = {a, b};
      p.links = {direct};
      addPathTotals(*this, &p);
      p.nccl = NcclClass::NVL;
      p.smi = SmiClass::NV;
      p.nvlinks = link(direct).nvlinkCount;
      return p;
    }
    // Through NVSwitches: every switch both GPUs reach adds its lanes and bandwidth.
    double bw = 0, lat = 0;
    int lanes = 0, via = -1, la = -1, lb = -1;
    for (int li : node(a).links) {
      const Link& l = link(li);
      const int s = l.other(a);
      if (l.kind != LinkKind::NvLink || node(s).kind != NodeKind::NvSwitch) continue;
      const int back = linkBetween(s, b);
      if (back < 0 || link(back).kind != LinkKind::NvLink) continue;
      bw += std::min(l.bandwidthGBs, link(back).bandwidthGBs);
      lanes += std::min(l.nvlinkCount, link(back).nvlinkCount);
      lat = l.latencyNs + link(back).latencyNs;
      if (via < 0) via = s, la = li, lb = back;
    }
    if (via >= 0) {
      p.nodes = {a, via, b};
      p.links = {la, lb};
      p.bandwidthGBs = bw;
      p.latencyNs = lat;
      p.nccl = NcclClass::NVL;
      p.smi = SmiClass::NV;
      p.nvlinks = lanes;
      return p;
    }
    // Through one intermediate GPU (NCCL's NVB), the best such relay.
    Path best;
    for (int li : node(a).links) {
      const Link& l = link(li);
      const int c = l.other(a);
      if (l.kind != LinkKind::NvLink || node(c).kind != NodeKind::Gpu) continue;
      const int back = linkBetween(c, b);
      if (back < 0 || link(back).kind != LinkKind::NvLink) continue;
      Path cand;
      cand.nodes = {a, c, b};
      cand.links = {li, back};
      addPathTotals(*this, &cand);
      if (best.nodes.empty() || cand.bandwidthGBs > best.bandwidthGBs) best = cand;
    }
    if (!best.nodes.empty()) {
      Path pcie = treePath(a, b);
      best.nccl = NcclClass::NVB;
      best.smi = pcie.smi;  // nvidia-smi names only direct NVLink; otherwise the PCIe class
      best.nvlinks = 0;
      return best;
    }
  }
  return treePath(a, b);
}

}  // namespace ridge::topo
