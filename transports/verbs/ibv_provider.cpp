// The rdma-core provider: the verbs subset over libibverbs, for real RDMA NICs.
//
// rdma-core is loaded at run time: every call goes through the IbvApi table (ibv_api.h),
// never a verbs symbol, so libridge loads without rdma-core and tests can substitute doubles.
//
// Work requests are translated from the shared Wqe layout into ibv_send_wr at postSend,
// and ibv_wc into Cqe at poll. mlx5Sq()/mlx5Cq() (producers that write mlx5 WQEs and poll
// mlx5 CQEs themselves) give, for QPs created with QpCaps::mlx5Direct and CQs from
// createMlx5Cq, the hardware rings from mlx5 direct verbs; for any other QP or CQ, rings in
// host memory in the same format that a proxy thread carries to the NIC (RingProxy); mlx5dv also
// gives device memory a CPU mapping. probeGdrLadder gathers the GDR-write ladder's facts.
//
// Connection setup uses port 1 and GID index 0 (global routing when the port is Ethernet,
// i.e. RoCE, or the GID is set), a random 24-bit PSN, the smaller of both active MTUs,
// and infinite RNR retries (the transports keep receives posted, a short RNR is a
// scheduling hiccup rather than an error).
#include <arpa/inet.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "bootstrap/bootstrap.h"
#include "core/log.h"
#include "core/settings.h"
#include "device/runtime.h"
#include "transports/verbs/gpu_ring_mapping.h"
#include "transports/verbs/ibv_api.h"
#include "transports/verbs/verbs.h"

namespace ridge {
namespace verbs {
namespace {

constexpr uint32_t kIbvAddrMagic = 0x56424952u;  // "RIBV"
constexpr uint8_t kPort = 1;

struct IbvAddress {
  uint32_t magic;
  uint32_t qpn;
  uint32_t psn;
  uint16_t lid;
  uint8_t mtu;  // enum ibv_mtu
  uint8_t global;
  uint8_t gid[16];
};
static_assert(sizeof(IbvAddress) <= sizeof(QpAddress), "verbs address fits QpAddress");

Status ibvError(const char* what, int err) {
  return makeError(ridgeSystemError, "verbs: %s failed: %s", what, std::strerror(err ? err : errno));
}

uint32_t toIbvAccess(uint32_t access) {
  uint32_t a = 0;
  if (access & kAccessLocalWrite) a |= IBV_ACCESS_LOCAL_WRITE;
  // Remote write requires local write in verbs.
  if (access & kAccessRemoteWrite) a |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  if (access & kAccessRemoteRead) a |= IBV_ACCESS_REMOTE_READ;
  return a;
}

uint8_t fromWcStatus(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS: return kCqeOk;
    case IBV_WC_LOC_LEN_ERR: return kCqeLocalLengthError;
    case IBV_WC_LOC_PROT_ERR: return kCqeLocalProtectionError;
    case IBV_WC_REM_ACCESS_ERR: return kCqeRemoteAccessError;
    case IBV_WC_REM_INV_REQ_ERR: return kCqeRemoteInvalidRequest;
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR: return kCqeTransportRetryExceeded;
    case IBV_WC_WR_FLUSH_ERR: return kCqeFlushed;
    default: return kCqeGeneralError;
  }
}

uint8_t fromWcOpcode(ibv_wc_opcode op) {
  switch (op) {
    case IBV_WC_RDMA_WRITE: return kCqeRdmaWrite;
    case IBV_WC_RDMA_READ: return kCqeRdmaRead;
    case IBV_WC_SEND: return kCqeSend;
    case IBV_WC_RECV: return kCqeRecv;
    case IBV_WC_RECV_RDMA_WITH_IMM: return kCqeRecvRdmaImm;
    default: return 0;
  }
}

// The verbs subset's WQE as an ibv_send_wr (the scatter entry in *sge).
Status toSendWr(const Wqe& w, ibv_sge* sge, ibv_send_wr* wr) {
  *sge = ibv_sge{w.localAddr, w.length, w.lkey};
  *wr = ibv_send_wr{};
  wr->wr_id = w.wrId;
  wr->sg_list = w.length ? sge : nullptr;
  wr->num_sge = w.length ? 1 : 0;
  wr->send_flags =
      ((w.flags & kWqeSignaled) ? IBV_SEND_SIGNALED : 0) | ((w.flags & kWqeFence) ? IBV_SEND_FENCE : 0);
  switch (w.opcode) {
    case kWqeRdmaWrite: wr->opcode = IBV_WR_RDMA_WRITE; break;
    case kWqeRdmaWriteImm: wr->opcode = IBV_WR_RDMA_WRITE_WITH_IMM; break;
    case kWqeSend: wr->opcode = IBV_WR_SEND; break;
    case kWqeSendImm: wr->opcode = IBV_WR_SEND_WITH_IMM; break;
    // The scatter entry is where the read bytes land (the region needs local write).
    case kWqeRdmaRead: wr->opcode = IBV_WR_RDMA_READ; break;
    // No verb: a zero-length RDMA WRITE (no gather entry, no remote access checked) completes
    // in order behind what was posted before, which is all a NOP is for.
    case kWqeNop:
      wr->opcode = IBV_WR_RDMA_WRITE;
      wr->sg_list = nullptr;
      wr->num_sge = 0;
      wr->wr.rdma.remote_addr = 0;
      wr->wr.rdma.rkey = 0;
      return Status::ok();
    default: return makeError(ridgeInvalidArgument, "verbs: unknown WQE opcode %u", w.opcode);
  }
  wr->imm_data = htonl(w.immData);
  wr->wr.rdma.remote_addr = w.remoteAddr;
  wr->wr.rdma.rkey = w.rkey;
  return Status::ok();
}

void wcToCqe(const ibv_wc& wc, Cqe* c) {
  std::memset(c, 0, sizeof *c);
  c->wrId = wc.wr_id;
  c->byteLen = wc.byte_len;
  c->qpn = wc.qp_num;
  c->status = fromWcStatus(wc.status);
  c->opcode = fromWcOpcode(wc.opcode);
  if (wc.wc_flags & IBV_WC_WITH_IMM) {
    c->immData = ntohl(wc.imm_data);
    c->flags = kCqeHasImm;
  }
}

class IbvQp;
class IbvCq;

// The mlx5 syndrome a NIC would report for an ibv_wc status.
uint8_t syndromeOf(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_LOC_LEN_ERR: return mlx5::kSyndLocalLength;
    case IBV_WC_LOC_PROT_ERR: return mlx5::kSyndLocalProt;
    case IBV_WC_WR_FLUSH_ERR: return mlx5::kSyndWrFlush;
    case IBV_WC_BAD_RESP_ERR: return mlx5::kSyndBadResp;
    case IBV_WC_REM_INV_REQ_ERR: return mlx5::kSyndRemoteInvalReq;
    case IBV_WC_REM_ACCESS_ERR: return mlx5::kSyndRemoteAccess;
    case IBV_WC_REM_OP_ERR: return mlx5::kSyndRemoteOp;
    case IBV_WC_RETRY_EXC_ERR: return mlx5::kSyndTransportRetryExc;
    case IBV_WC_RNR_RETRY_EXC_ERR: return mlx5::kSyndRnrRetryExc;
    default: return mlx5::kSyndLocalQpOp;
  }
}

// A completion on its way into an mlx5 CQ ring (the fields encodeCqe takes).
struct RingCqe {
  uint8_t opcode;     // mlx5::CqeOpcode
  uint8_t wqeOpcode;  // requester CQEs: the WQE's mlx5::Opcode
  uint16_t wqeCounter;
  uint32_t qpn;
  uint32_t byteCnt;
  uint32_t imm;
  uint8_t syndrome;
};

// What a NIC writes for `wc` when nothing more is known of the work request (a QP not in ring
// mode on a ring-mode CQ).
RingCqe ringCqeOf(const ibv_wc& wc) {
  RingCqe c{};
  c.qpn = wc.qp_num;
  c.byteCnt = wc.byte_len;
  c.wqeCounter = static_cast<uint16_t>(wc.wr_id);
  const bool recv = (wc.opcode & IBV_WC_RECV) != 0;
  if (wc.status != IBV_WC_SUCCESS) {
    c.opcode = recv ? mlx5::kCqeRespErr : mlx5::kCqeReqErr;
    c.syndrome = syndromeOf(wc.status);
    return c;
  }
  const bool imm = (wc.wc_flags & IBV_WC_WITH_IMM) != 0;
  if (imm) c.imm = ntohl(wc.imm_data);
  switch (wc.opcode) {
    case IBV_WC_RECV_RDMA_WITH_IMM: c.opcode = mlx5::kCqeRespWrImm; break;
    case IBV_WC_RECV: c.opcode = imm ? mlx5::kCqeRespSendImm : mlx5::kCqeRespSend; break;
    case IBV_WC_RDMA_READ: c.wqeOpcode = mlx5::kOpRdmaRead; break;
    case IBV_WC_SEND: c.wqeOpcode = mlx5::kOpSend; break;
    default: c.wqeOpcode = mlx5::kOpRdmaWrite; break;
  }
  return c;
}

// ---- Rings over any rdma-core device ----------------------------------------------------
// The NIC's own rings stay with its driver, so for producers that want raw mlx5 queues
// (mlx5Sq()/mlx5Cq() on a QP or CQ not created through mlx5 direct verbs) the provider keeps
// rings of its own in host memory, in the mlx5 wire format (kernels/gdr/mlx5_wire.h), and a
// proxy thread per device plays the NIC's part: it reads a send queue's big-endian doorbell
// record, decodes the new WQEs, posts each with ibv_post_send (every one signaled, so that it
// knows when each retires), polls the CQs and writes 64-byte mlx5 CQEs into the CQ rings with
// the owner bit: requester CQEs only for WQEs that asked (CQ_UPDATE) and for failures,
// responder CQEs for every receive. A QP or CQ enters this mode with its first
// mlx5Sq()/mlx5Cq() call, before it posts or is polled; its receives (postRecv) are then
// serialized with the thread, its postSend refused. This is the host-staged rung (a CPU
// posts): what works on every rdma-core device.
class RingProxy {
 public:
  ~RingProxy() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  std::mutex mu;  // the thread's passes, ring-mode receives, and the lists below
  void add(IbvQp* qp) {
    qps_.push_back(qp);
    start();
  }
  void add(IbvCq* cq) {
    cqs_.push_back(cq);
    start();
  }
  void remove(IbvQp* qp) { qps_.erase(std::remove(qps_.begin(), qps_.end(), qp), qps_.end()); }
  void remove(IbvCq* cq) { cqs_.erase(std::remove(cqs_.begin(), cqs_.end(), cq), cqs_.end()); }

