// Device-side verbs subset of the GDR-write transport: what a GPU thread needs to push a
// send through a NIC with no CPU on the path. The producer
//   1. takes a staging slot, but only while it holds a credit for it (a CQE says the slot's
//      previous send completed, the receiver's consumed counter says the landing slot at the
//      far end is free),
//   2. writes the payload into the slot (posted writes into NIC-side memory),
//   3. writes the slot's header and trailer (sequence number, size, flags),
//   4. builds an mlx5 RDMA WRITE WITH IMMEDIATE WQE (staging slot -> remote slot; the wire
//      format of mlx5_wire.h, the bytes a ConnectX NIC reads), publishes the producer index in
//      the doorbell record and rings the UAR doorbell,
// and polls its CQ (a CQE every k-th WQE gives the staging credits back) and the credit word
// the receiver writes. Everything the producer reads (CQ, credit record, its own state) is in
// memory local to it (GPU memory on a GPU): no PCIe read on the data path. Only stores cross
// to the NIC (payload, UAR). The receiver side checks the landed header and
// trailer against the sequence number it expects, which is how "staged data dropped or
// overwritten" is detected end to end.
//
// The same source is compiled twice: as CUDA device code (transports/gdr/gdr_kernels.cu) and as
// host code that a CPU thread runs against the software NIC where there is no GPU. Only the
// primitives of the "memory-ordering layer" below differ between the two; every decision
// (credits, slot layout, WQE fields, counters) is in code both share. C++17 (nvcc under
// CMake 3.25), no exceptions, no std:: containers.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "kernels/gdr/mlx5_wire.h"
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
  uint64_t doorbells;         // UAR doorbell (or BlueFlame) writes
  uint64_t stagedLost;        // staged data dropped or overwritten: must stay 0
  uint64_t slotsLanded;       // receiver: slots verified and handed out
  uint64_t creditWrites;      // receiver: consumed counts written back to the sender
  uint64_t completionErrors;  // CQEs with a status other than success
  uint64_t remoteReads;       // producer loads from NIC-side memory (staging, UAR): must stay 0
  uint64_t devicePosts;       // slots the device-side producer filled straight from a device
                              // buffer (GPU kernel, or the emulated runtime's device thread)
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
  mlx5::SqView sq;          // data QP's send queue: ring and record local, UAR remote
  mlx5::CqView cq;          // its completion queue, local: CQEs give staging credits back
  char* staging;            // producer mapping of slot 0 (remote: NIC memory or host memory)
  uint64_t stagingWqeAddr;  // the address of slot 0 in WQEs (offset for zero-based DM)
  uint32_t stagingLkey;
  uint32_t slotCount;        // staging slots (credits), <= 1 << sq.log2Bbs
  uint32_t slotStrideBytes;  // slotStride(payloadCapacity)
  uint32_t payloadCapacity;
  uint64_t remoteAddr;  // slot 0 of the receiver's landing ring
  uint32_t remoteRkey;
  uint32_t remoteSlotCount;
  const CreditRecord* remoteConsumed;  // local; written by the receiver (RDMA): slots released
  uint32_t signalEvery;                // a CQE is requested every k-th WQE (1 <= k <= slotCount)
  uint32_t reserved;
};

// Producer state; one producer per channel, in memory local to it.
struct SendState {
  uint64_t seq;             // slots posted so far
  uint64_t remoteConsumed;  // last valid CreditRecord::count seen
  uint64_t lastCtrl8;       // the doorbell word: first 8 bytes of the last WQE's control segment
  uint32_t pi;              // send-queue producer index (blocks; one per slot WQE)
  uint32_t rungPi;          // producer index last published through the doorbell
  uint32_t retired;         // WQEs known complete, from the CQEs polled
  uint32_t cqCi;            // CQ consumer index
  uint32_t signaledPi;      // producer index after the last WQE that asked for a CQE
  uint32_t failedSyndrome;  // first error CQE's syndrome (0: none)
  uint32_t stalledLocal;    // in a staging-credit stall episode
  uint32_t stalledRemote;   // in a receiver-ring stall episode
};

// What the host and a device-side producer both touch, on a page of its own so that it can be
// mapped into a GPU (the host takes credits, the device posts; one writer at a time: the host
// acquires the next slot only once postsRun says the device ran the last post it queued).
struct ProducerShared {
  SendState st;
  Counters ctr;       // the device-side producer's counters
  uint64_t postsRun;  // device posts run so far; the device's last store of a post
};

