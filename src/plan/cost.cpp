#include "plan/cost.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ridge::plan {

namespace {

// Constants, each with its source (docs/planner.md lists them again).
// Base latency of one collective call in µs, per protocol (LL, LL128, Simple): NCCL's
// tuning tables (topology-facts.md, "Graph search and tuning").
constexpr double kRingBaseUs[kProtocolCount] = {6.6, 14.0, 8.4};
constexpr double kTreeBaseUs[kProtocolCount] = {6.8, 14.0, 8.4};
// Latency added per hop, µs, per protocol: NCCL's per-hop figures for NVLink, PCIe and
// the network (same source). Host shared memory is charged as PCIe.
constexpr double kNvlinkHopUs[kProtocolCount] = {0.6, 1.9, 3.4};
constexpr double kPcieHopUs[kProtocolCount] = {1.0, 2.5, 5.7};
constexpr double kNetHopUs[kProtocolCount] = {2.7, 4.0, 14.0};
// TCP through the kernel: Ridge's assumption (one round of socket calls on each side plus
// the wire), not measured yet; only the Simple protocol runs on it.
constexpr double kTcpHopUs = 30.0;
// Fraction of a link's bandwidth each protocol delivers as payload. LL (8-byte flag per
// 8 bytes of data) 0.5 and LL128 0.92: NCCL's figures (topology-facts.md). Simple 0.96:
// calibrated once, 8×A100 allreduce busbw 230 GB/s (nccl-tests issue 149) over the 240
// GB/s NVLink figure; H100 and the 400G NIC then validate it (tests/plan, docs/planner.md).
constexpr double kProtocolEfficiency[kProtocolCount] = {0.5, 0.92, 0.96};
// A channel is only worth starting when it gets at least this much of the message: below
// it the per-channel chunk is too small to keep a pipeline busy. Ridge's choice (NCCL
// scales channels down for small messages too; its thresholds are internal).
constexpr size_t kMinBytesPerChannel = 64 << 10;

constexpr double kInf = std::numeric_limits<double>::infinity();

}  // namespace

const char* algorithmName(Algorithm a) {
  switch (a) {
    case Algorithm::Ring: return "ring";
    case Algorithm::Tree: return "tree";
    case Algorithm::Hier: return "hier";
    case Algorithm::AllPairs: return "allpairs";
  }
  return "?";
}

const char* protocolName(Protocol p) {
  switch (p) {
    case Protocol::LL: return "LL";
    case Protocol::LL128: return "LL128";
    case Protocol::Simple: return "Simple";
  }
  return "?";
}

double busBandwidthFactor(Coll coll, int n) {
  if (n <= 1) return 1;
  switch (coll) {
    case Coll::AllReduce: return 2.0 * (n - 1) / n;
    case Coll::AllGather:
    case Coll::ReduceScatter:
    case Coll::AlltoAll: return static_cast<double>(n - 1) / n;
    case Coll::Broadcast:
    case Coll::Reduce: return 1;
  }
  return 1;
}

