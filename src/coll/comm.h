// The communicator: what init builds and every collective reads.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coll/algo_select.h"
#include "coll/p2p_copy.h"
#include "coll/signature.h"
#include "core/status.h"
#include "ridge/ridge.h"
#include "transports/transport.h"

namespace ridge {
class Bootstrap;
struct DeviceCollectives;  // coll/device/device_collectives.h
struct DeviceCollectivesDeleter {
  void operator()(DeviceCollectives* d) const;
};
DeviceCollectives* newDeviceCollectives();

// What every rank tells every other rank at init (fixed size: it travels through the
// bootstrap all-gather).
struct PeerInfo {
  uint64_t hostHash;
  // Random per process, never 0 (p2p::processNonce()); 0 when the sender did not set it. With
  // pid it tells whether a peer is this process: pids alone collide across pid namespaces.
  uint64_t processNonce;
  // This rank's RIDGE_STAGING_BYTES (0: not valid there); the communicator uses the smallest.
  uint64_t stagingBytes;
  int32_t pid;
  int32_t rank;
  uint32_t version;
  int16_t package;         // processor package / NUMA node this rank is bound to (-1: not bound to
  int16_t numa;            // one), for the host ring order (src/plan/host_plan.h)
  int16_t cudaDevice;      // the device the communicator serves (-1: none), and whether this rank
  int16_t p2pAllowed;      // lets device collectives take the P2P path (RIDGE_P2P != off)
  int16_t deviceNetReady;  // can build the device network (RIDGE_GDR_DATA_PATH, dma-buf export)
  int16_t reserved;        // 0
  char busId[16];          // that device's PCI bus id ("" unknown): ordinals differ between processes
  char hostName[64];
  char topoSummary[200];  // one-line host summary for the planner and for logs
};

}  // namespace ridge

struct ridgeComm {
  static constexpr uint32_t kMagic = 0x434f4d4du;  // "COMM"
  static constexpr uint32_t kDeadMagic = 0xdeadc0deu;
  uint32_t magic = kMagic;
  // Which communicator of this process this is (1, 2, ...; 0 until registered). The API keeps
  // a registry of live handles and their generation (src/api/api.cpp), so a destroyed or
  // foreign handle is refused without being dereferenced; and the storage of a destroyed
  // communicator is not handed back to the allocator at once (these operators), so a newer
  // communicator does not take over a stale handle's address.
  uint64_t generation = 0;
  static void* operator new(size_t bytes);
  static void operator delete(void* p, size_t bytes);

  int rank = -1;
  int nranks = 0;
  int timeoutSec = 120;
  std::string name;

  std::unique_ptr<ridge::Bootstrap> bootstrap;
  std::vector<std::unique_ptr<ridge::Transport>> transports;
  std::vector<ridge::SendConnector*> sendTo;  // by rank; null for self
  std::vector<ridge::RecvConnector*> recvFrom;
  ridge::Transport* waitTransport = nullptr;  // the transport whose futex a waiting rank sleeps on
  std::vector<ridge::PeerInfo> peers;
  ridge::AlgoSelector algos;
  // The plan's ring (src/coll/comm_plan.cpp): ring position -> rank and rank -> position,
  // sized at init. The device plan's ring channel 0 when every rank serves a GPU placed in
  // the topology, else the host plan's. The ring, chain and tree algorithms follow this
  // order instead of rank order (also on the staged and device-network device paths; P2P
  // and LL are all-pairs).
  std::vector<int> ringOrder, ringPos;
  // How many collectives ran with each algorithm, and the last one (debug queries: tests
  // check that RIDGE_ALGO changes what runs).
  uint64_t algoRuns[ridge::kAlgoCount] = {};
  int lastAlgo = -1;
  // Bytes this rank wrote into peers' outputs as a direct broadcast's root (tests show the
  // split taken with it; src/coll/algorithms.cpp, broadcastPushedBytes).
  uint64_t broadcastPushedBytes = 0;

