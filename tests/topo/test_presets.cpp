// Built-in presets (src/topo/presets.h): shapes, counts and path classes in both vocabularies,
// and Ridge's topology JSON (src/topo/topo_json.h): lossless round trips and clear errors.
#include <gtest/gtest.h>

#include <algorithm>

#include "topo/presets.h"
#include "topo/topo_json.h"

namespace ridge::topo {
namespace {

Topology preset(const std::string& name) {
  Topology t;
  Status st = loadPreset(name, &t);
  EXPECT_TRUE(st.isOk()) << st.message();
  return t;
}

Path pathByName(const Topology& t, const std::string& a, const std::string& b) {
  const int ia = t.find(a), ib = t.find(b);
  EXPECT_GE(ia, 0) << a;
  EXPECT_GE(ib, 0) << b;
  return t.path(ia, ib);
}

std::string smi(const Topology& t, const std::string& a, const std::string& b) {
  Path p = pathByName(t, a, b);
  return smiClassName(p.smi, p.nvlinks);
}

std::string nccl(const Topology& t, const std::string& a, const std::string& b) {
  return ncclClassName(pathByName(t, a, b).nccl);
}

// The NIC with the best (lowest) nvidia-smi class from `gpu`, ties to the lower index.
std::string nearestNic(const Topology& t, int gpu) {
  int best = -1;
  SmiClass bestClass = SmiClass::SYS;
  for (int nic : t.nics()) {
    const SmiClass c = t.path(gpu, nic).smi;
    if (best < 0 || c < bestClass) best = nic, bestClass = c;
  }
  return best < 0 ? "" : t.node(best).name;
}

size_t count(const Topology& t, NodeKind k) {
  return t.nodesOfKind(k).size();
}

TEST(Presets, NamesAreListedAndAllBuild) {
  const std::vector<std::string> names = presetNames();
  ASSERT_EQ(names, (std::vector<std::string>{"dgx-a100", "dgx-h100", "pcie-8gpu-2socket", "cross-rc"}));
  for (const std::string& n : names) {
    Topology t = preset(n);
    EXPECT_TRUE(t.finalized()) << n;
    EXPECT_EQ(t.name, n);
    EXPECT_EQ(t.source, "preset " + n);
    EXPECT_FALSE(presetDescription(n).empty());
    // Every device hangs below a package and NUMA node; GPU/NIC/NVMe below a host bridge.
    for (const Node& nd : t.nodes()) {
      if (nd.kind == NodeKind::Gpu || nd.kind == NodeKind::Nic || nd.kind == NodeKind::Nvme) {
        EXPECT_GE(nd.package, 0) << n << " " << nd.name;
        EXPECT_GE(nd.numa, 0) << n << " " << nd.name;
        EXPECT_GE(nd.hostBridge, 0) << n << " " << nd.name;
        EXPECT_FALSE(nd.busId.empty()) << n << " " << nd.name;
      }
    }
    // Bus ids are unique.
    std::vector<std::string> ids;
    for (const Node& nd : t.nodes())
      if (!nd.busId.empty()) ids.push_back(nd.busId);
    std::sort(ids.begin(), ids.end());
    EXPECT_EQ(std::adjacent_find(ids.begin(), ids.end()), ids.end()) << n;
  }
}

TEST(Presets, UnknownNameListsTheKnownOnes) {
  Topology t;
  Status st = loadPreset("dgx-z900", &t);
  ASSERT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), ridgeInvalidArgument);
  EXPECT_NE(st.message().find("dgx-z900"), std::string::npos);
  EXPECT_NE(st.message().find("dgx-h100"), std::string::npos);
}

