// How many CPUs this thread may run on (its affinity mask), for decisions that depend on
// whether Ridge's threads would compete for cores.
#pragma once

#include <sched.h>

namespace ridge {

// 1 when the mask cannot be read: the cautious answer for "is the machine oversubscribed".
inline int usableCpus() {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  return sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
}

}  // namespace ridge
