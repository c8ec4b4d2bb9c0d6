// The rdma-core provider: the verbs subset over libibverbs, for real RDMA NICs.
//
// Work requests are translated from the shared Wqe layout into ibv_send_wr at postSend,
// and ibv_wc into Cqe at poll: the NIC's own rings stay private to the vendor driver here
// (sendRing()/ring() return nullptr), so GPU-side producers need the mlx5 direct path of
// the next issue. mlx5dv is used only to give device memory a CPU mapping where the
// header and library exist; everything else is plain verbs.
//
// Connection setup uses port 1 and GID index 0 (global routing when the port is Ethernet,
// i.e. RoCE, or the GID is set), a random 24-bit PSN, the smaller of both active MTUs,
// and infinite RNR retries (the transports keep receives posted, a short RNR is a
// scheduling hiccup rather than an error).
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_map>

#if defined(RIDGE_HAVE_MLX5DV)
#include <infiniband/mlx5dv.h>
#endif

#include "bootstrap/bootstrap.h"
#include "core/log.h"
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

class IbvQp;

class IbvMr final : public MemoryRegion {
 public:
  explicit IbvMr(ibv_mr* mr, bool zeroBased) : mr_(mr) {
    addr_ = zeroBased ? 0 : reinterpret_cast<uint64_t>(mr->addr);
    length_ = mr->length;
    lkey_ = mr->lkey;
    rkey_ = mr->rkey;
  }
  ~IbvMr() override { ibv_dereg_mr(mr_); }

 private:
  ibv_mr* mr_;
};

class IbvDm final : public DeviceMemory {
 public:
  IbvDm(ibv_dm* dm, size_t bytes) : dm_(dm), bytes_(bytes) {}
  ~IbvDm() override {
    mr_.reset();
    ibv_free_dm(dm_);
  }
  size_t size() const override { return bytes_; }
  Status copyTo(size_t offset, const void* src, size_t bytes) override {
    if (offset > bytes_ || bytes > bytes_ - offset)
      return makeError(ridgeInvalidArgument, "verbs: copy outside device memory");
    int rc = ibv_memcpy_to_dm(dm_, offset, src, bytes);
    return rc ? ibvError("ibv_memcpy_to_dm", rc) : Status::ok();
  }
  Status copyFrom(void* dst, size_t offset, size_t bytes) override {
    if (offset > bytes_ || bytes > bytes_ - offset)
      return makeError(ridgeInvalidArgument, "verbs: copy outside device memory");
    int rc = ibv_memcpy_from_dm(dst, dm_, offset, bytes);
    return rc ? ibvError("ibv_memcpy_from_dm", rc) : Status::ok();
  }
  MemoryRegion* region() override { return mr_.get(); }
  void* mapped() override {
#if defined(RIDGE_HAVE_MLX5DV)
    mlx5dv_dm out{};
    mlx5dv_obj obj{};
    obj.dm.in = dm_;
    obj.dm.out = &out;
    if (mlx5dv_init_obj(&obj, MLX5DV_OBJ_DM) == 0) return out.buf;
#endif
    return nullptr;
  }

  ibv_dm* dm_;
  size_t bytes_;
  std::unique_ptr<IbvMr> mr_;
};

class IbvCq final : public CompletionQueue {
 public:
  IbvCq(ibv_comp_channel* ch, ibv_cq* cq) : ch_(ch), cq_(cq) {}
  ~IbvCq() override {
    if (unacked_) ibv_ack_cq_events(cq_, unacked_);
    ibv_destroy_cq(cq_);
    ibv_destroy_comp_channel(ch_);
  }
  int poll(Cqe* out, int max) override;
  void wait(int64_t maxWaitNs, bool (*stillIdle)(void*), void* arg) override {
    if (ibv_req_notify_cq(cq_, 0) != 0) return;
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
      if (ibv_get_cq_event(ch_, &cq, &ctx) == 0 && ++unacked_ >= 64) {
        ibv_ack_cq_events(cq_, unacked_);
        unacked_ = 0;
      }
    }
  }
  std::unordered_map<uint32_t, IbvQp*> qps_;
  ibv_cq* cq() const { return cq_; }

 private:
  ibv_comp_channel* ch_;
  ibv_cq* cq_;
  unsigned unacked_ = 0;
};

