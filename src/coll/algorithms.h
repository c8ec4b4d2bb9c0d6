// Collective algorithms, written against the connector interface only (see
// transports/transport.h) and run as tasks by the Executor. docs/algorithms.md gives
// each one's steps, bytes on the wire and memory traffic per byte.
#pragma once

#include <cstddef>

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

// Whether a point-to-point message of `bytes` over `tx` is sent straight from caller memory
// (the direct extension, from the connector's directSendMinBytes) rather than copied into
// slots (sendMessage). A collective's header wait (coll/signature.cpp, HeaderSent) still
// starts at a full slot: below it the TCP transport's withdrawal lets the header leave first.
inline bool sendsDirect(const SendConnector* tx, size_t bytes) {
  return tx && tx->directVersion() >= kDirectTransferVersion && bytes >= tx->directSendMinBytes();
}

// The task that runs `args` on `comm` with the algorithm the selector picks.
Task runCollective(ridgeComm* comm, CollArgs args);

}  // namespace ridge
