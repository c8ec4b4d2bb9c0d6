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

// The task that runs `args` on `comm` with the algorithm the selector picks.
Task runCollective(ridgeComm* comm, CollArgs args);

}  // namespace ridge