class IbvQp final : public QueuePair {
 public:
  IbvQp(ibv_qp* qp, ibv_context* ctx, IbvCq* scq, IbvCq* rcq, uint32_t sqDepth)
      : qp_(qp), ctx_(ctx), scq_(scq), rcq_(rcq), sqDepth_(sqDepth) {
    psn_ = static_cast<uint32_t>(randomNonce()) & 0xffffff;
    scq_->qps_[qp_->qp_num] = this;
    rcq_->qps_[qp_->qp_num] = this;
  }
  ~IbvQp() override {
    scq_->qps_.erase(qp_->qp_num);
    rcq_->qps_.erase(qp_->qp_num);
    ibv_destroy_qp(qp_);
  }
  uint32_t qpn() const override { return qp_->qp_num; }
  QpState state() const override { return state_; }
  Status localAddress(QpAddress* out) const override {
    ibv_port_attr port{};
    if (ibv_query_port(ctx_, kPort, &port) != 0) return ibvError("ibv_query_port", 0);
    IbvAddress a{};
    a.magic = kIbvAddrMagic;
    a.qpn = qp_->qp_num;
    a.psn = psn_;
    a.lid = port.lid;
    a.mtu = static_cast<uint8_t>(port.active_mtu);
    ibv_gid gid{};
    if (ibv_query_gid(ctx_, kPort, 0, &gid) == 0) std::memcpy(a.gid, gid.raw, 16);
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
    if (posted_ - retired_ >= sqDepth_) return Status(ridgeInternalError, "verbs: send queue full");
    ibv_sge sge{w.localAddr, w.length, w.lkey};
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = w.wrId;
    wr.sg_list = w.length ? &sge : nullptr;
    wr.num_sge = w.length ? 1 : 0;
    wr.send_flags =
        ((w.flags & kWqeSignaled) ? IBV_SEND_SIGNALED : 0) | ((w.flags & kWqeFence) ? IBV_SEND_FENCE : 0);
    switch (w.opcode) {
      case kWqeRdmaWrite: wr.opcode = IBV_WR_RDMA_WRITE; break;
      case kWqeRdmaWriteImm: wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM; break;
      case kWqeSend: wr.opcode = IBV_WR_SEND; break;
      case kWqeSendImm: wr.opcode = IBV_WR_SEND_WITH_IMM; break;
      // The scatter entry is where the read bytes land (the region needs local write).
      case kWqeRdmaRead: wr.opcode = IBV_WR_RDMA_READ; break;
      default: return makeError(ridgeInvalidArgument, "verbs: unknown WQE opcode %u", w.opcode);
    }
    wr.imm_data = htonl(w.immData);
    wr.wr.rdma.remote_addr = w.remoteAddr;
    wr.wr.rdma.rkey = w.rkey;
    int rc = ibv_post_send(qp_, &wr, &bad);
    if (rc) return ibvError("ibv_post_send", rc);
    ++posted_;
    return Status::ok();
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
    int rc = ibv_post_recv(qp_, &wr, &bad);
    return rc ? ibvError("ibv_post_recv", rc) : Status::ok();
  }
  // Counted from send completions: the provider cannot see unsignaled WQEs retire, so
  // callers that post unsignaled work must signal at least one WQE per queue depth.
  uint32_t sendSlotsFree() const override { return sqDepth_ - (posted_ - retired_); }
  void retired() { ++retired_; }

 private:
  ibv_qp* qp_;
  ibv_context* ctx_;
  IbvCq* scq_;
  IbvCq* rcq_;
  uint32_t sqDepth_;
  uint32_t psn_ = 0;
  QpState state_ = QpState::Reset;
  uint32_t posted_ = 0;
  uint32_t retired_ = 0;
};

int IbvCq::poll(Cqe* out, int max) {
  ibv_wc wc[16];
  int total = 0;
  while (total < max) {
    int n = ibv_poll_cq(cq_, std::min(16, max - total), wc);
    if (n < 0) return total ? total : -1;
    for (int i = 0; i < n; ++i) {
      Cqe& c = out[total + i];
      std::memset(&c, 0, sizeof c);
      c.wrId = wc[i].wr_id;
      c.byteLen = wc[i].byte_len;
      c.qpn = wc[i].qp_num;
      c.status = fromWcStatus(wc[i].status);
      c.opcode = fromWcOpcode(wc[i].opcode);
      if (wc[i].wc_flags & IBV_WC_WITH_IMM) {
        c.immData = ntohl(wc[i].imm_data);
        c.flags = kCqeHasImm;
      }
      // Error completions do not carry a valid opcode: the receive side is told apart by
      // the caller's wr_id; send-side retirement counts every non-receive completion.
      const bool recv = c.opcode == kCqeRecv || c.opcode == kCqeRecvRdmaImm;
      if (!recv && c.status == kCqeOk) {
        auto it = qps_.find(c.qpn);
        if (it != qps_.end()) it->second->retired();
      }
    }
    total += n;
    if (n < 16) break;
  }
  return total;
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
  int rc = ibv_modify_qp(qp_, &attr, mask);
  if (rc) return ibvError(format("ibv_modify_qp to %s", qpStateName(to)).c_str(), rc);
  state_ = to;
  if (to == QpState::Reset) posted_ = retired_ = 0;
  return Status::ok();
}

