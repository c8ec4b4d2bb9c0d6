// Device-side verbs subset of the GDR-write transport: what a GPU thread needs to push a
// send through a NIC with no CPU on the path. The producer
//   1. takes a staging slot, but only while it holds a credit for it (the NIC's retired
//      counter says the slot's previous send completed, the receiver's consumed counter says
//      the landing slot at the far end is free),
//   2. writes the payload into the slot (posted writes into NIC-side memory),
//   3. writes the slot's header and trailer (sequence number, size, flags),
//   4. builds an RDMA WRITE WITH IMMEDIATE WQE (staging slot -> remote slot) per
//      verbs_layout.h, publishes the producer index in the doorbell record and rings the
//      doorbell page,
// and polls completions and credit words. The receiver side checks the landed header and
// trailer against the sequence number it expects, which is how "staged data dropped or
// overwritten" is detected end to end.
//
// The same source is compiled twice: as CUDA device code (kernels/gdr/gdr_kernels.cu) and as
// host code that a CPU thread runs against the software NIC where there is no GPU. Only the
// primitives of the "memory-ordering layer" below differ between the two; every decision
// (credits, slot layout, WQE fields, counters) is in code both share. C++17 (nvcc under
// CMake 3.25), no exceptions, no std:: containers.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "transports/verbs/verbs_layout.h"

// ---- Memory-ordering layer ------------------------------------------------------------
// A GPU's stores to NIC-side memory travel as posted PCIe writes; __threadfence_system()
// orders them before later stores as seen by every agent on the system (the NIC included).
// On the host the same places take release/acquire fences, which is what the software NIC's
// engine thread needs. Loads of words the NIC writes (credits, CQE owner bytes) go through
// volatile so the compiler re-reads them on every poll. The fences are verbs_layout.h's
// (verbsReleaseFence / verbsAcquireFence), shared with the host posters of both providers.

