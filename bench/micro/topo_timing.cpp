// Time of building the topology graph: discovery of this machine, and loading a file.
//
//   ridge-topo-timing [FILE] [ROUNDS=5]
//
// Prints one line per round (the first includes loading hwloc's plugins) and the median of
// the rest; the figures in docs/performance.md come from this program.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "topo/discover.h"
#include "topo/load.h"

int main(int argc, char** argv) {
  using ridge::topo::Topology;
  const char* file = argc > 1 ? argv[1] : nullptr;
  const int rounds = std::max(2, argc > 2 ? std::atoi(argv[2]) : 5);
  std::vector<double> discover, load;
  for (int i = 0; i < rounds; ++i) {
    Topology t;
    ridge::Status s = ridge::topo::discoverThisMachine(&t);
    if (!s.isOk()) {
      std::fprintf(stderr, "discovery failed: %s\n", s.message().c_str());
      return 1;
    }
    discover.push_back(t.loadMs);
    std::printf("round %d: discovery %.2f ms (%zu nodes)", i, t.loadMs, t.nodes().size());
    if (file) {
      Topology f;
      s = ridge::topo::loadTopologyFile(file, &f);
      if (!s.isOk()) {
        std::fprintf(stderr, "\nload failed: %s\n", s.message().c_str());
        return 1;
      }
      load.push_back(f.loadMs);
      std::printf(", load %.2f ms (%zu nodes)", f.loadMs, f.nodes().size());
    }
    std::printf("\n");
  }
  auto medianOfRest = [](std::vector<double> v) {
    v.erase(v.begin());
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("median after the first round: discovery %.2f ms", medianOfRest(discover));
  if (file) std::printf(", load %.2f ms", medianOfRest(load));
  std::printf("\n");
  return 0;
}
