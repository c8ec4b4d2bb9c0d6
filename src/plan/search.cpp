// The ring search on one node type (docs/planner.md, "Rings").
//
// Resources are link directions (plus NIC ports and, for host ranks, each rank's copy
// rate). A channel reserves the same bandwidth, its speed, on every resource its edges
// load; a second channel sees only what the first left. For each speed of a ladder
// (derived from the capacities, highest first) the search finds as many channels as fit
// by depth-first search and keeps the speed with the largest total. Each DFS prefers
// edges that stay on one socket, then wider ones, then lower device indices, and may
// cross the socket link only as often as a ring over the devices' packages must.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

#include "plan/plan.h"
#include "topo/gdr_placement.h"

namespace ridge::plan {

using topo::LinkKind;
using topo::NodeKind;
using topo::Topology;

namespace {

constexpr double kUnlimited = std::numeric_limits<double>::infinity();
// Capacities are compared with a relative slack so that speeds derived by division
// (370.8 / 8) fit exactly 8 times despite rounding.
constexpr double kSlack = 1e-6;

// The bandwidth of a NIC port when neither the network description nor the NIC says:
// 200 Gb/s (HDR), the most common port of the machines in topology-facts.md.
constexpr double kDefaultNicGBs = 25.0;

// Host ranks copy through shared memory; one core streams about this much (GB/s, one
// direction). From the development host's memcpy rate behind bound% in docs/performance.md
// (two ranks copying at once: 31.1 GB/s of node traffic = 7.8 GB/s copied per rank).
constexpr double kHostCopyGBs = 8.0;

int resourceOf(const Topology& t, int link, int fromNode) {
  return 2 * link + (t.link(link).a == fromNode ? 0 : 1);
}

struct Builder {
  NodeTemplate& tp;
  const Topology& t;
  int k = 0;
  bool tcp = false;  // SearchOptions::tcp: receives land in host memory too

  double capOf(int res) const { return tp.resources.capacityGBs[static_cast<size_t>(res)]; }

  void finishRoute(Route* r) {
    r->bandwidthGBs = kUnlimited;
    for (const ResourceUse& u : r->uses)
      r->bandwidthGBs = std::min(r->bandwidthGBs, capOf(u.resource) / u.weight);
  }

  int intern(Route r) {
    finishRoute(&r);
    tp.routes.push_back(std::move(r));
    return static_cast<int>(tp.routes.size()) - 1;
  }

  // Resources along a tree/NVLink path from `p.nodes.front()` to `p.nodes.back()`.
  void addPathUses(const topo::Path& p, Route* r) {
    for (size_t i = 0; i < p.links.size(); ++i) {
      const int li = p.links[i];
      if (li < 0) continue;
      r->uses.push_back({resourceOf(t, li, p.nodes[i]), 1.0f});
      r->latencyNs += t.link(li).latencyNs;
      if (t.link(li).kind == LinkKind::Socket) ++r->socketCrossings;
    }
  }

