#include "plan/host_plan.h"

#include <dirent.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>

namespace ridge::plan {

std::vector<int> hostRingOrder(const std::vector<HostPlacement>& ranks) {
  const int n = static_cast<int>(ranks.size());
  std::vector<uint64_t> hostOrder;  // hosts by lowest rank
  for (const HostPlacement& p : ranks)
    if (std::find(hostOrder.begin(), hostOrder.end(), p.host) == hostOrder.end()) hostOrder.push_back(p.host);
  auto hostIndex = [&](uint64_t h) {
    return std::find(hostOrder.begin(), hostOrder.end(), h) - hostOrder.begin();
  };
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const HostPlacement& x = ranks[static_cast<size_t>(a)];
    const HostPlacement& y = ranks[static_cast<size_t>(b)];
    const auto hx = hostIndex(x.host), hy = hostIndex(y.host);
    if (hx != hy) return hx < hy;
    if (x.package != y.package) return x.package < y.package;
    return x.numa < y.numa;
  });
  return order;
}

int hostSocketCrossings(const std::vector<int>& order, const std::vector<HostPlacement>& ranks) {
  int crossings = 0;
  const size_t n = order.size();
  for (size_t i = 0; i < n && n > 1; ++i) {
    const HostPlacement& a = ranks[static_cast<size_t>(order[i])];
    const HostPlacement& b = ranks[static_cast<size_t>(order[(i + 1) % n])];
    if (a.host == b.host && a.package >= 0 && b.package >= 0 && a.package != b.package) ++crossings;
  }
  return crossings;
}

namespace {

int readInt(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return -1;
  int v = -1;
  if (std::fscanf(f, "%d", &v) != 1) v = -1;
  std::fclose(f);
  return v;
}

// NUMA node of a CPU: the nodeN entry in its sysfs directory.
int numaOfCpu(int cpu) {
  const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu);
  DIR* d = opendir(dir.c_str());
  if (!d) return -1;
  int node = -1;
  while (dirent* e = readdir(d)) {
    if (std::string(e->d_name).rfind("node", 0) == 0 && e->d_name[4] >= '0' && e->d_name[4] <= '9') {
      node = std::atoi(e->d_name + 4);
      break;
    }
  }
  closedir(d);
  return node;
}

}  // namespace

void thisProcessPlacement(int* package, int* numa) {
  static const std::pair<int, int> placement = [] {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return std::make_pair(-1, -1);
    int pkg = -2, node = -2;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (!CPU_ISSET(cpu, &set)) continue;
      const int p =
          readInt("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/physical_package_id");
      const int m = numaOfCpu(cpu);
      pkg = pkg == -2 ? p : (pkg == p ? pkg : -1);
      node = node == -2 ? m : (node == m ? node : -1);
    }
    return std::make_pair(pkg < 0 ? -1 : pkg, node < 0 ? -1 : node);
  }();
  *package = placement.first;
  *numa = placement.second;
}

}  // namespace ridge::plan
