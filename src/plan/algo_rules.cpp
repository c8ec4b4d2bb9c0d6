#include "plan/algo_rules.h"

#include <sstream>

#include "core/settings.h"

namespace ridge::plan {

const char* collName(Coll c) {
  switch (c) {
    case Coll::AllReduce: return "allreduce";
    case Coll::Broadcast: return "broadcast";
    case Coll::Reduce: return "reduce";
    case Coll::AllGather: return "allgather";
    case Coll::ReduceScatter: return "reducescatter";
    case Coll::AlltoAll: return "alltoall";
  }
  return "?";
}

bool parseCollName(const std::string& s, Coll* out) {
  for (int i = 0; i < kCollCount; ++i) {
    if (s == collName(static_cast<Coll>(i))) {
      *out = static_cast<Coll>(i);
      return true;
    }
  }
  return false;
}

const char* algoNameText(AlgoName a) {
  switch (a) {
    case AlgoName::AllPairs: return "allpairs";
    case AlgoName::Ring: return "ring";
    case AlgoName::Direct: return "direct";
    case AlgoName::Tree: return "tree";
    case AlgoName::Hier: return "hier";
  }
  return "?";
}

bool parseAlgoName(const std::string& s, AlgoName* out) {
  for (int i = 0; i < kAlgoNameCount; ++i) {
    if (s == algoNameText(static_cast<AlgoName>(i))) {
      *out = static_cast<AlgoName>(i);
      return true;
    }
  }
  if (s == "hierarchical") {
    *out = AlgoName::Hier;
    return true;
  }
  return false;
}

bool parseAlgoRules(const std::string& text, std::vector<AlgoRule>* rules, std::string* bad) {
  bad->clear();
  std::stringstream entries(text);
  std::string entry;
  while (std::getline(entries, entry, ';')) {
    if (entry.empty()) continue;
    const size_t c1 = entry.find(':');
    const size_t c2 = c1 == std::string::npos ? c1 : entry.find(':', c1 + 1);
    AlgoRule rule{};
    bool ok = c2 != std::string::npos && parseCollName(entry.substr(0, c1), &rule.coll);
    if (ok) {
      const std::string range = entry.substr(c1 + 1, c2 - c1 - 1);
      const size_t dash = range.find('-');
      int64_t lo = 0, hi = -1;
      ok = dash != std::string::npos && parseSize(range.substr(0, dash), &lo) &&
           (dash + 1 == range.size() || parseSize(range.substr(dash + 1), &hi));
      rule.lo = static_cast<size_t>(lo);
      rule.hi = hi < 0 ? SIZE_MAX : static_cast<size_t>(hi);
      ok = ok && parseAlgoName(entry.substr(c2 + 1), &rule.algo) && rule.lo < rule.hi;
    }
    if (ok)
      rules->push_back(rule);
    else
      *bad += bad->empty() ? entry : ", " + entry;
  }
  return bad->empty();
}

const AlgoRule* findAlgoRule(const std::vector<AlgoRule>& rules, Coll coll, size_t bytes) {
  for (const AlgoRule& r : rules)
    if (r.coll == coll && bytes >= r.lo && bytes < r.hi) return &r;
  return nullptr;
}

}  // namespace ridge::plan
