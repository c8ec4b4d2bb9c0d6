// The topology graph on its own: a hand-built two-socket machine whose every pair has a
// known class, checked in both vocabularies, plus finalize()'s refusal of broken graphs.
#include <gtest/gtest.h>

#include "topo/model.h"

namespace ridge::topo {
namespace {

// Machine
//  Package0 - NUMA0 - HB0 - RP0 - SW0 (upstream) - DSP0a - GPU0
//                                               \- DSP0b - GPU1
//                                               \- DSP0c - NIC0
//                 \- HB1 - RP1 - NIC1
//  Package1 - NUMA1 - HB2 - RP2 - GPU2
// plus NVLink GPU0-GPU1 (4 lanes) and GPU1-GPU2 (2 lanes), socket link 10 GB/s.
struct TwoSocket {
  Topology t;
  int gpu[3], nic[2], pkg[2];
};

static Node make(NodeKind k, const std::string& busId = "") {
  Node n;
  n.kind = k;
  n.busId = busId;
  return n;
}

static TwoSocket buildTwoSocket() {
  TwoSocket m;
  Topology& t = m.t;
  t.name = "two-socket";
  const int machine = t.addNode(make(NodeKind::Machine));
  int hb[3], numa[2];
  for (int s = 0; s < 2; ++s) {
    m.pkg[s] = t.addNode(make(NodeKind::Package));
    t.connect(machine, m.pkg[s], LinkKind::Internal, 0, 0);
    numa[s] = t.addNode(make(NodeKind::Numa));
    t.connect(m.pkg[s], numa[s], LinkKind::Internal, 0, 0);
  }
  Link sock;
  sock.kind = LinkKind::Socket;
  sock.a = m.pkg[0];
  sock.b = m.pkg[1];
  sock.bandwidthGBs = 10;
  sock.latencyNs = 300;
  t.addLink(sock);
  const char* hbBus[3] = {"0000:00:00.0", "0000:40:00.0", "0000:80:00.0"};
  for (int i = 0; i < 3; ++i) {
    hb[i] = t.addNode(make(NodeKind::HostBridge, hbBus[i]));
    t.connect(i < 2 ? numa[0] : numa[1], hb[i], LinkKind::Pcie, 24, 200);
  }
  auto bridge = [&](int parent, const char* bus) {
    const int b = t.addNode(make(NodeKind::PciBridge, bus));
    t.connect(parent, b, LinkKind::Pcie, 24, 100);
    return b;
  };
  const int rp0 = bridge(hb[0], "0000:00:01.0");
  const int usp = bridge(rp0, "0000:01:00.0");
  const int dspA = bridge(usp, "0000:02:00.0");
  const int dspB = bridge(usp, "0000:02:01.0");
  const int dspC = bridge(usp, "0000:02:02.0");
  const int rp1 = bridge(hb[1], "0000:40:01.0");
  const int rp2 = bridge(hb[2], "0000:80:01.0");
  auto device = [&](NodeKind k, int parent, const char* bus, double gbs) {
    const int d = t.addNode(make(k, bus));
    t.connect(parent, d, LinkKind::Pcie, gbs, 100);
    return d;
  };
  m.gpu[0] = device(NodeKind::Gpu, dspA, "0000:03:00.0", 24);
  m.gpu[1] = device(NodeKind::Gpu, dspB, "0000:04:00.0", 24);
  m.nic[0] = device(NodeKind::Nic, dspC, "0000:05:00.0", 12);
  m.nic[1] = device(NodeKind::Nic, rp1, "0000:41:00.0", 24);
  m.gpu[2] = device(NodeKind::Gpu, rp2, "0000:81:00.0", 24);
  t.mutableNode(m.nic[0]).osNames = {"mlx5_0"};
  auto nvlink = [&](int a, int b, int lanes) {
    Link l;
    l.kind = LinkKind::NvLink;
    l.a = a;
    l.b = b;
    l.nvlinkCount = lanes;
    l.bandwidthGBs = 20.0 * lanes;
    l.latencyNs = 50;
    t.addLink(l);
  };
  nvlink(m.gpu[0], m.gpu[1], 4);
  nvlink(m.gpu[1], m.gpu[2], 2);
  return m;
}

TEST(TopologyModel, ClassesOfEveryPairInBothVocabularies) {
  TwoSocket m = buildTwoSocket();
  ASSERT_TRUE(m.t.finalize().isOk());
  const Topology& t = m.t;
  ASSERT_EQ(t.gpus().size(), 3u);
  ASSERT_EQ(t.nics().size(), 2u);

  // Direct NVLink.
  Path p = t.path(m.gpu[0], m.gpu[1]);
  EXPECT_EQ(p.nccl, NcclClass::NVL);
  EXPECT_EQ(smiClassName(p.smi, p.nvlinks), "NV4");
  EXPECT_DOUBLE_EQ(p.bandwidthGBs, 80);
  // Through GPU1: NVB for NCCL, the PCIe class (SYS) for nvidia-smi.
  p = t.path(m.gpu[0], m.gpu[2]);
  EXPECT_EQ(p.nccl, NcclClass::NVB);
  EXPECT_EQ(p.smi, SmiClass::SYS);
  EXPECT_DOUBLE_EQ(p.bandwidthGBs, 40);
  ASSERT_EQ(p.nodes.size(), 3u);
  EXPECT_EQ(p.nodes[1], m.gpu[1]);
  // GPU0 and NIC0 under one switch (two downstream ports, one upstream port): PIX.
  p = t.path(m.gpu[0], m.nic[0]);
  EXPECT_EQ(p.nccl, NcclClass::PIX);
  EXPECT_EQ(p.smi, SmiClass::PIX);
  EXPECT_EQ(p.bridges, 1);
  EXPECT_FALSE(p.crossesHostBridge);
  EXPECT_DOUBLE_EQ(p.bandwidthGBs, 12);  // the NIC's x8 link is the bottleneck
  EXPECT_DOUBLE_EQ(p.latencyNs, 100 + 100 + 100 + 100);
  // GPU0 and NIC1: same NUMA node, different host bridges: PHB / NODE.
  p = t.path(m.gpu[0], m.nic[1]);
  EXPECT_EQ(p.nccl, NcclClass::PHB);
  EXPECT_EQ(p.smi, SmiClass::NODE);
  EXPECT_TRUE(p.crossesHostBridge);
  EXPECT_FALSE(p.crossesSocket);
  // NIC0 and GPU2: across the socket link, which is the bottleneck.
  p = t.path(m.nic[0], m.gpu[2]);
  EXPECT_EQ(p.nccl, NcclClass::SYS);
  EXPECT_EQ(p.smi, SmiClass::SYS);
  EXPECT_TRUE(p.crossesSocket);
  EXPECT_DOUBLE_EQ(p.bandwidthGBs, 10);
  bool usesSocket = false;
  for (int li : p.links) usesSocket = usesSocket || t.link(li).kind == LinkKind::Socket;
  EXPECT_TRUE(usesSocket);
  // Path nodes and links agree.
  ASSERT_EQ(p.links.size() + 1, p.nodes.size());
  for (size_t i = 0; i < p.links.size(); ++i) {
    const Link& l = t.link(p.links[i]);
    EXPECT_TRUE((l.a == p.nodes[i] && l.b == p.nodes[i + 1]) || (l.b == p.nodes[i] && l.a == p.nodes[i + 1]));
  }
  // LOC.
  p = t.path(m.nic[1], m.nic[1]);
  EXPECT_EQ(p.nccl, NcclClass::LOC);
  EXPECT_EQ(smiClassName(p.smi, 0), "X");
}

TEST(TopologyModel, SwitchUnitsAlternateBelowTheRootPort) {
  TwoSocket m = buildTwoSocket();
  ASSERT_TRUE(m.t.finalize().isOk());
  const Topology& t = m.t;
  const int usp = t.find("0000:01:00.0");
  const int dsp = t.find("02:01.0");  // short form without the domain
  const int rp = t.find("0000:00:01.0");
  ASSERT_GE(usp, 0);
  ASSERT_GE(dsp, 0);
  EXPECT_EQ(t.node(dsp).pciSwitch, usp);
  EXPECT_EQ(t.node(usp).pciSwitch, usp);
  EXPECT_EQ(t.node(rp).pciSwitch, rp);
  EXPECT_EQ(t.find("mlx5_0"), m.nic[0]);
  EXPECT_EQ(t.find("GPU2"), m.gpu[2]);
  EXPECT_EQ(t.find("nothing"), -1);
  EXPECT_EQ(t.node(m.gpu[2]).package, m.pkg[1]);
}

TEST(TopologyModel, FinalizeRefusesBrokenGraphs) {
  {
    Topology t;
    t.addNode(make(NodeKind::Gpu));  // no machine root
    EXPECT_EQ(t.finalize().code(), ridgeInvalidArgument);
  }
  {
    Topology t;
    t.addNode(make(NodeKind::Machine));
    Node a = make(NodeKind::PciBridge);
    a.parent = 2;
    Node b = make(NodeKind::PciBridge);
    b.parent = 1;
    t.addNode(a);
    t.addNode(b);
    Status s = t.finalize();
    EXPECT_EQ(s.code(), ridgeInvalidArgument);
    EXPECT_NE(s.message().find("cycle"), std::string::npos) << s.message();
  }
  {
    TwoSocket m = buildTwoSocket();
    Link bad;
    bad.kind = LinkKind::Pcie;
    bad.a = m.gpu[0];
    bad.b = m.nic[1];
    bad.bandwidthGBs = -3;
    m.t.addLink(bad);
    EXPECT_EQ(m.t.finalize().code(), ridgeInvalidArgument);
  }
  {
    TwoSocket m = buildTwoSocket();
    Link bad;
    bad.a = m.gpu[0];
    bad.b = 9999;
    m.t.addLink(bad);
    EXPECT_EQ(m.t.finalize().code(), ridgeInvalidArgument);
  }
}

}  // namespace
}  // namespace ridge::topo
