// GDR advisor on hand-built placements: shared switch, across the root complex, across the
// socket link, and platforms where some options are impossible.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "topo/gdr_advisor.h"

namespace ridge::topo {
namespace {

const PcieConstants kDefaults{};

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// GPU and NIC (Gen5 x16 each) under one PCIe switch whose upstream port is Gen5 x16.
GdrPlacement sharedSwitch() {
  GdrPlacement p;
  p.gpu = "GPU0";
  p.nic = "NIC0";
  p.gpuToNic.hops = {Hop::link(5, 16), Hop::pcieSwitch(), Hop::link(5, 16)};
  p.gpuToNic.completer = Completer::NicMemory;
  p.gpuToHostMemory.hops = {Hop::link(5, 16), Hop::pcieSwitch(), Hop::link(5, 16), Hop::rootComplex()};
  p.nicToHostMemory = p.gpuToHostMemory;
  return p;
}

// GPU and NIC on two root ports of one root complex.
GdrPlacement acrossRootComplex() {
  GdrPlacement p;
  p.gpu = "GPU1";
  p.nic = "NIC0";
  p.gpuToNic.hops = {Hop::link(5, 16), Hop::rootComplex(), Hop::link(5, 16)};
  p.gpuToNic.completer = Completer::NicMemory;
  p.gpuToHostMemory.hops = {Hop::link(5, 16), Hop::rootComplex()};
  p.nicToHostMemory.hops = {Hop::link(5, 16), Hop::rootComplex()};
  return p;
}

// GPU on socket 0, NIC on socket 1; the staging memory is on the NIC's NUMA node.
GdrPlacement acrossSockets() {
  GdrPlacement p;
  p.gpu = "GPU2";
  p.nic = "NIC1";
  p.gpuToNic.hops = {Hop::link(5, 16), Hop::rootComplex(), Hop::socketLink(), Hop::rootComplex(),
                     Hop::link(5, 16)};
  p.gpuToNic.completer = Completer::NicMemory;
  p.gpuToHostMemory.hops = {Hop::link(5, 16), Hop::rootComplex(), Hop::socketLink()};
  p.nicToHostMemory.hops = {Hop::link(5, 16), Hop::rootComplex()};
  return p;
}

// The model, not a class table, makes the choice: the chosen option is never clearly behind
// another possible one on large-message bandwidth.
void expectChoiceFollowsTheModel(const GdrAdvice& a) {
  double best = 0;
  for (const GdrOptionEstimate& e : a.options) {
    if (e.possible) best = std::max(best, e.largeBandwidthGBs);
  }
  if (best > 0) {
    EXPECT_GE(a.estimate(a.chosen).largeBandwidthGBs, best * (1 - kDefaults.advisor_bandwidth_tie_fraction))
        << gdrAdviceText(a);
  }
  EXPECT_FALSE(a.reason.empty());
  EXPECT_EQ(a.reason.find('\n'), std::string::npos) << "the reason is one line";
}

TEST(GdrAdvisor, ClassifiesRoutes) {
  EXPECT_EQ(classifyRoute(sharedSwitch().gpuToNic), PlacementClass::PIX);
  Route twoSwitches = sharedSwitch().gpuToNic;
  twoSwitches.hops.insert(twoSwitches.hops.begin() + 1, {Hop::pcieSwitch(), Hop::link(5, 16)});
  EXPECT_EQ(classifyRoute(twoSwitches), PlacementClass::PXB);
  EXPECT_EQ(classifyRoute(acrossRootComplex().gpuToNic), PlacementClass::PHB);
  EXPECT_EQ(classifyRoute(acrossSockets().gpuToNic), PlacementClass::SYS);
  Route twoHostBridges = acrossRootComplex().gpuToNic;
  twoHostBridges.hops.insert(twoHostBridges.hops.begin() + 1, Hop::rootComplex());
  EXPECT_EQ(classifyRoute(twoHostBridges), PlacementClass::NODE);
}

TEST(GdrAdvisor, SharedSwitchReadsGpuMemory) {
  GdrAdvice a = adviseGdr(sharedSwitch(), kDefaults);
  EXPECT_EQ(a.pathClass, PlacementClass::PIX);
  EXPECT_EQ(a.chosen, GdrOption::GdrRead) << gdrAdviceText(a);
  EXPECT_TRUE(contains(a.reason, "share a PCIe switch")) << a.reason;
  EXPECT_TRUE(contains(a.reason, "no staging copy")) << a.reason;
  // Reads answered in 256 B completions at Gen5 x16: 63 x 512/552 GB/s.
  EXPECT_NEAR(a.estimate(GdrOption::GdrRead).largeBandwidthGBs, 63.0 * 512 / 552, 0.5);
  expectChoiceFollowsTheModel(a);
}

TEST(GdrAdvisor, AcrossTheRootComplexWritesAndSaysWhy) {
  for (bool nicMemory : {false, true}) {
    GdrPlacement p = acrossRootComplex();
    p.nicStagingMemory = nicMemory;
    GdrAdvice a = adviseGdr(p, kDefaults);
    EXPECT_EQ(a.pathClass, PlacementClass::PHB);
    EXPECT_EQ(a.chosen, GdrOption::GdrWrite) << gdrAdviceText(a);
    EXPECT_TRUE(contains(a.reason, "root complex")) << a.reason;
    // Why the classic path lost: two crossings and the CPU's P2P read forwarding.
    EXPECT_TRUE(contains(a.reason, "twice")) << a.reason;
    EXPECT_TRUE(contains(a.reason, "P2P read forwarding")) << a.reason;
    EXPECT_LT(a.estimate(GdrOption::GdrRead).largeBandwidthGBs,
              a.estimate(GdrOption::GdrWrite).largeBandwidthGBs);
    // gdr-write starts sooner than host staging: the GPU rings the doorbell itself.
    EXPECT_LT(a.estimate(GdrOption::GdrWrite).latencyNs[0], a.estimate(GdrOption::HostStaged).latencyNs[0]);
    if (nicMemory) {
      EXPECT_FALSE(a.estimate(GdrOption::GdrWrite).otherTier.empty());
    } else {
      EXPECT_EQ(a.estimate(GdrOption::GdrWrite).staging, StagingTier::HostMemory);
    }
    expectChoiceFollowsTheModel(a);
  }
}

TEST(GdrAdvisor, AcrossSocketsAvoidsPeerReads) {
  for (bool nicMemory : {false, true}) {
    GdrPlacement p = acrossSockets();
    p.nicStagingMemory = nicMemory;
    GdrAdvice a = adviseGdr(p, kDefaults);
    EXPECT_EQ(a.pathClass, PlacementClass::SYS);
    EXPECT_NE(a.chosen, GdrOption::GdrRead) << gdrAdviceText(a);
    EXPECT_TRUE(contains(a.reason, "socket link")) << a.reason;
    // Peer reads across sockets get the measured ~11 GB/s.
    EXPECT_NEAR(a.estimate(GdrOption::GdrRead).largeBandwidthGBs, kDefaults.socket_peer_read_gbs, 0.1);
    expectChoiceFollowsTheModel(a);
  }
}

TEST(GdrAdvisor, TheModelDecidesNotTheClass) {
  // A CPU that forwards peer reads at full rate and peer writes badly: across the root complex
  // reading GPU memory now wins on the numbers, and the reason says what held gdr-write back.
  PcieConstants c;
  c.rc_peer_read_fraction = 1;
  c.rc_peer_write_fraction = 0.3;
  GdrPlacement p = acrossRootComplex();
  p.nicStagingMemory = true;
  p.hostStaging = false;
  GdrAdvice a = adviseGdr(p, c);
  EXPECT_EQ(a.chosen, GdrOption::GdrRead) << gdrAdviceText(a);
  EXPECT_TRUE(contains(a.reason, "gdr-write")) << a.reason;
  EXPECT_EQ(a.decidedBy, "bandwidth");
}

TEST(GdrAdvisor, ImpossibleOptions) {
  GdrPlacement p = sharedSwitch();
  p.nicReadsGpuMemory = false;
  GdrAdvice a = adviseGdr(p, kDefaults);
  EXPECT_NE(a.chosen, GdrOption::GdrRead);
  EXPECT_FALSE(a.estimate(GdrOption::GdrRead).possible);
  EXPECT_TRUE(contains(a.estimate(GdrOption::GdrRead).whyNot, "dma-buf"));

  p.gpuRingsNicDoorbell = false;
  a = adviseGdr(p, kDefaults);
  EXPECT_EQ(a.chosen, GdrOption::HostStaged);
  EXPECT_EQ(a.decidedBy, "only option");
  EXPECT_TRUE(contains(a.reason, "only possible option")) << a.reason;

  p.hostStaging = false;
  a = adviseGdr(p, kDefaults);
  EXPECT_EQ(a.chosen, GdrOption::HostStaged);
  EXPECT_EQ(a.decidedBy, "nothing possible");
  EXPECT_TRUE(contains(a.reason, "no option is possible")) << a.reason;
}

TEST(GdrAdvisor, ANicWithoutRdmaIsNoTarget) {
  GdrPlacement p = sharedSwitch();  // the best placement there is: PIX
  p.nicRdma = false;
  const GdrAdvice a = adviseGdr(p, kDefaults);
  for (const GdrOptionEstimate& e : a.options) {
    EXPECT_FALSE(e.possible) << gdrOptionName(e.option);
    EXPECT_TRUE(contains(e.whyNot, "no RDMA")) << e.whyNot;
  }
  EXPECT_EQ(a.decidedBy, "nothing possible");
}

TEST(GdrAdvisor, NicPortCapsEveryOption) {
  GdrPlacement p = sharedSwitch();
  p.nicPortGBs = 25;  // 200G
  GdrAdvice a = adviseGdr(p, kDefaults);
  for (const GdrOptionEstimate& e : a.options) EXPECT_LE(e.steadyBandwidthGBs, 25);
  // All options now move as much; the latency or the PIX rule decides.
  EXPECT_TRUE(a.decidedBy == "latency" || a.decidedBy == "class rule") << a.decidedBy;
  expectChoiceFollowsTheModel(a);
}

TEST(GdrAdvisor, LatenciesGrowWithSizeAndStagesAddUp) {
  GdrAdvice a = adviseGdr(acrossRootComplex(), kDefaults);
  for (const GdrOptionEstimate& e : a.options) {
    ASSERT_EQ(e.latencyNs.size(), 2u);
    EXPECT_LT(e.latencyNs[0], e.latencyNs[1]) << gdrOptionName(e.option);
    double sum = 0;
    for (const GdrStage& s : e.stages) sum += s.smallNs;
    EXPECT_NEAR(sum, e.latencyNs[0], 1e-6) << gdrOptionName(e.option);
    EXPECT_GT(e.largeBandwidthGBs, 0);
    EXPECT_LE(e.largeBandwidthGBs, e.steadyBandwidthGBs);
  }
}

TEST(GdrAdvisor, RendersRowsTextAndJson) {
  GdrAdvice a = adviseGdr(acrossRootComplex(), kDefaults);
  auto rows = gdrAdviceRows(a);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0][0], "option");
  EXPECT_EQ(rows[0][3], "8 B us");
  EXPECT_EQ(rows[0][4], "4 KiB us");
  EXPECT_EQ(rows[0][5], "64 MiB GB/s");
  for (size_t i = 1; i < rows.size(); ++i) EXPECT_EQ(rows[i].size(), rows[0].size());
  EXPECT_EQ(rows[2][0], "gdr-write");
  EXPECT_EQ(rows[2].back(), "<- chosen");

  std::string text = gdrAdviceText(a);
  EXPECT_TRUE(contains(text, "GPU1 -> NIC0 (PHB): gdr-write: ")) << text;

  std::string json = gdrAdviceJson(a);
  EXPECT_EQ(json.front(), '{');
  EXPECT_EQ(json.back(), '}');
  EXPECT_TRUE(contains(json, "\"chosen\":\"gdr-write\"")) << json;
  EXPECT_TRUE(contains(json, "\"class\":\"PHB\"")) << json;
  EXPECT_TRUE(contains(json, "\"latency_ns\":{\"8\":")) << json;
  EXPECT_EQ(std::count(json.begin(), json.end(), '{'), std::count(json.begin(), json.end(), '}'));
  EXPECT_EQ(std::count(json.begin(), json.end(), '['), std::count(json.begin(), json.end(), ']'));

  EXPECT_EQ(sizeLabel(8), "8 B");
  EXPECT_EQ(sizeLabel(4096), "4 KiB");
  EXPECT_EQ(sizeLabel(uint64_t{64} << 20), "64 MiB");
  EXPECT_EQ(sizeLabel(1000), "1000 B");
}

}  // namespace
}  // namespace ridge::topo