// Producer-side accounting of where a load goes: staging and the UAR are across PCIe for a
// GPU (non-posted reads the design exists to avoid); everything else is local.
RIDGE_HOST_DEVICE inline bool isRemote(const SendChannel& ch, const void* p) {
  const char* c = static_cast<const char*>(p);
  const char* uar = reinterpret_cast<const char*>(ch.sq.uarDoorbell);
  return (c >= ch.staging && c < ch.staging + static_cast<size_t>(ch.slotCount) * ch.slotStrideBytes) ||
         (uar != nullptr && c >= uar && c < uar + 8) ||
         (ch.sq.blueFlame != nullptr && c >= reinterpret_cast<const char*>(ch.sq.blueFlame) &&
          c < reinterpret_cast<const char*>(ch.sq.blueFlame) + 2 * ch.sq.bfBytes);
}
// Every producer load goes through these, so a test can prove there is none across PCIe.
RIDGE_HOST_DEVICE inline uint64_t producerLoad64(const SendChannel& ch, Counters* ctr, const uint64_t* p) {
  if (isRemote(ch, p)) ctr->remoteReads += 1;
  return loadVolatile64(p);
}

// Polls the channel's CQ: a requester CQE for the WQE at block k means every WQE up to k is
// complete (the NIC retires in order), so `retired` moves to k + 1. Error CQEs (a flushed QP
// writes one for every outstanding WQE, signaled or not) are counted and remembered.
RIDGE_HOST_DEVICE inline void pollSendCq(const SendChannel& ch, SendState* st, Counters* ctr) {
  if (ch.cq.cqes == nullptr) return;
  mlx5::CqeFields f;
  for (int i = 0; i < 16; ++i) {
    const mlx5::Cqe64* c = ch.cq.cqes + (st->cqCi & ((1u << ch.cq.log2Size) - 1u));
    if (isRemote(ch, c)) ctr->remoteReads += 1;
    if (!mlx5::pollCq(ch.cq, &st->cqCi, &f)) return;
    if (f.opcode == mlx5::kCqeReq) {
      // 16-bit index in the CQE: the distance from what we knew, within one queue's length.
      const uint32_t upTo = st->retired + static_cast<uint16_t>(f.wqeCounter + 1u - st->retired);
      ctr->creditsReturned += upTo - st->retired;
      st->retired = upTo;
    } else {
      ctr->completionErrors += 1;
      if (st->failedSyndrome == 0) st->failedSyndrome = f.syndrome ? f.syndrome : 0xff;
    }
  }
}

// Staging credits the producer holds now: slot k is free again once the WQE posted from it
// has completed (the target acknowledged every byte). One WQE per slot on this queue pair
// keeps the two counters in step.
RIDGE_HOST_DEVICE inline uint32_t stagingCredits(const SendChannel& ch, SendState* st, Counters* ctr) {
  pollSendCq(ch, st, ctr);
  const uint32_t inUse = st->pi - st->retired;
  return inUse >= ch.slotCount ? 0u : ch.slotCount - inUse;
}

