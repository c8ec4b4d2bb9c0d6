// Plain-data structs of the verbs subset: the work requests a host thread hands to
// QueuePair::postSend / postRecv and the completions CompletionQueue::poll returns (the roles
// of ibv_send_wr, ibv_recv_wr and ibv_wc). What a NIC reads and writes in its queues is not
// these but the mlx5 wire format of kernels/gdr/mlx5_wire.h, which the providers encode and
// decode. Compiles as device code under nvcc (fixed sizes, no std:: types), for the fences.
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
  kWqeSignaled = 1,  // produce a CQE when done (mlx5 CQ_UPDATE)
  kWqeFence = 2,     // wait for earlier reads (softnic executes every WQE in order anyway)
};

// One send work request: four 16-byte segments, one cache line.
struct Wqe {
  // control segment
  uint8_t opcode;    // WqeOpcode
  uint8_t flags;     // WqeFlags
  uint16_t index;    // (unused: the provider fills the mlx5 control segment's index)
  uint32_t qpn;      // (unused: the provider fills the control segment's QP number)
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
  uint8_t owner;  // (unused: the provider's poll decodes the mlx5 CQE's owner bit)
};
static_assert(sizeof(Cqe) == 32, "a CQE is 32 bytes");
static_assert(offsetof(Cqe, qpn) == 16, "CQE layout");
static_assert(offsetof(Cqe, owner) == 31, "the owner byte is the last byte of a CQE");

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

}  // namespace verbs
}  // namespace ridge
