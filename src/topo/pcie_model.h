// PCIe transaction model: how long a transfer of N bytes takes along a route, and what
// limits its throughput, counted in TLPs.
//
// A route is the chain of hops from a requester (the device that issues the transactions)
// to a completer (the memory that is written or read). Posted writes carry data along the
// route and need no answer, so a write costs one traversal plus serialization at the slowest
// link. Non-posted reads send a request along the route and get the data back in one or more
// completions, so a read costs a round trip, and the requester can only have as many reads in
// flight as it has tags: by Little's law its throughput is at most bytes in flight / round
// trip, however fast the links are. Reads that a root complex forwards between two of its
// ports (peer to peer) are slow on many CPUs; the model applies a named penalty for them.
//
// Everything the model assumes is a named constant (pcie_constants.def) that a `key = value`
// file can override (loadPcieConstants), so a measured machine can replace the defaults
// without a rebuild. Pure computation: no I/O except loadPcieConstants, no global state.
// Units: bytes, nanoseconds, GB/s (10^9 bytes per second, which is also bytes per ns).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace ridge::topo {

/// The model's constants; each field is a key of pcie_constants.def (where its default, range
/// and source are).
struct PcieConstants {
  using Int = int64_t;
  using Real = double;
#define RIDGE_PCIE_CONSTANT(key, type, def, lo, hi, check, unit, source) type key = def;
#include "topo/pcie_constants.def"
#undef RIDGE_PCIE_CONSTANT
};

/// Extra rule on a constant beyond its range.
enum class PcieConstantCheck : uint8_t { None, PowerOfTwo, Rcb, Multiple64 };

/// One row of the constants table, for files, docs and tests.
struct PcieConstantInfo {
  const char* key;
  bool isInteger;
  double defaultValue, minimum, maximum;
  PcieConstantCheck check;
  const char* unit;
  const char* source;
};

/// Every constant, in declaration order.
const std::vector<PcieConstantInfo>& pcieConstantTable();

/// Reads a `key = value` file over `constants` (keys not in the file keep their value).
/// `#` starts a comment; blank lines are skipped. Fails (ridgeInvalidArgument, naming the file
/// and line) on an unknown or repeated key, a malformed or non-integral number, a value out of
/// range or breaking its rule, and on combinations that cannot be (a completion size that is
/// not a multiple of its RCB). On failure `constants` is left unchanged.
Status loadPcieConstants(const std::string& path, PcieConstants* constants);

/// Same, from text already in memory; `name` is used in messages in place of a file name.
Status parsePcieConstants(const std::string& text, const std::string& name, PcieConstants* constants);

/// Checks the rules that involve several constants; loadPcieConstants calls it.
Status validatePcieConstants(const PcieConstants& c);

/// Raw per-direction rate of a PCIe link after line encoding, GB/s; 0 for an unknown
/// generation (valid: 1..6) or width (valid: 1, 2, 4, 8, 12, 16, 32).
double pcieLinkGBs(const PcieConstants& c, int generation, int width);

enum class HopKind : uint8_t {
  PcieLink,     ///< one PCIe link (generation, width)
  PcieSwitch,   ///< traversal of a PCIe switch (upstream to downstream port or between ports)
  RootComplex,  ///< a host bridge with its root ports; a root port is part of it, not a switch
  SocketLink,   ///< the inter-socket link (UPI, xGMI, ...)
};

const char* hopKindName(HopKind k);

/// One hop of a route. Build them with the static functions.
struct Hop {
  HopKind kind = HopKind::PcieLink;
  int pcieGen = 0;          ///< PcieLink: 1..6
  int pcieWidth = 0;        ///< PcieLink: lanes
  double bandwidthGBs = 0;  ///< PcieLink: 0 = from gen/width; SocketLink: 0 = socket_link_gbs
  double latencyNs = -1;    ///< one-way latency; < 0 = the constant for this kind

  static Hop link(int generation, int width) { return {HopKind::PcieLink, generation, width, 0, -1}; }
  static Hop pcieSwitch() { return {HopKind::PcieSwitch, 0, 0, 0, -1}; }
  static Hop rootComplex() { return {HopKind::RootComplex, 0, 0, 0, -1}; }
  static Hop socketLink(double gbs = 0, double latencyNs = -1) {
    return {HopKind::SocketLink, 0, 0, gbs, latencyNs};
  }
};

