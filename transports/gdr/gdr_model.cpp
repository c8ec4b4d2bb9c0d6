#include "transports/gdr/gdr_model.h"

#include <algorithm>

#include "topo/load.h"
#include "topo/presets.h"

namespace ridge::gdr {

const char* modeName(Mode m) {
  switch (m) {
    case Mode::Read: return "gdr-read";
    case Mode::Write: return "gdr-write";
    case Mode::Staged: return "host-staged";
  }
  return "?";
}

bool parseMode(const std::string& text, Mode* out) {
  topo::GdrModeSetting m;
  if (!topo::parseGdrModeSetting(text, &m) || m.kind != topo::GdrModeSetting::Kind::Forced) return false;
  *out = fromGdrOption(m.forced);
  return true;
}

Mode fromGdrOption(topo::GdrOption o) {
  switch (o) {
    case topo::GdrOption::GdrRead: return Mode::Read;
    case topo::GdrOption::GdrWrite: return Mode::Write;
    case topo::GdrOption::HostStaged: return Mode::Staged;
  }
  return Mode::Staged;
}

topo::GdrOption toGdrOption(Mode m) {
  switch (m) {
    case Mode::Read: return topo::GdrOption::GdrRead;
    case Mode::Write: return topo::GdrOption::GdrWrite;
    case Mode::Staged: return topo::GdrOption::HostStaged;
  }
  return topo::GdrOption::HostStaged;
}

namespace {

using topo::Hop;
using topo::NodeKind;

bool isPciFunction(NodeKind k) {
  return k == NodeKind::PciBridge || k == NodeKind::Gpu || k == NodeKind::Nic || k == NodeKind::PciDevice ||
         k == NodeKind::Nvme || k == NodeKind::NvSwitch;
}

// The hops of the graph path a -> b in the PCIe model's terms: a PCIe link between two PCI
// functions (not the internal link of one switch), a root complex per host bridge passed, a
// switch per switch unit passed, the socket link. Links that only express containment
// (NUMA node, package) cost nothing here, as in the advisor's hand-built routes.
std::vector<Hop> hopsOf(const topo::Topology& t, int a, int b) {
  std::vector<Hop> hops;
  const topo::Path p = t.path(a, b);
  int lastSwitch = -1;
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const topo::Node& n = t.node(p.nodes[i]);
    if (i > 0 && i + 1 < p.nodes.size()) {
      if (n.kind == NodeKind::HostBridge) {
        hops.push_back(Hop::rootComplex());
      } else if (n.kind == NodeKind::PciBridge && n.pciSwitch >= 0 && n.parent >= 0 &&
                 t.node(n.parent).kind != NodeKind::HostBridge && n.pciSwitch != lastSwitch) {
        hops.push_back(Hop::pcieSwitch());
        lastSwitch = n.pciSwitch;
      }
    }
    if (i + 1 >= p.nodes.size()) break;
    const topo::Link& l = t.link(p.links[i]);
    const topo::Node& m = t.node(p.nodes[i + 1]);
    if (l.kind == topo::LinkKind::Socket) {
      hops.push_back(Hop::socketLink(l.bandwidthGBs, l.latencyNs > 0 ? l.latencyNs : -1));
    } else if (l.kind == topo::LinkKind::Pcie && isPciFunction(n.kind) && isPciFunction(m.kind)) {
      const bool sameSwitch = n.kind == NodeKind::PciBridge && m.kind == NodeKind::PciBridge &&
                              n.pciSwitch >= 0 && n.pciSwitch == m.pciSwitch;
      if (sameSwitch) continue;
      Hop h = Hop::link(l.pcieGen, l.pcieWidth);
      if (l.pcieGen == 0) h.bandwidthGBs = l.bandwidthGBs;
      hops.push_back(h);
    }
  }
  return hops;
}

}  // namespace

topo::GdrPlacement placementFromTopology(const topo::Topology& t, int gpuNode, int nicNode) {
  topo::GdrPlacement p;
  const topo::Node& gpu = t.node(gpuNode);
  const topo::Node& nic = t.node(nicNode);
  p.gpu = gpu.name;
  p.nic = nic.name;
  p.gpuToNic.hops = hopsOf(t, gpuNode, nicNode);
  p.gpuToNic.completer = topo::Completer::NicMemory;
  const int nicNuma = nic.numa >= 0 ? nic.numa : t.root();
  p.gpuToHostMemory.hops = hopsOf(t, gpuNode, nicNuma);
  p.gpuToHostMemory.completer = topo::Completer::HostMemory;
  p.nicToHostMemory.hops = hopsOf(t, nicNode, nicNuma);
  p.nicToHostMemory.completer = topo::Completer::HostMemory;
  p.nicStagingMemory = nic.nicDeviceMemory;
  double gbps = 0;
  for (const topo::NicPort& port : nic.ports) gbps = std::max(gbps, port.rateGbps);
  p.nicPortGBs = gbps / 8;
  return p;
}

std::string ModelView::describe() const {
  return source + ": " + topo::gdrAdviceText(advice);
}

Status loadModel(const std::string& spec, const std::string& pair, ModelView* out) {
  topo::Topology t;
  bool isPreset = false;
  for (const std::string& n : topo::presetNames()) isPreset = isPreset || n == spec;
  if (isPreset) {
    RIDGE_TRY(topo::loadPreset(spec, &t));
  } else {
    RIDGE_TRY(topo::loadTopologyFile(spec, &t));
  }
  int gpu = -1, nic = -1;
  if (!pair.empty()) {
    const size_t comma = pair.find(',');
    if (comma == std::string::npos)
      return makeError(ridgeInvalidArgument, "RIDGE_GDR_PAIR='%s': expected GPU,NIC", pair.c_str());
    gpu = t.find(pair.substr(0, comma));
    nic = t.find(pair.substr(comma + 1));
  } else {
    if (!t.gpus().empty()) gpu = t.gpus().front();
    if (!t.nics().empty()) nic = t.nics().front();
  }
  if (gpu < 0 || nic < 0 || t.node(gpu).kind != topo::NodeKind::Gpu ||
      t.node(nic).kind != topo::NodeKind::Nic)
    return makeError(ridgeInvalidArgument, "%s: no GPU-NIC pair '%s' (RIDGE_GDR_PAIR)", spec.c_str(),
                     pair.empty() ? "first GPU, first NIC" : pair.c_str());
  const topo::PcieConstants constants{};
  out->source = t.source;
  out->advice = topo::adviseGdr(placementFromTopology(t, gpu, nic), constants);
  for (int m = 0; m < kModeCount; ++m) {
    const topo::GdrOptionEstimate& e = out->advice.estimate(toGdrOption(static_cast<Mode>(m)));
    out->timing[m].latencyNs = e.latencyNs.empty() ? 0 : e.latencyNs.front();
    out->timing[m].bandwidthGBs = e.possible ? e.steadyBandwidthGBs : 0;
  }
  return Status::ok();
}

}  // namespace ridge::gdr
