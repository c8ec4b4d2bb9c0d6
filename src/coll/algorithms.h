// Collective algorithms, written against the connector interface only (see
// transports/transport.h) and run as tasks by the Executor. docs/algorithms.md gives
// each one's steps, bytes on the wire and memory traffic per byte.
#pragma once

#include <cstddef>
#include <cstdint>

#include "coll/algo_select.h"
#include "coll/task.h"
#include "ridge/ridge.h"

struct ridgeComm;

namespace ridge {

// One queued operation, arguments already validated.
struct CollArgs {
  CollType type;
  const void* send;
  void* recv;
  size_t count;  // elements: per rank block for AllGather/ReduceScatter/AlltoAll
  ridgeDataType_t dtype;
  ridgeRedOp_t op;
  int root;  // root for Broadcast/Reduce; peer for Send/Recv
};

// The task that runs `args` on `comm` with the algorithm the selector picks.
Task runCollective(ridgeComm* comm, CollArgs args);

// Peer j's [remote, remote + bytes) into `dst` through its PeerMemory: with streaming stores
// when `stream` and the peer's buffer is mapped here, else the transport's read (a plain copy
// through the mapping, or CMA). The single-copy collectives and send/recv's receive use it.
Status peerRead(ridgeComm* c, int j, void* dst, uint64_t remote, size_t bytes, bool stream);

}  // namespace ridge
