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

}  // namespace

std::string nicName(const NodeTemplate& t, int slot) {
  if (slot < 0 || slot >= static_cast<int>(t.nics.size())) return "-";
  return t.topology->node(t.nics[static_cast<size_t>(slot)]).name;
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
