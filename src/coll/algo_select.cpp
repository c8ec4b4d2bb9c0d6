#include "coll/algo_select.h"

#include "plan/algo_rules.h"

namespace ridge {

// The planner's collective ids are CollType's first six, so rules convert by value.
static_assert(static_cast<int>(plan::Coll::AllReduce) == static_cast<int>(CollType::AllReduce) &&
              static_cast<int>(plan::Coll::Broadcast) == static_cast<int>(CollType::Broadcast) &&
              static_cast<int>(plan::Coll::Reduce) == static_cast<int>(CollType::Reduce) &&
              static_cast<int>(plan::Coll::AllGather) == static_cast<int>(CollType::AllGather) &&
              static_cast<int>(plan::Coll::ReduceScatter) == static_cast<int>(CollType::ReduceScatter) &&
              static_cast<int>(plan::Coll::AlltoAll) == static_cast<int>(CollType::AlltoAll));

const char* collTypeName(CollType t) {
  switch (t) {
    case CollType::AllReduce: return "allreduce";
    case CollType::Broadcast: return "broadcast";
    case CollType::Reduce: return "reduce";
    case CollType::AllGather: return "allgather";
    case CollType::ReduceScatter: return "reducescatter";
    case CollType::AlltoAll: return "alltoall";
    case CollType::Send: return "send";
    case CollType::Recv: return "recv";
  }
  return "?";
}

const char* algoName(Algo a) {
  switch (a) {
    case Algo::AllPairs: return "allpairs";
    case Algo::Ring: return "ring";
    case Algo::Direct: return "direct";
    case Algo::Tree: return "tree";
  }
  return "?";
}

Status AlgoSelector::configure(const std::string& overrides, size_t allPairsMax, bool directAvailable,
                               size_t directMin, size_t directMax) {
  allPairsMax_ = allPairsMax;
  directAvailable_ = directAvailable;
  directMin_ = directMin;
  directMax_ = directMax;
  rules_.clear();
  std::vector<plan::AlgoRule> parsed;
  std::string bad;
  plan::parseAlgoRules(overrides, &parsed, &bad);
  for (const plan::AlgoRule& p : parsed) {
    Rule rule{static_cast<CollType>(p.coll), p.lo, p.hi, Algo::Ring};
    switch (p.algo) {
      case plan::AlgoName::AllPairs: rule.algo = Algo::AllPairs; break;
      case plan::AlgoName::Direct: rule.algo = Algo::Direct; break;
      case plan::AlgoName::Tree: rule.algo = rule.type == CollType::AllReduce ? Algo::Tree : Algo::Ring; break;
      // Hierarchical needs several hosts of GPUs; among host ranks the ring is its intra part.
      case plan::AlgoName::Ring:
      case plan::AlgoName::Hier: rule.algo = Algo::Ring; break;
    }
    // All-to-all has only the all-pairs form (a direct read would race with the peer's
    // own in-place writes); direct needs peer-memory access on every rank.
    if (rule.type == CollType::AlltoAll) rule.algo = Algo::AllPairs;
    if (rule.algo == Algo::Direct && !directAvailable_) rule.algo = Algo::Ring;
    rules_.push_back(rule);
  }
  if (!bad.empty())
    return makeError(ridgeInvalidArgument,
                     "RIDGE_ALGO: ignoring malformed entries [%s]; expected coll:lo-hi:algo with coll "
                     "in allreduce, broadcast, reduce, allgather, reducescatter, alltoall and algo in "
                     "allpairs, ring, direct, tree, hier",
                     bad.c_str());
  return Status::ok();
}

Algo AlgoSelector::choose(CollType type, size_t bytes) const {
  for (const Rule& r : rules_)
    if (r.type == type && bytes >= r.lo && bytes < r.hi) return r.algo;
  // All-to-all is all-pairs by nature; everything else switches to the direct or the
  // pipelined ring algorithms once the message amortises their extra steps.
  if (type == CollType::AlltoAll) return Algo::AllPairs;
  // Copy collectives gain from the single copy at every size; reductions only up to
  // directMax_, beyond which the ring's streaming output stores win (docs/performance.md).
  const bool copyOnly = type == CollType::AllGather || type == CollType::Broadcast;
  if (directAvailable_ && bytes >= directMin_ && (copyOnly || bytes <= directMax_)) return Algo::Direct;
  return bytes <= allPairsMax_ ? Algo::AllPairs : Algo::Ring;
}

}  // namespace ridge
