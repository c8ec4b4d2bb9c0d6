// Operation signatures (issue 19): every rank agrees on each call, or every rank fails.
//
// Each host collective and point-to-point operation starts with a header (HeaderWire: a
// 64-bit digest, then the full signature) on the connectors it checks: a collective posts its signature
// (kind, root, count, datatype, op, sequence number, and how many messages this rank has sent to and received
// from that peer) to every peer, a send posts its signature (sequence number of the pair, count, datatype) to
// its receiver. The receiving side reads a peer's header before any data from that peer (the algorithms call
// takeHeader before their first peek on a connector), at the end of the operation for peers it took no data
// from, and while it idles (the executor polls due headers), so a rank blocked on a full FIFO still sees the
// mismatch. A header is compared by its digest (one load and compare per peer); the full signatures are read
// and compared only when the digests differ, to say what differs and name both calls. Every pair compares
// both ways, so a mismatch fails the operation on every rank involved with ridgeInvalidUsage and a message
// naming both calls; the executor then marks the communicator broken (async error). A send nobody received
// shows up in the next collective's header (sent and received counts differ), on both ranks.
//
// The ledger also keeps per-rank operation counters for timeouts ("rank 2 did not arrive at
// allreduce #17") and for the state dump of RIDGE_DEBUG_DUMP / ridgeCommDumpState.
//
// The device paths sign with what they exchange per operation anyway (no header slot there):
// the P2P engine's operation descriptors, the LL launches' signature line (packedCall), and the
// device network's per-batch vote, which carries the batch's collectives as packedCall values.
// Staged device batches run the host algorithms over the host connectors and are signed like
// host calls. Communicators of one rank are not signed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coll/algorithms.h"

struct ridgeComm;

