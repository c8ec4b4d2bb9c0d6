// The cost model against published NCCL figures (topology-facts.md, "Published figures"),
// and its algorithm choices.
#include <gtest/gtest.h>

#include <cstdio>

#include "plan/cost.h"
#include "plan_fixtures.h"

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

}  // namespace
}  // namespace ridge::plan
