// The cost model: predicted time of a collective on a plan (docs/planner.md, "Cost model").
//
//   time = latency(algorithm, protocol, hops) + max over resources (bytes on it / capacity)
//                                                / efficiency(protocol)
//
// Bytes on each resource come from the plan: every edge of every channel that runs the
// collective adds its share of the message to the resources its routes load (link
// directions, NIC ports, fabric uplinks of the network description). The slowest
// resource sets the bandwidth term, so the model also says where the bottleneck is.
// Sizes follow nccl-tests: allreduce/broadcast/reduce the buffer, allgather the output,
// reducescatter the input, alltoall the send buffer; busbw = algbw times the factor
// nccl-tests uses.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "plan/algo_rules.h"
#include "plan/plan.h"

namespace ridge::plan {

enum class Algorithm : uint8_t { Ring, Tree, Hier, AllPairs };
constexpr int kAlgorithmCount = 4;
enum class Protocol : uint8_t { LL, LL128, Simple };
constexpr int kProtocolCount = 3;
const char* algorithmName(Algorithm a);
const char* protocolName(Protocol p);

/// nccl-tests' busbw factor: allreduce 2(n-1)/n, allgather/reducescatter/alltoall (n-1)/n,
/// broadcast/reduce 1.
double busBandwidthFactor(Coll coll, int nranks);

struct Estimate {
  bool valid = false;
  Coll coll = Coll::AllReduce;
  size_t bytes = 0;
  Algorithm algo = Algorithm::Ring;
  Protocol proto = Protocol::Simple;
  int channels = 0;  ///< ring/tree channels the data is split over (trees: tree pairs)
  double latencyUs = 0, timeUs = 0, algbwGBs = 0, busbwGBs = 0;
  std::string bottleneck;  ///< the resource that sets the bandwidth term
};

/// Bytes a resource carries, for one collective of a given size.
struct ResourceLoad {
  std::string name;
  double capacityGBs = 0;
  double bytes = 0;
  double busyUs = 0;  ///< bytes / capacity
};

class CostModel {
 public:
  explicit CostModel(std::shared_ptr<const Plan> plan);

  bool supports(Coll coll, Algorithm algo) const;
  /// Best protocol and channel count for a fixed algorithm (invalid when unsupported).
  Estimate estimate(Coll coll, size_t bytes, Algorithm algo) const;
  /// Best over algorithms; a rule from RIDGE_ALGO syntax that covers (coll, bytes) and names
  /// an algorithm this model prices forces it.
  Estimate best(Coll coll, size_t bytes, const std::vector<AlgoRule>* rules = nullptr) const;
  /// Busiest resources for (coll, bytes) with the chosen estimate's algorithm and channels,
  /// busiest first (at most `limit`).
  std::vector<ResourceLoad> loads(const Estimate& e, size_t limit) const;

  const Plan& plan() const { return *plan_; }

 private:
  // Bytes per message byte on each node resource (worst node) and each fabric resource.
  struct Profile {
    std::vector<double> node;          // by template resource
    std::map<int64_t, double> fabric;  // key: fabricKey()
    double worstTimePerByte = 0;       // ns per byte: max load / capacity
    std::string worst;
  };
  struct Phase {
    const Profile* profile;
    double latencyUs[kProtocolCount];
  };
  const Profile& profile(Coll coll, Algorithm algo, int phase, int channels) const;
  void finishProfile(Profile* p) const;
  void addRoute(std::vector<double>* v, int route, double coef) const;
  void addFabric(Profile* p, int fromNode, int toNode, int nic, double coef) const;
  int tiersCrossed(int a, int b, int nic, std::vector<int64_t>* groups) const;
  double netHopExtraUs(int a, int b) const;
  double fabricCapacity(int64_t key) const;
  std::string fabricName(int64_t key) const;
  std::vector<int> channelCandidates(size_t bytes, int maxChannels) const;
  double hopLatencyUs(Transport t, Protocol p) const;
  bool protocolAllowed(Protocol p) const;
  void phases(Coll coll, Algorithm algo, int channels, std::vector<Phase>* out) const;

  std::shared_ptr<const Plan> plan_;
  std::vector<int> fabricGroupNodes_;       // nodes per group at each non-top tier
  double intraHopUs_[kProtocolCount] = {};  // mean per intra-node hop of the ring channels
  double netHopUs_[kProtocolCount] = {};
  double netExtraUs_ = 0;  // mean extra latency of a ring's network hop: fabric tiers, send mode
  bool hasPcieOrShm_ = false;
  mutable std::map<int64_t, std::unique_ptr<Profile>> cache_;
};

}  // namespace ridge::plan
