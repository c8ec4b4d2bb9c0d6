#include "topo/gdr_placement.h"

#include <algorithm>

namespace ridge::topo {

namespace {

bool isCpuSide(NodeKind k) {
  return k == NodeKind::HostBridge || k == NodeKind::Numa || k == NodeKind::Package || k == NodeKind::Machine;
}

// The switch unit of a bridge, -1 for anything else. Root ports are units of their own but
// belong to the root complex: the route charges them through the host bridge's hop.
int switchUnit(const Topology& t, int id) {
  const Node& n = t.node(id);
  if (n.kind != NodeKind::PciBridge) return -1;
  const int unit = n.pciSwitch >= 0 ? n.pciSwitch : id;
  const Node& u = t.node(unit);
  const bool rootPort = u.parent < 0 || t.node(u.parent).kind != NodeKind::PciBridge;
  return rootPort ? -2 : unit;
}

PlacementClass placementOf(SmiClass c) {
  switch (c) {
    case SmiClass::PIX: return PlacementClass::PIX;
    case SmiClass::PXB: return PlacementClass::PXB;
    case SmiClass::PHB: return PlacementClass::PHB;
    case SmiClass::NODE: return PlacementClass::NODE;
    case SmiClass::SYS: return PlacementClass::SYS;
    default: return PlacementClass::Unknown;
  }
}

}  // namespace

Route routeBetween(const Topology& t, int from, int to, Completer completer) {
  Route r;
  r.completer = completer;
  const Path p = t.path(from, to);
  int lastUnit = -1;
  for (size_t i = 0; i < p.links.size(); ++i) {
    const int a = p.nodes[i], b = p.nodes[i + 1];
    if (p.links[i] >= 0) {
      const Link& l = t.link(p.links[i]);
      const Node &na = t.node(a), &nb = t.node(b);
      if (l.kind == LinkKind::Socket) {
        r.hops.push_back(Hop::socketLink(l.bandwidthGBs, l.latencyNs > 0 ? l.latencyNs : -1));
      } else if (l.kind == LinkKind::Pcie && !isCpuSide(na.kind) && !isCpuSide(nb.kind)) {
        const int ua = switchUnit(t, a), ub = switchUnit(t, b);
        const bool insideSwitch = ua >= 0 && ua == ub;
        const bool insideRootComplex = ua == -2 && ub == -2;
        if (!insideSwitch && !insideRootComplex) {
          Hop h = Hop::link(l.pcieGen, l.pcieWidth);
          // A link without a known generation still has the bandwidth the reader gave it.
          if (l.pcieGen <= 0 || l.pcieWidth <= 0) h.bandwidthGBs = l.bandwidthGBs;
          if (h.pcieGen > 0 || h.bandwidthGBs > 0) r.hops.push_back(h);
        }
      }
    }
    // The node entered next, unless it is the destination.
    if (i + 1 == p.links.size()) break;
    const Node& nb = t.node(b);
    if (nb.kind == NodeKind::HostBridge) r.hops.push_back(Hop::rootComplex());
    const int unit = switchUnit(t, b);
    if (unit >= 0 && unit != lastUnit) r.hops.push_back(Hop::pcieSwitch());
    lastUnit = unit;
  }
  return r;
}

Status gdrPlacementFor(const Topology& t, int gpu, int nic, GdrPlacement* out) {
  const int n = static_cast<int>(t.nodes().size());
  if (gpu < 0 || gpu >= n || t.node(gpu).kind != NodeKind::Gpu || nic < 0 || nic >= n ||
      t.node(nic).kind != NodeKind::Nic)
    return makeError(ridgeInvalidArgument, "GDR placement needs a GPU and a NIC (got node %d and %d)", gpu,
                     nic);
  GdrPlacement p;
  p.gpu = t.node(gpu).name;
  p.nic = t.node(nic).name;
  p.pathClass = placementOf(t.path(gpu, nic).smi);
  p.gpuToNic = routeBetween(t, gpu, nic, Completer::NicMemory);
  // Staging in host memory is on the NIC's NUMA node (else its package, else the machine).
  const Node& nn = t.node(nic);
  const int memory = nn.numa >= 0 ? nn.numa : nn.package >= 0 ? nn.package : t.root();
  p.gpuToHostMemory = routeBetween(t, gpu, memory, Completer::HostMemory);
  p.nicToHostMemory = routeBetween(t, nic, memory, Completer::HostMemory);
  p.nicStagingMemory = nn.nicDeviceMemory;
  p.nicRdma = nicHasRdma(nn);
  double gbps = 0;
  for (const NicPort& port : nn.ports) gbps = std::max(gbps, port.rateGbps);
  p.nicPortGBs = gbps / 8;  // Gb/s to GB/s, as NCCL counts (400G = 50)
  *out = std::move(p);
  return Status::ok();
}

}  // namespace ridge::topo
