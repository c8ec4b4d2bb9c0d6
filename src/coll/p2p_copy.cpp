// Single-copy send and receive (p2p_copy.h).
#include "coll/p2p_copy.h"

#include <algorithm>
#include <cstring>

#include "coll/algorithms.h"
#include "coll/comm.h"
#include "coll/device/data_ops.h"
#include "coll/signature.h"
#include "core/log.h"

namespace ridge {
namespace {

constexpr uint64_t kDescriptorMagic = 0x5249444745503250ull;  // "RIDGEP2P"

// What the sender posts in place of the payload: one slot, marked last, of exactly this size
// (unsigned communicators, and a sender whose ledger is not set up yet: its header went ahead
// in a slot of its own), or of kSignedDescriptorBytes: the send's signature (coll/signature.h)
// in the first kInlineHeaderBytes, this descriptor after it, so that a signed send/receive is
// one slot and one release, as before signatures.
struct Descriptor {
  uint64_t magic;
  uint64_t src;    // the sender's buffer, in its address space
  uint64_t bytes;  // the message size the sender was called with
};
constexpr size_t kSignedDescriptorBytes = kInlineHeaderBytes + sizeof(Descriptor);

// The descriptor in a slot of `bytes` marked `last`, or nullptr if it holds none.
const Descriptor* descriptorIn(const void* slot, const SlotInfo& info, size_t at) {
  if (!info.lastOfMessage || info.bytes != at + sizeof(Descriptor)) return nullptr;
  const auto* d = reinterpret_cast<const Descriptor*>(static_cast<const char*>(slot) + at);
  return d->magic == kDescriptorMagic ? d : nullptr;
}

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

Task sendSingleCopy(ridgeComm* c, int peer, const char* src, size_t bytes, const SendSignature* sign) {
  SendConnector* tx = c->sendTo[peer];
  const Descriptor d{kDescriptorMagic, reinterpret_cast<uint64_t>(src), bytes};
  // Signed: the header (coll/signature.h, sendHeader) in the descriptor's slot.
  const bool inlineSignature = sign != nullptr;
  const HeaderWire h = inlineSignature ? sendHeader(c, peer, sign->count, sign->dtype) : HeaderWire{};
  char* slot = static_cast<char*>(co_await AcquireSlot(tx));
  if (inlineSignature) {
    std::memcpy(slot, &h, sizeof h);
    std::memcpy(slot + kInlineHeaderBytes, &d, sizeof d);
    tx->post(kSignedDescriptorBytes, true);
  } else {
    std::memcpy(slot, &d, sizeof d);
    tx->post(sizeof d, true);
  }
  // The caller may reuse its buffer only once the peer has read it. Nothing else is posted
  // to `peer` until this send returns (its chain is sequential, and a batch's collectives
  // finish before its chains start), so every chunk released is the descriptor released.
  co_await PeerReleased(tx);
  if (sign) endOperation(c);
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
  OpLedger& L = c->ledger;
  // The sender's signature comes first (coll/signature.h): in the descriptor's slot when the
  // sender went single copy with its ledger set up, else in a slot of its own. This strand
  // checks it itself: while it waits, the header is not marked due, or the executor's idle
  // poll would take the descriptor's slot for a header alone (and release it unread).
  const bool headerDue = L.sized && L.due[static_cast<size_t>(peer)];
  if (headerDue) L.due[static_cast<size_t>(peer)] = 0;
  PeekSlot first(rx);
  const void* slot = co_await first;
  // A staged message of at least minBytes never starts with a last chunk this short.
  const Descriptor* found = descriptorIn(slot, first.info, headerDue ? kInlineHeaderBytes : 0);
  if (headerDue && found) {
    // Due again for the check alone (no suspension between): checkInlineHeader clears it.
    L.due[static_cast<size_t>(peer)] = kDueRecv;
    RIDGE_CO_TRY(checkInlineHeader(c, peer, slot, first.info));
  } else if (headerDue) {
    // A header alone (a descriptor or the staged message follows), or not a header at all:
    // takeHeader checks it, releases it and names a mismatch.
    L.due[static_cast<size_t>(peer)] = kDueRecv;
    RIDGE_CO_TRY(co_await takeHeader(c, peer));
    PeekSlot pk(rx);
    slot = co_await pk;
    found = descriptorIn(slot, pk.info, 0);
  }
  if (!found) {
    ++c->p2pCopy.stagedRecvs;  // the sender staged it (device memory): the slots as usual
    co_return Status::ok();
  }
  const Descriptor d = *found;
  if (d.bytes != bytes)
    co_return makeError(ridgeInvalidUsage,
                        "rank %d: recv of %zu bytes from rank %d does not match the size of the "
                        "message it sent (%llu bytes)",
                        c->rank, bytes, peer, static_cast<unsigned long long>(d.bytes));
  PeerMemory* pm = c->peerMemory[peer];
  if (!c->device->data) {
    // A mapped sender's buffer (its shareable ridgeMemAlloc memory) is copied with streaming
    // stores from RIDGE_STREAM_MIN, as the collectives' outputs (peerRead).
    RIDGE_CO_TRY(peerRead(c, peer, dst, d.src, bytes, bytes >= c->streamMin));
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
