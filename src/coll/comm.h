// The communicator: what init builds and every collective reads.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coll/algo_select.h"
#include "core/status.h"
#include "ridge/ridge.h"
#include "transports/transport.h"

namespace ridge {
class Bootstrap;

// What every rank tells every other rank at init (fixed size: it travels through the
// bootstrap all-gather).
struct PeerInfo {
  uint64_t hostHash;
  int32_t pid;
  int32_t rank;
  uint32_t version;
  uint32_t reserved;
  char hostName[64];
  char topoSummary[200];  // one-line host summary for the planner and for logs
};

}  // namespace ridge

struct ridgeComm {
  static constexpr uint32_t kMagic = 0x434f4d4du;  // "COMM"
  static constexpr uint32_t kDeadMagic = 0xdeadc0deu;
  uint32_t magic = kMagic;

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

  // Scratch for algorithms (sized nranks at init so the hot path never allocates).
  std::vector<const void*> scratchPtrs;
  // Single-copy access to each peer's memory (all null unless every rank has it), the
  // peers' buffer descriptors of the running direct collective, and one bounce chunk
  // per rank for reading peer data before it is reduced.
  std::vector<ridge::PeerMemory*> peerMemory;
  struct DirectDescriptor {
    uint64_t send, recv, count;
    uint32_t type, root;
  };
  std::vector<DirectDescriptor> peerDesc;
  std::vector<char> bounce;
  size_t bounceChunk = 0;
  size_t streamMin = SIZE_MAX;  // RIDGE_STREAM_MIN
  int64_t spinNs = 50000;       // busy-poll budget before yielding (RIDGE_SPIN_US)

  std::atomic<bool> aborted{false};
  // ridgeSuccess, ridgeInProgress (non-blocking init running) or the error that broke it.
  std::atomic<int> asyncError{ridgeInProgress};
  std::atomic<int> callsInFlight{0};
  bool finalized = false;
  std::thread initThread;
  std::mutex lastErrorMutex;
  std::string lastError;
};

namespace ridge {

// Connects a communicator whose rank/nranks/timeout are set. Sets asyncError.
Status initComm(ridgeComm* comm, const ridgeUniqueId& id);
// Collective teardown (barrier through the bootstrap, then close).
Status finalizeComm(ridgeComm* comm);
// Frees everything (waits for a non-blocking init thread first).
void freeComm(ridgeComm* comm);

}  // namespace ridge
