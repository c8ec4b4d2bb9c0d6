#include "coll/algo_select.h"

#include <bit>

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

static_assert(static_cast<int>(plan::HostAlgo::AllPairs) == static_cast<int>(Algo::AllPairs) &&
              static_cast<int>(plan::HostAlgo::Ring) == static_cast<int>(Algo::Ring) &&
              static_cast<int>(plan::HostAlgo::Direct) == static_cast<int>(Algo::Direct) &&
              static_cast<int>(plan::HostAlgo::Tree) == static_cast<int>(Algo::Tree));

int AlgoSelector::sizeClass(size_t bytes) {
  return static_cast<int>(std::bit_width(bytes));
}

namespace {

// The measured crossovers (docs/performance.md, "Algorithm crossovers").
Algo fixedChoice(const AlgoDefaults& d, CollType type, size_t bytes) {
  // All-to-all has no ring: all-pairs, or the single copy once it amortises its extra steps;
  // everything else switches to the direct or the pipelined ring algorithms.
  if (type == CollType::AlltoAll)
    return d.directAvailable && bytes >= d.directMin ? Algo::Direct : Algo::AllPairs;
  // Copy collectives gain from the single copy at every size; reductions only up to
  // directMax, beyond which the ring's streaming output stores win.
  const bool copyOnly = type == CollType::AllGather || type == CollType::Broadcast;
  // Reduce-scatter: direct measured no faster than the ring at any size and 1.5-2x slower
  // from 1 MiB (2 ranks, docs/performance.md "Reduce-scatter: direct against ring"). Reduce:
  // its direct form leaves every read and the whole reduction to the root while the chain
  // splits the copy and the reduction between the ranks; measured 2x slower at 256 KiB on 2
  // ranks (docs/performance.md, issue 21), and the model prices it above the chain at every
  // size and rank count.
  const bool directHelps = type != CollType::ReduceScatter && type != CollType::Reduce;
  if (d.directAvailable && directHelps && bytes >= d.directMin && (copyOnly || bytes <= d.directMax))
    return Algo::Direct;
  return bytes <= d.allPairsMax ? Algo::AllPairs : Algo::Ring;
}

// The model's choice, unless it prices the measured crossovers' choice within its own
// error of the best: the constants vary more between runs than the margins between the
// algorithms near a crossover (docs/planner.md), so only a clear difference overrides what
// was measured.
// A copy collective takes its single copy wherever the model prices it within that error of
// the best: it moves the fewest bytes through memory, so it is also the choice that loses
// least when the data is not in cache (issue 21: on 2 ranks of the Intel VM, direct
// allgather and alltoall measured as fast as all-pairs from 8 KiB per rank and faster from
// 32 KiB, broadcast from 64 KiB; docs/performance.md).
Algo modelChoice(const AlgoDefaults& d, plan::Coll coll, size_t bytes, Algo measured) {
  const plan::HostAlgo best = plan::hostBestAlgo(d.constants, coll, d.nranks, bytes, d.directAvailable);
  const double bestUs = plan::hostAlgoTimeUs(d.constants, coll, best, d.nranks, bytes, d.directAvailable);
  if (plan::hostCopiesOnly(coll) &&
      plan::hostAlgoTimeUs(d.constants, coll, plan::HostAlgo::Direct, d.nranks, bytes, d.directAvailable) <=
          bestUs * (1 + plan::kHostModelMargin))
    return Algo::Direct;
  const double measuredUs = plan::hostAlgoTimeUs(d.constants, coll, static_cast<plan::HostAlgo>(measured),
                                                 d.nranks, bytes, d.directAvailable);
  return measuredUs <= bestUs * (1 + plan::kHostModelMargin) ? measured : static_cast<Algo>(best);
}

}  // namespace

Status AlgoSelector::configure(const std::string& overrides, const AlgoDefaults& defaults) {
  usesModel_ = !defaults.fixedCrossovers;
  for (int t = 0; t < plan::kCollCount; ++t)
    for (int c = 0; c < kSizeClasses; ++c) {
      // Each class is priced at its smallest size, so a power of two gets its own answer.
      const size_t bytes = c == 0 ? 0 : size_t{1} << (c - 1);
      const auto type = static_cast<CollType>(t);
      const Algo measured = fixedChoice(defaults, type, bytes);
      table_[t][c] =
          usesModel_ ? modelChoice(defaults, static_cast<plan::Coll>(t), bytes, measured) : measured;
    }
  // The split is the model's under the fixed crossovers too: they choose algorithms only.
  for (int c = 0; c < kSizeClasses; ++c)
    for (int rootCopies = 0; rootCopies < 2; ++rootCopies)
      broadcastShare_[c][rootCopies] = plan::hostBroadcastRootShare(
          defaults.constants, defaults.nranks, c == 0 ? 0 : size_t{1} << (c - 1), rootCopies != 0);
  rules_.clear();
  std::vector<plan::AlgoRule> parsed;
  std::string bad;
  plan::parseAlgoRules(overrides, &parsed, &bad);
  for (const plan::AlgoRule& p : parsed) {
    Rule rule{static_cast<CollType>(p.coll), p.lo, p.hi, Algo::Ring};
    switch (p.algo) {
      case plan::AlgoName::AllPairs: rule.algo = Algo::AllPairs; break;
      case plan::AlgoName::Direct: rule.algo = Algo::Direct; break;
      case plan::AlgoName::Tree: rule.algo = Algo::Tree; break;
      // Hierarchical needs several hosts of GPUs; among host ranks the ring is its intra part.
      case plan::AlgoName::Ring:
      case plan::AlgoName::Hier: rule.algo = Algo::Ring; break;
    }
    // An algorithm the collective lacks here runs its ring (direct without peer-memory
    // access too); all-to-all, which has no ring, its all-pairs form.
    const auto host = static_cast<plan::HostAlgo>(rule.algo);
    if (!plan::hostAlgoAvailable(p.coll, host, defaults.directAvailable)) rule.algo = Algo::Ring;
    if (rule.type == CollType::AlltoAll && rule.algo != Algo::Direct) rule.algo = Algo::AllPairs;
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

Algo AlgoSelector::defaultChoice(CollType type, size_t bytes) const {
  const int t = static_cast<int>(type);
  if (t >= plan::kCollCount) return Algo::Ring;  // Send/Recv have no algorithm to choose
  return table_[t][sizeClass(bytes)];
}

Algo AlgoSelector::choose(CollType type, size_t bytes) const {
  for (const Rule& r : rules_)
    if (r.type == type && bytes >= r.lo && bytes < r.hi) return r.algo;
  return defaultChoice(type, bytes);
}

}  // namespace ridge
