// The mlx5 wire format of send work requests, doorbells and completions: one source for every
// producer and consumer of them, compiled as CUDA device code (GPU producers), as host code
// (the CPU stand-in for a GPU, the software NIC that parses what they wrote, real-NIC queue
// set-up). The layouts are the ones ConnectX NICs read and write (rdma-core's
// infiniband/mlx5dv.h names them mlx5_wqe_ctrl_seg, mlx5_wqe_raddr_seg, mlx5_wqe_data_seg,
// mlx5_wqe_inl_data_seg, mlx5_cqe64); tests/gdr/mlx5_wire_test.cpp compares every encoder with
// that header byte for byte. No rdma-core header is needed to build this one.
//
// Send queue: a ring of 64-byte basic blocks (WQEBBs). A WQE is 1..n blocks of 16-byte
// segments: control, then (RDMA opcodes) the remote address, then data segments or one inline
// data segment. The producer index counts blocks; the control segment carries the index of the
// WQE's first block (low 16 bits), the WQE's length in 16-byte units (ds) and the QP number.
// Posting: write the blocks, release fence, doorbell record = BE32(pi & 0xffff), release fence,
// then the UAR doorbell: the first 8 bytes of the last WQE's control segment (or, BlueFlame, the
// whole WQE when it fits the register). The record is what the NIC trusts; the doorbell says
// "look now".
//
// Completion queue: a ring of 64-byte CQEs; the NIC writes all fields, then op_own (opcode in
// the high nibble, owner bit in bit 0). Entries start as opcode INVALID; a CQE at consumer index
// ci is new when its opcode is not INVALID and its owner bit equals bit log2(size) of ci. The
// consumer publishes ci in the CQ doorbell record as BE32(ci & 0xffffff). A successful
// requester CQE is written only for WQEs with CQ_UPDATE in fm_ce_se and means every earlier WQE
// of the queue completed too, so a producer asks for one every k-th WQE to get its credits back.
//
// C++17, no std:: types, no exceptions: nvcc compiles it under CMake 3.25.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "core/host_device.h"

