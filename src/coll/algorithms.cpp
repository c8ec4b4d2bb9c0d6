// Collective algorithms over slot FIFOs. Conventions used throughout:
//   P = ranks, r = this rank, es = element size, a "chunk" fills at most one slot.
//   Blocks of AllReduce are balanced: block b covers elements [count*b/P, count*(b+1)/P).
//   Zero-length chunks are skipped by sender and receiver alike (both derive the same
//   lengths), so no empty slot is ever posted inside a collective.
//   Reductions always combine sources in the same order on every rank, so all ranks
//   end with bit-identical results.
#include "coll/algorithms.h"

#include <algorithm>
#include <cstring>

#include "coll/batch.h"
#include "coll/comm.h"
#include "coll/device/data_ops.h"
#include "coll/p2p_copy.h"
#include "coll/signature.h"
#include "core/log.h"
#include "core/shared_segments.h"
#include "plan/host_cost.h"
#include "reduce/reduce.h"
#include "reduce/stream_copy.h"

namespace ridge {
namespace {

inline int mod(int a, int p) {
  return ((a % p) + p) % p;
}
inline const char* cbytes(const void* p) {
  return static_cast<const char*>(p);
}
inline char* mbytes(void* p) {
  return static_cast<char*>(p);
}

// Before the first chunk from `peer` in an operation: its header (coll/signature.h), read
// and checked against this rank's call. One predictable branch per peek otherwise.
#define RIDGE_CO_TAKE_HEADER(c, peer)                                                 \
  do {                                                                                \
    if ((c)->ledger.sized && (c)->ledger.due[static_cast<size_t>(peer)]) [[unlikely]] \
      RIDGE_CO_TRY(co_await takeHeader((c), (peer)));                                 \
  } while (0)

// Balanced block boundary without overflowing count*b.
inline size_t blockStart(size_t count, int b, int P) {
  return (count / P) * b + (count % P) * b / P;
}

// Copy into the user's output: streaming stores for messages above RIDGE_STREAM_MIN.
inline void copyOut(bool stream, void* dst, const void* src, size_t bytes) {
  if (stream)
    streamCopy(dst, src, bytes);
  else
    std::memcpy(dst, src, bytes);
}

Status mismatch(ridgeComm* c, CollType t, int peer, size_t expected, const SlotInfo& got) {
  return makeError(ridgeInvalidUsage,
                   "rank %d: %s: peer %d sent a %u-byte chunk where %zu bytes were expected; ranks "
                   "called collectives with different counts, types or order",
                   c->rank, collTypeName(t), peer, got.bytes, expected);
}

// ---- direct extension: sending from and receiving into caller memory -------------------

// Whether a connector moves chunks straight from and into caller memory
// (transports/transport.h, the direct extension).
template <class Connector>
inline bool offersDirect(Connector* conn) {
  return conn && conn->directVersion() >= kDirectTransferVersion;
}

// Whether a point-to-point message of `bytes` over `tx` is sent straight from caller memory
// (from the connector's directSendMinBytes) rather than copied into slots (sendMessage). A
// collective's header wait (coll/signature.cpp, HeaderSent) still starts at a full slot:
// below it the TCP transport's withdrawal lets the header leave first.
inline bool sendsDirect(SendConnector* tx, size_t bytes) {
  return offersDirect(tx) && bytes >= tx->directSendMinBytes();
}

// Withdraws the direct chunks of an operation that ends without completing (error, or its
// frame destroyed by the executor after an abort or timeout), so that the transport never
// touches the caller's buffers after the call returned.
struct DirectWithdrawal {
  SendConnector* tx;
  RecvConnector* rx;
  bool armed = true;
  ~DirectWithdrawal() {
    if (!armed) return;
    if (tx) tx->withdrawDirect();
    if (rx) rx->withdrawDirect();
  }
};

// Declares the destinations of an operation's upcoming receives ahead (tryExpect), as far
// as the FIFO allows, so that the transport reads chunks straight into the output while
// the algorithm still works on earlier ones. `next(&dst, &bytes)` yields the operation's
// receives in arrival order (dst null: into a slot) and false after the last. Receives
// declared before the operation started (as slots, by a slot-only user's read-ahead) are
// skipped: they arrive in slots. Does nothing for a connector without the extension.
template <class Next>
struct ExpectAhead {
  RecvConnector* rx;
  Next next;
  bool held = false;  // dst/bytes wait for room in the FIFO
  char* dst = nullptr;
  size_t bytes = 0;

