// Queues: the softnic completion queue and queue pair, in the mlx5 layouts (send queue of
// 64-byte WQE blocks, receive queue of data segments, doorbell record, UAR, CQEs with owner
// bits), with the engine-side state of each QP.
#pragma once

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/gdr/mlx5_wire.h"
#include "transports/softnic/nic.h"
#include "transports/softnic/trace.h"
#include "transports/verbs/verbs.h"

namespace ridge {
namespace softnic {

using namespace verbs;

// Whole pages, alone: a GPU producer's transport maps a queue's rings, doorbell record and UAR
// into the GPU (cudaHostRegister works on pages, and refuses a page registered before), so no
// two queues, and nothing else, may share a page with them. Hence page-aligned rings and
// page-aligned queue objects (their doorbell records and UAR are members).
constexpr size_t kQueuePageBytes = 4096;
inline void* allocQueuePages(size_t bytes) {
  return std::aligned_alloc(kQueuePageBytes, (bytes + kQueuePageBytes - 1) & ~(kQueuePageBytes - 1));
}

class alignas(kQueuePageBytes) SoftCq final : public CompletionQueue {
 public:
  SoftCq(std::shared_ptr<Nic> nic, uint32_t entries) : nic_(std::move(nic)) {
    size_ = roundUpPow2(std::max<uint32_t>(entries, 2), &log2_);
    cqes_ = static_cast<mlx5::Cqe64*>(allocQueuePages(sizeof(mlx5::Cqe64) * size_));
    wrIds_.assign(size_, 0);
    std::memset(cqes_, 0, sizeof(mlx5::Cqe64) * size_);
    // Opcode INVALID: nothing is a completion until the NIC writes it.
    for (uint32_t i = 0; i < size_; ++i) cqes_[i].opOwn = mlx5::kCqeInitOpOwn;
    view_ = mlx5::CqView{cqes_, &dbrec_[0], log2_, 0};
  }
  ~SoftCq() override { std::free(cqes_); }
  int poll(Cqe* out, int max) override;
  void wait(int64_t maxWaitNs, bool (*stillIdle)(void*), void* arg) override {
    uint32_t word = wakeWord_.load(std::memory_order_acquire);
    sleeping_.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const uint8_t opOwn = __atomic_load_n(&cqes_[ci_ & (size_ - 1)].opOwn, __ATOMIC_ACQUIRE);
    if (!mlx5::cqeIsNew(opOwn, ci_, log2_) && (stillIdle == nullptr || stillIdle(arg))) {
      timespec ts{static_cast<time_t>(maxWaitNs / 1000000000), static_cast<long>(maxWaitNs % 1000000000)};
      futexCall(&wakeWord_, FUTEX_WAIT_PRIVATE, word, &ts);
    }
    sleeping_.store(0, std::memory_order_relaxed);
  }
  const mlx5::CqView* mlx5Cq() const override { return &view_; }

  // Engine side: room while the consumer index published in the record is less than a pass
  // behind (24 bits of it, as the hardware reads it).
  bool hasRoom() const {
    const uint32_t ci = mlx5::be32(loadAcquire(&dbrec_[0])) & 0xffffffu;
    return ((pi_ - ci) & 0xffffffu) < size_;
  }
  // `wrId` goes into the provider's side array, not the CQE (which has no room for it): libmlx5
  // keeps wrIds beside its queues too. Written before op_own, so poll() finds it with the CQE.
  void push(uint8_t opcode, uint8_t wqeOpcode, uint32_t wqeCounter, uint32_t qpn, uint32_t byteCnt,
            uint32_t imm, uint8_t syndrome, uint64_t wrId) {
    mlx5::Cqe64* slot = &cqes_[pi_ & (size_ - 1)];
    wrIds_[pi_ & (size_ - 1)] = wrId;
    mlx5::encodeCqe(slot, opcode, wqeOpcode, static_cast<uint16_t>(wqeCounter), qpn, byteCnt, imm, syndrome);
    mlx5::releaseFence();  // every field before op_own
    __atomic_store_n(&slot->opOwn, mlx5::makeOpOwn(opcode, pi_, log2_), __ATOMIC_RELEASE);
    ++pi_;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_relaxed)) {
      wakeWord_.fetch_add(1, std::memory_order_release);
      futexCall(&wakeWord_, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr);
    }
  }

 private:
  std::shared_ptr<Nic> nic_;
  mlx5::Cqe64* cqes_ = nullptr;
  uint32_t size_ = 0;
  uint32_t log2_ = 0;
  alignas(64) uint32_t dbrec_[2] = {0, 0};
  mlx5::CqView view_{};
  uint32_t ci_ = 0;              // poller
  uint32_t pi_ = 0;              // engine
  std::vector<uint64_t> wrIds_;  // by CQ index, engine-written
  alignas(64) std::atomic<uint32_t> wakeWord_{0};
  std::atomic<uint32_t> sleeping_{0};
};