CostModel::CostModel(std::shared_ptr<const Plan> plan) : plan_(std::move(plan)) {
  const Plan& p = *plan_;
  const NodeTemplate& t = *p.node;
  // Fabric groups: a leaf switch serves `down` ports (radix split by the oversubscription
  // ratio); each tier above groups `down` groups of the tier below. The top tier joins all.
  const int nn = std::max(1, static_cast<int>(t.nics.size()));
  const int nicsPerRail =
      p.network.rails > 0 ? std::max(1, (nn + p.network.rails - 1) / p.network.rails) : nn;
  int64_t g = 1;
  for (size_t i = 0; i + 1 < p.network.tiers.size(); ++i) {
    const topo::NetworkTier& tier = p.network.tiers[i];
    const double o = std::max(1.0, tier.oversubscription);
    const int64_t down = std::max<int64_t>(1, static_cast<int64_t>(tier.radix * o / (1 + o)));
    g = i == 0 ? std::max<int64_t>(1, down / nicsPerRail) : g * down;
    fabricGroupNodes_.push_back(static_cast<int>(std::min<int64_t>(g, 1 << 30)));
  }
  // Mean hop latencies of ring channel 0 (all channels look alike).
  if (!t.channels.empty()) {
    const ChannelTemplate& ct = t.channels.front();
    for (int pr = 0; pr < kProtocolCount; ++pr) {
      double sum = 0;
      for (int h : ct.hops)
        sum += hopLatencyUs(t.routes[static_cast<size_t>(h)].transport, static_cast<Protocol>(pr));
      intraHopUs_[pr] = ct.hops.empty() ? 0 : sum / static_cast<double>(ct.hops.size());
      netHopUs_[pr] = hopLatencyUs(p.tcp ? Transport::Tcp : Transport::Net, static_cast<Protocol>(pr));
    }
  }
  for (const Route& r : t.routes)
    if (r.transport == Transport::PcieP2p || r.transport == Transport::HostShm) hasPcieOrShm_ = true;
  if (!p.rings.empty() && p.nodes > 1) {
    // Beyond NCCL's per-hop network figure: the fabric tiers crossed and, over RDMA, the
    // modeled latency of the send mode the GDR advisor chose for the GPU-NIC pair (the
    // GPU-side part of the hop, which differs by mode: a copy engine and a proxy for host
    // staging, a doorbell rung by the GPU for GDR).
    double sum = 0;
    int count = 0;
    for (const Edge& e : p.rings.front().edges) {
      if (e.transport != Transport::Net && e.transport != Transport::Tcp) continue;
      sum += netHopExtraUs(p.nodeOf(e.from), p.nodeOf(e.to));
      if (e.transport == Transport::Net && e.route >= 0)
        sum += t.routes[static_cast<size_t>(e.route)].modeLatencyNs / 1000;
      ++count;
    }
    netExtraUs_ = count ? sum / count : 0;
  }
}

double CostModel::hopLatencyUs(Transport t, Protocol p) const {
  const int i = static_cast<int>(p);
  switch (t) {
    case Transport::NvLink: return kNvlinkHopUs[i];
    case Transport::PcieP2p:
    case Transport::HostShm: return kPcieHopUs[i];
    case Transport::Net: return kNetHopUs[i];
    case Transport::Tcp: return kTcpHopUs;
  }
  return kPcieHopUs[i];
}

bool CostModel::protocolAllowed(Protocol p) const {
  const Plan& pl = *plan_;
  if (pl.node->hostRanks || (pl.tcp && pl.nodes > 1)) return p == Protocol::Simple;
  // LL128 relies on 128-byte stores arriving whole, which NVLink and RDMA give; PCIe P2P
  // and host memory do not.
  if (p == Protocol::LL128) return !hasPcieOrShm_;
  return true;
}

bool CostModel::supports(Coll coll, Algorithm algo) const {
  const Plan& p = *plan_;
  switch (algo) {
    case Algorithm::Ring: return coll != Coll::AlltoAll && !p.rings.empty();
    case Algorithm::Tree:
      return (coll == Coll::AllReduce || coll == Coll::Broadcast || coll == Coll::Reduce) && !p.trees.empty();
    case Algorithm::Hier:
      // Every collective but all-to-all has a hierarchical form (phases() lists them).
      return coll != Coll::AlltoAll && p.nodes > 1 && p.ranksPerNode > 1 && !p.rails.empty();
    case Algorithm::AllPairs: return coll == Coll::AlltoAll;
  }
  return false;
}

void CostModel::addRoute(std::vector<double>* v, int route, double coef) const {
  if (route < 0 || coef == 0) return;
  for (const ResourceUse& u : plan_->node->routes[static_cast<size_t>(route)].uses)
    (*v)[static_cast<size_t>(u.resource)] += coef * u.weight;
}

