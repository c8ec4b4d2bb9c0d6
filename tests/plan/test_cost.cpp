// The cost model against published NCCL figures (topology-facts.md, "Published figures"),
// and its algorithm choices.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "plan/cost.h"
#include "plan_fixtures.h"
#include "topo/gdr_placement.h"
#include "transports/gdr/gdr_model.h"
#include "transports/net/net_transport.h"

namespace ridge::plan {
namespace {

using testing::buildOrDie;

constexpr size_t kLarge = size_t{4} << 30;  // nccl-tests' largest usual size: the bandwidth plateau

std::shared_ptr<const Plan> shared(Plan p) {
  return std::make_shared<const Plan>(std::move(p));
}

struct Figure {
  const char* system;
  const char* source;
  double published;  // GB/s busbw
  double predicted;
};

TEST(CostModel, OneNodePredictionsWithin15PercentOfPublishedFigures) {
  std::vector<Figure> rows;
  {
    CostModel m(shared(buildOrDie("dgx-a100", 1)));
    rows.push_back({"8x A100 NVSwitch, allreduce", "nccl-tests issue 149", 230,
                    m.estimate(Coll::AllReduce, kLarge, Algorithm::Ring).busbwGBs});
  }
  {
    CostModel m(shared(buildOrDie("dgx-h100", 1)));
    rows.push_back({"8x H100 NVSwitch, ring allreduce", "nccl-tests issue 212", 370,
                    m.estimate(Coll::AllReduce, kLarge, Algorithm::Ring).busbwGBs});
  }
  {
    // Two nodes of one H100 each, one NDR 400G NIC carrying the single channel.
    auto t = testing::preset("dgx-h100");
    PlanRequest req;
    req.nranks = 2;
    req.nodes = 2;
    req.ranksPerNode = 1;
    req.search.maxChannels = 1;
    ASSERT_TRUE(parseNetworkSpec("rails=8,nic=400G", &req.network, nullptr).isOk());
    Plan p;
    ASSERT_TRUE(buildPlan(t, req, &p).isOk());
    CostModel m(shared(std::move(p)));
    const Estimate e = m.estimate(Coll::AllReduce, kLarge, Algorithm::Ring);
    rows.push_back({"NDR 400G InfiniBand, per NIC", "nccl-tests issues 267, 290", 47.5, e.busbwGBs});
  }
  std::printf("\n%-36s %-28s %10s %10s %8s\n", "system", "published by", "published", "predicted", "error");
  for (const Figure& f : rows) {
    const double err = (f.predicted - f.published) / f.published;
    std::printf("%-36s %-28s %10.1f %10.1f %+7.1f%%\n", f.system, f.source, f.published, f.predicted,
                100 * err);
    EXPECT_NEAR(f.predicted, f.published, 0.15 * f.published) << f.system;
  }
  // The NIC figure is a range (46 to 49 GB/s): the prediction must fall inside it.
  EXPECT_GE(rows[2].predicted, 46.0);
  EXPECT_LE(rows[2].predicted, 49.0);
}

TEST(CostModel, TreesWinSmallMessagesAtScaleAndRulesForceTheAlgorithm) {
  CostModel m(shared(buildOrDie("dgx-h100", 512, 0, "rails=8,nic=400G,tiers=leaf:64:400G,spine:64:400G")));
  const Estimate small = m.best(Coll::AllReduce, 8);
  ASSERT_TRUE(small.valid);
  EXPECT_EQ(small.algo, Algorithm::Tree) << "ring latency grows with 4096 ranks";
  EXPECT_EQ(small.channels, 1) << "8 bytes do not need more than one channel";
  const Estimate large = m.best(Coll::AllReduce, kLarge);
  const Estimate ring = m.estimate(Coll::AllReduce, kLarge, Algorithm::Ring);
  EXPECT_GE(large.busbwGBs, 0.99 * ring.busbwGBs);
  EXPECT_GT(large.channels, 1);

  std::vector<AlgoRule> rules;
  std::string bad;
  ASSERT_TRUE(parseAlgoRules("allreduce:0-64K:ring;allreduce:64K-:hier", &rules, &bad));
  EXPECT_EQ(m.best(Coll::AllReduce, 8, &rules).algo, Algorithm::Ring);
  EXPECT_EQ(m.best(Coll::AllReduce, kLarge, &rules).algo, Algorithm::Hier);
  // A rule for another collective, or naming an algorithm the model cannot run, is ignored.
  EXPECT_EQ(m.best(Coll::Broadcast, 8, &rules).algo,
            small.algo == Algorithm::Tree ? Algorithm::Tree : small.algo);
  ASSERT_TRUE(parseAlgoRules("alltoall:0-:ring", &rules, &bad));
  EXPECT_EQ(m.best(Coll::AlltoAll, 1 << 20, &rules).algo, Algorithm::AllPairs);
  EXPECT_FALSE(parseAlgoRules("allreduce:0-64K:teleport", &rules, &bad));
  EXPECT_EQ(bad, "allreduce:0-64K:teleport");
}

TEST(CostModel, TimeGrowsWithSizeAndLoadsExplainTheBottleneck) {
  CostModel m(shared(buildOrDie("pcie-8gpu-2socket", 2, 0, "rails=0,nic=100G")));
  double last = 0;
  for (size_t bytes = 8; bytes <= (size_t{1} << 30); bytes *= 8) {
    for (int c = 0; c < kCollCount; ++c) {
      const Estimate e = m.best(static_cast<Coll>(c), bytes);
      ASSERT_TRUE(e.valid) << collName(static_cast<Coll>(c));
      EXPECT_GT(e.timeUs, 0);
    }
    const Estimate e = m.best(Coll::AllReduce, bytes);
    EXPECT_GT(e.timeUs, last);
    last = e.timeUs;
  }
  const Estimate e = m.estimate(Coll::AllReduce, size_t{1} << 30, Algorithm::Ring);
  const std::vector<ResourceLoad> loads = m.loads(e, 5);
  ASSERT_FALSE(loads.empty());
  // The busiest resource is the bottleneck the estimate names, and its busy time is the
  // bandwidth part of the predicted time.
  EXPECT_EQ(loads.front().name, e.bottleneck);
  EXPECT_NEAR(loads.front().busyUs / 0.96, e.timeUs - e.latencyUs, 0.01 * e.timeUs);
}

TEST(CostModel, HierarchicalOnlyAcrossNodes) {
  CostModel one(shared(buildOrDie("dgx-a100", 1)));
  EXPECT_FALSE(one.estimate(Coll::AllReduce, 1 << 20, Algorithm::Hier).valid);
  CostModel two(shared(buildOrDie("dgx-a100", 2)));
  const Estimate h = two.estimate(Coll::AllReduce, 1 << 30, Algorithm::Hier);
  ASSERT_TRUE(h.valid);
  EXPECT_GT(h.busbwGBs, 50);
}

// ---- network hops priced through the GDR advisor ---------------------------------------

// A plan of `nodes` nodes with `ranksPerNode` GPUs each, optionally forcing a send mode.
std::shared_ptr<const Plan> gdrPlan(const std::string& presetName, int nodes, int ranksPerNode,
                                    std::optional<topo::GdrOption> forced) {
  auto t = testing::preset(presetName);
  PlanRequest req;
  req.nodes = nodes;
  req.ranksPerNode = ranksPerNode;
  req.nranks = nodes * ranksPerNode;
  req.search.forcedGdrMode = forced;
  EXPECT_TRUE(parseNetworkSpec("rails=0,nic=400G", &req.network, nullptr).isOk());
  Plan p;
  EXPECT_TRUE(buildPlan(t, req, &p).isOk());
  return shared(std::move(p));
}

// What the advisor says for one pair of the preset, asked directly (not through the plan).
topo::GdrAdvice adviceFor(const std::string& presetName, const std::string& gpu, const std::string& nic) {
  auto t = testing::preset(presetName);
  topo::GdrPlacement placement;
  EXPECT_TRUE(topo::gdrPlacementFor(*t, t->find(gpu), t->find(nic), &placement).isOk());
  placement.nicPortGBs = 50;  // nic=400G, as the plan's network description says
  return topo::adviseGdr(placement, topo::PcieConstants{});
}

TEST(CostModelGdr, CrossRcNetworkSendsAreGdrWriteAtTheAdvisorsFigure) {
  const topo::GdrAdvice advice = adviceFor("cross-rc", "GPU0", "NIC0");
  ASSERT_EQ(advice.chosen, topo::GdrOption::GdrWrite) << advice.reason;
  auto advised = gdrPlan("cross-rc", 2, 1, std::nullopt);
  auto read = gdrPlan("cross-rc", 2, 1, topo::GdrOption::GdrRead);
  auto staged = gdrPlan("cross-rc", 2, 1, topo::GdrOption::HostStaged);
  int netEdges = 0;
  for (const Edge& e : advised->rings.front().edges) {
    if (e.transport != Transport::Net) continue;
    ++netEdges;
    EXPECT_EQ(e.sendMode, NetMode::GdrWrite) << "cross-rc sends go GPU-written (NODE placement)";
  }
  EXPECT_EQ(netEdges, 2);
  int readNet = 0;
  for (const Edge& e : read->rings.front().edges)
    if (e.transport == Transport::Net) {
      ++readNet;
      EXPECT_EQ(e.sendMode, NetMode::GdrRead) << "forced mode";
    }
  EXPECT_EQ(readNet, 2) << "the forced plan must cross the network too";

  // Large messages: the send pipeline of the mode is the bottleneck, so busbw scales with
  // the advisor's figure for that mode (gdr-write 47.9 GB/s against gdr-read's 29.2).
  const double writeGBs = advice.estimate(topo::GdrOption::GdrWrite).largeBandwidthGBs;
  const double readGBs = advice.estimate(topo::GdrOption::GdrRead).largeBandwidthGBs;
  const Estimate w = CostModel(advised).estimate(Coll::AllReduce, kLarge, Algorithm::Ring);
  const Estimate r = CostModel(read).estimate(Coll::AllReduce, kLarge, Algorithm::Ring);
  std::printf(
      "cross-rc 2x1, allreduce 4 GiB: gdr-write %.2f GB/s busbw (advisor %.2f), gdr-read %.2f (advisor "
      "%.2f)\n",
      w.busbwGBs, writeGBs, r.busbwGBs, readGBs);
  EXPECT_NE(w.bottleneck.find("gdr-write"), std::string::npos) << w.bottleneck;
  EXPECT_NE(r.bottleneck.find("gdr-read"), std::string::npos) << r.bottleneck;
  EXPECT_NEAR(w.busbwGBs / r.busbwGBs, writeGBs / readGBs, 0.01 * writeGBs / readGBs);
  EXPECT_LT(w.busbwGBs, writeGBs);
  EXPECT_GT(w.busbwGBs, 0.9 * writeGBs);

  // Small messages: every network hop pays the mode's modeled latency; a 2-rank ring
  // allreduce takes two network hops, so host staging costs twice its extra latency.
  const double extraUs = (advice.estimate(topo::GdrOption::HostStaged).latencyNs.front() -
                          advice.estimate(topo::GdrOption::GdrWrite).latencyNs.front()) /
                         1000;
  ASSERT_GT(extraUs, 1.0);
  const Estimate ws = CostModel(advised).estimate(Coll::AllReduce, 8, Algorithm::Ring);
  const Estimate ss = CostModel(staged).estimate(Coll::AllReduce, 8, Algorithm::Ring);
  EXPECT_NEAR(ss.timeUs - ws.timeUs, 2 * extraUs, 0.01 * extraUs);
}

TEST(CostModelGdr, DgxH100NetworkSendsAreGdrRead) {
  auto p = gdrPlan("dgx-h100", 2, 8, std::nullopt);
  const NodeTemplate& t = *p->node;
  ASSERT_EQ(t.nicModes.size(), static_cast<size_t>(8) * t.nics.size());
  for (const ChannelTemplate& ct : t.channels) {
    // The GPU under the channel's NIC sends with gdr-read, as the advisor says for PIX.
    const NicPairMode& m = t.nicModes[static_cast<size_t>(ct.order.front()) * t.nics.size() + ct.nic];
    EXPECT_EQ(m.option, topo::GdrOption::GdrRead) << m.why;
    const topo::GdrAdvice a =
        adviceFor("dgx-h100", t.deviceName(ct.order.front()), t.topology->node(t.nics[ct.nic]).name);
    EXPECT_EQ(a.chosen, topo::GdrOption::GdrRead);
    EXPECT_DOUBLE_EQ(m.bandwidthGBs, a.estimate(topo::GdrOption::GdrRead).largeBandwidthGBs);
  }
  ASSERT_FALSE(t.channels.empty());
  int ringNet = 0, railEdges = 0, firstRingNet = 0;
  for (const Channel& ring : p->rings)
    for (const Edge& e : ring.edges)
      if (e.transport == Transport::Net) {
        ++ringNet;
        EXPECT_TRUE(e.sendMode == NetMode::GdrRead || e.sendMode == NetMode::Pxn) << netModeName(e.sendMode);
      }
  for (const Channel& rail : p->rails)
    for (const Edge& e : rail.edges) {
      ++railEdges;
      EXPECT_EQ(e.sendMode, NetMode::GdrRead);
    }
  EXPECT_GT(ringNet, 0) << "two nodes: the rings must cross the network";
  EXPECT_GT(railEdges, 0) << "two nodes: the rails must have edges";
  // Relayed exits (PXN) carry the latency of the relaying GPU's gdr-read, like direct ones.
  const double channelLatencyNs =
      t.nicModes[static_cast<size_t>(t.channels.front().order.front()) * t.nics.size() +
                 t.channels.front().nic]
          .latencyNs;
  for (const Edge& e : p->rings.front().edges) {
    if (e.transport != Transport::Net) continue;
    ++firstRingNet;
    EXPECT_DOUBLE_EQ(t.routes[static_cast<size_t>(e.route)].modeLatencyNs, channelLatencyNs);
  }
  EXPECT_GT(firstRingNet, 0);
}

// The planner and the gdr transport read RIDGE_GDR_MODE through one parser: each value is
// accepted by both or by neither, forcing the same option.
TEST(CostModelGdr, PlannerAndTransportAcceptTheSameGdrModes) {
  struct Case {
    const char* text;
    bool valid;
    int forced;  // GdrOption, -1 none forced (off, auto)
  };
  const Case cases[] = {{"", true, -1},          {"off", true, -1},     {"OFF", true, -1},
                        {"auto", true, -1},      {"AUTO", true, -1},    {"Auto", true, -1},
                        {"read", true, 0},       {"gdr-read", true, 0}, {"WRITE", true, 1},
                        {"gdr-write", true, 1},  {"staged", true, 2},   {"Host-Staged", true, 2},
                        {"sideways", false, -1}, {"rea", false, -1},    {"off ", false, -1},
                        {"gdr_read", false, -1}, {"autos", false, -1},  {"hoststaged", false, -1}};
  for (const Case& c : cases) {
    setenv("RIDGE_GDR_MODE", c.text, 1);
    std::optional<topo::GdrOption> planner;
    const bool plannerOk = gdrModeFromSettings(&planner).isOk();
    gdr::Mode transport = gdr::Mode::Read;
    const bool transportForced = gdr::parseMode(c.text, &transport);
    EXPECT_EQ(plannerOk, c.valid) << "'" << c.text << "'";
    EXPECT_EQ(transportForced, c.forced >= 0) << "'" << c.text << "'";
    if (c.forced >= 0) {
      ASSERT_TRUE(planner.has_value()) << c.text;
      EXPECT_EQ(static_cast<int>(*planner), c.forced) << c.text;
      EXPECT_EQ(gdr::toGdrOption(transport), *planner) << c.text;
    } else if (c.valid) {
      EXPECT_FALSE(planner.has_value()) << c.text;
    }
    // The net transport steps aside for every value but off (an invalid one included, so
    // that the gdr transport reports it).
    topo::GdrModeSetting m;
    const bool off = topo::parseGdrModeSetting(c.text, &m) && m.kind == topo::GdrModeSetting::Kind::Off;
    EXPECT_EQ(gdrModeOn(), !off) << "'" << c.text << "'";
  }
  unsetenv("RIDGE_GDR_MODE");
  EXPECT_FALSE(gdrModeOn());
}

TEST(CostModelGdr, RidgeGdrModeForcesOrLeavesItToTheAdvisor) {
  std::optional<topo::GdrOption> m;
  setenv("RIDGE_GDR_MODE", "staged", 1);
  ASSERT_TRUE(gdrModeFromSettings(&m).isOk());
  EXPECT_EQ(m, topo::GdrOption::HostStaged);
  setenv("RIDGE_GDR_MODE", "gdr-write", 1);
  ASSERT_TRUE(gdrModeFromSettings(&m).isOk());
  EXPECT_EQ(m, topo::GdrOption::GdrWrite);
  setenv("RIDGE_GDR_MODE", "auto", 1);
  ASSERT_TRUE(gdrModeFromSettings(&m).isOk());
  EXPECT_FALSE(m.has_value());
  setenv("RIDGE_GDR_MODE", "sideways", 1);
  EXPECT_FALSE(gdrModeFromSettings(&m).isOk());
  unsetenv("RIDGE_GDR_MODE");
  ASSERT_TRUE(gdrModeFromSettings(&m).isOk());
  EXPECT_FALSE(m.has_value());
  // TCP sends leave from host memory, whatever the advisor would pick.
  {
    auto t = testing::preset("dgx-h100");
    PlanRequest req;
    req.nodes = 2;
    req.ranksPerNode = 8;
    req.nranks = 16;
    ASSERT_TRUE(parseNetworkSpec("rails=8,transport=tcp", &req.network, &req.tcp).isOk());
    // A forced GDR mode does not override TCP: nothing reaches the NIC but host memory.
    req.search.forcedGdrMode = topo::GdrOption::GdrRead;
    Plan tcp;
    ASSERT_TRUE(buildPlan(t, req, &tcp).isOk());
    for (const NicPairMode& pm : tcp.node->nicModes) {
      EXPECT_EQ(pm.option, topo::GdrOption::HostStaged);
      EXPECT_EQ(pm.why, "TCP: sends leave from host memory");
    }
    // Both ends of every network edge, rings and trees (receives on GPUs under the NIC's
    // own switch would be GPUDirect over RDMA).
    int netEdges = 0;
    for (const std::vector<Channel>* set : {&tcp.rings, &tcp.trees})
      for (const Channel& ch : *set)
        for (const Edge& e : ch.edges) {
          if (e.transport == Transport::Net) ADD_FAILURE() << "an RDMA edge in a TCP plan";
          if (e.transport != Transport::Tcp) continue;
          ++netEdges;
          EXPECT_EQ(e.sendMode, NetMode::HostStaged) << e.from << "->" << e.to;
          EXPECT_EQ(e.recvMode, NetMode::HostStaged) << e.from << "->" << e.to;
        }
    EXPECT_GT(netEdges, 0);
  }
  // Forced host staging on DGX H100: no GPUDirect send anywhere, so no PXN relay either.
  auto p = gdrPlan("dgx-h100", 2, 8, topo::GdrOption::HostStaged);
  int stagedNet = 0;
  for (const Channel& ring : p->rings)
    for (const Edge& e : ring.edges)
      if (e.transport == Transport::Net) {
        ++stagedNet;
        EXPECT_EQ(e.sendMode, NetMode::HostStaged);
      }
  EXPECT_GT(stagedNet, 0) << "two nodes: the rings must cross the network";
}

// ---- hierarchical and tree forms beyond allreduce ---------------------------------------

const Coll kRootedAndGathers[] = {Coll::Broadcast, Coll::Reduce, Coll::AllGather, Coll::ReduceScatter};

TEST(CostModelHier, EveryCollectiveButAlltoallHasAHierarchicalForm) {
  const int nodes = 64, k = 8;
  CostModel m(shared(buildOrDie("dgx-h100", nodes, 0, "rails=8,nic=400G,tiers=leaf:64:400G,spine:64:400G")));
  for (Coll c : kRootedAndGathers) {
    const Estimate h = m.estimate(c, kLarge, Algorithm::Hier);
    ASSERT_TRUE(h.valid) << collName(c);
    // The inter-node phase is the only one on the NICs: each rail carries the busbw factor
    // over nodes of a 1/k shard (allgather/reduce-scatter (N-1)/N, broadcast/reduce 1).
    double nicOut = -1;
    for (const ResourceLoad& l : m.loads(h, 1000))
      if (l.name.rfind("NIC0 port out", 0) == 0) nicOut = l.bytes;
    const double expected = static_cast<double>(kLarge) * busBandwidthFactor(c, nodes) / k;
    EXPECT_NEAR(nicOut, expected, 1e-6 * expected) << collName(c);
  }
  EXPECT_FALSE(m.estimate(Coll::AlltoAll, kLarge, Algorithm::Hier).valid);
  // Fewer steps: (N-1) network + (k-1) local hops against n-1 ring hops, so at scale the
  // hierarchical allgather and reduce-scatter win small and mid sizes over the ring.
  for (Coll c : {Coll::AllGather, Coll::ReduceScatter}) {
    const Estimate b = m.best(c, 1 << 20);
    EXPECT_EQ(b.algo, Algorithm::Hier) << collName(c);
    EXPECT_LT(b.timeUs, m.estimate(c, 1 << 20, Algorithm::Ring).timeUs);
  }
  // Broadcast and reduce: the double binary tree is shallower still.
  EXPECT_EQ(m.best(Coll::Broadcast, 8).algo, Algorithm::Tree);
  EXPECT_EQ(m.best(Coll::Reduce, 8).algo, Algorithm::Tree);
  // A rule forces the hierarchical form for a collective that now has one.
  std::vector<AlgoRule> rules;
  std::string bad;
  ASSERT_TRUE(parseAlgoRules("broadcast:0-:hier", &rules, &bad));
  EXPECT_EQ(m.best(Coll::Broadcast, 8, &rules).algo, Algorithm::Hier);
}

// Every algorithm of every collective: no resource is busy longer than the predicted time
// (no link carries more than its bandwidth allows), and the choice is deterministic.
// Bytes one ring edge carries per message byte, from the algorithm's steps (not from the
// model): allreduce sends each of n blocks twice around (n-1 hops each), allgather and
// reduce-scatter once; broadcast and reduce pipeline the whole message over every edge.
double ringEdgeShare(Coll c, int n) {
  switch (c) {
    case Coll::AllReduce: return 2.0 * (n - 1) / n;
    case Coll::AllGather:
    case Coll::ReduceScatter: return static_cast<double>(n - 1) / n;
    case Coll::Broadcast:
    case Coll::Reduce: return 1.0;
    case Coll::AlltoAll: break;
  }
  return 0;
}

// The model's ring loads against a recount from the plan's own edges: every edge of the
// channels in use puts its share on the resources of its routes (sending and receiving
// node); nodes are alike, so one node's load is the total over N. The model must agree
// resource by resource, and its time can be no shorter than the busiest resource needs.
TEST(CostModelHier, RingLoadsMatchARecountFromThePlanEdgesAndChoicesAreDeterministic) {
  for (const char* name : {"dgx-h100", "pcie-8gpu-2socket", "cross-rc"}) {
    for (int nodes : {1, 3, 16}) {
      const std::string net = "rails=8,nic=400G,tiers=leaf:8:400G,spine:64:400G";
      auto plan = shared(buildOrDie(name, nodes, 0, net));
      CostModel a(plan);
      CostModel b(shared(buildOrDie(name, nodes, 0, net)));
      const NodeTemplate& t = *plan->node;
      const ResourceTable& rt = t.resources;
      for (int c = 0; c < kCollCount; ++c)
        for (size_t bytes = 8; bytes <= (size_t{1} << 32); bytes *= 64) {
          const Coll coll = static_cast<Coll>(c);
          const Estimate e = a.estimate(coll, bytes, Algorithm::Ring);
          if (e.valid) {
            const std::string what = std::string(name) + " x" + std::to_string(nodes) + " " + collName(coll) +
                                     " " + std::to_string(bytes) + " B, " + std::to_string(e.channels) +
                                     " ch";
            std::vector<double> recount(rt.capacityGBs.size(), 0.0);
            const double share = ringEdgeShare(coll, plan->nranks) * static_cast<double>(bytes) / e.channels;
            for (int ch = 0; ch < e.channels; ++ch)
              for (const Edge& edge : plan->rings[static_cast<size_t>(ch)].edges)
                for (int route : {edge.route, edge.recvRoute}) {
                  if (route < 0) continue;
                  for (const ResourceUse& u : t.routes[static_cast<size_t>(route)].uses)
                    recount[static_cast<size_t>(u.resource)] += share * u.weight / nodes;
                }
            std::map<std::string, double> modeled;
            for (const ResourceLoad& l : a.loads(e, 1u << 20)) modeled[l.name] = l.bytes;
            for (size_t r = 0; r < recount.size(); ++r) {
              const auto it = modeled.find(rt.names[r]);
              const double m = it == modeled.end() ? 0 : it->second;
              EXPECT_NEAR(m, recount[r], 1e-6 * recount[r] + 1e-3) << what << ": " << rt.names[r];
              if (std::isfinite(rt.capacityGBs[r]) && recount[r] > 0) {
                EXPECT_GE(e.timeUs * (1 + 1e-9), recount[r] / (rt.capacityGBs[r] * 1e3))
                    << what << ": " << rt.names[r] << " needs longer than the estimate";
              }
            }
          }
          const Estimate x = a.best(coll, bytes), y = b.best(coll, bytes);
          EXPECT_EQ(x.algo, y.algo);
          EXPECT_EQ(x.proto, y.proto);
          EXPECT_EQ(x.channels, y.channels);
          EXPECT_DOUBLE_EQ(x.timeUs, y.timeUs);
        }
    }
  }
}

}  // namespace
}  // namespace ridge::plan
