// The NIC counters (softnic.h Counters) as the engine keeps them, and the process-wide
// registry of NICs that processCounters() sums over.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "transports/softnic/softnic.h"

namespace ridge {
namespace softnic {

// Every field of Counters, for the declarations, copies and sums below.
// clang-format off
#define RIDGE_SOFTNIC_COUNTERS(X) \
  X(packetsSent) \
  X(packetsReceived) \
  X(payloadBytesLanded) \
  X(acksSent) \
  X(injectedDrops) \
  X(injectedDups) \
  X(injectedReorders) \
  X(injectedDelays) \
  X(injectedStagingExhaust) \
  X(retransmittedPackets) \
  X(retransmitTimeouts) \
  X(naksSent) \
  X(duplicatesDiscarded) \
  X(outOfOrderDiscarded) \
  X(rnrDiscards) \
  X(stagingStalls) \
  X(cqFullStalls) \
  X(cmaPayloadReads) \
  X(inlinePayloads) \
  X(zeroCopyPackets) \
  X(remoteAccessErrors) \
  X(readsExecuted) \
  X(readsReexecuted) \
  X(readResponseDiscards) \
  X(injectedResponseDrops) \
  X(injectedResponseDups) \
  X(injectedResponseReorders)
// clang-format on
struct AtomicCounters {
#define RIDGE_DECLARE(name) std::atomic<uint64_t> name{0};
  RIDGE_SOFTNIC_COUNTERS(RIDGE_DECLARE)
#undef RIDGE_DECLARE
  Counters snapshot() const {
    Counters c;
#define RIDGE_COPY(name) c.name = name.load(std::memory_order_relaxed);
    RIDGE_SOFTNIC_COUNTERS(RIDGE_COPY)
#undef RIDGE_COPY
    return c;
  }
};

void addCounters(Counters* sum, const Counters& c);

// Every live NIC, and the sum of the counters of those already closed.
class Nic;
extern std::mutex gRegistryMutex;
extern std::vector<Nic*> gLiveNics;
extern Counters gRetiredCounters;

}  // namespace softnic
}  // namespace ridge