// Which non-top tiers an edge between nodes a and b leaves its group at; fills the group
// keys (both directions) it loads.
int CostModel::tiersCrossed(int a, int b, int nic, std::vector<int64_t>* groups) const {
  int crossed = 0;
  const NodeTemplate& t = *plan_->node;
  const int rail = plan_->network.rails > 0 && nic >= 0 ? t.nicRail[static_cast<size_t>(nic)] : 0;
  for (size_t i = 0; i < fabricGroupNodes_.size(); ++i) {
    const int ga = a / fabricGroupNodes_[i], gb = b / fabricGroupNodes_[i];
    if (ga == gb) break;
    ++crossed;
    if (groups) {
      const int64_t base = (static_cast<int64_t>(i) * 4096 + rail) << 32;
      groups->push_back(base | (static_cast<int64_t>(ga) * 2));
      groups->push_back(base | (static_cast<int64_t>(gb) * 2 + 1));
    }
  }
  return crossed;
}

double CostModel::netHopExtraUs(int a, int b) const {
  const int crossed = tiersCrossed(a, b, -1, nullptr);
  double ns = plan_->network.wireLatencyNs;
  for (int i = 1; i <= crossed && i < static_cast<int>(plan_->network.tiers.size()); ++i)
    ns += 2 * plan_->network.tiers[static_cast<size_t>(i)].latencyNs;
  return ns / 1000;
}

void CostModel::addFabric(Profile* p, int fromNode, int toNode, int nic, double coef) const {
  if (fabricGroupNodes_.empty() || coef == 0) return;
  std::vector<int64_t> groups;
  tiersCrossed(fromNode, toNode, nic, &groups);
  for (int64_t key : groups) p->fabric[key] += coef;
}

double CostModel::fabricCapacity(int64_t key) const {
  const int tier = static_cast<int>(key >> 32) / 4096;
  const Plan& p = *plan_;
  const NodeTemplate& t = *p.node;
  const int nn = std::max(1, static_cast<int>(t.nics.size()));
  const int nicsOnRail = p.network.rails > 0 ? std::max(1, (nn + p.network.rails - 1) / p.network.rails) : nn;
  const topo::NetworkTier& nt = p.network.tiers[static_cast<size_t>(tier)];
  return static_cast<double>(fabricGroupNodes_[static_cast<size_t>(tier)]) * nicsOnRail * t.nicGBs /
         std::max(1.0, nt.oversubscription);
}

std::string CostModel::fabricName(int64_t key) const {
  const int tier = static_cast<int>(key >> 32) / 4096;
  const int rail = static_cast<int>(key >> 32) % 4096;
  const int64_t low = key & 0xffffffffLL;
  return plan_->network.tiers[static_cast<size_t>(tier)].name + " group " + std::to_string(low / 2) +
         " rail " + std::to_string(rail) + (low % 2 ? " uplinks in" : " uplinks out");
}

void CostModel::finishProfile(Profile* p) const {
  const ResourceTable& rt = plan_->node->resources;
  p->worstTimePerByte = 0;
  for (size_t r = 0; r < p->node.size(); ++r) {
    if (p->node[r] <= 0 || !std::isfinite(rt.capacityGBs[r])) continue;
    const double tpb = p->node[r] / (rt.capacityGBs[r] * 1e3);
    if (tpb > p->worstTimePerByte) {
      p->worstTimePerByte = tpb;
      p->worst = rt.names[r];
    }
  }
  for (const auto& [key, coef] : p->fabric) {
    const double tpb = coef / (fabricCapacity(key) * 1e3);
    if (tpb > p->worstTimePerByte) {
      p->worstTimePerByte = tpb;
      p->worst = fabricName(key);
    }
  }
}