namespace ridge {
namespace mlx5 {

// ---- Byte order (hosts and GPUs here are little-endian; the wire is big-endian) -------------
RIDGE_HOST_DEVICE inline uint16_t be16(uint16_t v) {
  return static_cast<uint16_t>((v >> 8) | (v << 8));
}
RIDGE_HOST_DEVICE inline uint32_t be32(uint32_t v) {
  return (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
}
RIDGE_HOST_DEVICE inline uint64_t be64(uint64_t v) {
  return (static_cast<uint64_t>(be32(static_cast<uint32_t>(v))) << 32) | be32(static_cast<uint32_t>(v >> 32));
}

// ---- Constants (values of mlx5dv.h) -------------------------------------------------------
constexpr uint32_t kWqeBbBytes = 64;  // MLX5_SEND_WQE_BB
constexpr uint32_t kWqeBbShift = 6;
constexpr uint32_t kSegBytes = 16;  // the "ds" unit

enum Opcode : uint8_t {  // MLX5_OPCODE_*
  kOpNop = 0x00,
  kOpRdmaWrite = 0x08,
  kOpRdmaWriteImm = 0x09,
  kOpSend = 0x0a,
  kOpSendImm = 0x0b,
  kOpRdmaRead = 0x10,
};

enum CtrlFlags : uint8_t {   // fm_ce_se
  kCtrlSolicited = 1u << 1,  // MLX5_WQE_CTRL_SOLICITED
  kCtrlCqUpdate = 2u << 2,   // MLX5_WQE_CTRL_CQ_UPDATE: write a CQE when this WQE completes
  kCtrlFence = 4u << 5,      // MLX5_WQE_CTRL_FENCE
};

constexpr uint32_t kInlineSeg = 0x80000000u;  // MLX5_INLINE_SEG, in an inline segment's byte count

enum CqeOpcode : uint8_t {  // MLX5_CQE_*
  kCqeReq = 0,
  kCqeRespWrImm = 1,
  kCqeRespSend = 2,
  kCqeRespSendImm = 3,
  kCqeReqErr = 13,
  kCqeRespErr = 14,
  kCqeInvalid = 15,
};

enum Syndrome : uint8_t {  // MLX5_CQE_SYNDROME_*
  kSyndLocalLength = 0x01,
  kSyndLocalQpOp = 0x02,
  kSyndLocalProt = 0x04,
  kSyndWrFlush = 0x05,
  kSyndBadResp = 0x10,
  kSyndRemoteInvalReq = 0x12,
  kSyndRemoteAccess = 0x13,
  kSyndRemoteOp = 0x14,
  kSyndTransportRetryExc = 0x15,
  kSyndRnrRetryExc = 0x16,
};

// Word index of the send and receive producer indices in a QP's doorbell record
// (MLX5_SND_DBR / MLX5_RCV_DBR); a CQ's record has its consumer index at word 0.
constexpr uint32_t kSendDbrWord = 1;
constexpr uint32_t kRecvDbrWord = 0;

// ---- Segments (every multi-byte field big-endian) -----------------------------------------
struct CtrlSeg {            // mlx5_wqe_ctrl_seg
  uint32_t opmodIdxOpcode;  // opmod << 24 | wqe index << 8 | opcode
  uint32_t qpnDs;           // qpn << 8 | ds (WQE length in 16-byte units)
  uint8_t signature;
  uint8_t dciStreamChannel[2];
  uint8_t fmCeSe;  // CtrlFlags
  uint32_t imm;    // immediate as it goes on the wire (big-endian)
};
struct RaddrSeg {  // mlx5_wqe_raddr_seg
  uint64_t raddr;
  uint32_t rkey;
  uint32_t reserved;
};
struct DataSeg {  // mlx5_wqe_data_seg
  uint32_t byteCount;
  uint32_t lkey;
  uint64_t addr;
};
struct InlineSeg {     // mlx5_wqe_inl_data_seg: the bytes follow the count
  uint32_t byteCount;  // BE32(length | kInlineSeg)
};
static_assert(sizeof(CtrlSeg) == 16 && sizeof(RaddrSeg) == 16 && sizeof(DataSeg) == 16, "16-byte segments");
static_assert(offsetof(CtrlSeg, fmCeSe) == 11 && offsetof(CtrlSeg, imm) == 12, "control segment layout");

// A 64-byte CQE (mlx5_cqe64; the error layout mlx5_err_cqe shares its tail).
struct Cqe64 {
  uint8_t rsvd0[32];
  uint32_t srqnUidx;
  uint32_t immInvalPkey;  // immediate of RESP_WR_IMM / RESP_SEND_IMM, big-endian as sent
  uint8_t app;
  uint8_t appOp;
  uint16_t appInfo;
  uint32_t byteCnt;       // responder: bytes landed; requester RDMA READ: bytes read
  uint8_t timestamp[6];   // (the error layout's reserved bytes)
  uint8_t vendorErrSynd;  // error CQEs only
  uint8_t syndrome;       // error CQEs only
  uint32_t sopDropQpn;    // WQE opcode << 24 (requester) | qpn; error CQEs: s_wqe_opcode_qpn
  uint16_t wqeCounter;    // requester: index of the WQE's first block; responder: RQ index
  uint8_t signature;
  uint8_t opOwn;  // opcode << 4 | owner
};
static_assert(sizeof(Cqe64) == 64, "a CQE is 64 bytes");
static_assert(offsetof(Cqe64, byteCnt) == 44 && offsetof(Cqe64, syndrome) == 55 &&
                  offsetof(Cqe64, sopDropQpn) == 56 && offsetof(Cqe64, wqeCounter) == 60 &&
                  offsetof(Cqe64, opOwn) == 63,
              "CQE layout");

// ---- Encoders -------------------------------------------------------------------------------
RIDGE_HOST_DEVICE inline CtrlSeg makeCtrl(uint8_t opcode, uint16_t wqeIndex, uint32_t qpn, uint8_t fmCeSe,
                                          uint8_t ds, uint32_t imm) {
  CtrlSeg c;
  c.opmodIdxOpcode = be32((static_cast<uint32_t>(wqeIndex) << 8) | opcode);
  c.qpnDs = be32((qpn << 8) | ds);
  c.signature = 0;
  c.dciStreamChannel[0] = 0;
  c.dciStreamChannel[1] = 0;
  c.fmCeSe = fmCeSe;
  c.imm = be32(imm);
  return c;
}
RIDGE_HOST_DEVICE inline RaddrSeg makeRaddr(uint64_t raddr, uint32_t rkey) {
  RaddrSeg r;
  r.raddr = be64(raddr);
  r.rkey = be32(rkey);
  r.reserved = 0;
  return r;
}
RIDGE_HOST_DEVICE inline DataSeg makeData(uint32_t bytes, uint32_t lkey, uint64_t addr) {
  DataSeg d;
  d.byteCount = be32(bytes);
  d.lkey = be32(lkey);
  d.addr = be64(addr);
  return d;
}
RIDGE_HOST_DEVICE inline uint32_t inlineByteCount(uint32_t bytes) {
  return be32(bytes | kInlineSeg);
}

// 16-byte units of an inline segment carrying `bytes` (count word + data, padded).
RIDGE_HOST_DEVICE inline uint32_t inlineDs(uint32_t bytes) {
  return (4u + bytes + 15u) / 16u;
}
// Blocks a WQE of `ds` 16-byte units occupies.
RIDGE_HOST_DEVICE inline uint32_t wqeBbs(uint32_t ds) {
  return (ds * kSegBytes + kWqeBbBytes - 1) / kWqeBbBytes;
}

// Largest WQE the builders below produce (blocks); an inline payload must fit it.
constexpr uint32_t kMaxWqeBbs = 4;
constexpr uint32_t kMaxInlineBytes = kMaxWqeBbs * kWqeBbBytes - 2 * kSegBytes - 4;

// A WQE being built: whole blocks, so it can be copied into the ring (or a BlueFlame register)
// block by block.
struct alignas(64) WqeBuf {
  uint8_t bytes[kMaxWqeBbs * kWqeBbBytes];
};

// RDMA WRITE (imm == nullptr: no immediate) / WRITE_IMM / READ / SEND / SEND_IMM of one
// gather entry; returns ds. `raddr`/`rkey` are ignored for SEND.
RIDGE_HOST_DEVICE inline uint32_t buildWqe(WqeBuf* w, uint8_t opcode, uint16_t wqeIndex, uint32_t qpn,
                                           uint8_t fmCeSe, uint32_t imm, uint64_t raddr, uint32_t rkey,
                                           uint64_t laddr, uint32_t lkey, uint32_t bytes) {
  const bool rdma = opcode == kOpRdmaWrite || opcode == kOpRdmaWriteImm || opcode == kOpRdmaRead;
  const uint32_t ds = rdma ? 3u : 2u;
  CtrlSeg* c = reinterpret_cast<CtrlSeg*>(w->bytes);
  *c = makeCtrl(opcode, wqeIndex, qpn, fmCeSe, static_cast<uint8_t>(ds), imm);
  uint8_t* p = w->bytes + kSegBytes;
  if (rdma) {
    *reinterpret_cast<RaddrSeg*>(p) = makeRaddr(raddr, rkey);
    p += kSegBytes;
  }
  *reinterpret_cast<DataSeg*>(p) = makeData(bytes, lkey, laddr);
  p += kSegBytes;
  for (uint8_t* end = w->bytes + kWqeBbBytes; p < end; ++p) *p = 0;
  return ds;
}

// The same with the payload inline in the WQE (no local key; the NIC takes the bytes from the
// WQE itself). `bytes` <= kMaxInlineBytes. Returns ds.
RIDGE_HOST_DEVICE inline uint32_t buildInlineWqe(WqeBuf* w, uint8_t opcode, uint16_t wqeIndex, uint32_t qpn,
                                                 uint8_t fmCeSe, uint32_t imm, uint64_t raddr, uint32_t rkey,
                                                 const void* data, uint32_t bytes) {
  const bool rdma = opcode == kOpRdmaWrite || opcode == kOpRdmaWriteImm;
  const uint32_t ds = (rdma ? 2u : 1u) + inlineDs(bytes);
  CtrlSeg* c = reinterpret_cast<CtrlSeg*>(w->bytes);
  *c = makeCtrl(opcode, wqeIndex, qpn, fmCeSe, static_cast<uint8_t>(ds), imm);
  uint8_t* p = w->bytes + kSegBytes;
  if (rdma) {
    *reinterpret_cast<RaddrSeg*>(p) = makeRaddr(raddr, rkey);
    p += kSegBytes;
  }
  reinterpret_cast<InlineSeg*>(p)->byteCount = inlineByteCount(bytes);
  p += 4;
  const uint8_t* src = static_cast<const uint8_t*>(data);
  for (uint32_t i = 0; i < bytes; ++i) p[i] = src[i];
  for (uint8_t *q = p + bytes, *end = w->bytes + wqeBbs(ds) * kWqeBbBytes; q < end; ++q) *q = 0;
  return ds;
}

RIDGE_HOST_DEVICE inline uint32_t buildNop(WqeBuf* w, uint16_t wqeIndex, uint32_t qpn, uint8_t fmCeSe) {
  *reinterpret_cast<CtrlSeg*>(w->bytes) = makeCtrl(kOpNop, wqeIndex, qpn, fmCeSe, 1, 0);
  for (uint32_t i = kSegBytes; i < kWqeBbBytes; ++i) w->bytes[i] = 0;
  return 1;
}

// ---- Decoders (the NIC's side, and tests) ---------------------------------------------------
struct WqeFields {
  uint8_t opcode;
  uint8_t opmod;
  uint16_t wqeIndex;
  uint32_t qpn;
  uint32_t ds;
  uint8_t fmCeSe;
  uint32_t imm;  // host order
  uint64_t raddr;
  uint32_t rkey;
  bool isInline;
  uint32_t bytes;  // data segment's or inline segment's length
  uint32_t lkey;
  uint64_t laddr;
  uint32_t inlineOffset;  // inline: offset of the first payload byte in the WQE
};

RIDGE_HOST_DEVICE inline bool opcodeHasRaddr(uint8_t op) {
  return op == kOpRdmaWrite || op == kOpRdmaWriteImm || op == kOpRdmaRead;
}

// Decodes the control segment of a WQE whose first block is at `wqe`.
RIDGE_HOST_DEVICE inline void decodeCtrl(const uint8_t* wqe, WqeFields* f) {
  const CtrlSeg* c = reinterpret_cast<const CtrlSeg*>(wqe);
  const uint32_t w0 = be32(c->opmodIdxOpcode);
  const uint32_t w1 = be32(c->qpnDs);
  f->opcode = static_cast<uint8_t>(w0 & 0xff);
  f->wqeIndex = static_cast<uint16_t>(w0 >> 8);
  f->opmod = static_cast<uint8_t>(w0 >> 24);
  f->qpn = w1 >> 8;
  f->ds = w1 & 0x3f;
  f->fmCeSe = c->fmCeSe;
  f->imm = be32(c->imm);
}

// Decodes a whole WQE (all its blocks contiguous at `wqe`). False when it is malformed: an
// opcode outside the subset, a ds that does not fit the opcode's segments, more than one
// gather entry, an inline length that disagrees with ds.
RIDGE_HOST_DEVICE inline bool decodeWqe(const uint8_t* wqe, WqeFields* f) {
  decodeCtrl(wqe, f);
  f->raddr = 0;
  f->rkey = 0;
  f->isInline = false;
  f->bytes = 0;
  f->lkey = 0;
  f->laddr = 0;
  f->inlineOffset = 0;
  if (f->opmod != 0) return false;
  if (f->opcode == kOpNop) return f->ds == 1;
  if (f->opcode != kOpRdmaWrite && f->opcode != kOpRdmaWriteImm && f->opcode != kOpSend &&
      f->opcode != kOpSendImm && f->opcode != kOpRdmaRead)
    return false;
  uint32_t at = kSegBytes;
  if (opcodeHasRaddr(f->opcode)) {
    const RaddrSeg* r = reinterpret_cast<const RaddrSeg*>(wqe + at);
    f->raddr = be64(r->raddr);
    f->rkey = be32(r->rkey);
    at += kSegBytes;
  }
  if (f->ds * kSegBytes <= at) return false;
  const uint32_t first = be32(*reinterpret_cast<const uint32_t*>(wqe + at));
  if (first & kInlineSeg) {
    if (f->opcode == kOpRdmaRead) return false;
    f->isInline = true;
    f->bytes = first & ~kInlineSeg;
    f->inlineOffset = at + 4;
    return f->bytes <= kMaxInlineBytes && at / kSegBytes + inlineDs(f->bytes) == f->ds;
  }
  if (f->ds * kSegBytes != at + kSegBytes) return false;  // exactly one gather entry
  const DataSeg* d = reinterpret_cast<const DataSeg*>(wqe + at);
  f->bytes = be32(d->byteCount);
  f->lkey = be32(d->lkey);
  f->laddr = be64(d->addr);
  return true;
}

// ---- Completions ----------------------------------------------------------------------------
RIDGE_HOST_DEVICE inline uint8_t cqeOpcode(uint8_t opOwn) {
  return static_cast<uint8_t>(opOwn >> 4);
}
RIDGE_HOST_DEVICE inline uint8_t ownerForIndex(uint32_t index, uint32_t log2Size) {
  return static_cast<uint8_t>((index >> log2Size) & 1u);
}
// Whether a CQE with this op_own byte is new for consumer index `ci`.
RIDGE_HOST_DEVICE inline bool cqeIsNew(uint8_t opOwn, uint32_t ci, uint32_t log2Size) {
  return cqeOpcode(opOwn) != kCqeInvalid && (opOwn & 1u) == ownerForIndex(ci, log2Size);
}
// Value a CQ's entries are initialized with (opcode INVALID, owner 0).
constexpr uint8_t kCqeInitOpOwn = static_cast<uint8_t>(kCqeInvalid << 4);

// What a CQE says, in host order.
struct CqeFields {
  uint8_t opcode;     // CqeOpcode
  uint8_t wqeOpcode;  // requester CQEs: the WQE's Opcode
  uint16_t wqeCounter;
  uint32_t qpn;
  uint32_t byteCnt;
  uint32_t imm;
  uint8_t syndrome;  // error CQEs
  uint8_t vendorSyndrome;
};

RIDGE_HOST_DEVICE inline void decodeCqe(const Cqe64* c, CqeFields* f) {
  const volatile Cqe64* v = c;
  f->opcode = cqeOpcode(v->opOwn);
  const uint32_t sop = be32(v->sopDropQpn);
  f->wqeOpcode = static_cast<uint8_t>(sop >> 24);
  f->qpn = sop & 0xffffffu;
  f->wqeCounter = be16(v->wqeCounter);
  f->byteCnt = be32(v->byteCnt);
  f->imm = be32(v->immInvalPkey);
  const bool err = f->opcode == kCqeReqErr || f->opcode == kCqeRespErr;
  f->syndrome = err ? v->syndrome : 0;
  f->vendorSyndrome = err ? v->vendorErrSynd : 0;
}

// The NIC's side: a CQE with every field but op_own. `wqeOpcode` goes into the top byte of
// sop_drop_qpn (requester CQEs, error CQEs), `syndrome` only into error CQEs.
RIDGE_HOST_DEVICE inline void encodeCqe(Cqe64* c, uint8_t opcode, uint8_t wqeOpcode, uint16_t wqeCounter,
                                        uint32_t qpn, uint32_t byteCnt, uint32_t imm, uint8_t syndrome) {
  uint8_t* b = reinterpret_cast<uint8_t*>(c);
  for (uint32_t i = 0; i < 63; ++i) b[i] = 0;
  c->immInvalPkey = be32(imm);
  c->byteCnt = be32(byteCnt);
  c->sopDropQpn = be32((static_cast<uint32_t>(wqeOpcode) << 24) | (qpn & 0xffffffu));
  c->wqeCounter = be16(wqeCounter);
  if (opcode == kCqeReqErr || opcode == kCqeRespErr) c->syndrome = syndrome;
}
RIDGE_HOST_DEVICE inline uint8_t makeOpOwn(uint8_t opcode, uint32_t pi, uint32_t log2Size) {
  return static_cast<uint8_t>((opcode << 4) | ownerForIndex(pi, log2Size));
}

// ---- Fences ---------------------------------------------------------------------------------
RIDGE_HOST_DEVICE inline void releaseFence() {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
#else
  __atomic_thread_fence(__ATOMIC_RELEASE);
#endif
}
RIDGE_HOST_DEVICE inline void acquireFence() {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
#else
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
#endif
}

// ---- Queues as a producer / consumer sees them ----------------------------------------------
// The "device handle" of a send queue: every pointer in the producer's address space. On a
// GPU the ring and the record live in GPU memory (the NIC reads them), the doorbell and the
// BlueFlame register are the UAR page mapped with cudaHostRegister(IoMemory).
struct SqView {
  uint8_t* ring;          // 1 << log2Bbs blocks
  uint32_t* dbrec;        // the send word of the QP's doorbell record (kSendDbrWord)
  uint64_t* uarDoorbell;  // 8-byte doorbell register
  uint8_t* blueFlame;     // BlueFlame register (two halves of bfBytes, used alternately); may be null
  uint32_t bfBytes;       // 0: no BlueFlame
  uint32_t log2Bbs;
  uint32_t qpn;
  uint32_t reserved;
};

struct CqView {
  Cqe64* cqes;      // 1 << log2Size entries
  uint32_t* dbrec;  // consumer index word
  uint32_t log2Size;
  uint32_t cqn;
};

// Copies a built WQE of `bbs` blocks into the ring at block index `pi` (wrapping block by block).
RIDGE_HOST_DEVICE inline void copyToRing(const SqView& sq, uint32_t pi, const WqeBuf& w, uint32_t bbs) {
  const uint32_t mask = (1u << sq.log2Bbs) - 1u;
  for (uint32_t b = 0; b < bbs; ++b) {
    uint64_t* dst = reinterpret_cast<uint64_t*>(sq.ring + static_cast<size_t>((pi + b) & mask) * kWqeBbBytes);
    const uint64_t* src = reinterpret_cast<const uint64_t*>(w.bytes + b * kWqeBbBytes);
    for (uint32_t i = 0; i < kWqeBbBytes / 8; ++i) dst[i] = src[i];
  }
}

// Publishes every WQE below block index `newPi` in the doorbell record.
RIDGE_HOST_DEVICE inline void publishDbr(const SqView& sq, uint32_t newPi) {
  releaseFence();  // WQEs (and the payload they name) before the record
  *reinterpret_cast<volatile uint32_t*>(sq.dbrec) = be32(newPi & 0xffffu);
}

// The UAR doorbell: the first 8 bytes of the last posted WQE's control segment.
RIDGE_HOST_DEVICE inline void ringDoorbell(const SqView& sq, const WqeBuf& last) {
  releaseFence();  // the record before the doorbell
  *reinterpret_cast<volatile uint64_t*>(sq.uarDoorbell) = *reinterpret_cast<const uint64_t*>(last.bytes);
}

// The same with the doorbell word kept from the WQE (a producer that no longer holds the WQE).
RIDGE_HOST_DEVICE inline void ringDoorbellWord(const SqView& sq, uint64_t ctrlFirst8) {
  releaseFence();
  *reinterpret_cast<volatile uint64_t*>(sq.uarDoorbell) = ctrlFirst8;
}

// BlueFlame: the whole WQE written into the register when it fits (the NIC need not fetch it);
// the halves alternate. Returns false (nothing written) when the WQE is too large or the queue
// has no register; the caller then rings the plain doorbell.
RIDGE_HOST_DEVICE inline bool ringBlueFlame(const SqView& sq, const WqeBuf& w, uint32_t bbs,
                                            uint32_t* bfOffset) {
  if (sq.blueFlame == nullptr || bbs * kWqeBbBytes > sq.bfBytes) return false;
  releaseFence();
  volatile uint64_t* dst = reinterpret_cast<volatile uint64_t*>(sq.blueFlame + *bfOffset);
  const uint64_t* src = reinterpret_cast<const uint64_t*>(w.bytes);
  for (uint32_t i = 0; i < bbs * kWqeBbBytes / 8; ++i) dst[i] = src[i];
  *bfOffset ^= sq.bfBytes;
  return true;
}

// Whether WQE number `n` (0-based count of WQEs posted) asks for a completion when the
// producer requests one every `k` WQEs: the k-th, 2k-th, ... and every one when k <= 1.
RIDGE_HOST_DEVICE inline bool signalEvery(uint64_t n, uint32_t k) {
  return k <= 1 || (n + 1) % k == 0;
}

// Copies the CQE at consumer index *ci out if it is new, advances *ci and publishes it.
RIDGE_HOST_DEVICE inline bool pollCq(const CqView& cq, uint32_t* ci, CqeFields* out) {
  const Cqe64* c = cq.cqes + (*ci & ((1u << cq.log2Size) - 1u));
  const uint8_t opOwn = reinterpret_cast<const volatile Cqe64*>(c)->opOwn;
  if (!cqeIsNew(opOwn, *ci, cq.log2Size)) return false;
  acquireFence();  // the fields were written before op_own
  decodeCqe(c, out);
  *ci += 1;
  releaseFence();
  *reinterpret_cast<volatile uint32_t*>(cq.dbrec) = be32(*ci & 0xffffffu);
  return true;
}

}  // namespace mlx5
}  // namespace ridge
