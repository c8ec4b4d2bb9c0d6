// The host collectives' plan: the ring order of ranks that are processes on CPUs (the shm
// and socket transports). Ranks are grouped by host, and within a host by processor package
// and NUMA node, so a ring over a two-socket host crosses the socket link exactly twice
// however the launcher numbered the ranks. Ranks whose placement is unknown (not bound
// to one NUMA node) sort first on their host; on a host where every rank shares one NUMA
// node (or none is bound) the order is the identity, so nothing changes there.
#pragma once

#include <cstdint>
#include <vector>

namespace ridge::plan {

struct HostPlacement {
  uint64_t host = 0;  ///< host identity (equal for ranks of one host)
  int package = -1;   ///< processor package the rank is bound to, -1 unknown / several
  int numa = -1;      ///< NUMA node the rank is bound to, -1 unknown / several
};

/// Ring order (position -> rank) for ranks with these placements (indexed by rank). Hosts
/// appear in the order of their lowest rank.
std::vector<int> hostRingOrder(const std::vector<HostPlacement>& ranks);

/// How often a ring in `order` moves between packages of one host (wrap-around included).
int hostSocketCrossings(const std::vector<int>& order, const std::vector<HostPlacement>& ranks);

/// This process's package and NUMA node from its CPU affinity (-1 when it may run on
/// CPUs of several). Read once per process from sysfs.
void thisProcessPlacement(int* package, int* numa);

}  // namespace ridge::plan
