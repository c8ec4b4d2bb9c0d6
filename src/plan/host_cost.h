// The host collectives' cost model (docs/planner.md, "Host algorithm choice"): the time of
// each host algorithm (all-pairs, ring/chain, direct CMA, tree) per collective, rank count
// and message size, from a handful of host constants: the hand-off between ranks (step),
// the CMA call, and the rates of copying, reducing, reading what another core just wrote
// and moving bytes with CMA, each in cache and in memory. The selector
// (src/coll/algo_select.*) asks it once at setup for every power-of-two size and keeps the
// answer in a table, so the hot path only indexes it.
//
//   time = latency steps x step + CMA calls x call + work on the busiest rank
//
// where the work is the bytes each pass of the algorithm (docs/algorithms.md) copies,
// reduces, reads across cores and moves with CMA, at the cache or the memory rate by
// whether the working set of all ranks fits the last-level cache (blended in between).
// Chunked messages pipeline: the latency of the steps is paid once, not once per chunk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"
#include "plan/algo_rules.h"

namespace ridge::plan {

/// The host algorithms, in the order of ridge::Algo (src/coll/algo_select.h).
enum class HostAlgo : uint8_t { AllPairs, Ring, Direct, Tree };
constexpr int kHostAlgoCount = 4;
const char* hostAlgoName(HostAlgo a);

/// Rates of one regime (data in cache, or streaming from memory). GB/s = 1e9 bytes/s.
struct HostRates {
  double copyGBs = 0;      ///< memcpy between a rank's buffers and its slots
  double reduceGBs = 0;    ///< float sum of two sources into a destination, GB/s of output
  double crossNsPerB = 0;  ///< extra time per byte read that another core has just written
  double cmaReadGBs = 0;   ///< process_vm_readv from a peer
  double cmaWriteGBs = 0;  ///< process_vm_writev into a peer's output (pays its RFO in memory)
};

/// Defaults: fitted to the measured algorithm crossover table (docs/performance.md,
/// "Algorithm crossovers") by bench/micro/host_cost_fit.py and rounded, each within a
/// factor 1.5 of the range ridge-host-constants measured on the development VM
/// (docs/planner.md has both, and why they differ).
struct HostConstants {
  double stepUs = 1.5;     ///< one hand-off through a slot, as a collective pays it
  double cmaCallUs = 1.0;  ///< one process_vm_readv/writev call, beyond its bytes
  double callUs = 0.4;     ///< every call's fixed cost (the same for every algorithm)
  HostRates cache{26, 17, 0.12, 7.6, 6.8};
  HostRates memory{5.3, 4.2, 0.038, 6.6, 2.9};
  double cacheBytes = 32.0 * (1 << 20);  ///< last-level cache shared by the ranks
  size_t cmaChunkBytes = 128 * 1024;     ///< bytes per CMA call (the direct bounce buffer)
  size_t slotBytes = 256 * 1024;         ///< RIDGE_SHM_SLOT_BYTES: the chunk of the slot algorithms
  size_t streamMinBytes = 4u << 20;      ///< RIDGE_STREAM_MIN: the ring's output skips the RFO
};

/// Overrides from "key=value,..." (RIDGE_HOST_COST): step, cma-call, call (µs); copy,
/// reduce, cma-read, cma-write with -cache or -memory (GB/s); cross-cache, cross-memory
/// (ns per byte); cache (bytes, K/M/G suffix). Unknown keys or bad numbers: an error
/// naming them, `out` unchanged.
Status parseHostConstants(const std::string& text, HostConstants* out);

/// The host tree over positions 0..nranks-1 (0 the root; positions count along the ring
/// from the root, so a subtree is a run of neighbouring ranks on the ring): the node heading
/// positions [lo, hi) has its first child at lo + 1, heading the first half (rounded up) of
/// the rest, and its second at the start of the other half. Depth floor(log2(nranks)).
struct HostTreeLinks {
  int parent = -1;  ///< -1 for the root
  int children[2] = {-1, -1};
  int childCount = 0;
  int depth = 0;  ///< hops from the root
};
HostTreeLinks hostTreeLinks(int nranks, int pos);

/// Depth (hops from the root to the deepest rank) of the host tree over `nranks` ranks.
int hostTreeDepth(int nranks);

/// Whether the host collectives have `algo` for `coll` (direct needs CMA: `direct`).
bool hostAlgoAvailable(Coll coll, HostAlgo algo, bool direct);

/// Modeled time (µs) of `coll` with `algo` on `nranks` ranks of one host, `bytes` per rank
/// as RIDGE_ALGO counts them (ridge::AlgoSelector::choose). +inf when unavailable.
double hostAlgoTimeUs(const HostConstants& k, Coll coll, HostAlgo algo, int nranks, size_t bytes,
                      bool direct);

/// The model's error on the measured crossover table (rms of the log ratio, 24 times: 13 %,
/// docs/planner.md): a choice it prices within this of the best is as good as the best.
constexpr double kHostModelMargin = 0.15;

/// The fastest available algorithm; ties go to the lower HostAlgo.
HostAlgo hostBestAlgo(const HostConstants& k, Coll coll, int nranks, size_t bytes, bool direct);

/// Modeled time (µs) of one host send/receive exchange, `bytes` each way per rank (every rank
/// sends one message and receives one, as ridge-bench's sendrecv shift does): staged through
/// the slot FIFO (the sender copies into slots, the receiver out of them: 4 bytes of
/// traffic per byte) or single copy (the receiver reads the sender's buffer with one CMA
/// call and releases the descriptor's slot, which the sender sees: 2 bytes per byte).
double hostSendRecvTimeUs(const HostConstants& k, int nranks, size_t bytes, bool singleCopy);

/// The smallest power of two from which the single copy is priced no slower than the
/// staged path for every larger power of two up to 1 GiB (SIZE_MAX: never). Sender and
/// receiver take the single copy from here on (src/coll/p2p_copy.h), so it must be the same
/// on both: it depends on the constants only.
size_t hostSendRecvSingleCopyMin(const HostConstants& k, int nranks);

/// Share of the message that the direct broadcast's root writes into every non-root's output
/// itself (process_vm_writev, the head of the buffer), in [0, 1], while each non-root reads
/// the rest from the root's buffer: both run at once, so the copy takes the longer of the
/// two. Balanced where the root's writes to the P - 1 peers, plus its own copy into its
/// output when `rootCopies` (out of place; it runs after the root's writes), take as long
/// as a non-root's read. 0 where the root's own copy alone takes that long (in memory) or
/// the bytes pushed would not pay for the extra CMA call.
double hostBroadcastRootShare(const HostConstants& k, int nranks, size_t bytes, bool rootCopies);
/// The same balance where the root's input and every non-root's output are mapped by the ranks
/// that copy them (shareable ridgeMemAlloc buffers, issue 21): the root's writes, its own copy
/// and a non-root's read are all memcpy at one rate and no call costs anything, so the root
/// pushes nothing out of place (its own copy takes as long as a non-root's whole read) and
/// 1/P in place.
double hostBroadcastRootShareMapped(int nranks, bool rootCopies);

/// Whether `coll` only copies (broadcast, allgather, alltoall): with CMA its direct form is
/// one kernel copy per byte against two through slots, the least memory traffic of all.
bool hostCopiesOnly(Coll coll);

}  // namespace ridge::plan
