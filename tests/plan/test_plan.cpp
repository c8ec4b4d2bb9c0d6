// Properties of the planner's rings and trees on the built-in presets: rings are Hamiltonian
// cycles, trees span with bounded depth and no rank interior in both trees, no resource gets
// more bandwidth than it has, plans are deterministic, the dual-socket PCIe machine's rings
// cross the socket link exactly twice, and on DGX machines every channel has its own NIC.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <set>

#include "plan/plan_io.h"
#include "plan_fixtures.h"
#include "time_scale.h"

namespace ridge::plan {
namespace {

using testing::buildOrDie;
using testing::preset;

const char* const kPresets[] = {"dgx-a100", "dgx-h100", "pcie-8gpu-2socket", "cross-rc"};

void expectHamiltonian(const Plan& p, const Channel& ring, const std::string& what) {
  ASSERT_EQ(static_cast<int>(ring.ranks.size()), p.nranks) << what;
  std::set<int> seen(ring.ranks.begin(), ring.ranks.end());
  EXPECT_EQ(static_cast<int>(seen.size()), p.nranks) << what << ": a rank appears twice";
  EXPECT_EQ(*seen.begin(), 0) << what;
  EXPECT_EQ(*seen.rbegin(), p.nranks - 1) << what;
  // Edges follow the order and close the cycle.
  const size_t expectedEdges = p.nranks > 1 ? static_cast<size_t>(p.nranks) : 0;
  ASSERT_EQ(ring.edges.size(), expectedEdges) << what;
  for (size_t i = 0; i < ring.edges.size(); ++i) {
    EXPECT_EQ(ring.edges[i].from, ring.ranks[i]) << what << " edge " << i;
    EXPECT_EQ(ring.edges[i].to, ring.ranks[(i + 1) % ring.ranks.size()]) << what << " edge " << i;
    const bool crossNode = p.nodeOf(ring.edges[i].from) != p.nodeOf(ring.edges[i].to);
    EXPECT_EQ(crossNode, ring.edges[i].transport == Transport::Net) << what << " edge " << i;
  }
}

TEST(PlanRings, EveryRingIsAHamiltonianCycle) {
  for (const char* name : kPresets) {
    for (int nodes : {1, 2, 3, 5}) {
      Plan p = buildOrDie(name, nodes);
      ASSERT_FALSE(p.rings.empty()) << name;
      for (size_t c = 0; c < p.rings.size(); ++c)
        expectHamiltonian(p, p.rings[c],
                          std::string(name) + " x" + std::to_string(nodes) + " ring " + std::to_string(c));
    }
  }
}

// Sum of every channel's reservation on each resource never exceeds its capacity.
TEST(PlanRings, NoResourceAssignedMoreThanItHas) {
  for (const char* name : kPresets) {
    for (int nodes : {1, 2}) {
      Plan p = buildOrDie(name, nodes);
      const NodeTemplate& t = *p.node;
      std::vector<double> used(t.resources.capacityGBs.size(), 0.0);
      for (const ChannelTemplate& ct : t.channels) {
        std::vector<int> routes = ct.hops;
        if (ct.entryRoute >= 0) routes.push_back(ct.entryRoute);
        if (ct.exitRoute >= 0) routes.push_back(ct.exitRoute);
        for (int r : routes)
          for (const ResourceUse& u : t.routes[static_cast<size_t>(r)].uses)
            used[static_cast<size_t>(u.resource)] += ct.speedGBs * u.weight;
      }
      for (size_t r = 0; r < used.size(); ++r)
        EXPECT_LE(used[r], t.resources.capacityGBs[r] * (1 + 1e-5))
            << name << " x" << nodes << ": " << t.resources.names[r] << " over-assigned";
    }
  }
}

TEST(PlanRings, DeterministicForTheSameInput) {
  for (const char* name : kPresets) {
    Plan a = buildOrDie(name, 3);
    Plan b = buildOrDie(name, 3);
    a.buildMs = b.buildMs = 0;
    std::const_pointer_cast<NodeTemplate>(a.node)->stats.ms = 0;
    std::const_pointer_cast<NodeTemplate>(b.node)->stats.ms = 0;
    EXPECT_EQ(json::write(planJson(a, {}, {})), json::write(planJson(b, {}, {}))) << name;
  }
}

TEST(PlanRings, DualSocketPcieRingsCrossTheSocketLinkExactlyTwice) {
  for (int nodes : {1, 2}) {
    Plan p = buildOrDie("pcie-8gpu-2socket", nodes);
    for (const ChannelTemplate& ct : p.node->channels)
      EXPECT_EQ(ct.socketCrossings, 2) << "every ring on the dual-socket PCIe preset crosses the socket link "
                                          "exactly twice (nodes "
                                       << nodes << ")";
    // Count again from the routes, independently of the search's own bookkeeping.
    const NodeTemplate& t = *p.node;
    for (const Channel& ring : p.rings) {
      int crossings = 0;
      for (const Edge& e : ring.edges) {
        if (p.nodeOf(e.from) != 0 && p.nodeOf(e.to) != 0) continue;
        // A ring's edge inside node 0 or its network edges' node-0 ends.
        if (p.nodeOf(e.from) == 0 && e.route >= 0)
          crossings += t.routes[static_cast<size_t>(e.route)].socketCrossings;
        if (p.nodeOf(e.to) == 0 && e.recvRoute >= 0)
          crossings += t.routes[static_cast<size_t>(e.recvRoute)].socketCrossings;
      }
      EXPECT_EQ(crossings, 2) << "node 0 of a ring, nodes " << nodes;
    }
  }
}

TEST(PlanRings, DgxChannelsEachUseADifferentNic) {
  for (const char* name : {"dgx-a100", "dgx-h100"}) {
    Plan p = buildOrDie(name, 4);
    const NodeTemplate& t = *p.node;
    ASSERT_GE(t.nics.size(), 8u) << name;
    std::set<int> nics;
    for (const ChannelTemplate& ct : t.channels) {
      EXPECT_GE(ct.nic, 0) << name;
      EXPECT_TRUE(nics.insert(ct.nic).second) << name << ": NIC slot " << ct.nic << " used by two channels";
      // Enters through a GPU that shares a PCIe switch with the NIC: GPUDirect both ways.
      EXPECT_EQ(t.routes[static_cast<size_t>(ct.entryRoute)].mode, NetMode::GdrWrite) << name;
      // Leaves GPUDirect (the advisor picks gdr-read on H100, gdr-write into NIC memory on
      // A100, whose preset NICs have it) or relayed over NVLink to the GPU the NIC reads.
      const NetMode exit = t.routes[static_cast<size_t>(ct.exitRoute)].mode;
      EXPECT_TRUE(exit == NetMode::GdrRead || exit == NetMode::GdrWrite || exit == NetMode::Pxn)
          << name << " exit " << netModeName(exit);
    }
    EXPECT_EQ(nics.size(), t.nics.size()) << name << ": every NIC carries a channel";
    // Rail-aligned: the edge between nodes leaves and enters through the same NIC slot.
    for (const Channel& ring : p.rings)
      for (const Edge& e : ring.edges)
        if (e.transport == Transport::Net) {
          EXPECT_EQ(e.nic, ring.nic);
        }
  }
}

TEST(PlanRings, DgxIntraNodeHopsAreNvlinkAndUseTheWholeFabric) {
  Plan h = buildOrDie("dgx-h100", 1);
  double total = 0;
  for (const ChannelTemplate& ct : h.node->channels) {
    total += ct.speedGBs;
    for (int r : ct.hops) EXPECT_EQ(h.node->routes[static_cast<size_t>(r)].transport, Transport::NvLink);
  }
  EXPECT_NEAR(total, 370.8, 0.5);  // 18 lanes x 20.6 GB/s
  Plan a = buildOrDie("dgx-a100", 1);
  total = 0;
  for (const ChannelTemplate& ct : a.node->channels) total += ct.speedGBs;
  EXPECT_NEAR(total, 240, 0.5);  // 12 lanes x 20 GB/s
}

// ---- trees -------------------------------------------------------------------------------

TEST(PlanTrees, InOrderTreeAndItsPartnerNeverShareAnInteriorItem) {
  for (int n = 1; n <= 300; ++n) {
    std::vector<int> parent;
    const int depth = inOrderBinaryTree(n, &parent);
    EXPECT_LE(depth, static_cast<int>(std::ceil(std::log2(n + 1))) - 1 + (n == 1 ? 0 : 0)) << n;
    std::vector<int> children0(static_cast<size_t>(n), 0), children1(static_cast<size_t>(n), 0);
    int roots = 0;
    for (int i = 0; i < n; ++i) {
      if (parent[static_cast<size_t>(i)] < 0) {
        ++roots;
        continue;
      }
      ++children0[static_cast<size_t>(parent[static_cast<size_t>(i)])];
      ++children1[static_cast<size_t>(secondTreeItem(parent[static_cast<size_t>(i)], n))];
    }
    EXPECT_EQ(roots, 1) << n;
    for (int i = 0; i < n; ++i) {
      EXPECT_LE(children0[static_cast<size_t>(i)], 2) << n;
      EXPECT_FALSE(children0[static_cast<size_t>(i)] > 0 && children1[static_cast<size_t>(i)] > 0)
          << "item " << i << " of " << n << " is interior in both trees";
    }
  }
}

// Walks every rank up to the root: spanning, no cycles, depth bounded.
TEST(PlanTrees, TreesSpanWithBoundedDepthAndNoRankInteriorInBoth) {
  for (const char* name : {"dgx-a100", "dgx-h100", "pcie-8gpu-2socket"}) {
    for (int nodes : {1, 2, 5, 16, 33}) {
      Plan p = buildOrDie(name, nodes);
      ASSERT_FALSE(p.trees.empty());
      const int bound = static_cast<int>(std::ceil(std::log2(nodes))) + (p.ranksPerNode - 1);
      for (const Channel& tc : p.trees) {
        for (int r = 0; r < p.nranks; ++r) {
          int cur = r, depth = 0;
          while (tc.parent[static_cast<size_t>(cur)] >= 0 && depth <= p.nranks) {
            cur = tc.parent[static_cast<size_t>(cur)];
            ++depth;
          }
          EXPECT_EQ(cur, tc.root) << name << " x" << nodes << " rank " << r << " does not reach the root";
          EXPECT_LE(depth, bound) << name << " x" << nodes << " rank " << r;
        }
      }
      // Pairs (tree 0, tree 1) of one channel: interior = has a child on another node.
      for (size_t c = 0; c + 1 < p.trees.size() && nodes > 1; c += 2) {
        std::vector<int> interior(static_cast<size_t>(p.nranks), 0);
        for (size_t ti = c; ti < c + 2; ++ti) {
          std::vector<char> mark(static_cast<size_t>(p.nranks), 0);
          for (int r = 0; r < p.nranks; ++r) {
            const int par = p.trees[ti].parent[static_cast<size_t>(r)];
            if (par >= 0 && p.nodeOf(par) != p.nodeOf(r)) mark[static_cast<size_t>(par)] = 1;
          }
          for (int r = 0; r < p.nranks; ++r) interior[static_cast<size_t>(r)] += mark[static_cast<size_t>(r)];
        }
        for (int r = 0; r < p.nranks; ++r)
          EXPECT_LE(interior[static_cast<size_t>(r)], 1)
              << name << " x" << nodes << " rank " << r << " trees " << c;
      }
    }
  }
}

TEST(PlanHier, RailsAreInterNodeRingsOfOneLocalIndexEach) {
  Plan p = buildOrDie("dgx-a100", 4);
  ASSERT_EQ(static_cast<int>(p.rails.size()), p.ranksPerNode);
  std::map<int, int> perNic;
  for (const Channel& r : p.rails) {
    ASSERT_EQ(static_cast<int>(r.ranks.size()), p.nodes);
    for (int rank : r.ranks) EXPECT_EQ(p.localOf(rank), r.templateChannel);
    ++perNic[r.nic];
    // GPU g uses a NIC on its own switch, so it sends GPUDirect in the advisor's mode.
    const NetMode mode = p.node->routes[static_cast<size_t>(r.edges.front().route)].mode;
    EXPECT_TRUE(mode == NetMode::GdrRead || mode == NetMode::GdrWrite) << "GPU" << r.templateChannel;
    const NicPairMode& pair =
        p.node->nicModes[static_cast<size_t>(r.templateChannel) * p.node->nics.size() + r.nic];
    // The route takes the pair's mode (the advisor's or the forced one).
    const NetMode expected = pair.option == topo::GdrOption::GdrRead ? NetMode::GdrRead : NetMode::GdrWrite;
    EXPECT_EQ(mode, expected) << pair.why;
  }
  // DGX A100: two GPUs and two NICs per switch, so each NIC serves exactly one GPU.
  for (const auto& [nic, count] : perNic) EXPECT_EQ(count, 1) << "NIC slot " << nic;
}

// ---- network spec, plan files -----------------------------------------------------------

TEST(PlanNetwork, SpecParsesAndFormatsBack) {
  topo::NetworkDescription net;
  bool tcp = true;
  ASSERT_TRUE(
      parseNetworkSpec("rails=8,nic=400G,tiers=leaf:64:400G,spine:64:400G:2:600ns", &net, &tcp).isOk());
  EXPECT_EQ(net.rails, 8);
  EXPECT_DOUBLE_EQ(net.nicGbps, 400);
  ASSERT_EQ(net.tiers.size(), 2u);
  EXPECT_EQ(net.tiers[1].name, "spine");
  EXPECT_EQ(net.tiers[1].radix, 64);
  EXPECT_DOUBLE_EQ(net.tiers[1].oversubscription, 2);
  EXPECT_DOUBLE_EQ(net.tiers[1].latencyNs, 600);
  EXPECT_FALSE(tcp);
  topo::NetworkDescription again;
  ASSERT_TRUE(parseNetworkSpec(formatNetworkSpec(net, false), &again, nullptr).isOk());
  EXPECT_EQ(formatNetworkSpec(again, false), formatNetworkSpec(net, false));
  for (const char* bad : {"rails=x", "nic=fast", "tiers=leaf:1:400G", "colour=blue", "transport=pigeon"})
    EXPECT_FALSE(parseNetworkSpec(bad, &net, &tcp).isOk()) << bad;
}

TEST(PlanFiles, DumpReadsBackAsAForcedPlan) {
  Plan p = buildOrDie("pcie-8gpu-2socket", 2);
  const std::string text = json::write(planJson(p, {}, {}));
  json::Value doc;
  ASSERT_TRUE(json::parse(text, "dump", &doc).isOk());
  ForcedPlan fp;
  Status s = parsePlanJson(doc, "dump", p.nranks, &fp);
  ASSERT_TRUE(s.isOk()) << s.message();
  ASSERT_EQ(fp.rings.size(), p.rings.size());
  for (size_t c = 0; c < p.rings.size(); ++c) EXPECT_EQ(fp.rings[c], p.rings[c].ranks);
  // Wrong rank count and a ring that is not a permutation are refused.
  EXPECT_FALSE(parsePlanJson(doc, "dump", p.nranks + 1, &fp).isOk());
  ASSERT_TRUE(json::parse(R"({"format": "ridge-plan", "version": 1,
                              "channels": [{"kind": "ring", "ranks": [0, 1, 1, 3]}]})",
                          "bad", &doc)
                  .isOk());
  s = parsePlanJson(doc, "bad", 4, &fp);
  EXPECT_NE(s.message().find("appears twice"), std::string::npos) << s.message();
}

TEST(PlanScale, FourThousandNodesBuildQuickly) {
  const auto start = std::chrono::steady_clock::now();
  Plan p = buildOrDie("dgx-h100", 4096, 0, "rails=8,nic=400G,tiers=leaf:64:400G,spine:64:400G,core:64:400G");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(p.nranks, 4096 * 8);
  EXPECT_LT(s, ridgetest::scaledSeconds(5.0))
      << "plan building at 4096 x 8 took " << s << " s";  // target < 1 s (bench), slack for sanitizers
  expectHamiltonian(p, p.rings.front(), "4096 nodes ring 0");
}

}  // namespace
}  // namespace ridge::plan