class IbvPd final : public ProtectionDomain {
 public:
  IbvPd(ibv_pd* pd, ibv_context* ctx) : pd_(pd), ctx_(ctx) {}
  ~IbvPd() override { ibv_dealloc_pd(pd_); }
  Status registerMemory(void* addr, size_t bytes, uint32_t access,
                        std::unique_ptr<MemoryRegion>* out) override {
    ibv_mr* mr = ibv_reg_mr(pd_, addr, bytes, static_cast<int>(toIbvAccess(access)));
    if (!mr) return ibvError("ibv_reg_mr", 0);
    *out = std::make_unique<IbvMr>(mr, false);
    return Status::ok();
  }
  Status registerDmaBuf(int fd, uint64_t offset, size_t bytes, uint64_t iova, uint32_t access,
                        std::unique_ptr<MemoryRegion>* out) override {
    // The seam for GPU memory: rdma-core registers a dma-buf exported by the GPU driver.
    ibv_mr* mr = ibv_reg_dmabuf_mr(pd_, offset, bytes, iova, fd, static_cast<int>(toIbvAccess(access)));
    if (!mr) return ibvError("ibv_reg_dmabuf_mr", 0);
    *out = std::make_unique<IbvMr>(mr, false);
    return Status::ok();
  }
  Status allocDeviceMemory(size_t bytes, uint32_t access, std::unique_ptr<DeviceMemory>* out) override {
    ibv_alloc_dm_attr a{};
    a.length = bytes;
    ibv_dm* dm = ibv_alloc_dm(ctx_, &a);
    if (!dm) return ibvError("ibv_alloc_dm (is there on-NIC memory? see max_dm_size)", 0);
    auto d = std::make_unique<IbvDm>(dm, bytes);
    ibv_mr* mr = ibv_reg_dm_mr(pd_, dm, 0, bytes, toIbvAccess(access) | IBV_ACCESS_ZERO_BASED);
    if (!mr) return ibvError("ibv_reg_dm_mr", 0);
    d->mr_ = std::make_unique<IbvMr>(mr, true);
    *out = std::move(d);
    return Status::ok();
  }
  Status createCq(uint32_t entries, std::unique_ptr<CompletionQueue>* out) override {
    ibv_comp_channel* ch = ibv_create_comp_channel(ctx_);
    if (!ch) return ibvError("ibv_create_comp_channel", 0);
    ibv_cq* cq = ibv_create_cq(ctx_, static_cast<int>(entries), nullptr, ch, 0);
    if (!cq) {
      Status s = ibvError("ibv_create_cq", 0);
      ibv_destroy_comp_channel(ch);
      return s;
    }
    *out = std::make_unique<IbvCq>(ch, cq);
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
    ibv_qp* qp = ibv_create_qp(pd_, &init);
    if (!qp) return ibvError("ibv_create_qp", 0);
    *out = std::make_unique<IbvQp>(qp, ctx_, s, r, caps.maxSendWr);
    return Status::ok();
  }

 private:
  ibv_pd* pd_;
  ibv_context* ctx_;
};

bool queryAttributes(ibv_context* ctx, const char* name, DeviceAttributes* a) {
  ibv_device_attr_ex ex{};
  if (ibv_query_device_ex(ctx, nullptr, &ex) != 0) return false;
  ibv_port_attr port{};
  if (ibv_query_port(ctx, kPort, &port) != 0) return false;
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
  IbvDevice(ibv_context* ctx, DeviceAttributes attr) : ctx_(ctx), attr_(std::move(attr)) {}
  ~IbvDevice() override { ibv_close_device(ctx_); }
  const DeviceAttributes& attributes() const override { return attr_; }
  Status allocPd(std::unique_ptr<ProtectionDomain>* out) override {
    ibv_pd* pd = ibv_alloc_pd(ctx_);
    if (!pd) return ibvError("ibv_alloc_pd", 0);
    *out = std::make_unique<IbvPd>(pd, ctx_);
    return Status::ok();
  }

 private:
  ibv_context* ctx_;
  DeviceAttributes attr_;
};

class IbvProvider final : public Provider {
 public:
  const char* name() const override { return "verbs"; }
  Status listDevices(std::vector<DeviceAttributes>* out) override {
    out->clear();
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list) return ibvError("ibv_get_device_list", 0);
    for (int i = 0; i < n; ++i) {
      DeviceAttributes a;
      a.name = ibv_get_device_name(list[i]);
      a.provider = "verbs";
      if (ibv_context* ctx = ibv_open_device(list[i])) {
        queryAttributes(ctx, a.name.c_str(), &a);
        ibv_close_device(ctx);
      }
      out->push_back(a);
    }
    ibv_free_device_list(list);
    return Status::ok();
  }
  Status open(int index, std::unique_ptr<Device>* out) override {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list) return ibvError("ibv_get_device_list", 0);
    if (index < 0 || index >= n) {
      ibv_free_device_list(list);
      return makeError(ridgeInvalidArgument, "verbs: no RDMA device %d (%d found)", index, n);
    }
    const std::string name = ibv_get_device_name(list[index]);
    ibv_context* ctx = ibv_open_device(list[index]);
    ibv_free_device_list(list);
    if (!ctx) return ibvError(format("ibv_open_device(%s)", name.c_str()).c_str(), 0);
    DeviceAttributes a;
    if (!queryAttributes(ctx, name.c_str(), &a)) {
      ibv_close_device(ctx);
      return ibvError("ibv_query_device_ex/ibv_query_port", 0);
    }
    *out = std::make_unique<IbvDevice>(ctx, a);
    return Status::ok();
  }
};

}  // namespace

Status createIbvProvider(std::unique_ptr<Provider>* out) {
  *out = std::make_unique<IbvProvider>();
  return Status::ok();
}

}  // namespace verbs
}  // namespace ridge