// phase: 0 the whole algorithm (ring, tree, allpairs); hier 0 one intra-node pass, 1 the
// inter-node part on the rails.
const CostModel::Profile& CostModel::profile(Coll coll, Algorithm algo, int phase, int channels) const {
  const int64_t key =
      ((static_cast<int64_t>(coll) * 8 + static_cast<int64_t>(algo)) * 4 + phase) * 1024 + channels;
  auto it = cache_.find(key);
  if (it != cache_.end()) return *it->second;
  auto prof = std::make_unique<Profile>();
  const Plan& p = *plan_;
  const NodeTemplate& t = *p.node;
  const int n = p.nranks, k = p.ranksPerNode, N = p.nodes;
  const int nn = static_cast<int>(t.nics.size());
  prof->node.assign(t.resources.capacityGBs.size(), 0.0);
  if (algo == Algorithm::Ring) {
    // Every edge of a ring channel carries the same bytes: the busbw factor's share.
    const double f = busBandwidthFactor(coll, n) / channels;
    for (int j = 0; j < channels; ++j) {
      const ChannelTemplate& ct = t.channels[static_cast<size_t>(j)];
      for (int h : ct.hops) addRoute(&prof->node, h, f);
      addRoute(&prof->node, ct.entryRoute, f);
      addRoute(&prof->node, ct.exitRoute, f);
      for (const Edge& e : p.rings[static_cast<size_t>(j)].edges)
        if (e.transport == Transport::Net || e.transport == Transport::Tcp)
          addFabric(prof.get(), p.nodeOf(e.from), p.nodeOf(e.to), e.nic, f);
    }
  } else if (algo == Algorithm::Tree) {
    // Each edge carries the tree's share once up (reduce) and once down (broadcast).
    const double upF = coll == Coll::Broadcast ? 0 : 1, downF = coll == Coll::Reduce ? 0 : 1;
    const int perTemplate = N > 1 ? 2 : 1;
    const double d = 1.0 / (channels * perTemplate);
    // Node roles: (has parent, children) in each tree. The per-resource maximum over roles
    // is the worst node's load.
    std::vector<int> children[2];
    std::vector<char> hasParent[2];
    for (int ti = 0; ti < perTemplate; ++ti) {
      const Channel& tc = p.trees[static_cast<size_t>(ti)];
      children[ti].assign(static_cast<size_t>(N), 0);
      hasParent[ti].assign(static_cast<size_t>(N), 0);
      const int head = t.channels.front().order.front();
      for (int node = 0; node < N; ++node) {
        const int par = tc.parent[static_cast<size_t>(node * k + head)];
        if (par >= 0) {
          hasParent[ti][static_cast<size_t>(node)] = 1;
          ++children[ti][static_cast<size_t>(p.nodeOf(par))];
        }
      }
    }
    std::vector<int> seen;
    std::vector<double> v(prof->node.size());
    for (int node = 0; node < N; ++node) {
      int role = 0;
      for (int ti = 0; ti < perTemplate; ++ti)
        role =
            role * 8 + hasParent[ti][static_cast<size_t>(node)] * 4 + children[ti][static_cast<size_t>(node)];
      if (std::find(seen.begin(), seen.end(), role) != seen.end()) continue;
      seen.push_back(role);
      std::fill(v.begin(), v.end(), 0.0);
      for (int j = 0; j < channels; ++j) {
        const ChannelTemplate& ct = t.channels[static_cast<size_t>(j)];
        const int head = ct.order.front();
        for (int ti = 0; ti < perTemplate; ++ti) {
          for (int i = 1; i < k; ++i) {
            const int a = ct.order[static_cast<size_t>(i)], up = ct.order[static_cast<size_t>(i - 1)];
            addRoute(&v, t.pairRoute[static_cast<size_t>(a * k + up)], d * upF);
            addRoute(&v, t.pairRoute[static_cast<size_t>(up * k + a)], d * downF);
          }
          if (N == 1 || ct.nic < 0) continue;
          const int send = t.nicSend[static_cast<size_t>(head * nn + ct.nic)];
          const int recv = t.nicRecv[static_cast<size_t>(ct.nic * k + head)];
          const double hp = hasParent[ti][static_cast<size_t>(node)];
          const double ch = children[ti][static_cast<size_t>(node)];
          addRoute(&v, send, d * (hp * upF + ch * downF));
          addRoute(&v, recv, d * (hp * downF + ch * upF));
        }
      }
      for (size_t r = 0; r < v.size(); ++r) prof->node[r] = std::max(prof->node[r], v[r]);
    }
    if (N > 1)
      for (int j = 0; j < channels * perTemplate; ++j)
        for (const Edge& e : p.trees[static_cast<size_t>(j)].edges)
          if (e.transport == Transport::Net || e.transport == Transport::Tcp)
            addFabric(prof.get(), p.nodeOf(e.from), p.nodeOf(e.to), e.nic, d * (e.up ? upF : downF));
  } else if (algo == Algorithm::Hier) {
    if (phase == 0) {
      // One intra-node pass over the channels' orders closed into cycles: a reduce-scatter,
      // all-gather, scatter or gather of the node's data; each edge carries (k-1)/k of it.
      const double f = static_cast<double>(k - 1) / k / channels;
      for (int j = 0; j < channels; ++j) {
        const ChannelTemplate& ct = t.channels[static_cast<size_t>(j)];
        for (int i = 0; i < k; ++i)
          addRoute(&prof->node,
                   t.pairRoute[static_cast<size_t>(ct.order[static_cast<size_t>(i)] * k +
                                                   ct.order[static_cast<size_t>((i + 1) % k)])],
                   f);
      }
    } else {
      // Each local index runs the collective on its 1/k shard across nodes on its rail: a
      // ring for allreduce, allgather and reduce-scatter, a pipelined chain for broadcast
      // and reduce; each rail edge carries the busbw factor over N of the shard.
      const double f = busBandwidthFactor(coll, N) / k;
      for (const Channel& rail : p.rails) {
        const int g = rail.templateChannel;
        if (rail.nic >= 0) {
          addRoute(&prof->node, t.nicSend[static_cast<size_t>(g * nn + rail.nic)], f);
          addRoute(&prof->node, t.nicRecv[static_cast<size_t>(rail.nic * k + g)], f);
        }
        for (const Edge& e : rail.edges) addFabric(prof.get(), p.nodeOf(e.from), p.nodeOf(e.to), e.nic, f);
      }
    }
  } else {
    // All-pairs: 1/n of the send buffer to every peer; the inter-node part through the
    // NIC of the rank's rail.
    for (int a = 0; a < k; ++a) {
      for (int b = 0; b < k; ++b)
        if (a != b) addRoute(&prof->node, t.pairRoute[static_cast<size_t>(a * k + b)], 1.0 / n);
      if (N == 1 || nn == 0) continue;
      const int nic = a < static_cast<int>(p.rails.size()) ? p.rails[static_cast<size_t>(a)].nic : 0;
      if (nic < 0) continue;
      const double inter = static_cast<double>(n - k) / n;
      addRoute(&prof->node, t.nicSend[static_cast<size_t>(a * nn + nic)], inter);
      addRoute(&prof->node, t.nicRecv[static_cast<size_t>(nic * k + a)], inter);
      // Uniform traffic: a group of g nodes sends (N - g) / (N - 1) of it outside.
      for (size_t i = 0; i < fabricGroupNodes_.size(); ++i) {
        const int gsz = fabricGroupNodes_[i];
        if (gsz >= N) break;
        const int rail = p.network.rails > 0 ? t.nicRail[static_cast<size_t>(nic)] : 0;
        const double out = static_cast<double>(gsz) * inter * (N - gsz) / (N - 1);
        for (int grp = 0; grp * gsz < N; ++grp) {
          const int64_t base = (static_cast<int64_t>(i) * 4096 + rail) << 32;
          prof->fabric[base | (static_cast<int64_t>(grp) * 2)] += out;
          prof->fabric[base | (static_cast<int64_t>(grp) * 2 + 1)] += out;
        }
      }
    }
  }
  finishProfile(prof.get());
  return *cache_.emplace(key, std::move(prof)).first->second;
}