TEST(Presets, DgxH100) {
  Topology t = preset("dgx-h100");
  EXPECT_EQ(count(t, NodeKind::Package), 2u);
  EXPECT_EQ(count(t, NodeKind::Numa), 2u);
  EXPECT_EQ(t.gpus().size(), 8u);
  EXPECT_EQ(t.nics().size(), 8u);
  EXPECT_EQ(count(t, NodeKind::NvSwitch), 4u);
  EXPECT_EQ(count(t, NodeKind::Nvme), 4u);
  for (int i = 0; i < 8; ++i) {
    const std::string gpu = "GPU" + std::to_string(i);
    EXPECT_EQ(nearestNic(t, t.find(gpu)), "NIC" + std::to_string(i));
    EXPECT_EQ(smi(t, gpu, "NIC" + std::to_string(i)), "PIX");
    EXPECT_EQ(nccl(t, gpu, "NIC" + std::to_string(i)), "PIX");
    EXPECT_EQ(t.node(t.find(gpu)).smVersion, 90);
    for (int j = 0; j < 8; ++j) {
      if (i == j) continue;
      Path p = pathByName(t, gpu, "GPU" + std::to_string(j));
      EXPECT_EQ(smiClassName(p.smi, p.nvlinks), "NV18");
      EXPECT_EQ(p.nccl, NcclClass::NVL);
      EXPECT_NEAR(p.bandwidthGBs, 370.8, 1e-9);
    }
  }
  // Other NICs of the socket: other host bridges of the same NUMA node; the far socket: SYS.
  EXPECT_EQ(smi(t, "GPU0", "NIC1"), "NODE");
  EXPECT_EQ(nccl(t, "GPU0", "NIC1"), "PHB");
  EXPECT_EQ(smi(t, "GPU0", "NIC4"), "SYS");
  EXPECT_EQ(nccl(t, "GPU0", "NIC7"), "SYS");
  // GPU0 -> NIC0: two Gen5 x16 links and a switch traversal.
  Path p = pathByName(t, "GPU0", "NIC0");
  EXPECT_DOUBLE_EQ(p.bandwidthGBs, 48);
  EXPECT_DOUBLE_EQ(p.latencyNs, 40 + 115 + 40);
  EXPECT_EQ(p.bridges, 1);
  for (int nic : t.nics()) {
    EXPECT_TRUE(t.node(nic).nicDeviceMemory);
    ASSERT_EQ(t.node(nic).ports.size(), 1u);
    EXPECT_EQ(t.node(nic).ports[0].rateGbps, 400);
  }
  // Across sockets the data takes the 22 GB/s socket link.
  Path far = pathByName(t, "NIC0", "NIC4");
  EXPECT_TRUE(far.crossesSocket);
  EXPECT_DOUBLE_EQ(far.bandwidthGBs, 22);
}

TEST(Presets, DgxA100) {
  Topology t = preset("dgx-a100");
  EXPECT_EQ(count(t, NodeKind::Package), 2u);
  EXPECT_EQ(count(t, NodeKind::Numa), 8u);
  EXPECT_EQ(t.gpus().size(), 8u);
  EXPECT_EQ(t.nics().size(), 8u);
  EXPECT_EQ(count(t, NodeKind::NvSwitch), 6u);
  for (int i = 0; i < 8; ++i) {
    const std::string gpu = "GPU" + std::to_string(i);
    EXPECT_EQ(nearestNic(t, t.find(gpu)), "NIC" + std::to_string(i));
    for (int j = 0; j < 8; ++j) {
      if (i == j) continue;
      Path p = pathByName(t, gpu, "GPU" + std::to_string(j));
      EXPECT_EQ(smiClassName(p.smi, p.nvlinks), "NV12");
      EXPECT_NEAR(p.bandwidthGBs, 240, 1e-9);
    }
  }
  // One switch tree: GPU and its NIC PIX, the pair's other NIC PXB (two switch levels).
  EXPECT_EQ(smi(t, "GPU0", "NIC0"), "PIX");
  EXPECT_EQ(smi(t, "GPU0", "NIC1"), "PXB");
  EXPECT_EQ(nccl(t, "GPU1", "NIC0"), "PXB");
  // The socket's other tree is on another NUMA node (NPS4): SYS in both vocabularies.
  EXPECT_EQ(smi(t, "GPU0", "NIC2"), "SYS");
  EXPECT_EQ(smi(t, "GPU0", "NIC6"), "SYS");
  for (int nic : t.nics()) {
    EXPECT_TRUE(t.node(nic).nicDeviceMemory);
    EXPECT_EQ(t.node(nic).ports[0].rateGbps, 200);
  }
  EXPECT_DOUBLE_EQ(pathByName(t, "GPU0", "NIC0").bandwidthGBs, 24);
  EXPECT_DOUBLE_EQ(pathByName(t, "NIC0", "NIC7").bandwidthGBs, 16);  // AMD socket link
}

