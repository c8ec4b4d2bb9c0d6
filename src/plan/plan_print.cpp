// The plan printers only ridge-topo uses (plan_io.h): planText and planDot. Part of
// ridge_tooling, not libridge; planJson (RIDGE_PLAN_DUMP) stays in plan_io.cpp.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "plan/plan_io.h"

namespace ridge::plan {

namespace {

std::string fmt(double v, int decimals = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// "NIC0 =[gdr-write]=> GPU0 -nvlink-> GPU1 ... GPU7 =[pxn]=> NIC0"
std::string templateLine(const NodeTemplate& t, const ChannelTemplate& ct) {
  std::string s;
  if (ct.entryRoute >= 0)
    s += nicName(t, ct.nic) + " =[" + netModeName(t.routes[static_cast<size_t>(ct.entryRoute)].mode) + "]=> ";
  for (size_t i = 0; i < ct.order.size(); ++i) {
    s += t.deviceName(ct.order[i]);
    if (i < ct.hops.size() && (i + 1 < ct.order.size() || ct.entryRoute < 0))
      s += std::string(" -") + transportName(t.routes[static_cast<size_t>(ct.hops[i])].transport) + "-> ";
  }
  if (ct.entryRoute < 0 && ct.order.size() > 1) s += t.deviceName(ct.order.front());
  if (ct.exitRoute >= 0)
    s += " =[" + std::string(netModeName(t.routes[static_cast<size_t>(ct.exitRoute)].mode)) + "]=> " +
         nicName(t, ct.nic);
  return s;
}
std::string rankList(const std::vector<int>& ranks, const PrintOptions& opt) {
  std::string s;
  const size_t n = opt.full ? ranks.size() : std::min(ranks.size(), static_cast<size_t>(opt.maxListedRanks));
  for (size_t i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += std::to_string(ranks[i]);
  }
  if (n < ranks.size()) s += " ... (" + std::to_string(ranks.size()) + " ranks)";
  return s;
}
}  // namespace

std::string planText(const Plan& p, const PrintOptions& opt) {
  const NodeTemplate& t = *p.node;
  std::ostringstream o;
  o << "plan: " << p.nranks << " ranks = " << p.nodes << " node" << (p.nodes > 1 ? "s" : "") << " x "
    << p.ranksPerNode << " " << (t.hostRanks ? "host ranks" : "GPUs") << " of '" << t.topology->name << "'";
  if (p.nodes > 1)
    o << ", network " << formatNetworkSpec(p.network, p.tcp) << " (NIC " << fmt(t.nicGBs) << " GB/s)";
  o << "\n";
  double total = 0;
  for (const ChannelTemplate& ct : t.channels) total += ct.speedGBs;
  o << "search: " << t.channels.size() << " ring channel" << (t.channels.size() == 1 ? "" : "s") << ", "
    << fmt(total) << " GB/s per rank in all; " << t.stats.steps << " steps over " << t.stats.speedsTried
    << " speeds in " << fmt(t.stats.ms, 3) << " ms"
    << (t.stats.budgetExhausted ? " (step budget exhausted)" : "")
    << (t.stats.fallback ? " (fallback: one channel in device order)" : "") << "; plan built in "
    << fmt(p.buildMs, 3) << " ms\n";
  o << "node template (the same on every node):\n";
  for (size_t c = 0; c < t.channels.size(); ++c) {
    const ChannelTemplate& ct = t.channels[c];
    o << "  channel " << c << ": " << fmt(ct.speedGBs) << " GB/s, socket crossings " << ct.socketCrossings;
    if (ct.nic >= 0) o << ", " << nicName(t, ct.nic) << " rail " << t.nicRail[static_cast<size_t>(ct.nic)];
    o << "\n    " << templateLine(t, ct) << "\n";
    if (opt.full) {
      for (size_t i = 0; i < ct.hops.size(); ++i)
        o << "      hop " << t.deviceName(ct.order[i]) << " -> "
          << t.deviceName(ct.order[(i + 1) % ct.order.size()]) << ": " << routeText(t, ct.hops[i]) << "\n";
      if (ct.entryRoute >= 0) o << "      entry: " << routeText(t, ct.entryRoute) << "\n";
      if (ct.exitRoute >= 0) o << "      exit: " << routeText(t, ct.exitRoute) << "\n";
    }
  }
  const std::vector<std::pair<int, int>> pairs = sendPairs(p);
  if (!pairs.empty()) o << "network sends (mode per GPU-NIC pair, modeled by the PCIe model):\n";
  for (const auto& [device, nic] : pairs) {
    const NicPairMode& m = t.nicModes[static_cast<size_t>(device) * t.nics.size() + static_cast<size_t>(nic)];
    o << "  " << t.deviceName(device) << " -> " << nicName(t, nic) << ": " << topo::gdrOptionName(m.option)
      << ", " << fmt(m.bandwidthGBs) << " GB/s, " << fmt(m.latencyNs / 1000, 2) << " us; " << m.why << "\n";
  }
  o << "rings:\n";
  for (size_t c = 0; c < p.rings.size(); ++c)
    o << "  ring " << c << ": " << rankList(p.rings[c].ranks, opt) << "\n";
  if (!p.trees.empty()) {
    o << "trees: " << (p.nodes > 1 ? "double binary tree over nodes (tree 1 = " : "one chain per channel")
      << (p.nodes > 1 ? (p.nodes % 2 == 0 ? "mirror of tree 0)" : "tree 0 shifted by one)") : "")
      << ", depth " << p.trees.front().depthNodes << " + chain of " << p.ranksPerNode - 1 << "\n";
    for (size_t c = 0; c < p.trees.size(); ++c) {
      const Channel& tc = p.trees[c];
      o << "  tree " << c << " (channel " << tc.templateChannel << ", tree " << tc.treeIndex << "): root "
        << tc.root;
      if (p.nodes > 1) {
        o << ", node parents:";
        const int head = t.channels[static_cast<size_t>(tc.templateChannel)].order.front();
        const int shown = opt.full ? p.nodes : std::min(p.nodes, 16);
        for (int n = 0; n < shown; ++n) {
          const int par = tc.parent[static_cast<size_t>(n * p.ranksPerNode + head)];
          o << " " << n << "<-" << (par < 0 ? std::string("root") : std::to_string(p.nodeOf(par)));
        }
        if (shown < p.nodes) o << " ...";
      }
      o << "\n";
    }
  }
  if (!p.rails.empty()) {
    o << "rails (hierarchical allreduce: intra-node reduce-scatter, inter-node allreduce per rail, "
         "intra-node allgather):\n ";
    for (const Channel& r : p.rails) o << " " << t.deviceName(r.templateChannel) << "->" << nicName(t, r.nic);
    o << "\n";
  }
  return o.str();
}
// One row per ring channel, read left to right: the ring's ranks in order from rank 0 (rank
// 0 again at the end, dashed, instead of an arc back across the row), filled by node,
// intra-node hops thin and unlabelled unless not NVLink, network hops bold with the NIC and
// the send/receive modes. Ranks past `maxNodes` nodes fold into one "..." box per stretch.
// An all-edges graph (every ring over the same rank boxes) is unreadable past a few
// channels: at 16 ranks x 8 channels it has 128 crossing labelled arcs.
std::string planDot(const Plan& p, int maxNodes) {
  const NodeTemplate& t = *p.node;
  static const char* const kColors[] = {"red",    "blue",  "darkgreen", "orange",
                                        "purple", "brown", "magenta",   "cyan"};
  static const char* const kNodeFills[] = {"#dbe9f6", "#fdf0d5", "#e2f0d9", "#f3e0ef"};
  const int shownRanks = std::min(p.nodes, std::max(1, maxNodes)) * p.ranksPerNode;
  std::ostringstream o;
  o << "digraph plan {\n  rankdir=LR;\n  newrank=true;\n  nodesep=0.12;\n  ranksep=0.28;\n"
    << "  node [shape=box, style=filled, fontname=\"Helvetica\", fontsize=10, height=0.3, "
       "margin=\"0.05,0.02\"];\n"
    << "  edge [fontname=\"Helvetica\", fontsize=9, arrowsize=0.6];\n"
    << "  labelloc=t;\n  label=\"" << p.nranks << " ranks = " << p.nodes << " nodes x " << p.ranksPerNode
    << ", " << p.rings.size()
    << " ring channels; one row per channel from rank 0; fill = node; bold = network"
    << (shownRanks < p.nranks
            ? "; ranks past node " + std::to_string(shownRanks / p.ranksPerNode - 1) + " folded"
            : std::string())
    << "\";\n";
  // Emitted last to first: Graphviz stacks the rows of a left-to-right graph bottom up.
  for (size_t c = p.rings.size(); c-- > 0;) {
    // The ring's order, following its edges from rank 0.
    std::vector<int> next(static_cast<size_t>(p.nranks), -1);
    std::vector<const Edge*> edgeFrom(static_cast<size_t>(p.nranks), nullptr);
    for (const Edge& e : p.rings[c].edges)
      if (e.from >= 0 && e.from < p.nranks) {
        next[static_cast<size_t>(e.from)] = e.to;
        edgeFrom[static_cast<size_t>(e.from)] = &e;
      }
    const char* colour = kColors[c % 8];
    const ChannelTemplate* ct =
        p.rings[c].templateChannel >= 0 && static_cast<size_t>(p.rings[c].templateChannel) < t.channels.size()
            ? &t.channels[static_cast<size_t>(p.rings[c].templateChannel)]
            : nullptr;
    o << "  subgraph cluster_c" << c << " {\n    label=\"channel " << c;
    if (ct) o << ", " << std::round(ct->speedGBs * 100) / 100 << " GB/s";
    o << "\";\n    labeljust=l;\n    color=" << colour << ";\n";
    std::string prev;
    const Edge* prevEdge = nullptr;
    int folded = 0, foldedFirstNode = -1, foldId = 0;
    auto box = [&](const std::string& id) {
      if (!prev.empty()) {
        o << "    " << prev << " -> " << id;
        if (prevEdge && prevEdge->transport == Transport::Net) {
          o << " [color=" << colour << ", penwidth=2.2, label=\"" << nicName(t, prevEdge->nic) << "\\n"
            << netModeName(prevEdge->sendMode) << "/" << netModeName(prevEdge->recvMode) << "\"]";
        } else if (prevEdge && prevEdge->transport != Transport::NvLink) {
          o << " [label=\"" << transportName(prevEdge->transport) << "\"]";
        }
        o << ";\n";
      }
      prev = id;
    };
    auto flushFold = [&](int lastNode) {
      if (folded == 0) return;
      const std::string id = "c" + std::to_string(c) + "_fold" + std::to_string(foldId++);
      o << "    " << id << " [label=\"... " << folded << " ranks\\nnodes " << foldedFirstNode << "-"
        << lastNode << "\", style=dashed];\n";
      box(id);
      folded = 0;
    };
    int r = 0, lastFoldedNode = -1;
    for (int step = 0; step < p.nranks && r >= 0; ++step) {
      const Edge* out = edgeFrom[static_cast<size_t>(r)];
      if (r >= shownRanks) {
        if (folded++ == 0) foldedFirstNode = p.nodeOf(r);
        lastFoldedNode = p.nodeOf(r);
      } else {
        flushFold(lastFoldedNode);
        const std::string id = "c" + std::to_string(c) + "_r" + std::to_string(r);
        o << "    " << id << " [label=\"r" << r << "\\n"
          << t.deviceName(p.localOf(r)) << "\", fillcolor=\"" << kNodeFills[p.nodeOf(r) % 4] << "\"];\n";
        box(id);
      }
      prevEdge = out;
      r = next[static_cast<size_t>(r)];
      if (r == 0) break;
    }
    flushFold(lastFoldedNode);
    const std::string back = "c" + std::to_string(c) + "_back";
    o << "    " << back << " [label=\"r0\", style=dashed];\n";
    box(back);
    o << "  }\n";
  }
  o << "}\n";
  return o.str();
}
}  // namespace ridge::plan
