// ridge-plan-scale: how long building a plan takes and how much memory it holds, for
// 8 to 4096 nodes of 8 GPUs (docs/performance.md, "Planner scale").
//
//   ridge-plan-scale [--preset dgx-h100] [--network SPEC] [--nodes 8,64,512,4096] [--repeat 3]
//
// Time is the best of `repeat` builds (search, rings, trees, rails). Memory is what the
// plan's containers hold (sum of their capacities: deterministic, independent of the
// allocator), plus the process's peak RSS after the largest so far. The cost-model column
// prices allreduce at 8 B and 1 GiB (both algorithms' load profiles over every node).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "plan/cost.h"
#include "plan/plan.h"
#include "topo/presets.h"

namespace {

using Clock = std::chrono::steady_clock;

template <typename T>
size_t bytesOf(const std::vector<T>& v) {
  return v.capacity() * sizeof(T);
}

size_t planBytes(const ridge::plan::Plan& p) {
  size_t b = sizeof p;
  for (const auto* list : {&p.rings, &p.trees, &p.rails})
    for (const ridge::plan::Channel& c : *list)
      b += sizeof c + bytesOf(c.ranks) + bytesOf(c.parent) + bytesOf(c.edges);
  return b;
}

double peakRssMiB() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string presetName = "dgx-h100";
  std::string network = "rails=8,nic=400G,tiers=leaf:64:400G,spine:64:400G,core:64:400G";
  std::vector<int> nodeCounts = {8, 64, 512, 4096};
  int repeat = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--preset" && i + 1 < argc) {
      presetName = argv[++i];
    } else if (a == "--network" && i + 1 < argc) {
      network = argv[++i];
    } else if (a == "--repeat" && i + 1 < argc) {
      repeat = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--nodes" && i + 1 < argc) {
      nodeCounts.clear();
      std::stringstream ss(argv[++i]);
      std::string n;
      while (std::getline(ss, n, ',')) nodeCounts.push_back(std::atoi(n.c_str()));
    } else {
      std::fprintf(stderr, "usage: %s [--preset NAME] [--network SPEC] [--nodes N,N,...] [--repeat R]\n",
                   argv[0]);
      return 2;
    }
  }
  auto topo = std::make_shared<ridge::topo::Topology>();
  ridge::Status s = ridge::topo::loadPreset(presetName, topo.get());
  if (!s.isOk()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 1;
  }
  const int gpus = static_cast<int>(topo->gpus().size());
  std::printf("preset %s (%d GPUs per node), network %s, best of %d\n", presetName.c_str(), gpus,
              network.c_str(), repeat);
  std::printf("%7s %8s %9s %12s %12s %12s %14s %13s\n", "nodes", "ranks", "channels", "build (ms)",
              "plan (MiB)", "bytes/rank", "peak RSS (MiB)", "cost (ms)");
  for (int nodes : nodeCounts) {
    ridge::plan::PlanRequest req;
    req.nodes = nodes;
    req.ranksPerNode = gpus;
    req.nranks = nodes * gpus;
    s = ridge::plan::parseNetworkSpec(network, &req.network, &req.tcp);
    if (!s.isOk()) {
      std::fprintf(stderr, "%s\n", s.message().c_str());
      return 2;
    }
    double best = 1e30;
    std::shared_ptr<ridge::plan::Plan> plan;
    for (int r = 0; r < repeat; ++r) {
      auto p = std::make_shared<ridge::plan::Plan>();
      const auto t0 = Clock::now();
      s = ridge::plan::buildPlan(topo, req, p.get());
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (!s.isOk()) {
        std::fprintf(stderr, "%s\n", s.message().c_str());
        return 1;
      }
      best = std::min(best, ms);
      plan = p;
    }
    const auto t0 = Clock::now();
    ridge::plan::CostModel model(plan);
    model.best(ridge::plan::Coll::AllReduce, 8);
    model.best(ridge::plan::Coll::AllReduce, size_t{1} << 30);
    const double costMs = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    const size_t bytes = planBytes(*plan);
    std::printf("%7d %8d %9zu %12.2f %12.2f %12.1f %14.1f %13.2f\n", nodes, req.nranks, plan->rings.size(),
                best, bytes / 1048576.0, static_cast<double>(bytes) / req.nranks, peakRssMiB(), costMs);
  }
  return 0;
}
