// Plain-data layouts shared by every producer and consumer of work requests: host code,
// the software NIC's engine, and (next issue) GPU threads that build WQEs, publish a
// producer index in the doorbell record, ring the doorbell page and consume CQEs without
// any CPU help. Hence this header compiles as device code under nvcc: fixed sizes, no
// std:: types, no exceptions, and every helper carries RIDGE_HOST_DEVICE.
//
// Rings and indices (all indices are free-running 32-bit counters, wrapping at 2^32):
//
//   send queue      Wqe[1 << sqLog]       producer: the poster; consumer: the NIC
//   receive queue   RecvWqe[1 << rqLog]   producer: the poster; consumer: the NIC
//   completion q.   Cqe[1 << cqLog]       producer: the NIC;    consumer: the poller
//
// Posting a send: write the WQE into slot (pi & mask), release-fence, store pi + 1 into
// DoorbellRecord::sqProducer, then write DoorbellPage::ring. The record is what the NIC
// trusts; the page is only the "look now" signal (on hardware a write to a UAR page), so a
// producer that batches WQEs rings once for all of them.
//
// Completions carry an owner bit instead of a producer index, so a consumer reads one
// cache line per completion and never a shared counter: the NIC writes every field, then
// (after a release fence) the owner byte with the phase of the pass it is on, the phase
// being bit `cqLog` of its producer index. Entries start with owner 1, so during the
// first pass (phase 0) nothing is valid until written. The consumer expects the phase of
// its own consumer index, publishes that index in CqDoorbellRecord::consumer, and the NIC
// never writes more than one pass ahead of it.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "core/host_device.h"

