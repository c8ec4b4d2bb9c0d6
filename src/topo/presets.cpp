#include "topo/presets.h"

#include <map>

namespace ridge::topo {

namespace {

// ---- Figures and where they come from ---------------------------------------------------
//
// Bandwidths are the per-direction figures NCCL plans with (../shared/reference/
// topology-facts.md, "Bandwidth figures NCCL uses"), so Ridge's plans and NCCL's can be
// compared on the same machine. Latencies are the assumptions of the PCIe model
// (src/topo/pcie_constants.def), so `paths` and the GDR advisor agree.

// PCIe: width x per-lane code / 80, code 15, 30, 60, 120, 240, 480 for Gen1..Gen6
// (topology-facts.md): Gen4 x16 = 24 GB/s, Gen5 x16 = 48 GB/s.
double pcieGBs(int gen, int width) {
  static const int kLaneCode[] = {0, 15, 30, 60, 120, 240, 480};
  return gen >= 1 && gen <= 6 ? width * kLaneCode[gen] / 80.0 : 0;
}

// NVLink per lane (topology-facts.md): A100 20 GB/s (12 lanes = 240), Hopper 20.6 (18 = 370.8).
constexpr double kNvlinkLaneA100 = 20.0;
constexpr double kNvlinkLaneH100 = 20.6;
// Inter-socket links (topology-facts.md): AMD 16 GB/s, Sapphire Rapids 22 GB/s.
constexpr double kSocketAmd = 16.0;
constexpr double kSocketSapphireRapids = 22.0;

// Latencies (pcie_constants.def): a PCIe link 40 ns, a switch traversal 115 ns, a root
// complex 150 ns, the socket link 100 ns. A switch or root complex is a hub in the tree (the
// upstream port or host bridge sits between the ports data passes), so each edge of the hub
// carries half of its traversal: port to port through the hub then costs exactly one.
constexpr double kPcieLinkNs = 40;
constexpr double kSwitchHalfNs = 115 / 2.0;
constexpr double kRootComplexHalfNs = 150 / 2.0;
constexpr double kSocketLinkNs = 100;
// NVLink hop (GPU to NVSwitch): an assumption of the same order as a PCIe switch traversal;
// no public figure we rely on.
constexpr double kNvlinkHopNs = 100;

// PCI class codes (PCI-SIG): 3D controller, InfiniBand, Ethernet, NVMe, bridge (other).
constexpr uint32_t kClassGpu = 0x030200;
constexpr uint32_t kClassInfiniBand = 0x020700;
constexpr uint32_t kClassEthernet = 0x020000;
constexpr uint32_t kClassNvme = 0x010802;
constexpr uint32_t kClassPciBridge = 0x060400;
constexpr uint32_t kClassHostBridge = 0x060000;
constexpr uint32_t kClassOtherBridge = 0x068000;
// Vendor ids (PCI-SIG); device ids are those the named parts report.
constexpr uint16_t kVendorNvidia = 0x10de;
constexpr uint16_t kVendorMellanox = 0x15b3;
constexpr uint16_t kVendorBroadcom = 0x14e4;

// Builds the usual shapes (host bridge > root port > switch > device) with plausible, unique
// bus ids: every bridge gets the next free secondary bus, a device sits at function 0 of its
// parent bridge's secondary bus.
class Builder {
 public:
  explicit Builder(Topology* t) : t_(*t) {}

  int machine(const std::string& name) {
    Node n;
    n.kind = NodeKind::Machine;
    n.name = name;
    return t_.addNode(n);
  }

  int package(int machine, int index, const std::string& model) {
    Node n;
    n.kind = NodeKind::Package;
    n.index = index;
    n.model = model;
    const int id = t_.addNode(n);
    t_.connect(machine, id, LinkKind::Internal, 0, 0);
    return id;
  }

  int numa(int package, int index) {
    Node n;
    n.kind = NodeKind::Numa;
    n.index = index;
    const int id = t_.addNode(n);
    t_.connect(package, id, LinkKind::Internal, 0, 0);
    return id;
  }

