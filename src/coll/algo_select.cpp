#include "coll/algo_select.h"

#include <sstream>

#include "core/settings.h"

namespace ridge {

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
  }
  return "?";
}

static bool parseColl(const std::string& s, CollType* out) {
  for (CollType t : {CollType::AllReduce, CollType::Broadcast, CollType::Reduce, CollType::AllGather,
                     CollType::ReduceScatter, CollType::AlltoAll}) {
    if (s == collTypeName(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

Status AlgoSelector::configure(const std::string& overrides, size_t allPairsMax, bool directAvailable,
                               size_t directMin, size_t directMax) {
  allPairsMax_ = allPairsMax;
  directAvailable_ = directAvailable;
  directMin_ = directMin;
  directMax_ = directMax;
  rules_.clear();
  std::string bad;
  std::stringstream entries(overrides);
  std::string entry;
  while (std::getline(entries, entry, ';')) {
    if (entry.empty()) continue;
    // coll:lo-hi:algo, hi may be empty (no upper bound).
    size_t c1 = entry.find(':');
    size_t c2 = c1 == std::string::npos ? c1 : entry.find(':', c1 + 1);
    Rule rule{};
    bool ok = c2 != std::string::npos && parseColl(entry.substr(0, c1), &rule.type);
    if (ok) {
      std::string range = entry.substr(c1 + 1, c2 - c1 - 1);
      size_t dash = range.find('-');
      int64_t lo = 0, hi = -1;
      ok = dash != std::string::npos && parseSize(range.substr(0, dash), &lo) &&
           (dash + 1 == range.size() || parseSize(range.substr(dash + 1), &hi));
      rule.lo = static_cast<size_t>(lo);
      rule.hi = hi < 0 ? SIZE_MAX : static_cast<size_t>(hi);
      std::string algo = entry.substr(c2 + 1);
      if (algo == "allpairs") {
        rule.algo = Algo::AllPairs;
      } else if (algo == "ring") {
        rule.algo = Algo::Ring;
      } else if (algo == "direct") {
        rule.algo = Algo::Direct;
      } else {
        ok = false;
      }
      ok = ok && rule.lo < rule.hi;
      // All-to-all has only the all-pairs form (a direct read would race with the peer's
      // own in-place writes); direct needs peer-memory access on every rank.
      if (ok && rule.type == CollType::AlltoAll) rule.algo = Algo::AllPairs;
      if (ok && rule.algo == Algo::Direct && !directAvailable_) rule.algo = Algo::Ring;
    }
    if (ok) {
      rules_.push_back(rule);
    } else {
      bad += bad.empty() ? entry : ", " + entry;
    }
  }
  if (!bad.empty())
    return makeError(ridgeInvalidArgument,
                     "RIDGE_ALGO: ignoring malformed entries [%s]; expected coll:lo-hi:algo with coll "
                     "in allreduce, broadcast, reduce, allgather, reducescatter, alltoall and algo in "
                     "allpairs, ring, direct",
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