TEST(Presets, Pcie8Gpu2Socket) {
  Topology t = preset("pcie-8gpu-2socket");
  EXPECT_EQ(t.gpus().size(), 8u);
  EXPECT_EQ(t.nics().size(), 2u);
  EXPECT_EQ(count(t, NodeKind::NvSwitch), 0u);
  for (const Link& l : t.links()) EXPECT_NE(l.kind, LinkKind::NvLink);
  EXPECT_EQ(smi(t, "GPU0", "GPU1"), "PIX");
  EXPECT_EQ(smi(t, "GPU0", "GPU2"), "PXB");
  EXPECT_EQ(nccl(t, "GPU3", "GPU0"), "PXB");
  EXPECT_EQ(smi(t, "GPU4", "GPU5"), "PIX");
  EXPECT_EQ(smi(t, "GPU0", "GPU4"), "SYS");
  EXPECT_EQ(nccl(t, "GPU3", "GPU7"), "SYS");
  // Within a socket every GPU pair is PIX or PXB, never through the CPU.
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) {
      if (i == j) continue;
      const std::string c = smi(t, "GPU" + std::to_string(i), "GPU" + std::to_string(j));
      if (i / 4 == j / 4)
        EXPECT_TRUE(c == "PIX" || c == "PXB") << i << "-" << j << " " << c;
      else
        EXPECT_EQ(c, "SYS") << i << "-" << j;
    }
  // NICs sit on root ports: the socket's GPUs reach them through the host bridge.
  EXPECT_EQ(smi(t, "GPU0", "NIC0"), "PHB");
  EXPECT_EQ(nccl(t, "GPU0", "NIC0"), "PHB");
  EXPECT_EQ(smi(t, "GPU0", "NIC1"), "SYS");
  EXPECT_EQ(nearestNic(t, t.find("GPU6")), "NIC1");
  for (int nic : t.nics()) EXPECT_FALSE(t.node(nic).nicDeviceMemory);
}

TEST(Presets, CrossRc) {
  Topology t = preset("cross-rc");
  EXPECT_EQ(t.gpus().size(), 2u);
  EXPECT_EQ(t.nics().size(), 1u);
  EXPECT_EQ(count(t, NodeKind::HostBridge), 3u);
  Path p = pathByName(t, "GPU0", "NIC0");
  EXPECT_EQ(p.nccl, NcclClass::PHB);
  EXPECT_EQ(p.smi, SmiClass::NODE);
  EXPECT_TRUE(p.crossesHostBridge);
  EXPECT_FALSE(p.crossesSocket);
  EXPECT_NE(t.node(t.find("GPU0")).hostBridge, t.node(t.find("NIC0")).hostBridge);
  EXPECT_EQ(smi(t, "GPU1", "NIC0"), "SYS");
  EXPECT_EQ(nccl(t, "GPU1", "NIC0"), "SYS");
  EXPECT_EQ(smi(t, "GPU0", "GPU1"), "SYS");
  EXPECT_TRUE(t.node(t.find("NIC0")).nicDeviceMemory);
  // Found by OS name and bus id as well.
  EXPECT_EQ(t.find("mlx5_0"), t.find("NIC0"));
  EXPECT_EQ(t.find("cuda1"), t.find("GPU1"));
}

// ---- JSON -------------------------------------------------------------------------------

