// Shared by the libFuzzer harnesses: quiet logging (every rejected input would otherwise
// print a WARN line and slow fuzzing down tenfold) and a bounded walk over the graph that
// a successful load produced, so that the queries users run are fuzzed too.
#pragma once

#include <cstdlib>
#include <string>

#include "topo/model.h"

namespace ridge::fuzz {

inline void quietLogs() {
  setenv("RIDGE_DEBUG", "NONE", 1);
}

// Paths between the first few devices, and lookups by name; bounded so that one input
// cannot take long however large its graph.
inline void exerciseGraph(const topo::Topology& t) {
  if (!t.finalized()) std::abort();  // a loader said OK without finalizing
  std::vector<int> devs = t.gpus();
  for (int n : t.nics()) devs.push_back(n);
  if (devs.size() > 12) devs.resize(12);
  for (int a : devs)
    for (int b : devs) {
      const topo::Path p = t.path(a, b);
      if (p.nodes.empty() || p.nodes.front() != a || p.nodes.back() != b) std::abort();
      if (p.links.size() + 1 != p.nodes.size()) std::abort();
    }
  for (int d : devs) {
    const topo::Node& n = t.node(d);
    if (t.find(n.name) < 0) std::abort();
    if (!n.busId.empty() && t.find(n.busId) < 0) std::abort();
  }
}

}  // namespace ridge::fuzz
