// Counters: sums over the NICs of the process and their text form.
#include "transports/softnic/counters.h"

#include "core/log.h"
#include "transports/softnic/nic.h"

namespace ridge {
namespace softnic {

std::mutex gRegistryMutex;
std::vector<Nic*> gLiveNics;
Counters gRetiredCounters;

void addCounters(Counters* sum, const Counters& c) {
#define RIDGE_ADD(name) sum->name += c.name;
  RIDGE_SOFTNIC_COUNTERS(RIDGE_ADD)
#undef RIDGE_ADD
}

Counters processCounters() {
  std::lock_guard<std::mutex> g(gRegistryMutex);
  Counters sum = gRetiredCounters;
  for (Nic* n : gLiveNics) addCounters(&sum, n->counters());
  return sum;
}

std::string countersToString(const Counters& c) {
  std::string s;
#define RIDGE_PRINT(name) \
  s += format("%s%s=%llu", s.empty() ? "" : " ", #name, static_cast<unsigned long long>(c.name));
  RIDGE_SOFTNIC_COUNTERS(RIDGE_PRINT)
#undef RIDGE_PRINT
  return s;
}

}  // namespace softnic
}  // namespace ridge
