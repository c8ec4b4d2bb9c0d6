// What the two transports over the verbs subset share: the net transport (net_transport.cpp)
// and the gdr transport (transports/gdr) serve the same pairs of ranks, the gdr transport
// when RIDGE_GDR_MODE is on and the net transport otherwise, so exactly one of them is
// created for a communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
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

// A net transport for `setup` with the provider RIDGE_NET names, outside the registry: the
// communicator's device network (docs/gpu.md), whose setup names its slot allocator
// (TransportSetup::netRingAllocator). Collective over the ranks it connects.
Status createNetTransport(const TransportSetup& setup, std::unique_ptr<Transport>* out);

// ---- Receive rings in device memory and the receive-side GPUDirect RDMA flush ----------

class DeviceMemoryRegistrar;

// RIDGE_GDR_FLUSH: auto (flush unless the device orders inbound RDMA writes), read (always
// flush device memory), off (never).
enum class GdrFlushMode { Auto, Read, Off };
// Case-insensitive; false for any other text.
bool parseGdrFlush(const std::string& text, GdrFlushMode* out);
// Whether a chunk that the NIC wrote into memory of `device` must be flushed before it is
// handed on: Read yes, Off no, Auto unless the active device runtime (src/device/runtime.h)
// reports rdmaWritesOrdered(device). Without a runtime nothing says the writes are ordered.
bool gdrFlushNeeded(GdrFlushMode mode, int device);

// Where the net transport's receive rings live. By default host memory (an anonymous
// mapping); an allocator installed here puts them in device memory that `registrar()`
// recognises and exports as dma-buf, so the rings are registered for GPUDirect RDMA
// (device_registration.h) and received chunks are flushed as RIDGE_GDR_FLUSH says. Tests
// install one backed by memfd; nothing in this build installs a GPU one yet.
class NetRingAllocator {
 public:
  virtual ~NetRingAllocator() = default;
  virtual Status allocate(size_t bytes, void** out) = 0;
  virtual void release(void* p, size_t bytes) = 0;
  virtual DeviceMemoryRegistrar* registrar() = 0;
  // The device ordinal that owns the memory (asked for its write ordering).
  virtual int device() const = 0;
};
// Process-wide, read when a net transport connects; nullptr restores host memory.
void setNetRingAllocator(NetRingAllocator* allocator);
// The one installed (nullptr: host memory); the gdr transport's read-mode slots come from it too.
NetRingAllocator* netRingAllocator();

// What a net transport did about GPUDirect RDMA receive flushes.
struct NetTransportStats {
  bool recvRingsOnDevice = false;  // the receive rings are registered device memory
  bool flushing = false;           // and received chunks are flushed
  uint64_t loopbackQps = 0;        // queue pairs connected to themselves (created at connect)
  uint64_t chunksArrived = 0;      // data chunks whose write completion arrived
  uint64_t flushesIssued = 0;      // flush READs posted
  uint64_t flushesCompleted = 0;   // ... that completed without error
  uint64_t flushErrors = 0;        // ... that completed with an error (the peer then fails)
  // Direct transfers (RIDGE_NET_DIRECT).
  uint64_t directSends = 0;         // chunks posted from caller memory (tryPostDirect)
  uint64_t chunksToAdvertised = 0;  // chunks this rank wrote into a destination the peer advertised
  uint64_t chunksLandedDirect = 0;  // chunks that arrived at a destination this rank advertised
  uint64_t advertsSent = 0;         // destinations advertised (tryExpect)
  uint64_t advertsReceived = 0;     // adverts from the peer whose write completed
  uint64_t advertsCompleted = 0;    // this rank's adverts whose write completed (acknowledged)
  uint64_t advertsLate = 0;         // adverts that arrived after their chunk had been posted
  uint64_t withdrawals = 0;         // withdrawDirect calls that had to fail the peer
  uint64_t registrations = 0;       // registration cache misses (rings included)
};
// The stats of a net transport; zeros for any other transport.
NetTransportStats netTransportStats(Transport* transport);
// The sum over every net transport this process has created, live or destroyed (flags:
// any of them; read while no operation runs), and as "name=value ..." text.
NetTransportStats netProcessStats();
std::string netStatsToString(const NetTransportStats& stats);
// Tests: every later flush READ of `transport` names a remote key the NIC refuses, so it
// completes with an error (what a broken flush looks like to the receiver).
void netBreakFlushReadsForTesting(Transport* transport);
// Tests: records a failure of `peer` the way a transport error does (not a withdrawal).
void netFailPeerForTesting(Transport* transport, int peer);

}  // namespace ridge
