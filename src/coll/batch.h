// What several call sites share about a batch of operations on one communicator: which
// parts of the user's buffers an operation reads and writes, and how a batch (a group, or
// one call) is spawned on an executor. Used by the C API (host memory, on the caller's
// thread) and by the GPU proxy (device memory, staged through host memory on its thread).
#pragma once

#include <cstddef>

#include "coll/algorithms.h"

struct ridgeComm;

namespace ridge {

class Executor;

// Elements of sendbuff read and of recvbuff written by `a` on `rank` of `nranks`.
struct BufferUse {
  size_t sendCount = 0;
  size_t recvCount = 0;
  bool readsSend = false;
  bool writesRecv = false;
};
BufferUse bufferUse(const CollArgs& a, int rank, int nranks);

// Spawns `n` operations of `comm` on `ex`: the collectives in call order on one strand, then
// the point-to-point operations as chains, one per (peer, direction), which run
// concurrently and keep their order (that is how sends and receives are matched).
void spawnBatch(Executor& ex, ridgeComm* comm, const CollArgs* ops, size_t n);

}  // namespace ridge