  Route deviceRoute(int a, int b) {
    Route r;
    const int A = tp.devices[static_cast<size_t>(a)], B = tp.devices[static_cast<size_t>(b)];
    if (tp.hostRanks) {
      r.transport = Transport::HostShm;
      if (A != B) {
        topo::Path p = t.path(A, B);
        addPathUses(p, &r);
        r.nccl = p.nccl;
      }
      r.uses.push_back({tp.resources.deviceBase + 2 * a, 1.0f});
      r.uses.push_back({tp.resources.deviceBase + 2 * b + 1, 1.0f});
      return r;
    }
    topo::Path p = t.path(A, B);
    r.nccl = p.nccl;
    const bool viaSwitch = p.nccl == topo::NcclClass::NVL && p.nodes.size() == 3 &&
                           t.node(p.nodes[1]).kind == NodeKind::NvSwitch;
    if (viaSwitch) {
      // The GPUs reach each other through every NVSwitch both are wired to; traffic
      // spreads over them in proportion to their width.
      struct Leg {
        int up, down;
        double bw;
      };
      std::vector<Leg> legs;
      double total = 0;
      for (int li : t.node(A).links) {
        const topo::Link& l = t.link(li);
        const int s = l.other(A);
        if (l.kind != LinkKind::NvLink || t.node(s).kind != NodeKind::NvSwitch) continue;
        const int back = t.linkBetween(s, B);
        if (back < 0 || t.link(back).kind != LinkKind::NvLink) continue;
        const double bw = std::min(l.bandwidthGBs, t.link(back).bandwidthGBs);
        legs.push_back({li, back, bw});
        total += bw;
        r.latencyNs = l.latencyNs + t.link(back).latencyNs;
      }
      for (const Leg& g : legs) {
        const float w = total > 0 ? static_cast<float>(g.bw / total) : 1.0f / static_cast<float>(legs.size());
        r.uses.push_back({resourceOf(t, g.up, A), w});
        r.uses.push_back({resourceOf(t, g.down, t.link(g.up).other(A)), w});
      }
      r.transport = Transport::NvLink;
      return r;
    }
    addPathUses(p, &r);
    if (p.nccl == topo::NcclClass::NVL || p.nccl == topo::NcclClass::NVB)
      r.transport = Transport::NvLink;
    else if (p.nccl == topo::NcclClass::SYS)
      r.transport = Transport::HostShm;  // P2P across the socket link is slow or refused
    else
      r.transport = Transport::PcieP2p;
    return r;
  }

  // Device a to NIC slot s (send) or back (recv). Sends take the pair's mode (the GDR
  // advisor's, tp.nicModes) and load the pair's mode resource, whose capacity is that mode's
  // modeled bandwidth. Receives: the NIC writes GPU memory directly when GPU and NIC share a
  // PCIe switch (class PXB or better, as NCCL decides), else through host memory; over TCP
  // always through host memory.
  Route nicRoute(int a, int s, bool send) {
    Route r;
    const int A = tp.devices[static_cast<size_t>(a)], X = tp.nics[static_cast<size_t>(s)];
    topo::Path p = send ? t.path(A, X) : t.path(X, A);
    addPathUses(p, &r);
    r.nccl = p.nccl;
    r.transport = Transport::Net;
    const int nn = static_cast<int>(tp.nics.size());
    if (tp.hostRanks) {
      r.mode = NetMode::HostStaged;
    } else if (send) {
      const NicPairMode& m = tp.nicModes[static_cast<size_t>(a * nn + s)];
      r.mode = netModeOf(m.option);
      r.modeLatencyNs = m.latencyNs;
      r.uses.push_back({tp.resources.nicModeBase + a * nn + s, 1.0f});
    } else {
      r.mode = p.nccl <= topo::NcclClass::PXB && !tcp ? NetMode::GdrWrite : NetMode::HostStaged;
    }
    r.uses.push_back({tp.resources.nicPortBase + 2 * s + (send ? 0 : 1), 1.0f});
    if (tp.hostRanks) r.uses.push_back({tp.resources.deviceBase + 2 * a + (send ? 0 : 1), 1.0f});
    return r;
  }

