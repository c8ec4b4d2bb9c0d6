// Presets and plan-building helpers shared by the planner tests.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "plan/plan.h"
#include "topo/presets.h"

namespace ridge::plan::testing {

inline std::shared_ptr<const topo::Topology> preset(const std::string& name) {
  auto t = std::make_shared<topo::Topology>();
  Status s = topo::loadPreset(name, t.get());
  EXPECT_TRUE(s.isOk()) << s.message();
  return t;
}

inline Plan buildOrDie(const std::string& presetName, int nodes, int ranksPerNode = 0,
                       const std::string& network = "rails=8,nic=400G") {
  auto t = preset(presetName);
  PlanRequest req;
  req.nodes = nodes;
  req.ranksPerNode = ranksPerNode > 0 ? ranksPerNode : static_cast<int>(t->gpus().size());
  req.nranks = nodes * req.ranksPerNode;
  Status s = parseNetworkSpec(network, &req.network, &req.tcp);
  EXPECT_TRUE(s.isOk()) << s.message();
  Plan p;
  s = buildPlan(t, req, &p);
  EXPECT_TRUE(s.isOk()) << s.message();
  return p;
}

}  // namespace ridge::plan::testing