struct alignas(kQueuePageBytes) SoftQp final : public QueuePair {
  SoftQp(std::shared_ptr<Nic> nic, SoftCq* scq, SoftCq* rcq, const QpCaps& caps);
  ~SoftQp() override;
  uint32_t qpn() const override { return qpn_; }
  QpState state() const override { return state_.load(std::memory_order_acquire); }
  Status localAddress(QpAddress* out) const override;
  Status modify(QpState to, const QpAddress* remote) override;
  Status postSend(const Wqe& wqe) override;
  Status postRecv(const RecvWqe& wqe) override;
  uint32_t sendSlotsFree() const override { return sqSize_ - (sqPi_ - loadAcquire(&sqRetired_)); }
  const mlx5::SqView* mlx5Sq() const override { return &view_; }
  // Engine: new send/receive blocks the doorbell record announces (16-bit indices, as mlx5).
  uint32_t sqPosted(bool trace) {
    const uint32_t raw = loadAcquire(&dbrec_[mlx5::kSendDbrWord]);
    if (trace && raw != lastDbrTraced_ && Trace::get().on()) {
      lastDbrTraced_ = raw;
      Trace::get().dbr(qpn_, raw);
    }
    return static_cast<uint16_t>((mlx5::be32(raw) & 0xffffu) - sqCi_);
  }
  uint32_t rqPosted() const {
    return static_cast<uint16_t>((mlx5::be32(loadAcquire(&dbrec_[mlx5::kRecvDbrWord])) & 0xffffu) - rqCi_);
  }
  // The doorbell words a producer writes (UAR, either BlueFlame half): any change = "look now".
  uint64_t doorbellWords() const {
    return __atomic_load_n(&uar_.doorbell, __ATOMIC_ACQUIRE) ^
           __atomic_load_n(reinterpret_cast<const uint64_t*>(uar_.blueFlame), __ATOMIC_ACQUIRE) ^
           __atomic_load_n(reinterpret_cast<const uint64_t*>(uar_.blueFlame + kBlueFlameBytes),
                           __ATOMIC_ACQUIRE);
  }

  std::shared_ptr<Nic> nic_;
  uint32_t qpn_ = 0;
  std::atomic<QpState> state_{QpState::Reset};
  SoftCq* scq_;
  SoftCq* rcq_;
  uint8_t* sq_ = nullptr;  // mlx5 send queue: sqSize_ blocks of 64 bytes
  uint32_t sqSize_ = 0, sqLog_ = 0;
  mlx5::DataSeg* rq_ = nullptr;  // mlx5 receive queue: one data segment per receive
  uint32_t rqSize_ = 0, rqLog_ = 0;
  alignas(64) uint32_t dbrec_[2] = {0, 0};  // mlx5 doorbell record (BE16 indices in BE32 words)
  static constexpr uint32_t kBlueFlameBytes = 256;
  struct alignas(64) Uar {
    uint64_t doorbell;
    uint64_t reserved[7];
    alignas(64) uint8_t blueFlame[2 * kBlueFlameBytes];
  } uar_{};
  // The engine's consumer indices, for postSend/postRecv's "queue full" (the provider's own
  // bookkeeping, as libmlx5's; producers that bypass the provider see CQEs only).
  alignas(64) uint32_t sqRetired_ = 0;  // engine-written
  uint32_t rqConsumed_ = 0;             // engine-written
  mlx5::SqView view_{};
  std::vector<uint64_t> sqWrId_;  // by send-queue block index (provider side)
  std::vector<uint64_t> rqWrId_;
  // Poster side.
  alignas(64) uint32_t sqPi_ = 0;
  uint32_t rqPi_ = 0;
  std::string remoteEndpoint_;
  uint32_t remoteQpn_ = 0;

  // Engine side.
  Conn* out_ = nullptr;
  Conn* in_ = nullptr;
  uint64_t lastPage_ = 0;
  uint32_t lastDbrTraced_ = 0;
  uint32_t sqCi_ = 0;  // first block of the next WQE to take into staging
  bool haveCur_ = false;
  Wqe cur_{};  // the WQE being cut into packets, decoded
  uint8_t curBbs_ = 1;
  uint8_t curMlx5Opcode_ = 0;
  uint64_t curWrId_ = 0;
  bool curInline_ = false;
  mlx5::WqeBuf curWqe_{};  // its bytes (inline payload is sent from here)
  uint32_t curOffset_ = 0;
  std::vector<Packet> inflight_;  // ring, capacity a power of two
  uint32_t inflightHead_ = 0, inflightTail_ = 0;
  uint32_t nextSeq_ = 0;
  uint32_t ackedUpTo_ = 0;
  int64_t lastProgressNs_ = 0;
  int64_t lastRetxNs_ = 0;
  uint32_t lastNakSeq_ = UINT32_MAX;
  int retries_ = 0;
  bool stalledOnStaging_ = false;
  // An RDMA READ is in flight: later WQEs wait for its response (an implicit fence), so a
  // re-executed read sees the same memory, as far as this QP's own writes go, as the first.
  bool readPending_ = false;
  HeldPacket held_[kHeldMax];
  uint32_t heldCount_ = 0;
  uint8_t errorStatus_ = kCqeOk;  // status for the WQE that failed first
  bool errorReported_ = false;
  // Inbound.
  uint32_t expectedSeq_ = 0;
  bool ackPending_ = false;
  uint32_t nakSentFor_ = UINT32_MAX;
  uint32_t rqCi_ = 0;
  // Read response frames (serialized, payload included) held back by the fault injector
  // until the next response frame goes out.
  std::vector<char> heldResponses_;
};

}  // namespace softnic
}  // namespace ridge
