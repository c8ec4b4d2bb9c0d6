// ridge-topo plan / simulate through their entry points (tools/topo_plan_commands.cpp) on
// presets, output captured: text, JSON and dot, usage errors, and 4096 nodes x 8 GPUs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/json.h"
#include "plan_fixtures.h"
#include "time_scale.h"
#include "tools/topo_commands.h"

namespace ridge::tools {
namespace {

// Runs `fn` with stdout redirected to a temporary file and returns what it printed.
template <typename Fn>
std::string captureStdout(Fn fn, int* rc) {
  std::fflush(stdout);
  char path[] = "/tmp/ridge-plan-out-XXXXXX";
  const int fd = mkstemp(path);
  const int saved = dup(1);
  dup2(fd, 1);
  *rc = fn();
  std::fflush(stdout);
  dup2(saved, 1);
  close(saved);
  std::string out;
  FILE* f = std::fopen(path, "r");
  char buf[65536];
  size_t n;
  while (f && (n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  if (f) std::fclose(f);
  close(fd);
  unlink(path);
  return out;
}

TEST(PlanCommand, TextJsonAndDot) {
  auto t = plan::testing::preset("dgx-h100");
  CommonOptions common;
  int rc = -1;
  std::string text = captureStdout(
      [&] {
        return runPlanCommand(*t, common, {"-n", "16", "--network", "rails=8,nic=400G"});
      },
      &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(text.find("2 nodes x 8 GPUs"), std::string::npos) << text;
  EXPECT_NE(text.find("gdr-write"), std::string::npos) << text;
  EXPECT_NE(text.find("double binary tree"), std::string::npos) << text;
  std::printf("%s", text.c_str());

  common.format = OutputFormat::Json;
  std::string js = captureStdout([&] { return runPlanCommand(*t, common, {"-n", "16"}); }, &rc);
  EXPECT_EQ(rc, 0);
  json::Value doc;
  ASSERT_TRUE(json::parse(js, "plan --json", &doc).isOk()) << js.substr(0, 200);
  EXPECT_EQ(doc.get("nranks")->asNumber(), 16);
  EXPECT_TRUE(doc.get("channels")->isArray());

  common.format = OutputFormat::Text;
  std::string dot = captureStdout([&] { return runPlanCommand(*t, common, {"-n", "16", "--dot"}); }, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(dot.rfind("digraph plan {", 0), 0u) << dot.substr(0, 100);
  // One row per channel (ids cC_rR); channel 0's hop between the nodes is a network edge.
  EXPECT_NE(dot.find("c0_r7 -> c0_r8 [color=red, penwidth="), std::string::npos) << "ring edge between nodes";

  EXPECT_EQ(runPlanCommand(*t, common, {"-n", "15", "--nodes", "2"}), 1)
      << "15 ranks do not split over 2 nodes";
  EXPECT_EQ(runPlanCommand(*t, common, {"--bogus"}), 2);
  EXPECT_EQ(runPlanCommand(*t, common, {"-n", "16", "--network", "rails=x"}), 2);
}

// The plan says which mode each network send takes and why; RIDGE_GDR_MODE forces one
// and a value the planner does not know is a usage error.
TEST(PlanCommand, NetworkSendsShowTheGdrMode) {
  auto t = plan::testing::preset("cross-rc");
  CommonOptions common;
  int rc = -1;
  const std::vector<std::string> args = {"--nodes", "2", "--network", "nic=400G"};
  std::string text = captureStdout([&] { return runPlanCommand(*t, common, args); }, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(text.find("GPU0 -> NIC0: gdr-write, 47.89 GB/s"), std::string::npos) << text;
  EXPECT_NE(text.find("GDR advisor (latency)"), std::string::npos) << text;
  common.format = OutputFormat::Json;
  std::string js = captureStdout([&] { return runPlanCommand(*t, common, args); }, &rc);
  json::Value doc;
  ASSERT_TRUE(json::parse(js, "plan --json", &doc).isOk()) << js.substr(0, 200);
  const json::Value* sends = doc.get("node")->get("networkSends");
  ASSERT_TRUE(sends && sends->isArray() && sends->size() > 0) << js.substr(0, 400);
  for (const json::Value& x : sends->items()) EXPECT_EQ(x.get("mode")->asString(), "gdr-write");
  common.format = OutputFormat::Text;
  setenv("RIDGE_GDR_MODE", "staged", 1);
  text = captureStdout([&] { return runPlanCommand(*t, common, args); }, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(text.find("GPU0 -> NIC0: host-staged"), std::string::npos) << text;
  EXPECT_NE(text.find("forced by RIDGE_GDR_MODE"), std::string::npos) << text;
  setenv("RIDGE_GDR_MODE", "sideways", 1);
  EXPECT_EQ(runPlanCommand(*t, common, args), 2);
  unsetenv("RIDGE_GDR_MODE");
}

TEST(SimulateCommand, FourThousandNodesTableAndLoads) {
  auto t = plan::testing::preset("dgx-h100");
  CommonOptions common;
  int rc = -1;
  const auto start = std::chrono::steady_clock::now();
  std::string text = captureStdout(
      [&] {
        return runSimulateCommand(
            *t, common,
            {"--nodes", "4096", "--network", "rails=8,nic=400G,tiers=leaf:64:400G,spine:64:400G,core:64:400G",
             "--collective", "allreduce,allgather", "-b", "8", "-e", "1G", "-f", "32"});
      },
      &rc);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(rc, 0);
  EXPECT_LT(s, ridgetest::scaledSeconds(10.0));
  std::printf("%s(%.2f s)\n", text.c_str(), s);
  EXPECT_NE(text.find("32768 ranks"), std::string::npos);
  EXPECT_NE(text.find("allreduce"), std::string::npos);
  EXPECT_NE(text.find("busiest resources"), std::string::npos);

  common.format = OutputFormat::Json;
  std::string js = captureStdout(
      [&] {
        return runSimulateCommand(*t, common, {"--nodes", "2", "--algo", "allreduce:0-:tree", "-e", "1M"});
      },
      &rc);
  EXPECT_EQ(rc, 0);
  json::Value doc;
  ASSERT_TRUE(json::parse(js, "simulate --json", &doc).isOk());
  for (const json::Value& r : doc.get("results")->items())
    if (r.get("collective")->asString() == "allreduce") {
      EXPECT_EQ(r.get("algo")->asString(), "tree");
    }
  EXPECT_EQ(runSimulateCommand(*t, CommonOptions{}, {"--algo", "allreduce:x:ring"}), 2);
}

}  // namespace
}  // namespace ridge::tools
