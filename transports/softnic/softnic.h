// softnic: a NIC emulated in user space behind the verbs subset (transports/verbs/verbs.h).
//
// Each opened device is one NIC with an engine thread. Posting writes the shared layouts of
// verbs_layout.h (WQE ring, doorbell record, doorbell page); the engine consumes WQEs,
// copies their payload into on-NIC staging memory, cuts it into packets of at most the
// MTU and sends them to the peer NIC's engine over a TCP connection per QP and direction.
// The target engine checks the rkey, lands the bytes in the registered region (reading
// them straight out of the sender's staging memory with process_vm_readv when both NICs
// are on one host, else from the TCP stream), consumes a posted receive for SEND and
// WRITE_WITH_IMM, writes CQEs with owner bits, and acknowledges cumulatively. An RDMA READ
// is a request packet in the same sequence; the target answers with response packets on the
// reverse direction of the connection, and re-executes a duplicate request (its response
// may have been lost). Packets carry
// sequence numbers; the receiver accepts only the next one in order (go-back-N), so
// faults injected on the wire (loss, duplication, reordering, delay) are repaired by
// retransmission from staging without losing, duplicating or reordering anything.
// docs/transports.md ("softnic") has the wire format and the rules.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "transports/verbs/verbs.h"

namespace ridge {
namespace softnic {

// Faults injected by a NIC on the packets it sends (probabilities per packet).
struct FaultSpec {
  double drop = 0;     // data and acknowledgement packets
  double dup = 0;      // data packets sent twice
  double reorder = 0;  // data packet held back until after the next one
  double delay = 0;    // data packet held back for delayNs
  int64_t delayNs = 200000;
  double stagingExhaust = 0;  // a staging allocation pretends that staging is full
  uint64_t seed = 1;
  bool any() const { return drop > 0 || dup > 0 || reorder > 0 || delay > 0 || stagingExhaust > 0; }
};

// Parses "drop=0.01,dup=0.01,reorder=0.01,delay=0.02:200us,staging_exhaust=0.01,seed=7".
// An empty text means no faults. Errors are ridgeInvalidArgument naming the bad item.
Status parseFaults(const std::string& text, FaultSpec* out);

struct Options {
  size_t stagingBytes = 256 << 10;
  size_t mtu = 16 << 10;
  FaultSpec faults;
  int64_t rtoNs = 2000000;
  bool forceTcpPayload = false;  // never read payload across processes, always inline
  // From RIDGE_SOFTNIC_STAGING_BYTES, _MTU, _FAULTS, _RTO_US, _WIRE (malformed faults: WARN,
  // none injected).
  static Options fromSettings();
};

// What a NIC did; tests read these to prove that faults happened and were repaired.
struct Counters {
  uint64_t packetsSent = 0;  // data packets put on the wire (first sends and resends)
  uint64_t packetsReceived = 0;
  uint64_t payloadBytesLanded = 0;
  uint64_t acksSent = 0;
  uint64_t injectedDrops = 0;
  uint64_t injectedDups = 0;
  uint64_t injectedReorders = 0;
  uint64_t injectedDelays = 0;
  uint64_t injectedStagingExhaust = 0;
  uint64_t retransmittedPackets = 0;
  uint64_t retransmitTimeouts = 0;
  uint64_t naksSent = 0;
  uint64_t duplicatesDiscarded = 0;  // seq already delivered
  uint64_t outOfOrderDiscarded = 0;  // seq beyond the next expected
  uint64_t rnrDiscards = 0;          // no receive posted (or CQ full) at the target
  uint64_t stagingStalls = 0;        // a WQE had to wait for staging memory (back-pressure)
  uint64_t cqFullStalls = 0;
  uint64_t cmaPayloadReads = 0;  // packets landed with process_vm_readv
  uint64_t inlinePayloads = 0;   // packets landed from the TCP stream
  uint64_t zeroCopyPackets = 0;  // sent straight from device memory (already NIC staging)
  uint64_t remoteAccessErrors = 0;
  // RDMA READ. Target: reads executed (first time and again for a duplicate request, whose
  // response may have been lost). Requester: response packets discarded because their read
  // was already complete or they were not the next piece expected.
  uint64_t readsExecuted = 0;
  uint64_t readsReexecuted = 0;
  uint64_t readResponseDiscards = 0;
  // Faults injected on read response packets (target -> requester).
  uint64_t injectedResponseDrops = 0;
  uint64_t injectedResponseDups = 0;
  uint64_t injectedResponseReorders = 0;
};

std::string countersToString(const Counters& c);

// Opens one emulated NIC with explicit options (tests: tiny staging, faults).
Status openDevice(const Options& options, std::unique_ptr<verbs::Device>* out);
// The counters of one softnic device; zeros for a device of another provider.
Counters deviceCounters(const verbs::Device* device);
// Sum over every softnic device this process has opened, open or closed.
Counters processCounters();
// Makes the NIC look at its doorbell pages now, as NIC hardware notices a doorbell (UAR) write
// at once. For producers that ring through mlx5Sq() instead of postSend (the gdr
// transport's CPU stand-in for a GPU); one load when the engine is awake. No-op for a device
// of another provider. (Added by the gdr-write transport, issue 6.)
void notifyDoorbell(verbs::Device* device);
// Sleeps until the NIC's engine next lands data, retires a WQE or handles an acknowledgement
// (or maxWaitNs pass), unless stillIdle(arg) returns false first: the wake-up a producer that
// polls NIC-written memory (credit words, CQ rings) has no other way to get. For the gdr
// transport's idle ranks. False, without waiting, for a device of another provider.
bool waitForNicActivity(verbs::Device* device, int64_t maxWaitNs, bool (*stillIdle)(void*), void* arg);

}  // namespace softnic
}  // namespace ridge
