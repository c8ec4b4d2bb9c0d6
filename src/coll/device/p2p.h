// The P2P engine: collectives on device memory between the ranks of one host, moved
// device to device instead of through pinned host memory.
//
// Every rank exports its buffers as IPC handles (DeviceRuntime::ipcExport of the
// allocation holding them, once per allocation: a bounded cache keyed by the allocation's
// unique id) and sends them, with the operation's arguments, to every peer
// over the communicator's host connectors; each rank opens the peers' handles (through a
// bounded cache, so the same buffers are not reopened per call) and then, on an internal
// stream, reads the peers' send buffers with the device reduction (launchReduce, n
// sources) or copy-engine copies and writes the results straight into its own and the
// peers' receive buffers. The operations of a batch are queued in segments; an exchange of
// one small message per peer closes each segment (a barrier), so no rank starts work that
// depends on a peer's earlier operation, returns, or lets its stream reuse the buffers while
// a peer still reads or writes them. docs/transports.md (P2P) and docs/algorithms.md (device-direct) have the
// protocol and the traffic.
//
// It is run by the GPU proxy (src/coll/device/gpu_proxy.cpp) for each batch, before staging: when
// every rank of the communicator is on this host, every pair of their devices allows P2P
// (DeviceRuntime::peerLink, refined by the topology as the planner classes the pair; several
// ranks on one device always may), no rank set
// RIDGE_P2P=off, and every rank's batch holds only collectives on device memory whose
// buffers it could export. Otherwise the batch is staged, unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "coll/algorithms.h"
#include "core/status.h"
#include "device/runtime.h"
#include "topo/model.h"

struct ridgeComm;

namespace ridge {
struct PeerInfo;
struct DeviceOp;
}  // namespace ridge

namespace ridge::p2p {

struct Context;
struct ContextDeleter {
  void operator()(Context* c) const;
};

// RIDGE_P2P as this process reads it: false for off (a WARN for an unknown value, read as auto).
bool allowedBySettings();

// Called by the GPU proxy thread for each batch whose ready markers have passed. When the
// communicator and every rank's batch allow it, runs the batch through P2P and sets *ran;
// otherwise leaves *ran false and the caller stages it. Every rank of a P2P-capable
// communicator takes part in a small vote per batch, so all of them decide alike. The
// operations carry the API's classification of their buffers (DeviceOp::sendKind/recvKind):
// the runtime is not asked again.
Status runBatch(ridgeComm* comm, device::DeviceRuntime* rt, const DeviceOp* ops, size_t n, bool* ran);

// The planner's rule (src/plan/search.cpp, GPU-to-GPU routes) for the GPUs with PCI bus ids
// busA and busB of `t`: NVLink on an NVL or NVB path; no P2P across the socket link (SYS:
// the planner routes such pairs through host memory, and so does this transport); PCIe
// otherwise. False (out untouched) when either GPU is not in `t`.
bool linkFromTopology(const topo::Topology& t, const std::string& busA, const std::string& busB,
                      device::DeviceRuntime::PeerLink* out);
// Tests: classify links with `t` instead of this machine's discovered topology (null: back
// to discovery). Set before communicators are created.
void setTopologyForTesting(std::shared_ptr<const topo::Topology> t);

// This process's random nonce (never 0), for PeerInfo::processNonce.
uint64_t processNonce();
// Whether `peer` is this process: same pid and, when the peer sent one, same nonce (pid
// namespaces on one host can give two processes the same pid; the host hash matches then).
bool isThisProcess(const PeerInfo& peer);

// The rules every rank judges alike from the ranks' PeerInfo: "" when there are at least two
// ranks, all on this host, each serving a device and none with RIDGE_P2P=off; else why not.
// *exportHandles: some peer is another process (or the runtime wants handles within one), so
// device memory travels as IPC handles. The LL collectives (src/coll/device/ll_path.h) apply the same.
std::string communicatorRefusal(ridgeComm* comm, device::DeviceRuntime* rt, bool* exportHandles);
// What this rank can judge only from its own view of the devices: that it sees every rank's
// device, that every pair allows P2P (the runtime, refined by the topology), and that its
// kernels may reach the devices of peers in this process (enabling that access, which may
// synchronize the device: call at setup only). "" when all holds; *worstKind: the slowest
// link kind found. Ranks may see differently, so callers agree on the answer.
std::string pairsRefusalHere(ridgeComm* comm, device::DeviceRuntime* rt, int* worstKind);

// Decides whether the communicator can use P2P and creates the context (internal stream,
// peer access). Called by the proxy thread's setup, which completes before the first
// release wait is queued on a user's stream: stream creation and enabling peer access may
// synchronize the device implicitly and must not run while a stream is parked on the proxy.
Status prepareContext(ridgeComm* comm, device::DeviceRuntime* rt);

// Closes the IPC mappings the cache evicted (eviction only sets them aside: closing may
// synchronize the device implicitly). The proxy calls it when no stream waits on it.
void closeDeferred(ridgeComm* comm);

// Closes every cached IPC mapping and frees the internal stream (the proxy is stopped).
void releaseContext(ridgeComm* comm);

// What the P2P path did on a communicator (tests and logs).
struct Stats {
  bool capable = false;             // the communicator allows P2P (decided by the proxy's setup)
  uint64_t p2pOps = 0;              // collectives run device to device
  uint64_t stagedBatches = 0;       // batches left to staging (by a vote or an incapable comm)
  uint64_t barriers = 0;            // segments closed: stream synchronized and end messages exchanged
  uint64_t descriptorMessages = 0;  // messages per peer carrying batches' later descriptors (after the vote)
  uint64_t ipcExports = 0;          // this rank's buffers exported (export cache misses, or no id)
  uint64_t exportHits = 0;          // this rank's handles found exported
  size_t exportsCached = 0;         // handles in the export cache now
  size_t exportCacheCapacity = 0;
  uint64_t ipcOpens = 0;      // handles opened (cache misses)
  uint64_t cacheHits = 0;     // handles found open
  uint64_t ipcCloses = 0;     // mappings closed (evictions and release)
  size_t closesDeferred = 0;  // evicted mappings waiting for the proxy to go idle
  size_t mappingsOpen = 0;    // mappings in the cache now
  size_t cacheCapacity = 0;
};
Stats stats(const ridgeComm* comm);

}  // namespace ridge::p2p
