// Which algorithm runs a collective of a given size. By default the host cost model
// (src/plan/host_cost.h) prices all-pairs, ring (a chain for Broadcast/Reduce), direct
// (CMA single copy, when every peer's memory is reachable) and tree per collective, rank
// count and size; the selector asks it once at setup for every size class and keeps the
// answers in a table. The measured crossovers (RIDGE_ALLPAIRS_MAX, RIDGE_DIRECT_MIN/MAX,
// docs/performance.md) take over when the user sets any of them or where the model does
// not price the transport. RIDGE_ALGO ("allreduce:0-64K:allpairs;allreduce:64K-:ring",
// parsed by the planner's src/plan/algo_rules.h, which the simulator shares) wins over both.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/status.h"
#include "plan/host_cost.h"

namespace ridge {

enum class CollType { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AlltoAll, Send, Recv };
// Sends and receives: point to point, the rest are collectives (every rank takes part).
inline bool isExchange(CollType t) {
  return t == CollType::Send || t == CollType::Recv;
}
// Tree: a binary tree over the ring order (plan::hostTreeLinks), pipelined in chunks:
// reduce up to the root, broadcast down, or both for allreduce. Other collectives asked to
// run "tree" or "hier" run the ring: those are the GPU planner's algorithms
// (docs/planner.md).
enum class Algo { AllPairs, Ring, Direct, Tree };
constexpr int kAlgoCount = 4;

const char* collTypeName(CollType t);
const char* algoName(Algo a);

// What decides the default algorithm where RIDGE_ALGO says nothing.
struct AlgoDefaults {
  int nranks = 2;
  bool directAvailable = false;  // the transport gives peer-memory access to every rank
  // The measured crossovers instead of the cost model: set when the user sets any of
  // RIDGE_ALLPAIRS_MAX, RIDGE_DIRECT_MIN, RIDGE_DIRECT_MAX, and where the model does not
  // price the transport (ranks on several hosts, or RIDGE_SHM=0).
  bool fixedCrossovers = false;
  size_t allPairsMax = 64 << 10;
  size_t directMin = 256 << 10;
  size_t directMax = 8 << 20;
  plan::HostConstants constants;  // the model's (RIDGE_HOST_COST overrides the defaults)
};

class AlgoSelector {
 public:
  // Parses `overrides` (RIDGE_ALGO syntax; a malformed entry is reported in the returned
  // status and ignored) and fills the default choice of every collective for every size
  // class (powers of two) from the cost model or the fixed crossovers: choose() only
  // looks it up.
  Status configure(const std::string& overrides, const AlgoDefaults& defaults);
  // `bytes` is the per-rank message size (the input of AllReduce/Reduce/Broadcast, one
  // block of AllGather/ReduceScatter/AlltoAll).
  Algo choose(CollType type, size_t bytes) const;
  // The choice without RIDGE_ALGO's rules.
  Algo defaultChoice(CollType type, size_t bytes) const;
  bool usesCostModel() const { return usesModel_; }
  // The direct broadcast's split (plan::hostBroadcastRootShare): the share of `bytes` the
  // root writes into every peer's output itself, by size class, from the constants alone,
  // so that every rank derives the same split. `rootCopies`: the root is out of place.
  double broadcastRootShare(size_t bytes, bool rootCopies) const {
    return broadcastShare_[sizeClass(bytes)][rootCopies ? 1 : 0];
  }

  // Size class of `bytes`: 0 for 0, else the bit width (class c holds [2^(c-1), 2^c)).
  static int sizeClass(size_t bytes);
  static constexpr int kSizeClasses = 65;

 private:
  struct Rule {
    CollType type;
    size_t lo, hi;  // [lo, hi)
    Algo algo;
  };
  std::vector<Rule> rules_;
  bool usesModel_ = false;
  Algo table_[plan::kCollCount][kSizeClasses] = {};  // by collective and size class
  double broadcastShare_[kSizeClasses][2] = {};      // by size class and rootCopies
};

}  // namespace ridge