void expectSameTopology(const Topology& a, const Topology& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.source, b.source);
  EXPECT_EQ(a.finalized(), b.finalized());
  EXPECT_EQ(a.root(), b.root());
  ASSERT_EQ(a.nodes().size(), b.nodes().size());
  for (size_t i = 0; i < a.nodes().size(); ++i) {
    const Node& x = a.nodes()[i];
    const Node& y = b.nodes()[i];
    SCOPED_TRACE("node " + std::to_string(i) + " " + x.name);
    EXPECT_EQ(x.kind, y.kind);
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.busId, y.busId);
    EXPECT_EQ(x.pciClass, y.pciClass);
    EXPECT_EQ(x.vendor, y.vendor);
    EXPECT_EQ(x.device, y.device);
    EXPECT_EQ(x.parent, y.parent);
    EXPECT_EQ(x.index, y.index);
    EXPECT_EQ(x.model, y.model);
    EXPECT_EQ(x.osNames, y.osNames);
    EXPECT_EQ(x.cudaIndex, y.cudaIndex);
    EXPECT_EQ(x.smVersion, y.smVersion);
    ASSERT_EQ(x.ports.size(), y.ports.size());
    for (size_t p = 0; p < x.ports.size(); ++p) {
      EXPECT_EQ(x.ports[p].name, y.ports[p].name);
      EXPECT_EQ(x.ports[p].netdev, y.ports[p].netdev);
      EXPECT_EQ(x.ports[p].state, y.ports[p].state);
      EXPECT_EQ(x.ports[p].linkLayer, y.ports[p].linkLayer);
      EXPECT_EQ(x.ports[p].rateGbps, y.ports[p].rateGbps);
    }
    EXPECT_EQ(x.nicDeviceMemory, y.nicDeviceMemory);
    EXPECT_EQ(x.package, y.package);
    EXPECT_EQ(x.numa, y.numa);
    EXPECT_EQ(x.hostBridge, y.hostBridge);
    EXPECT_EQ(x.pciSwitch, y.pciSwitch);
    EXPECT_EQ(x.children, y.children);
    EXPECT_EQ(x.links, y.links);
  }
  ASSERT_EQ(a.links().size(), b.links().size());
  for (size_t i = 0; i < a.links().size(); ++i) {
    const Link& x = a.links()[i];
    const Link& y = b.links()[i];
    SCOPED_TRACE("link " + std::to_string(i));
    EXPECT_EQ(x.kind, y.kind);
    EXPECT_EQ(x.a, y.a);
    EXPECT_EQ(x.b, y.b);
    EXPECT_EQ(x.bandwidthGBs, y.bandwidthGBs);  // exact: the writer prints round-trip digits
    EXPECT_EQ(x.latencyNs, y.latencyNs);
    EXPECT_EQ(x.pcieGen, y.pcieGen);
    EXPECT_EQ(x.pcieWidth, y.pcieWidth);
    EXPECT_EQ(x.nvlinkCount, y.nvlinkCount);
  }
}

Topology roundTrip(const Topology& t) {
  // finalize() adds a link for every tree edge the reader left unpriced, so only a finalized
  // topology writes back to the very same text.
  const std::string text = topologyToJson(t);
  Topology back;
  Status st = parseTopologyJson(text, "round-trip.json", &back);
  EXPECT_TRUE(st.isOk()) << st.message() << "\n" << text;
  // Writing what was read gives the same text: nothing was lost or reordered.
  if (t.finalized()) EXPECT_EQ(topologyToJson(back), text);
  return back;
}

TEST(TopologyJson, EveryPresetRoundTrips) {
  for (const std::string& n : presetNames()) {
    SCOPED_TRACE(n);
    Topology t = preset(n);
    Topology back = roundTrip(t);
    expectSameTopology(t, back);
    // And the derived answers agree.
    for (int g : t.gpus())
      for (int nic : t.nics()) {
        EXPECT_EQ(t.path(g, nic).nodes, back.path(g, nic).nodes);
        EXPECT_EQ(t.path(g, nic).smi, back.path(g, nic).smi);
      }
  }
}