// Landing slots free at the receiver.
RIDGE_HOST_DEVICE inline uint64_t remoteCredits(const SendChannel& ch, SendState* st, Counters* ctr) {
  const uint64_t count = producerLoad64(ch, ctr, &ch.remoteConsumed->count);
  const uint64_t check = producerLoad64(ch, ctr, &ch.remoteConsumed->check);
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
  if (remoteCredits(ch, st, ctr) == 0) {
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

// One slot's send, as the sealed slot describes it: what the device-side producer writes as an
// mlx5 WQE and the host-staged proxy posts through the provider.
struct SlotSend {
  uint64_t localAddr;
  uint64_t remoteAddr;
  uint32_t bytes;  // on the wire: header, payload, trailer
  uint32_t imm;    // low 32 bits of the sequence number
  uint32_t signaled;
  uint32_t reserved;
};

// Seals the acquired slot with `bytes` of payload (already written): header and trailer, and
// the send that carries it. Only stores reach the slot (it is remote memory for a GPU).
// Advances the sequence number. A CQE is requested every ch.signalEvery-th slot and for the
// last slot of a message, so credits come back without relying on unsignaled completions.
RIDGE_HOST_DEVICE inline SlotSend sealSlot(const SendChannel& ch, SendState* st, uint32_t bytes, bool last,
                                           Counters* ctr) {
  const uint64_t seq = st->seq + 1;
  char* slot = stagingSlot(ch, st->seq);
  SlotHeader* h = reinterpret_cast<SlotHeader*>(slot);
  SlotTrailer* t = reinterpret_cast<SlotTrailer*>(slot + kSlotHeaderBytes + paddedPayload(bytes));
  h->bytes = bytes;
  h->flags = last ? kSlotLast : 0u;
  h->magic = kSlotMagic;
  storeVolatile64(&h->seq, seq);
  storeVolatile64(&t->seq, seq);
  SlotSend s;
  s.localAddr = ch.stagingWqeAddr + static_cast<uint64_t>(st->seq % ch.slotCount) * ch.slotStrideBytes;
  s.remoteAddr = ch.remoteAddr + static_cast<uint64_t>(st->seq % ch.remoteSlotCount) * ch.slotStrideBytes;
  s.bytes = wireBytes(bytes);
  s.imm = static_cast<uint32_t>(seq);
  s.signaled = (mlx5::signalEvery(st->seq, ch.signalEvery) || last) ? 1u : 0u;
  s.reserved = 0;
  st->seq = seq;
  ctr->slotsWritten += 1;
  ctr->creditsConsumed += 1;
  return s;
}

// Writes one built WQE into the send queue at st->pi (the caller holds a credit for it).
RIDGE_HOST_DEVICE inline void appendWqe(const mlx5::SqView& sq, uint32_t* pi, uint64_t* lastCtrl8,
                                        const mlx5::WqeBuf& w, uint32_t ds) {
  mlx5::copyToRing(sq, *pi, w, mlx5::wqeBbs(ds));
  *lastCtrl8 = *reinterpret_cast<const uint64_t*>(w.bytes);
  *pi += mlx5::wqeBbs(ds);
}

// Seals the slot and writes its WQE into the send queue; does not ring, so several slots can
// share one doorbell. Returns the producer index to ring with.
RIDGE_HOST_DEVICE inline uint32_t postSlot(const SendChannel& ch, SendState* st, uint32_t bytes, bool last,
                                           Counters* ctr) {
  const SlotSend s = sealSlot(ch, st, bytes, last, ctr);
  mlx5::WqeBuf w;
  const uint32_t ds = mlx5::buildWqe(&w, mlx5::kOpRdmaWriteImm, static_cast<uint16_t>(st->pi), ch.sq.qpn,
                                     s.signaled ? uint8_t{mlx5::kCtrlCqUpdate} : uint8_t{0}, s.imm,
                                     s.remoteAddr, ch.remoteRkey, s.localAddr, ch.stagingLkey, s.bytes);
  appendWqe(ch.sq, &st->pi, &st->lastCtrl8, w, ds);
  if (s.signaled) st->signaledPi = st->pi;
  return st->pi;
}

// Publishes every WQE below st->pi in the doorbell record and rings the UAR doorbell.
// A queue without a UAR (the cpu-doorbell rung: the UAR is not mapped into the GPU) only
// publishes the record; a CPU thread that watches it rings for the producer.
RIDGE_HOST_DEVICE inline void ringTo(const mlx5::SqView& sq, uint32_t pi, uint64_t ctrl8, Counters* ctr) {
  mlx5::publishDbr(sq, pi);
  if (sq.uarDoorbell == nullptr) return;
  mlx5::ringDoorbellWord(sq, ctrl8);
  ctr->doorbells += 1;
}

// Rings for everything posted since the last ring (no-op when nothing is new).
RIDGE_HOST_DEVICE inline void flushDoorbell(const SendChannel& ch, SendState* st, Counters* ctr) {
  if (st->rungPi == st->pi) return;
  ringTo(ch.sq, st->pi, st->lastCtrl8, ctr);
  st->rungPi = st->pi;
}

// When the last WQE rung did not ask for a completion, a signaled NOP behind it does (the NIC
// completes in order), so a producer about to leave learns when everything retired. Needs a
// free block; returns whether it posted.
RIDGE_HOST_DEVICE inline bool postCompletionMarker(const SendChannel& ch, SendState* st, Counters* ctr) {
  if (st->signaledPi == st->pi || st->pi - st->retired >= (1u << ch.sq.log2Bbs)) return false;
  mlx5::WqeBuf w;
  const uint32_t ds = mlx5::buildNop(&w, static_cast<uint16_t>(st->pi), ch.sq.qpn, mlx5::kCtrlCqUpdate);
  appendWqe(ch.sq, &st->pi, &st->lastCtrl8, w, ds);
  st->signaledPi = st->pi;
  flushDoorbell(ch, st, ctr);
  return true;
}

// Posts one RDMA WRITE of `bytes` (<= mlx5::kMaxInlineBytes) carried inline in the WQE, asks
// for its completion and rings at once (BlueFlame when the queue has a register): used to
// return credits (the consumed counter) to a sender. `retired` is the caller's count of
// completed WQEs on this queue (from its CQ). False when the queue is full.
RIDGE_HOST_DEVICE inline bool postInlineWrite(const mlx5::SqView& sq, uint32_t* pi, uint32_t retired,
                                              uint32_t* bfOffset, const void* data, uint32_t bytes,
                                              uint64_t remoteAddr, uint32_t rkey, Counters* ctr) {
  mlx5::WqeBuf w;
  const uint32_t ds = mlx5::buildInlineWqe(&w, mlx5::kOpRdmaWrite, static_cast<uint16_t>(*pi), sq.qpn,
                                           mlx5::kCtrlCqUpdate, 0, remoteAddr, rkey, data, bytes);
  const uint32_t bbs = mlx5::wqeBbs(ds);
  if (*pi + bbs - retired > (1u << sq.log2Bbs)) return false;
  uint64_t ctrl8 = 0;
  appendWqe(sq, pi, &ctrl8, w, ds);
  mlx5::publishDbr(sq, *pi);
  if (!mlx5::ringBlueFlame(sq, w, bbs, bfOffset)) mlx5::ringDoorbellWord(sq, ctrl8);
  ctr->doorbells += 1;
  return true;
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