void CostModel::phases(Coll coll, Algorithm algo, int channels, std::vector<Phase>* out) const {
  const Plan& p = *plan_;
  const int n = p.nranks, k = p.ranksPerNode, N = p.nodes;
  out->clear();
  double hop[kProtocolCount], net[kProtocolCount];
  for (int pr = 0; pr < kProtocolCount; ++pr) {
    net[pr] = netHopUs_[pr] + netExtraUs_;
    hop[pr] = N == 1 ? intraHopUs_[pr] : ((k - 1) * intraHopUs_[pr] + net[pr]) / k;
  }
  Phase ph{};
  if (algo == Algorithm::Ring) {
    const double steps = coll == Coll::AllReduce ? 2.0 * (n - 1) : n - 1;
    ph.profile = &profile(coll, algo, 0, channels);
    for (int pr = 0; pr < kProtocolCount; ++pr) ph.latencyUs[pr] = kRingBaseUs[pr] + steps * hop[pr];
    out->push_back(ph);
  } else if (algo == Algorithm::Tree) {
    const double trips = coll == Coll::AllReduce ? 2 : 1;
    const int depth = p.trees.empty() ? 0 : p.trees.front().depthNodes;
    ph.profile = &profile(coll, algo, 0, channels);
    for (int pr = 0; pr < kProtocolCount; ++pr)
      ph.latencyUs[pr] = kTreeBaseUs[pr] + trips * ((k - 1) * intraHopUs_[pr] + depth * net[pr]);
    out->push_back(ph);
  } else if (algo == Algorithm::Hier) {
    // The phases, one after the other (docs/planner.md, "Hierarchical forms"):
    //   allreduce      intra reduce-scatter, inter allreduce, intra allgather
    //   allgather      inter allgather, intra allgather
    //   reducescatter  intra reduce-scatter, inter reduce-scatter
    //   broadcast      intra scatter from the root, inter broadcast, intra allgather
    //   reduce         intra reduce-scatter, inter reduce, intra gather to the root
    Phase intra{}, inter{};
    intra.profile = &profile(coll, algo, 0, channels);
    inter.profile = &profile(coll, algo, 1, channels);
    const double interSteps = coll == Coll::AllReduce ? 2.0 * (N - 1) : N - 1;
    for (int pr = 0; pr < kProtocolCount; ++pr) {
      intra.latencyUs[pr] = kRingBaseUs[pr] + (k - 1) * intraHopUs_[pr];
      inter.latencyUs[pr] = kRingBaseUs[pr] + interSteps * net[pr];
    }
    if (coll != Coll::AllGather) out->push_back(intra);
    out->push_back(inter);
    if (coll != Coll::ReduceScatter) out->push_back(intra);
  } else {
    ph.profile = &profile(coll, algo, 0, channels);
    for (int pr = 0; pr < kProtocolCount; ++pr)
      ph.latencyUs[pr] = kRingBaseUs[pr] + (N > 1 ? net[pr] : hop[pr]);
    out->push_back(ph);
  }
}