// Everything a preset does not exercise: odd values, nodes added child-first, a 16-bit class,
// fractional rates, an explicit switch unit, empty and non-ASCII strings, a Net link.
TEST(TopologyJson, OddTopologyRoundTrips) {
  Topology t;
  t.name = "odd \"machine\"\n\xc3\xa9";
  t.source = "hand-built";
  Node gpu;
  gpu.kind = NodeKind::Gpu;
  gpu.parent = 2;  // added before its parent
  gpu.name = "";
  gpu.busId = "ffff:ff:01.0";
  gpu.pciClass = 0x0302;
  gpu.vendor = 0xffff;
  gpu.device = 0x0001;
  gpu.index = 7;
  gpu.cudaIndex = 3;
  gpu.smVersion = 100;
  gpu.osNames = {"cuda3", "", "nvml3"};
  t.addNode(gpu);
  Node machine;
  machine.kind = NodeKind::Machine;
  machine.name = "m";
  t.addNode(machine);
  Node bridge;
  bridge.kind = NodeKind::PciBridge;
  bridge.parent = 1;
  bridge.pciSwitch = 2;
  bridge.model = "tab\there";
  t.addNode(bridge);
  Node nic;
  nic.kind = NodeKind::Nic;
  nic.parent = 2;
  nic.nicDeviceMemory = true;
  nic.ports.push_back({"p0", "", "", "", 0});
  nic.ports.push_back({"p1", "eth9", "DOWN", "Ethernet", 12.5});
  t.addNode(nic);
  Node other;
  other.kind = NodeKind::PciDevice;
  other.parent = 1;
  other.pciClass = 0xff0000;
  t.addNode(other);
  Link l;
  l.kind = LinkKind::Pcie;
  l.a = 2;
  l.b = 0;
  l.bandwidthGBs = 0.1 + 0.2;  // not representable in few digits
  l.latencyNs = 1e-3;
  l.pcieGen = 6;
  l.pcieWidth = 1;
  t.addLink(l);
  Link net;
  net.kind = LinkKind::Net;
  net.a = 3;
  net.b = 4;
  net.bandwidthGBs = 12.5;
  net.nvlinkCount = 3;
  t.addLink(net);
  // Round trip before finalize (no derived fields yet) and after.
  {
    SCOPED_TRACE("not finalized");
    Topology back = roundTrip(t);
    ASSERT_TRUE(back.finalized());
    Topology copy = t;
    ASSERT_TRUE(copy.finalize().isOk());
    expectSameTopology(copy, back);
  }
  ASSERT_TRUE(t.finalize().isOk());
  expectSameTopology(t, roundTrip(t));
}

std::string parseError(const std::string& text) {
  Topology t;
  Status st = parseTopologyJson(text, "bad.json", &t);
  EXPECT_FALSE(st.isOk()) << text;
  return st.message();
}

