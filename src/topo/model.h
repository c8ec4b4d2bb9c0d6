// The topology graph of one machine, and of a cluster of them.
//
// Nodes are the things data passes through or ends at: the machine, processor packages,
// NUMA nodes, PCIe host bridges (root complexes), PCIe bridges (root ports and switch
// ports), GPUs, NICs, NVSwitches, NVMe drives and other PCI functions. They form a tree
// (Machine > Package > NUMA node > host bridge > bridges > devices) kept in `parent`, plus
// links that are not tree edges: the inter-socket link between packages and NVLinks
// between GPUs and NVSwitches.
//
// Every edge is a Link with a per-direction bandwidth (GB/s, 10^9 bytes, as NCCL counts)
// and a latency. A Path between two devices is the route data takes: the tree route for
// PCIe (through the lowest common ancestor, over the socket link when packages differ) or
// NVLink when the GPUs have it. Its bandwidth is the minimum over its links and its class
// the worst hop, in the two vocabularies users know (NCCL's and nvidia-smi's, see
// docs/topology.md).
//
// Readers (hwloc, NCCL XML, Ridge JSON, presets) fill a Topology through addNode/addLink
// and call finalize(), which checks the graph and derives what queries need. The graph
// is then immutable and cheap to share between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace ridge::topo {

enum class NodeKind : uint8_t {
  Machine,
  Package,     // processor package (socket)
  Numa,        // NUMA node (memory + the cores near it)
  HostBridge,  // PCIe host bridge: the root complex a PCIe hierarchy hangs from
  PciBridge,   // a PCIe bridge: a root port or a switch port
  Gpu,
  Nic,
  NvSwitch,
  Nvme,
  PciDevice,  // any other PCI function (kept so that trees read like lstopo's)
};

enum class LinkKind : uint8_t {
  Internal,  // containment with no modelled cost: machine-package, package-NUMA node
  Pcie,      // a PCIe link (host bridge to its NUMA node counts as one, at the root port's rate)
  Socket,    // inter-socket link (UPI, xGMI, ...) between two packages
  NvLink,    // one or more NVLink lanes between two GPUs or a GPU and an NVSwitch
  Net,       // a NIC port to the network (cluster view)
};

const char* nodeKindName(NodeKind k);
const char* linkKindName(LinkKind k);

/// One port of a NIC, from sysfs/verbs or a file.
struct NicPort {
  std::string name;       ///< "mlx5_0:1" or the netdev name "eth0"
  std::string netdev;     ///< network interface name when known
  std::string state;      ///< "ACTIVE", "DOWN", ... ("" unknown)
  std::string linkLayer;  ///< "InfiniBand", "Ethernet" ("" unknown)
  double rateGbps = 0;    ///< signalling rate in Gb/s (400 for NDR), 0 unknown
};

/// True for a port of an RDMA (verbs) device, named "<device>:<port>" ("mlx5_0:1",
/// "efa_0:1"), as readers name the ports sysfs/hwloc/NCCL files list under a verbs device;
/// a port named by its network interface alone ("eth0") is TCP only.
bool isVerbsPort(const NicPort& p);

struct Node {
  NodeKind kind = NodeKind::PciDevice;
  std::string name;       ///< display name: "GPU0", "NIC1", "PCIe switch 0000:05:00.0", "NUMA0"
  std::string busId;      ///< "0000:3b:00.0" for PCI functions, "" otherwise
  uint32_t pciClass = 0;  ///< 24-bit class code (0x030200) or 16-bit (0x0302); 0 unknown
  uint16_t vendor = 0, device = 0;
  int parent = -1;                   ///< tree parent (node id), -1 for the machine
  int index = -1;                    ///< per-kind ordinal: GPU 0..n-1, NIC 0..n-1, package/NUMA os index
  std::string model;                 ///< "H100 80GB HBM3", "ConnectX-7", CPU model, ...
  std::vector<std::string> osNames;  ///< "cuda0", "nvme0n1", "mlx5_0", "ens5"
  /// NUMA nodes: their CPUs in the kernel's list syntax ("0-55,112-167"); "" unknown.
  std::string cpus;
  // GPU
  int cudaIndex = -1;  ///< CUDA device ordinal when known
  int smVersion = 0;   ///< 90 for Hopper, 0 unknown
  // NIC
  std::vector<NicPort> ports;
  bool nicDeviceMemory = false;  ///< NIC has on-chip memory usable as staging (mlx5 DM)
  // Derived by finalize():
  int package = -1;     ///< id of the Package node above it (-1 none)
  int numa = -1;        ///< id of the Numa node above it (-1 none)
  int hostBridge = -1;  ///< id of the HostBridge above it (-1 none)
  int pciSwitch = -1;   ///< bridges only: id of the bridge that stands for its switch unit
  std::vector<int> children;
  std::vector<int> links;  ///< ids of the links touching this node
};

/// Whether a NIC can be a GPUDirect/RDMA target: a verbs port when the source listed ports,
/// else (a file that lists PCI functions only) its PCI identity: InfiniBand class, a
/// Mellanox/NVIDIA ConnectX or BlueField, an AWS EFA. A 1 GbE port or any other Ethernet
/// function without a verbs device is not.
bool nicHasRdma(const Node& nic);

