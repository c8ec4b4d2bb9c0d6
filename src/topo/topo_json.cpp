#include "topo/topo_json.h"

#include <cmath>
#include <cstdlib>
#include <set>

#include "core/json.h"

namespace ridge::topo {

namespace {

constexpr NodeKind kNodeKinds[] = {
    NodeKind::Machine, NodeKind::Package, NodeKind::Numa,     NodeKind::HostBridge, NodeKind::PciBridge,
    NodeKind::Gpu,     NodeKind::Nic,     NodeKind::NvSwitch, NodeKind::Nvme,       NodeKind::PciDevice};
constexpr LinkKind kLinkKinds[] = {LinkKind::Internal, LinkKind::Pcie, LinkKind::Socket, LinkKind::NvLink,
                                   LinkKind::Net};

std::string hex(uint32_t v, int digits) {
  return format("0x%0*x", digits, v);
}

// ---- reading ---------------------------------------------------------------------------

// Reads the fields of one JSON object, reporting errors as "file:line: <context>: ..." and
// rejecting fields nobody asked for (done()).
class Fields {
 public:
  Fields(const json::Value& obj, const std::string& what, std::string context)
      : obj_(obj), what_(what), context_(std::move(context)) {}

  Status error(const json::Value& at, const std::string& msg) const {
    return makeError(ridgeInvalidArgument, "%s: %s%s", json::where(what_, at).c_str(),
                     context_.empty() ? "" : (context_ + ": ").c_str(), msg.c_str());
  }

  const json::Value* take(const char* key) {
    used_.insert(key);
    return obj_.get(key);
  }

  Status string(const char* key, std::string* out, bool required = false) {
    const json::Value* v = take(key);
    if (!v) return required ? error(obj_, format("missing \"%s\"", key)) : Status::ok();
    if (!v->isString()) return typeError(*v, key, "a string");
    *out = v->asString();
    return Status::ok();
  }

  Status number(const char* key, double* out, double lo, double hi) {
    const json::Value* v = take(key);
    if (!v) return Status::ok();
    if (!v->isNumber()) return typeError(*v, key, "a number");
    const double d = v->asNumber();
    if (!(d >= lo && d <= hi)) return error(*v, format("\"%s\" = %g is outside [%g, %g]", key, d, lo, hi));
    *out = d;
    return Status::ok();
  }

  template <typename Int>
  Status integer(const char* key, Int* out, long long lo, long long hi, bool required = false) {
    const json::Value* v = take(key);
    if (!v) return required ? error(obj_, format("missing \"%s\"", key)) : Status::ok();
    long long n = 0;
    if (v->isNumber()) {
      const double d = v->asNumber();
      if (d != std::floor(d) || std::fabs(d) > 9e15) return typeError(*v, key, "an integer");
      n = static_cast<long long>(d);
    } else if (v->isString()) {
      // PCI ids read best in hex: "0x10de".
      const std::string& s = v->asString();
      char* end = nullptr;
      n = std::strtoll(s.c_str(), &end, 0);
      if (s.empty() || *end != '\0') return typeError(*v, key, "an integer or a hex string like \"0x10de\"");
    } else {
      return typeError(*v, key, "an integer");
    }
    if (n < lo || n > hi) return error(*v, format("\"%s\" = %lld is outside [%lld, %lld]", key, n, lo, hi));
    *out = static_cast<Int>(n);
    return Status::ok();
  }

  Status boolean(const char* key, bool* out) {
    const json::Value* v = take(key);
    if (!v) return Status::ok();
    if (!v->isBool()) return typeError(*v, key, "true or false");
    *out = v->asBool();
    return Status::ok();
  }

  Status done() const {
    for (const json::Value::Member& m : obj_.members())
      if (!used_.count(m.first)) return error(m.second, format("unknown field \"%s\"", m.first.c_str()));
    return Status::ok();
  }

 private:
  Status typeError(const json::Value& v, const char* key, const char* expected) const {
    return error(v, format("\"%s\" must be %s, not %s", key, expected, json::typeName(v.type())));
  }