  // The peer's operation header, while due, is the first declared chunk (as a slot, see
  // coll/signature.cpp): it is none of the operation's receives.
  ExpectAhead(const ridgeComm* c, RecvConnector* r, Next n)
      : rx(offersDirect(r) ? r : nullptr), next(std::move(n)) {
    if (!rx) return;
    // Slots a slot-only user's read-ahead declared drain from here on instead of being
    // declared again as they are released (transport.h, endReadAhead).
    rx->endReadAhead();
    uint32_t ahead = rx->declaredAhead();
    if (ahead && c->ledger.sized && c->ledger.due[static_cast<size_t>(rx->peer())]) --ahead;
    for (; ahead && next(&dst, &bytes); --ahead) {
    }
    declare();
  }
  void declare() {
    if (!rx) return;
    while (held || next(&dst, &bytes)) {
      held = !rx->tryExpect(dst, static_cast<uint32_t>(bytes));
      if (held) return;
    }
  }
  // Releases the peeked chunk and declares what that made room for.
  void release(RecvConnector* conn) {
    conn->release();
    declare();
  }
};

// Sends `bytes` of caller memory as the next chunk: queued directly when `direct` (the
// caller then awaits SendsComplete before reusing it), else copied into a slot (by the
// communicator's data ops: coll/device/data_ops.h) and posted once the copy is done. With `later`,
// a device copy is not waited for here: the post waits in `later` for the caller's next
// settle (which then covers the caller's own copies of the step too); the host posts at once.
Task sendChunk(ridgeComm* c, SendConnector* tx, bool direct, const void* src, size_t bytes, bool last,
               PostAfterSettle* later = nullptr) {
  if (direct) {
    co_await PostDirect(tx, src, bytes, last);
    co_return Status::ok();
  }
  void* slot = co_await AcquireSlot(tx);
  RIDGE_CO_TRY(dataCopy(c, slot, src, bytes));
  if (later) {
    later->queue(c, tx, static_cast<uint32_t>(bytes), last);
    co_return Status::ok();
  }
  RIDGE_CO_TRY(co_await dataSettled(c));
  tx->post(static_cast<uint32_t>(bytes), last);
  co_return Status::ok();
}

// ---- point to point ---------------------------------------------------------------------

// Messages of at least the connector's directSendMinBytes (a full chunk, or less where the
// transport says so) go straight from the caller's buffer where the connector offers it,
// which saves copying them into slots; the call then returns once
// the transport has handed every chunk over (SendsComplete), so the caller may reuse its
// buffer. Shorter messages are copied into a slot: the copy costs less than waiting for
// the transport, and the call returns as soon as the message is queued.
// Device buffers (c->device->data, set by the GPU proxy) are copied into the slots by the
// copy engine, chunk by chunk, the same chunks as from host memory, never sent directly (a
// transport would read them from the host).
Task sendMessage(ridgeComm* c, int peer, const char* src, size_t bytes) {
  SendConnector* tx = c->sendTo[peer];
  // A device buffer over a connector the device can drive itself (gdr write): the device-side
  // producer sends the whole message from device memory, queued on the data ops' stream; no
  // copy into a slot by the copy engine. Only a message the transport takes without the peer
  // releasing anything (chunksInFlight): a longer one would wait on the stream for the peer's
  // credits while this rank's own receives queue behind it, and two ranks exchanging such
  // messages would wait for each other. Otherwise, and where the runtime cannot run it, the
  // chunk path below (the device posting each slot where the producer is bound to the stream).
  if (c->device->data && bytes <= static_cast<size_t>(tx->chunksInFlight()) * tx->slotBytes()) {
    if (DeviceProducer* dp = tx->deviceProducer()) {
      void* arg = nullptr;
      const DeviceProducer::Fn fn = dp->deviceFunction(&arg);
      if (c->device->data->launch(fn, arg, src, bytes).isOk()) {
        RIDGE_CO_TRY(co_await dataSettled(c));
        co_return dp->finishDeviceSend();
      }
    }
  }
  const size_t chunk = tx->slotBytes();
  const bool direct = !c->device->data && sendsDirect(tx, bytes);
  DirectWithdrawal withdrawal{direct ? tx : nullptr, nullptr};
  size_t off = 0;
  do {
    const size_t n = std::min(chunk, bytes - off);
    off += n;
    RIDGE_CO_TRY(co_await sendChunk(c, tx, direct, src + off - n, n, off == bytes));
  } while (off < bytes);
  if (direct) co_await SendsComplete(tx);
  withdrawal.armed = false;
  co_return Status::ok();
}

// Receives land straight in `dst` where the connector offers it (a chunk of the wrong size
// cannot: it is larger than its room, or it ends the message early, and is reported).
Task recvMessage(ridgeComm* c, int peer, char* dst, size_t bytes) {
  RecvConnector* rx = c->recvFrom[peer];
  // Device buffers are never declared as destinations (a transport would write into them
  // from the host): their chunks arrive in slots and the copy engine moves them.
  const bool direct = !c->device->data && offersDirect(rx);
  DirectWithdrawal withdrawal{nullptr, direct ? rx : nullptr};
  const size_t chunk = rx->slotBytes();
  size_t planOff = 0;
  bool planDone = false;
  ExpectAhead expect(c, direct ? rx : nullptr, [&](char** to, size_t* n) {
    if (planDone) return false;
    *to = dst + planOff;
    *n = std::min(chunk, bytes - planOff);
    planOff += *n;
    planDone = planOff == bytes;  // an empty message is one empty chunk
    return true;
  });
  size_t off = 0;
  do {
    RIDGE_CO_TAKE_HEADER(c, rx->peer());
    PeekSlot pk(rx);
    const void* slot = co_await pk;
    size_t n = pk.info.bytes;
    if (off + n > bytes || pk.info.lastOfMessage != (off + n == bytes))
      co_return makeError(ridgeInvalidUsage,
                          "rank %d: recv of %zu bytes from rank %d does not match the size of the "
                          "message it sent (chunk of %zu bytes at offset %zu%s)",
                          c->rank, bytes, peer, n, off, pk.info.lastOfMessage ? ", last" : "");
    if (slot != dst + off) RIDGE_CO_TRY(dataCopy(c, dst + off, slot, n));
    off += n;
    RIDGE_CO_TRY(co_await dataSettled(c));
    expect.release(rx);
  } while (off < bytes);
  withdrawal.armed = false;
  co_return Status::ok();
}

// ---- all-pairs: every rank exchanges with every other rank in one step per chunk -------

// ---- inline headers of the all-pairs reductions (allPairsReduce, allPairsReduceToRoot) ----

// Where an inline header from `peer` sits: in the slot's last line on a connector with tags
// (its digest is the post's tag), else ahead of the data.
inline size_t inlineHeaderRoomFrom(const ridgeComm* c, int peer) {
  return c->ledger.tagsFrom[static_cast<size_t>(peer)] ? 0 : kInlineHeaderBytes;
}
// The empty word after a header that leads a slot of its own (allPairsReduceToRoot).
constexpr size_t kHeaderOnlyPad = sizeof(uint64_t);

// Posts this rank's header for `peer` in one slot with `bytes` of `src` (null: the header
// alone, see allPairsReduceToRoot).
Task postInlineSlot(ridgeComm* c, int peer, const char* src, size_t bytes) {
  SendConnector* tx = c->sendTo[peer];
  char* slot = static_cast<char*>(co_await AcquireSlot(tx));
  const size_t n = src ? bytes : 0;
  if (c->ledger.tagsTo[static_cast<size_t>(peer)]) {
    const uint64_t tag = writeInlineHeader(c->ledger, peer, coldHeader(slot, tx->slotBytes()));
    if (n) std::memcpy(slot, src, n);
    tx->postTagged(static_cast<uint32_t>(n), true, tag);
    co_return Status::ok();
  }
  writeInlineHeader(c->ledger, peer, slot);
  if (n)
    std::memcpy(slot + kInlineHeaderBytes, src, n);
  else
    std::memset(slot + kInlineHeaderBytes, 0, kHeaderOnlyPad);
  tx->post(static_cast<uint32_t>(kInlineHeaderBytes + (n ? n : kHeaderOnlyPad)), true);
  co_return Status::ok();
}

// Takes `peer`'s slot with its header alone and checks the header, unless the executor's idle
// poll already did in place.
Task takeHeaderSlot(ridgeComm* c, CollType type, int peer) {
  RecvConnector* rx = c->recvFrom[peer];
  PeekSlot pk(rx);
  const void* slot = co_await pk;
  const size_t want = inlineHeaderRoomFrom(c, peer) ? kInlineHeaderBytes + kHeaderOnlyPad : 0;
  if (c->ledger.due[static_cast<size_t>(peer)]) RIDGE_CO_TRY(checkInlineHeader(c, peer, slot, pk.info));
  if (pk.info.bytes != want) co_return mismatch(c, type, peer, want, pk.info);
  rx->release();
  co_return Status::ok();
}

// A data slot's inline header in two steps, so that its line is fetched beside the payload's
// rather than before it: the digest copied out before the reduction (the tag, or the slot's
// first word), compared after it; a digest that differs is then checked in full from the slot,
// still held, which names the peer's call.
inline void keepInlineDigest(ridgeComm* c, int peer, const void* slot, const SlotInfo& info) {
  OpLedger& L = c->ledger;
  if (!L.due[static_cast<size_t>(peer)]) return;
  if (inlineHeaderRoomFrom(c, peer) == 0)
    L.inbox[static_cast<size_t>(peer)] = info.tag;
  else
    copyInlineHeader(L, peer, slot);
}
Status checkKeptDigest(ridgeComm* c, int peer, const void* slot, size_t bytes) {
  OpLedger& L = c->ledger;
  if (!L.due[static_cast<size_t>(peer)]) return Status::ok();
  if (copiedHeaderMatches(L, peer)) [[likely]] {
    headerMatched(L, peer);
    return Status::ok();
  }
  SlotInfo info;
  info.bytes = static_cast<uint32_t>(bytes);
  info.tag = inlineHeaderRoomFrom(c, peer) == 0 ? L.inbox[static_cast<size_t>(peer)] : 0;
  return checkInlineHeader(c, peer, slot, info);
}

// AllReduce (blockStride 0) and ReduceScatter (blockStride = recv count): in each round
// a rank sends the chunk every peer needs, then reduces the P contributions to its own.
Task allPairsReduce(ridgeComm* c, CollArgs a, bool scatter, bool inlineHeader = false) {
  const int P = c->nranks, r = c->rank;
  const size_t es = dataTypeSize(a.dtype);
  const size_t chunkElems = P == 1 ? std::max<size_t>(a.count, 1) : c->sendTo[(r + 1) % P]->slotBytes() / es;
  const int divisor = a.op == ridgeAvg ? P : 0;
  const void** srcs = c->scratchPtrs.data();
  // A message that fits one slot beside its header carries the header in that slot
  // (runCollective decides, coll/signature.h): one slot per peer, as without signatures. On
  // a connector with tags the header's digest is the post's tag and the header itself sits
  // in the slot's last line (hdr 0 there); elsewhere the header leads the data.
  const OpLedger& L = c->ledger;
  auto headerRoom = [inlineHeader](const std::vector<uint8_t>& tags, int peer) {
    return inlineHeader && !tags[static_cast<size_t>(peer)] ? kInlineHeaderBytes : 0;
  };
  for (size_t off = 0; off < a.count; off += chunkElems) {
    const size_t n = std::min(chunkElems, a.count - off);
    for (int k = 1; k < P; ++k) {
      int j = (r + k) % P;
      size_t src = scatter ? (size_t(j) * a.count + off) : off;
      SendConnector* tx = c->sendTo[j];
      char* slot = static_cast<char*>(co_await AcquireSlot(tx));
      const size_t hdr = headerRoom(L.tagsTo, j);
      if (inlineHeader && hdr == 0) {
        const uint64_t tag = writeInlineHeader(c->ledger, j, coldHeader(slot, tx->slotBytes()));
        std::memcpy(slot, cbytes(a.send) + src * es, n * es);
        tx->postTagged(static_cast<uint32_t>(n * es), false, tag);
        continue;
      }
      if (inlineHeader) writeInlineHeader(c->ledger, j, slot);
      std::memcpy(slot + hdr, cbytes(a.send) + src * es, n * es);
      tx->post(static_cast<uint32_t>(hdr + n * es), false);
    }
    srcs[r] = cbytes(a.send) + (scatter ? size_t(r) * a.count + off : off) * es;
    bool copied = false;  // inline headers copied out, checked after the reduction
    for (int k = 1; k < P; ++k) {
      int j = (r + P - k) % P;
      if (!inlineHeader) RIDGE_CO_TAKE_HEADER(c, j);
      PeekSlot pk(c->recvFrom[j]);
      const char* got = static_cast<const char*>(co_await pk);
      const bool due = inlineHeader && c->ledger.due[static_cast<size_t>(j)];
      const size_t hdr = headerRoom(L.tagsFrom, j);
      srcs[j] = got + hdr;
      if (pk.info.bytes != hdr + n * es) {
        if (due) RIDGE_CO_TRY(checkInlineHeader(c, j, got, pk.info));  // names the peer's call
        co_return mismatch(c, scatter ? CollType::ReduceScatter : CollType::AllReduce, j, hdr + n * es,
                           pk.info);
      }
      if (due) {
        keepInlineDigest(c, j, got, pk.info);
        copied = true;
      }
    }
    reduceMany(mbytes(a.recv) + off * es, srcs, P, n, a.dtype, a.op, divisor);
    if (copied)
      for (int k = 1; k < P; ++k) {
        const int j = (r + P - k) % P;
        const size_t hdr = headerRoom(L.tagsFrom, j);
        RIDGE_CO_TRY(checkKeptDigest(c, j, cbytes(srcs[j]) - hdr, hdr + n * es));
      }
    for (int k = 1; k < P; ++k) c->recvFrom[(r + P - k) % P]->release();
  }
  co_return Status::ok();
}

// Chunk rounds by which an all-gather or all-to-all of two ranks posts its sends ahead of
// its receives. Each rank sends only its own input then, so no send depends on a receive;
// sending round t + 1 only once round t has arrived leaves the connection idle in both
// directions for two wake-ups per round, at every round (issue 21, over TCP against Gloo).
// Before its first receive a rank has posted its operation header and rounds 0 to lead,
// and the peer may not have opened its receive window yet (an operation that receives
// through slots declares its positions only at its first receive), so those lead + 2
// chunks must fit in this rank's own send queue: half of chunksInFlight, the other half
// being the peer's window (0 = not stated: no lead). Then no rank ever blocks posting
// before it receives, and every rank can always progress; with the whole of chunksInFlight
// an in-place all-to-all through slots deadlocked once the kernel buffers were full
// (SocketOneHost.ExchangeLeadWithinFifos*). With more ranks the ring forwards what it
// receives and all-pairs sends to every peer; neither is changed.
// One rank has no connector to itself (sendTo[rank] is null): no lead, and nothing to ask.
inline size_t exchangeAhead(int P, const SendConnector* tx) {
  if (P != 2 || tx == nullptr) return 0;
  const uint32_t ownQueue = tx->chunksInFlight() / 2;
  return ownQueue >= 3 ? size_t{ownQueue} - 2 : 0;
}

// AllGather (gather = true: every rank's block goes to everyone) and AlltoAll (block j
// of the input goes to rank j). Each round sends one chunk to every peer before it
// receives any, which also makes the in-place forms safe: a block is copied into a slot
// before the incoming chunk for the same offset overwrites it.
// Two ranks over a connector with the direct extension (TCP) send straight from the input
// and receive straight into the output (no copy in user space but the own block's), except
// an all-to-all in place, whose incoming chunk would overwrite the one still to be sent.
Task allPairsExchange(ridgeComm* c, CollArgs a, bool gather) {
  const int P = c->nranks, r = c->rank;
  const size_t es = dataTypeSize(a.dtype);
  const size_t chunkElems = P == 1 ? std::max<size_t>(a.count, 1) : c->sendTo[(r + 1) % P]->slotBytes() / es;
  const int peer = (r + 1) % P;
  const bool direct = P == 2 && !c->device->data && (gather || a.send != a.recv);
  SendConnector* txDirect = direct && offersDirect(c->sendTo[peer]) ? c->sendTo[peer] : nullptr;
  RecvConnector* rxDirect = direct && offersDirect(c->recvFrom[peer]) ? c->recvFrom[peer] : nullptr;
  DirectWithdrawal withdrawal{txDirect, rxDirect};
  size_t planOff = 0;
  ExpectAhead expect(c, rxDirect, [&](char** dst, size_t* bytes) {
    if (planOff >= a.count) return false;
    *dst = mbytes(a.recv) + (size_t(peer) * a.count + planOff) * es;
    *bytes = std::min(chunkElems, a.count - planOff) * es;
    planOff += chunkElems;
    return true;
  });
  const size_t lead = exchangeAhead(P, c->sendTo[peer]);
  size_t sentOff = 0;  // with a lead: the per-peer elements sent so far
  for (size_t off = 0; off < a.count; off += chunkElems) {
    const size_t n = std::min(chunkElems, a.count - off);
    // Two ranks: the rounds up to `lead` ahead of this one (their chunks are copied into
    // slots, in place too, before the receives of the same offsets overwrite them).
    for (const size_t until = std::min(a.count, off + (lead + 1) * chunkElems); lead && sentOff < until;
         sentOff += chunkElems) {
      const size_t m = std::min(chunkElems, a.count - sentOff);
      const size_t src = gather ? sentOff : size_t(peer) * a.count + sentOff;
      RIDGE_CO_TRY(co_await sendChunk(c, c->sendTo[peer], txDirect != nullptr, cbytes(a.send) + src * es,
                                      m * es, false));
    }
    for (int k = 1; k < P && !lead; ++k) {
      int j = (r + k) % P;
      size_t src = gather ? off : size_t(j) * a.count + off;
      RIDGE_CO_TRY(
          co_await sendChunk(c, c->sendTo[j], txDirect != nullptr, cbytes(a.send) + src * es, n * es, false));
    }
    // The own block gates no slot: on the device it is left to the stream (coll/device/data_ops.h).
    char* own = mbytes(a.recv) + (size_t(r) * a.count + off) * es;
    const char* ownSrc = cbytes(a.send) + ((gather ? 0 : size_t(r) * a.count) + off) * es;
    if (own != ownSrc) RIDGE_CO_TRY(dataCopy(c, own, ownSrc, n * es));
    for (int k = 1; k < P; ++k) {
      int j = (r + P - k) % P;
      RIDGE_CO_TAKE_HEADER(c, j);
      PeekSlot pk(c->recvFrom[j]);
      const void* slot = co_await pk;
      if (pk.info.bytes != n * es)
        co_return mismatch(c, gather ? CollType::AllGather : CollType::AlltoAll, j, n * es, pk.info);
      char* dst = mbytes(a.recv) + (size_t(j) * a.count + off) * es;
      if (slot != dst) RIDGE_CO_TRY(dataCopy(c, dst, slot, n * es));  // arrived in a slot
      RIDGE_CO_TRY(co_await dataSettled(c));
      expect.release(c->recvFrom[j]);
    }
  }
  if (txDirect) co_await SendsComplete(txDirect);
  withdrawal.armed = false;
  co_return Status::ok();
}

// Broadcast, all-pairs: the root writes each chunk into every peer's FIFO.
Task allPairsBroadcast(ridgeComm* c, CollArgs a) {
  const size_t bytes = a.count * dataTypeSize(a.dtype);
  if (c->rank != a.root) co_return co_await recvMessage(c, a.root, mbytes(a.recv), bytes);
  const int P = c->nranks;
  const size_t chunk = P == 1 ? std::max<size_t>(bytes, 1) : c->sendTo[(a.root + 1) % P]->slotBytes();
  for (size_t off = 0; off < bytes; off += chunk) {
    const size_t n = std::min(chunk, bytes - off);
    for (int k = 1; k < P; ++k) {
      int j = (a.root + k) % P;
      void* slot = co_await AcquireSlot(c->sendTo[j]);
      std::memcpy(slot, cbytes(a.send) + off, n);
      c->sendTo[j]->post(static_cast<uint32_t>(n), off + n == bytes);
    }
  }
  if (a.recv != a.send) std::memcpy(a.recv, a.send, bytes);
  co_return Status::ok();
}

// Reduce, all-pairs: every rank sends its whole input to the root, which reduces the P
// contributions chunk by chunk.
// With `inlineHeader` (a message that fits one slot beside its header: runCollective decides,
// coll/signature.h) the collective's header rides in that one slot, as in the small all-pairs
// allreduce: a non-root posts one slot to the root per call instead of a header slot and then
// a data slot, and the root takes one (the slot hand-off of the header alone was a part of a
// 64 KiB reduce on 2 ranks, docs/performance.md, issue 21). Every pair still compares both
// ways: a rank sends every peer it sends no data to a slot with its header alone (tagged and
// empty where the connector carries tags, else the header and an empty word, so that it is
// never the lone header of a rank that chose the other way) and takes one from every peer it
// receives no data from.
Task allPairsReduceToRoot(ridgeComm* c, CollArgs a, bool inlineHeader = false) {
  const size_t es = dataTypeSize(a.dtype);
  const int P = c->nranks, r = c->rank;
  if (inlineHeader) {
    for (int k = 1; k < P; ++k) {
      const int j = (r + k) % P;
      RIDGE_CO_TRY(co_await postInlineSlot(c, j, j == a.root ? cbytes(a.send) : nullptr, a.count * es));
    }
    for (int k = 1; k < P && r != a.root; ++k) {
      const int j = (r + P - k) % P;
      if (j != a.root) RIDGE_CO_TRY(co_await takeHeaderSlot(c, CollType::Reduce, j));
    }
    if (r != a.root) co_return co_await takeHeaderSlot(c, CollType::Reduce, a.root);
  } else if (r != a.root) {
    co_return co_await sendMessage(c, a.root, cbytes(a.send), a.count * es);
  }
  const size_t chunkElems =
      P == 1 ? std::max<size_t>(a.count, 1) : c->recvFrom[(r + 1) % P]->slotBytes() / es;
  const void** srcs = c->scratchPtrs.data();
  for (size_t off = 0; off < a.count; off += chunkElems) {
    const size_t n = std::min(chunkElems, a.count - off);
    srcs[r] = cbytes(a.send) + off * es;
    for (int j = 0; j < P; ++j) {
      if (j == r) continue;
      if (!inlineHeader) RIDGE_CO_TAKE_HEADER(c, j);
      PeekSlot pk(c->recvFrom[j]);
      const char* got = static_cast<const char*>(co_await pk);
      const size_t hdr = inlineHeader ? inlineHeaderRoomFrom(c, j) : 0;
      srcs[j] = got + hdr;
      if (pk.info.bytes != hdr + n * es || pk.info.lastOfMessage != (off + n == a.count)) {
        if (inlineHeader && c->ledger.due[static_cast<size_t>(j)])
          RIDGE_CO_TRY(checkInlineHeader(c, j, got, pk.info));  // names the peer's call
        co_return mismatch(c, CollType::Reduce, j, hdr + n * es, pk.info);
      }
      if (inlineHeader) keepInlineDigest(c, j, got, pk.info);
    }
    reduceMany(mbytes(a.recv) + off * es, srcs, P, n, a.dtype, a.op, a.op == ridgeAvg ? P : 0);
    // The digests copied out before the reduction, compared after it (the slot is still held:
    // a digest that differs is checked in full from there, which names the peer's call).
    for (int j = 0; j < P && inlineHeader; ++j)
      if (j != r) {
        const size_t hdr = inlineHeaderRoomFrom(c, j);
        RIDGE_CO_TRY(checkKeptDigest(c, j, cbytes(srcs[j]) - hdr, hdr + n * es));
      }
    for (int j = 0; j < P; ++j)
      if (j != r) c->recvFrom[j]->release();
  }
  co_return Status::ok();
}

// ---- ring / chain: pipelined, each rank talks to its two neighbours ---------------------

// The ring neighbours of this rank on the plan's ring.
inline int ringNext(const ridgeComm* c) {
  return c->ringOrder[(c->ringPos[static_cast<size_t>(c->rank)] + 1) % c->nranks];
}
inline int ringPrev(const ridgeComm* c) {
  return c->ringOrder[(c->ringPos[static_cast<size_t>(c->rank)] + c->nranks - 1) % c->nranks];
}

// Chunk rounds by which a ring of two ranks runs its reduce-scatter sends ahead. Two ranks
// would otherwise take turns once per round: each sends its step-0 chunk, waits for the
// peer's, reduces it and sends the result, and its next step-0 chunk leaves only after the
// peer's result has arrived, so the reductions and the transfers alternate instead of
// overlapping, and every wait is a wake-up on the critical path. Sending step 0 of later
// rounds first gives the peer its next chunks to reduce while the results cross. With a
// lead of `d` rounds a rank has at most 2d + 2 chunks posted that the peer has not
// released (d + 1 step-0 chunks and d + 1 results), so the lead stays within what the
// connector can hold without any kernel buffering (chunksInFlight; 0 = no lead), and
// within 2: more measured no faster (docs/performance.md, issue 5). With more ranks every
// step but the first depends on a receive, and the ring's P-1 chunks in flight already
// overlap them. Both ranks derive the same lead (the connectors' FIFO sizes must match),
// so each receives in the order its peer sends.
inline size_t ringAhead(int P, const SendConnector* tx) {
  const uint32_t inFlight = tx->chunksInFlight();
  return P == 2 && inFlight >= 4 ? std::min<size_t>(2, (inFlight - 2) / 2) : 0;
}

// Where the chunks of a ring reduce-scatter / allreduce are: blocks are balanced
// (AllReduce) or a.count each (ReduceScatter); a chunk round starting at element `base`
// of every block covers at most chunkElems elements of each.
struct RingLayout {
  const int* order;
  int P, p;
  size_t count, total, chunkElems;
  bool allGather;
  size_t start(int b) const { return allGather ? blockStart(total, b, P) : size_t(b) * count; }
  size_t length(int b) const { return start(b + 1) - start(b); }
  size_t maxBlock() const { return allGather ? (total + P - 1) / P : count; }
  // Elements of block b in the round at `base` (0 when the block is shorter), and where.
  size_t chunk(int b, size_t base, size_t* off) const {
    const size_t len = length(b);
    *off = start(b) + base;
    return base >= len ? size_t{0} : std::min(chunkElems, len - base);
  }
  // The block received at step k (1..P-1) of the reduce-scatter or the all-gather half.
  int recvBlock(bool reduceScatter, int k) const { return order[mod(reduceScatter ? p - 1 - k : p - k, P)]; }
  size_t rounds() const { return (maxBlock() + chunkElems - 1) / chunkElems; }
  // Chunk rounds by which the reduce-scatter's step-0 sends run ahead of the rest (0 or
  // more, see ringAhead). The all-gather of the last `ahead` rounds runs in iterations of
  // their own.
  size_t ahead;
  size_t iterations() const { return rounds() + (allGather ? ahead : 0); }
};

// AllReduce = reduce-scatter then all-gather around the ring (withAllGather = true);
// ReduceScatter = the first half alone, blocks of a.count elements. Per chunk round:
//   RS step 0 sends block r-1; step k receives block r-1-k, reduces it with the local
//   input and forwards it (fused: the reduction writes straight into the next slot);
//   at step P-1 the block is r, complete, and goes to the output (and, for AllReduce,
//   starts around the ring again). AG step k receives block r-k, stores and forwards it.
//   With two ranks, step 0 of later rounds is sent ahead of the rest (ringAhead).
// Positions are on the plan's ring (the identity unless ranks span sockets or a plan file
// says otherwise): position q owns block order[q], so the rank at position p ends with
// the complete block order[p] = r, its own, as ReduceScatter requires.
//
// Each rank decides for its own two connectors whether to use the direct extension.
// Sending directly: the reduce-scatter sends block r-1 straight from the input; a partial
// sum (P > 2, AllReduce) and the final block r are reduced into the output, which is
// their last home or is overwritten later by the all-gather, and sent from there; the
// all-gather forwards from the output. Receiving directly: reduce-scatter chunks still
// arrive in slots (reduced with the input, so that copy is the reduction), all-gather
// chunks straight in the output. For P = 2 no byte is then copied in user space besides
// the reduction itself. Buffers are reused only after the sends are complete. Through
// slots: the final block is reduced into the next slot (cache) and copied to the output
// from there, so the output can take streaming stores and is never read back.
// In place is safe: a block's input is read once, before its output is written, and a
// region sent from is overwritten only by a chunk that causally follows the peer's full
// receipt of what was sent from it (the ring must pass it on first).
Task ringReduce(ridgeComm* c, CollArgs a, bool withAllGather) {
  const int P = c->nranks;
  const int p = c->ringPos[static_cast<size_t>(c->rank)];
  const int prev = ringPrev(c);
  SendConnector* tx = c->sendTo[ringNext(c)];
  RecvConnector* rx = c->recvFrom[prev];
  const bool txDirect = offersDirect(tx), rxDirect = offersDirect(rx);
  const size_t es = dataTypeSize(a.dtype);
  const RingLayout L{c->ringOrder.data(),
                     P,
                     p,
                     a.count,
                     withAllGather ? a.count : a.count * P,
                     tx->slotBytes() / es,
                     withAllGather,
                     ringAhead(P, tx)};
  const CollType type = withAllGather ? CollType::AllReduce : CollType::ReduceScatter;
  const int r = L.order[p];
  // Where block r's final result goes: in place in the AllReduce output, or at the start
  // of the ReduceScatter output.
  char* finalBase = mbytes(a.recv) + (withAllGather ? L.start(r) * es : 0);
  const int divisor = a.op == ridgeAvg ? P : 0;
  const char* in = cbytes(a.send);
  char* out = mbytes(a.recv);
  // In place, the output lines were just read as input and are in cache: plain stores.
  const bool stream = L.total * es >= c->streamMin && a.send != a.recv;
  DirectWithdrawal withdrawal{txDirect ? tx : nullptr, rxDirect ? rx : nullptr};
  // Chunk rounds in iterations (see RingLayout::iterations): iteration t sends the
  // reduce-scatter's step-0 chunk of round t + ahead (iteration 0 also those of rounds 0 to
  // ahead - 1), handles the reduce-scatter receives of round t, then the all-gather
  // receives of round t - ahead. Every rank runs the same schedule, so each receives in
  // the order its predecessor sends.
  const size_t ahead = L.ahead, rounds = L.rounds();
  // Receives in arrival order: reduce-scatter chunks into slots (they are reduced with the
  // input), all-gather chunks straight into the output.
  size_t planIter = 0;
  int planStep = 0;
  ExpectAhead expect(c, rx, [&, steps = withAllGather ? 2 * (P - 1) : P - 1](char** dst, size_t* bytes) {
    for (; planIter < L.iterations(); ++planIter, planStep = 0) {
      while (planStep < steps) {
        const int s = planStep++;
        const bool rs = s < P - 1;
        if (rs ? planIter >= rounds : planIter < ahead || planIter - ahead >= rounds) continue;
        const size_t base = (rs ? planIter : planIter - ahead) * L.chunkElems;
        size_t off;
        const size_t n = L.chunk(L.recvBlock(rs, rs ? s + 1 : s - P + 2), base, &off);
        if (!n) continue;
        *dst = rs ? nullptr : out + off * es;
        *bytes = n * es;
        return true;
      }
    }
    return false;
  });

  for (size_t t = 0; t < L.iterations(); ++t) {
    size_t off, n;
    for (size_t round = t == 0 ? 0 : t + ahead; round <= t + ahead && round < rounds; ++round) {
      n = L.chunk(L.order[mod(p - 1, P)], round * L.chunkElems, &off);
      if (n) RIDGE_CO_TRY(co_await sendChunk(c, tx, txDirect, in + off * es, n * es, false));
    }
    for (int k = 1; k < P && t < rounds; ++k) {
      n = L.chunk(L.recvBlock(true, k), t * L.chunkElems, &off);
      if (!n) continue;
      RIDGE_CO_TAKE_HEADER(c, rx->peer());
      PeekSlot pk(rx);
      const void* recvd = co_await pk;
      if (pk.info.bytes != n * es) co_return mismatch(c, type, prev, n * es, pk.info);
      const int div = k < P - 1 ? 0 : divisor;
      if (k == P - 1 && !withAllGather) {
        RIDGE_CO_TRY(dataReduce2(c, finalBase + (off - L.start(r)) * es, recvd, in + off * es, n, a.dtype,
                                 a.op, divisor));
        RIDGE_CO_TRY(co_await dataSettled(c));
        expect.release(rx);
      } else if (txDirect && withAllGather) {  // (ReduceScatter's output has no room for partial sums)
        char* dst = out + off * es;
        RIDGE_CO_TRY(dataReduce2(c, dst, recvd, in + off * es, n, a.dtype, a.op, div));
        RIDGE_CO_TRY(co_await dataSettled(c));
        expect.release(rx);
        co_await PostDirect(tx, dst, n * es);
      } else {
        // On the device the reduction and the copy of the final block run back to back behind
        // one settle.
        void* slot = co_await AcquireSlot(tx);
        RIDGE_CO_TRY(dataReduce2(c, slot, recvd, in + off * es, n, a.dtype, a.op, div));
        if (k == P - 1) RIDGE_CO_TRY(dataCopy(c, finalBase + (off - L.start(r)) * es, slot, n * es, stream));
        RIDGE_CO_TRY(co_await dataSettled(c));
        tx->post(static_cast<uint32_t>(n * es), false);
        expect.release(rx);
      }
    }
    if (!withAllGather || t < ahead || t - ahead >= rounds) continue;
    const size_t base = (t - ahead) * L.chunkElems;
    for (int k = 1; k < P; ++k) {
      n = L.chunk(L.recvBlock(false, k), base, &off);
      if (!n) continue;
      char* dst = out + off * es;
      RIDGE_CO_TAKE_HEADER(c, rx->peer());
      PeekSlot pk(rx);
      const void* recvd = co_await pk;
      if (pk.info.bytes != n * es) co_return mismatch(c, type, prev, n * es, pk.info);
      const bool forward = k < P - 1;
      // Through slots, forward from the received slot (cache) before the output is written
      // with streaming stores, which are not read back. On the device both copies run back to
      // back behind one settle, then the forwarded slot is posted.
      PostAfterSettle later;
      if (forward && !txDirect) RIDGE_CO_TRY(co_await sendChunk(c, tx, false, recvd, n * es, false, &later));
      if (recvd != dst) RIDGE_CO_TRY(dataCopy(c, dst, recvd, n * es, stream));  // arrived in a slot
      RIDGE_CO_TRY(co_await dataSettled(c));
      later.post();
      expect.release(rx);
      if (forward && txDirect) co_await PostDirect(tx, dst, n * es);
    }
  }
  if (txDirect) co_await SendsComplete(tx);
  withdrawal.armed = false;
  co_return Status::ok();
}

// AllGather around the ring: each rank sends its block, then P-2 times forwards the
// block it just received.
Task ringAllGather(ridgeComm* c, CollArgs a) {
  const int P = c->nranks, r = c->rank;
  const int* order = c->ringOrder.data();
  const int p = c->ringPos[static_cast<size_t>(r)];
  const int prev = ringPrev(c);
  SendConnector* tx = c->sendTo[ringNext(c)];
  RecvConnector* rx = c->recvFrom[prev];
  const size_t es = dataTypeSize(a.dtype);
  const size_t chunkElems = tx->slotBytes() / es;
  char* out = mbytes(a.recv);
  // With the direct extension, blocks are sent from the input and forwarded from the
  // output, and arrive straight in the output (no copy in user space but the own block's).
  const bool txDirect = offersDirect(tx);
  DirectWithdrawal withdrawal{txDirect ? tx : nullptr, offersDirect(rx) ? rx : nullptr};
  size_t planOff = 0;
  int planStep = 1;
  ExpectAhead expect(c, rx, [&](char** dst, size_t* bytes) {
    if (planStep == P) {
      planStep = 1;
      planOff += chunkElems;
    }
    if (planOff >= a.count) return false;
    const int b = order[mod(p - planStep++, P)];
    *dst = out + (size_t(b) * a.count + planOff) * es;
    *bytes = std::min(chunkElems, a.count - planOff) * es;
    return true;
  });
  const size_t lead = exchangeAhead(P, tx);
  size_t sentOff = 0;  // with a lead (two ranks): the elements of the own block sent so far
  for (size_t off = 0; off < a.count; off += chunkElems) {
    const size_t n = std::min(chunkElems, a.count - off);
    char* own = out + (size_t(r) * a.count + off) * es;
    const char* src = cbytes(a.send) + off * es;
    if (!lead) RIDGE_CO_TRY(co_await sendChunk(c, tx, txDirect, src, n * es, false));
    for (const size_t until = std::min(a.count, off + (lead + 1) * chunkElems); lead && sentOff < until;
         sentOff += chunkElems) {
      const size_t m = std::min(chunkElems, a.count - sentOff);
      RIDGE_CO_TRY(co_await sendChunk(c, tx, txDirect, cbytes(a.send) + sentOff * es, m * es, false));
    }
    if (own != src) RIDGE_CO_TRY(dataCopy(c, own, src, n * es));
    for (int k = 1; k < P; ++k) {
      int b = order[mod(p - k, P)];
      char* dst = out + (size_t(b) * a.count + off) * es;
      RIDGE_CO_TAKE_HEADER(c, rx->peer());
      PeekSlot pk(rx);
      const void* recvd = co_await pk;
      if (pk.info.bytes != n * es) co_return mismatch(c, CollType::AllGather, prev, n * es, pk.info);
      if (recvd != dst) RIDGE_CO_TRY(dataCopy(c, dst, recvd, n * es));
      RIDGE_CO_TRY(co_await dataSettled(c));
      expect.release(rx);
      if (k < P - 1) RIDGE_CO_TRY(co_await sendChunk(c, tx, txDirect, dst, n * es, false));
    }
  }
  if (txDirect) co_await SendsComplete(tx);
  withdrawal.armed = false;
  co_return Status::ok();
}

// Reduce up a chain that ends at the root (position = (rank - root - 1) mod P): each rank
// adds its input to the partial result from its predecessor and passes it on.
Task chainReduce(ridgeComm* c, CollArgs a) {
  const int P = c->nranks, r = c->rank;
  const int p = c->ringPos[static_cast<size_t>(r)];
  const int pos = mod(p - c->ringPos[static_cast<size_t>(a.root)] - 1, P);
  const int next = ringNext(c), prev = ringPrev(c);
  SendConnector* tx = pos < P - 1 ? c->sendTo[next] : nullptr;
  RecvConnector* rx = pos > 0 ? c->recvFrom[prev] : nullptr;
  const size_t es = dataTypeSize(a.dtype);
  const size_t chunkElems = (tx ? tx->slotBytes() : rx->slotBytes()) / es;
  const int divisor = a.op == ridgeAvg ? P : 0;
  for (size_t off = 0; off < a.count; off += chunkElems) {
    const size_t n = std::min(chunkElems, a.count - off);
    const char* in = cbytes(a.send) + off * es;
    if (!rx) {
      void* slot = co_await AcquireSlot(tx);
      RIDGE_CO_TRY(dataCopy(c, slot, in, n * es));
      RIDGE_CO_TRY(co_await dataSettled(c));
      tx->post(static_cast<uint32_t>(n * es), false);
      continue;
    }
    RIDGE_CO_TAKE_HEADER(c, rx->peer());
    PeekSlot pk(rx);
    const void* recvd = co_await pk;
    if (pk.info.bytes != n * es) co_return mismatch(c, CollType::Reduce, prev, n * es, pk.info);
    if (tx) {
      void* slot = co_await AcquireSlot(tx);
      RIDGE_CO_TRY(dataReduce2(c, slot, recvd, in, n, a.dtype, a.op, 0));
      RIDGE_CO_TRY(co_await dataSettled(c));
      tx->post(static_cast<uint32_t>(n * es), false);
    } else {
      RIDGE_CO_TRY(dataReduce2(c, mbytes(a.recv) + off * es, recvd, in, n, a.dtype, a.op, divisor));
      RIDGE_CO_TRY(co_await dataSettled(c));
    }
    rx->release();
  }
  co_return Status::ok();
}

// ---- direct: single copy through peer-memory access (CMA on one host) ------------------
//
// Every rank first tells every peer where its buffers are (one small slot each way),
// then reads (and for AllReduce writes) peer buffers itself, and finally all ranks
// exchange an empty "done" slot so that nobody returns, and reuses its buffers, while
// a peer may still be reading or writing them.

// DirectDescriptor::shareable: this rank's input / output of a broadcast lies in its own
// shareable memory (ridgeMemAlloc on the host, core/shared_segments.h), which its peers map
// and copy with memcpy instead of CMA: the split of the copy depends on it
// (broadcastPushedBytes), so every rank tells the others.
constexpr uint32_t kSendShareable = 1, kRecvShareable = 2;
uint32_t broadcastShareable(const CollArgs& a) {
  const size_t bytes = a.count * dataTypeSize(a.dtype);
  return (isOwnSharedMemory(a.send, bytes) ? kSendShareable : 0) |
         (isOwnSharedMemory(a.recv, bytes) ? kRecvShareable : 0);
}

// With `inlineHeader` (runCollective decides, coll/signature.h) the collective's header rides
// at the start of the descriptor's slot: one slot per peer and direction, not two.
Task directBegin(ridgeComm* c, const CollArgs& a, bool inlineHeader) {
  const int P = c->nranks, r = c->rank;
  ridgeComm::DirectDescriptor mine{reinterpret_cast<uint64_t>(a.send),
                                   reinterpret_cast<uint64_t>(a.recv),
                                   a.count,
                                   static_cast<uint32_t>(a.type),
                                   static_cast<uint32_t>(a.root),
                                   a.type == CollType::Broadcast ? broadcastShareable(a) : 0u,
                                   0u};
  c->peerDesc[r] = mine;
  // Peers read (and write) these buffers through CMA: count the calls whose buffers the
  // caller registered (ridgeCommRegister locks them in RAM for exactly this access).
  if (!c->registrations.empty()) {
    const BufferUse use = bufferUse(a, r, P);
    const size_t es = dataTypeSize(a.dtype);
    if ((!use.readsSend || bufferRegistered(c, a.send, use.sendCount * es)) &&
        (!use.writesRecv || bufferRegistered(c, a.recv, use.recvCount * es)))
      c->registeredDirectCalls.fetch_add(1, std::memory_order_relaxed);
  }
  const size_t hdr = inlineHeader ? kInlineHeaderBytes : 0;
  for (int k = 1; k < P; ++k) {
    int j = (r + k) % P;
    char* slot = static_cast<char*>(co_await AcquireSlot(c->sendTo[j]));
    if (inlineHeader) writeInlineHeader(c->ledger, j, slot);
    std::memcpy(slot + hdr, &mine, sizeof mine);
    c->sendTo[j]->post(static_cast<uint32_t>(hdr + sizeof mine), true);
  }
  for (int k = 1; k < P; ++k) {
    int j = (r + P - k) % P;
    if (!inlineHeader) RIDGE_CO_TAKE_HEADER(c, j);
    PeekSlot pk(c->recvFrom[j]);
    const char* slot = static_cast<const char*>(co_await pk);
    // Still due: this strand checks it (else the executor's idle poll did, in place).
    const bool due = inlineHeader && c->ledger.due[static_cast<size_t>(j)];
    if (pk.info.bytes != hdr + sizeof mine) {
      if (due) RIDGE_CO_TRY(checkInlineHeader(c, j, slot, pk.info));  // names the peer's call
      co_return mismatch(c, a.type, j, hdr + sizeof mine, pk.info);
    }
    if (due) RIDGE_CO_TRY(checkInlineHeader(c, j, slot, pk.info));
    std::memcpy(&c->peerDesc[j], slot + hdr, sizeof mine);
    c->recvFrom[j]->release();
    const auto& d = c->peerDesc[j];
    if (d.count != mine.count || d.type != mine.type || d.root != mine.root)
      co_return makeError(
          ridgeInvalidUsage,
          "rank %d: %s: rank %d called %s with count %llu root %u, this rank with count %zu root %d", r,
          collTypeName(a.type), j, collTypeName(static_cast<CollType>(d.type)),
          static_cast<unsigned long long>(d.count), d.root, a.count, a.root);
  }
  co_return Status::ok();
}

// `ownCopy` (may be null): a copy of this rank's own that no peer waits for, run between
// posting "done" and waiting for the peers' (the broadcast root's copy into its output).
struct OwnCopy {
  void* dst;
  const void* src;
  size_t bytes;
  bool stream;
};
Task directEnd(ridgeComm* c, CollType type, const OwnCopy* ownCopy = nullptr) {
  const int P = c->nranks, r = c->rank;
  for (int k = 1; k < P; ++k) {
    int j = (r + k) % P;
    (void)co_await AcquireSlot(c->sendTo[j]);
    c->sendTo[j]->post(0, true);
  }
  if (ownCopy) copyOut(ownCopy->stream, ownCopy->dst, ownCopy->src, ownCopy->bytes);
  for (int k = 1; k < P; ++k) {
    int j = (r + P - k) % P;
    RIDGE_CO_TAKE_HEADER(c, j);
    PeekSlot pk(c->recvFrom[j]);
    (void)co_await pk;
    if (pk.info.bytes != 0) co_return mismatch(c, type, j, 0, pk.info);
    c->recvFrom[j]->release();
  }
  co_return Status::ok();
}

// This rank's `src` into peer j's [remote, remote + bytes): peerRead's counterpart (algorithms.h).
Status peerWrite(ridgeComm* c, int j, uint64_t remote, const void* src, size_t bytes, bool stream) {
  PeerMemory* pm = c->peerMemory[j];
  if (stream)
    if (void* dst = pm->mappedForWrite(remote, bytes)) {
      copyOut(true, dst, src, bytes);
      return Status::ok();
    }
  return pm->write(remote, src, bytes);
}

// Reduces chunk [srcElem, srcElem+n) of every peer's send buffer with the local input into
// `dst`, sources in rank order: straight from a peer's buffer where it is mapped here
// (docs/algorithms.md, "Mapped buffers": the peer's bytes are read once, by the reduction),
// else read into that peer's bounce chunk first.
Status directReduceChunk(ridgeComm* c, const CollArgs& a, size_t srcElem, size_t n, char* dst, int divisor) {
  const int P = c->nranks, r = c->rank;
  const size_t es = dataTypeSize(a.dtype);
  const void** srcs = c->scratchPtrs.data();
  for (int j = 0; j < P; ++j) {
    if (j == r) {
      srcs[j] = cbytes(a.send) + srcElem * es;
      continue;
    }
    const uint64_t remote = c->peerDesc[j].send + srcElem * es;
    if (const void* mapped = c->peerMemory[j]->mapped(remote, n * es)) {
      srcs[j] = mapped;
      continue;
    }
    char* bounce = c->bounce.get() + size_t(j) * c->bounceChunk;
    RIDGE_TRY(c->peerMemory[j]->read(bounce, remote, n * es));
    srcs[j] = bounce;
  }
  reduceMany(dst, srcs, P, n, a.dtype, a.op, divisor);
  return Status::ok();
}

// AllReduce: rank r reduces its 1/P slice reading every peer's input once, then writes
// the result into every peer's output. ReduceScatter: the same on block r, result kept.
// Reduce: the root reduces everything.
Task directReduce(ridgeComm* c, CollArgs a, bool inlineHeader) {
  RIDGE_CO_TRY(co_await directBegin(c, a, inlineHeader));
  const int P = c->nranks, r = c->rank;
  const size_t es = dataTypeSize(a.dtype);
  const size_t chunkElems = c->bounceChunk / es;
  const int divisor = a.op == ridgeAvg ? P : 0;
  size_t lo = 0, hi = 0, inBase = 0;  // output range [lo, hi) and its offset in the input
  if (a.type == CollType::AllReduce) {
    lo = blockStart(a.count, r, P);
    hi = blockStart(a.count, r + 1, P);
    inBase = 0;
  } else if (a.type == CollType::ReduceScatter) {
    hi = a.count;
    inBase = size_t(r) * a.count;
  } else if (r == a.root) {
    hi = a.count;
  }
  // AllReduce reduces into this rank's own (otherwise unused) bounce chunk, which stays
  // in cache while it is written to every peer and streamed to the output.
  const bool stream = a.count * es >= c->streamMin && a.send != a.recv;
  char* mine = c->bounce.get() + size_t(r) * c->bounceChunk;
  for (size_t off = lo; off < hi; off += chunkElems) {
    const size_t n = std::min(chunkElems, hi - off);
    char* dst = mbytes(a.recv) + off * es;
    if (a.type != CollType::AllReduce) {
      RIDGE_CO_TRY(directReduceChunk(c, a, inBase + off, n, dst, divisor));
      continue;
    }
    RIDGE_CO_TRY(directReduceChunk(c, a, inBase + off, n, mine, divisor));
    for (int k = 1; k < P; ++k) {
      int j = (r + k) % P;
      RIDGE_CO_TRY(peerWrite(c, j, c->peerDesc[j].recv + off * es, mine, n * es, stream));
    }
    copyOut(stream, dst, mine, n * es);
  }
  co_return co_await directEnd(c, a.type);
}

// Bytes at the start of every non-root's output that a direct broadcast's root writes into
// it (process_vm_writev) while the non-root reads the rest from the root's buffer, so that
// two cores copy at once instead of the non-root's alone (docs/algorithms.md, Broadcast).
// The share is the model's (AlgoSelector::broadcastRootShare), by size and by whether the
// root copies into its own output too; every rank derives the same split, as the
// descriptors carry both of the root's buffers. Where the root's input and every non-root's
// output are shareable (the descriptors say so), both sides memcpy at one rate and the
// split is plan::hostBroadcastRootShareMapped's instead (measured: out of place the model's
// CMA split left the root 1.3-2x slower at 1-16 MiB, docs/performance.md). Whole cache lines.
size_t broadcastPushedBytes(const ridgeComm* c, int root, size_t bytes, bool rootCopies) {
  bool mapped = true;
  for (int j = 0; j < c->nranks && mapped; ++j)
    mapped = (c->peerDesc[j].shareable & (j == root ? kSendShareable : kRecvShareable)) != 0;
  const double share = mapped ? plan::hostBroadcastRootShareMapped(c->nranks, rootCopies)
                              : c->algos.broadcastRootShare(bytes, rootCopies);
  return std::min(bytes, static_cast<size_t>(static_cast<double>(bytes) * share) & ~size_t{63});
}

// AllGather: read every peer's block straight into the output. Broadcast: non-roots read
// the root's buffer. One kernel copy per byte, no staging.
Task directCopy(ridgeComm* c, CollArgs a, bool inlineHeader) {
  RIDGE_CO_TRY(co_await directBegin(c, a, inlineHeader));
  const int P = c->nranks, r = c->rank;
  const size_t bytes = a.count * dataTypeSize(a.dtype);
  // The local copy runs while peers read this rank's memory: above RIDGE_STREAM_MIN its
  // stores skip the read-for-ownership (a third of its memory traffic), as the allreduce's do.
  const bool stream = bytes >= c->streamMin;
  if (a.type == CollType::AllGather) {
    char* own = mbytes(a.recv) + size_t(r) * bytes;
    if (own != a.send) copyOut(stream, own, a.send, bytes);
    for (int k = 1; k < P; ++k) {
      int j = (r + k) % P;
      RIDGE_CO_TRY(peerRead(c, j, mbytes(a.recv) + size_t(j) * bytes, c->peerDesc[j].send, bytes, stream));
    }
    co_return co_await directEnd(c, a.type);
  }
  // Broadcast: the root writes the head of every peer's output while each peer reads the
  // rest (broadcastPushedBytes): both cores copy at once, not the peer's alone.
  const auto& rootDesc = c->peerDesc[a.root];
  const size_t pushed =
      broadcastPushedBytes(c, a.root, bytes, r == a.root ? a.send != a.recv : rootDesc.send != rootDesc.recv);
  if (r != a.root) {
    RIDGE_CO_TRY(
        peerRead(c, a.root, mbytes(a.recv) + pushed, rootDesc.send + pushed, bytes - pushed, stream));
    co_return co_await directEnd(c, a.type);
  }
  if (pushed > 0)
    for (int k = 1; k < P; ++k) {
      const int j = (r + k) % P;
      RIDGE_CO_TRY(peerWrite(c, j, c->peerDesc[j].recv, a.send, pushed, stream));
      c->broadcastPushedBytes += pushed;
    }
  // The root's own copy runs after its "done" is posted: no peer waits for it.
  const OwnCopy own{a.recv, a.send, bytes, stream};
  co_return co_await directEnd(c, a.type, a.recv != a.send ? &own : nullptr);
}

// AlltoAll: rank r's output block j is block r of rank j's input. Where neither rank of a
// pair is in place, each reads its peer's block straight into its output (one kernel copy
// per byte, no staging), and nobody writes what a peer reads. Where either is in place, the
// block a rank reads is the one its peer overwrites, so the pair swaps instead, each chunk
// entirely by one of the two (even chunks the lower rank, odd the higher: the split is the
// same on both sides and the chunks are disjoint): read the peer's chunk into the bounce
// buffer, write the own chunk into the peer's output, copy the bounce into the own output.
Task directAlltoAll(ridgeComm* c, CollArgs a, bool inlineHeader) {
  RIDGE_CO_TRY(co_await directBegin(c, a, inlineHeader));
  const int P = c->nranks, r = c->rank;
  const size_t bytes = a.count * dataTypeSize(a.dtype);
  const char* in = cbytes(a.send);
  char* out = mbytes(a.recv);
  if (in != out) copyOut(bytes >= c->streamMin, out + size_t(r) * bytes, in + size_t(r) * bytes, bytes);
  char* bounce = c->bounce.get() + size_t(r) * c->bounceChunk;
  for (int k = 1; k < P; ++k) {
    const int j = (r + k) % P;
    const auto& d = c->peerDesc[j];
    const uint64_t peerBlock = d.send + size_t(r) * bytes;  // block r of j's input
    char* mine = out + size_t(j) * bytes;                   // lands in block j of the output
    if (in != out && d.send != d.recv) {
      RIDGE_CO_TRY(peerRead(c, j, mine, peerBlock, bytes, bytes >= c->streamMin));
      continue;
    }
    const size_t parity = r < j ? 0 : 1;
    size_t index = 0;
    for (size_t off = 0; off < bytes; off += c->bounceChunk, ++index) {
      if (index % 2 != parity) continue;
      const size_t n = std::min(c->bounceChunk, bytes - off);
      RIDGE_CO_TRY(c->peerMemory[j]->read(bounce, peerBlock + off, n));
      RIDGE_CO_TRY(
          c->peerMemory[j]->write(d.recv + size_t(r) * bytes + off, in + size_t(j) * bytes + off, n));
      std::memcpy(mine + off, bounce, n);
    }
  }
  co_return co_await directEnd(c, a.type);
}

// ---- tree: pipelined up and down a binary tree (plan::hostTreeLinks) ---------------------
//
// Positions count along the plan's ring from the root, so every subtree is a run of ring
// neighbours (on a two-socket host at most a few edges cross the socket link). A rank
// talks to its parent and at most two children; chunks stream through, so after the first
// chunk has climbed depth = floor(log2 P) hops every rank works on its own chunk at once.

struct TreeRanks {
  int parent = -1;
  int children[2] = {-1, -1};
  int childCount = 0;
};

TreeRanks treeRanks(const ridgeComm* c, int root) {
  const int P = c->nranks;
  const int rootPos = c->ringPos[static_cast<size_t>(root)];
  const int pos = mod(c->ringPos[static_cast<size_t>(c->rank)] - rootPos, P);
  auto rankAt = [&](int q) { return c->ringOrder[static_cast<size_t>((rootPos + q) % P)]; };
  const plan::HostTreeLinks links = plan::hostTreeLinks(P, pos);
  TreeRanks t;
  t.parent = links.parent < 0 ? -1 : rankAt(links.parent);
  t.childCount = links.childCount;
  for (int i = 0; i < links.childCount; ++i) t.children[i] = rankAt(links.children[i]);
  return t;
}

// Reduce up the tree to the root: per chunk a rank reduces its input with its children's
// partial sums (input first, then the children in order: the same fold on every run) into
// its parent's slot, or at the root into the output.
Task treeReduce(ridgeComm* c, CollArgs a) {
  const TreeRanks t = treeRanks(c, a.root);
  SendConnector* tx = t.parent >= 0 ? c->sendTo[t.parent] : nullptr;
  const size_t es = dataTypeSize(a.dtype);
  const size_t chunkElems = (tx ? tx->slotBytes() : c->recvFrom[t.children[0]]->slotBytes()) / es;
  const int divisor = a.op == ridgeAvg ? c->nranks : 0;
  const void* srcs[3];
  for (size_t off = 0; off < a.count; off += chunkElems) {
    const size_t n = std::min(chunkElems, a.count - off);
    srcs[0] = cbytes(a.send) + off * es;
    for (int i = 0; i < t.childCount; ++i) {
      RIDGE_CO_TAKE_HEADER(c, t.children[i]);
      PeekSlot pk(c->recvFrom[t.children[i]]);
      srcs[i + 1] = co_await pk;
      if (pk.info.bytes != n * es) co_return mismatch(c, CollType::Reduce, t.children[i], n * es, pk.info);
    }
    if (tx) {
      void* slot = co_await AcquireSlot(tx);
      reduceMany(slot, srcs, t.childCount + 1, n, a.dtype, a.op, 0);
      tx->post(static_cast<uint32_t>(n * es), false);
    } else {
      reduceMany(mbytes(a.recv) + off * es, srcs, t.childCount + 1, n, a.dtype, a.op, divisor);
    }
    for (int i = 0; i < t.childCount; ++i) c->recvFrom[t.children[i]]->release();
  }
  co_return Status::ok();
}

// Broadcast down a tree from the root (`t` from treeRanks; the chain is the tree whose ranks
// have one child each): per chunk a rank takes it from its parent, sends it to each child
// and copies it into its output. With the direct extension the root sends from its buffer
// and the others receive straight into theirs and forward from there.
Task treeBroadcast(ridgeComm* c, CollArgs a, TreeRanks t) {
  RecvConnector* rx = t.parent >= 0 ? c->recvFrom[t.parent] : nullptr;
  SendConnector* tx[2] = {nullptr, nullptr};
  bool direct[2] = {false, false};
  bool anyDirect = false;
  for (int i = 0; i < t.childCount; ++i) {
    tx[i] = c->sendTo[t.children[i]];
    direct[i] = offersDirect(tx[i]);
    anyDirect = anyDirect || direct[i];
  }
  const size_t bytes = a.count * dataTypeSize(a.dtype);
  const size_t chunk = rx ? rx->slotBytes() : tx[0]->slotBytes();
  DirectWithdrawal withdrawal0{direct[0] ? tx[0] : nullptr, offersDirect(rx) ? rx : nullptr};
  DirectWithdrawal withdrawal1{direct[1] ? tx[1] : nullptr, nullptr};
  size_t planOff = 0;
  ExpectAhead expect(c, rx, [&](char** dst, size_t* n) {
    if (planOff >= bytes) return false;
    *dst = mbytes(a.recv) + planOff;
    *n = std::min(chunk, bytes - planOff);
    planOff += *n;
    return true;
  });
  for (size_t off = 0; off < bytes; off += chunk) {
    const size_t n = std::min(chunk, bytes - off);
    const char* src = cbytes(a.send) + off;
    char* dst = mbytes(a.recv) + off;
    if (rx) {
      RIDGE_CO_TAKE_HEADER(c, rx->peer());
      PeekSlot pk(rx);
      src = static_cast<const char*>(co_await pk);
      if (pk.info.bytes != n) co_return mismatch(c, CollType::Broadcast, t.parent, n, pk.info);
      if (anyDirect && src != dst) {  // forward from the output: the slot is released at once
        RIDGE_CO_TRY(dataCopy(c, dst, src, n));
        src = dst;
      }
    }
    // On the device the forwarding copies and the copy into the output run back to back
    // behind one settle, then the forwarded slots are posted and the received one released.
    PostAfterSettle later[2];
    for (int i = 0; i < t.childCount; ++i)
      RIDGE_CO_TRY(co_await sendChunk(c, tx[i], direct[i], src, n, off + n == bytes, &later[i]));
    if (dst != src) RIDGE_CO_TRY(dataCopy(c, dst, src, n));
    RIDGE_CO_TRY(co_await dataSettled(c));
    later[0].post();
    later[1].post();
    if (rx) expect.release(rx);
  }
  for (int i = 0; i < t.childCount; ++i)
    if (direct[i]) co_await SendsComplete(tx[i]);
  withdrawal0.armed = withdrawal1.armed = false;
  co_return Status::ok();
}

// Broadcast down a chain that starts at the root (position = (rank - root) mod P); every
// rank but the last forwards each chunk as soon as it has it.
Task chainBroadcast(ridgeComm* c, CollArgs a) {
  const int P = c->nranks;
  const int p = c->ringPos[static_cast<size_t>(c->rank)];
  const int pos = mod(p - c->ringPos[static_cast<size_t>(a.root)], P);
  TreeRanks chain;
  chain.parent = pos > 0 ? c->ringOrder[static_cast<size_t>((p + P - 1) % P)] : -1;
  if (pos < P - 1) chain.children[chain.childCount++] = c->ringOrder[static_cast<size_t>((p + 1) % P)];
  co_return co_await treeBroadcast(c, a, chain);
}

// AllReduce: reduce up the tree to the ring's first rank, then broadcast the result back
// down. 2 floor(log2 P) hops of latency instead of the ring's 2(P-1) steps, for N bytes
// through every inner rank instead of the ring's 2(P-1)/P N.
Task treeAllReduce(ridgeComm* c, CollArgs a) {
  CollArgs up = a;
  up.type = CollType::Reduce;
  up.root = c->ringOrder.front();
  RIDGE_CO_TRY(co_await treeReduce(c, up));
  CollArgs down = a;
  down.type = CollType::Broadcast;
  down.root = up.root;
  down.send = a.recv;  // the root's result; other ranks only receive
  co_return co_await treeBroadcast(c, down, treeRanks(c, down.root));
}

// On the device network (coll/data_ops.h) only the ring and chain algorithms (and alltoall's
// all-pairs exchange, its only one) move payload through the data ops.
Algo chooseAlgo(ridgeComm* c, const CollArgs& a) {
  return c->nranks == 1    ? Algo::AllPairs
         : c->device->data ? Algo::Ring
                           : c->algos.choose(a.type, a.count * dataTypeSize(a.dtype));
}

// A receive that may be single-copy: the sender decides (by size, and whether it could), so
// the first slot says which; a staged message is then received the usual way.
Task recvSingleCopyOrStaged(ridgeComm* c, int peer, char* dst, size_t bytes) {
  bool received = false;
  RIDGE_CO_TRY(co_await recvSingleCopy(c, peer, dst, bytes, &received));
  if (received) co_return Status::ok();
  co_return co_await recvMessage(c, peer, dst, bytes);
}

// Whether the all-pairs reduction (allreduce, reduce-scatter, reduce) carries the collective's
// header in its one slot per peer, or a direct algorithm in its descriptor's slot (every
// peer's, as every peer's is read).
bool inlineHeaderFits(const ridgeComm* c, const CollArgs& a, Algo algo) {
  if (algo == Algo::Direct)
    return a.count > 0 && c->nranks > 1 &&
           kInlineHeaderBytes + sizeof(ridgeComm::DirectDescriptor) <=
               c->sendTo[(c->rank + 1) % c->nranks]->slotBytes();
  return algo == Algo::AllPairs &&
         (a.type == CollType::AllReduce || a.type == CollType::ReduceScatter || a.type == CollType::Reduce) &&
         a.count > 0 &&
         a.count * dataTypeSize(a.dtype) + kInlineHeaderBytes <=
             c->sendTo[(c->rank + 1) % c->nranks]->slotBytes();
}

Task finished(Status s) {
  co_return s;
}

// The operation itself, without its signature (inlineHeader: see allPairsReduce): not a
// coroutine, it returns the algorithm's task (not started yet), so that a call costs no
// coroutine frame more than before signatures.
Task dispatchAlgorithm(ridgeComm* c, const CollArgs& a, Algo algo, bool inlineHeader) {
  const size_t es = dataTypeSize(a.dtype);
  const size_t bytes = a.count * es;
  // Large host messages within a host: one copy between the user buffers (coll/p2p_copy.h).
  if (a.type == CollType::Send) {
    if (p2pSendsSingleCopy(c, a.root, bytes))
      return sendSingleCopy(c, a.root, cbytes(a.send), bytes, nullptr);
    return sendMessage(c, a.root, cbytes(a.send), bytes);
  }
  if (a.type == CollType::Recv) {
    if (p2pMayReceiveSingleCopy(c, a.root, bytes))
      return recvSingleCopyOrStaged(c, a.root, mbytes(a.recv), bytes);
    return recvMessage(c, a.root, mbytes(a.recv), bytes);
  }
  if (a.count == 0) return finished(Status::ok());
  RIDGE_TRACE("rank %d: %s of %zu bytes with %s", c->rank, collTypeName(a.type), bytes, algoName(algo));
  ++c->algoRuns[static_cast<int>(algo)];
  c->lastAlgo = static_cast<int>(algo);
  // Note: no `co_await (cond ? f() : g())` here: GCC 12 destroys the temporary task of
  // a conditional expression twice (found by AddressSanitizer, test CollGroup).
  const bool ring = algo == Algo::Ring || algo == Algo::Tree;
  if (algo == Algo::Tree) {
    switch (a.type) {
      case CollType::AllReduce: return treeAllReduce(c, a);
      case CollType::Reduce: return treeReduce(c, a);
      case CollType::Broadcast: return treeBroadcast(c, a, treeRanks(c, a.root));
      default: break;  // the others have no tree form here: the ring
    }
  }
  if (algo == Algo::Direct) {
    switch (a.type) {
      case CollType::AllReduce:
      case CollType::ReduceScatter:
      case CollType::Reduce: return directReduce(c, a, inlineHeader);
      case CollType::AllGather:
      case CollType::Broadcast: return directCopy(c, a, inlineHeader);
      case CollType::AlltoAll: return directAlltoAll(c, a, inlineHeader);
      default: break;
    }
  }
  switch (a.type) {
    case CollType::AllReduce:
      if (ring) return ringReduce(c, a, true);
      return allPairsReduce(c, a, false, inlineHeader);
    case CollType::ReduceScatter:
      if (ring) return ringReduce(c, a, false);
      return allPairsReduce(c, a, true, inlineHeader);
    case CollType::AllGather:
      if (ring) return ringAllGather(c, a);
      return allPairsExchange(c, a, true);
    case CollType::AlltoAll: return allPairsExchange(c, a, false);
    case CollType::Broadcast:
      if (ring) return chainBroadcast(c, a);
      return allPairsBroadcast(c, a);
    case CollType::Reduce:
      if (ring) return chainReduce(c, a);
      return allPairsReduceToRoot(c, a, inlineHeader);
    default: break;
  }
  return finished(makeError(ridgeInternalError, "unknown collective type %d", static_cast<int>(a.type)));
}

// Where non-in-place buffers overlap, a rank would read what it already overwrote (or a peer
// what this rank overwrote): the result depends on the algorithm. One comparison per call.
Status checkOverlap(const ridgeComm* c, const CollArgs& a) {
  if (a.send == a.recv || a.count == 0) return Status::ok();
  const BufferUse u = bufferUse(a, c->rank, c->nranks);
  if (!u.readsSend || !u.writesRecv) return Status::ok();
  const size_t es = dataTypeSize(a.dtype);
  const uintptr_t s0 = reinterpret_cast<uintptr_t>(a.send), r0 = reinterpret_cast<uintptr_t>(a.recv);
  const uintptr_t s1 = s0 + u.sendCount * es, r1 = r0 + u.recvCount * es;
  if (s0 >= r1 || r0 >= s1) return Status::ok();
  // The in-place forms the API documents (AllGather: sendbuff == recvbuff + rank*count;
  // ReduceScatter: recvbuff == sendbuff + rank*count) are not overlaps.
  if (a.type == CollType::AllGather && s0 == r0 + size_t(c->rank) * a.count * es) return Status::ok();
  if (a.type == CollType::ReduceScatter && r0 == s0 + size_t(c->rank) * a.count * es) return Status::ok();
  return makeError(ridgeInvalidUsage,
                   "rank %d: %s: sendbuff [%p, +%zu) and recvbuff [%p, +%zu) overlap without being the "
                   "in-place form; use the same buffer (in place) or separate ones",
                   c->rank, collTypeName(a.type), a.send, u.sendCount * es, a.recv, u.recvCount * es);
}

}  // namespace

// Peer j's [remote, remote + bytes) into `dst`: where the peer's buffer is mapped here (its
// shareable ridgeMemAlloc memory, transports/transport.h PeerMemory::mapped) a copy by this
// core, with streaming stores when `stream` as the algorithms' own copies; else the
// transport's copy (CMA), which does not stream.
Status peerRead(ridgeComm* c, int j, void* dst, uint64_t remote, size_t bytes, bool stream) {
  PeerMemory* pm = c->peerMemory[j];
  if (stream)
    if (const void* src = pm->mapped(remote, bytes)) {
      streamCopy(dst, src, bytes);
      return Status::ok();
    }
  return pm->read(dst, remote, bytes);  // copies through the mapping itself when there is one
}

// Every operation carries its signature (coll/signature.h): collectives exchange headers
// with every peer, a send sends one ahead of its message, a receive checks it.
Task runCollective(ridgeComm* c, CollArgs a) {
  const bool exchange = isExchange(a.type);
  const Algo algo = exchange ? Algo::AllPairs : chooseAlgo(c, a);
  if (!exchange) RIDGE_CO_TRY(checkOverlap(c, a));
  if (!signaturesOn(c)) co_return co_await dispatchAlgorithm(c, a, algo, false);
  const bool inlineHeader = !exchange && inlineHeaderFits(c, a, algo);
  if (a.type == CollType::Send) {
    // A single-copy send carries its signature in its descriptor's slot (coll/p2p_copy.h):
    // one slot and one hand-off per message, as without signatures.
    const size_t bytes = a.count * dataTypeSize(a.dtype);
    if (p2pSendsSingleCopy(c, a.root, bytes)) {
      const SendSignature sign{a.count, a.dtype};
      co_return co_await sendSingleCopy(c, a.root, cbytes(a.send), bytes, &sign);
    }
    RIDGE_CO_TRY(co_await beginSend(c, a.root, a.count, a.dtype));
    RIDGE_CO_TRY(co_await sendMessage(c, a.root, cbytes(a.send), bytes));
    endOperation(c);
    co_return Status::ok();
  } else if (a.type == CollType::Recv) {
    beginRecv(c, a.root, a.count, a.dtype);
  } else if (inlineHeader) {
    beginInlineCollective(c, a);
  } else {
    RIDGE_CO_TRY(co_await beginCollective(c, a));
  }
  RIDGE_CO_TRY(co_await dispatchAlgorithm(c, a, algo, inlineHeader));
  if (!exchange && headersDue(c)) co_return co_await endCollective(c);
  endOperation(c);
  co_return Status::ok();
}

}  // namespace ridge
