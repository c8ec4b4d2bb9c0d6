// The topology graph readers (load.h) against real files published by others
// (../shared/topo_samples; skipped when absent) and our own synthetic files (tests/topo/data).
// Every expectation below was taken by reading the file, as the comment before it says.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "time_scale.h"
#include "topo/gdr_placement.h"
#include "topo/graph_build.h"
#include "topo/load.h"
#include "topo/model.h"
#include "topo_samples.h"

namespace fs = std::filesystem;

namespace ridge::topo {
namespace {

// The whole tree, one node a line, for failure messages.
std::string dump(const Topology& t) {
  std::string s;
  std::vector<std::pair<int, int>> stack = {{t.root(), 0}};
  while (!stack.empty()) {
    auto [id, depth] = stack.back();
    stack.pop_back();
    const Node& n = t.node(id);
    s += std::string(static_cast<size_t>(depth) * 2, ' ') + n.name + " [" + nodeKindName(n.kind) + "] " +
         n.busId;
    for (const std::string& o : n.osNames) s += " " + o;
    s += "\n";
    for (auto it = n.children.rbegin(); it != n.children.rend(); ++it) stack.push_back({*it, depth + 1});
  }
  return s;
}

Topology load(const std::string& path) {
  Topology t;
  Status s = loadTopologyFile(path, &t);
  EXPECT_TRUE(s.isOk()) << s.message();
  return t;
}

int count(const Topology& t, NodeKind k) {
  return static_cast<int>(t.nodesOfKind(k).size());
}

int switchUnits(const Topology& t) {
  std::set<int> units;
  for (int b : t.nodesOfKind(NodeKind::PciBridge)) units.insert(t.node(b).pciSwitch);
  return static_cast<int>(units.size());
}

// Class of the path between two devices named as Topology::find understands them, in
// both vocabularies: "PIX/PIX", "PHB/NODE", "NVL/NV12".
std::string classOf(const Topology& t, const std::string& a, const std::string& b) {
  const int x = t.find(a), y = t.find(b);
  if (x < 0 || y < 0) return "missing " + (x < 0 ? a : b);
  const Path p = t.path(x, y);
  return std::string(ncclClassName(p.nccl)) + "/" + smiClassName(p.smi, p.nvlinks);
}

double bandwidthOf(const Topology& t, const std::string& a, const std::string& b) {
  return t.path(t.find(a), t.find(b)).bandwidthGBs;
}

double socketLinkGBs(const Topology& t) {
  for (const Link& l : t.links())
    if (l.kind == LinkKind::Socket) return l.bandwidthGBs;
  return -1;
}

// The link from a device up to its parent.
const Link& upLink(const Topology& t, const std::string& dev) {
  const int id = t.find(dev);
  return t.link(t.linkBetween(t.node(id).parent, id));
}

// ---- Real files -------------------------------------------------------------------------

// aliyun SimAI HGX A100 (read by hand): 2 <cpu> (Intel family 6 model 106, Ice Lake), 8 GPUs
// (dev 0-7, sm 80) each three Broadcom bridges below a top-level bridge, 20 class-0x060400
// bridges in all, 5 NICs mlx5_bond_0..4 at 200000 Mb/s; mlx5_bond_0 (06:00.0) sits straight
// under cpu 0 (a CPU root port). Every GPU lists 6 NVSwitch targets c0..c5:00.0 with count 2.
// GPU1 (19:00.0) and mlx5_bond_1 (1a:00.0) share the bridge 15:00.0: 19 -> 17 -> 15 -> 1a.
TEST(TopoSamples, AliyunHgxA100) {
  SKIP_WITHOUT_SAMPLES();
  const Topology t = load(kSamples + "/nccl/aliyun-SimAI_topo_8A100_4CX6.xml");
  ASSERT_TRUE(t.finalized()) << dump(t);
  EXPECT_EQ(count(t, NodeKind::Package), 2);
  EXPECT_EQ(count(t, NodeKind::Numa), 2);
  EXPECT_EQ(count(t, NodeKind::Gpu), 8);
  EXPECT_EQ(count(t, NodeKind::Nic), 5);
  EXPECT_EQ(count(t, NodeKind::NvSwitch), 6);
  EXPECT_EQ(count(t, NodeKind::PciBridge), 20);
  EXPECT_EQ(switchUnits(t), 20);  // each NCCL bridge is one unit
  EXPECT_EQ(t.node(t.find("GPU0")).busId, "0000:13:00.0");
  EXPECT_EQ(t.node(t.find("GPU7")).busId, "0000:b3:00.0");
  EXPECT_EQ(t.node(t.find("GPU0")).smVersion, 80);
  // Through the six NVSwitches: 6 x 2 lanes at A100's 20 GB/s per lane.
  EXPECT_EQ(classOf(t, "GPU0", "GPU1"), "NVL/NV12");
  EXPECT_EQ(classOf(t, "GPU0", "GPU7"), "NVL/NV12");  // across sockets too
  EXPECT_DOUBLE_EQ(bandwidthOf(t, "GPU0", "GPU1"), 240);
  // The NIC on a CPU root port meets the GPUs of its socket in the CPU.
  EXPECT_EQ(classOf(t, "mlx5_bond_0", "GPU0"), "PHB/NODE");
  EXPECT_EQ(classOf(t, "mlx5_bond_0", "GPU3"), "PHB/NODE");
  EXPECT_EQ(classOf(t, "mlx5_bond_0", "GPU4"), "SYS/SYS");
  // GPU1 and its NIC: two bridges (17, 15), no CPU.
  EXPECT_EQ(classOf(t, "GPU1", "mlx5_bond_1"), "PXB/PXB");
  EXPECT_EQ(classOf(t, "GPU0", "mlx5_bond_1"), "PXB/PXB");
  EXPECT_EQ(classOf(t, "GPU6", "mlx5_bond_4"), "PXB/PXB");
  EXPECT_EQ(classOf(t, "mlx5_bond_1", "mlx5_bond_3"), "SYS/SYS");
  // 16 GT/s x16 is NCCL's 24 GB/s; Ice Lake's socket link 10 GB/s.
  EXPECT_DOUBLE_EQ(upLink(t, "GPU0").bandwidthGBs, 24);
  EXPECT_EQ(upLink(t, "GPU0").pcieGen, 4);
  EXPECT_EQ(upLink(t, "GPU0").pcieWidth, 16);
  EXPECT_DOUBLE_EQ(socketLinkGBs(t), 10);
  const Node& nic = t.node(t.find("mlx5_bond_2"));
  ASSERT_EQ(nic.ports.size(), 1u);
  EXPECT_EQ(nic.ports[0].name, "mlx5_bond_2:1");
  EXPECT_DOUBLE_EQ(nic.ports[0].rateGbps, 200);
  EXPECT_EQ(nic.ports[0].linkLayer, "Ethernet");  // class 0x020000: RoCE
  EXPECT_EQ(nic.busId, "0000:4f:00.0");
}

// Azure ND H100 v5 (read by hand): 2 <cpu> (Intel model 143, Sapphire Rapids), 8 virtual
// switches ffff:ff:01.0 .. 08.0, each with one GPU (class 0x030200) and one InfiniBand NIC
// (0x020700), in that order; 32.0 GT/s x16 everywhere; no gpu/nic/net elements.
TEST(TopoSamples, AzureNdv5) {
  SKIP_WITHOUT_SAMPLES();
  const Topology t = load(kSamples + "/nccl/azure_ndv5-topo.xml");
  EXPECT_EQ(count(t, NodeKind::Numa), 2);
  EXPECT_EQ(count(t, NodeKind::Gpu), 8);
  EXPECT_EQ(count(t, NodeKind::Nic), 8);
  EXPECT_EQ(count(t, NodeKind::PciBridge), 8);
  for (int i = 0; i < 8; ++i) {
    const std::string g = "GPU" + std::to_string(i), n = "NIC" + std::to_string(i);
    EXPECT_EQ(classOf(t, g, n), "PIX/PIX") << g;
    EXPECT_DOUBLE_EQ(bandwidthOf(t, g, n), 48) << g;  // Gen5 x16 in NCCL's figures
  }
  EXPECT_EQ(t.node(t.find("GPU3")).busId, "0008:00:00.0");
  EXPECT_EQ(t.node(t.find("NIC3")).busId, "0104:00:00.0");
  EXPECT_EQ(classOf(t, "GPU0", "NIC1"), "PHB/NODE");
  EXPECT_EQ(classOf(t, "GPU0", "GPU1"), "PHB/NODE");
  EXPECT_EQ(classOf(t, "GPU0", "NIC4"), "SYS/SYS");
  EXPECT_EQ(classOf(t, "GPU3", "GPU4"), "SYS/SYS");
  EXPECT_DOUBLE_EQ(socketLinkGBs(t), 22);
  EXPECT_TRUE(t.node(t.find("NIC0")).ports.empty());  // partial file: no <net>
  EXPECT_EQ(t.node(t.node(t.find("GPU0")).parent).name, "Virtual switch ffff:ff:01.0");
}

// Azure ND A100 v4 (read by hand): 4 <cpu> (AMD family 23 model 49, Rome), each one virtual
// switch holding GPU, NIC, GPU, NIC in that order; cpu 0's: GPUs 0003/0004, NICs 0103/0104.
TEST(TopoSamples, AzureNdv4) {
  SKIP_WITHOUT_SAMPLES();
  const Topology t = load(kSamples + "/nccl/azure_ndv4-topo.xml");
  EXPECT_EQ(count(t, NodeKind::Numa), 4);
  EXPECT_EQ(count(t, NodeKind::Package), 4);
  EXPECT_EQ(count(t, NodeKind::Gpu), 8);
  EXPECT_EQ(count(t, NodeKind::Nic), 8);
  EXPECT_EQ(count(t, NodeKind::PciBridge), 4);
  EXPECT_EQ(t.node(t.find("GPU0")).busId, "0003:00:00.0");
  EXPECT_EQ(t.node(t.find("NIC0")).busId, "0103:00:00.0");
  for (int i = 0; i < 8; ++i) {
    // GPU i and NIC i share a switch; so do GPU 2k and GPU 2k+1.
    EXPECT_EQ(classOf(t, "GPU" + std::to_string(i), "NIC" + std::to_string(i)), "PIX/PIX") << i;
  }
  EXPECT_EQ(classOf(t, "GPU0", "GPU1"), "PIX/PIX");
  EXPECT_EQ(classOf(t, "GPU0", "NIC1"), "PIX/PIX");
  EXPECT_EQ(classOf(t, "GPU1", "GPU2"), "SYS/SYS");
  EXPECT_DOUBLE_EQ(socketLinkGBs(t), 16);
  EXPECT_DOUBLE_EQ(bandwidthOf(t, "GPU0", "NIC0"), 24);
}

// Azure ND V100 v2 (read by hand): 2 <cpu> (Intel model 85, Skylake), GPUs 0001-0004 and the
// only NIC 0101 straight under cpu 0, GPUs 0005-0008 under cpu 1; no bridges.
TEST(TopoSamples, AzureNdv2) {
  SKIP_WITHOUT_SAMPLES();
  const Topology t = load(kSamples + "/nccl/azure_ndv2-topo.xml");
  EXPECT_EQ(count(t, NodeKind::Numa), 2);
  EXPECT_EQ(count(t, NodeKind::Gpu), 8);
  EXPECT_EQ(count(t, NodeKind::Nic), 1);
  EXPECT_EQ(count(t, NodeKind::PciBridge), 0);
  EXPECT_EQ(classOf(t, "GPU0", "NIC0"), "PHB/NODE");
  EXPECT_EQ(classOf(t, "GPU0", "GPU3"), "PHB/NODE");
  EXPECT_EQ(classOf(t, "GPU4", "NIC0"), "SYS/SYS");
  EXPECT_DOUBLE_EQ(socketLinkGBs(t), 10);
}

// Azure NC A100 v4 (read by hand): 4 <cpu> (AMD), one GPU each (0001..0004, link_speed ""
// and width 0) whose only nvlink targets the GPU itself; an Ethernet <nic> eth0 (100000
// Mb/s, port 0, gdr 0) straight under cpu 0, with no PCI element.
TEST(TopoSamples, AzureNcv4) {
  SKIP_WITHOUT_SAMPLES();
  const Topology t = load(kSamples + "/nccl/azure_ncv4-topo.xml");
  EXPECT_EQ(count(t, NodeKind::Numa), 4);
  EXPECT_EQ(count(t, NodeKind::Gpu), 4);
  EXPECT_EQ(count(t, NodeKind::Nic), 1);
  for (const Link& l : t.links()) EXPECT_NE(l.kind, LinkKind::NvLink) << "self-targeted nvlink kept";
  EXPECT_EQ(classOf(t, "GPU0", "GPU1"), "SYS/SYS");
  EXPECT_EQ(t.node(t.find("GPU2")).cudaIndex, 2);
  EXPECT_EQ(upLink(t, "GPU0").bandwidthGBs, 0);  // unknown, not invented
  const int nic = t.find("eth0");
  ASSERT_GE(nic, 0) << dump(t);
  EXPECT_EQ(t.node(nic).busId, "");
  EXPECT_EQ(t.node(t.node(nic).numa).index, 0);
  ASSERT_EQ(t.node(nic).ports.size(), 1u);
  EXPECT_EQ(t.node(nic).ports[0].name, "eth0");
  EXPECT_DOUBLE_EQ(t.node(nic).ports[0].rateGbps, 100);
  EXPECT_EQ(classOf(t, "GPU0", "eth0"), "PHB/NODE");
}

// AWS p4d.24xlarge (read by hand; has XML comments): 2 <cpu> (Intel model 85), 4 virtual
// switches ffff:ff:01.0..04.0, each GPU, GPU, EFA NIC (0x020000, vendor 0x1d0f) at 8 GT/s x16.
TEST(TopoSamples, AwsP4d) {
  SKIP_WITHOUT_SAMPLES();
  const Topology t = load(kSamples + "/nccl/aws_p4d-24xl-topo.xml");
  EXPECT_EQ(count(t, NodeKind::Numa), 2);
  EXPECT_EQ(count(t, NodeKind::Gpu), 8);
  EXPECT_EQ(count(t, NodeKind::Nic), 4);
  EXPECT_EQ(count(t, NodeKind::PciBridge), 4);
  EXPECT_EQ(t.node(t.find("NIC0")).busId, "0000:10:1b.0");
  EXPECT_EQ(t.node(t.find("NIC0")).vendor, 0x1d0f);
  for (int g = 0; g < 8; ++g) {
    const std::string gpu = "GPU" + std::to_string(g);
    for (int n = 0; n < 4; ++n) {
      const std::string nic = "NIC" + std::to_string(n);
      const char* want = (g / 2 == n) ? "PIX/PIX" : (g / 4 == n / 2 ? "PHB/NODE" : "SYS/SYS");
      EXPECT_EQ(classOf(t, gpu, nic), want) << gpu << "-" << nic;
    }
  }
  EXPECT_DOUBLE_EQ(bandwidthOf(t, "GPU0", "NIC0"), 12);  // Gen3 x16
}

TEST(TopoSamples, NcclGraphFileIsRefused) {
  SKIP_WITHOUT_SAMPLES();
  Topology t;
  const std::string path = kSamples + "/nccl/azure_ncv4-graph.xml";
  Status s = loadTopologyFile(path, &t);
  EXPECT_EQ(s.code(), ridgeInvalidArgument);
  EXPECT_NE(s.message().find("not a topology"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("graph"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_EQ(loadNcclTopologyXml(path, &t).code(), ridgeInvalidArgument);
}

// hwloc test file, hwloc 3 format (read by hand): 2 packages ("Xeon E5-2650 0", no model
// numbers), NUMA 0 and 1. GPUs: Tesla 03:00.0 (package 0), Tesla 83:00.0 (root port
// 80:02.0), Tesla 84:00.0 "cuda0" and Radeon 84:00.1 "opencl0d1" (root port 80:03.0); the
// Matrox 05:03.0 is a BMC display. NICs: I350 81:00.0 eth0 and 81:00.1 eth1 (root port
// 80:01.0), ConnectX-4 04:00.0 (ib0 Port 1, mlx5_0 Port1State 4) under 80:03.0 -- whose bus
// id the SATA controller 04:00.0 on package 0 also has. HostName "conan" at the top level.
TEST(TopoSamples, HwlocTestsHwloc3Format) {
  SKIP_WITHOUT_SAMPLES();
  const Topology t = load(kSamples + "/hwloc/hwloc-tests_32em64t-2n8c2t-pci-normalio.xml");
  ASSERT_TRUE(t.finalized());
  EXPECT_EQ(t.name, "conan");
  EXPECT_EQ(count(t, NodeKind::Package), 2);
  EXPECT_EQ(count(t, NodeKind::Numa), 2);
  EXPECT_EQ(count(t, NodeKind::Gpu), 4) << dump(t);
  EXPECT_EQ(count(t, NodeKind::Nic), 3) << dump(t);
  EXPECT_EQ(count(t, NodeKind::PciBridge), 6);
  EXPECT_EQ(count(t, NodeKind::HostBridge), 2);
  const int cx4 = t.find("mlx5_0");
  ASSERT_GE(cx4, 0);
  EXPECT_EQ(t.find("0000:04:00.0"), cx4);  // the NIC keeps the duplicated bus id
  ASSERT_EQ(t.node(cx4).ports.size(), 1u);
  EXPECT_EQ(t.node(cx4).ports[0].name, "mlx5_0:1");
  EXPECT_EQ(t.node(cx4).ports[0].netdev, "ib0");
  EXPECT_EQ(t.node(cx4).ports[0].state, "ACTIVE");
  EXPECT_EQ(t.node(cx4).ports[0].linkLayer, "InfiniBand");
  EXPECT_EQ(t.find("ib0"), cx4);
  EXPECT_EQ(t.node(t.find("cuda0")).busId, "0000:84:00.0");
  EXPECT_EQ(t.node(t.find("cuda0")).cudaIndex, 0);
  EXPECT_EQ(t.node(t.find("cuda0")).model, "Tesla K40m");
  EXPECT_EQ(classOf(t, "cuda0", "mlx5_0"), "PIX/PIX");         // one root port
  EXPECT_EQ(classOf(t, "cuda0", "0000:83:00.0"), "PHB/PHB");   // two root ports, one host bridge
  EXPECT_EQ(classOf(t, "0000:03:00.0", "mlx5_0"), "SYS/SYS");  // across packages
  EXPECT_EQ(classOf(t, "eth0", "eth1"), "PIX/PIX");
  EXPECT_DOUBLE_EQ(socketLinkGBs(t), 6);  // no model number: the documented default
}

// LLNL Sierra node, hwloc 1.x (read by hand): Machine > Group > NUMANode 0/8 > Group > Socket
// (POWER9); I/O below the Groups: host bridges with devices straight on them. GPUs cuda0 and
// cuda1 on host bridge 0004 (socket 0), cuda2/cuda3 on 0035 (socket 8). ConnectX-5 functions
// mlx5_0/1 (0003:01:00.0/.1, netdevs hsi0/hsi1), mlx5_2/3 (0033), Broadcom enP5p1s0f0/f1
// (0005), Samsung NVMe nvme0n1 (0000:01:00.0), ASPEED display. NUMA nodes 252-255 are the
// V100s' memory (cpuset 0x0).
TEST(TopoSamples, SierraHwloc1) {
  SKIP_WITHOUT_SAMPLES();
  const Topology t = load(kSamples + "/hwloc/flux-sched_sierra2_node0_power9_4xV100_4xmlx5.xml");
  EXPECT_EQ(t.name, "sierra3682");
  EXPECT_EQ(count(t, NodeKind::Package), 2);
  EXPECT_EQ(count(t, NodeKind::Numa), 2) << "GPU memory NUMA nodes are not placement targets\n" << dump(t);
  EXPECT_EQ(count(t, NodeKind::Gpu), 4);
  EXPECT_EQ(count(t, NodeKind::Nic), 6);
  EXPECT_EQ(count(t, NodeKind::Nvme), 1);
  EXPECT_EQ(count(t, NodeKind::PciBridge), 0);
  EXPECT_EQ(t.node(t.find("GPU0")).busId, "0004:04:00.0");
  EXPECT_EQ(t.node(t.find("GPU3")).busId, "0035:04:00.0");
  EXPECT_EQ(classOf(t, "GPU0", "GPU1"), "PHB/PHB");
  EXPECT_EQ(classOf(t, "GPU0", "mlx5_0"), "PHB/NODE");
  EXPECT_EQ(classOf(t, "GPU2", "mlx5_3"), "PHB/NODE");
  EXPECT_EQ(classOf(t, "GPU0", "GPU2"), "SYS/SYS");
  EXPECT_EQ(classOf(t, "GPU0", "mlx5_2"), "SYS/SYS");
  EXPECT_EQ(t.node(t.find("mlx5_1")).ports.at(0).netdev, "hsi1");
  EXPECT_EQ(t.find("nvme0n1"), t.find("0000:01:00.0"));
  EXPECT_DOUBLE_EQ(socketLinkGBs(t), 32);  // POWER9 X-Bus
  EXPECT_EQ(t.node(t.node(t.find("GPU2")).package).index, 8);
}

// LLNL Corona (hwloc 1.11, Package objects; read by hand): 2 EPYC 7401 packages, NUMA 0-3 in
// package 0 and 4-7 in package 1, I/O below NUMA nodes. MI25 GPUs 13:00.0 (NUMA 1), 23:00.0
// (NUMA 2), 53:00.0 (NUMA 5), 73:00.0 (NUMA 7), each behind its own AMD 1470/1471 bridge pair
// at 15.753846 GB/s (Gen3 x16 = Gen4 x8). ConnectX-6 33:00.0 (mlx5_0, hsi0) on NUMA 3 behind
// the PLX PEX 8747: root port 30:03.1 > upstream 31:00.0 > downstream 32:08.0. I350
// enp3s0f0/f1 and an NVMe on NUMA 0. 20 PCI-PCI bridges.
TEST(TopoSamples, CoronaHwloc1Package) {
  SKIP_WITHOUT_SAMPLES();
  const Topology t = load(kSamples + "/hwloc/flux-sched_corona11_epyc_4xMI25_pex8747_cx6.xml");
  EXPECT_EQ(t.name, "corona11");
  EXPECT_EQ(count(t, NodeKind::Package), 2);
  EXPECT_EQ(count(t, NodeKind::Numa), 8);
  EXPECT_EQ(count(t, NodeKind::Gpu), 4);
  EXPECT_EQ(count(t, NodeKind::Nic), 3);
  EXPECT_EQ(count(t, NodeKind::Nvme), 1);
  EXPECT_EQ(count(t, NodeKind::PciBridge), 20);
  const int nic = t.find("mlx5_0");
  ASSERT_GE(nic, 0);
  EXPECT_EQ(t.node(t.node(nic).parent).pciSwitch, t.find("0000:31:00.0")) << "PEX 8747 downstream port";
  EXPECT_EQ(t.node(t.node(nic).numa).index, 3);
  EXPECT_EQ(t.node(t.node(t.find("GPU1")).numa).index, 2);
  for (int g = 0; g < 4; ++g) EXPECT_EQ(classOf(t, "GPU" + std::to_string(g), "mlx5_0"), "SYS/SYS") << g;
  EXPECT_EQ(classOf(t, "enp3s0f0", "enp3s0f1"), "PIX/PIX");
  EXPECT_DOUBLE_EQ(upLink(t, "GPU0").bandwidthGBs, 12);  // hwloc's 15.75 GB/s is NCCL's 12
  EXPECT_EQ(upLink(t, "GPU0").pcieWidth, 0);             // ambiguous: Gen3 x16 or Gen4 x8
  EXPECT_DOUBLE_EQ(socketLinkGBs(t), 16);
}

// Every sample loads (except the graph file) and answers a path query between every pair
// of GPUs and NICs without tripping anything.
TEST(TopoSamples, EverySampleLoadsAndAnswersPaths) {
  SKIP_WITHOUT_SAMPLES();
  int files = 0;
  double slowestMs = 0;
  std::string slowest;
  for (const auto& e : fs::recursive_directory_iterator(kSamples)) {
    if (!e.is_regular_file() || e.path().extension() != ".xml") continue;
    const std::string path = e.path().string();
    SCOPED_TRACE(path);
    Topology t;
    Status s = loadTopologyFile(path, &t);
    if (path.find("graph") != std::string::npos) {
      EXPECT_EQ(s.code(), ridgeInvalidArgument);
      continue;
    }
    ASSERT_TRUE(s.isOk()) << s.message();
    ++files;
    if (t.loadMs > slowestMs) slowestMs = t.loadMs, slowest = path;
    std::vector<int> devs = t.gpus();
    for (int n : t.nics()) devs.push_back(n);
    EXPECT_GE(t.gpus().size(), 1u);
    for (int a : devs)
      for (int b : devs) {
        const Path p = t.path(a, b);
        ASSERT_FALSE(p.nodes.empty());
        EXPECT_EQ(p.nodes.front(), a);
        EXPECT_EQ(p.nodes.back(), b);
        EXPECT_EQ(p.links.size() + 1, p.nodes.size());
      }
  }
  EXPECT_EQ(files, 9);
  std::printf("[ info ] slowest sample: %s loaded in %.2f ms\n", slowest.c_str(), slowestMs);
  EXPECT_LT(slowestMs, ridgetest::scaledSeconds(200.0));
}

// ---- Our own files ------------------------------------------------------------------------

TEST(TopoReaders, HwlocV2TwoLevelSwitch) {
  const Topology t = load(kData + "/hwloc-v2-two-level-switch.xml");
  ASSERT_TRUE(t.finalized());
  EXPECT_EQ(t.name, "two-level");
  EXPECT_EQ(count(t, NodeKind::Package), 2);
  EXPECT_EQ(count(t, NodeKind::Numa), 2);
  EXPECT_EQ(count(t, NodeKind::Gpu), 3);
  EXPECT_EQ(count(t, NodeKind::Nic), 1);
  EXPECT_EQ(count(t, NodeKind::Nvme), 1);
  EXPECT_EQ(count(t, NodeKind::PciBridge), 10) << dump(t);
  EXPECT_EQ(switchUnits(t), 6);
  EXPECT_EQ(t.node(t.find("0000:02:01.0")).pciSwitch, t.find("0000:01:00.0"));
  EXPECT_EQ(t.node(t.find("0000:04:01.0")).pciSwitch, t.find("0000:03:00.0"));
  EXPECT_EQ(classOf(t, "GPU0", "GPU1"), "PIX/PIX");
  EXPECT_EQ(classOf(t, "GPU0", "NIC0"), "PXB/PXB");
  EXPECT_EQ(classOf(t, "GPU0", "GPU2"), "SYS/SYS");
  EXPECT_EQ(classOf(t, "GPU2", "nvme0n1"), "PHB/PHB");
  EXPECT_DOUBLE_EQ(bandwidthOf(t, "GPU0", "GPU1"), 48);
  EXPECT_DOUBLE_EQ(bandwidthOf(t, "GPU0", "NIC0"), 24);
  EXPECT_DOUBLE_EQ(bandwidthOf(t, "GPU0", "GPU2"), 22);  // Sapphire Rapids socket link
  EXPECT_EQ(upLink(t, "GPU0").pcieWidth, 0);             // hwloc GB/s alone is ambiguous
  EXPECT_DOUBLE_EQ(upLink(t, "nvme0n1").bandwidthGBs, 6);
  const Node& nic = t.node(t.find("mlx5_0"));
  EXPECT_EQ(nic.model, "MT2910 Family [ConnectX-7]");
  ASSERT_EQ(nic.ports.size(), 1u);
  EXPECT_EQ(nic.ports[0].netdev, "ib0");
  EXPECT_EQ(nic.ports[0].state, "ACTIVE");
  EXPECT_EQ(t.node(t.find("GPU1")).osNames, std::vector<std::string>{"cuda1"});
  EXPECT_EQ(t.node(t.find("GPU0")).osNames, std::vector<std::string>{"cuda0"});  // card1 left out
  // Latencies: GPU0 to GPU1 is two device links and two switch ports.
  const Path p = t.path(t.find("GPU0"), t.find("GPU1"));
  EXPECT_GT(p.latencyNs, 100);
  EXPECT_LT(p.latencyNs, t.path(t.find("GPU0"), t.find("GPU2")).latencyNs);
  EXPECT_GE(t.loadMs, 0);
}

// NVLink recorded by hwloc's nvml backend (synthetic files; their comments give the shape).
int nvlinkLanesBetween(const Topology& t, const std::string& a, const std::string& b) {
  const int l = t.linkBetween(t.find(a), t.find(b));
  return l >= 0 && t.link(l).kind == LinkKind::NvLink ? t.link(l).nvlinkCount : -1;
}

TEST(TopoReaders, HwlocNvSwitchMatrixGivesNvLinkThroughSwitches) {
  const Topology t = load(kData + "/hwloc-v2-nvlink-nvswitch.xml");
  ASSERT_TRUE(t.finalized());
  EXPECT_EQ(count(t, NodeKind::Gpu), 4);
  ASSERT_EQ(count(t, NodeKind::NvSwitch), 2) << dump(t);
  for (const char* a : {"GPU0", "GPU1", "GPU2", "GPU3"})
    for (const char* b : {"GPU0", "GPU1", "GPU2", "GPU3"}) {
      if (std::string(a) == b) continue;
      EXPECT_EQ(classOf(t, a, b), "NVL/NV12") << a << "-" << b;
      EXPECT_DOUBLE_EQ(bandwidthOf(t, a, b), 300) << a << "-" << b;  // 2 x 6 x 25 GB/s
    }
  // Each GPU has one bundle of 6 lanes to each switch, none to the other GPUs directly.
  for (int s : t.nodesOfKind(NodeKind::NvSwitch))
    for (const char* g : {"GPU0", "GPU1", "GPU2", "GPU3"})
      EXPECT_EQ(nvlinkLanesBetween(t, g, t.node(s).busId), 6);
  EXPECT_EQ(nvlinkLanesBetween(t, "GPU0", "GPU1"), -1);
}

TEST(TopoReaders, HwlocHomogeneousNvLinkMatrixGivesGpuPairs) {
  const Topology t = load(kData + "/hwloc-v2-nvlink-pairs.xml");
  ASSERT_TRUE(t.finalized());
  EXPECT_EQ(classOf(t, "GPU0", "GPU1"), "NVL/NV4");
  EXPECT_EQ(classOf(t, "GPU2", "GPU3"), "NVL/NV4");
  EXPECT_EQ(classOf(t, "GPU0", "GPU2"), "NVL/NV1");
  EXPECT_EQ(classOf(t, "GPU1", "GPU3"), "NVL/NV2");
  EXPECT_DOUBLE_EQ(bandwidthOf(t, "GPU0", "GPU1"), 100);
  // No direct link: NCCL's NVB through a GPU that has NVLink to both, nvidia-smi's PCIe class.
  EXPECT_EQ(classOf(t, "GPU0", "GPU3"), "NVB/PHB");
  EXPECT_EQ(classOf(t, "GPU1", "GPU2"), "NVB/PHB");
  EXPECT_EQ(classOf(t, "GPU0", "mlx5_0"), "PHB/PHB");
  EXPECT_EQ(count(t, NodeKind::NvSwitch), 0);
}

TEST(TopoReaders, HwlocGpuToCpuNvLinkEndsAtThePackage) {
  const Topology t = load(kData + "/hwloc-v2-nvlink-power.xml");
  ASSERT_TRUE(t.finalized());
  EXPECT_EQ(classOf(t, "GPU0", "GPU1"), "NVL/NV3");
  const int pkg = t.nodesOfKind(NodeKind::Package).at(0);
  for (const char* g : {"GPU0", "GPU1"}) {  // GPU1's CPU end is named by its NUMA node
    const int l = t.linkBetween(t.find(g), pkg);
    ASSERT_GE(l, 0) << g << "\n" << dump(t);
    EXPECT_EQ(t.link(l).kind, LinkKind::NvLink);
    EXPECT_EQ(t.link(l).nvlinkCount, 3);
    EXPECT_DOUBLE_EQ(t.link(l).bandwidthGBs, 75);
  }
  // The GPUs still hang from the PCIe tree: the CPU link is not their tree edge.
  EXPECT_EQ(t.node(t.node(t.find("GPU0")).parent).kind, NodeKind::PciBridge);
}

// Variants written by the test from the synthetic pairs file.
std::string withMatrix(const std::string& matrix) {
  std::ifstream in(kData + "/hwloc-v2-nvlink-pairs.xml");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t b = text.find("  <distances2 "), e = text.find("</distances2>");
  EXPECT_NE(b, std::string::npos);
  EXPECT_NE(e, std::string::npos);
  return text.substr(0, b) + matrix + text.substr(e + std::string("</distances2>").size());
}

Status loadText(const std::string& text, Topology* t) {
  const std::string path = ::testing::TempDir() + "/nvlink-variant-" + std::to_string(::getpid()) + ".xml";
  {
    std::ofstream out(path);
    out << text;
  }
  Status s = loadTopologyFile(path, t);
  std::remove(path.c_str());
  return s;
}

TEST(TopoReaders, HwlocNvLinkMatrixVariants) {
  const std::string head =
      R"(<distances2 nbobjs="2" kind="9" name="NVLinkBandwidth" indexing="gp" type="OSDev">)";
  Topology t;
  // Split lists (hwloc may cut long ones), extra whitespace, hex values: read alike.
  ASSERT_TRUE(
      loadText(withMatrix(head + "<indexes length=\"4\"> 102 </indexes><indexes length=\"4\">112</indexes>"
                                 "<u64values length=\"9\">1000000 0x249f0</u64values>"
                                 "<u64values length=\"9\">150000\n1000000 </u64values></distances2>"),
               &t)
          .isOk());
  EXPECT_EQ(classOf(t, "GPU0", "GPU1"), "NVL/NV6");
  // Another matrix name (XGMI, NUMA latencies) is not NVLink.
  ASSERT_TRUE(
      loadText(
          withMatrix(R"(<distances2 nbobjs="2" kind="9" name="XGMIBandwidth" indexing="gp" type="OSDev">)"
                     "<indexes length=\"8\">102 112 </indexes>"
                     "<u64values length=\"9\">1 50000 50000 1</u64values></distances2>"),
          &t)
          .isOk());
  EXPECT_EQ(classOf(t, "GPU0", "GPU1"), "PHB/PHB");
  // A gp_index that names no object of the file leaves that row out, not the file.
  ASSERT_TRUE(loadText(withMatrix(head + "<indexes length=\"8\">102 999 </indexes>"
                                         "<u64values length=\"9\">1 50000 50000 1</u64values></distances2>"),
                       &t)
                  .isOk());
  EXPECT_EQ(classOf(t, "GPU0", "GPU1"), "PHB/PHB");
  // Malformed matrices are refused with the line: too few values, too few indexes, a value
  // that is no number, a hetero index without its type, an absurd bandwidth.
  for (const std::string& bad :
       {head +
            "<indexes length=\"8\">102 112 </indexes><u64values length=\"3\">1 2 3</u64values></distances2>",
        head + "<indexes length=\"4\">102 </indexes><u64values length=\"3\">1 2 3 4</u64values></distances2>",
        head + "<indexes length=\"8\">102 112 </indexes><u64values length=\"3\">1 x 3 "
               "4</u64values></distances2>",
        std::string(R"(<distances2hetero nbobjs="2" kind="25" name="NVLinkBandwidth" indexing="gp">)") +
            "<indexes length=\"8\">102 112 </indexes><u64values length=\"3\">1 2 3 "
            "4</u64values></distances2hetero>",
        head + "<indexes length=\"8\">102 112 </indexes>"
               "<u64values length=\"3\">1 999999999999 999999999999 4</u64values></distances2>"}) {
    SCOPED_TRACE(bad);
    Status s = loadText(withMatrix(bad), &t);
    EXPECT_EQ(s.code(), ridgeInvalidArgument) << s.message();
    EXPECT_NE(s.message().find("NVLinkBandwidth"), std::string::npos) << s.message();
  }
}

TEST(TopoReaders, NvlinkLanesFromHwlocBandwidth) {
  EXPECT_EQ(nvlinkLanesFromHwlocMBs(25000), 1);
  EXPECT_EQ(nvlinkLanesFromHwlocMBs(150000), 6);
  EXPECT_EQ(nvlinkLanesFromHwlocMBs(80000), 4);    // 4 NVLink 1.0 links (P100)
  EXPECT_EQ(nvlinkLanesFromHwlocMBs(100000), 4);   // ambiguous: read as NVLink 2+
  EXPECT_EQ(nvlinkLanesFromHwlocMBs(1000), 1);     // never 0 lanes for a link that exists
  EXPECT_EQ(nvlinkLanesFromHwlocMBs(240000), 12);  // 12 x 20000, no multiple of 25000
}

// Which NICs are GPUDirect/RDMA targets: a verbs port decides when ports are known, else the
// PCI identity.
TEST(GdrTargets, RdmaCapabilityFromPortsOrPciIdentity) {
  Node nic;
  nic.kind = NodeKind::Nic;
  nic.pciClass = 0x020000;
  nic.vendor = 0x8086;
  EXPECT_FALSE(nicHasRdma(nic));  // an Intel Ethernet function, nothing else known
  nic.ports = {{"eno1", "eno1", "ACTIVE", "Ethernet", 1}};
  EXPECT_FALSE(nicHasRdma(nic));  // 1 GbE, TCP only
  nic.ports.push_back({"irdma0:1", "eno1", "ACTIVE", "Ethernet", 100});
  EXPECT_TRUE(nicHasRdma(nic));  // a RoCE verbs device on the same function
  Node cx;
  cx.kind = NodeKind::Nic;
  cx.pciClass = 0x020000;
  cx.vendor = 0x15b3;
  EXPECT_TRUE(nicHasRdma(cx));  // ConnectX listed by PCI identity only
  cx.ports = {{"ens1f0", "ens1f0", "ACTIVE", "Ethernet", 100}};
  EXPECT_FALSE(nicHasRdma(cx));  // seen live without its verbs device: the RDMA driver is not loaded
  Node ib;
  ib.kind = NodeKind::Nic;
  ib.pciClass = 0x0207;
  EXPECT_TRUE(nicHasRdma(ib));
  Node efa;
  efa.kind = NodeKind::Nic;
  efa.pciClass = 0x020000;
  efa.vendor = 0x1d0f;
  efa.device = 0xefa1;
  EXPECT_TRUE(nicHasRdma(efa));
  efa.device = 0xec20;  // Amazon ENA: Ethernet only
  EXPECT_FALSE(nicHasRdma(efa));
  Node gpu;
  gpu.kind = NodeKind::Gpu;
  gpu.pciClass = 0x0207;
  EXPECT_FALSE(nicHasRdma(gpu));
}

TEST(GdrTargets, OneGigabitPortIsNoGdrTargetNorARail) {
  const Topology t = load(kData + "/hwloc-v2-nvlink-pairs.xml");
  ASSERT_TRUE(t.finalized());
  const int cx = t.find("mlx5_0"), i350 = t.find("eno1");
  ASSERT_GE(cx, 0);
  ASSERT_GE(i350, 0);
  EXPECT_TRUE(nicHasRdma(t.node(cx)));
  EXPECT_FALSE(nicHasRdma(t.node(i350)));
  EXPECT_EQ(t.rdmaNicsOrAll(), std::vector<int>{cx});
  GdrPlacement toI350, toCx;
  ASSERT_TRUE(gdrPlacementFor(t, t.find("GPU0"), i350, &toI350).isOk());
  ASSERT_TRUE(gdrPlacementFor(t, t.find("GPU0"), cx, &toCx).isOk());
  EXPECT_EQ(adviseGdr(toI350, PcieConstants()).decidedBy, "nothing possible");
  EXPECT_NE(adviseGdr(toCx, PcieConstants()).decidedBy, "nothing possible");
}

TEST(TopoReaders, HwlocV1SocketForm) {
  const Topology t = load(kData + "/hwloc-v1-socket.xml");
  EXPECT_EQ(t.name, "old-socket-node");
  EXPECT_EQ(count(t, NodeKind::Package), 2);
  EXPECT_EQ(count(t, NodeKind::Numa), 2) << dump(t);
  EXPECT_EQ(count(t, NodeKind::Gpu), 2);
  EXPECT_EQ(count(t, NodeKind::Nic), 1);
  EXPECT_EQ(classOf(t, "cuda0", "cuda1"), "PHB/PHB");
  EXPECT_EQ(classOf(t, "cuda0", "eth0"), "SYS/SYS");
  EXPECT_EQ(t.node(t.find("cuda0")).model, "NVIDIA Corporation GV100GL [Tesla V100 SXM2]");
  EXPECT_EQ(t.node(t.find("eth0")).ports.at(0).linkLayer, "Ethernet");
  EXPECT_DOUBLE_EQ(socketLinkGBs(t), 6);
  EXPECT_EQ(t.node(t.node(t.find("eth0")).package).index, 1);
}

TEST(TopoReaders, NcclPartialFile) {
  const Topology t = load(kData + "/nccl-partial.xml");
  EXPECT_EQ(count(t, NodeKind::Package), 2);
  EXPECT_EQ(count(t, NodeKind::Gpu), 3);
  EXPECT_EQ(count(t, NodeKind::Nic), 1);
  EXPECT_EQ(classOf(t, "GPU0", "NIC0"), "PIX/PIX");
  EXPECT_EQ(classOf(t, "GPU1", "NIC0"), "PHB/NODE");
  EXPECT_EQ(classOf(t, "GPU0", "GPU1"), "NVL/NV4");
  EXPECT_DOUBLE_EQ(bandwidthOf(t, "GPU0", "GPU1"), 80);
  EXPECT_EQ(classOf(t, "GPU0", "GPU2"), "SYS/SYS");
  EXPECT_EQ(classOf(t, "GPU1", "GPU2"), "SYS/SYS");
  EXPECT_DOUBLE_EQ(socketLinkGBs(t), 16);
  EXPECT_DOUBLE_EQ(upLink(t, "GPU1").bandwidthGBs, 6);  // 8 GT/s x8
  int nvlinks = 0;
  for (const Link& l : t.links()) nvlinks += l.kind == LinkKind::NvLink;
  EXPECT_EQ(nvlinks, 1);
  // The ordinary loader and the format-specific one agree; the wrong one refuses.
  Topology u;
  EXPECT_TRUE(loadNcclTopologyXml(kData + "/nccl-partial.xml", &u).isOk());
  EXPECT_EQ(u.nodes().size(), t.nodes().size());
  EXPECT_EQ(loadHwlocXml(kData + "/nccl-partial.xml", &u).code(), ridgeInvalidArgument);
}

// The host summary's own test files load as graphs too.
TEST(TopoReaders, SummaryTestFilesLoad) {
  const Topology a = load(kData + "/two-socket-gpu-nic.xml");
  EXPECT_EQ(count(a, NodeKind::Gpu), 1);
  EXPECT_EQ(count(a, NodeKind::Nic), 1);
  const Topology b = load(kData + "/nccl-two-numa.xml");
  EXPECT_EQ(count(b, NodeKind::Gpu), 3);
  EXPECT_EQ(count(b, NodeKind::Nic), 2);
  EXPECT_EQ(b.node(b.find("mlx5_0")).ports.size(), 2u);
}

// ---- Fuzzer regressions ------------------------------------------------------------------

// Inputs that once crashed, hung or leaked in a fuzzer (tests/fuzz), kept after the fix:
// each must now load cleanly or be refused with ridgeInvalidArgument, and a graph that loads
// must answer path queries.
TEST(TopoReaders, FuzzRegressionsReplay) {
  const fs::path dir = fs::path(RIDGE_FUZZ_CORPUS_DIR) / "regressions";
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().filename().string()[0] == '.') continue;
    const std::string path = e.path().string();
    SCOPED_TRACE(path);
    ++files;
    Topology t;
    Status s = loadTopologyFile(path, &t);
    if (!s.isOk()) {
      EXPECT_EQ(s.code(), ridgeInvalidArgument) << s.message();
      EXPECT_FALSE(s.message().empty());
      continue;
    }
    ASSERT_TRUE(t.finalized());
    std::vector<int> devs = t.gpus();
    for (int n : t.nics()) devs.push_back(n);
    for (int a : devs)
      for (int b : devs) EXPECT_EQ(t.path(a, b).nodes.back(), b);
  }
  EXPECT_GE(files, 1);
}

// ---- Bad input ----------------------------------------------------------------------------

class BadInput : public ::testing::Test {
 protected:
  std::string write(const std::string& text) {
    const std::string path = dir_ + "/case" + std::to_string(n_++) + ".xml";
    std::ofstream(path) << text;
    return path;
  }
  // Loads `text` from a file and expects ridgeInvalidArgument whose message holds `needle`
  // and the file's path.
  void expectRefused(const std::string& text, const std::string& needle) {
    const std::string path = write(text);
    Topology t;
    Status s = loadTopologyFile(path, &t);
    EXPECT_EQ(s.code(), ridgeInvalidArgument) << s.message();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
    EXPECT_TRUE(t.nodes().empty());
  }
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("ridge-topo-bad-" + std::to_string(getpid()))).string();
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
  int n_ = 0;
};

const char* const kNcclHead = "<system version=\"1\">\n  <cpu numaid=\"0\">\n";
const char* const kNcclTail = "  </cpu>\n</system>\n";

TEST_F(BadInput, MissingEmptyAndForeignFiles) {
  Topology t;
  Status s = loadTopologyFile(dir_ + "/no-such-file.xml", &t);
  EXPECT_EQ(s.code(), ridgeInvalidArgument);
  EXPECT_NE(s.message().find("no-such-file.xml"), std::string::npos);
  expectRefused("", "empty");
  expectRefused("   \n", "empty");
  expectRefused("<catalog><book/></catalog>", "<catalog>");
  expectRefused("<graphs version=\"1\"><graph id=\"0\"/></graphs>", "not a topology");
  expectRefused("<system version=\"1\"></system>", "no <cpu>");
  expectRefused("<topology version=\"2.0\"></topology>", "describes no machine");
}

TEST_F(BadInput, TruncatedAndMalformedXml) {
  const std::string full =
      std::string(kNcclHead) + "    <pci busid=\"0000:01:00.0\" class=\"0x030200\"/>\n" + kNcclTail;
  expectRefused(full.substr(0, full.size() - 12), "line");
  expectRefused("<system version=\"1\">\n<cpu numaid=0>\n</cpu></system>", "line 2");
  expectRefused("<system><cpu></system>", "closes");
}

TEST_F(BadInput, AbsurdValuesNameTheLine) {
  auto nccl = [](const std::string& body) { return std::string(kNcclHead) + body + kNcclTail; };
  expectRefused(nccl("    <pci busid=\"0000:01:00.0\" class=\"0x030200\" link_width=\"999\"/>\n"), ":3:");
  expectRefused(nccl("    <pci busid=\"0000:01:00.0\" class=\"0x030200\" link_width=\"999\"/>\n"),
                "link_width");
  expectRefused(nccl("    <pci busid=\"0000:01:00.0\" link_speed=\"-8 GT/s\" link_width=\"16\"/>\n"),
                "link_speed");
  expectRefused(nccl("    <pci busid=\"0000:01:00.0\" class=\"0x020700\"><nic><net name=\"x\" "
                     "speed=\"-100\"/></nic></pci>\n"),
                "speed");
  expectRefused(nccl("    <pci busid=\"not-a-bus\"/>\n"), "bus id");
  expectRefused(nccl("    <pci busid=\"0000:01:00.0\" class=\"banana\"/>\n"), "class");
  expectRefused(nccl("    <pci busid=\"0000:01:00.0\" class=\"0x030200\"><gpu dev=\"0\"><nvlink "
                     "target=\"0000:02:00.0\" count=\"-2\"/></gpu></pci>\n"),
                "count");
  expectRefused(nccl("    <pci busid=\"0000:01:00.0\"/>\n    <pci busid=\"0000:01:00.0\"/>\n"),
                "appears twice");
  expectRefused("<system><cpu numaid=\"1\"/><cpu numaid=\"1\"/></system>", "numaid 1 appears twice");
  const std::string hwlocHead =
      "<topology version=\"2.0\"><object type=\"Machine\" cpuset=\"0x1\" nodeset=\"0x1\">"
      "<object type=\"NUMANode\" os_index=\"0\" cpuset=\"0x1\" nodeset=\"0x1\"/>"
      "<object type=\"Bridge\" bridge_type=\"0-1\" depth=\"0\">\n";
  const std::string hwlocTail = "</object></object></topology>";
  expectRefused(hwlocHead +
                    "<object type=\"PCIDev\" pci_busid=\"0000:01:00.0\" pci_type=\"0302 [10de:1db1]\" "
                    "pci_link_speed=\"-3\"/>" +
                    hwlocTail,
                "pci_link_speed");
  expectRefused(hwlocHead +
                    "<object type=\"PCIDev\" pci_busid=\"0000:01:00.0\" pci_type=\"0302 [10de:1db1]\"/>\n"
                    "<object type=\"PCIDev\" pci_busid=\"0000:01:00.0\" pci_type=\"0200 [8086:1521]\"/>" +
                    hwlocTail,
                "appears twice");
  expectRefused(
      hwlocHead + "<object type=\"PCIDev\" pci_busid=\"0000:01:00.0\" pci_type=\"zz\"/>" + hwlocTail,
      "pci_type");
  expectRefused("<topology><object type=\"System\"/></topology>", "not a Machine");
  expectRefused(
      "<topology><object type=\"Machine\"><object type=\"NUMANode\" cpuset=\"0xzz\"/></object></topology>",
      "bitmap");
}

TEST_F(BadInput, UnknownElementsAreSkipped) {
  const std::string path = write(std::string(kNcclHead) +
                                 "    <pci busid=\"0000:01:00.0\" class=\"0x030200\"><sparkle/></pci>\n"
                                 "    <hologram/>\n" +
                                 kNcclTail + "");
  Topology t;
  Status s = loadTopologyFile(path, &t);
  ASSERT_TRUE(s.isOk()) << s.message();
  EXPECT_EQ(t.gpus().size(), 1u);
}

}  // namespace
}  // namespace ridge::topo