TEST(TopologyJson, ErrorsNameFileAndLine) {
  const std::string head = "{\"version\": 1,\n\"nodes\": [\n{\"kind\": \"machine\"},\n";
  EXPECT_EQ(parseError(head + "{\"kind\": \"gpus\", \"parent\": 0}]}"),
            "bad.json:4: node 1: unknown kind \"gpus\" (one of: machine, package, numa, hostbridge, bridge, "
            "gpu, nic, nvswitch, nvme, pci)");
  EXPECT_EQ(parseError(head + "{\"kind\": \"gpu\", \"parent\": 0, \"smversion\": 90}]}"),
            "bad.json:4: node 1: unknown field \"smversion\"");
  EXPECT_EQ(parseError(head + "{\"kind\": \"gpu\", \"parent\": 5}]}"),
            "bad.json:4: node 1: \"parent\" = 5 is outside [-1, 1]");
  EXPECT_EQ(
      parseError(head + "{\"kind\": \"gpu\", \"parent\": 0, \"smVersion\": \"ninety\"}]}"),
      "bad.json:4: node 1: \"smVersion\" must be an integer or a hex string like \"0x10de\", not string");
  EXPECT_EQ(parseError(head + "{\"kind\": \"gpu\", \"parent\": 0, \"smVersion\": 9.5}]}"),
            "bad.json:4: node 1: \"smVersion\" must be an integer, not number");
  EXPECT_EQ(parseError(head + "{\"kind\": \"gpu\", \"parent\": 0, \"id\": 3}]}"),
            "bad.json:4: node 1: \"id\" is 3 but the node is at position 1 of \"nodes\" (ids are positions)");
  EXPECT_EQ(
      parseError(head + "{\"kind\": \"gpu\", \"parent\": 0}],\n\"links\": [\n{\"kind\": \"pcie\", \"a\": 0, "
                        "\"b\": 1, \"bandwidthGBs\": -1}]}"),
      "bad.json:6: link 0: \"bandwidthGBs\" = -1 is outside [0, 100000]");
  EXPECT_EQ(
      parseError(head + "{\"kind\": \"gpu\", \"parent\": 0}],\n\"links\": [{\"kind\": \"pcie\", \"a\": 0}]}"),
      "bad.json:5: link 0: missing \"b\"");
  EXPECT_EQ(parseError("{\"version\": 2, \"nodes\": []}"),
            "bad.json:1: version 2 is newer than this build reads (1)");
  EXPECT_EQ(parseError("{\"nodes\": [{\"kind\": \"machine\"}]}"), "bad.json:1: missing \"version\"");
  EXPECT_EQ(parseError("{\"version\": 1, \"nodes\": []}"), "bad.json:1: \"nodes\" must be a non-empty array");
  EXPECT_EQ(parseError("[]"), "bad.json:1: a Ridge topology must be a JSON object");
  EXPECT_EQ(parseError("{\"version\": 1, \"format\": \"nccl\", \"nodes\": [1]}"),
            "bad.json:1: \"format\" is \"nccl\", expected \"ridge-topology\"");
  // Syntax errors come from the JSON parser with line and column.
  EXPECT_EQ(parseError(head + "{\"kind\": \"gpu\" \"parent\": 0}]}"),
            "bad.json:4:16: expected ',' or '}' in object, found '\"'");
  // Graph errors from finalize() are prefixed with the file.
  EXPECT_EQ(parseError(head + "{\"kind\": \"gpu\"}]}").rfind("bad.json: topology", 0), 0u);
}

TEST(TopologyJson, AcceptsHandWrittenFiles) {
  Topology t;
  Status st = parseTopologyJson(R"({
    "version": 1, "name": "tiny",
    "nodes": [
      {"kind": "machine"},
      {"kind": "package", "parent": 0},
      {"kind": "numa", "parent": 1},
      {"kind": "hostbridge", "parent": 2},
      {"kind": "gpu", "parent": 3, "vendor": "0x10de", "pciClass": 197120},
      {"kind": "nic", "parent": 3, "ports": [{"name": "mlx5_0:1", "rateGbps": 200}]}
    ],
    "links": [{"kind": "pcie", "a": 3, "b": 4, "bandwidthGBs": 24, "pcieGen": 4, "pcieWidth": 16}]
  })",
                                "tiny.json", &t);
  ASSERT_TRUE(st.isOk()) << st.message();
  EXPECT_EQ(t.gpus().size(), 1u);
  EXPECT_EQ(t.node(4).vendor, 0x10de);
  EXPECT_EQ(t.node(4).pciClass, 0x030200u);
  EXPECT_EQ(t.node(4).name, "GPU0");  // named by finalize()
  Path p = t.path(t.find("GPU0"), t.find("mlx5_0:1"));
  EXPECT_EQ(p.smi, SmiClass::PHB);
  EXPECT_DOUBLE_EQ(p.bandwidthGBs, 24);
}

}  // namespace
}  // namespace ridge::topo
