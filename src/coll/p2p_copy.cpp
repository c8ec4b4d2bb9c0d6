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
  uint64_t src;      // the sender's buffer, in its address space
  uint64_t bytes;    // the message size the sender was called with
  uint64_t ackAddr;  // where the receiver writes `seq` once it has read the buffer
  uint64_t seq;
};

// co_await AckReached: the peer wrote `seq` into the acknowledgement word, so it has read
// the buffer. The peer writes it before it releases the descriptor's slot, and the release
// wakes this rank if it sleeps on the transport, so the executor's usual wait applies. The
// word is compared for equality: whichever of its bytes the kernel's copy has stored, the
// read it acknowledges is complete, and only the full value equals `seq`.
struct AckReached : WaitCondition {
  const std::atomic<uint64_t>* word;
  uint64_t seq;
  AckReached(const std::atomic<uint64_t>* w, uint64_t s, int from) : word(w), seq(s) {
    peer = from;
    ready = [](WaitCondition* self) {
      auto* a = static_cast<AckReached*>(self);
      return a->word->load(std::memory_order_acquire) == a->seq;
    };
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
  const size_t P = static_cast<size_t>(c->nranks);
  c->p2pCopy.minBytes = std::max(minBytes, sizeof(Descriptor) + 1);
  c->p2pCopy.acked = std::make_unique<std::atomic<uint64_t>[]>(P);
  c->p2pCopy.sent = std::make_unique<uint64_t[]>(P);
  for (size_t i = 0; i < P; ++i) {
    c->p2pCopy.acked[i].store(0, std::memory_order_relaxed);
    c->p2pCopy.sent[i] = 0;
  }
}

bool p2pSendsSingleCopy(ridgeComm* c, int peer, size_t bytes) {
  // Device memory (the proxy's staged sends) is not in this process's address space.
  const bool single = !c->device->data && singleCopyPossible(c, peer, bytes);
  ++(single ? c->p2pCopy.singleCopySends : c->p2pCopy.stagedSends);
  return single;
}

Task sendSingleCopy(ridgeComm* c, int peer, const char* src, size_t bytes) {
  SendConnector* tx = c->sendTo[peer];
  const uint64_t seq = ++c->p2pCopy.sent[peer];
  const Descriptor d{kDescriptorMagic, reinterpret_cast<uint64_t>(src), bytes,
                     reinterpret_cast<uint64_t>(&c->p2pCopy.acked[peer]), seq};
  void* slot = co_await AcquireSlot(tx);
  std::memcpy(slot, &d, sizeof d);
  tx->post(sizeof d, true);
  // The caller may reuse its buffer only once the peer has read it.
  co_await AckReached(&c->p2pCopy.acked[peer], seq, peer);
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
  // The reads above are complete before the sender can see the acknowledgement.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  RIDGE_CO_TRY(pm->write(d.ackAddr, &d.seq, sizeof d.seq));
  rx->release();  // wakes the sender if it sleeps
  *done = true;
  co_return Status::ok();
}

}  // namespace ridge
