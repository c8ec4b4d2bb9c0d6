// What the two transports over the verbs subset share: the net transport (net_transport.cpp)
// and the gdr transport (transports/gdr) serve the same pairs of ranks, the gdr transport
// when RIDGE_GDR_MODE is on and the net transport otherwise, so exactly one of them is
// created for a communicator.
#pragma once

#include <cstdint>
#include <string>

#include "transports/transport.h"

namespace ridge {

// The provider RIDGE_NET names for these transports, in lower case ("softnic" or "verbs"),
// or "" when it names none.
std::string netProvider();

// Whether ranks a and b talk through a verbs provider: RIDGE_NET names one, and they are on
// different hosts or RIDGE_SHM=0 keeps them off shared memory.
bool netPairReachable(const TransportSetup& setup, int a, int b);

// RIDGE_GDR_MODE is set to something other than off: the gdr transport takes those pairs.
bool gdrModeOn();

}  // namespace ridge