namespace ridge {
namespace gdr {

RIDGE_HOST_DEVICE inline uint32_t loadVolatile32(const uint32_t* p) {
  return *reinterpret_cast<const volatile uint32_t*>(p);
}
RIDGE_HOST_DEVICE inline uint64_t loadVolatile64(const uint64_t* p) {
  return *reinterpret_cast<const volatile uint64_t*>(p);
}
RIDGE_HOST_DEVICE inline void storeVolatile32(uint32_t* p, uint32_t v) {
  *reinterpret_cast<volatile uint32_t*>(p) = v;
}
RIDGE_HOST_DEVICE inline void storeVolatile64(uint64_t* p, uint64_t v) {
  *reinterpret_cast<volatile uint64_t*>(p) = v;
}

// ---- Slot layout ----------------------------------------------------------------------
// A slot is [header 64 B][payload, padded to 8 B][trailer 8 B]; the whole of it travels in
// one RDMA write so that the receiver sees what the NIC really read out of staging. The
// header's and trailer's sequence numbers bracket the payload: a slot rewritten while the NIC
// was reading it lands with a header or trailer that does not match the immediate.
constexpr uint32_t kSlotMagic = 0x52444731u;  // "RDG1"
constexpr uint32_t kSlotLast = 1u;            // last chunk of a message

struct SlotHeader {
  uint64_t seq;  // 1-based send sequence number of the slot's contents (0: never written)
  uint32_t bytes;
  uint32_t flags;  // kSlotLast
  uint32_t magic;
  uint32_t reserved[11];
};
static_assert(sizeof(SlotHeader) == 64, "the slot header is one line");

struct SlotTrailer {
  uint64_t seq;
};

constexpr uint32_t kSlotHeaderBytes = sizeof(SlotHeader);

RIDGE_HOST_DEVICE inline uint32_t paddedPayload(uint32_t bytes) {
  return (bytes + 7u) & ~7u;
}
// Bytes one slot of `payloadCapacity` occupies (header, payload, trailer, rounded to a line).
RIDGE_HOST_DEVICE inline uint32_t slotStride(uint32_t payloadCapacity) {
  return (kSlotHeaderBytes + paddedPayload(payloadCapacity) + sizeof(SlotTrailer) + 63u) & ~63u;
}
// Bytes the NIC moves for a slot carrying `bytes` of payload.
RIDGE_HOST_DEVICE inline uint32_t wireBytes(uint32_t bytes) {
  return kSlotHeaderBytes + paddedPayload(bytes) + sizeof(SlotTrailer);
}

// ---- Counters -------------------------------------------------------------------------
// Plain words (pinned host memory on a GPU, so the CPU can read them at any time). Each has
// one writer: the producer's counters are written by the sender, the receiver's by the
// receiver.
struct Counters {
  uint64_t slotsWritten;      // payloads written into staging and posted
  uint64_t creditsConsumed;   // staging credits taken (one per slot written)
  uint64_t creditsReturned;   // staging credits the NIC gave back (retired sends seen)
  uint64_t creditStalls;      // times the producer found no staging credit (one per episode)
  uint64_t remoteStalls;      // times it found the receiver's ring full (one per episode)
  uint64_t doorbells;         // doorbell page writes
  uint64_t stagedLost;        // staged data dropped or overwritten: must stay 0
  uint64_t slotsLanded;       // receiver: slots verified and handed out
  uint64_t creditWrites;      // receiver: consumed counts written back to the sender
  uint64_t completionErrors;  // CQEs with a status other than success
};

// ---- Device handles -------------------------------------------------------------------
// The receiver's count of released slots as it lands in the sender's memory. The NIC copies
// it like any payload, so the count travels with a check word: a torn or half-landed record
// fails the check and is ignored until the next one lands (the count only grows).
constexpr uint64_t kCreditCheck = 0x5a17c0de5a17c0deull;
struct CreditRecord {
  uint64_t count;
  uint64_t check;  // count ^ kCreditCheck
};

// Everything a producer needs, as plain data (pointers in the producer's address space).
struct SendChannel {
  verbs::SendRingView sq;   // WQE ring, doorbell record, doorbell page, retired counter
  char* staging;            // producer mapping of slot 0
  uint64_t stagingWqeAddr;  // the address of slot 0 in WQEs (offset for zero-based DM)
  uint32_t stagingLkey;
  uint32_t slotCount;        // staging slots (credits), <= 1 << sq.log2Size
  uint32_t slotStrideBytes;  // slotStride(payloadCapacity)
  uint32_t payloadCapacity;
  uint64_t remoteAddr;  // slot 0 of the receiver's landing ring
  uint32_t remoteRkey;
  uint32_t remoteSlotCount;
  const CreditRecord* remoteConsumed;  // written by the receiver (RDMA): slots released
};

// Producer state; one producer per channel.
struct SendState {
  uint64_t seq;             // slots posted so far
  uint64_t remoteConsumed;  // last valid CreditRecord::count seen
  uint32_t pi;              // send-queue producer index
  uint32_t rungPi;          // producer index last published through the doorbell
  uint32_t retiredSeen;     // NIC retired counter at the last look
  uint32_t stalledLocal;    // in a staging-credit stall episode
  uint32_t stalledRemote;   // in a receiver-ring stall episode
};

// Staging credits the producer holds now. The NIC retires the WQE of a slot when its send
// completed (the target acknowledged every byte), so `retired` is the credit word: slot k is
// free again once the WQE posted from it has retired. One WQE per slot on this queue pair
// keeps the two counters in step.
RIDGE_HOST_DEVICE inline uint32_t stagingCredits(const SendChannel& ch, SendState* st, Counters* ctr) {
  const uint32_t retired = loadVolatile32(ch.sq.retired);
  ctr->creditsReturned += retired - st->retiredSeen;
  st->retiredSeen = retired;
  const uint32_t inUse = st->pi - retired;
  return inUse >= ch.slotCount ? 0u : ch.slotCount - inUse;
}

// Landing slots free at the receiver.
RIDGE_HOST_DEVICE inline uint64_t remoteCredits(const SendChannel& ch, SendState* st) {
  const uint64_t count = loadVolatile64(&ch.remoteConsumed->count);
  const uint64_t check = loadVolatile64(&ch.remoteConsumed->check);
  // Valid, newer and never ahead of what was sent: anything else is a record still landing.
  if ((count ^ kCreditCheck) == check && count > st->remoteConsumed && count <= st->seq)
    st->remoteConsumed = count;
  const uint64_t inUse = st->seq - st->remoteConsumed;
  return inUse >= ch.remoteSlotCount ? 0u : ch.remoteSlotCount - inUse;
}

RIDGE_HOST_DEVICE inline char* stagingSlot(const SendChannel& ch, uint64_t seq) {
  return ch.staging + static_cast<size_t>(seq % ch.slotCount) * ch.slotStrideBytes;
}

// The payload area of the next slot when both credits are held, else nullptr (and counts
// the start of a stall). Repeated calls before postSlot return the same slot.
RIDGE_HOST_DEVICE inline char* tryAcquireSlot(const SendChannel& ch, SendState* st, Counters* ctr) {
  if (stagingCredits(ch, st, ctr) == 0) {
    if (!st->stalledLocal) ctr->creditStalls += 1;
    st->stalledLocal = 1;
    return nullptr;
  }
  if (remoteCredits(ch, st) == 0) {
    if (!st->stalledRemote) ctr->remoteStalls += 1;
    st->stalledRemote = 1;
    return nullptr;
  }
  st->stalledLocal = 0;
  st->stalledRemote = 0;
  verbs::verbsAcquireFence();  // the NIC's reads of the slot are done before we overwrite it
  return stagingSlot(ch, st->seq) + kSlotHeaderBytes;
}

// Cooperative copy of `bytes` into a staging slot by `lanes` threads (lane = 0..lanes-1).
// 16-byte stores when both ends allow them: each is one posted write of a full TLP payload
// fragment on the way to the NIC.
RIDGE_HOST_DEVICE inline void writeStaging(char* dst, const char* src, size_t bytes, unsigned lane,
                                           unsigned lanes) {
  struct alignas(16) Vec16 {
    uint64_t lo, hi;
  };
  size_t done = 0;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15u) == 0) {
    const size_t vecs = bytes / 16;
    const Vec16* s = reinterpret_cast<const Vec16*>(src);
    Vec16* d = reinterpret_cast<Vec16*>(dst);
    for (size_t i = lane; i < vecs; i += lanes) d[i] = s[i];
    done = vecs * 16;
  }
  for (size_t i = done + lane; i < bytes; i += lanes) dst[i] = src[i];
}

