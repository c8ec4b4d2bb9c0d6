// The planner's output: how the ranks of a communicator move data.
//
// A plan is a set of channels. A channel is a ring or a tree over ranks (the data of a
// collective is split evenly across the channels that run it); a rail channel is the
// inter-node ring of the hierarchical algorithms. Every edge of a channel says which
// transport carries it (NVLink, PCIe P2P, host shared memory, the network through
// GPUDirect RDMA or host staging, TCP) and, through its routes, which topology links it
// loads.
//
// Ranks map to devices block-wise: rank r lives on node r / ranksPerNode and is local
// device r % ranksPerNode of that node (a GPU when the node has enough, otherwise a NUMA
// node: host ranks). All nodes share one node type: the ring search runs once on it
// (NodeTemplate) and the result is replicated across nodes, so 4096 nodes cost little
// more than one (docs/planner.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "topo/gdr_advisor.h"
#include "topo/model.h"

namespace ridge::plan {

/// What carries an edge.
enum class Transport : uint8_t {
  NvLink,   ///< GPU to GPU over NVLink (direct, through NVSwitches or one relay GPU)
  PcieP2p,  ///< GPU to GPU over PCIe peer-to-peer
  HostShm,  ///< through host memory on one node (host ranks, or GPUs too far apart for P2P)
  Net,      ///< between nodes through NICs (RDMA)
  Tcp,      ///< between nodes through the kernel's TCP stack
};
/// How a network edge reads its data on the sending side and writes it on the receiving side.
enum class NetMode : uint8_t {
  None,        ///< not a network edge
  GdrRead,     ///< sender: the NIC reads GPU memory (GPUDirect RDMA read)
  GdrWrite,    ///< receiver: the NIC writes GPU memory (GPUDirect RDMA write)
  HostStaged,  ///< through a host-memory buffer (GPU to host copy, NIC reads/writes host memory)
  Pxn,         ///< sender: relayed over NVLink to the GPU next to the NIC, which the NIC reads
};

const char* transportName(Transport t);
const char* netModeName(NetMode m);

/// One direction of a resource a route loads, with the share of the route's traffic it
/// carries (below 1 when a route spreads over parallel links, e.g. several NVSwitches).
struct ResourceUse {
  int32_t resource;
  float weight;
};

/// How data moves between two devices of one node, or between a device and a NIC.
struct Route {
  std::vector<ResourceUse> uses;
  Transport transport = Transport::HostShm;
  NetMode mode = NetMode::None;  ///< NIC routes only
  topo::NcclClass nccl = topo::NcclClass::LOC;
  int socketCrossings = 0;
  double bandwidthGBs = 0;  ///< alone on an idle node (min over uses of capacity / weight)
  double latencyNs = 0;     ///< sum of the topology links' latencies
  /// Network send routes: the GDR advisor's modeled latency of the route's mode for the
  /// smallest size (GPU data to the NIC, doorbell included); 0 elsewhere.
  double modeLatencyNs = 0;
};

/// The resources of one node type: one per link direction, one per NIC port direction
/// (the network side of the NIC) and one per device for host ranks (a core's copy rate).
struct ResourceTable {
  std::vector<double> capacityGBs;  ///< by resource id; +inf = not a constraint
  std::vector<std::string> names;   ///< "GPU0->NVSwitch1 nvlink", "NIC3 port out"
  int linkResources = 0;            ///< ids [0, 2 * links) are link directions
  int nicPortBase = 0;              ///< NIC slot s: nicPortBase + 2s (out), + 2s + 1 (in)
  int deviceBase = -1;              ///< host ranks: device i's copy resource, else -1
  int nicModeBase = -1;             ///< GPU a to NIC slot s in its mode: nicModeBase + a * nics + s
};

/// How one GPU sends through one NIC: the GDR advisor's choice for the pair (or the mode
/// forced by RIDGE_GDR_MODE) with the PCIe model's figures for that mode.
struct NicPairMode {
  topo::GdrOption option = topo::GdrOption::HostStaged;
  double latencyNs = 0;     ///< modeled latency at the advisor's first small size (8 B)
  double bandwidthGBs = 0;  ///< modeled bandwidth at its large size (64 MiB), port-capped
  std::string why;          ///< "GDR advisor (latency): ..." or "forced by RIDGE_GDR_MODE"
};

/// The ring of one channel inside one node (the part replicated on every node).
struct ChannelTemplate {
  std::vector<int> order;   ///< local device indices; single node: a cycle, else entry first
  std::vector<int> hops;    ///< route ids: order[i] -> order[i+1]; single node also last -> first
  int nic = -1;             ///< NIC slot (index into NodeTemplate::nics), multi-node only
  int entryRoute = -1;      ///< NIC -> order.front()
  int exitRoute = -1;       ///< order.back() -> NIC (direct or relayed, see NetMode::Pxn)
  double speedGBs = 0;      ///< bandwidth reserved for this channel on every resource it uses
  int socketCrossings = 0;  ///< inter-socket link traversals of one trip through the node
};

struct SearchOptions {
  int maxChannels = 16;
  /// DFS steps (device visits) the whole search may take; when they run out the best set
  /// found so far is kept, and with none a single channel in device order.
  int64_t stepBudget = int64_t{1} << 20;
  /// Most bandwidth one channel may get (GB/s): one channel is a handful of GPU thread
  /// blocks and cannot drive a whole NVSwitch port set (NCCL's Hopper ladder tops at 60).
  double maxChannelGBs = 60;
  /// Network sends of GPU ranks: every GPU-NIC pair takes the GDR advisor's mode (PCIe model
  /// with `pcieConstants`) unless one is forced here (RIDGE_GDR_MODE=read|write|staged).
  std::optional<topo::GdrOption> forcedGdrMode;
  /// Network edges go through the kernel's TCP stack: sends and receives both pass through
  /// host memory whatever the GPU-NIC pair could do, and nothing else forces that. The one
  /// place TCP makes a route host staged (nicPairModes and the receive routes, search.cpp).
  bool tcp = false;
  topo::PcieConstants pcieConstants;
  /// Topology node ids of the GPUs the local ranks serve, in local rank order (a
  /// communicator's ranks' devices, found by bus id). Empty: the node's first ranksPerNode
  /// GPUs in index order (ridge-topo plan), which is the same plan when rank i serves GPU i.
  std::vector<int> localGpus;
};

/// RIDGE_GDR_MODE as the planner reads it: read, write or staged force that mode on every
/// GPU-NIC pair; off, auto (or unset) leave each pair to the GDR advisor.
Status gdrModeFromSettings(std::optional<topo::GdrOption>* out);

struct SearchStats {
  int64_t steps = 0;
  int speedsTried = 0;
  bool budgetExhausted = false;
  bool fallback = false;  ///< nothing found: one channel in device order
  double ms = 0;
};

/// The search result for one node type; shared by every node of that type.
struct NodeTemplate {
  std::shared_ptr<const topo::Topology> topology;
  std::vector<int> devices;  ///< local index -> topology node id (GPU, or NUMA node for host ranks)
  bool hostRanks = false;
  std::vector<int> nics;     ///< NIC slot -> topology node id
  std::vector<int> nicRail;  ///< NIC slot -> rail
  double nicGBs = 0;         ///< network bandwidth of one NIC port, per direction
  bool multiNode = false;
  ResourceTable resources;
  std::vector<Route> routes;
  std::vector<int> pairRoute;         ///< [a * k + b]: route id from local device a to b (-1 for a == b)
  std::vector<int> nicSend;           ///< [a * nics + s]: device a to NIC slot s (direct)
  std::vector<int> nicRecv;           ///< [s * k + a]: NIC slot s to device a
  std::vector<NicPairMode> nicModes;  ///< [a * nics + s]: GPU ranks, multi-node only
  std::vector<ChannelTemplate> channels;
  SearchStats stats;