  void socketLink(int a, int b, double gbs) {
    Link l;
    l.kind = LinkKind::Socket;
    l.a = a;
    l.b = b;
    l.bandwidthGBs = gbs;
    l.latencyNs = kSocketLinkNs;
    t_.addLink(l);
  }

  // The host bridge's edge to its NUMA node runs at the rate of its root ports (model.h).
  int hostBridge(int numa, int rootBus, int gen, int width) {
    Node n;
    n.kind = NodeKind::HostBridge;
    n.name = format("HostBridge 0000:%02x", rootBus);
    n.pciClass = kClassHostBridge;
    const int id = t_.addNode(n);
    pcie(numa, id, gen, width, kRootComplexHalfNs);
    secondary_[id] = rootBus;
    nextFunction_[id] = 0;
    nextBus_ = rootBus + 1;
    return id;
  }

  int rootPort(int hostBridge, int gen, int width) {
    const int fn = nextFunction_[hostBridge]++;
    Node n;
    n.kind = NodeKind::PciBridge;
    n.name = format("Root port 0000:%02x:%02x.%d", secondary_[hostBridge], 1 + fn / 8, fn % 8);
    n.busId = format("0000:%02x:%02x.%d", secondary_[hostBridge], 1 + fn / 8, fn % 8);
    n.pciClass = kClassPciBridge;
    const int id = t_.addNode(n);
    pcie(hostBridge, id, gen, width, kRootComplexHalfNs);
    secondary_[id] = nextBus_++;
    return id;
  }

  // A switch below `port` (a root port or another switch's downstream port): the upstream
  // port joined to `port` by a physical link, and `downstream` downstream ports, whose ids
  // are returned.
  std::vector<int> pcieSwitch(int port, int gen, int width, int downstream) {
    Node up;
    up.kind = NodeKind::PciBridge;
    up.busId = busBelow(port);
    up.name = "PCIe switch " + up.busId;
    up.pciClass = kClassPciBridge;
    const int upId = t_.addNode(up);
    pcie(port, upId, gen, width, kPcieLinkNs, true);
    secondary_[upId] = nextBus_++;
    std::vector<int> ports;
    for (int i = 0; i < downstream; ++i) {
      Node d;
      d.kind = NodeKind::PciBridge;
      d.busId = format("0000:%02x:%02x.0", secondary_[upId], i);
      d.name = "Bridge " + d.busId;
      d.pciClass = kClassPciBridge;
      const int dId = t_.addNode(d);
      pcie(upId, dId, gen, width, kSwitchHalfNs);
      secondary_[dId] = nextBus_++;
      ports.push_back(dId);
    }
    return ports;
  }

  // An endpoint below `port`, on a physical link of `gen` x `width`.
  int device(int port, Node n, int gen, int width) {
    n.busId = busBelow(port);
    const int id = t_.addNode(std::move(n));
    pcie(port, id, gen, width, kPcieLinkNs, true);
    return id;
  }

  int nvswitch(int machine, int index, const std::string& model) {
    Node n;
    n.kind = NodeKind::NvSwitch;
    n.index = index;
    n.model = model;
    n.pciClass = kClassOtherBridge;
    n.vendor = kVendorNvidia;
    const int id = t_.addNode(n);
    // The fabric is not on a PCIe data path: containment only.
    t_.connect(machine, id, LinkKind::Internal, 0, 0);
    return id;
  }

  void nvlink(int gpu, int nvswitch, int lanes, double perLaneGBs) {
    Link l;
    l.kind = LinkKind::NvLink;
    l.a = gpu;
    l.b = nvswitch;
    l.nvlinkCount = lanes;
    l.bandwidthGBs = lanes * perLaneGBs;
    l.latencyNs = kNvlinkHopNs;
    t_.addLink(l);
  }

 private:
  std::string busBelow(int port) { return format("0000:%02x:00.0", secondary_[port]); }

  // A tree edge of kind Pcie. Only physical links have a generation and width of their own;
  // the edges inside a switch or root complex carry the rate but no link parameters.
  void pcie(int parent, int child, int gen, int width, double latencyNs, bool physical = false) {
    t_.connect(parent, child, LinkKind::Pcie, pcieGBs(gen, width), latencyNs, physical ? gen : 0,
               physical ? width : 0);
  }