std::vector<int> CostModel::channelCandidates(size_t bytes, int maxChannels) const {
  const int byBytes = static_cast<int>(
      std::min<size_t>(static_cast<size_t>(maxChannels), std::max<size_t>(1, bytes / kMinBytesPerChannel)));
  std::vector<int> c;
  for (int x = 1; x <= byBytes; x *= 2) c.push_back(x);
  if (c.back() != byBytes) c.push_back(byBytes);
  return c;
}

Estimate CostModel::estimate(Coll coll, size_t bytes, Algorithm algo) const {
  Estimate best;
  best.coll = coll;
  best.bytes = bytes;
  best.algo = algo;
  if (!supports(coll, algo)) return best;
  const Plan& p = *plan_;
  const int maxCh = algo == Algorithm::AllPairs ? 1 : static_cast<int>(p.node->channels.size());
  std::vector<Phase> ph;
  double bestTime = kInf;
  for (int ch : channelCandidates(bytes, maxCh)) {
    phases(coll, algo, ch, &ph);
    for (int pr = 0; pr < kProtocolCount; ++pr) {
      if (!protocolAllowed(static_cast<Protocol>(pr))) continue;
      double time = 0, lat = 0;
      std::string worst;
      double worstTpb = -1;
      for (const Phase& f : ph) {
        time += f.latencyUs[pr] +
                static_cast<double>(bytes) * f.profile->worstTimePerByte / kProtocolEfficiency[pr];
        lat += f.latencyUs[pr];
        if (f.profile->worstTimePerByte > worstTpb) {
          worstTpb = f.profile->worstTimePerByte;
          worst = f.profile->worst;
        }
      }
      if (time < bestTime * (1 - 1e-12)) {
        bestTime = time;
        best.valid = true;
        best.proto = static_cast<Protocol>(pr);
        best.channels = ch;
        best.latencyUs = lat;
        best.timeUs = time;
        best.bottleneck = worst;
      }
    }
  }
  if (best.valid) {
    best.algbwGBs = bytes / (best.timeUs * 1e3);
    best.busbwGBs = best.algbwGBs * busBandwidthFactor(coll, p.nranks);
  }
  return best;
}

