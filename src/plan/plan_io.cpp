#include "plan/plan_io.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "plan/algo_rules.h"

namespace ridge::plan {

namespace {

std::string fmt(double v, int decimals = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string nicName(const NodeTemplate& t, int slot) {
  if (slot < 0 || slot >= static_cast<int>(t.nics.size())) return "-";
  return t.topology->node(t.nics[static_cast<size_t>(slot)]).name;
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

json::Value intArray(const std::vector<int>& v) {
  json::Value a = json::Value::array();
  for (int x : v) a.push(json::Value(x));
  return a;
}

json::Value routeJson(const NodeTemplate& t, int route, const std::string& from, const std::string& to) {
  json::Value h = json::Value::object();
  const Route& r = t.routes[static_cast<size_t>(route)];
  h.set("from", from);
  h.set("to", to);
  h.set("transport", transportName(r.transport));
  if (r.mode != NetMode::None) h.set("mode", netModeName(r.mode));
  h.set("class", topo::ncclClassName(r.nccl));
  h.set("bandwidthGBs", std::isfinite(r.bandwidthGBs) ? json::Value(r.bandwidthGBs) : json::Value());
  json::Value links = json::Value::array();
  for (const ResourceUse& u : r.uses) {
    json::Value l = json::Value::object();
    l.set("resource", t.resources.names[static_cast<size_t>(u.resource)]);
    l.set("share", static_cast<double>(u.weight));
    links.push(std::move(l));
  }
  h.set("links", std::move(links));
  return h;
}

// The GPU-NIC pairs the plan sends through, in first-use order: each channel's exit (the
// relaying GPU for PXN), its tree head, and every rail.
std::vector<std::pair<int, int>> sendPairs(const Plan& p) {
  const NodeTemplate& t = *p.node;
  std::vector<std::pair<int, int>> pairs;
  if (t.nicModes.empty()) return pairs;
  auto add = [&](int device, int nic) {
    if (device < 0 || nic < 0) return;
    const std::pair<int, int> x{device, nic};
    if (std::find(pairs.begin(), pairs.end(), x) == pairs.end()) pairs.push_back(x);
  };
  for (const ChannelTemplate& ct : t.channels) {
    const bool relayed =
        ct.exitRoute >= 0 && t.routes[static_cast<size_t>(ct.exitRoute)].mode == NetMode::Pxn;
    add(relayed ? ct.order.front() : ct.order.back(), ct.nic);
    if (!p.trees.empty()) add(ct.order.front(), ct.nic);
  }
  for (const Channel& r : p.rails) add(r.templateChannel, r.nic);
  return pairs;
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

json::Value planJson(const Plan& p, const std::vector<Estimate>& algorithms, const PrintOptions& opt) {
  const NodeTemplate& t = *p.node;
  json::Value doc = json::Value::object();
  doc.set("format", "ridge-plan");
  doc.set("version", 1);
  doc.set("nranks", p.nranks);
  doc.set("nodes", p.nodes);
  doc.set("ranksPerNode", p.ranksPerNode);
  doc.set("source", p.source);
  doc.set("network", formatNetworkSpec(p.network, p.tcp));
  // No times here (buildMs, the search's ms): the same input gives the same bytes, so a
  // communicator's RIDGE_PLAN_DUMP can be compared with ridge-topo plan --json. The text
  // form and the communicator's log say how long planning took.
  json::Value node = json::Value::object();
  node.set("topology", t.topology->name);
  node.set("hostRanks", t.hostRanks);
  json::Value devices = json::Value::array();
  for (int i = 0; i < t.localCount(); ++i) devices.push(t.deviceName(i));
  node.set("devices", std::move(devices));
  json::Value nics = json::Value::array();
  for (size_t s = 0; s < t.nics.size(); ++s) nics.push(nicName(t, static_cast<int>(s)));
  node.set("nics", std::move(nics));
  node.set("nicGBs", t.nicGBs);
  json::Value search = json::Value::object();
  search.set("steps", static_cast<int64_t>(t.stats.steps));
  search.set("speedsTried", t.stats.speedsTried);
  search.set("budgetExhausted", t.stats.budgetExhausted);
  search.set("fallback", t.stats.fallback);
  node.set("search", std::move(search));
  json::Value chans = json::Value::array();
  for (const ChannelTemplate& ct : t.channels) {
    json::Value c = json::Value::object();
    json::Value order = json::Value::array();
    for (int d : ct.order) order.push(t.deviceName(d));
    c.set("order", std::move(order));
    c.set("nic", ct.nic >= 0 ? json::Value(nicName(t, ct.nic)) : json::Value());
    c.set("speedGBs", ct.speedGBs);
    c.set("socketCrossings", ct.socketCrossings);
    json::Value hops = json::Value::array();
    const size_t k = ct.order.size();
    for (size_t i = 0; i < ct.hops.size(); ++i)
      hops.push(routeJson(t, ct.hops[i], t.deviceName(ct.order[i]), t.deviceName(ct.order[(i + 1) % k])));
    c.set("hops", std::move(hops));
    if (ct.entryRoute >= 0)
      c.set("entry", routeJson(t, ct.entryRoute, nicName(t, ct.nic), t.deviceName(ct.order.front())));
    if (ct.exitRoute >= 0)
      c.set("exit", routeJson(t, ct.exitRoute, t.deviceName(ct.order.back()), nicName(t, ct.nic)));
    chans.push(std::move(c));
  }
  node.set("channels", std::move(chans));
  json::Value sends = json::Value::array();
  for (const auto& [device, nic] : sendPairs(p)) {
    const NicPairMode& m = t.nicModes[static_cast<size_t>(device) * t.nics.size() + static_cast<size_t>(nic)];
    json::Value x = json::Value::object();
    x.set("gpu", t.deviceName(device));
    x.set("nic", nicName(t, nic));
    x.set("mode", topo::gdrOptionName(m.option));
    x.set("bandwidthGBs", m.bandwidthGBs);
    x.set("latencyUs", m.latencyNs / 1000);
    x.set("why", m.why);
    sends.push(std::move(x));
  }
  node.set("networkSends", std::move(sends));
  doc.set("node", std::move(node));
  // Rank lists are written in full unless they would be huge and `full` is off.
  const bool ranksToo = opt.full || p.nranks <= 4096;
  json::Value channels = json::Value::array();
  auto add = [&](const Channel& ch, int index) {
    json::Value c = json::Value::object();
    c.set("kind", channelKindName(ch.kind));
    c.set("index", index);
    c.set("template", ch.templateChannel);
    if (ch.nic >= 0) c.set("nic", nicName(t, ch.nic));
    if (ch.kind == ChannelKind::Tree) {
      c.set("tree", ch.treeIndex);
      c.set("root", ch.root);
      c.set("depthNodes", ch.depthNodes);
      if (ranksToo) c.set("parent", intArray(ch.parent));
    } else if (ranksToo) {
      c.set("ranks", intArray(ch.ranks));
    }
    channels.push(std::move(c));
  };
  for (size_t i = 0; i < p.rings.size(); ++i) add(p.rings[i], static_cast<int>(i));
  for (size_t i = 0; i < p.trees.size(); ++i) add(p.trees[i], static_cast<int>(i));
  for (size_t i = 0; i < p.rails.size(); ++i) add(p.rails[i], static_cast<int>(i));
  doc.set("channels", std::move(channels));
  // What a communicator executes of this plan (docs/planner.md, "A communicator's plan"),
  // written into the plan so that a RIDGE_PLAN_DUMP says what ran.
  json::Value runs = json::Value::object();
  runs.set("ringChannel", 0);
  runs.set("by", kPlanRunsText);
  doc.set("runs", std::move(runs));
  if (!algorithms.empty()) {
    json::Value algos = json::Value::array();
    for (const Estimate& e : algorithms) {
      json::Value a = json::Value::object();
      a.set("collective", collName(e.coll));
      a.set("bytes", static_cast<uint64_t>(e.bytes));
      a.set("algo", algorithmName(e.algo));
      a.set("protocol", protocolName(e.proto));
      a.set("channels", e.channels);
      a.set("timeUs", e.timeUs);
      a.set("algbwGBs", e.algbwGBs);
      a.set("busbwGBs", e.busbwGBs);
      a.set("bottleneck", e.bottleneck);
      algos.push(std::move(a));
    }
    doc.set("algorithms", std::move(algos));
  }
  return doc;
}

std::string planJsonText(const Plan& plan, const PrintOptions& opt) {
  return json::write(planJson(plan, {}, opt)) + "\n";
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

Status parsePlanJson(const json::Value& doc, const std::string& what, int nranks, ForcedPlan* out) {
  ForcedPlan fp;
  if (!doc.isObject())
    return makeError(ridgeInvalidArgument, "%s: a plan file is a JSON object", what.c_str());
  // Format and version first: a file of another kind (a topology, another tool's plan) or of a
  // later format is refused by name rather than half understood.
  const json::Value* format = doc.get("format");
  if (!format || !format->isString() || format->asString() != kPlanFormat)
    return makeError(ridgeInvalidArgument, "%s: not a Ridge plan: \"format\" must be \"%s\"%s",
                     format ? json::where(what, *format).c_str() : what.c_str(), kPlanFormat,
                     !format              ? " (missing)"
                     : format->isString() ? (", not \"" + format->asString() + "\"").c_str()
                                          : "");
  const json::Value* version = doc.get("version");
  if (!version || !version->isNumber() || version->asNumber() != kPlanVersion)
    return makeError(ridgeInvalidArgument,
                     "%s: plan format version %s is not supported; this Ridge reads version %d",
                     version ? json::where(what, *version).c_str() : what.c_str(),
                     !version              ? "(missing)"
                     : version->isNumber() ? json::write(*version).c_str()
                                           : "(not a number)",
                     kPlanVersion);
  if (const json::Value* n = doc.get("nranks"); n && (!n->isNumber() || n->asNumber() != nranks))
    return makeError(ridgeInvalidArgument, "%s: the plan is for %g ranks, this communicator has %d",
                     json::where(what, *n).c_str(), n->asNumber(), nranks);
  if (const json::Value* rules = doc.get("algoRules")) {
    if (!rules->isString())
      return makeError(ridgeInvalidArgument, "%s: 'algoRules' must be a string",
                       json::where(what, *rules).c_str());
    std::vector<AlgoRule> parsed;
    std::string bad;
    if (!parseAlgoRules(rules->asString(), &parsed, &bad))
      return makeError(ridgeInvalidArgument, "%s: malformed 'algoRules' entries: %s (RIDGE_ALGO syntax)",
                       json::where(what, *rules).c_str(), bad.c_str());
    fp.algoRules = rules->asString();
  }
  const json::Value* channels = doc.get("channels");
  if (!channels || !channels->isArray())
    return makeError(ridgeInvalidArgument, "%s: 'channels' must be an array with a ring channel",
                     channels ? json::where(what, *channels).c_str() : what.c_str());
  for (const json::Value& c : channels->items()) {
    const json::Value* kind = c.isObject() ? c.get("kind") : nullptr;
    if (!kind || !kind->isString())
      return makeError(ridgeInvalidArgument, "%s: every channel needs a 'kind' (ring, tree or rail)",
                       json::where(what, c).c_str());
    if (kind->asString() != "ring") continue;
    const json::Value* ranks = c.get("ranks");
    if (!ranks || !ranks->isArray())
      return makeError(ridgeInvalidArgument, "%s: a ring channel needs 'ranks'",
                       json::where(what, c).c_str());
    std::vector<int> order;
    std::vector<char> seen(static_cast<size_t>(nranks), 0);
    for (const json::Value& r : ranks->items()) {
      const double v = r.isNumber() ? r.asNumber() : -1;
      if (v < 0 || v >= nranks || v != static_cast<int>(v))
        return makeError(ridgeInvalidArgument, "%s: ring ranks must be ranks of this communicator, 0 to %d",
                         json::where(what, r).c_str(), nranks - 1);
      if (seen[static_cast<size_t>(v)])
        return makeError(ridgeInvalidArgument,
                         "%s: rank %d appears twice in a ring; a ring lists every rank once",
                         json::where(what, r).c_str(), static_cast<int>(v));
      seen[static_cast<size_t>(v)] = 1;
      order.push_back(static_cast<int>(v));
    }
    if (static_cast<int>(order.size()) != nranks) {
      int missing = 0;
      while (missing < nranks && seen[static_cast<size_t>(missing)]) ++missing;
      return makeError(ridgeInvalidArgument, "%s: ring has %zu ranks, expected all %d (rank %d is missing)",
                       json::where(what, *ranks).c_str(), order.size(), nranks, missing);
    }
    fp.rings.push_back(std::move(order));
  }
  if (fp.rings.empty())
    return makeError(ridgeInvalidArgument,
                     "%s: no ring channel (a channel of kind \"ring\" listing every rank once)",
                     json::where(what, *channels).c_str());
  *out = std::move(fp);
  return Status::ok();
}

Status readPlanFile(const std::string& path, int nranks, ForcedPlan* out) {
  json::Value doc;
  RIDGE_TRY(json::parseFile(path, &doc));
  return parsePlanJson(doc, path, nranks, out);
}

Status writeTextFile(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return makeError(ridgeSystemError, "cannot write %s: %s", path.c_str(), std::strerror(errno));
  const size_t n = std::fwrite(text.data(), 1, text.size(), f);
  const bool ok = n == text.size() && std::fclose(f) == 0;
  if (!ok) return makeError(ridgeSystemError, "writing %s failed", path.c_str());
  return Status::ok();
}

}  // namespace ridge::plan