  static NetMode netModeOf(topo::GdrOption o) {
    switch (o) {
      case topo::GdrOption::GdrRead: return NetMode::GdrRead;
      case topo::GdrOption::GdrWrite: return NetMode::GdrWrite;
      case topo::GdrOption::HostStaged: return NetMode::HostStaged;
    }
    return NetMode::HostStaged;
  }
};

// The mode of every GPU-NIC pair: the GDR advisor's choice from the PCIe model (the NIC port
// capped at the network description's rate, so that the advisor's figure and the plan's NIC
// agree), or the forced one with the model's figures for it.
std::vector<NicPairMode> nicPairModes(const Topology& t, const NodeTemplate& tp,
                                      const SearchOptions& options) {
  std::vector<NicPairMode> modes;
  for (int gpu : tp.devices)
    for (int nic : tp.nics) {
      NicPairMode m;
      topo::GdrPlacement placement;
      if (!topo::gdrPlacementFor(t, gpu, nic, &placement).isOk()) {
        m.why = "no PCIe route between GPU and NIC: host staged";
        m.bandwidthGBs = tp.nicGBs;
        modes.push_back(m);
        continue;
      }
      placement.nicPortGBs = tp.nicGBs;
      const topo::GdrAdvice advice = topo::adviseGdr(placement, options.pcieConstants);
      if (options.tcp) {
        m.option = topo::GdrOption::HostStaged;
        m.why = "TCP: sends leave from host memory";
      } else if (options.forcedGdrMode) {
        m.option = *options.forcedGdrMode;
        m.why = "forced by RIDGE_GDR_MODE";
      } else {
        m.option = advice.chosen;
        m.why = "GDR advisor (" + advice.decidedBy + "): " + advice.reason;
      }
      const topo::GdrOptionEstimate& e = advice.estimate(m.option);
      m.latencyNs = e.latencyNs.empty() ? 0 : e.latencyNs.front();
      m.bandwidthGBs = e.largeBandwidthGBs > 0 ? e.largeBandwidthGBs : tp.nicGBs;
      modes.push_back(std::move(m));
    }
  return modes;
}

std::string linkEndName(const Topology& t, int node) {
  const topo::Node& n = t.node(node);
  return n.name.empty() ? std::string(topo::nodeKindName(n.kind)) : n.name;
}

// ---- DFS -----------------------------------------------------------------------------

struct Search {
  Search(NodeTemplate& t, const SearchOptions& o, int devices) : tp(t), opt(o), k(devices) {}
  NodeTemplate& tp;
  const SearchOptions& opt;
  int k;
  std::vector<double> remaining;
  int64_t steps = 0;
  bool exhausted = false;
  int maxCrossings = 0;
  std::vector<char> used;
  std::vector<int> order;
  std::vector<int> hops;
  std::vector<int> entryCount;  // how many channels already enter at each device

  bool fits(int route, double speed) const {
    for (const ResourceUse& u : tp.routes[static_cast<size_t>(route)].uses) {
      const double need = speed * u.weight;
      const double have = remaining[static_cast<size_t>(u.resource)];
      if (have < need * (1 - kSlack) - 1e-12) return false;
    }
    return true;
  }
  void apply(int route, double speed, double sign) {
    for (const ResourceUse& u : tp.routes[static_cast<size_t>(route)].uses)
      remaining[static_cast<size_t>(u.resource)] -= sign * speed * u.weight;
  }

  // The exit from the last device to NIC slot s: direct when the NIC reads that GPU with
  // GPUDirect, else relayed over NVLink through the entry GPU (PXN), else whatever the
  // direct route is (host staged).
  int exitRoute(int last, int entry, int s) {
    const int direct = tp.nicSend[static_cast<size_t>(last * static_cast<int>(tp.nics.size()) + s)];
    const Route& d = tp.routes[static_cast<size_t>(direct)];
    if (d.mode == NetMode::GdrRead || tp.hostRanks || last == entry) return direct;
    const int relay = tp.pairRoute[static_cast<size_t>(last * k + entry)];
    const int entrySend = tp.nicSend[static_cast<size_t>(entry * static_cast<int>(tp.nics.size()) + s)];
    if (tp.routes[static_cast<size_t>(relay)].transport != Transport::NvLink ||
        tp.routes[static_cast<size_t>(entrySend)].mode != NetMode::GdrRead)
      return direct;
    auto key = static_cast<int64_t>((last * k + entry) * 64 + s);
    for (size_t i = 0; i < pxnKeys.size(); ++i)
      if (pxnKeys[i] == key) return pxnRoutes[i];
    Route r = tp.routes[static_cast<size_t>(relay)];
    const Route& tail = tp.routes[static_cast<size_t>(entrySend)];
    r.uses.insert(r.uses.end(), tail.uses.begin(), tail.uses.end());
    r.latencyNs += tail.latencyNs;
    r.modeLatencyNs = tail.modeLatencyNs;  // the NIC reads the relaying GPU in its pair's mode
    r.socketCrossings += tail.socketCrossings;
    r.transport = Transport::Net;
    r.mode = NetMode::Pxn;
    r.nccl = tail.nccl;
    r.bandwidthGBs = std::min(r.bandwidthGBs, tail.bandwidthGBs);
    tp.routes.push_back(std::move(r));
    pxnKeys.push_back(key);
    pxnRoutes.push_back(static_cast<int>(tp.routes.size()) - 1);
    return pxnRoutes.back();
  }
  std::vector<int64_t> pxnKeys;
  std::vector<int> pxnRoutes;