 private:
  void start() {
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  void run();
  std::vector<IbvQp*> qps_;  // under mu
  std::vector<IbvCq*> cqs_;  // under mu
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class IbvMr final : public MemoryRegion {
 public:
  IbvMr(const IbvApi* api, ibv_mr* mr, bool zeroBased) : api_(api), mr_(mr) {
    addr_ = zeroBased ? 0 : reinterpret_cast<uint64_t>(mr->addr);
    length_ = mr->length;
    lkey_ = mr->lkey;
    rkey_ = mr->rkey;
  }
  ~IbvMr() override { api_->deregMr(mr_); }

 private:
  const IbvApi* api_;
  ibv_mr* mr_;
};

class IbvDm final : public DeviceMemory {
 public:
  IbvDm(const IbvApi* api, ibv_dm* dm, size_t bytes) : api_(api), dm_(dm), bytes_(bytes) {}
  ~IbvDm() override {
    mr_.reset();
    api_->freeDm(dm_);
  }
  size_t size() const override { return bytes_; }
  Status copyTo(size_t offset, const void* src, size_t bytes) override {
    if (offset > bytes_ || bytes > bytes_ - offset)
      return makeError(ridgeInvalidArgument, "verbs: copy outside device memory");
    int rc = api_->memcpyToDm(dm_, offset, src, bytes);
    return rc ? ibvError("ibv_memcpy_to_dm", rc) : Status::ok();
  }
  Status copyFrom(void* dst, size_t offset, size_t bytes) override {
    if (offset > bytes_ || bytes > bytes_ - offset)
      return makeError(ridgeInvalidArgument, "verbs: copy outside device memory");
    int rc = api_->memcpyFromDm(dst, dm_, offset, bytes);
    return rc ? ibvError("ibv_memcpy_from_dm", rc) : Status::ok();
  }
  MemoryRegion* region() override { return mr_.get(); }
  void* mapped() override {
#if defined(RIDGE_HAVE_MLX5DV)
    if (!api_->hasMlx5()) return nullptr;
    mlx5dv_dm out{};
    mlx5dv_obj obj{};
    obj.dm.in = dm_;
    obj.dm.out = &out;
    if (api_->mlx5InitObj(&obj, MLX5DV_OBJ_DM) == 0) return out.buf;
#endif
    return nullptr;
  }

  const IbvApi* api_;
  ibv_dm* dm_;
  size_t bytes_;
  std::unique_ptr<IbvMr> mr_;
};

class IbvCq final : public CompletionQueue {
 public:
  IbvCq(const IbvApi* api, ibv_comp_channel* ch, ibv_cq* cq, RingProxy* proxy, uint32_t entries)
      : api_(api), ch_(ch), cq_(cq), proxy_(proxy), entries_(entries) {}
  ~IbvCq() override {
    if (ringMode_) {
      std::lock_guard<std::mutex> g(proxy_->mu);
      proxy_->remove(this);
    }
    if (unacked_) api_->ackCqEvents(cq_, unacked_);
    api_->destroyCq(cq_);
    api_->destroyCompChannel(ch_);
  }
  int poll(Cqe* out, int max) override;
  void wait(int64_t maxWaitNs, bool (*stillIdle)(void*), void* arg) override {
    if (api_->reqNotifyCq(cq_, 0) != 0) return;
    // A completion that arrived before arming produces no event: re-check first.
    if (stillIdle && !stillIdle(arg)) return;
    pollfd p{ch_->fd, POLLIN, 0};
    // ppoll, not poll: the wait may be shorter than a millisecond (the executor's slices),
    // and poll's millisecond timeout would round it up to one.
    const int64_t ns = std::max<int64_t>(0, maxWaitNs);
    const timespec timeout{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    if (::ppoll(&p, 1, &timeout, nullptr) > 0) {
      ibv_cq* cq = nullptr;
      void* ctx = nullptr;
      if (api_->getCqEvent(ch_, &cq, &ctx) == 0 && ++unacked_ >= 64) {
        api_->ackCqEvents(cq_, unacked_);
        unacked_ = 0;
      }
    }
  }
  // The hardware ring of a CQ from createMlx5Cq, else the proxy's ring in host memory.
  const mlx5::CqView* mlx5Cq() const override {
    return hardware_ ? &view_ : const_cast<IbvCq*>(this)->enterRingMode();
  }
  // Ring mode (RingProxy): one pass of the proxy thread, under proxy_->mu. True when it moved
  // a completion.
  bool drain();
  // A completion the proxy makes itself (a ring WQE the provider refused, a NOP), under
  // proxy_->mu.
  void deliverFromProxy(const RingCqe& c) {
    if (ringMode_) deliver(c);
  }
  std::unordered_map<uint32_t, IbvQp*> qps_;  // under proxy_->mu
  ibv_cq* cq() const { return cq_; }
  // createMlx5Cq: the hardware ring from mlx5dv_init_obj.
  void setHardwareRing(const mlx5::CqView& v) {
    view_ = v;
    hardware_ = true;
  }

 private:
  const mlx5::CqView* enterRingMode();
  void deliver(const RingCqe& c);   // into the ring, or the overflow while the ring is full
  bool tryWrite(const RingCqe& c);  // into the ring if it has room

  const IbvApi* api_;
  ibv_comp_channel* ch_;
  ibv_cq* cq_;
  RingProxy* proxy_;
  uint32_t entries_;
  unsigned unacked_ = 0;
  bool hardware_ = false;
  bool ringMode_ = false;
  std::unique_ptr<mlx5::Cqe64[]> cqes_;
  uint32_t dbrec_[2] = {0, 0};  // [0]: the consumer index, big-endian (mlx5 CQ doorbell record)
  mlx5::CqView view_{};
  uint32_t pi_ = 0;               // the next CQE's index
  std::deque<RingCqe> overflow_;  // completions waiting for the consumer to free entries
};

class IbvQp final : public QueuePair {
 public:
  IbvQp(const IbvApi* api, ibv_qp* qp, ibv_context* ctx, ibv_pd* pd, IbvCq* scq, IbvCq* rcq, uint32_t sqDepth,
        RingProxy* proxy)
      : api_(api), qp_(qp), ctx_(ctx), pd_(pd), scq_(scq), rcq_(rcq), sqDepth_(sqDepth), proxy_(proxy) {
    psn_ = static_cast<uint32_t>(randomNonce()) & 0xffffff;
    std::lock_guard<std::mutex> g(proxy_->mu);
    scq_->qps_[qp_->qp_num] = this;
    rcq_->qps_[qp_->qp_num] = this;
  }
  ~IbvQp() override {
    {
      std::lock_guard<std::mutex> g(proxy_->mu);
      if (ringMode_) proxy_->remove(this);
      scq_->qps_.erase(qp_->qp_num);
      rcq_->qps_.erase(qp_->qp_num);
    }
    if (bounceMr_) api_->deregMr(bounceMr_);
    api_->destroyQp(qp_);
  }
  uint32_t qpn() const override { return qp_->qp_num; }
  // A completion error moves an RC QP to the error state (the NIC does; rdma-core says so
  // only through ibv_query_qp, which this keeps us from calling per poll).
  QpState state() const override { return failed_.load(std::memory_order_acquire) ? QpState::Error : state_; }
  void noteCompletion(const ibv_wc& wc) {
    if (wc.status != IBV_WC_SUCCESS) failed_.store(true, std::memory_order_release);
  }
  Status localAddress(QpAddress* out) const override {
    ibv_port_attr port{};
    if (api_->queryPort(ctx_, kPort, &port) != 0) return ibvError("ibv_query_port", 0);
    IbvAddress a{};
    a.magic = kIbvAddrMagic;
    a.qpn = qp_->qp_num;
    a.psn = psn_;
    a.lid = port.lid;
    a.mtu = static_cast<uint8_t>(port.active_mtu);
    ibv_gid gid{};
    if (api_->queryGid(ctx_, kPort, 0, &gid) == 0) std::memcpy(a.gid, gid.raw, 16);
    bool gidSet = false;
    for (uint8_t b : a.gid) gidSet = gidSet || b != 0;
    a.global = (port.link_layer == IBV_LINK_LAYER_ETHERNET || gidSet) ? 1 : 0;
    std::memset(out, 0, sizeof *out);
    std::memcpy(out->bytes, &a, sizeof a);
    return Status::ok();
  }
  Status modify(QpState to, const QpAddress* remote) override;
  Status postSend(const Wqe& w) override {
    if (state_ != QpState::Rts && state_ != QpState::Error)
      return makeError(ridgeInvalidUsage, "verbs: QP %u: postSend in state %s (needs RTS)", qpn(),
                       qpStateName(state_));
    if (ringMode_)
      return makeError(ridgeInvalidUsage,
                       "verbs: QP %u: postSend on a QP driven through its mlx5 send queue (mlx5Sq())", qpn());
    if (posted_ - retired_ >= sqDepth_) return Status(ridgeInternalError, "verbs: send queue full");
    ibv_sge sge;
    ibv_send_wr wr;
    ibv_send_wr* bad = nullptr;
    RIDGE_TRY(toSendWr(w, &sge, &wr));
    // The NIC sees the send's index (the CQE's wqeCounter, as softnic gives it); poll restores
    // the caller's id. An index's entry is reused only after the queue's depth of later posts,
    // which the slot count above keeps behind its completion.
    if (sendIds_.empty()) sendIds_.resize(roundUpPow2(std::max<uint32_t>(sqDepth_, 1)));
    wr.wr_id = kSendTag | sendIndex_;
    sendIds_[sendIndex_ & (sendIds_.size() - 1)] = w.wrId;
    int rc = api_->postSend(qp_, &wr, &bad);
    if (rc) return ibvError("ibv_post_send", rc);
    ++sendIndex_;
    ++posted_;
    return Status::ok();
  }
  // A completion of postSend's: the caller's id and the WQE's index back.
  // A success also retires every WQE before it (RC completes in order), unsignaled ones too.
  void restoreSend(const ibv_wc& wc, Cqe* c) {
    if (!(wc.wr_id & kSendTag) || sendIds_.empty()) return;
    const uint64_t index = wc.wr_id & ~kSendTag;
    c->wrId = sendIds_[index & (sendIds_.size() - 1)];
    c->wqeCounter = static_cast<uint16_t>(index);
    if (wc.status == IBV_WC_SUCCESS) retired_ = static_cast<uint32_t>(index + 1);
  }
  Status postRecv(const RecvWqe& w) override {
    if (state_ == QpState::Reset)
      return makeError(ridgeInvalidUsage, "verbs: QP %u: postRecv in state RESET (needs INIT or later)",
                       qpn());
    ibv_sge sge{w.addr, w.length, w.lkey};
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = w.wrId;
    wr.sg_list = w.length ? &sge : nullptr;
    wr.num_sge = w.length ? 1 : 0;
    std::unique_lock<std::mutex> g(proxy_->mu, std::defer_lock);
    if (ringMode_) {
      // Receives complete in order: their CQEs carry the receive's index, as an mlx5 NIC's do.
      g.lock();
      wr.wr_id = recvSeq_++;
    }
    int rc = api_->postRecv(qp_, &wr, &bad);
    if (rc && ringMode_) --recvSeq_;
    return rc ? ibvError("ibv_post_recv", rc) : Status::ok();
  }
  // Counted from send completions (a success retires every WQE up to it): callers that post
  // unsignaled work must signal at least one WQE per queue depth. (A QP
  // driven through mlx5Sq() counts its free blocks itself.)
  uint32_t sendSlotsFree() const override { return ringMode_ ? 0 : sqDepth_ - (posted_ - retired_); }
  // The hardware send queue of a QpCaps::mlx5Direct QP, else the proxy's ring in host memory.
  const mlx5::SqView* mlx5Sq() const override {
    return hardware_ ? &view_ : const_cast<IbvQp*>(this)->enterRingMode();
  }
  // createMlx5Qp: the hardware send queue from mlx5dv_init_obj.
  void setHardwareRing(const mlx5::SqView& v) {
    view_ = v;
    hardware_ = true;
  }

  // Ring mode (RingProxy), under proxy_->mu.
  bool ringMode() const { return ringMode_; }
  // Posts what the producer published in the doorbell record; true when it posted any.
  bool pump();
  // A completion of this QP from the NIC, as the CQE the producer sees. False when the
  // producer sees none (an unsignaled success).
  bool translate(const ibv_wc& wc, RingCqe* c);

 private:
  const mlx5::SqView* enterRingMode();
  // Posts the WQE at block `index` (copied out contiguously into `w`); false with *why when the
  // provider refuses it.
  bool submit(const mlx5::WqeBuf& w, uint32_t index, std::string* why);
  void retireNops();  // NOPs at the head of pending_ complete once everything before them has
  static constexpr uint64_t kSendTag = 1ull << 63;  // proxy ids of sends (receives: without)
  static constexpr uint32_t kBounceBytes = 256;     // per block: holds any inline payload
  struct Pending {
    uint16_t index;
    uint8_t opcode;  // mlx5::Opcode
    bool signaled;
    bool nop;  // completed by the proxy, not the NIC (a NOP, or a WQE it refused)
    uint32_t bytes;
    uint8_t syndrome;  // a refused WQE: the error CQE it retires with
  };

  const IbvApi* api_;
  ibv_qp* qp_;
  ibv_context* ctx_;
  ibv_pd* pd_;
  IbvCq* scq_;
  IbvCq* rcq_;
  uint32_t sqDepth_;
  uint32_t psn_ = 0;
  QpState state_ = QpState::Reset;
  uint32_t posted_ = 0;
  uint32_t retired_ = 0;
  std::atomic<bool> failed_{false};
  RingProxy* proxy_;
  bool hardware_ = false;
  // Ring mode: the producer's ring and doorbell record, the bounce buffer inline payloads are
  // posted from, what the proxy took from the ring, and the WQEs on the NIC in order.
  bool ringMode_ = false;
  std::unique_ptr<uint64_t[]> ring_;  // 1 << log2Bbs blocks of 64 bytes
  uint32_t dbrec_[2] = {0, 0};        // [kSendDbrWord]: the producer's block counter, big-endian
  uint64_t uar_ = 0;                  // the "doorbell register": the proxy reads the record instead
  std::unique_ptr<char[]> bounce_;
  ibv_mr* bounceMr_ = nullptr;
  mlx5::SqView view_{};
  uint32_t consumed_ = 0;  // block index the proxy reads next
  uint64_t sendSeq_ = 0;
  std::deque<Pending> pending_;
  uint64_t recvSeq_ = 0;
  // postSend's ids by WQE index (not ring mode).
  std::vector<uint64_t> sendIds_;
  uint64_t sendIndex_ = 0;
};

int IbvCq::poll(Cqe* out, int max) {
  // In ring mode the completions go to the ring (the proxy polls the NIC).
  if (ringMode_) return -1;
  ibv_wc wc[16];
  int total = 0;
  while (total < max) {
    int n = api_->pollCq(cq_, std::min(16, max - total), wc);
    if (n < 0) return total ? total : -1;
    for (int i = 0; i < n; ++i) {
      Cqe& c = out[total + i];
      wcToCqe(wc[i], &c);
      auto owner = qps_.find(wc[i].qp_num);
      if (owner != qps_.end()) {
        owner->second->restoreSend(wc[i], &c);
        owner->second->noteCompletion(wc[i]);
      }
      // Error completions do not carry a valid opcode: the receive side is told apart by
      // the caller's wr_id; send-side retirement counts every non-receive completion.
      // (Send-side retirement: restoreSend, from the WQE index the completion names.)
    }
    total += n;
    if (n < 16) break;
  }
  return total;
}

// ---- ring mode ----

const mlx5::CqView* IbvCq::enterRingMode() {
  std::lock_guard<std::mutex> g(proxy_->mu);
  if (!ringMode_) {
    uint32_t log2 = 0;
    const uint32_t size = roundUpPow2(std::max<uint32_t>(entries_, 2), &log2);
    cqes_ = std::make_unique<mlx5::Cqe64[]>(size);
    // Opcode INVALID everywhere: nothing is valid until written.
    for (uint32_t i = 0; i < size; ++i) {
      std::memset(&cqes_[i], 0, sizeof(mlx5::Cqe64));
      cqes_[i].opOwn = mlx5::kCqeInitOpOwn;
    }
    view_ = mlx5::CqView{cqes_.get(), &dbrec_[0], log2, 0};
    ringMode_ = true;
    proxy_->add(this);
  }
  return &view_;
}

bool IbvCq::tryWrite(const RingCqe& c) {
  const uint32_t size = 1u << view_.log2Size;
  const uint32_t consumer = mlx5::be32(__atomic_load_n(&dbrec_[0], __ATOMIC_ACQUIRE)) & 0xffffffu;
  if (((pi_ - consumer) & 0xffffffu) >= size) return false;
  // Every field first (the entry still shows the old pass's owner or INVALID), then op_own.
  mlx5::Cqe64* e = &cqes_[pi_ & (size - 1)];
  mlx5::encodeCqe(e, c.opcode, c.wqeOpcode, c.wqeCounter, c.qpn, c.byteCnt, c.imm, c.syndrome);
  mlx5::releaseFence();
  __atomic_store_n(&e->opOwn, mlx5::makeOpOwn(c.opcode, pi_, view_.log2Size), __ATOMIC_RELEASE);
  ++pi_;
  return true;
}

void IbvCq::deliver(const RingCqe& c) {
  // In order: behind anything held back, else into the ring while it has room.
  if (!overflow_.empty() || !tryWrite(c)) overflow_.push_back(c);
}

bool IbvCq::drain() {
  bool moved = false;
  // Completions held back while the ring was full, first.
  while (!overflow_.empty() && tryWrite(overflow_.front())) {
    overflow_.pop_front();
    moved = true;
  }
  ibv_wc wc[16];
  const int n = api_->pollCq(cq_, 16, wc);
  for (int i = 0; i < n; ++i) {
    RingCqe c = ringCqeOf(wc[i]);
    auto it = qps_.find(wc[i].qp_num);
    if (it != qps_.end()) it->second->noteCompletion(wc[i]);
    if (it != qps_.end() && it->second->ringMode()) {
      if (!it->second->translate(wc[i], &c)) continue;
    } else {
      Cqe retiring;  // postSend's retirement count, from the WQE index the completion names
      if (it != qps_.end()) it->second->restoreSend(wc[i], &retiring);
    }
    deliver(c);
  }
  return moved || n > 0;
}

const mlx5::SqView* IbvQp::enterRingMode() {
  std::lock_guard<std::mutex> g(proxy_->mu);
  if (!ringMode_) {
    uint32_t log2 = 0;
    const uint32_t blocks = roundUpPow2(std::max<uint32_t>(sqDepth_, 1), &log2);
    // Inline payloads are posted from here (a registered buffer: no provider need support
    // IBV_SEND_INLINE), one slot per block, reused only after the block's WQE retired.
    bounce_ = std::make_unique<char[]>(static_cast<size_t>(blocks) * kBounceBytes);
    bounceMr_ =
        api_->regMr(pd_, bounce_.get(), static_cast<size_t>(blocks) * kBounceBytes, IBV_ACCESS_LOCAL_WRITE);
    if (!bounceMr_) {
      RIDGE_WARN("verbs: QP %u: no mlx5 send queue: ibv_reg_mr of its bounce buffer failed: %s", qpn(),
                 std::strerror(errno));
      return nullptr;
    }
    ring_ = std::make_unique<uint64_t[]>(static_cast<size_t>(blocks) * (mlx5::kWqeBbBytes / 8));
    view_ = mlx5::SqView{reinterpret_cast<uint8_t*>(ring_.get()),
                         &dbrec_[mlx5::kSendDbrWord],
                         &uar_,
                         nullptr,
                         0,
                         log2,
                         qp_->qp_num,
                         0};
    consumed_ = 0;
    ringMode_ = true;
    proxy_->add(this);
  }
  return &view_;
}

bool IbvQp::submit(const mlx5::WqeBuf& w, uint32_t index, std::string* why) {
  mlx5::WqeFields f;
  if (!mlx5::decodeWqe(w.bytes, &f)) {
    *why = "malformed mlx5 WQE";
    return false;
  }
  if (f.wqeIndex != static_cast<uint16_t>(index)) {
    *why = format("WQE index %u at block %u", f.wqeIndex, index & 0xffffu);
    return false;
  }
  const bool signaled = (f.fmCeSe & mlx5::kCtrlCqUpdate) != 0;
  ibv_sge sge{f.laddr, f.bytes, f.lkey};
  if (f.isInline) {
    char* slot = bounce_.get() + static_cast<size_t>(index & ((1u << view_.log2Bbs) - 1u)) * kBounceBytes;
    std::memcpy(slot, w.bytes + f.inlineOffset, f.bytes);
    sge = ibv_sge{reinterpret_cast<uint64_t>(slot), f.bytes, bounceMr_->lkey};
  }
  ibv_send_wr wr{};
  wr.wr_id = kSendTag | sendSeq_;
  wr.sg_list = f.bytes ? &sge : nullptr;
  wr.num_sge = f.bytes ? 1 : 0;
  // Every one signaled: the proxy learns of each retirement (and writes a CQE for those that
  // asked). A NOP is no verb: it completes once everything before it has (RC order).
  wr.send_flags = IBV_SEND_SIGNALED | ((f.fmCeSe & mlx5::kCtrlFence) ? IBV_SEND_FENCE : 0);
  wr.imm_data = htonl(f.imm);
  wr.wr.rdma.remote_addr = f.raddr;
  wr.wr.rdma.rkey = f.rkey;
  switch (f.opcode) {
    case mlx5::kOpNop:
      pending_.push_back({static_cast<uint16_t>(index), f.opcode, signaled, true, 0, 0});
      retireNops();
      return true;
    case mlx5::kOpRdmaWrite: wr.opcode = IBV_WR_RDMA_WRITE; break;
    case mlx5::kOpRdmaWriteImm: wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM; break;
    case mlx5::kOpSend: wr.opcode = IBV_WR_SEND; break;
    case mlx5::kOpSendImm: wr.opcode = IBV_WR_SEND_WITH_IMM; break;
    default: wr.opcode = IBV_WR_RDMA_READ; break;  // decodeWqe admits no other opcode
  }
  ibv_send_wr* bad = nullptr;
  const int rc = api_->postSend(qp_, &wr, &bad);
  if (rc) {
    *why = format("ibv_post_send failed: %s", std::strerror(rc));
    return false;
  }
  ++sendSeq_;
  pending_.push_back({static_cast<uint16_t>(index), f.opcode, signaled, false, f.bytes, 0});
  return true;
}

void IbvQp::retireNops() {
  while (!pending_.empty() && pending_.front().nop) {
    const Pending p = pending_.front();
    pending_.pop_front();
    if (p.syndrome != 0)
      scq_->deliverFromProxy({mlx5::kCqeReqErr, p.opcode, p.index, qpn(), 0, 0, p.syndrome});
    else if (p.signaled)
      scq_->deliverFromProxy({mlx5::kCqeReq, mlx5::kOpNop, p.index, qpn(), 0, 0, 0});
  }
}

bool IbvQp::pump() {
  const uint32_t producer =
      mlx5::be32(__atomic_load_n(&dbrec_[mlx5::kSendDbrWord], __ATOMIC_ACQUIRE)) & 0xffffu;
  const uint32_t mask = (1u << view_.log2Bbs) - 1u;
  bool any = false;
  while ((consumed_ & 0xffffu) != producer) {
    // The WQE's blocks, contiguous (a WQE may wrap around the ring's end).
    mlx5::WqeBuf w;
    const uint64_t* ring = ring_.get();
    std::memcpy(w.bytes, ring + static_cast<size_t>(consumed_ & mask) * 8, mlx5::kWqeBbBytes);
    mlx5::WqeFields ctrl;
    mlx5::decodeCtrl(w.bytes, &ctrl);
    const uint32_t avail = (producer - consumed_) & 0xffffu;
    uint32_t bbs = mlx5::wqeBbs(ctrl.ds);
    if (bbs == 0 || bbs > mlx5::kMaxWqeBbs || bbs > avail) bbs = 1;  // malformed: refused below
    for (uint32_t b = 1; b < bbs; ++b)
      std::memcpy(w.bytes + b * mlx5::kWqeBbBytes, ring + static_cast<size_t>((consumed_ + b) & mask) * 8,
                  mlx5::kWqeBbBytes);
    std::string why;
    if (!submit(w, consumed_, &why)) {
      // Refused before the NIC saw it, so no completion of it will come: retire it here with an
      // error CQE, as an mlx5 NIC reports a bad WQE, so that the producer learns of it and gets
      // its credit.
      RIDGE_WARN("verbs: QP %u: ring WQE at %u not posted: %s", qpn(), consumed_ & 0xffffu, why.c_str());
      pending_.push_back(
          {static_cast<uint16_t>(consumed_), ctrl.opcode, true, true, 0, mlx5::kSyndLocalQpOp});
      retireNops();
    }
    consumed_ += bbs;
    any = true;
  }
  return any;
}

bool IbvQp::translate(const ibv_wc& wc, RingCqe* c) {
  if (wc.wr_id & kSendTag) {
    // Skip past refused WQEs and NOPs already reported (they sit in order with the posted ones).
    retireNops();
    if (pending_.empty()) return true;  // not ours: hand it on as it is
    const Pending p = pending_.front();
    pending_.pop_front();
    c->wqeCounter = p.index;
    c->wqeOpcode = p.opcode;
    c->byteCnt = p.bytes;
    const bool report = p.signaled || wc.status != IBV_WC_SUCCESS;
    if (report) scq_->deliverFromProxy(*c);  // before any NOP behind it
    retireNops();
    return false;
  }
  c->wqeCounter = static_cast<uint16_t>(wc.wr_id);
  return true;
}

void RingProxy::run() {
  int idlePasses = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    bool busy = false;
    {
      std::lock_guard<std::mutex> g(mu);
      for (IbvQp* qp : qps_) busy = qp->pump() || busy;
      for (IbvCq* cq : cqs_) busy = cq->drain() || busy;
    }
    // Spin briefly after work (a producer often posts in bursts), then poll every 20 us.
    if (busy) {
      idlePasses = 0;
    } else if (++idlePasses > 64) {
      const timespec ts{0, 20000};
      nanosleep(&ts, nullptr);
    }
  }
}

Status IbvQp::modify(QpState to, const QpAddress* remote) {
  if (!qpTransitionAllowed(state_, to))
    return makeError(ridgeInvalidUsage, "verbs: QP %u: illegal transition %s -> %s", qpn(),
                     qpStateName(state_), qpStateName(to));
  ibv_qp_attr attr{};
  int mask = IBV_QP_STATE;
  switch (to) {
    case QpState::Reset: attr.qp_state = IBV_QPS_RESET; break;
    case QpState::Error: attr.qp_state = IBV_QPS_ERR; break;
    case QpState::Init:
      attr.qp_state = IBV_QPS_INIT;
      attr.pkey_index = 0;
      attr.port_num = kPort;
      attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
      mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
      break;
    case QpState::Rtr: {
      if (!remote)
        return makeError(ridgeInvalidArgument, "verbs: QP %u: RTR needs the remote address", qpn());
      IbvAddress r;
      std::memcpy(&r, remote->bytes, sizeof r);
      if (r.magic != kIbvAddrMagic)
        return makeError(ridgeInvalidArgument, "verbs: QP %u: the remote address is not a verbs address",
                         qpn());
      QpAddress mineRaw;
      RIDGE_TRY(localAddress(&mineRaw));
      IbvAddress mine;
      std::memcpy(&mine, mineRaw.bytes, sizeof mine);
      attr.qp_state = IBV_QPS_RTR;
      attr.path_mtu = static_cast<ibv_mtu>(std::min(mine.mtu, r.mtu));
      attr.dest_qp_num = r.qpn;
      attr.rq_psn = r.psn;
      attr.max_dest_rd_atomic = 1;
      attr.min_rnr_timer = 12;
      attr.ah_attr.dlid = r.lid;
      attr.ah_attr.port_num = kPort;
      if (r.global) {
        attr.ah_attr.is_global = 1;
        std::memcpy(attr.ah_attr.grh.dgid.raw, r.gid, 16);
        attr.ah_attr.grh.sgid_index = 0;
        attr.ah_attr.grh.hop_limit = 64;
      }
      mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
              IBV_QP_MIN_RNR_TIMER;
      break;
    }
    case QpState::Rts:
      attr.qp_state = IBV_QPS_RTS;
      attr.timeout = 14;
      attr.retry_cnt = 7;
      attr.rnr_retry = 7;
      attr.sq_psn = psn_;
      attr.max_rd_atomic = 1;
      mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
      break;
  }
  int rc = api_->modifyQp(qp_, &attr, mask);
  if (rc) return ibvError(format("ibv_modify_qp to %s", qpStateName(to)).c_str(), rc);
  state_ = to;
  if (to == QpState::Reset) failed_.store(false, std::memory_order_release);
  if (to == QpState::Reset) posted_ = retired_ = 0;
  return Status::ok();
}

class IbvPd final : public ProtectionDomain {
 public:
  IbvPd(const IbvApi* api, ibv_pd* pd, ibv_context* ctx, RingProxy* proxy)
      : api_(api), pd_(pd), ctx_(ctx), proxy_(proxy) {}
  ~IbvPd() override { api_->deallocPd(pd_); }
  Status registerMemory(void* addr, size_t bytes, uint32_t access,
                        std::unique_ptr<MemoryRegion>* out) override {
    ibv_mr* mr = api_->regMr(pd_, addr, bytes, static_cast<int>(toIbvAccess(access)));
    if (!mr) return ibvError("ibv_reg_mr", 0);
    *out = std::make_unique<IbvMr>(api_, mr, false);
    return Status::ok();
  }
  Status registerDmaBuf(int fd, uint64_t offset, size_t bytes, uint64_t iova, uint32_t access,
                        std::unique_ptr<MemoryRegion>* out) override {
    // The seam for GPU memory: rdma-core registers a dma-buf exported by the GPU driver.
    if (!api_->regDmabufMr)
      return makeError(ridgeInvalidUsage,
                       "verbs: this libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or later needed for "
                       "dma-buf registration of GPU memory)");
    ibv_mr* mr = api_->regDmabufMr(pd_, offset, bytes, iova, fd, static_cast<int>(toIbvAccess(access)));
    if (!mr) return ibvError("ibv_reg_dmabuf_mr", 0);
    *out = std::make_unique<IbvMr>(api_, mr, false);
    return Status::ok();
  }
  Status allocDeviceMemory(size_t bytes, uint32_t access, std::unique_ptr<DeviceMemory>* out) override {
    ibv_alloc_dm_attr a{};
    a.length = bytes;
    ibv_dm* dm = api_->allocDm(ctx_, &a);
    if (!dm) return ibvError("ibv_alloc_dm (is there on-NIC memory? see max_dm_size)", 0);
    auto d = std::make_unique<IbvDm>(api_, dm, bytes);
    ibv_mr* mr = api_->regDmMr(pd_, dm, 0, bytes, toIbvAccess(access) | IBV_ACCESS_ZERO_BASED);
    if (!mr) return ibvError("ibv_reg_dm_mr", 0);
    d->mr_ = std::make_unique<IbvMr>(api_, mr, true);
    *out = std::move(d);
    return Status::ok();
  }
  Status createCq(uint32_t entries, std::unique_ptr<CompletionQueue>* out) override {
    ibv_comp_channel* ch = api_->createCompChannel(ctx_);
    if (!ch) return ibvError("ibv_create_comp_channel", 0);
    ibv_cq* cq = api_->createCq(ctx_, static_cast<int>(entries), nullptr, ch, 0);
    if (!cq) {
      Status s = ibvError("ibv_create_cq", 0);
      api_->destroyCompChannel(ch);
      return s;
    }
    *out = std::make_unique<IbvCq>(api_, ch, cq, proxy_, entries);
    return Status::ok();
  }
  Status createQp(CompletionQueue* sendCq, CompletionQueue* recvCq, const QpCaps& caps,
                  std::unique_ptr<QueuePair>* out) override {
    auto* s = dynamic_cast<IbvCq*>(sendCq);
    auto* r = dynamic_cast<IbvCq*>(recvCq);
    if (!s || !r) return makeError(ridgeInvalidArgument, "verbs: createQp needs CQs of the same device");
    ibv_qp_init_attr init{};
    init.send_cq = s->cq();
    init.recv_cq = r->cq();
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = caps.maxSendWr;
    init.cap.max_recv_wr = caps.maxRecvWr;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    if (caps.mlx5Direct) return createMlx5Qp(init, s, r, out);
    ibv_qp* qp = api_->createQp(pd_, &init);
    if (!qp) return ibvError("ibv_create_qp", 0);
    *out = std::make_unique<IbvQp>(api_, qp, ctx_, pd_, s, r, caps.maxSendWr, proxy_);
    return Status::ok();
  }
  Status createMlx5Cq(uint32_t entries, std::unique_ptr<CompletionQueue>* out) override;

 private:
  Status createMlx5Qp(const ibv_qp_init_attr& init, IbvCq* s, IbvCq* r, std::unique_ptr<QueuePair>* out);

  const IbvApi* api_;
  ibv_pd* pd_;
  ibv_context* ctx_;
  RingProxy* proxy_;
};

// "" when mlx5 direct verbs can drive `ctx`'s device, else why not.
std::string mlx5DirectMissing(const IbvApi* api, ibv_context* ctx) {
  if (!api->hasMlx5())
    return "libmlx5 not available (" +
           (api->mlx5Missing.empty() ? std::string("unknown") : api->mlx5Missing) + ")";
#if defined(RIDGE_HAVE_MLX5DV)
  if (!api->mlx5IsSupported(ctx->device))
    return format("%s is not an mlx5 device (mlx5dv_is_supported)", api->getDeviceName(ctx->device));
#endif
  return "";
}

Status IbvPd::createMlx5Cq(uint32_t entries, std::unique_ptr<CompletionQueue>* out) {
  const std::string missing = mlx5DirectMissing(api_, ctx_);
  if (!missing.empty()) return makeError(ridgeInvalidUsage, "verbs: mlx5 direct CQ: %s", missing.c_str());
#if defined(RIDGE_HAVE_MLX5DV)
  ibv_comp_channel* ch = api_->createCompChannel(ctx_);
  if (!ch) return ibvError("ibv_create_comp_channel", 0);
  ibv_cq_init_attr_ex attr{};
  attr.cqe = entries;
  attr.channel = ch;
  // 64-byte CQEs (not the provider's MLX5_CQE_SIZE choice) and no compression: the layout a
  // producer polling the ring itself parses (docs/gdr-write.md, wire format).
  mlx5dv_cq_init_attr dv{};
  dv.comp_mask = MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE;
  dv.cqe_size = 64;
  ibv_cq_ex* cqx = api_->mlx5CreateCq(ctx_, &attr, &dv);
  if (!cqx) {
    Status st = ibvError("mlx5dv_create_cq", 0);
    api_->destroyCompChannel(ch);
    return st;
  }
  ibv_cq* cq = ibv_cq_ex_to_cq(cqx);
  mlx5dv_cq dvcq{};
  mlx5dv_obj obj{};
  obj.cq.in = cq;
  obj.cq.out = &dvcq;
  const int rc = api_->mlx5InitObj(&obj, MLX5DV_OBJ_CQ);
  if (rc != 0) {
    api_->destroyCq(cq);
    api_->destroyCompChannel(ch);
    return ibvError("mlx5dv_init_obj(CQ)", rc);
  }
  uint32_t log2Cqes = 0;
  if (dvcq.cqe_size != sizeof(mlx5::Cqe64) || dvcq.cqe_cnt == 0 ||
      roundUpPow2(dvcq.cqe_cnt, &log2Cqes) != dvcq.cqe_cnt) {
    api_->destroyCq(cq);
    api_->destroyCompChannel(ch);
    return makeError(ridgeSystemError,
                     "verbs: mlx5 direct CQ: %u CQEs of %u bytes (needs a power of two of 64)", dvcq.cqe_cnt,
                     dvcq.cqe_size);
  }
  auto c = std::make_unique<IbvCq>(api_, ch, cq, proxy_, entries);
  // The hardware ring as the one raw-queue view (mlx5_wire.h): its CQEs and consumer-index word.
  c->setHardwareRing(mlx5::CqView{static_cast<mlx5::Cqe64*>(dvcq.buf), dvcq.dbrec, log2Cqes, dvcq.cqn});
  *out = std::move(c);
  return Status::ok();
#else
  return makeError(ridgeInvalidUsage, "verbs: mlx5 direct CQ: this build has no infiniband/mlx5dv.h");
#endif
}

Status IbvPd::createMlx5Qp(const ibv_qp_init_attr& init, IbvCq* s, IbvCq* r,
                           std::unique_ptr<QueuePair>* out) {
  const std::string missing = mlx5DirectMissing(api_, ctx_);
  if (!missing.empty()) return makeError(ridgeInvalidUsage, "verbs: mlx5 direct QP: %s", missing.c_str());
#if defined(RIDGE_HAVE_MLX5DV)
  ibv_qp_init_attr_ex ex{};
  ex.send_cq = init.send_cq;
  ex.recv_cq = init.recv_cq;
  ex.cap = init.cap;
  ex.qp_type = IBV_QPT_RC;
  ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  ex.pd = pd_;
  // Receives of small payloads stay in their buffers (no scatter into the CQE), so every CQE a
  // producer parses has the one layout.
  mlx5dv_qp_init_attr dv{};
  dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS;
  dv.create_flags = MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE;
  ibv_qp* qp = api_->mlx5CreateQp(ctx_, &ex, &dv);
  if (!qp) return ibvError("mlx5dv_create_qp", 0);
  mlx5dv_qp dvqp{};
  mlx5dv_obj obj{};
  obj.qp.in = qp;
  obj.qp.out = &dvqp;
  const int rc = api_->mlx5InitObj(&obj, MLX5DV_OBJ_QP);
  if (rc != 0) {
    api_->destroyQp(qp);
    return ibvError("mlx5dv_init_obj(QP)", rc);
  }
  if (!dvqp.sq.buf || dvqp.sq.wqe_cnt == 0 || !dvqp.dbrec || !dvqp.bf.reg) {
    api_->destroyQp(qp);
    return makeError(ridgeSystemError,
                     "verbs: mlx5dv_init_obj(QP) gave no send queue, doorbell record or UAR");
  }
  uint32_t log2Bbs = 0;
  if (dvqp.sq.stride != mlx5::kWqeBbBytes || roundUpPow2(dvqp.sq.wqe_cnt, &log2Bbs) != dvqp.sq.wqe_cnt) {
    api_->destroyQp(qp);
    return makeError(ridgeSystemError,
                     "verbs: mlx5 direct QP: %u send blocks of %u bytes (needs a power of two of 64)",
                     dvqp.sq.wqe_cnt, dvqp.sq.stride);
  }
  auto q = std::make_unique<IbvQp>(api_, qp, ctx_, pd_, s, r, init.cap.max_send_wr, proxy_);
  // The hardware send queue as the one raw-queue view (mlx5_wire.h): the doorbell record's send
  // word, the BlueFlame register as both the doorbell and the BlueFlame buffer.
  q->setHardwareRing(mlx5::SqView{static_cast<uint8_t*>(dvqp.sq.buf), &dvqp.dbrec[mlx5::kSendDbrWord],
                                  static_cast<uint64_t*>(dvqp.bf.reg), static_cast<uint8_t*>(dvqp.bf.reg),
                                  dvqp.bf.size, log2Bbs, qp->qp_num, 0});
  *out = std::move(q);
  return Status::ok();
#else
  return makeError(ridgeInvalidUsage, "verbs: mlx5 direct QP: this build has no infiniband/mlx5dv.h");
#endif
}

bool queryAttributes(const IbvApi* api_, ibv_context* ctx, const char* name, DeviceAttributes* a) {
  ibv_device_attr_ex ex{};
  if (api_->queryDeviceEx(ctx, &ex) != 0) return false;
  ibv_port_attr port{};
  if (api_->queryPort(ctx, kPort, &port) != 0) return false;
  a->name = name;
  a->provider = "verbs";
  a->maxMrBytes = ex.orig_attr.max_mr_size;
  a->maxQpWr = static_cast<uint32_t>(ex.orig_attr.max_qp_wr);
  a->maxCqe = static_cast<uint32_t>(ex.orig_attr.max_cqe);
  a->maxDeviceMemoryBytes = ex.max_dm_size;
  a->portCount = ex.orig_attr.phys_port_cnt;
  a->portActive = port.state == IBV_PORT_ACTIVE;
  a->mtuBytes = 128u << port.active_mtu;
  return true;
}

class IbvDevice final : public Device {
 public:
  IbvDevice(const IbvApi* api, ibv_context* ctx, DeviceAttributes attr)
      : api_(api), ctx_(ctx), attr_(std::move(attr)) {}
  ~IbvDevice() override {
    proxy_.reset();  // its thread stops before the device closes
    api_->closeDevice(ctx_);
  }
  const DeviceAttributes& attributes() const override { return attr_; }
  Status allocPd(std::unique_ptr<ProtectionDomain>* out) override {
    ibv_pd* pd = api_->allocPd(ctx_);
    if (!pd) return ibvError("ibv_alloc_pd", 0);
    *out = std::make_unique<IbvPd>(api_, pd, ctx_, proxy_.get());
    return Status::ok();
  }
  const IbvApi* api() const { return api_; }
  ibv_context* context() const { return ctx_; }

 private:
  const IbvApi* api_;
  ibv_context* ctx_;
  std::unique_ptr<RingProxy> proxy_ = std::make_unique<RingProxy>();
  DeviceAttributes attr_;
};

class IbvProvider final : public Provider {
 public:
  explicit IbvProvider(const IbvApi* api) : api_(api) {}
  const char* name() const override { return "verbs"; }
  Status listDevices(std::vector<DeviceAttributes>* out) override {
    out->clear();
    int n = 0;
    ibv_device** list = api_->getDeviceList(&n);
    if (!list) return ibvError("ibv_get_device_list", 0);
    for (int i = 0; i < n; ++i) {
      DeviceAttributes a;
      a.name = api_->getDeviceName(list[i]);
      a.provider = "verbs";
      if (ibv_context* ctx = api_->openDevice(list[i])) {
        queryAttributes(api_, ctx, a.name.c_str(), &a);
        api_->closeDevice(ctx);
      }
      out->push_back(a);
    }
    api_->freeDeviceList(list);
    return Status::ok();
  }
  Status open(int index, std::unique_ptr<Device>* out) override {
    int n = 0;
    ibv_device** list = api_->getDeviceList(&n);
    if (!list) return ibvError("ibv_get_device_list", 0);
    if (index < 0 || index >= n) {
      api_->freeDeviceList(list);
      return makeError(ridgeInvalidArgument, "verbs: no RDMA device %d (%d found)", index, n);
    }
    const std::string name = api_->getDeviceName(list[index]);
    ibv_context* ctx = api_->openDevice(list[index]);
    api_->freeDeviceList(list);
    if (!ctx) return ibvError(format("ibv_open_device(%s)", name.c_str()).c_str(), 0);
    DeviceAttributes a;
    if (!queryAttributes(api_, ctx, name.c_str(), &a)) {
      api_->closeDevice(ctx);
      return ibvError("ibv_query_device_ex/ibv_query_port", 0);
    }
    auto device = std::make_unique<IbvDevice>(api_, ctx, a);
    logGdrLadderAtOpen(device.get());
    *out = std::move(device);
    return Status::ok();
  }

 private:
  // With a GDR mode selected, say at init which ladder rung the device allows (RIDGE_DEBUG=INFO).
  void logGdrLadderAtOpen(Device* device) {
    const std::string mode = settingString(Setting::GDR_MODE);
    if (mode.empty() || mode == "off" || mode == "OFF") return;
    if (logLevel() < LogLevel::Info) return;
    const GdrLadderDecision d = decideGdrLadder(probeGdrLadder(device, device::activeRuntime(), 0));
    RIDGE_INFO("verbs: %s: gdr-write ladder: %s", device->attributes().name.c_str(),
               gdrLadderLine(d).c_str());
  }

  const IbvApi* api_;
};

}  // namespace

namespace {

// The load error without its "verbs: rdma-core not found: " lead (the ladder says that).
std::string loadFailure(const Status& st) {
  const std::string lead = "verbs: rdma-core not found: ";
  const std::string& m = st.message();
  return m.compare(0, lead.size(), lead) == 0 ? m.substr(lead.size()) : m;
}

using HostRangeKind = device::DeviceRuntime::HostRangeKind;

// The GPU mapping part of the probe: the rings and UAR of `qp`/`cq`, and on-NIC memory.
void probeGpuMappings(IbvDevice* d, ProtectionDomain* pd, QueuePair* qp, CompletionQueue* cq,
                      device::DeviceRuntime* rt, uint64_t stagingBytes, GdrLadderFacts* f) {
  GpuRingMapping mapping(rt);
  const mlx5::SqView& sq = *qp->mlx5Sq();
  const mlx5::CqView& cqv = *cq->mlx5Cq();
  uint64_t dev = 0;
  // The whole doorbell record (the send word is its second): the page a GPU maps holds both.
  Status st =
      mapping.map(sq.ring, static_cast<size_t>(mlx5::kWqeBbBytes) << sq.log2Bbs, HostRangeKind::Memory, &dev);
  if (st.isOk()) st = mapping.map(sq.dbrec - mlx5::kSendDbrWord, 8, HostRangeKind::Memory, &dev);
  if (st.isOk()) st = mapping.map(cqv.cqes, sizeof(mlx5::Cqe64) << cqv.log2Size, HostRangeKind::Memory, &dev);
  if (st.isOk()) st = mapping.map(cqv.dbrec, 8, HostRangeKind::Memory, &dev);
  f->ringsMappedForGpu = st.isOk() ? FactWhy::yes() : FactWhy::no(st.message());
  st = mapping.map(sq.uarDoorbell, 8, HostRangeKind::IoMemory, &dev);
  f->uarMappedForGpu = st.isOk() ? FactWhy::yes() : FactWhy::no(st.message());

  const uint64_t maxDm = d->attributes().maxDeviceMemoryBytes;
  if (maxDm == 0) {
    f->nicMemoryMappedForGpu = FactWhy::no("the NIC has no on-NIC memory (max_dm_size 0)");
    return;
  }
  // Without a staging size (the probe at device open) one page says whether mapping works.
  const uint64_t bytes = stagingBytes ? std::min(stagingBytes, maxDm) : std::min<uint64_t>(maxDm, 4096);
  std::unique_ptr<DeviceMemory> dm;
  st = pd->allocDeviceMemory(bytes, kAccessLocalWrite, &dm);
  if (st.isOk() && !dm->mapped())
    st = makeError(ridgeInvalidUsage, "mlx5dv_init_obj(DM) gave no mapping of the on-NIC memory");
  if (st.isOk()) st = mapping.map(dm->mapped(), bytes, HostRangeKind::IoMemory, &dev);
  f->nicMemoryMappedForGpu = st.isOk() ? FactWhy::yes() : FactWhy::no(st.message());
  // `mapping` unmaps everything here, before `dm` is freed.
}

}  // namespace

GdrLadderFacts gdrLadderFactsWithoutDevice() {
  GdrLadderFacts f;
  const IbvApi* api = nullptr;
  Status st = ibvApi(&api);
  if (!st.isOk()) {
    f.rdmaCore = FactWhy::no(loadFailure(st));
    return f;
  }
  f.rdmaCore = FactWhy::yes();
  if (!api->hasMlx5()) f.directQueues = FactWhy::no("libmlx5 not available (" + api->mlx5Missing + ")");
  return f;
}

GdrLadderFacts probeGdrLadder(Device* device, device::DeviceRuntime* runtime, uint64_t stagingBytes) {
  GdrLadderFacts f;
  auto* d = dynamic_cast<IbvDevice*>(device);
  if (!d) {
    f.rdmaCore =
        FactWhy::no(format("%s is a %s device, not an rdma-core one", device->attributes().name.c_str(),
                           device->attributes().provider.c_str()));
    return f;
  }
  f.rdmaCore = FactWhy::yes();
  f.nicMemoryBytes = d->attributes().maxDeviceMemoryBytes;
  f.stagingBytesNeeded = stagingBytes;
  if (!runtime)
    f.gpu = FactWhy::no("no device runtime (a build without CUDA)");
  else if (runtime->deviceCount() == 0)
    f.gpu = FactWhy::no(format("the %s runtime sees no device", runtime->name()));
  else
    f.gpu = FactWhy::yes();

  const std::string missing = mlx5DirectMissing(d->api(), d->context());
  if (!missing.empty()) {
    f.directQueues = FactWhy::no(missing);
    return f;
  }
  // The same calls the transport makes: a PD, a CQ and a QP through mlx5 direct verbs.
  std::unique_ptr<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<QueuePair> qp;
  Status st = d->allocPd(&pd);
  if (st.isOk()) st = pd->createMlx5Cq(16, &cq);
  if (st.isOk()) {
    QpCaps caps;
    caps.maxSendWr = 16;
    caps.maxRecvWr = 16;
    caps.mlx5Direct = true;
    st = pd->createQp(cq.get(), cq.get(), caps, &qp);
  }
  if (!st.isOk()) {
    f.directQueues = FactWhy::no(st.message());
    return f;
  }
  f.directQueues = FactWhy::yes(format("send queue of %u blocks, %u 64-byte CQEs",
                                       1u << qp->mlx5Sq()->log2Bbs, 1u << cq->mlx5Cq()->log2Size));
  if (f.gpu.value == Fact::Yes) probeGpuMappings(d, pd.get(), qp.get(), cq.get(), runtime, stagingBytes, &f);
  return f;
}

Status createIbvProvider(std::unique_ptr<Provider>* out) {
  const IbvApi* api = nullptr;
  RIDGE_TRY(ibvApi(&api));
  *out = std::make_unique<IbvProvider>(api);
  return Status::ok();
}

}  // namespace verbs
}  // namespace ridge
