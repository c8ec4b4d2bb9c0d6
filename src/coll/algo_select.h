// Which algorithm runs a collective of a given size: the defaults (a one-step
// all-pairs exchange for small messages, a pipelined ring or chain for large ones,
// crossover RIDGE_ALLPAIRS_MAX, measured: docs/performance.md) and the user's
// RIDGE_ALGO override ("allreduce:0-64K:allpairs;allreduce:64K-:ring", parsed by the
// planner's src/plan/algo_rules.h, which the simulator shares). With
// single-copy peer access (CMA), messages from RIDGE_DIRECT_MIN up use the direct
// algorithms, where each rank reads and writes its peers' buffers itself; reductions
// only up to RIDGE_DIRECT_MAX.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/status.h"

namespace ridge {

enum class CollType { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AlltoAll, Send, Recv };
// Tree: a reduction up a chain in ring order to its first rank, then a broadcast back down
// (allreduce only; the host's degenerate tree). Other collectives asked to run "tree" or
// "hier" run the ring: those are the GPU planner's algorithms (docs/planner.md).
enum class Algo { AllPairs, Ring, Direct, Tree };
constexpr int kAlgoCount = 4;

const char* collTypeName(CollType t);
const char* algoName(Algo a);

class AlgoSelector {
 public:
  // Takes the thresholds (RIDGE_ALLPAIRS_MAX, RIDGE_DIRECT_MIN/MAX, read by the caller)
  // and parses `overrides` (RIDGE_ALGO syntax); a malformed entry is reported in the
  // returned status and ignored. The direct thresholds apply only when
  // `directAvailable` (the transport gives peer-memory access to every rank).
  Status configure(const std::string& overrides, size_t allPairsMax, bool directAvailable, size_t directMin,
                   size_t directMax);
  // `bytes` is the per-rank message size (the input of AllReduce/Reduce/Broadcast, one
  // block of AllGather/ReduceScatter/AlltoAll).
  Algo choose(CollType type, size_t bytes) const;

 private:
  struct Rule {
    CollType type;
    size_t lo, hi;  // [lo, hi)
    Algo algo;
  };
  std::vector<Rule> rules_;
  size_t allPairsMax_ = 0;  // all set by configure()
  bool directAvailable_ = false;
  size_t directMin_ = SIZE_MAX;
  size_t directMax_ = 0;
};

}  // namespace ridge