  int localCount() const { return static_cast<int>(devices.size()); }
  std::string deviceName(int local) const;
};

/// Builds the devices, resources and routes of a node type and searches its channels.
/// `ranksPerNode` devices are used (GPUs when there are that many, else NUMA nodes);
/// `multiNode` makes every channel enter and leave through a NIC; `network` gives the NIC
/// bandwidth and rails.
Status buildNodeTemplate(std::shared_ptr<const topo::Topology> topology, int ranksPerNode, bool multiNode,
                         const topo::NetworkDescription& network, const SearchOptions& options,
                         NodeTemplate* out);

enum class ChannelKind : uint8_t { Ring, Tree, Rail };
const char* channelKindName(ChannelKind k);

/// One edge of a channel. Intra-node edges use `route` of the node template; network edges
/// use `route` on the sending node (device to NIC) and `recvRoute` on the receiving node.
struct Edge {
  int32_t from = -1, to = -1;  ///< ranks
  int32_t route = -1;
  int32_t recvRoute = -1;
  int16_t nic = -1;  ///< network edges: NIC slot used on both nodes (rail-aligned)
  Transport transport = Transport::HostShm;
  NetMode sendMode = NetMode::None, recvMode = NetMode::None;
  bool up = true;  ///< trees: child to parent (reduce direction); false: parent to child
};

struct Channel {
  ChannelKind kind = ChannelKind::Ring;
  int templateChannel = 0;  ///< which ChannelTemplate its intra-node parts follow
  int treeIndex = -1;       ///< trees: 0 (in-order) or 1 (mirrored / shifted)
  int nic = -1;             ///< NIC slot it enters and leaves nodes through (-1 single node)
  double speedGBs = 0;
  std::vector<int> ranks;   ///< ring / rail: the cycle in order; tree: every rank, root first
  std::vector<int> parent;  ///< trees: parent of each rank (indexed by rank; -1 root)
  int root = -1;
  std::vector<Edge> edges;  ///< ring: ranks[i] -> ranks[i+1 mod n]; tree: up and down edges
  int depthNodes = 0;       ///< trees: depth of the inter-node tree (edges root to deepest leaf)
};

struct Plan {
  int nranks = 0, nodes = 1, ranksPerNode = 0;
  std::shared_ptr<const NodeTemplate> node;
  topo::NetworkDescription network;
  bool tcp = false;               ///< inter-node edges go through TCP rather than RDMA
  std::vector<Channel> rings;     ///< one per ring channel
  std::vector<Channel> trees;     ///< two per ring channel (tree 0 and tree 1) when nodes > 1
  std::vector<Channel> rails;     ///< hierarchical: one inter-node ring per local index
  std::string source = "search";  ///< "search", "file <path>", "host placement"
  double buildMs = 0;