namespace ridge {

// The full description of one call. Fixed layout: it crosses the wire between builds of the
// same version.
struct OpSignature {
  uint64_t magic = 0;  // kSignatureMagic
  uint64_t seq = 0;    // collectives: the communicator's collective count; p2p: the pair's
  uint64_t count = 0;  // elements (per block where the API says so)
  int32_t rank = -1;   // the rank that posted it
  int32_t root = -1;   // Broadcast/Reduce: root; Send/Recv: peer; else -1
  int32_t op = -1;     // reductions only, else -1
  uint8_t kind = 0;    // CollType
  uint8_t dtype = 0;
  uint8_t reserved[2] = {};
  uint64_t p2pSent = 0;   // collectives: messages this rank started sending to the receiver
  uint64_t p2pRecvd = 0;  // and receiving from it
};
static_assert(sizeof(OpSignature) == 56, "OpSignature is a wire format");
constexpr uint64_t kSignatureMagic = 0x5249444745534947ull;  // "RIDGESIG"

// One header as it travels (alone in a slot, or at the start of a slot with data): a 64-bit
// digest of everything the receiver compares (kind, root, count, datatype, op, sequence
// number, the pair's send/receive counts, the sender's rank; for a send its bytes and
// receiver), then the full signature. A receiver compares the digest with the one it expects
// (one load, one compare) and reads the signature only when they differ, to name both calls.
// Both live in one cache line, so the cold part costs no transfer of its own.
struct HeaderWire {
  uint64_t digest = 0;
  OpSignature sig;
};
static_assert(sizeof(HeaderWire) == 64, "HeaderWire is one cache line");

// Per communicator. Only the thread running the communicator's operations writes it; the
// atomics are also read by the dump (another thread) and are relaxed (plain stores on x86).
struct OpLedger {
  bool sized = false;
  uint64_t collSeq = 0;
  std::vector<uint64_t> sendSeq, recvSeq;  // per peer
  // Per peer: 0, or what its next slot is: kDueCollective (the running collective's header,
  // expected to match `current`) or kDueRecv (a send's header, to match expect[peer]).
  std::vector<uint8_t> due;
  std::vector<uint64_t> expectDigest;  // per peer: the digest its due header must carry
  std::vector<uint64_t> pairOut;       // per peer: the digest's part for the pair's counts, sending
  std::vector<uint64_t> pairIn;        // and receiving (the peer's view of the same counts)
  std::vector<uint64_t> inbox;         // per peer: an inline header's digest copied out, to check
  // Per peer: the connectors to and from it carry tags (transports/transport.h), read once.
  std::vector<uint8_t> tagsTo, tagsFrom;
  std::vector<OpSignature> expect;  // per peer: a receive's signature (kDueRecv)
  OpSignature current;              // this rank's latest operation
  uint64_t currentDigest = 0;       // digest of `current` without the pair's part
  bool inlineHeaders = false;       // the running collective's headers ride in its data slots
  // For dumps and timeout messages.
  std::atomic<uint64_t> started{0}, finished{0};
  std::atomic<uint64_t> curSeq{0}, curCount{0};
  std::atomic<int32_t> curKind{-1}, curRoot{-1}, curOp{-1}, curDtype{-1};
  std::atomic<bool> running{false};
  std::unique_ptr<std::atomic<uint64_t>[]> peerSeen;  // latest collective seq seen from each peer
};
constexpr uint8_t kDueCollective = 1, kDueRecv = 2;
// A header's digest from its parts: never 0, which marks an untagged post (SlotInfo::tag).
inline uint64_t headerDigest(uint64_t callPart, uint64_t pairPart) {
  const uint64_t d = callPart ^ pairPart;
  return d ? d : 1;
}

// Whether operations of `c` in its present mode carry signatures.
bool signaturesOn(const ridgeComm* c);

// Collective: posts this rank's signature to every peer and marks every peer's header due.
Task beginCollective(ridgeComm* c, const CollArgs& a);
// The same without posting (not a coroutine): the algorithm (the all-pairs reduction of a
// message that fits one slot beside its header) writes the header at the start of its one
// slot per peer (writeInlineHeader) and checks the peer's there (checkInlineHeader, no
// release), so small allreduces move as many slots as without signatures.
void beginInlineCollective(ridgeComm* c, const CollArgs& a);
// Whether a peer's header is still to be read (endCollective then waits for it).
bool headersDue(const ridgeComm* c);
constexpr size_t kInlineHeaderBytes = sizeof(HeaderWire);  // header room at the start of such a slot
// On a connector with the tag extension (transports/transport.h: shared-memory slots) the
// header goes to the slot's last line instead (coldHeader) and its digest into the post's tag
// (postTagged): the receiver compares the tag it reads with the slot's size, so a matching
// call costs it no cache line more than the data; the slot's last line, never read then,
// stays in the sender's cache. The data then starts at the slot's start.
inline uint64_t writeInlineHeader(OpLedger& L, int peer, void* at);
inline void* coldHeader(void* slot, size_t slotBytes) {
  return static_cast<char*>(slot) + slotBytes - sizeof(HeaderWire);
}
Status checkInlineHeader(ridgeComm* c, int peer, const void* slot, const SlotInfo& info);
// The same in two steps, so that the header's cache line is fetched beside the payload's
// instead of before it: copy its digest out of the slot (ledger inbox) before the reduction,
// compare it after (and before the slot is released: a digest that differs is then checked in
// full from the slot, which names the peer's call). A mismatch then fails the call with the
// output already written, as any failed call may leave it.
inline void copyInlineHeader(OpLedger& L, int peer, const void* slot);
inline bool copiedHeaderMatches(const OpLedger& L, int peer);
// A due collective header whose digest matched: no longer due, and seen (for dumps).
inline void headerMatched(OpLedger& L, int peer);
// Waits for the headers still due (peers this rank took no data from) and checks them.
Task endCollective(ridgeComm* c);
// Send: posts the pair's header to the receiver. Recv: marks the sender's header due.
// Called by sendMessage / recvMessage for messages of the API (host21: call these around a
// single-copy send/recv so both paths keep the same pair sequence).
Task beginSend(ridgeComm* c, int peer, size_t count, ridgeDataType_t dtype);
// The send's header without posting it: counted and published as beginSend does, for a
// caller that carries it at the start of a slot of its own (the single-copy send's descriptor
// slot, coll/p2p_copy.cpp); the receiver checks it there with checkInlineHeader.
HeaderWire sendHeader(ridgeComm* c, int peer, size_t count, ridgeDataType_t dtype);
void beginRecv(ridgeComm* c, int peer, size_t count, ridgeDataType_t dtype);
void endOperation(ridgeComm* c);

// Reads and checks peer's header if it is due (the algorithms call it before peeking).
Task takeHeader(ridgeComm* c, int peer);
// Non-blocking: checks every due header that has arrived (executor, while idle).
Status pollHeaders(ridgeComm* c);

// What a timed-out rank says: its operation, sequence number, the ranks whose header has not
// arrived, and `waitingOn` (the peers blocked strands wait for).
std::string describeStall(ridgeComm* c, const std::vector<int>& waitingOn);
// One paragraph per communicator state; dumpAllComms writes every live communicator's to fd.
std::string describeState(const ridgeComm* c);
void dumpAllComms(int fd);
void registerComm(ridgeComm* c);
void unregisterComm(ridgeComm* c);
// RIDGE_DEBUG_DUMP: installs the signal handler and the thread that prints (once).
void installDumpSignal();

// Writes the sender's header for `peer` at `at` (`current` with the pair's counts, and its
// digest); returns the digest (the tag of a tagged post).
inline uint64_t writeInlineHeader(OpLedger& L, int peer, void* at) {
  const size_t j = static_cast<size_t>(peer);
  const uint64_t digest = headerDigest(L.currentDigest, L.pairOut[j]);
  char* out = static_cast<char*>(at);
  __builtin_memcpy(out + offsetof(HeaderWire, digest), &digest, sizeof digest);
  __builtin_memcpy(out + offsetof(HeaderWire, sig), &L.current, offsetof(OpSignature, p2pSent));
  __builtin_memcpy(out + offsetof(HeaderWire, sig) + offsetof(OpSignature, p2pSent), &L.sendSeq[j], 8);
  __builtin_memcpy(out + offsetof(HeaderWire, sig) + offsetof(OpSignature, p2pRecvd), &L.recvSeq[j], 8);
  return digest;
}

inline void copyInlineHeader(OpLedger& L, int peer, const void* slot) {
  __builtin_memcpy(&L.inbox[static_cast<size_t>(peer)], slot, sizeof(uint64_t));
}
inline bool copiedHeaderMatches(const OpLedger& L, int peer) {
  return L.inbox[static_cast<size_t>(peer)] == L.expectDigest[static_cast<size_t>(peer)];
}

inline void headerMatched(OpLedger& L, int peer) {
  const size_t j = static_cast<size_t>(peer);
  L.due[j] = 0;
  L.peerSeen[j].store(L.current.seq, std::memory_order_relaxed);
}

// "allreduce #3(1024 x float32, sum)" etc. (no "#n" for sequence number 0).
std::string describeCall(const OpSignature& s);

// The device paths that exchange per-operation descriptors of their own (the P2P engine's
// descriptor, coll/device/p2p.h) sign with them: a signature without sequence number (those
// paths run in lockstep by their own exchanges; describeCall then prints none), the fields a
// call's other ranks must agree on (the root and op only where the kind has them).
OpSignature deviceCallSignature(int rank, CollType kind, uint64_t count, ridgeDataType_t dtype, int op,
                                int root);
bool sameDeviceCall(const OpSignature& a, const OpSignature& b);
// The LL path's signature: such a call (count <= 2^32 - 1, root and op below 256) packed into the
// 8-byte payload of one LL line: kind, datatype, op, root, count; equal for calls that match.
uint64_t packedCall(const OpSignature& s);
// The call of packedCall's value, as posted by `rank` (no sequence number).
OpSignature unpackCall(uint64_t packed, int rank);
// ridgeInvalidUsage naming both calls (`path`: "P2P"), as the host signatures do.
Status deviceCallMismatch(int rank, const char* path, const OpSignature& mine, int peer,
                          const OpSignature& theirs);

}  // namespace ridge