  // Scratch for algorithms (sized nranks at init so the hot path never allocates).
  std::vector<const void*> scratchPtrs;
  // Single-copy access to each peer's memory (all null unless every rank has it), the
  // peers' buffer descriptors of the running direct collective, and one bounce chunk
  // per rank for reading peer data before it is reduced.
  std::vector<ridge::PeerMemory*> peerMemory;
  struct DirectDescriptor {
    uint64_t send, recv, count;
    uint32_t type, root;
    uint32_t shareable;  // a broadcast's kSendShareable | kRecvShareable (src/coll/algorithms.cpp)
    uint32_t pad;
  };
  std::vector<DirectDescriptor> peerDesc;
  struct FreeBytes {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char[], FreeBytes> bounce;  // nranks chunks of bounceChunk bytes, page-aligned
  size_t bounceChunk = 0;
  // Single-copy sends and receives (coll/p2p_copy.h): threshold, counters.
  ridge::P2pCopy p2pCopy;
  size_t streamMin = SIZE_MAX;  // RIDGE_STREAM_MIN
  int64_t spinNs = 50000;       // busy-poll budget before yielding (RIDGE_SPIN_US)
  int64_t yieldNs = 1000000;    // then yield this long before sleeping on the transport

  std::atomic<bool> aborted{false};
  // Cancels the bootstrap's waits (its abort flag). ridgeCommAbort sets it with `aborted`;
  // ridgeCommShrink with RIDGE_SHRINK_ABORT sets it only until the calls of other threads have
  // left, so that the survivors still meet through the parent's bootstrap while its transports
  // and device operations stay aborted.
  std::atomic<bool> bootstrapAborted{false};
  // ridgeSuccess, ridgeInProgress (non-blocking init running) or the error that broke it.
  std::atomic<int> asyncError{ridgeInProgress};
  std::atomic<int> callsInFlight{0};
  bool finalized = false;
  std::thread initThread;
  std::mutex lastErrorMutex;
  std::string lastError;

  // The CUDA device the communicator serves: the caller's current device at init when the
  // device runtime has one; -1 for a host-only communicator.
  int cudaDevice = -1;
  // RIDGE_DEVICE=emulated when it was made: its operations classify their buffers with that
  // runtime (device::runtimeOf) without reading the environment again.
  bool emulatedDevice = false;
  // Everything its collectives on device memory use (coll/device/device_collectives.h: the
  // GPU proxy, P2P, device network, data ops and LL path). Never null.
  std::unique_ptr<ridge::DeviceCollectives, ridge::DeviceCollectivesDeleter> device{
      ridge::newDeviceCollectives()};
  // Operators of ridgeRedOpCreatePreMulSum: handle ridgeNumOps + index (src/api/api.cpp).
  struct UserOp {
    bool live = false;
    ridgeDataType_t type = ridgeFloat32;
    ridgeScalarResidence_t residence = ridgeScalarHostImmediate;
    unsigned char scalar[8] = {};     // the value (ridgeScalarHostImmediate)
    const void* scalarPtr = nullptr;  // read per call (ridgeScalarDevice)
  };
  std::mutex userOpsMutex;
  std::vector<UserOp> userOps;
  // Registrations of ridgeCommRegister; the handle is the Registration's address.
  struct Registration {
    const char* base;
    size_t bytes;
    bool locked;  // mlock succeeded (host memory)
  };
  mutable std::mutex registrationsMutex;
  std::vector<std::unique_ptr<Registration>> registrations;
  // Direct (single-copy) collectives whose own buffers were all registered (debug counter).
  std::atomic<uint64_t> registeredDirectCalls{0};
  // How many ridgeCommShrink calls this rank made on the communicator: part of the tags of the
  // next one's messages, so that two shrinks never read each other's.
  uint32_t shrinkCount = 0;

  // Signatures and operation counters of the host operations (coll/signature.h).
  ridge::OpLedger ledger;
};

namespace ridge {

// The host plan: ring order from the ranks' placements (or RIDGE_PLAN_FILE), RIDGE_PLAN_DUMP,
// and the algorithm selector (RIDGE_ALGO, with the plan file's rules first). Called by
// initComm once peers and transports are known.
Status setupHostPlan(ridgeComm* comm, bool directAvailable);

// Connects a communicator whose rank/nranks/timeout are set. Sets asyncError.
Status initComm(ridgeComm* comm, const ridgeUniqueId& id);
// Collective teardown (barrier through the bootstrap, then close).
Status finalizeComm(ridgeComm* comm);
// Frees everything (waits for a non-blocking init thread first).
void freeComm(ridgeComm* comm);
// Whether [p, p+bytes) lies inside one registration of ridgeCommRegister (bytes 0: p is
// inside one). One lock per call, never per chunk.
bool bufferRegistered(const ridgeComm* comm, const void* p, size_t bytes);

}  // namespace ridge