  Topology& t_;
  std::map<int, int> secondary_;     // bridge or host bridge id -> its secondary (child) bus
  std::map<int, int> nextFunction_;  // host bridge id -> next root port function
  int nextBus_ = 0;
};

Node gpuNode(int index, const std::string& model, uint16_t device, int sm) {
  Node n;
  n.kind = NodeKind::Gpu;
  n.index = index;
  n.cudaIndex = index;
  n.model = model;
  n.pciClass = kClassGpu;
  n.vendor = kVendorNvidia;
  n.device = device;
  n.smVersion = sm;
  n.osNames = {"cuda" + std::to_string(index)};
  return n;
}

Node connectXNode(int index, const std::string& model, uint16_t device, double gbps) {
  Node n;
  n.kind = NodeKind::Nic;
  n.index = index;
  n.model = model;
  n.pciClass = kClassInfiniBand;
  n.vendor = kVendorMellanox;
  n.device = device;
  const std::string ib = "mlx5_" + std::to_string(index);
  n.osNames = {ib, "ib" + std::to_string(index)};
  n.ports.push_back({ib + ":1", "ib" + std::to_string(index), "ACTIVE", "InfiniBand", gbps});
  // ConnectX NICs have on-chip memory that verbs can allocate (ibv_alloc_dm, see
  // gdr-write-facts.md), usable as GDR-write staging.
  n.nicDeviceMemory = true;
  return n;
}

Node nvmeNode(int index) {
  Node n;
  n.kind = NodeKind::Nvme;
  n.index = index;
  n.model = "NVMe SSD";
  n.pciClass = kClassNvme;
  n.osNames = {"nvme" + std::to_string(index) + "n1"};
  return n;
}

// ---- dgx-a100 ---------------------------------------------------------------------------
// Two AMD EPYC 7742 (Rome) in NPS4 mode: four NUMA nodes per socket. Four PCIe Gen4 switch
// trees, two per socket, each on its own quadrant: a first-level switch under a root port,
// fanning out to two second-level switches that each hold one GPU and one HDR NIC, plus an
// NVMe drive on the first level. So a GPU and the NIC beside it are PIX, the pair's other NIC
// PXB, the other tree of the socket SYS (a different NUMA node, as nvidia-smi counts it).
// NVLink: 6 NVSwitches, 2 lanes from every GPU to each (12 lanes x 20 GB/s = 240 GB/s).
void buildDgxA100(Topology* t) {
  Builder b(t);
  const int m = b.machine("dgx-a100");
  const int gen = 4, width = 16;
  // Which NUMA node of its socket each tree hangs from (GPU pairs 0-1, 2-3 on socket 0).
  const int treeNuma[4] = {3, 1, 7, 5};
  int pkgs[2], numas[8];
  for (int s = 0; s < 2; ++s) {
    pkgs[s] = b.package(m, s, "AMD EPYC 7742 64-Core Processor");
    for (int q = 0; q < 4; ++q) numas[s * 4 + q] = b.numa(pkgs[s], s * 4 + q);
  }
  b.socketLink(pkgs[0], pkgs[1], kSocketAmd);
  int gpus[8];
  for (int tree = 0; tree < 4; ++tree) {
    const int hb = b.hostBridge(numas[treeNuma[tree]], 0x20 + 0x40 * tree, gen, width);
    const int rp = b.rootPort(hb, gen, width);
    const std::vector<int> level1 = b.pcieSwitch(rp, gen, width, 3);
    for (int half = 0; half < 2; ++half) {
      const int i = tree * 2 + half;
      const std::vector<int> level2 = b.pcieSwitch(level1[static_cast<size_t>(half)], gen, width, 2);
      gpus[i] = b.device(level2[0], gpuNode(i, "A100-SXM4-80GB", 0x20b2, 80), gen, width);
      b.device(level2[1], connectXNode(i, "ConnectX-6 HDR 200G", 0x101b, 200), gen, width);
    }
    b.device(level1[2], nvmeNode(tree), gen, 4);
  }
  for (int s = 0; s < 6; ++s) {
    const int sw = b.nvswitch(m, s, "NVSwitch (A100 generation)");
    for (int g : gpus) b.nvlink(g, sw, 2, kNvlinkLaneA100);
  }
}

// ---- dgx-h100 ---------------------------------------------------------------------------
// Two Intel Xeon Platinum 8480C (Sapphire Rapids), one NUMA node each. Every GPU shares a
// PCIe Gen5 switch with one 400G NDR ConnectX-7, so each GPU's nearest NIC is PIX; each
// switch sits under a root port of its own host bridge (the CPU's PCIe stacks), so other
// NICs of the socket are NODE and those of the other socket SYS. Two NVMe drives per socket
// on root ports of a further host bridge. NVLink: 4 NVSwitches reached with 5, 4, 4 and 5
// lanes from every GPU (18 lanes x 20.6 GB/s = 370.8 GB/s).
void buildDgxH100(Topology* t) {
  Builder b(t);
  const int m = b.machine("dgx-h100");
  const int gen = 5, width = 16;
  int gpus[8];
  int pkgs[2];
  for (int s = 0; s < 2; ++s) {
    pkgs[s] = b.package(m, s, "Intel Xeon Platinum 8480C");
    const int numa = b.numa(pkgs[s], s);
    for (int k = 0; k < 4; ++k) {
      const int i = s * 4 + k;
      const int hb = b.hostBridge(numa, 0x10 + 0x20 * i, gen, width);
      const int rp = b.rootPort(hb, gen, width);
      const std::vector<int> ports = b.pcieSwitch(rp, gen, width, 2);
      gpus[i] = b.device(ports[0], gpuNode(i, "H100 80GB HBM3", 0x2330, 90), gen, width);
      b.device(ports[1], connectXNode(i, "ConnectX-7 NDR 400G", 0x1021, 400), gen, width);
    }
    const int storage = b.hostBridge(numa, 0x0c + 0x80 * s, gen, width);
    for (int d = 0; d < 2; ++d) b.device(b.rootPort(storage, gen, 4), nvmeNode(s * 2 + d), gen, 4);
  }
  b.socketLink(pkgs[0], pkgs[1], kSocketSapphireRapids);
  const int lanes[4] = {5, 4, 4, 5};
  for (int s = 0; s < 4; ++s) {
    const int sw = b.nvswitch(m, s, "NVSwitch (H100 generation)");
    for (int g : gpus) b.nvlink(g, sw, lanes[s], kNvlinkLaneH100);
  }
}

// ---- pcie-8gpu-2socket ------------------------------------------------------------------
// A common PCIe server: two AMD EPYC sockets, one NUMA node each; on each socket one root
// port feeds a Gen4 switch with two Gen4 switches below it, each holding two L40S GPUs (no
// NVLink), and a 100 GbE NIC sits directly on another root port of the same host bridge. So
// GPUs on one second-level switch are PIX, on the other one PXB, across sockets SYS, and
// every GPU reaches its socket's NIC through the host bridge (PHB). Broadcom NICs: no
// on-NIC memory for staging.
void buildPcie8Gpu(Topology* t) {
  Builder b(t);
  const int m = b.machine("pcie-8gpu-2socket");
  const int gen = 4, width = 16;
  int pkgs[2];
  for (int s = 0; s < 2; ++s) {
    pkgs[s] = b.package(m, s, "AMD EPYC 9354 32-Core Processor");
    const int numa = b.numa(pkgs[s], s);
    const int hb = b.hostBridge(numa, 0x40 + 0x80 * s, gen, width);
    const std::vector<int> level1 = b.pcieSwitch(b.rootPort(hb, gen, width), gen, width, 2);
    for (int half = 0; half < 2; ++half) {
      const std::vector<int> level2 = b.pcieSwitch(level1[static_cast<size_t>(half)], gen, width, 2);
      for (int k = 0; k < 2; ++k) {
        const int i = s * 4 + half * 2 + k;
        b.device(level2[static_cast<size_t>(k)], gpuNode(i, "L40S", 0x26b9, 89), gen, width);
      }
    }
    Node nic;
    nic.kind = NodeKind::Nic;
    nic.index = s;
    nic.model = "BCM57508 NetXtreme-E 100GbE";
    nic.pciClass = kClassEthernet;
    nic.vendor = kVendorBroadcom;
    nic.device = 0x1750;
    const std::string netdev = format("ens%df0np0", 3 + s);
    nic.osNames = {"bnxt_re" + std::to_string(s), netdev};
    nic.ports.push_back({"bnxt_re" + std::to_string(s) + ":1", netdev, "ACTIVE", "Ethernet", 100});
    b.device(b.rootPort(hb, gen, width), nic, gen, width);
  }
  b.socketLink(pkgs[0], pkgs[1], kSocketAmd);
}

// ---- cross-rc ---------------------------------------------------------------------------
// The GDR case of the design documents (gdr-write-facts.md): GPU0 and NIC0 under different
// host bridges (root complexes) of socket 0, so NIC reads of GPU memory climb through the
// CPU (NCCL: PHB, nvidia-smi: NODE); GPU1 on socket 1 reaches NIC0 across the socket link
// (SYS). Gen5 x16 everywhere; the ConnectX-7 has on-chip memory for staging.
void buildCrossRc(Topology* t) {
  Builder b(t);
  const int m = b.machine("cross-rc");
  const int gen = 5, width = 16;
  int pkgs[2], numas[2];
  for (int s = 0; s < 2; ++s) {
    pkgs[s] = b.package(m, s, "Intel Xeon Platinum 8480+");
    numas[s] = b.numa(pkgs[s], s);
  }
  b.socketLink(pkgs[0], pkgs[1], kSocketSapphireRapids);
  const int hbGpu0 = b.hostBridge(numas[0], 0x17, gen, width);
  b.device(b.rootPort(hbGpu0, gen, width), gpuNode(0, "H100 PCIe", 0x2331, 90), gen, width);
  const int hbNic = b.hostBridge(numas[0], 0x3a, gen, width);
  b.device(b.rootPort(hbNic, gen, width), connectXNode(0, "ConnectX-7 NDR 400G", 0x1021, 400), gen, width);
  const int hbGpu1 = b.hostBridge(numas[1], 0x97, gen, width);
  b.device(b.rootPort(hbGpu1, gen, width), gpuNode(1, "H100 PCIe", 0x2331, 90), gen, width);
}

struct Preset {
  const char* name;
  const char* description;
  void (*build)(Topology*);
};

const Preset kPresets[] = {
    {"dgx-a100", "2x AMD EPYC 7742, 8x A100 SXM4 (NV12 over 6 NVSwitches), 8x 200G HDR, Gen4 switch trees",
     buildDgxA100},
    {"dgx-h100", "2x Xeon 8480C, 8x H100 SXM5 (NV18 over 4 NVSwitches), 8x 400G NDR, GPU+NIC per Gen5 switch",
     buildDgxH100},
    {"pcie-8gpu-2socket",
     "2x AMD EPYC, 8x L40S on Gen4 switches (no NVLink), one 100GbE NIC per root complex", buildPcie8Gpu},
    {"cross-rc", "GPU and NIC under different root complexes of socket 0 (NODE), a GPU on socket 1 (SYS)",
     buildCrossRc},
};

}  // namespace

std::vector<std::string> presetNames() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets) out.emplace_back(p.name);
  return out;
}

std::string presetDescription(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return p.description;
  return "";
}

Status loadPreset(const std::string& name, Topology* out) {
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    Topology t;
    t.name = p.name;
    t.source = std::string("preset ") + p.name;
    p.build(&t);
    RIDGE_TRY(t.finalize());
    *out = std::move(t);
    return Status::ok();
  }
  std::string known;
  for (const Preset& p : kPresets) known += (known.empty() ? "" : ", ") + std::string(p.name);
  return makeError(ridgeInvalidArgument, "unknown preset '%s' (known: %s)", name.c_str(), known.c_str());
}

}  // namespace ridge::topo
