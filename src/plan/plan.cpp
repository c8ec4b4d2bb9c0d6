// Plans across nodes: the node template replicated into rings, the double binary trees,
// the rails of the hierarchical algorithms, and the network description's syntax.
#include "plan/plan.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "core/settings.h"

namespace ridge::plan {

const char* transportName(Transport t) {
  switch (t) {
    case Transport::NvLink: return "nvlink";
    case Transport::PcieP2p: return "pcie-p2p";
    case Transport::HostShm: return "shm";
    case Transport::Net: return "net";
    case Transport::Tcp: return "tcp";
  }
  return "?";
}

const char* netModeName(NetMode m) {
  switch (m) {
    case NetMode::None: return "none";
    case NetMode::GdrRead: return "gdr-read";
    case NetMode::GdrWrite: return "gdr-write";
    case NetMode::HostStaged: return "host-staged";
    case NetMode::Pxn: return "pxn";
  }
  return "?";
}

const char* channelKindName(ChannelKind k) {
  switch (k) {
    case ChannelKind::Ring: return "ring";
    case ChannelKind::Tree: return "tree";
    case ChannelKind::Rail: return "rail";
  }
  return "?";
}

Status gdrModeFromSettings(std::optional<topo::GdrOption>* out) {
  topo::GdrModeSetting m;
  RIDGE_TRY(topo::readGdrModeSetting(&m));
  out->reset();
  if (m.kind == topo::GdrModeSetting::Kind::Forced) *out = m.forced;
  return Status::ok();
}

// ---- trees ------------------------------------------------------------------------------

// In-order binary tree over 1-based labels 1..count: the root of a range is the label with
// the most trailing zero bits, so odd labels (even 0-based indices) are always leaves. That
// is what makes the double tree work: the second tree maps leaves onto interior positions.
static int buildRange(int lo, int hi, int parentLabel, std::vector<int>* parent, int depth, int* maxDepth) {
  if (lo > hi) return -1;
  int bit = 1;
  while ((bit << 1) <= hi) bit <<= 1;
  int root = -1;
  for (; bit >= 1; bit >>= 1) {
    // The smallest multiple of `bit` in [lo, hi], if any, has the most trailing zeros.
    const int m = ((lo + bit - 1) / bit) * bit;
    if (m <= hi) {
      root = m;
      break;
    }
  }
  (*parent)[static_cast<size_t>(root - 1)] = parentLabel - 1;
  *maxDepth = std::max(*maxDepth, depth);
  buildRange(lo, root - 1, root, parent, depth + 1, maxDepth);
  buildRange(root + 1, hi, root, parent, depth + 1, maxDepth);
  return root;
}

int inOrderBinaryTree(int count, std::vector<int>* parent) {
  parent->assign(static_cast<size_t>(std::max(count, 0)), -1);
  if (count <= 0) return 0;
  int depth = 0;
  buildRange(1, count, 0, parent, 0, &depth);
  return depth;
}

int secondTreeItem(int i, int count) {
  return count % 2 == 0 ? count - 1 - i : (i + 1) % count;
}

// ---- building a plan ------------------------------------------------------------------

namespace {

Edge intraEdge(const NodeTemplate& t, int base, int a, int b, bool up) {
  Edge e;
  e.from = base + a;
  e.to = base + b;
  e.route = t.pairRoute[static_cast<size_t>(a * t.localCount() + b)];
  e.transport = t.routes[static_cast<size_t>(e.route)].transport;
  e.up = up;
  return e;
}

// A network edge from local device `a` of node `na` to local device `b` of node `nb`
// through NIC slot `nic` on both (rail-aligned); `sendRoute` overrides the sender side
// (a relayed exit).
Edge netEdge(const Plan& p, int na, int a, int nb, int b, int nic, int sendRoute, bool up) {
  const NodeTemplate& t = *p.node;
  const int k = t.localCount();
  const int nn = static_cast<int>(t.nics.size());
  Edge e;
  e.from = na * p.ranksPerNode + a;
  e.to = nb * p.ranksPerNode + b;
  e.up = up;
  e.transport = p.tcp ? Transport::Tcp : Transport::Net;
  if (nic < 0 || nn == 0) {
    e.sendMode = e.recvMode = NetMode::HostStaged;
    return e;
  }
  e.nic = static_cast<int16_t>(nic);
  e.route = sendRoute >= 0 ? sendRoute : t.nicSend[static_cast<size_t>(a * nn + nic)];
  e.recvRoute = t.nicRecv[static_cast<size_t>(nic * k + b)];
  e.sendMode = t.routes[static_cast<size_t>(e.route)].mode;
  e.recvMode = t.routes[static_cast<size_t>(e.recvRoute)].mode;
  return e;
}

void buildRings(Plan* p) {
  const NodeTemplate& t = *p->node;
  const int k = p->ranksPerNode, N = p->nodes;
  for (size_t c = 0; c < t.channels.size(); ++c) {
    const ChannelTemplate& ct = t.channels[c];
    Channel ch;
    ch.kind = ChannelKind::Ring;
    ch.templateChannel = static_cast<int>(c);
    ch.nic = ct.nic;
    ch.speedGBs = ct.speedGBs;
    ch.ranks.reserve(static_cast<size_t>(p->nranks));
    ch.edges.reserve(static_cast<size_t>(p->nranks));
    for (int n = 0; n < N; ++n) {
      const int base = n * k;
      for (int i = 0; i < k; ++i) ch.ranks.push_back(base + ct.order[static_cast<size_t>(i)]);
      for (int i = 0; i + 1 < k; ++i)
        ch.edges.push_back(
            intraEdge(t, base, ct.order[static_cast<size_t>(i)], ct.order[static_cast<size_t>(i + 1)], true));
      if (N == 1) {
        if (k > 1) ch.edges.push_back(intraEdge(t, base, ct.order.back(), ct.order.front(), true));
      } else {
        ch.edges.push_back(
            netEdge(*p, n, ct.order.back(), (n + 1) % N, ct.order.front(), ct.nic, ct.exitRoute, true));
      }
    }
    p->rings.push_back(std::move(ch));
  }
}

// Two trees per ring channel: the in-order binary tree over nodes and its mirror (or
// shift), each node a chain in the channel's ring order hanging from its entry device,
// which talks to the other nodes through the channel's NIC. One node: a single chain.
void buildTrees(Plan* p) {
  const NodeTemplate& t = *p->node;
  const int k = p->ranksPerNode, N = p->nodes;
  std::vector<int> tree0;
  const int depth = inOrderBinaryTree(N, &tree0);
  const int treesPerChannel = N > 1 ? 2 : 1;
  for (size_t c = 0; c < t.channels.size(); ++c) {
    const ChannelTemplate& ct = t.channels[c];
    const int head = ct.order.front();
    for (int ti = 0; ti < treesPerChannel; ++ti) {
      Channel ch;
      ch.kind = ChannelKind::Tree;
      ch.templateChannel = static_cast<int>(c);
      ch.treeIndex = ti;
      ch.nic = ct.nic;
      ch.speedGBs = ct.speedGBs / treesPerChannel;
      ch.depthNodes = depth;
      ch.parent.assign(static_cast<size_t>(p->nranks), -1);
      ch.ranks.reserve(static_cast<size_t>(p->nranks));
      ch.edges.reserve(2 * static_cast<size_t>(p->nranks));
      for (int pos = 0; pos < N; ++pos) {
        // Node `n` sits at position `pos` of the tree shape.
        const int n = ti == 0 ? pos : secondTreeItem(pos, N);
        const int parentPos = tree0[static_cast<size_t>(pos)];
        const int base = n * k;
        if (parentPos < 0) {
          ch.root = base + head;
        } else {
          const int pn = ti == 0 ? parentPos : secondTreeItem(parentPos, N);
          ch.parent[static_cast<size_t>(base + head)] = pn * k + head;
          ch.edges.push_back(netEdge(*p, n, head, pn, head, ct.nic, -1, true));
          ch.edges.push_back(netEdge(*p, pn, head, n, head, ct.nic, -1, false));
        }
        for (int i = 1; i < k; ++i) {
          const int a = ct.order[static_cast<size_t>(i)], up = ct.order[static_cast<size_t>(i - 1)];
          ch.parent[static_cast<size_t>(base + a)] = base + up;
          ch.edges.push_back(intraEdge(t, base, a, up, true));
          ch.edges.push_back(intraEdge(t, base, up, a, false));
        }
      }
      ch.ranks.push_back(ch.root);
      for (int r = 0; r < p->nranks; ++r)
        if (r != ch.root) ch.ranks.push_back(r);
      p->trees.push_back(std::move(ch));
    }
  }
}

// Hierarchical allreduce: local index g of every node forms an inter-node ring through
// the NIC nearest to it (ties broken towards the NIC with fewest local indices so far).
void buildRails(Plan* p) {
  const NodeTemplate& t = *p->node;
  const int k = p->ranksPerNode, N = p->nodes;
  const int nn = static_cast<int>(t.nics.size());
  std::vector<int> perNic(static_cast<size_t>(nn), 0);
  for (int g = 0; g < k; ++g) {
    int nic = -1;
    for (int s = 0; s < nn; ++s) {
      if (nic < 0) {
        nic = s;
        continue;
      }
      const Route& a = t.routes[static_cast<size_t>(t.nicSend[static_cast<size_t>(g * nn + s)])];
      const Route& b = t.routes[static_cast<size_t>(t.nicSend[static_cast<size_t>(g * nn + nic)])];
      if (a.nccl != b.nccl ? a.nccl < b.nccl
          : a.bandwidthGBs != b.bandwidthGBs
              ? a.bandwidthGBs > b.bandwidthGBs
              : perNic[static_cast<size_t>(s)] < perNic[static_cast<size_t>(nic)])
        nic = s;
    }
    if (nic >= 0) ++perNic[static_cast<size_t>(nic)];
    Channel ch;
    ch.kind = ChannelKind::Rail;
    ch.nic = nic;
    ch.templateChannel = g;
    ch.ranks.reserve(static_cast<size_t>(N));
    for (int n = 0; n < N; ++n) {
      ch.ranks.push_back(n * k + g);
      ch.edges.push_back(netEdge(*p, n, g, (n + 1) % N, g, nic, -1, true));
    }
    p->rails.push_back(std::move(ch));
  }
}

}  // namespace

Status buildPlan(std::shared_ptr<const topo::Topology> node, const PlanRequest& req, Plan* out) {
  const auto start = std::chrono::steady_clock::now();
  if (!node || !node->finalized())
    return makeError(ridgeInvalidArgument, "planner: the node topology is missing or not finalized");
  if (req.nranks < 1) return makeError(ridgeInvalidArgument, "planner: %d ranks", req.nranks);
  int nodes = req.nodes;
  int rpn = req.ranksPerNode;
  const int gpus = static_cast<int>(node->gpus().size());
  if (nodes <= 0) nodes = rpn > 0 ? req.nranks / rpn : gpus > 0 ? (req.nranks + gpus - 1) / gpus : 1;
  if (nodes < 1) nodes = 1;
  if (rpn <= 0) rpn = req.nranks / nodes;
  if (rpn < 1 || static_cast<int64_t>(rpn) * nodes != req.nranks)
    return makeError(ridgeInvalidArgument,
                     "planner: %d ranks do not split evenly over %d nodes (%d per node); give a multiple",
                     req.nranks, nodes, rpn);
  Plan p;
  p.nranks = req.nranks;
  p.nodes = nodes;
  p.ranksPerNode = rpn;
  p.network = req.network;
  p.tcp = req.tcp;
  auto tmpl = std::make_shared<NodeTemplate>();
  SearchOptions search = req.search;
  search.tcp = req.tcp;
  RIDGE_TRY(buildNodeTemplate(node, rpn, nodes > 1, req.network, search, tmpl.get()));
  p.node = tmpl;
  buildRings(&p);
  if (req.buildTrees) buildTrees(&p);
  if (req.buildRails && nodes > 1) buildRails(&p);
  p.buildMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  *out = std::move(p);
  return Status::ok();
}

// ---- network description --------------------------------------------------------------

// "400G" (bit/s with K/M/G/T suffix) or "400" (Gb/s) to Gb/s.
static bool parseGbps(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit(end);
  if (!unit.empty() && (unit.back() == 'b' || unit.back() == 'B')) unit.pop_back();
  if (unit.size() > 1 && unit.substr(unit.size() - 2) == "/s") unit.resize(unit.size() - 2);
  double scale = 1;
  if (unit.empty() || unit == "G" || unit == "g")
    scale = 1;
  else if (unit == "T" || unit == "t")
    scale = 1000;
  else if (unit == "M" || unit == "m")
    scale = 1e-3;
  else if (unit == "K" || unit == "k")
    scale = 1e-6;
  else
    return false;
  *out = v * scale;
  return std::isfinite(*out) && *out > 0;
}

// "600ns", "1.5us", "2ms", "600" (ns) to ns.
static bool parseLatencyNs(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  const std::string unit(end);
  double scale = 1;
  if (unit.empty() || unit == "ns")
    scale = 1;
  else if (unit == "us")
    scale = 1e3;
  else if (unit == "ms")
    scale = 1e6;
  else
    return false;
  *out = v * scale;
  return std::isfinite(*out) && *out >= 0;
}

static bool parseTier(const std::string& s, topo::NetworkTier* tier) {
  std::vector<std::string> f;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ':')) f.push_back(part);
  if (f.size() < 3 || f.size() > 5 || f[0].empty()) return false;
  tier->name = f[0];
  char* end = nullptr;
  const long radix = std::strtol(f[1].c_str(), &end, 10);
  if (*end || radix < 2 || radix > 100000) return false;
  tier->radix = static_cast<int>(radix);
  if (!parseGbps(f[2], &tier->linkGbps)) return false;
  for (size_t i = 3; i < f.size(); ++i) {
    const bool isLatency = f[i].find('s') != std::string::npos;
    if (isLatency) {
      if (!parseLatencyNs(f[i], &tier->latencyNs)) return false;
    } else {
      tier->oversubscription = std::strtod(f[i].c_str(), &end);
      if (*end || !(tier->oversubscription >= 1)) return false;
    }
  }
  return true;
}