// Fills one WQE; the caller owns send-queue slot `pi`.
RIDGE_HOST_DEVICE inline verbs::Wqe makeWriteWqe(uint8_t opcode, uint64_t localAddr, uint32_t lkey,
                                                 uint32_t bytes, uint64_t remoteAddr, uint32_t rkey,
                                                 uint32_t imm, uint64_t wrId, bool signaled) {
  verbs::Wqe w;
  w.opcode = opcode;
  w.flags = signaled ? static_cast<uint8_t>(verbs::kWqeSignaled) : static_cast<uint8_t>(0);
  w.index = 0;
  w.qpn = 0;
  w.immData = imm;
  w.length = bytes;
  w.remoteAddr = remoteAddr;
  w.rkey = rkey;
  w.reserved0 = 0;
  w.localAddr = localAddr;
  w.lkey = lkey;
  w.reserved1 = 0;
  w.wrId = wrId;
  w.reserved2 = 0;
  return w;
}

// Writes `w` into the send ring at `pi` (index and QP number filled in). The index field is
// what the NIC uses to tell a fresh slot from last pass's, so it is stored after the rest.
RIDGE_HOST_DEVICE inline void writeWqe(const verbs::SendRingView& sq, uint32_t pi, const verbs::Wqe& w) {
  verbs::Wqe* slot = sq.wqes + (pi & ((1u << sq.log2Size) - 1u));
  verbs::Wqe tmp = w;
  tmp.qpn = sq.qpn;
  tmp.index = static_cast<uint16_t>(pi - (1u << sq.log2Size));  // still "last pass"
  *slot = tmp;
  verbs::verbsReleaseFence();
  *reinterpret_cast<volatile uint16_t*>(&slot->index) = static_cast<uint16_t>(pi);
}

// Publishes every WQE below `newPi` and rings the doorbell page. The record is what the NIC
// trusts, so it must be visible before the ring; the ring names the QP and index the way a
// UAR write does.
RIDGE_HOST_DEVICE inline void ringDoorbell(const verbs::SendRingView& sq, uint32_t newPi, Counters* ctr) {
  verbs::sqRing(sq, newPi);  // fences: WQEs and payload, then the record, then the ring
  ctr->doorbells += 1;
}