  const json::Value& obj_;
  const std::string& what_;
  std::string context_;
  std::set<std::string> used_;
};

template <typename Kind, size_t N, typename NameFn>
bool kindFromName(const std::string& name, const Kind (&kinds)[N], NameFn nameOf, Kind* out) {
  for (Kind k : kinds)
    if (name == nameOf(k)) return *out = k, true;
  return false;
}

std::string kindList(const char* (*nameOf)(NodeKind)) {
  std::string s;
  for (NodeKind k : kNodeKinds) s += (s.empty() ? "" : ", ") + std::string(nameOf(k));
  return s;
}

std::string kindList(const char* (*nameOf)(LinkKind)) {
  std::string s;
  for (LinkKind k : kLinkKinds) s += (s.empty() ? "" : ", ") + std::string(nameOf(k));
  return s;
}

Status readPort(const json::Value& v, const std::string& what, const std::string& context, NicPort* p) {
  Fields f(v, what, context);
  if (!v.isObject()) return f.error(v, "a port must be an object");
  RIDGE_TRY(f.string("name", &p->name));
  RIDGE_TRY(f.string("netdev", &p->netdev));
  RIDGE_TRY(f.string("state", &p->state));
  RIDGE_TRY(f.string("linkLayer", &p->linkLayer));
  RIDGE_TRY(f.number("rateGbps", &p->rateGbps, 0, 1e6));
  return f.done();
}

Status readStrings(Fields& f, const char* key, std::vector<std::string>* out) {
  const json::Value* v = f.take(key);
  if (!v) return Status::ok();
  if (!v->isArray()) return f.error(*v, format("\"%s\" must be an array of strings", key));
  for (const json::Value& e : v->items()) {
    if (!e.isString()) return f.error(e, format("\"%s\" must be an array of strings", key));
    out->push_back(e.asString());
  }
  return Status::ok();
}

Status readNode(const json::Value& v, size_t id, size_t count, const std::string& what, Node* n) {
  const std::string context = format("node %zu", id);
  Fields f(v, what, context);
  if (!v.isObject()) return f.error(v, "must be an object");
  const int maxId = static_cast<int>(count) - 1;
  int declaredId = static_cast<int>(id);
  RIDGE_TRY(f.integer("id", &declaredId, 0, 1LL << 40));
  if (declaredId != static_cast<int>(id))
    return f.error(*v.get("id"), format("\"id\" is %d but the node is at position %zu of \"nodes\" (ids are "
                                        "positions)",
                                        declaredId, id));
  std::string kind;
  RIDGE_TRY(f.string("kind", &kind, true));
  if (!kindFromName(kind, kNodeKinds, nodeKindName, &n->kind))
    return f.error(*v.get("kind"),
                   format("unknown kind \"%s\" (one of: %s)", kind.c_str(), kindList(nodeKindName).c_str()));
  RIDGE_TRY(f.string("name", &n->name));
  RIDGE_TRY(f.string("busId", &n->busId));
  RIDGE_TRY(f.integer("pciClass", &n->pciClass, 0, 0xffffff));
  RIDGE_TRY(f.integer("vendor", &n->vendor, 0, 0xffff));
  RIDGE_TRY(f.integer("device", &n->device, 0, 0xffff));
  RIDGE_TRY(f.integer("parent", &n->parent, -1, maxId));
  RIDGE_TRY(f.integer("index", &n->index, -1, 1 << 20));
  RIDGE_TRY(f.string("model", &n->model));
  RIDGE_TRY(f.string("cpus", &n->cpus));
  RIDGE_TRY(readStrings(f, "osNames", &n->osNames));
  RIDGE_TRY(f.integer("cudaIndex", &n->cudaIndex, -1, 1 << 20));
  RIDGE_TRY(f.integer("smVersion", &n->smVersion, 0, 1000));
  if (const json::Value* ports = f.take("ports")) {
    if (!ports->isArray()) return f.error(*ports, "\"ports\" must be an array");
    for (size_t i = 0; i < ports->items().size(); ++i) {
      n->ports.emplace_back();
      RIDGE_TRY(readPort(ports->items()[i], what, context + format(" port %zu", i), &n->ports.back()));
    }
  }
  RIDGE_TRY(f.boolean("nicDeviceMemory", &n->nicDeviceMemory));
  RIDGE_TRY(f.integer("pciSwitch", &n->pciSwitch, -1, maxId));
  return f.done();
}

Status readLink(const json::Value& v, size_t id, size_t nodeCount, const std::string& what, Link* l) {
  Fields f(v, what, format("link %zu", id));
  if (!v.isObject()) return f.error(v, "must be an object");
  std::string kind;
  RIDGE_TRY(f.string("kind", &kind, true));
  if (!kindFromName(kind, kLinkKinds, linkKindName, &l->kind))
    return f.error(*v.get("kind"),
                   format("unknown kind \"%s\" (one of: %s)", kind.c_str(), kindList(linkKindName).c_str()));
  const long long maxId = static_cast<long long>(nodeCount) - 1;
  RIDGE_TRY(f.integer("a", &l->a, 0, maxId, true));
  RIDGE_TRY(f.integer("b", &l->b, 0, maxId, true));
  RIDGE_TRY(f.number("bandwidthGBs", &l->bandwidthGBs, 0, 1e5));
  RIDGE_TRY(f.number("latencyNs", &l->latencyNs, 0, 1e9));
  RIDGE_TRY(f.integer("pcieGen", &l->pcieGen, 0, 8));
  RIDGE_TRY(f.integer("pcieWidth", &l->pcieWidth, 0, 32));
  RIDGE_TRY(f.integer("nvlinkCount", &l->nvlinkCount, 0, 1024));
  return f.done();
}

// ---- writing ---------------------------------------------------------------------------

json::Value nodeToJson(const Node& n, int id) {
  const Node defaults;
  json::Value o = json::Value::object();
  o.set("id", id);
  o.set("kind", nodeKindName(n.kind));
  if (!n.name.empty()) o.set("name", n.name);
  if (n.parent != defaults.parent) o.set("parent", n.parent);
  if (n.index != defaults.index) o.set("index", n.index);
  if (!n.busId.empty()) o.set("busId", n.busId);
  if (n.pciClass) o.set("pciClass", hex(n.pciClass, n.pciClass > 0xffff ? 6 : 4));
  if (n.vendor) o.set("vendor", hex(n.vendor, 4));
  if (n.device) o.set("device", hex(n.device, 4));
  if (!n.model.empty()) o.set("model", n.model);
  if (!n.cpus.empty()) o.set("cpus", n.cpus);
  if (!n.osNames.empty()) {
    json::Value& names = o.set("osNames", json::Value::array());
    for (const std::string& s : n.osNames) names.push(s);
  }
  if (n.cudaIndex != defaults.cudaIndex) o.set("cudaIndex", n.cudaIndex);
  if (n.smVersion != defaults.smVersion) o.set("smVersion", n.smVersion);
  if (!n.ports.empty()) {
    json::Value& ports = o.set("ports", json::Value::array());
    for (const NicPort& p : n.ports) {
      json::Value& pj = ports.push(json::Value::object());
      pj.set("name", p.name);
      if (!p.netdev.empty()) pj.set("netdev", p.netdev);
      if (!p.state.empty()) pj.set("state", p.state);
      if (!p.linkLayer.empty()) pj.set("linkLayer", p.linkLayer);
      if (p.rateGbps != 0) pj.set("rateGbps", p.rateGbps);
    }
  }
  if (n.nicDeviceMemory) o.set("nicDeviceMemory", true);
  if (n.pciSwitch != defaults.pciSwitch) o.set("pciSwitch", n.pciSwitch);
  return o;
}

json::Value linkToJson(const Link& l) {
  json::Value o = json::Value::object();
  o.set("kind", linkKindName(l.kind));
  o.set("a", l.a);
  o.set("b", l.b);
  if (l.bandwidthGBs != 0) o.set("bandwidthGBs", l.bandwidthGBs);
  if (l.latencyNs != 0) o.set("latencyNs", l.latencyNs);
  if (l.pcieGen) o.set("pcieGen", l.pcieGen);
  if (l.pcieWidth) o.set("pcieWidth", l.pcieWidth);
  if (l.nvlinkCount) o.set("nvlinkCount", l.nvlinkCount);
  return o;
}

}  // namespace

Status parseTopologyJson(const std::string& text, const std::string& what, Topology* out) {
  json::Value doc;
  RIDGE_TRY(json::parse(text, what, &doc));
  Fields top(doc, what, "");
  if (!doc.isObject()) return top.error(doc, "a Ridge topology must be a JSON object");
  std::string formatName;
  RIDGE_TRY(top.string("format", &formatName));
  if (!formatName.empty() && formatName != "ridge-topology")
    return top.error(*doc.get("format"),
                     format("\"format\" is \"%s\", expected \"ridge-topology\"", formatName.c_str()));
  int version = 0;
  RIDGE_TRY(top.integer("version", &version, 1, 1 << 20, true));
  if (version > kTopologyJsonVersion)
    return top.error(*doc.get("version"),
                     format("version %d is newer than this build reads (%d)", version, kTopologyJsonVersion));
  Topology t;
  RIDGE_TRY(top.string("name", &t.name));
  RIDGE_TRY(top.string("source", &t.source));
  const json::Value* nodes = top.take("nodes");
  if (!nodes || !nodes->isArray() || nodes->items().empty())
    return top.error(nodes ? *nodes : doc, "\"nodes\" must be a non-empty array");
  const json::Value* links = top.take("links");
  if (links && !links->isArray()) return top.error(*links, "\"links\" must be an array");
  RIDGE_TRY(top.done());

  const size_t count = nodes->items().size();
  for (size_t i = 0; i < count; ++i) {
    Node n;
    RIDGE_TRY(readNode(nodes->items()[i], i, count, what, &n));
    t.addNode(std::move(n));
  }
  if (links) {
    for (size_t i = 0; i < links->items().size(); ++i) {
      Link l;
      RIDGE_TRY(readLink(links->items()[i], i, count, what, &l));
      t.addLink(l);
    }
  }
  Status st = t.finalize();
  if (!st.isOk()) return Status(st.code(), what + ": " + st.message());
  *out = std::move(t);
  return Status::ok();
}

std::string topologyToJson(const Topology& t) {
  json::Value doc = json::Value::object();
  doc.set("format", "ridge-topology");
  doc.set("version", kTopologyJsonVersion);
  doc.set("name", t.name);
  doc.set("source", t.source);
  json::Value& nodes = doc.set("nodes", json::Value::array());
  for (size_t i = 0; i < t.nodes().size(); ++i) nodes.push(nodeToJson(t.nodes()[i], static_cast<int>(i)));
  json::Value& links = doc.set("links", json::Value::array());
  for (const Link& l : t.links()) links.push(linkToJson(l));
  return json::write(doc, 2) + "\n";
}

}  // namespace ridge::topo
