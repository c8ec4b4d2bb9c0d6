// The summaries only ridge-topo prints (summary.h): the one of a graph already loaded, and the
// human-readable text of any summary. Part of ridge_tooling, not libridge, which needs only the
// live summary and its compact form (summary.cpp) for the all-gather at init.
#include <string>

#include "core/status.h"
#include "topo/model.h"
#include "topo/pci.h"
#include "topo/summary.h"
#include "topo/sysfs.h"

namespace ridge {

namespace {

std::string countText(int n, const char* one, const char* many) {
  if (n < 0) return std::string("? ") + many;
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

}  // namespace

HostSummary summarizeTopology(const topo::Topology& t) {
  HostSummary s;
  s.packages = static_cast<int>(t.nodesOfKind(topo::NodeKind::Package).size());
  s.numaNodes = static_cast<int>(t.nodesOfKind(topo::NodeKind::Numa).size());
  s.cores = -1;
  s.pus = 0;
  for (int n : t.nodesOfKind(topo::NodeKind::Numa)) {
    if (t.node(n).cpus.empty()) {
      s.pus = -1;
      break;
    }
    s.pus += static_cast<int>(topo::parseCpuList(t.node(n).cpus).size());
  }
  auto describe = [&](int id) {
    const topo::Node& n = t.node(id);
    const int l = t.linkBetween(n.parent, id);
    const topo::Link* link = l >= 0 ? &t.link(l) : nullptr;
    const std::string linkText =
        link && link->pcieGen > 0 ? format("PCIe x%d Gen%d", link->pcieWidth, link->pcieGen) : std::string();
    return topo::describePciDevice(n.busId, n.vendor, n.device, "", n.model, n.osNames, linkText);
  };
  for (int g : t.gpus()) s.gpuNames.push_back(describe(g));
  for (int n : t.nics()) s.nicNames.push_back(describe(n));
  s.gpus = static_cast<int>(s.gpuNames.size());
  s.nics = static_cast<int>(s.nicNames.size());
  s.source = t.source;
  s.discoveryMs = t.loadMs;
  return s;
}

std::string formatSummary(const HostSummary& s) {
  std::string text = "host " + (s.hostname.empty() ? std::string("(unnamed)") : s.hostname) + ": " +
                     countText(s.packages, "package", "packages") + ", " +
                     countText(s.numaNodes, "NUMA node", "NUMA nodes") + ", " +
                     countText(s.cores, "core", "cores") + ", " + countText(s.pus, "PU", "PUs") + ", " +
                     countText(s.gpus, "GPU", "GPUs") + ", " + countText(s.nics, "NIC", "NICs");
  for (const auto& g : s.gpuNames) text += "\n  GPU " + g;
  for (const auto& n : s.nicNames) text += "\n  NIC " + n;
  text += format("\nsource: %s; discovered in %.1f ms", s.source.c_str(), s.discoveryMs);
  return text;
}

}  // namespace ridge
