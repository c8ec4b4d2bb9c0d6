// The RIDGE_ALGO override syntax, shared by the host collectives (src/coll/algo_select.*)
// and the simulator: "coll:lo-hi:algo" entries separated by ';', e.g.
//   allreduce:0-64K:tree;allreduce:64K-:ring
// Sizes take 1024-based K/M/G suffixes; an empty upper bound means no bound. Which
// algorithms a consumer can run is its own business: the parser only checks the names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ridge::plan {

/// Collectives the planner prices (same order as ridge::CollType's first six).
enum class Coll : uint8_t { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AlltoAll };
constexpr int kCollCount = 6;
const char* collName(Coll c);
bool parseCollName(const std::string& s, Coll* out);

/// Every algorithm name the override accepts. Host collectives run allpairs, ring, direct
/// and tree; the GPU planner prices ring, tree, hier (hierarchical) and allpairs.
enum class AlgoName : uint8_t { AllPairs, Ring, Direct, Tree, Hier };
constexpr int kAlgoNameCount = 5;
const char* algoNameText(AlgoName a);
bool parseAlgoName(const std::string& s, AlgoName* out);

struct AlgoRule {
  Coll coll;
  size_t lo, hi;  ///< [lo, hi) bytes per rank
  AlgoName algo;
};

/// Parses `text`; good entries go to `rules` in order, malformed ones are listed in `bad`
/// (", "-joined). Returns true when nothing was malformed.
bool parseAlgoRules(const std::string& text, std::vector<AlgoRule>* rules, std::string* bad);

/// The first rule covering (coll, bytes), or null.
const AlgoRule* findAlgoRule(const std::vector<AlgoRule>& rules, Coll coll, size_t bytes);

}  // namespace ridge::plan