struct Link {
  LinkKind kind = LinkKind::Internal;
  int a = -1, b = -1;              ///< node ids; for tree links `a` is the parent
  double bandwidthGBs = 0;         ///< per direction, GB/s (10^9 B/s); 0 = unknown
  double latencyNs = 0;            ///< one-way latency of the hop
  int pcieGen = 0, pcieWidth = 0;  ///< PCIe links when known
  int nvlinkCount = 0;             ///< NvLink: number of lanes bundled in this link
  int other(int node) const { return node == a ? b : a; }
};

/// NCCL's path classes, best to worst (printed by name: NCCL's numbers changed across
/// releases).
enum class NcclClass : uint8_t { LOC, NVL, NVB, PIX, PXB, PHB, SYS, NET };
/// nvidia-smi topo -m's classes (NV# carries the lane count in Path::nvlinks).
enum class SmiClass : uint8_t { X, NV, PIX, PXB, PHB, NODE, SYS };

const char* ncclClassName(NcclClass c);
std::string smiClassName(SmiClass c, int nvlinks);  ///< "NV18", "PIX", ...

struct Path {
  std::vector<int> nodes;   ///< from the source to the destination, both included
  std::vector<int> links;   ///< nodes.size() - 1 link ids, in order
  double bandwidthGBs = 0;  ///< bottleneck (minimum over links with a known bandwidth)
  double latencyNs = 0;     ///< sum over links
  NcclClass nccl = NcclClass::LOC;
  SmiClass smi = SmiClass::X;
  int nvlinks = 0;  ///< lanes on an NVLink path (NVL/NV#), else 0
  int bridges = 0;  ///< PCIe switch units traversed (root ports count as one each)
  bool crossesHostBridge = false;
  bool crossesSocket = false;
};

class Topology {
 public:
  std::string name;    ///< "dgx-h100", the hostname, or the file name
  std::string source;  ///< "hwloc 2.9.0 (this machine)", "hwloc XML <file>", "preset dgx-h100"
  double loadMs = 0;   ///< time discovery or loading took

  /// Adds a node (its `parent` must already exist or be -1) and returns its id.
  int addNode(Node n);
  /// Adds a link; for a tree edge pass the parent as `a`. Returns its id.
  int addLink(Link l);
  /// Adds the tree edge parent->child as a link of `kind` (and sets child.parent), with the
  /// PCIe generation and width when known (0: not a physical PCIe link, or unknown).
  int connect(int parent, int child, LinkKind kind, double bandwidthGBs, double latencyNs, int pcieGen = 0,
              int pcieWidth = 0);

  /// Checks the graph (one machine root, parents exist, no cycles, link ends valid, values
  /// sane) and derives children, package/NUMA/host bridge of every node, switch units and
  /// per-kind indices where the reader left them unset. Must be called once after loading.
  Status finalize();
  bool finalized() const { return finalized_; }

  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Link>& links() const { return links_; }
  const Node& node(int id) const { return nodes_[static_cast<size_t>(id)]; }
  Node& mutableNode(int id) { return nodes_[static_cast<size_t>(id)]; }
  const Link& link(int id) const { return links_[static_cast<size_t>(id)]; }
  int root() const { return root_; }

  /// Node ids of one kind, in per-kind index order (GPU0, GPU1, ...).
  std::vector<int> nodesOfKind(NodeKind k) const;
  std::vector<int> gpus() const { return nodesOfKind(NodeKind::Gpu); }
  std::vector<int> nics() const { return nodesOfKind(NodeKind::Nic); }
  /// The NICs that can move data by RDMA (nicHasRdma); every NIC when none can (a machine
  /// whose network is TCP only still has its NICs).
  std::vector<int> rdmaNicsOrAll() const;

  /// Finds a device by display name ("GPU3", "NIC0"), OS name ("mlx5_0", "cuda1", "eth0")
  /// or bus id ("0000:3b:00.0", "3b:00.0"); -1 when nothing matches.
  int find(const std::string& what) const;

  /// The route between two nodes (see the file comment). a == b gives a LOC path.
  Path path(int a, int b) const;

  /// The link joining two nodes directly, or -1.
  int linkBetween(int a, int b) const;

 private:
  std::vector<Node> nodes_;
  std::vector<Link> links_;
  int root_ = -1;
  bool finalized_ = false;

  Path treePath(int a, int b) const;
};

/// One tier of a cluster network (leaf, spine, ...).
struct NetworkTier {
  std::string name;             ///< "leaf", "spine"
  int radix = 0;                ///< ports per switch
  double linkGbps = 0;          ///< per port
  double latencyNs = 0;         ///< per switch traversal
  double oversubscription = 1;  ///< downlink:uplink bandwidth ratio at this tier (1 = non-blocking)
};

/// The network between nodes: rails (NIC i of every node on rail i's switches) and tiers.
struct NetworkDescription {
  int rails = 0;  ///< 0: every NIC sees one fabric (no rail alignment)
  std::vector<NetworkTier> tiers;
  double nicGbps = 0;  ///< per NIC port, 0: take it from the node topology
  double wireLatencyNs = 0;
};

/// A cluster: a list of node topologies (usually one shared description repeated) and the
/// network between them.
struct Cluster {
  std::vector<std::shared_ptr<const Topology>> nodes;
  NetworkDescription network;
};

}  // namespace ridge::topo