/// What answers at the far end of a route: sets default RCB, completion size and access
/// latency, and whether a root complex on the route forwards peer-to-peer (device memory
/// behind a BAR) or terminates the route at host memory.
enum class Completer : uint8_t { HostMemory, GpuMemory, NicMemory };

const char* completerName(Completer c);

/// Endpoint parameters; 0 (or < 0 for the latency) means "the default for this completer from
/// the constants". mps/mrrs/tags belong to the requester side, the rest to the completer.
struct EndpointParams {
  int mpsBytes = 0;               ///< Max Payload Size in force on the route
  int mrrsBytes = 0;              ///< requester's Max Read Request Size
  int rcbBytes = 0;               ///< completer's Read Completion Boundary
  int completionBytes = 0;        ///< completion size the completer really uses (capped at MPS)
  int maxOutstandingReads = 0;    ///< requester's tags
  double completerAccessNs = -1;  ///< time from request arrival to first completion leaving
};

/// Hops in order from requester to completer, and the endpoints.
struct Route {
  std::vector<Hop> hops;
  Completer completer = Completer::HostMemory;
  EndpointParams params;
};

/// `route` with every default filled in from `c`.
EndpointParams resolveEndpoint(const Route& route, const PcieConstants& c);

/// The same hops walked from the completer's side: `newCompleter` is at the old requester's
/// end. mps/mrrs/tags are kept (they describe the route and its reader); completer-side
/// parameters go back to the defaults of the new completer.
Route reverseRoute(const Route& route, Completer newCompleter);

/// True when a root complex on the route forwards between two of its ports (the completer is
/// device memory), the case CPUs handle poorly.
bool isPeerToPeer(const Route& route);

/// Sum of one-way hop latencies.
double traversalNs(const Route& route, const PcieConstants& c);

enum class Transaction : uint8_t { PostedWrite, Read };

/// The model's answer for one transfer.
struct TransferEstimate {
  Transaction kind = Transaction::PostedWrite;
  uint64_t bytes = 0;
  EndpointParams params;           ///< resolved
  uint64_t dataTlps = 0;           ///< writes, or completions for a read
  uint64_t requestTlps = 0;        ///< read requests (0 for writes)
  double overheadPerDataTlp = 0;   ///< bytes added to each data TLP
  double wireBytes = 0;            ///< bytes on the wire in the data direction
  double reverseWireBytes = 0;     ///< read requests travelling the other way
  double efficiency = 0;           ///< bytes / wireBytes
  double linkLimitGBs = 0;         ///< slowest link x efficiency (socket link: its own rate)
  double outstandingLimitGBs = 0;  ///< reads: tags x MRRS / round trip (Little's law); 0 for writes
  double peerLimitGBs = 0;         ///< P2P forwarding cap when it applies, else 0
  double bandwidthGBs = 0;         ///< steady throughput: the smallest limit
  const char* limitedBy = "";      ///< which limit set bandwidthGBs
  double roundTripNs = 0;          ///< reads: request out, access, first completion back
  double latencyNs = 0;            ///< time to the first byte at the destination
  double totalNs = 0;              ///< latencyNs + bytes / bandwidthGBs
};

/// Posted writes of `bytes` from the requester to the completer.
TransferEstimate estimateWrite(const Route& route, uint64_t bytes, const PcieConstants& c);
/// The requester reads `bytes` from the completer.
TransferEstimate estimateRead(const Route& route, uint64_t bytes, const PcieConstants& c);

/// payload / (payload + overhead) for one posted write TLP of `payload` bytes
/// (payload <= MPS), as in the efficiency table of gdr-write-facts.md.
double writeTlpEfficiency(const PcieConstants& c, int payload);
/// Data-direction efficiency of a read of `bytes` answered in completions of
/// `completionBytes` (the table's read columns and the 512/552 worked example).
double readDataEfficiency(const PcieConstants& c, uint64_t bytes, int completionBytes);

/// Bytes that must be in flight to sustain `gbs` over a round trip of `roundTripNs`
/// (Little's law: 50 GB/s over 1 us needs 50,000 bytes).
double bytesInFlightFor(double gbs, double roundTripNs);

/// "Gen4 x16 > switch > root complex > host memory" for messages and docs.
std::string describeRoute(const Route& route);

}  // namespace ridge::topo
