// What the summary of this machine (summary.cpp, in libridge) and the summaries of topology
// files (summary_files.cpp, in ridge_tooling) share. Not for other users.
#pragma once

#include <chrono>
#include <string>

#include "topo/summary.h"

#ifdef RIDGE_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace ridge::summary_internal {

using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point start);

// Counts a classified PCI device and keeps its description line.
void addDevice(HostSummary* out, bool gpu, std::string line);

#ifdef RIDGE_HAVE_HWLOC

struct HwlocTopology {
  hwloc_topology_t t = nullptr;
  ~HwlocTopology() {
    if (t) hwloc_topology_destroy(t);
  }
};

// Fills counts and devices from a loaded topology. `live`: this machine, so sysfs can add
// link width and rate.
void fromHwloc(hwloc_topology_t t, bool live, HostSummary* out);

const char* rootInfo(hwloc_topology_t t, const char* key);

#endif  // RIDGE_HAVE_HWLOC

}  // namespace ridge::summary_internal