Estimate CostModel::best(Coll coll, size_t bytes, const std::vector<AlgoRule>* rules) const {
  if (rules) {
    if (const AlgoRule* r = findAlgoRule(*rules, coll, bytes)) {
      Algorithm forced;
      bool known = true;
      switch (r->algo) {
        case AlgoName::Ring: forced = Algorithm::Ring; break;
        case AlgoName::Tree: forced = Algorithm::Tree; break;
        case AlgoName::Hier: forced = Algorithm::Hier; break;
        case AlgoName::AllPairs: forced = Algorithm::AllPairs; break;
        default:
          known = false;
          forced = Algorithm::Ring;
          break;
      }
      if (known) {
        Estimate e = estimate(coll, bytes, forced);
        if (e.valid) return e;
      }
    }
  }
  Estimate best;
  for (int a = 0; a < kAlgorithmCount; ++a) {
    Estimate e = estimate(coll, bytes, static_cast<Algorithm>(a));
    if (e.valid && (!best.valid || e.timeUs < best.timeUs)) best = e;
  }
  return best;
}

std::vector<ResourceLoad> CostModel::loads(const Estimate& e, size_t limit) const {
  std::vector<ResourceLoad> out;
  if (!e.valid) return out;
  std::vector<Phase> ph;
  phases(e.coll, e.algo, e.channels, &ph);
  const ResourceTable& rt = plan_->node->resources;
  std::vector<double> node(rt.capacityGBs.size(), 0.0);
  std::map<int64_t, double> fabric;
  for (const Phase& f : ph) {
    for (size_t r = 0; r < node.size(); ++r) node[r] += f.profile->node[r];
    for (const auto& [key, coef] : f.profile->fabric) fabric[key] += coef;
  }
  const double bytes = static_cast<double>(e.bytes);
  for (size_t r = 0; r < node.size(); ++r) {
    if (node[r] <= 0) continue;
    ResourceLoad l{rt.names[r], rt.capacityGBs[r], node[r] * bytes, 0};
    l.busyUs = std::isfinite(l.capacityGBs) ? l.bytes / (l.capacityGBs * 1e3) : 0;
    out.push_back(l);
  }
  for (const auto& [key, coef] : fabric) {
    ResourceLoad l{fabricName(key), fabricCapacity(key), coef * bytes, 0};
    l.busyUs = l.bytes / (l.capacityGBs * 1e3);
    out.push_back(l);
  }
  std::stable_sort(out.begin(), out.end(), [](const ResourceLoad& a, const ResourceLoad& b) {
    return a.busyUs != b.busyUs ? a.busyUs > b.busyUs : a.bytes > b.bytes;
  });
  if (out.size() > limit) out.resize(limit);
  return out;
}

}  // namespace ridge::plan