  int nodeOf(int rank) const { return rank / ranksPerNode; }
  int localOf(int rank) const { return rank % ranksPerNode; }
};

struct PlanRequest {
  int nranks = 0;
  int nodes = 1;         ///< 0: nranks / GPUs per node
  int ranksPerNode = 0;  ///< 0: nranks / nodes
  topo::NetworkDescription network;
  bool tcp = false;
  bool buildTrees = true;
  bool buildRails = true;
  SearchOptions search;
};

/// The network description a plan assumes when none is given (ridge-topo plan without
/// --network, and a communicator's plan): NICs as the topology has them, one fabric.
constexpr const char* kDefaultNetworkSpec = "rails=0";

/// Builds the plan of `request` on a cluster of identical nodes of type `node`.
Status buildPlan(std::shared_ptr<const topo::Topology> node, const PlanRequest& request, Plan* out);

/// Parses a network description: comma-separated key=value pairs
///   rails=8            NIC i of every node on rail i mod 8 (0: one fabric)
///   nic=400G           per NIC port (G/M suffix in bit/s, or a plain number of Gb/s)
///   tiers=leaf:64:400G[:2][:600ns],spine:64:400G
///                      name:radix:port speed[:oversubscription][:switch latency]
///   latency=1us        wire latency added to every network hop
///   transport=rdma|tcp
/// `tcp` (may be null) receives transport=tcp.
Status parseNetworkSpec(const std::string& spec, topo::NetworkDescription* out, bool* tcp);
std::string formatNetworkSpec(const topo::NetworkDescription& net, bool tcp);

/// The in-order binary tree over `count` items: parent of each (−1 for the root), and its
/// depth (edges from the root to the deepest leaf). Items with an even index are leaves.
int inOrderBinaryTree(int count, std::vector<int>* parent);
/// The second tree of the double binary tree: item i plays the role of item map(i) of the
/// first, map = mirror (count - 1 - i) for an even count, shift ((i + 1) mod count) for odd.
int secondTreeItem(int i, int count);

/// Names of the route's resources, " + "-joined (for printing).
std::string routeText(const NodeTemplate& t, int route);

}  // namespace ridge::plan
