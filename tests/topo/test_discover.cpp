// Live discovery of the machine the tests run on (whatever it has), checked against the
// host summary's independent count and between the hwloc and /sys sources.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>

#include "topo/discover.h"
#include "topo/load.h"
#include "topo/summary.h"

namespace ridge::topo {
namespace {

std::set<std::string> busIds(const Topology& t, NodeKind k) {
  std::set<std::string> ids;
  for (int n : t.nodesOfKind(k)) ids.insert(t.node(n).busId);
  return ids;
}

void checkWellFormed(const Topology& t) {
  ASSERT_TRUE(t.finalized());
  EXPECT_GE(t.nodesOfKind(NodeKind::Numa).size(), 1u);
  EXPECT_FALSE(t.name.empty());
  for (int g : t.gpus()) {
    const Node& n = t.node(g);
    EXPECT_FALSE(n.busId.empty());
    EXPECT_GE(n.numa, 0) << n.name;
    EXPECT_GE(n.hostBridge, 0) << n.name;
  }
  // Every pair of devices has a route whose ends are the devices.
  std::vector<int> devs = t.gpus();
  for (int n : t.nics()) devs.push_back(n);
  for (int a : devs)
    for (int b : devs) {
      const Path p = t.path(a, b);
      ASSERT_FALSE(p.nodes.empty());
      EXPECT_EQ(p.nodes.front(), a);
      EXPECT_EQ(p.nodes.back(), b);
    }
  for (const Link& l : t.links()) {
    if (l.kind != LinkKind::Pcie || l.pcieWidth == 0) continue;
    EXPECT_GT(l.bandwidthGBs, 0);  // a known width and rate give a bandwidth
  }
}

TEST(TopoDiscover, ThisMachine) {
  Topology t;
  Status s = discoverThisMachine(&t);
  ASSERT_TRUE(s.isOk()) << s.message();
  checkWellFormed(t);
  std::printf("[ info ] %s: %zu nodes, %zu GPUs, %zu NICs, discovered in %.2f ms\n", t.source.c_str(),
              t.nodes().size(), t.gpus().size(), t.nics().size(), t.loadMs);
  EXPECT_GT(t.loadMs, 0);
  EXPECT_LT(t.loadMs, 500) << "discovery should take a few ms; 100 ms is the budget on an idle machine";
  // The host summary counts GPUs and NICs on its own (hwloc or sysfs): the graph agrees.
  HostSummary sum;
  ASSERT_TRUE(summarizeThisHost(&sum).isOk());
  EXPECT_EQ(static_cast<int>(t.gpus().size()), sum.gpus);
  EXPECT_EQ(static_cast<int>(t.nics().size()), sum.nics);
  EXPECT_EQ(static_cast<int>(t.nodesOfKind(NodeKind::Package).size()), sum.packages);
  EXPECT_LE(static_cast<int>(t.nodesOfKind(NodeKind::Numa).size()), sum.numaNodes);
  for (int n : t.nics())
    for (const NicPort& p : t.node(n).ports) EXPECT_FALSE(p.name.empty());
}

TEST(TopoDiscover, SysfsAgreesWithHwloc) {
  Topology a, b;
  ASSERT_TRUE(discoverThisMachine(&a).isOk());
  Status s = discoverThisMachineSysfs(&b);
  ASSERT_TRUE(s.isOk()) << s.message();
  checkWellFormed(b);
  EXPECT_EQ(busIds(a, NodeKind::Gpu), busIds(b, NodeKind::Gpu));
  EXPECT_EQ(busIds(a, NodeKind::Nic), busIds(b, NodeKind::Nic));
  EXPECT_EQ(a.nodesOfKind(NodeKind::Package).size(), b.nodesOfKind(NodeKind::Package).size());
  EXPECT_EQ(a.nodesOfKind(NodeKind::Numa).size(), b.nodesOfKind(NodeKind::Numa).size());
  // Same GPUs in the same order (bus order), with the same classes between them.
  for (size_t i = 0; i < a.gpus().size() && i < b.gpus().size(); ++i)
    EXPECT_EQ(a.node(a.gpus()[i]).busId, b.node(b.gpus()[i]).busId);
}

// An NCCL topology file with `gpus` GPUs (bus ids 0000:01:00.0 ...) on one cpu and no NVLink,
// and that file's graph rebuilt with NVML's links, as discovery does.
std::string gpusOnOneCpu(int gpus) {
  std::string file = "<system version=\"1\"><cpu numaid=\"0\">";
  for (int g = 1; g <= gpus; ++g)
    file += "<pci busid=\"0000:0" + std::to_string(g) + ":00.0\" class=\"0x030200\"/>";
  return file + "</cpu></system>";
}

Topology withNvmlLinks(const Topology& base, const std::vector<NvmlGpu>& nvml) {
  Topology t;
  for (const Node& n : base.nodes()) t.addNode(n);
  for (const Link& l : base.links()) t.addLink(l);
  addNvLinksFromNvml(&t, base.root(), nvml);
  EXPECT_TRUE(t.finalize().isOk());
  return t;
}

// NVML's answers for an HGX-like box, made up: on the NCCL file below (4 GPUs, no NVLink),
// GPU0 and GPU1 have 4 direct lanes (each end reports them), and every GPU has 2 lanes to
// each of two NVSwitches (bus ids c0 and c1). sm 90: 20.6 GB/s per lane.
TEST(TopoDiscover, NvmlLinksBecomeNvLinksAndSwitches) {
  Topology base;
  ASSERT_TRUE(loadTopologyText(gpusOnOneCpu(4), "test", &base).isOk());
  std::vector<NvmlGpu> nvml;
  int linkNo = 0;
  for (int g = 1; g <= 4; ++g) {
    NvmlGpu gpu;
    gpu.busId = "0000:0" + std::to_string(g) + ":00.0";
    gpu.smVersion = 90;
    for (const char* sw : {"0000:c0:00.0", "0000:c1:00.0"})
      for (int lane = 0; lane < 2; ++lane) gpu.activeLinks.push_back({linkNo++, sw, NvmlRemote::Switch});
    if (g <= 2)
      for (int lane = 0; lane < 4; ++lane)
        gpu.activeLinks.push_back({linkNo++, g == 1 ? "0000:02:00.0" : "0000:01:00.0", NvmlRemote::Gpu});
    gpu.activeLinks.push_back({linkNo++, gpu.busId, NvmlRemote::Gpu});       // itself: ignored
    gpu.activeLinks.push_back({linkNo++, "0000:99:00.0", NvmlRemote::Gpu});  // not in the tree
    gpu.activeLinks.push_back({linkNo++, "", NvmlRemote::Unknown});          // no remote info
    nvml.push_back(gpu);
  }
  const Topology t = withNvmlLinks(base, nvml);
  ASSERT_TRUE(t.finalized());
  EXPECT_EQ(t.nodesOfKind(NodeKind::NvSwitch).size(), 2u);
  const int g0 = t.find("GPU0"), g1 = t.find("GPU1"), g2 = t.find("GPU2");
  const int direct = t.linkBetween(g0, g1);
  ASSERT_GE(direct, 0);
  EXPECT_EQ(t.link(direct).nvlinkCount, 4);
  EXPECT_NEAR(t.link(direct).bandwidthGBs, 4 * 20.6, 1e-9);
  EXPECT_EQ(t.node(g0).smVersion, 90);
  // GPU0-GPU2: no direct link; two switches with 2 lanes each.
  const Path p = t.path(g0, g2);
  EXPECT_EQ(ncclClassName(p.nccl), std::string("NVL"));
  EXPECT_EQ(p.nvlinks, 4);
  EXPECT_NEAR(p.bandwidthGBs, 4 * 20.6, 1e-9);
  int nvlinkLinks = 0;
  for (const Link& l : t.links()) nvlinkLinks += l.kind == LinkKind::NvLink;
  EXPECT_EQ(nvlinkLinks, 1 + 4 * 2);  // one GPU pair, each GPU to each switch
}

// POWER's GPU-CPU NVLink as NVML reports it (remote type CPU, no useful bus id): 3 lanes from
// each of two V100s (sm 70, 20 GB/s a lane) to the CPU, plus 3 between the GPUs.
TEST(TopoDiscover, NvmlCpuLinksEndAtTheGpusPackage) {
  Topology base;
  ASSERT_TRUE(loadTopologyText(gpusOnOneCpu(2), "test", &base).isOk());
  std::vector<NvmlGpu> nvml;
  int linkNo = 0;
  for (int g = 1; g <= 2; ++g) {
    NvmlGpu gpu;
    gpu.busId = "0000:0" + std::to_string(g) + ":00.0";
    gpu.smVersion = 70;
    for (int lane = 0; lane < 3; ++lane) gpu.activeLinks.push_back({linkNo++, "", NvmlRemote::Cpu});
    for (int lane = 0; lane < 3; ++lane)
      gpu.activeLinks.push_back({linkNo++, g == 1 ? "0000:02:00.0" : "0000:01:00.0", NvmlRemote::Gpu});
    nvml.push_back(gpu);
  }
  const Topology t = withNvmlLinks(base, nvml);
  ASSERT_TRUE(t.finalized());
  const int pkg = t.nodesOfKind(NodeKind::Package).at(0);
  for (const char* name : {"GPU0", "GPU1"}) {
    const int l = t.linkBetween(t.find(name), pkg);
    ASSERT_GE(l, 0) << name;
    EXPECT_EQ(t.link(l).kind, LinkKind::NvLink);
    EXPECT_EQ(t.link(l).nvlinkCount, 3);
    EXPECT_NEAR(t.link(l).bandwidthGBs, 3 * 20.0, 1e-9);
  }
  EXPECT_EQ(t.path(t.find("GPU0"), t.find("GPU1")).nvlinks, 3);
}

}  // namespace
}  // namespace ridge::topo