// Seals the acquired slot with `bytes` of payload (already written): header and trailer, then
// the WQE that sends it (returned, not yet in the ring). Advances the sequence number.
RIDGE_HOST_DEVICE inline verbs::Wqe sealSlot(const SendChannel& ch, SendState* st, uint32_t bytes, bool last,
                                             Counters* ctr) {
  const uint64_t seq = st->seq + 1;
  char* slot = stagingSlot(ch, st->seq);
  SlotHeader* h = reinterpret_cast<SlotHeader*>(slot);
  SlotTrailer* t = reinterpret_cast<SlotTrailer*>(slot + kSlotHeaderBytes + paddedPayload(bytes));
  // The slot must still hold what was posted from it one lap ago: anything else means some
  // writer did not respect the credits, and is counted as staged data overwritten.
  const uint64_t previous = loadVolatile64(&h->seq);
  if (previous != 0 && previous + ch.slotCount != seq) ctr->stagedLost += 1;
  h->bytes = bytes;
  h->flags = last ? kSlotLast : 0u;
  h->magic = kSlotMagic;
  storeVolatile64(&h->seq, seq);
  storeVolatile64(&t->seq, seq);
  const uint64_t local =
      ch.stagingWqeAddr + static_cast<uint64_t>(st->seq % ch.slotCount) * ch.slotStrideBytes;
  const uint64_t remote =
      ch.remoteAddr + static_cast<uint64_t>(st->seq % ch.remoteSlotCount) * ch.slotStrideBytes;
  st->seq = seq;
  ctr->slotsWritten += 1;
  ctr->creditsConsumed += 1;
  // Unsignaled: credits come back through the retired counter; the NIC still writes a CQE
  // for a WQE that fails, which the producer's error poll sees.
  return makeWriteWqe(verbs::kWqeRdmaWriteImm, local, ch.stagingLkey, wireBytes(bytes), remote, ch.remoteRkey,
                      static_cast<uint32_t>(seq), seq, false);
}

// Seals the slot and writes its WQE into the send ring; does not ring, so several slots can
// share one doorbell. Returns the producer index to ring with.
RIDGE_HOST_DEVICE inline uint32_t postSlot(const SendChannel& ch, SendState* st, uint32_t bytes, bool last,
                                           Counters* ctr) {
  const verbs::Wqe w = sealSlot(ch, st, bytes, last, ctr);
  writeWqe(ch.sq, st->pi, w);
  st->pi += 1;
  return st->pi;
}

// Rings for everything posted since the last ring (no-op when nothing is new).
RIDGE_HOST_DEVICE inline void flushDoorbell(const SendChannel& ch, SendState* st, Counters* ctr) {
  if (st->rungPi == st->pi) return;
  ringDoorbell(ch.sq, st->pi, ctr);
  st->rungPi = st->pi;
}

// Posts one plain RDMA WRITE (no immediate) of `bytes` at `localAddr` and rings at once:
// used to return credits (the consumed counter) to a sender.
RIDGE_HOST_DEVICE inline bool postPlainWrite(const verbs::SendRingView& sq, uint32_t* pi, uint64_t localAddr,
                                             uint32_t lkey, uint32_t bytes, uint64_t remoteAddr,
                                             uint32_t rkey, Counters* ctr) {
  const uint32_t size = 1u << sq.log2Size;
  if (*pi - loadVolatile32(sq.retired) >= size) return false;
  const verbs::Wqe w =
      makeWriteWqe(verbs::kWqeRdmaWrite, localAddr, lkey, bytes, remoteAddr, rkey, 0, *pi, false);
  writeWqe(sq, *pi, w);
  *pi += 1;
  ringDoorbell(sq, *pi, ctr);
  return true;
}

// ---- Completions ------------------------------------------------------------------------
// Copies the next CQE out if the NIC wrote one for consumer index *ci, advances *ci and
// publishes it so the NIC may reuse the entry.
RIDGE_HOST_DEVICE inline bool pollCq(const verbs::CqRingView& cq, uint32_t* ci, verbs::Cqe* out) {
  return verbs::cqPollOne(cq, ci, out);
}

// ---- Receiver ------------------------------------------------------------------------
// What a landing slot said, checked against the sequence number the receiver expects next.
enum LandedCheck : uint32_t {
  kLandedOk = 0,
  kLandedWrongImmediate = 1,  // a slot was skipped (dropped) or delivered twice
  kLandedTornHeader = 2,      // header sequence or magic wrong: overwritten in staging
  kLandedTornTrailer = 3,     // trailer disagrees with the header: overwritten mid-read
  kLandedBadSize = 4,
};

RIDGE_HOST_DEVICE inline uint32_t checkLanded(const char* slot, uint32_t payloadCapacity, uint64_t expectSeq,
                                              uint32_t imm, uint32_t byteLen) {
  const volatile SlotHeader* h = reinterpret_cast<const volatile SlotHeader*>(slot);
  if (imm != static_cast<uint32_t>(expectSeq)) return kLandedWrongImmediate;
  if (h->seq != expectSeq || h->magic != kSlotMagic) return kLandedTornHeader;
  const uint32_t bytes = h->bytes;
  if (bytes > payloadCapacity || wireBytes(bytes) != byteLen) return kLandedBadSize;
  const volatile SlotTrailer* t =
      reinterpret_cast<const volatile SlotTrailer*>(slot + kSlotHeaderBytes + paddedPayload(bytes));
  if (t->seq != expectSeq) return kLandedTornTrailer;
  return kLandedOk;
}

}  // namespace gdr
}  // namespace ridge
