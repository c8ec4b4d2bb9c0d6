#include "coll/signature.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include "coll/comm.h"
#include "coll/device/device_collectives.h"
#include "core/log.h"
#include "core/settings.h"
#include "reduce/reduce.h"

namespace ridge {
namespace {

bool hasRoot(CollType t) {
  return t == CollType::Broadcast || t == CollType::Reduce || t == CollType::Send || t == CollType::Recv;
}
bool hasOp(CollType t) {
  return t == CollType::AllReduce || t == CollType::Reduce || t == CollType::ReduceScatter;
}

std::string opName(int32_t op) {
  if (op >= 0 && op < ridgeNumOps) return redOpName(static_cast<ridgeRedOp_t>(op));
  return format("user op %d", op);
}

OpSignature makeSignature(const ridgeComm* c, CollType kind, size_t count, ridgeDataType_t dtype,
                          ridgeRedOp_t op, int root, uint64_t seq) {
  OpSignature s;
  s.magic = kSignatureMagic;
  s.seq = seq;
  s.count = count;
  s.rank = c->rank;
  s.root = hasRoot(kind) ? root : -1;
  s.op = hasOp(kind) ? static_cast<int32_t>(op) : -1;
  s.kind = static_cast<uint8_t>(kind);
  s.dtype = static_cast<uint8_t>(dtype);
  return s;
}

// A 64-bit mix (the finalizer of splitmix64): every input bit moves every output bit.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// The digest of a call without the pair's part: what a collective's two sides must agree on
// (kind, root, op, datatype, count, sequence number). A send and its receive agree on the
// pair's sequence number, the bytes and the receiver: both digest them as a send's.
uint64_t callDigest(const OpSignature& s) {
  const CollType t = static_cast<CollType>(s.kind);
  if (t == CollType::Send || t == CollType::Recv) {
    const uint64_t bytes = s.count * dataTypeSize(static_cast<ridgeDataType_t>(s.dtype));
    return mix64(mix64(mix64(0x53454e44ull ^ s.seq) ^ bytes) ^ static_cast<uint32_t>(s.root));
  }
  const uint64_t shape =
      uint64_t{s.kind} | uint64_t{s.dtype} << 8 | uint64_t{static_cast<uint32_t>(s.op)} << 16;
  return mix64(mix64(mix64(shape ^ uint64_t{static_cast<uint32_t>(s.root)} << 48) ^ s.count) ^ s.seq);
}

// The digest's part for a pair: the sender's rank and, for collectives, the messages between
// the two before it (what one side sent, the other received).
uint64_t pairDigest(int sender, uint64_t sent, uint64_t received) {
  return mix64(mix64(static_cast<uint64_t>(sender) + 0x9e3779b97f4a7c15ull) ^ sent) ^ mix64(received + 1);
}

// The receiver's own `sig` (a Recv) as the digest of the header it expects from `peer`.
uint64_t recvDigest(const OpSignature& mine, int self, int peer) {
  OpSignature as = mine;
  as.root = self;  // the send names its receiver
  return headerDigest(callDigest(as), pairDigest(peer, 0, 0));
}

void updatePair(ridgeComm* c, int peer) {
  OpLedger& L = c->ledger;
  const size_t j = static_cast<size_t>(peer);
  L.pairOut[j] = pairDigest(c->rank, L.sendSeq[j], L.recvSeq[j]);
  L.pairIn[j] = pairDigest(peer, L.recvSeq[j], L.sendSeq[j]);
}

void ensureSized(ridgeComm* c) {
  OpLedger& L = c->ledger;
  if (L.sized) return;
  const size_t P = static_cast<size_t>(c->nranks);
  L.sendSeq.assign(P, 0);
  L.recvSeq.assign(P, 0);
  L.due.assign(P, 0);
  L.expect.assign(P, OpSignature{});
  L.expectDigest.assign(P, 0);
  L.pairOut.assign(P, 0);
  L.pairIn.assign(P, 0);
  L.inbox.assign(P, 0);
  L.tagsTo.assign(P, 0);
  L.tagsFrom.assign(P, 0);
  for (int j = 0; j < c->nranks; ++j) {
    if (j == c->rank) continue;
    L.tagsTo[static_cast<size_t>(j)] = c->sendTo[j]->carriesTags();
    L.tagsFrom[static_cast<size_t>(j)] = c->recvFrom[j]->carriesTags();
  }
  L.peerSeen.reset(new std::atomic<uint64_t>[P]);
  for (size_t j = 0; j < P; ++j) L.peerSeen[j].store(0, std::memory_order_relaxed);
  for (int j = 0; j < c->nranks; ++j) updatePair(c, j);
  L.sized = true;
}

void publish(ridgeComm* c, const OpSignature& s) {
  OpLedger& L = c->ledger;
  L.current = s;
  L.curSeq.store(s.seq, std::memory_order_relaxed);
  L.curCount.store(s.count, std::memory_order_relaxed);
  L.curKind.store(s.kind, std::memory_order_relaxed);
  L.curRoot.store(s.root, std::memory_order_relaxed);
  L.curOp.store(s.op, std::memory_order_relaxed);
  L.curDtype.store(s.dtype, std::memory_order_relaxed);
  // One writer (the thread running the communicator's operations): no atomic read-modify-write.
  L.started.store(L.started.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  L.running.store(true, std::memory_order_relaxed);
}

// The next chunk from `peer` is its header: on a connector with the direct extension it
// must land in a slot, never in a destination an algorithm declares (ExpectAhead skips it).
void declareHeaderSlot(RecvConnector* rx) {
  if (rx->directVersion() >= kDirectTransferVersion && rx->declaredAhead() == 0)
    (void)rx->tryExpect(nullptr, static_cast<uint32_t>(rx->slotBytes()));
}

// Before an operation queues caller memory on a connector with the direct extension (whole
// chunks, so messages of at least a slot), its header must have left: a rank that fails the
// operation withdraws its queued chunks, which fails the connection, and a header still queued
// behind nothing would then never reach the peer, which would wait for RIDGE_TIMEOUT instead
// of seeing the mismatch. Costs a wake-up of the transport's thread on large messages only.
// Below a slot the ring and all-pairs algorithms still queue caller memory at once: there the
// TCP transport's withdrawal first lets the slots ahead of the caller's chunks leave
// (transports/socket/socket_transport.cpp, withdrawDirect).
struct HeaderSent : SendsComplete {
  HeaderSent(SendConnector* tx, size_t bytes) : SendsComplete(tx) {
    skip = tx->directVersion() < kDirectTransferVersion || bytes < tx->slotBytes();
  }
  bool skip;
  bool await_ready() { return skip || SendsComplete::await_ready(); }
};

bool sameCall(const OpSignature& a, const OpSignature& b) {
  return a.kind == b.kind && a.seq == b.seq && a.count == b.count && a.dtype == b.dtype && a.op == b.op &&
         a.root == b.root;
}

Status mismatchError(const ridgeComm* c, int peer, const OpSignature& mine, const OpSignature& theirs,
                     const std::string& detail) {
  return makeError(ridgeInvalidUsage,
                   "rank %d: mismatched calls: rank %d called %s where rank %d called %s%s; the "
                   "communicator is now broken (ridgeCommGetAsyncError), create a new one",
                   c->rank, c->rank, describeCall(mine).c_str(), peer, describeCall(theirs).c_str(),
                   detail.c_str());
}

// This rank's call that `peer`'s header must match (`due`: what the header is due for).
const OpSignature& expectedCall(const ridgeComm* c, int peer, uint8_t due) {
  return due == kDueRecv ? c->ledger.expect[static_cast<size_t>(peer)] : c->ledger.current;
}

// Compares `peer`'s header `h` in full with what this rank expects from it (`due`), after
// their digests differed: says what differs.
Status compareHeader(ridgeComm* c, int peer, const OpSignature& h, uint8_t due) {
  OpLedger& L = c->ledger;
  const OpSignature& mine = expectedCall(c, peer, due);
  if (h.magic != kSignatureMagic || h.rank != peer)
    return makeError(ridgeInvalidUsage,
                     "rank %d: mismatched calls: rank %d called %s, but the next %zu bytes from rank %d "
                     "are data, not a call header (a send without its receive, or a different call); "
                     "the communicator is now broken",
                     c->rank, c->rank, describeCall(mine).c_str(), sizeof(HeaderWire), peer);
  const CollType myKind = static_cast<CollType>(mine.kind);
  const CollType theirKind = static_cast<CollType>(h.kind);
  if (myKind == CollType::Recv) {
    const bool same = theirKind == CollType::Send && h.seq == mine.seq && h.root == c->rank &&
                      h.count * dataTypeSize(static_cast<ridgeDataType_t>(h.dtype)) ==
                          mine.count * dataTypeSize(static_cast<ridgeDataType_t>(mine.dtype));
    if (!same)
      return mismatchError(c, peer, mine, h,
                           theirKind == CollType::Send && h.seq == mine.seq
                               ? "; the size of the message does not match the size of the receive"
                               : "");
    return makeError(ridgeInternalError,
                     "rank %d: rank %d's header for %s carries a digest that does not match its call "
                     "(damaged in transit?)",
                     c->rank, peer, describeCall(h).c_str());
  }
  if (theirKind != CollType::Send && theirKind != CollType::Recv)
    L.peerSeen[static_cast<size_t>(peer)].store(h.seq, std::memory_order_relaxed);
  if (!sameCall(mine, h)) return mismatchError(c, peer, mine, h, "");
  // Messages between the pair before this collective: what one side sent, the other received.
  if (h.p2pSent != L.recvSeq[static_cast<size_t>(peer)] || h.p2pRecvd != L.sendSeq[static_cast<size_t>(peer)])
    return mismatchError(
        c, peer, mine, h,
        format(" after sends and receives that do not pair up: rank %d had started %llu send(s) to "
               "rank %d and %llu receive(s) from it, rank %d %llu receive(s) from rank %d and %llu "
               "send(s) to it",
               c->rank, static_cast<unsigned long long>(L.sendSeq[static_cast<size_t>(peer)]), peer,
               static_cast<unsigned long long>(L.recvSeq[static_cast<size_t>(peer)]), peer,
               static_cast<unsigned long long>(h.p2pRecvd), c->rank,
               static_cast<unsigned long long>(h.p2pSent)));
  // Everything compared is equal, yet the digests differed: the header was damaged.
  return makeError(ridgeInternalError,
                   "rank %d: rank %d's header for %s carries a digest that does not match its call "
                   "(damaged in transit?)",
                   c->rank, peer, describeCall(h).c_str());
}

Status notAHeader(const ridgeComm* c, int peer, const SlotInfo& info, uint8_t due) {
  return makeError(ridgeInvalidUsage,
                   "rank %d: mismatched calls: rank %d called %s, but the next chunk from rank %d is "
                   "%u bytes of data, not its call's header: rank %d sent data this rank never asked "
                   "for (a send without its receive, or a different call); the communicator is now "
                   "broken",
                   c->rank, c->rank, describeCall(expectedCall(c, peer, due)).c_str(), peer, info.bytes,
                   peer);
}

// Checks the header slot `slot` of `peer` and releases it.
// A slot that starts with a header but carries data (the peer's call put its header inline)
// is compared all the same, so that the error names the peer's call.
// Copies the header of the slot `slot` out: at its start, or in its last line when the post
// was tagged (the tag is then the digest). False when an untagged slot is too short for one.
bool readHeader(const RecvConnector* rx, const void* slot, const SlotInfo& info, HeaderWire* h) {
  if (info.tag) {
    std::memcpy(h, coldHeader(const_cast<void*>(slot), rx->slotBytes()), sizeof *h);
    h->digest = info.tag;
    return true;
  }
  if (info.bytes < sizeof(HeaderWire)) return false;
  std::memcpy(h, slot, sizeof *h);
  return true;
}

Status checkHeader(ridgeComm* c, int peer, const void* slot, const SlotInfo& info) {
  RecvConnector* rx = c->recvFrom[peer];
  OpLedger& L = c->ledger;
  const size_t j = static_cast<size_t>(peer);
  const uint8_t due = L.due[j];
  HeaderWire h;
  if (!readHeader(rx, slot, info, &h)) {
    rx->release();
    return notAHeader(c, peer, info, due);
  }
  rx->release();
  L.due[j] = 0;
  if (h.digest != L.expectDigest[j]) RIDGE_TRY(compareHeader(c, peer, h.sig, due));
  if (due == kDueCollective) L.peerSeen[j].store(L.current.seq, std::memory_order_relaxed);
  if (info.tag || info.bytes != sizeof(HeaderWire))
    return makeError(ridgeInternalError,
                     "rank %d: rank %d sent %s's header with data where this rank expects "
                     "it alone",
                     c->rank, peer, describeCall(h.sig).c_str());
  return Status::ok();
}

}  // namespace

Status checkInlineHeader(ridgeComm* c, int peer, const void* slot, const SlotInfo& info) {
  OpLedger& L = c->ledger;
  const size_t j = static_cast<size_t>(peer);
  const uint8_t due = L.due[j];
  HeaderWire h;
  if (!readHeader(c->recvFrom[peer], slot, info, &h)) return notAHeader(c, peer, info, due);
  L.due[j] = 0;
  if (h.digest != L.expectDigest[j]) RIDGE_TRY(compareHeader(c, peer, h.sig, due));
  L.peerSeen[j].store(L.current.seq, std::memory_order_relaxed);
  // The same call on both ranks makes the same choice; a lone header here means they did not.
  if (!info.tag && info.bytes == sizeof(HeaderWire))
    return makeError(ridgeInternalError,
                     "rank %d: rank %d sent %s's header alone where this rank carries it "
                     "with the data",
                     c->rank, peer, describeCall(h.sig).c_str());
  return Status::ok();
}

std::string describeCall(const OpSignature& s) {
  const CollType t = static_cast<CollType>(s.kind);
  const char* type = dataTypeName(static_cast<ridgeDataType_t>(s.dtype));
  const unsigned long long n = static_cast<unsigned long long>(s.count);
  const unsigned long long seq = static_cast<unsigned long long>(s.seq);
  if (s.kind > static_cast<uint8_t>(CollType::Recv)) return format("an unknown call (kind %u)", s.kind);
  std::string args;
  // Sequence number 0: a device path's call, which counts none (deviceCallSignature).
  const std::string number = seq ? format(" #%llu", seq) : std::string();
  if (t == CollType::Send) return format("send%s(%llu x %s to rank %d)", number.c_str(), n, type, s.root);
  if (t == CollType::Recv) return format("recv%s(%llu x %s from rank %d)", number.c_str(), n, type, s.root);
  if (hasRoot(t)) args = format("root %d, ", s.root);
  args += format("%llu x %s", n, type);
  if (hasOp(t)) args += ", " + opName(s.op);
  return format("%s%s(%s)", collTypeName(t), number.c_str(), args.c_str());
}

OpSignature deviceCallSignature(int rank, CollType kind, uint64_t count, ridgeDataType_t dtype, int op,
                                int root) {
  OpSignature s;
  s.magic = kSignatureMagic;
  s.count = count;
  s.rank = rank;
  s.root = hasRoot(kind) ? root : -1;
  s.op = hasOp(kind) ? op : -1;
  s.kind = static_cast<uint8_t>(kind);
  s.dtype = static_cast<uint8_t>(dtype);
  return s;
}

uint64_t packedCall(const OpSignature& s) {
  return uint64_t{s.kind} | uint64_t{s.dtype} << 8 | uint64_t{static_cast<uint8_t>(s.op)} << 16 |
         uint64_t{static_cast<uint8_t>(s.root)} << 24 | (s.count & 0xffffffffull) << 32;
}

OpSignature unpackCall(uint64_t packed, int rank) {
  OpSignature s;
  s.magic = kSignatureMagic;
  s.rank = rank;
  s.kind = static_cast<uint8_t>(packed);
  s.dtype = static_cast<uint8_t>(packed >> 8);
  s.op = static_cast<int8_t>(packed >> 16);
  s.root = static_cast<int8_t>(packed >> 24);
  s.count = packed >> 32;
  return s;
}

bool sameDeviceCall(const OpSignature& a, const OpSignature& b) {
  return sameCall(a, b);
}

Status deviceCallMismatch(int rank, const char* path, const OpSignature& mine, int peer,
                          const OpSignature& theirs) {
  return makeError(ridgeInvalidUsage,
                   "rank %d: mismatched calls (%s path): rank %d called %s where rank %d called %s; the "
                   "communicator is now broken (ridgeCommGetAsyncError), create a new one",
                   rank, path, rank, describeCall(mine).c_str(), peer, describeCall(theirs).c_str());
}

// On the device network the connectors' slots are device memory (and every rank voted the
// batch onto it): no headers there. Staged device batches use the host connectors: signed.
bool signaturesOn(const ridgeComm* c) {
  return c->nranks > 1 && !(c->device->net && c->waitTransport == c->device->net.get());
}

namespace {
// Counts the collective, publishes it and marks every peer's header due.
OpSignature startCollective(ridgeComm* c, const CollArgs& a, bool inlineHeaders) {
  ensureSized(c);
  OpLedger& L = c->ledger;
  const OpSignature s = makeSignature(c, a.type, a.count, a.dtype, a.op, a.root, ++L.collSeq);
  publish(c, s);
  L.currentDigest = callDigest(s);
  L.inlineHeaders = inlineHeaders;
  for (int j = 0; j < c->nranks; ++j) {
    if (j == c->rank) continue;
    L.due[static_cast<size_t>(j)] = kDueCollective;
    L.expectDigest[static_cast<size_t>(j)] = headerDigest(L.currentDigest, L.pairIn[static_cast<size_t>(j)]);
  }
  return s;
}
}  // namespace

void beginInlineCollective(ridgeComm* c, const CollArgs& a) {
  (void)startCollective(c, a, true);
}

bool headersDue(const ridgeComm* c) {
  for (uint8_t d : c->ledger.due)
    if (d) return true;
  return false;
}

Task beginCollective(ridgeComm* c, const CollArgs& a) {
  (void)startCollective(c, a, false);
  OpLedger& L = c->ledger;
  const int P = c->nranks, r = c->rank;
  // Every peer's header is due before any is posted: while this rank waits for room to post,
  // the executor's idle poll already checks the headers that have arrived.
  for (int k = 1; k < P; ++k) declareHeaderSlot(c->recvFrom[(r + k) % P]);
  for (int k = 1; k < P; ++k) {
    const int j = (r + k) % P;
    void* slot = co_await AcquireSlot(c->sendTo[j]);
    writeInlineHeader(L, j, slot);
    c->sendTo[j]->post(sizeof(HeaderWire), true);
  }
  const size_t bytes = a.count * dataTypeSize(a.dtype);
  for (int k = 1; k < P; ++k) co_await HeaderSent(c->sendTo[(r + k) % P], bytes);
  co_return Status::ok();
}

Task endCollective(ridgeComm* c) {
  const int P = c->nranks, r = c->rank;
  for (int k = 1; k < P; ++k) {
    const int j = (r + P - k) % P;
    if (c->ledger.due[static_cast<size_t>(j)]) RIDGE_CO_TRY(co_await takeHeader(c, j));
  }
  endOperation(c);
  co_return Status::ok();
}

namespace {
// The pair's next send or receive: its sequence number counted, published for dumps.
OpSignature startExchange(ridgeComm* c, CollType kind, int peer, size_t count, ridgeDataType_t dtype) {
  ensureSized(c);
  std::vector<uint64_t>& seqs = kind == CollType::Send ? c->ledger.sendSeq : c->ledger.recvSeq;
  const OpSignature s =
      makeSignature(c, kind, count, dtype, ridgeSum, peer, ++seqs[static_cast<size_t>(peer)]);
  publish(c, s);
  updatePair(c, peer);
  return s;
}
}  // namespace

HeaderWire sendHeader(ridgeComm* c, int peer, size_t count, ridgeDataType_t dtype) {
  const OpSignature s = startExchange(c, CollType::Send, peer, count, dtype);
  HeaderWire w;
  w.digest = headerDigest(callDigest(s), pairDigest(c->rank, 0, 0));
  w.sig = s;
  return w;
}

Task beginSend(ridgeComm* c, int peer, size_t count, ridgeDataType_t dtype) {
  const HeaderWire w = sendHeader(c, peer, count, dtype);
  void* slot = co_await AcquireSlot(c->sendTo[peer]);
  std::memcpy(slot, &w, sizeof w);
  c->sendTo[peer]->post(sizeof w, true);
  // No HeaderSent wait: a send receives nothing, so it never fails on a mismatch of its own
  // and never withdraws its chunks while its header waits behind them.
  co_return Status::ok();
}

void beginRecv(ridgeComm* c, int peer, size_t count, ridgeDataType_t dtype) {
  const OpSignature s = startExchange(c, CollType::Recv, peer, count, dtype);
  c->ledger.inlineHeaders = false;
  c->ledger.due[static_cast<size_t>(peer)] = kDueRecv;
  c->ledger.expect[static_cast<size_t>(peer)] = s;
  c->ledger.expectDigest[static_cast<size_t>(peer)] = recvDigest(s, c->rank, peer);
  declareHeaderSlot(c->recvFrom[peer]);
}

void endOperation(ridgeComm* c) {
  OpLedger& L = c->ledger;
  const uint64_t finished = L.finished.load(std::memory_order_relaxed) + 1;
  L.finished.store(finished, std::memory_order_relaxed);
  if (finished == L.started.load(std::memory_order_relaxed))
    L.running.store(false, std::memory_order_relaxed);
}

namespace {
// co_await AwaitHeader{c, peer}: peer's header has arrived, or is no longer due because the
// executor's idle poll checked and released it while this strand waited (then the peer may
// send nothing more in this operation: waiting for a slot would wait forever).
struct AwaitHeader : WaitCondition {
  ridgeComm* comm;
  const void* slot = nullptr;
  SlotInfo info;
  AwaitHeader(ridgeComm* c, int from) : comm(c) {
    peer = from;
    ready = [](WaitCondition* self) {
      auto* a = static_cast<AwaitHeader*>(self);
      if (!a->comm->ledger.due[static_cast<size_t>(a->peer)]) return true;
      a->slot = a->comm->recvFrom[a->peer]->tryPeek(&a->info);
      return a->slot != nullptr;
    };
  }
  bool await_ready() { return ready(this); }
  void await_suspend(std::coroutine_handle<Task::promise_type> h) { h.promise().strand->blocked = this; }
  void await_resume() const {}
};
}  // namespace

Task takeHeader(ridgeComm* c, int peer) {
  AwaitHeader header(c, peer);
  co_await header;
  if (!c->ledger.due[static_cast<size_t>(peer)]) co_return Status::ok();
  co_return checkHeader(c, peer, header.slot, header.info);
}

Status pollHeaders(ridgeComm* c) {
  if (!c->ledger.sized || !signaturesOn(c)) return Status::ok();
  for (int j = 0; j < c->nranks; ++j) {
    if (!c->ledger.due[static_cast<size_t>(j)]) continue;
    SlotInfo info;
    const void* slot = c->recvFrom[j]->tryPeek(&info);
    if (!slot) continue;
    // An inline header is checked where it is; the algorithm then takes the slot's data.
    RIDGE_TRY(c->ledger.inlineHeaders ? checkInlineHeader(c, j, slot, info) : checkHeader(c, j, slot, info));
  }
  return Status::ok();
}

std::string describeStall(ridgeComm* c, const std::vector<int>& waitingOn) {
  const OpLedger& L = c->ledger;
  std::string text = L.sized && L.started.load(std::memory_order_relaxed) > 0 ? describeCall(L.current)
                                                                              : std::string("an operation");
  std::string absent, seen;
  if (L.sized && signaturesOn(c)) {
    for (int j = 0; j < c->nranks; ++j) {
      if (!L.due[static_cast<size_t>(j)]) continue;
      absent += format("%s%d", absent.empty() ? "" : ", ", j);
      seen += format("%s#%llu", seen.empty() ? "" : ", ",
                     static_cast<unsigned long long>(L.peerSeen[static_cast<size_t>(j)].load()));
    }
  }
  std::string waits;
  for (int j : waitingOn) waits += format("%s%d", waits.empty() ? "" : ", ", j);
  std::string out = text;
  if (!absent.empty())
    out += ": rank(s) " + absent + " did not arrive at it (latest collective seen from them: " + seen + ")";
  if (!waits.empty()) out += (absent.empty() ? ": " : "; ") + std::string("waiting on rank(s) ") + waits;
  return out;
}

// ---- state dump ---------------------------------------------------------------------------

namespace {
std::mutex gRegistryMutex;
std::vector<ridgeComm*>& registry() {
  static std::vector<ridgeComm*> comms;
  return comms;
}
}  // namespace

std::string describeState(const ridgeComm* c) {
  const OpLedger& L = c->ledger;
  OpSignature s;
  s.seq = L.curSeq.load(std::memory_order_relaxed);
  s.count = L.curCount.load(std::memory_order_relaxed);
  s.kind = static_cast<uint8_t>(L.curKind.load(std::memory_order_relaxed));
  s.root = L.curRoot.load(std::memory_order_relaxed);
  s.op = L.curOp.load(std::memory_order_relaxed);
  s.dtype = static_cast<uint8_t>(L.curDtype.load(std::memory_order_relaxed));
  const uint64_t started = L.started.load(std::memory_order_relaxed);
  const uint64_t finished = L.finished.load(std::memory_order_relaxed);
  std::string out =
      format("ridge comm %p rank %d of %d: %llu operation(s) started, %llu finished, async error %d",
             static_cast<const void*>(c), c->rank, c->nranks, static_cast<unsigned long long>(started),
             static_cast<unsigned long long>(finished), c->asyncError.load(std::memory_order_relaxed));
  if (started > 0)
    out +=
        format("; %s %s", L.running.load(std::memory_order_relaxed) ? "in" : "last", describeCall(s).c_str());
  out += "\n";
  if (L.peerSeen) {
    out += "  latest collective seen from each peer:";
    for (int j = 0; j < c->nranks; ++j) {
      if (j == c->rank)
        out += format(" %d:#%llu(self)", j, static_cast<unsigned long long>(L.collSeq));
      else
        out += format(" %d:#%llu", j,
                      static_cast<unsigned long long>(L.peerSeen[static_cast<size_t>(j)].load()));
    }
    out += "\n";
  }
  return out;
}

void dumpAllComms(int fd) {
  std::lock_guard<std::mutex> lock(gRegistryMutex);
  std::string out = format("ridge state dump (pid %d): %zu communicator(s)\n", static_cast<int>(getpid()),
                           registry().size());
  for (const ridgeComm* c : registry()) out += describeState(c);
  size_t off = 0;
  while (off < out.size()) {
    const ssize_t n = ::write(fd, out.data() + off, out.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
}

void registerComm(ridgeComm* c) {
  installDumpSignal();
  std::lock_guard<std::mutex> lock(gRegistryMutex);
  registry().push_back(c);
}

void unregisterComm(ridgeComm* c) {
  std::lock_guard<std::mutex> lock(gRegistryMutex);
  auto& v = registry();
  v.erase(std::remove(v.begin(), v.end(), c), v.end());
}

// ---- RIDGE_DEBUG_DUMP: a signal that prints every communicator's state ---------------------
//
// The handler only writes one byte to a pipe (async-signal-safe); a thread of ours reads it
// and prints, taking the registry lock like any other caller.
namespace {
int gDumpPipe[2] = {-1, -1};

void onDumpSignal(int) {
  const int saved = errno;
  const char byte = 1;
  (void)!::write(gDumpPipe[1], &byte, 1);
  errno = saved;
}

void dumpThreadMain(int readFd) {
  char buf[64];
  for (;;) {
    const ssize_t n = ::read(readFd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    dumpAllComms(2);
  }
}
}  // namespace

void installDumpSignal() {
  static std::mutex m;
  static pid_t installedIn = 0;
  std::lock_guard<std::mutex> lock(m);
  // A forked child has the handler but not the thread: install again there.
  if (installedIn == getpid() || !settingIsSet(Setting::DEBUG_DUMP)) return;
  installedIn = getpid();
  const std::string value = settingString(Setting::DEBUG_DUMP);
  int sig = 0;
  if (value == "SIGUSR1" || value == "USR1")
    sig = SIGUSR1;
  else if (value == "SIGUSR2" || value == "USR2")
    sig = SIGUSR2;
  if (sig == 0) {
    RIDGE_WARN("RIDGE_DEBUG_DUMP=%s is not a signal Ridge dumps on (accepted: SIGUSR1, SIGUSR2); ignored",
               value.c_str());
    return;
  }
  if (gDumpPipe[0] >= 0) {
    ::close(gDumpPipe[0]);
    ::close(gDumpPipe[1]);
  }
  if (::pipe2(gDumpPipe, O_CLOEXEC) != 0) {
    RIDGE_WARN("RIDGE_DEBUG_DUMP: pipe2 failed: %s; no dump on %s", std::strerror(errno), value.c_str());
    gDumpPipe[0] = gDumpPipe[1] = -1;
    return;
  }
  ::fcntl(gDumpPipe[1], F_SETFL, O_NONBLOCK);  // a flood of signals must never block the handler
  std::thread(dumpThreadMain, gDumpPipe[0]).detach();
  struct sigaction sa {};
  sa.sa_handler = onDumpSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(sig, &sa, nullptr);
  RIDGE_INFO("RIDGE_DEBUG_DUMP: %s prints every communicator's state to stderr", value.c_str());
}

}  // namespace ridge
