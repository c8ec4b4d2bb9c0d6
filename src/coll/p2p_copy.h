// Single-copy send and receive between ranks of one host (docs/algorithms.md, "Send and
// receive"). A message of at least P2pCopy::minBytes between two host buffers is not
// copied through the slot FIFO (the sender into slots, the receiver out of them: 4 bytes of
// memory traffic per byte): the sender posts one small descriptor slot naming its buffer
// (with the send's signature ahead of it),
// the receiver reads the buffer straight into its own with one peer-memory (CMA) call and
// then releases the slot, which wakes the sender; the sender returns once it sees the slot
// released (SendConnector::unreleasedChunks: no acknowledgement message, no system call).
// 2 bytes of traffic per byte, and the FIFO in the other direction (which carries the peer's
// own messages) is never used.
//
// Both ends decide by the message size alone, with the same threshold (the host cost model's
// crossover, plan::hostSendRecvSingleCopyMin, or RIDGE_DIRECT_MIN under the fixed crossovers),
// and only where every rank has peer memory (RIDGE_CMA, decided collectively at init), so
// they agree without asking each other. A sender on device memory (the GPU proxy's staged
// sends), or over a connector that cannot tell releases, stages; the receiver therefore
// recognises the descriptor by its size, flag and magic and otherwise receives the slots as
// usual.
#pragma once

#include <cstddef>
#include <cstdint>

#include "coll/task.h"

struct ridgeComm;

namespace ridge {

// A communicator's single-copy send/receive state (ridgeComm::p2pCopy).
struct P2pCopy {
  // Messages of at least this many bytes go single copy where peer memory is available
  // (SIZE_MAX: never). Set at init by setupHostPlan.
  size_t minBytes = SIZE_MAX;
  // How many messages took each path (tests prove every path taken with them).
  uint64_t singleCopySends = 0;
  uint64_t singleCopyRecvs = 0;
  uint64_t stagedSends = 0;
  uint64_t stagedRecvs = 0;
  uint64_t bouncedRecvs = 0;  // single-copy messages received into device memory via the bounce
};

// Sets the threshold of `c`.
void setupP2pCopy(ridgeComm* c, size_t minBytes);

// Whether a send of `bytes` from `c` to `peer` takes the single copy (host buffer, peer
// memory available, at least minBytes, the connector tracks releases), counted either way.
bool p2pSendsSingleCopy(ridgeComm* c, int peer, size_t bytes);
// The send's call, for its signature (coll/signature.h), which then rides in the
// descriptor's slot: one slot per message, signed or not. nullptr: unsigned.
struct SendSignature {
  size_t count;
  ridgeDataType_t dtype;
};
// Signed (`sign` not null): counts and ends the operation in the ledger itself (the caller
// calls neither beginSend nor endOperation).
Task sendSingleCopy(ridgeComm* c, int peer, const char* src, size_t bytes, const SendSignature* sign);

// Receives a message of `bytes` from `peer` into `dst` if the sender sent it single copy
// (sets *done); otherwise leaves the slots to the staged receive (*done false, nothing
// released). Call only where p2pMayReceiveSingleCopy holds; that counts the staged receives
// where it does not.
bool p2pMayReceiveSingleCopy(ridgeComm* c, int peer, size_t bytes);
Task recvSingleCopy(ridgeComm* c, int peer, char* dst, size_t bytes, bool* done);

}  // namespace ridge