  bool dfs(int depth, double speed, int crossings, int nic, int entry, int* exitOut) {
    if (++steps > opt.stepBudget) {
      exhausted = true;
      return false;
    }
    const int cur = order[static_cast<size_t>(depth - 1)];
    if (depth == k) {
      int close;
      if (nic < 0) {
        if (k == 1) return true;
        close = tp.pairRoute[static_cast<size_t>(cur * k + entry)];
      } else {
        close = exitRoute(cur, entry, nic);
      }
      const Route& cr = tp.routes[static_cast<size_t>(close)];
      if (crossings + cr.socketCrossings > maxCrossings || !fits(close, speed)) return false;
      apply(close, speed, 1);
      *exitOut = close;
      return true;
    }
    // Candidates: stay on the socket first, then the widest edge, then device order.
    int cand[64];
    int n = 0;
    for (int v = 0; v < k && n < 64; ++v)
      if (!used[static_cast<size_t>(v)]) cand[n++] = v;
    std::sort(cand, cand + n, [&](int x, int y) {
      const Route& rx = tp.routes[static_cast<size_t>(tp.pairRoute[static_cast<size_t>(cur * k + x)])];
      const Route& ry = tp.routes[static_cast<size_t>(tp.pairRoute[static_cast<size_t>(cur * k + y)])];
      if (rx.socketCrossings != ry.socketCrossings) return rx.socketCrossings < ry.socketCrossings;
      if (rx.bandwidthGBs != ry.bandwidthGBs) return rx.bandwidthGBs > ry.bandwidthGBs;
      return x < y;
    });
    for (int i = 0; i < n; ++i) {
      const int v = cand[i];
      const int route = tp.pairRoute[static_cast<size_t>(cur * k + v)];
      const int c = crossings + tp.routes[static_cast<size_t>(route)].socketCrossings;
      if (c > maxCrossings || !fits(route, speed)) continue;
      apply(route, speed, 1);
      used[static_cast<size_t>(v)] = 1;
      order[static_cast<size_t>(depth)] = v;
      hops[static_cast<size_t>(depth - 1)] = route;
      if (dfs(depth + 1, speed, c, nic, entry, exitOut)) return true;
      used[static_cast<size_t>(v)] = 0;
      apply(route, speed, -1);
      if (exhausted) return false;
    }
    return false;
  }

  // Entry devices for NIC slot s, best first: GPUDirect-capable, widest route, fewest
  // channels already entering there, lowest index.
  std::vector<int> entriesFor(int s) const {
    std::vector<int> e(static_cast<size_t>(k));
    std::iota(e.begin(), e.end(), 0);
    auto quality = [&](int a) {
      const Route& r = tp.routes[static_cast<size_t>(tp.nicRecv[static_cast<size_t>(s * k + a)])];
      return r;
    };
    std::stable_sort(e.begin(), e.end(), [&](int x, int y) {
      const Route& rx = quality(x);
      const Route& ry = quality(y);
      if (rx.nccl != ry.nccl) return rx.nccl < ry.nccl;
      if (rx.bandwidthGBs != ry.bandwidthGBs) return rx.bandwidthGBs > ry.bandwidthGBs;
      return entryCount[static_cast<size_t>(x)] < entryCount[static_cast<size_t>(y)];
    });
    return e;
  }