Status parseNetworkSpec(const std::string& spec, topo::NetworkDescription* out, bool* tcp) {
  topo::NetworkDescription net;
  bool isTcp = false;
  std::stringstream ss(spec);
  std::string tok, key;
  auto bad = [&](const std::string& what) {
    return makeError(ridgeInvalidArgument,
                     "network spec '%s': bad %s; expected e.g. "
                     "rails=8,nic=400G,tiers=leaf:64:400G,spine:64:400G (see docs/planner.md)",
                     spec.c_str(), what.c_str());
  };
  while (std::getline(ss, tok, ',')) {
    if (tok.empty()) continue;
    const size_t eq = tok.find('=');
    std::string value = tok;
    if (eq != std::string::npos) {
      key = tok.substr(0, eq);
      value = tok.substr(eq + 1);
    } else if (key != "tiers") {
      return bad("entry '" + tok + "'");
    }
    if (key == "rails") {
      char* end = nullptr;
      const long r = std::strtol(value.c_str(), &end, 10);
      if (*end || r < 0 || r > 1024) return bad("rails");
      net.rails = static_cast<int>(r);
    } else if (key == "nic") {
      if (!parseGbps(value, &net.nicGbps)) return bad("nic speed");
    } else if (key == "tiers") {
      topo::NetworkTier tier;
      if (!parseTier(value, &tier)) return bad("tier '" + value + "'");
      net.tiers.push_back(tier);
    } else if (key == "latency") {
      if (!parseLatencyNs(value, &net.wireLatencyNs)) return bad("latency");
    } else if (key == "transport") {
      if (value != "tcp" && value != "rdma") return bad("transport (rdma or tcp)");
      isTcp = value == "tcp";
    } else {
      return bad("key '" + key + "'");
    }
  }
  *out = net;
  if (tcp) *tcp = isTcp;
  return Status::ok();
}

std::string formatNetworkSpec(const topo::NetworkDescription& net, bool tcp) {
  std::ostringstream o;
  o << "rails=" << net.rails;
  if (net.nicGbps > 0) o << ",nic=" << net.nicGbps << "G";
  if (!net.tiers.empty()) {
    o << ",tiers=";
    for (size_t i = 0; i < net.tiers.size(); ++i) {
      const topo::NetworkTier& t = net.tiers[i];
      o << (i ? "," : "") << t.name << ":" << t.radix << ":" << t.linkGbps << "G";
      if (t.oversubscription != 1) o << ":" << t.oversubscription;
      if (t.latencyNs > 0) o << ":" << t.latencyNs << "ns";
    }
  }
  if (net.wireLatencyNs > 0) o << ",latency=" << net.wireLatencyNs << "ns";
  if (tcp) o << ",transport=tcp";
  return o.str();
}

}  // namespace ridge::plan