namespace ridge {
namespace verbs {

// ---- Work queue entries --------------------------------------------------------------

enum WqeOpcode : uint8_t {
  kWqeNop = 0,
  kWqeRdmaWrite = 1,     // remote write, no completion at the target
  kWqeRdmaWriteImm = 2,  // remote write, then consumes a receive at the target
  kWqeSend = 3,          // payload lands in the target's next posted receive
  kWqeSendImm = 4,
  kWqeRdmaRead = 5,  // remote read: `length` bytes at remoteAddr/rkey land at localAddr/lkey
                     // (a region with local write); no completion at the target
};

enum WqeFlags : uint8_t {
  kWqeSignaled = 1,  // produce a CQE when done (else only the retire counter moves)
  kWqeFence = 2,     // wait for earlier reads (softnic executes every WQE in order anyway)
};

// One send work request: four 16-byte segments, one cache line.
struct Wqe {
  // control segment
  uint8_t opcode;    // WqeOpcode
  uint8_t flags;     // WqeFlags
  uint16_t index;    // low 16 bits of the producer index it was written at: lets the NIC
                     // tell a freshly written slot from one left over from the last pass
  uint32_t qpn;      // the queue pair it belongs to (checked by the NIC)
  uint32_t immData;  // immediate data for *_IMM opcodes
  uint32_t length;   // payload bytes
  // remote address segment
  uint64_t remoteAddr;
  uint32_t rkey;
  uint32_t reserved0;
  // data segment (one scatter/gather entry)
  uint64_t localAddr;  // virtual address, or the offset into device memory for a DM key
  uint32_t lkey;
  uint32_t reserved1;
  // bookkeeping segment
  uint64_t wrId;  // returned in the CQE
  uint64_t reserved2;
};
static_assert(sizeof(Wqe) == 64, "a WQE is one 64-byte line");
static_assert(offsetof(Wqe, immData) == 8, "control segment layout");
static_assert(offsetof(Wqe, remoteAddr) == 16, "remote address segment at 16");
static_assert(offsetof(Wqe, localAddr) == 32, "data segment at 32");
static_assert(offsetof(Wqe, wrId) == 48, "bookkeeping segment at 48");

// One receive work request (one scatter entry); WRITE_IMM needs one but may post length 0.
struct RecvWqe {
  uint64_t wrId;
  uint64_t addr;
  uint32_t lkey;
  uint32_t length;
  uint64_t reserved;
};
static_assert(sizeof(RecvWqe) == 32, "a receive WQE is 32 bytes");
static_assert(offsetof(RecvWqe, lkey) == 16, "receive WQE layout");

// ---- Completion queue entries --------------------------------------------------------

enum CqeOpcode : uint8_t {
  kCqeRdmaWrite = 1,    // requester: an RDMA WRITE (with or without immediate) finished
  kCqeSend = 2,         // requester: a SEND finished
  kCqeRecv = 3,         // responder: a SEND landed in a posted receive
  kCqeRecvRdmaImm = 4,  // responder: a WRITE_WITH_IMM landed; immData valid
  kCqeRdmaRead = 5,     // requester: an RDMA READ finished, its bytes are in local memory
};

enum CqeStatus : uint8_t {
  kCqeOk = 0,
  kCqeLocalLengthError = 1,        // payload longer than the receive buffer
  kCqeLocalProtectionError = 2,    // lkey unknown or range outside its region
  kCqeRemoteAccessError = 3,       // rkey unknown, range outside, or no remote write/read right
  kCqeRemoteInvalidRequest = 4,    // the target refused the opcode or the QP state
  kCqeTransportRetryExceeded = 5,  // the peer stopped answering or closed the connection
  kCqeFlushed = 6,                 // the QP went to the error state before this one ran
  kCqeBadOpcode = 7,
  kCqeGeneralError = 8,
};

enum CqeFlags : uint8_t {
  kCqeHasImm = 1,
};

struct Cqe {
  uint64_t wrId;
  uint32_t byteLen;
  uint32_t immData;
  uint32_t qpn;
  uint16_t wqeCounter;  // low 16 bits of the send-queue index of the WQE (requester)
  uint8_t opcode;       // CqeOpcode
  uint8_t status;       // CqeStatus
  uint8_t flags;        // CqeFlags
  uint8_t reserved[6];
  uint8_t owner;  // written last; see the top of this file
};
static_assert(sizeof(Cqe) == 32, "a CQE is 32 bytes");
static_assert(offsetof(Cqe, qpn) == 16, "CQE layout");
static_assert(offsetof(Cqe, owner) == 31, "the owner byte is the last byte of a CQE");

// ---- Doorbells -----------------------------------------------------------------------

// Producer indices of one QP, in memory the NIC reads (host memory, or GPU memory later).
struct alignas(8) DoorbellRecord {
  uint32_t sqProducer;
  uint32_t rqProducer;
};
static_assert(sizeof(DoorbellRecord) == 8, "doorbell record is 8 bytes");

// The doorbell "page": a word the producer writes to make the NIC look at the record now.
// A whole line of its own so that ringing never shares a line with the record or a WQE.
// The value written is (qpn << 32) | sqProducer, as a hardware UAR write names the QP.
struct alignas(64) DoorbellPage {
  uint64_t ring;
  uint64_t reserved[7];
};
static_assert(sizeof(DoorbellPage) == 64, "doorbell page is one line");

// The consumer index of a CQ, published by the poller so the NIC knows how far it may write.
struct alignas(8) CqDoorbellRecord {
  uint32_t consumer;
  uint32_t reserved;
};
static_assert(sizeof(CqDoorbellRecord) == 8, "CQ doorbell record is 8 bytes");

// What a producer needs to post sends without calling into the provider: the "device
// handle" of a QP. All pointers are in the producer's address space.
struct SendRingView {
  Wqe* wqes;
  DoorbellRecord* dbr;
  DoorbellPage* page;
  uint32_t log2Size;
  uint32_t qpn;
  // The NIC's count of retired WQEs (completed or flushed): slot (pi & mask) is free when
  // pi - *retired < size.
  const uint32_t* retired;
};

// What a consumer needs to poll a CQ without calling into the provider.
struct CqRingView {
  Cqe* cqes;
  CqDoorbellRecord* dbr;
  uint32_t log2Size;
  uint32_t reserved;
};

// ---- Helpers usable from host and device code -----------------------------------------

RIDGE_HOST_DEVICE inline void verbsReleaseFence() {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
#else
  __atomic_thread_fence(__ATOMIC_RELEASE);
#endif
}

RIDGE_HOST_DEVICE inline void verbsAcquireFence() {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
#else
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
#endif
}

// Owner byte the producer writes for its pass at index `pi`.
RIDGE_HOST_DEVICE inline uint8_t cqeOwnerForIndex(uint32_t pi, uint32_t log2Size) {
  return static_cast<uint8_t>((pi >> log2Size) & 1u);
}

// Whether the CQE at consumer index `ci` holds a completion the consumer has not seen.
RIDGE_HOST_DEVICE inline bool cqeReady(const Cqe* ring, uint32_t ci, uint32_t log2Size) {
  const volatile Cqe* c = ring + (ci & ((1u << log2Size) - 1u));
  return (c->owner & 1u) == cqeOwnerForIndex(ci, log2Size);
}

// Copies the next completion out if there is one and advances *ci; publishes the new
// consumer index so the NIC may reuse the entry.
RIDGE_HOST_DEVICE inline bool cqPollOne(const CqRingView& cq, uint32_t* ci, Cqe* out) {
  if (!cqeReady(cq.cqes, *ci, cq.log2Size)) return false;
  verbsAcquireFence();
  const volatile Cqe* c = cq.cqes + (*ci & ((1u << cq.log2Size) - 1u));
  out->wrId = c->wrId;
  out->byteLen = c->byteLen;
  out->immData = c->immData;
  out->qpn = c->qpn;
  out->wqeCounter = c->wqeCounter;
  out->opcode = c->opcode;
  out->status = c->status;
  out->flags = c->flags;
  out->owner = c->owner;
  *ci += 1;
  verbsReleaseFence();
  *reinterpret_cast<volatile uint32_t*>(&cq.dbr->consumer) = *ci;
  return true;
}

// Writes one WQE at producer index `pi` (the caller checked there is room), without
// ringing: several may be written before one sqRing.
RIDGE_HOST_DEVICE inline void sqWrite(const SendRingView& sq, uint32_t pi, const Wqe& wqe) {
  Wqe* slot = sq.wqes + (pi & ((1u << sq.log2Size) - 1u));
  *slot = wqe;
  slot->index = static_cast<uint16_t>(pi);
  slot->qpn = sq.qpn;
}

// Publishes every WQE below `newPi` and rings the doorbell page.
RIDGE_HOST_DEVICE inline void sqRing(const SendRingView& sq, uint32_t newPi) {
  verbsReleaseFence();
  *reinterpret_cast<volatile uint32_t*>(&sq.dbr->sqProducer) = newPi;
  verbsReleaseFence();
  *reinterpret_cast<volatile uint64_t*>(&sq.page->ring) = (static_cast<uint64_t>(sq.qpn) << 32) | newPi;
}

}  // namespace verbs
}  // namespace ridge