  bool findChannel(double speed, int nic, ChannelTemplate* out) {
    std::vector<int> entries;
    if (nic < 0)
      entries = {0};
    else
      entries = entriesFor(nic);
    for (int entry : entries) {
      int entryRoute = -1;
      if (nic >= 0) {
        entryRoute = tp.nicRecv[static_cast<size_t>(nic * k + entry)];
        if (!fits(entryRoute, speed)) continue;
        apply(entryRoute, speed, 1);
      }
      std::fill(used.begin(), used.end(), 0);
      used[static_cast<size_t>(entry)] = 1;
      order[0] = entry;
      const int startCrossings =
          entryRoute >= 0 ? tp.routes[static_cast<size_t>(entryRoute)].socketCrossings : 0;
      int exit = -1;
      if (dfs(1, speed, startCrossings, nic, entry, &exit)) {
        out->order = order;
        out->hops.assign(hops.begin(), hops.begin() + (k - 1));
        out->nic = nic;
        out->entryRoute = entryRoute;
        out->exitRoute = nic >= 0 ? exit : -1;
        if (nic < 0 && k > 1) out->hops.push_back(exit);
        out->speedGBs = speed;
        int crossings = 0;
        for (int h : out->hops) crossings += tp.routes[static_cast<size_t>(h)].socketCrossings;
        if (entryRoute >= 0) crossings += tp.routes[static_cast<size_t>(entryRoute)].socketCrossings;
        if (out->exitRoute >= 0) crossings += tp.routes[static_cast<size_t>(out->exitRoute)].socketCrossings;
        out->socketCrossings = crossings;
        ++entryCount[static_cast<size_t>(entry)];
        return true;
      }
      if (entryRoute >= 0) apply(entryRoute, speed, -1);
      if (exhausted) return false;
    }
    return false;
  }
};

}  // namespace

std::string NodeTemplate::deviceName(int local) const {
  if (local < 0 || local >= localCount()) return "?";
  return topology->node(devices[static_cast<size_t>(local)]).name;
}

std::string routeText(const NodeTemplate& t, int route) {
  if (route < 0) return "";
  std::string s;
  for (const ResourceUse& u : t.routes[static_cast<size_t>(route)].uses) {
    if (!s.empty()) s += " + ";
    s += t.resources.names[static_cast<size_t>(u.resource)];
    if (u.weight < 0.999f) s += " x" + std::to_string(u.weight).substr(0, 4);
  }
  return s;
}

Status buildNodeTemplate(std::shared_ptr<const topo::Topology> topology, int ranksPerNode, bool multiNode,
                         const topo::NetworkDescription& network, const SearchOptions& options,
                         NodeTemplate* out) {
  const auto start = std::chrono::steady_clock::now();
  if (!topology || !topology->finalized())
    return makeError(ridgeInvalidArgument, "planner: the node topology is missing or not finalized");
  if (ranksPerNode < 1) return makeError(ridgeInvalidArgument, "planner: %d ranks per node", ranksPerNode);
  NodeTemplate tp;
  tp.topology = topology;
  tp.multiNode = multiNode;
  const Topology& t = *topology;
  const std::vector<int> gpus = t.gpus();
  if (!options.localGpus.empty()) {
    // The GPUs a communicator's ranks serve: one per local rank, each a GPU, none twice.
    if (static_cast<int>(options.localGpus.size()) != ranksPerNode)
      return makeError(ridgeInvalidArgument, "planner: %zu GPUs given for %d ranks per node",
                       options.localGpus.size(), ranksPerNode);
    for (size_t i = 0; i < options.localGpus.size(); ++i) {
      const int g = options.localGpus[i];
      if (std::find(gpus.begin(), gpus.end(), g) == gpus.end())
        return makeError(ridgeInvalidArgument,
                         "planner: local rank %zu's device (node %d) is not a GPU of %s", i, g,
                         t.name.c_str());
      if (std::find(options.localGpus.begin(), options.localGpus.begin() + static_cast<long>(i), g) !=
          options.localGpus.begin() + static_cast<long>(i))
        return makeError(ridgeInvalidArgument, "planner: local ranks share %s; one GPU per rank",
                         t.node(g).name.c_str());
    }
    tp.devices = options.localGpus;
  } else if (static_cast<int>(gpus.size()) >= ranksPerNode) {
    tp.devices.assign(gpus.begin(), gpus.begin() + ranksPerNode);
  } else {
    // Host ranks, spread block-wise over the NUMA nodes (as launchers bind them).
    tp.hostRanks = true;
    std::vector<int> places = t.nodesOfKind(NodeKind::Numa);
    if (places.empty()) places = t.nodesOfKind(NodeKind::Package);
    if (places.empty()) places = {t.root()};
    for (int i = 0; i < ranksPerNode; ++i)
      tp.devices.push_back(
          places[static_cast<size_t>(int64_t{i} * static_cast<int64_t>(places.size()) / ranksPerNode)]);
  }
  if (ranksPerNode > 64 && !tp.hostRanks)
    return makeError(ridgeInvalidArgument, "planner: %d GPUs per node; at most 64 supported", ranksPerNode);
  const int k = ranksPerNode;
  // Rails are the RDMA NICs; a 1 GbE management port next to them carries no collective.
  tp.nics = t.rdmaNicsOrAll();
  // NIC bandwidth: the network description, else the NIC's fastest port, else its PCIe link.
  for (size_t s = 0; s < tp.nics.size(); ++s)
    tp.nicRail.push_back(network.rails > 0 ? static_cast<int>(s) % network.rails : static_cast<int>(s));
  double nicGBs = network.nicGbps > 0 ? network.nicGbps / 8 : 0;
  if (nicGBs <= 0) {
    for (int x : tp.nics)
      for (const topo::NicPort& p : t.node(x).ports) nicGBs = std::max(nicGBs, p.rateGbps / 8);
  }
  if (nicGBs <= 0) nicGBs = kDefaultNicGBs;
  tp.nicGBs = nicGBs;
  if (multiNode && tp.nics.empty()) {
    // A node without NICs (a file that lists none): model one virtual NIC on the host
    // bridge side so that the plan still exists; it is host staged.
    tp.nics.clear();
  }

  // Resources.
  ResourceTable& rt = tp.resources;
  const int links = static_cast<int>(t.links().size());
  rt.linkResources = 2 * links;
  for (int li = 0; li < links; ++li) {
    const topo::Link& l = t.link(li);
    const double cap = l.bandwidthGBs > 0 ? l.bandwidthGBs : kUnlimited;
    for (int dir = 0; dir < 2; ++dir) {
      rt.capacityGBs.push_back(cap);
      const int from = dir == 0 ? l.a : l.b, to = dir == 0 ? l.b : l.a;
      rt.names.push_back(linkEndName(t, from) + "->" + linkEndName(t, to) + " " + topo::linkKindName(l.kind));
    }
  }
  rt.nicPortBase = static_cast<int>(rt.capacityGBs.size());
  for (size_t s = 0; s < tp.nics.size(); ++s) {
    const std::string n = linkEndName(t, tp.nics[s]);
    rt.capacityGBs.push_back(nicGBs);
    rt.names.push_back(n + " port out (rail " + std::to_string(tp.nicRail[s]) + ")");
    rt.capacityGBs.push_back(nicGBs);
    rt.names.push_back(n + " port in (rail " + std::to_string(tp.nicRail[s]) + ")");
  }
  if (tp.hostRanks) {
    rt.deviceBase = static_cast<int>(rt.capacityGBs.size());
    for (int a = 0; a < k; ++a) {
      rt.capacityGBs.push_back(kHostCopyGBs);
      rt.names.push_back("rank " + std::to_string(a) + " copy out");
      rt.capacityGBs.push_back(kHostCopyGBs);
      rt.names.push_back("rank " + std::to_string(a) + " copy in");
    }
  }
  if (multiNode && !tp.hostRanks && !tp.nics.empty()) {
    // One resource per GPU-NIC pair: what the pair's send mode moves (the PCIe model's
    // figure, e.g. root-complex P2P read forwarding for gdr-read past the root complex),
    // shared by every channel that sends from that GPU through that NIC.
    tp.nicModes = nicPairModes(t, tp, options);
    rt.nicModeBase = static_cast<int>(rt.capacityGBs.size());
    for (int a = 0; a < k; ++a)
      for (size_t s = 0; s < tp.nics.size(); ++s) {
        const NicPairMode& m = tp.nicModes[static_cast<size_t>(a) * tp.nics.size() + s];
        rt.capacityGBs.push_back(m.bandwidthGBs);
        rt.names.push_back(tp.deviceName(a) + "->" + linkEndName(t, tp.nics[s]) + " " +
                           topo::gdrOptionName(m.option) + " (PCIe model)");
      }
  }

  // Routes.
  Builder b{tp, t, k, options.tcp};
  tp.pairRoute.assign(static_cast<size_t>(k) * k, -1);
  for (int a = 0; a < k; ++a)
    for (int c = 0; c < k; ++c)
      if (a != c) tp.pairRoute[static_cast<size_t>(a * k + c)] = b.intern(b.deviceRoute(a, c));
  const int nn = static_cast<int>(tp.nics.size());
  tp.nicSend.assign(static_cast<size_t>(k) * nn, -1);
  tp.nicRecv.assign(static_cast<size_t>(k) * nn, -1);
  if (multiNode) {
    for (int a = 0; a < k; ++a)
      for (int s = 0; s < nn; ++s) {
        tp.nicSend[static_cast<size_t>(a * nn + s)] = b.intern(b.nicRoute(a, s, true));
        tp.nicRecv[static_cast<size_t>(s * k + a)] = b.intern(b.nicRoute(a, s, false));
      }
  }

  // The fewest socket crossings a ring can have: none on one package, else one per
  // package visited (in and out of each).
  std::vector<int> packages;
  for (int d : tp.devices) {
    const int p = t.node(d).kind == NodeKind::Package ? d : t.node(d).package;
    if (std::find(packages.begin(), packages.end(), p) == packages.end()) packages.push_back(p);
  }
  if (multiNode && nn > 0)
    for (int x : tp.nics)
      if (std::find(packages.begin(), packages.end(), t.node(x).package) == packages.end())
        packages.push_back(t.node(x).package);
  const int minCrossings = packages.size() > 1 ? static_cast<int>(packages.size()) : 0;

  // The speed ladder: the per-channel cap and every capacity (single resources and each
  // device's summed NVLink egress) divided by 1..maxChannels.
  const int maxCh = std::max(1, options.maxChannels);
  std::vector<double> caps;
  for (double c : rt.capacityGBs)
    if (std::isfinite(c) && c > 0) caps.push_back(c);
  for (int d : tp.devices) {
    double nv = 0;
    for (int li : t.node(d).links) {
      // GPU-to-GPU and GPU-to-NVSwitch lanes carry ring traffic; a GPU-CPU NVLink (POWER)
      // reaches host memory, not a peer.
      const topo::Link& l = t.link(li);
      const topo::NodeKind far = t.node(l.other(d)).kind;
      if (l.kind == LinkKind::NvLink && (far == topo::NodeKind::Gpu || far == topo::NodeKind::NvSwitch))
        nv += l.bandwidthGBs;
    }
    if (nv > 0) caps.push_back(nv);
  }
  std::vector<double> ladder = {options.maxChannelGBs};
  for (double c : caps)
    for (int m = 1; m <= maxCh; ++m)
      if (c / m <= options.maxChannelGBs) ladder.push_back(c / m);
  std::sort(ladder.begin(), ladder.end(), std::greater<>());
  ladder.erase(std::unique(ladder.begin(), ladder.end(),
                           [](double x, double y) { return std::abs(x - y) <= 1e-9 * std::max(x, y); }),
               ladder.end());

  Search srch(tp, options, k);
  srch.used.assign(static_cast<size_t>(k), 0);
  srch.order.assign(static_cast<size_t>(k), 0);
  srch.hops.assign(static_cast<size_t>(k), -1);
  std::vector<ChannelTemplate> best;
  double bestTotal = 0;
  const bool needNic = multiNode && nn > 0;
  // First with the fewest socket crossings; only when that finds nothing, with any.
  // Host ranks are placed block-wise by NUMA node already, so device order is the ring
  // that crosses each socket link twice; no search needed (and k may be large).
  for (int pass = tp.hostRanks ? 2 : 0; pass < 2 && best.empty() && !srch.exhausted; ++pass) {
    srch.maxCrossings = pass == 0 ? minCrossings : 4 * k + 8;
    for (double speed : ladder) {
      if (speed * maxCh <= bestTotal * (1 + 1e-9)) break;
      ++tp.stats.speedsTried;
      srch.remaining = rt.capacityGBs;
      srch.entryCount.assign(static_cast<size_t>(k), 0);
      std::vector<ChannelTemplate> found;
      while (static_cast<int>(found.size()) < maxCh) {
        ChannelTemplate ch;
        const int nic = needNic ? static_cast<int>(found.size()) % nn : -1;
        if (!srch.findChannel(speed, nic, &ch)) break;
        found.push_back(std::move(ch));
      }
      const double total = speed * static_cast<double>(found.size());
      if (total > bestTotal * (1 + 1e-6)) {
        bestTotal = total;
        best = std::move(found);
      }
      if (srch.exhausted) break;
    }
  }
  tp.stats.steps = srch.steps;
  tp.stats.budgetExhausted = srch.exhausted;
  if (best.empty()) {
    // Fallback: one channel in device (PCI) order at whatever its bottleneck is.
    tp.stats.fallback = !tp.hostRanks;
    ChannelTemplate ch;
    for (int a = 0; a < k; ++a) ch.order.push_back(a);
    double speed = kUnlimited;
    for (int a = 0; a + 1 < k; ++a) ch.hops.push_back(tp.pairRoute[static_cast<size_t>(a * k + a + 1)]);
    if (needNic) {
      ch.nic = 0;
      ch.entryRoute = tp.nicRecv[0];
      ch.exitRoute = tp.nicSend[static_cast<size_t>((k - 1) * nn)];
    } else if (k > 1) {
      ch.hops.push_back(tp.pairRoute[static_cast<size_t>((k - 1) * k)]);
    }
    auto bw = [&](int r) {
      if (r >= 0) speed = std::min(speed, tp.routes[static_cast<size_t>(r)].bandwidthGBs);
    };
    for (int h : ch.hops) bw(h);
    bw(ch.entryRoute);
    bw(ch.exitRoute);
    ch.speedGBs = std::isfinite(speed) ? std::min(speed, options.maxChannelGBs) : options.maxChannelGBs;
    for (int h : ch.hops) ch.socketCrossings += tp.routes[static_cast<size_t>(h)].socketCrossings;
    best.push_back(std::move(ch));
  }
  tp.channels = std::move(best);
  tp.stats.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  *out = std::move(tp);
  return Status::ok();
}

}  // namespace ridge::plan
