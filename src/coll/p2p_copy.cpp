// Single-copy send and receive (p2p_copy.h).
#include "coll/p2p_copy.h"

#include <algorithm>
#include <cstring>

#include "coll/comm.h"
#include "coll/device/data_ops.h"
#include "core/log.h"

namespace ridge {
namespace {

constexpr uint64_t kDescriptorMagic = 0x5249444745503250ull;  // "RIDGEP2P"

// What the sender posts in place of the payload: one slot of exactly this size, marked last.
struct Descriptor {
  uint64_t magic;
  uint64_t src;    // the sender's buffer, in its address space
  uint64_t bytes;  // the message size the sender was called with
};

// co_await PeerReleased: the peer has released every chunk posted to it, so it has read the
// buffer the descriptor named (it releases the descriptor's slot after the read, and the
// release wakes this rank if it sleeps on the transport). No message, no system call.
struct PeerReleased : WaitCondition {
  SendConnector* tx;
  explicit PeerReleased(SendConnector* t) : tx(t) {
    peer = t->peer();
    ready = [](WaitCondition* self) { return static_cast<PeerReleased*>(self)->tx->unreleasedChunks() == 0; };
  }
  bool await_ready() { return ready(this); }
  void await_suspend(std::coroutine_handle<Task::promise_type> h) { h.promise().strand->blocked = this; }
  void await_resume() const {}
};

bool singleCopyPossible(const ridgeComm* c, int peer, size_t bytes) {
  return bytes >= c->p2pCopy.minBytes && peer >= 0 && static_cast<size_t>(peer) < c->peerMemory.size() &&
         c->peerMemory[static_cast<size_t>(peer)] != nullptr;
}

}  // namespace

void setupP2pCopy(ridgeComm* c, size_t minBytes) {
  c->p2pCopy.minBytes = std::max(minBytes, sizeof(Descriptor) + 1);
}

bool p2pSendsSingleCopy(ridgeComm* c, int peer, size_t bytes) {
  // Device memory (the proxy's staged sends) is not in this process's address space; and the
  // sender must be able to see the peer release the descriptor (shm can).
  const bool single = !c->device->data && singleCopyPossible(c, peer, bytes) &&
                      c->sendTo[static_cast<size_t>(peer)]->unreleasedChunks() >= 0;
  ++(single ? c->p2pCopy.singleCopySends : c->p2pCopy.stagedSends);
  return single;
}

Task sendSingleCopy(ridgeComm* c, int peer, const char* src, size_t bytes) {
  SendConnector* tx = c->sendTo[peer];
  const Descriptor d{kDescriptorMagic, reinterpret_cast<uint64_t>(src), bytes};
  void* slot = co_await AcquireSlot(tx);
  std::memcpy(slot, &d, sizeof d);
  tx->post(sizeof d, true);
  // The caller may reuse its buffer only once the peer has read it. Nothing else is posted
  // to `peer` until this send returns (its chain is sequential, and a batch's collectives
  // finish before its chains start), so every chunk released is the descriptor released.
  co_await PeerReleased(tx);
  co_return Status::ok();
}

bool p2pMayReceiveSingleCopy(ridgeComm* c, int peer, size_t bytes) {
  if (singleCopyPossible(c, peer, bytes)) return true;
  ++c->p2pCopy.stagedRecvs;
  return false;
}

Task recvSingleCopy(ridgeComm* c, int peer, char* dst, size_t bytes, bool* done) {
  *done = false;
  RecvConnector* rx = c->recvFrom[peer];
  // The sender's signature comes first (coll/signature.h): read and check it before the slot
  // that says whether this message is single-copy.
  if (c->ledger.sized && c->ledger.due[static_cast<size_t>(peer)]) RIDGE_CO_TRY(co_await takeHeader(c, peer));
  PeekSlot pk(rx);
  const void* slot = co_await pk;
  Descriptor d{};
  // A staged message of at least minBytes never starts with a last chunk this short.
  if (pk.info.bytes == sizeof d && pk.info.lastOfMessage) std::memcpy(&d, slot, sizeof d);
  if (d.magic != kDescriptorMagic) {
    ++c->p2pCopy.stagedRecvs;  // the sender staged it (device memory): the slots as usual
    co_return Status::ok();
  }
  if (d.bytes != bytes)
    co_return makeError(ridgeInvalidUsage,
                        "rank %d: recv of %zu bytes from rank %d does not match the size of the "
                        "message it sent (%llu bytes)",
                        c->rank, bytes, peer, static_cast<unsigned long long>(d.bytes));
  PeerMemory* pm = c->peerMemory[peer];
  if (!c->device->data) {
    RIDGE_CO_TRY(pm->read(dst, d.src, bytes));
    ++c->p2pCopy.singleCopyRecvs;
  } else {
    // Device memory: through this peer's bounce chunk (no other strand of this rank uses
    // it while the chain from `peer` runs), then the device's copy.
    char* bounce = c->bounce.get() + static_cast<size_t>(peer) * c->bounceChunk;
    for (size_t off = 0; off < bytes; off += c->bounceChunk) {
      const size_t n = std::min(c->bounceChunk, bytes - off);
      RIDGE_CO_TRY(pm->read(bounce, d.src + off, n));
      RIDGE_CO_TRY(dataCopy(c, dst + off, bounce, n));
      RIDGE_CO_TRY(co_await dataSettled(c));
    }
    ++c->p2pCopy.bouncedRecvs;
  }
  // The release is a release store, ordered after the reads above: once the sender sees it,
  // it may reuse its buffer. It also wakes the sender if it sleeps.
  rx->release();
  *done = true;
  co_return Status::ok();
}

}  // namespace ridge
