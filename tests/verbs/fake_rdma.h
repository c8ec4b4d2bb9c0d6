// A fake rdma-core for tests: every entry of the provider's function table (ibv_api.h) answered
// by a test double, over one fake mlx5 device. It creates what the provider asks for, counts
// creations and destructions (balanced() after teardown), fails where a test sets a knob, and
// carries data like a loopback NIC: RDMA WRITE (with immediate), SEND and RDMA READ between its
// queue pairs are done at post time, against registered regions, with the completions a NIC
// would write. Queues created through mlx5 direct verbs get rings of their own (send queue,
// doorbell records, CQ, a UAR page), which fakeServeDirectRings() executes as a NIC would: the
// WQEs the doorbell record publishes, once the UAR doorbell was written, with mlx5 CQEs for
// those that ask. Include only where RIDGE_HAVE_VERBS and RIDGE_HAVE_MLX5DV are defined.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "kernels/gdr/mlx5_wire.h"
#include "transports/verbs/ibv_api.h"

namespace ridge {
namespace verbs_test {

using namespace verbs;

inline size_t pageBytes() {
  return static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// The fake NIC: objects the doubles hand out, knobs that make a call fail, and counts of
// creations and destructions.
struct FakeNic {
  ibv_device device{};
  ibv_device* list[2] = {&device, nullptr};
  ibv_context context{};
  ibv_pd pd{};
  ibv_comp_channel channel{};
  // Queue pairs, CQs and regions the doubles created (deques: addresses stay put). A QP's
  // index is qp_num - kFirstQpn.
  static constexpr uint32_t kFirstQpn = 0x1234;
  struct Qp {
    ibv_qp qp{};
    ibv_cq* sendCq = nullptr;
    ibv_cq* recvCq = nullptr;
    uint32_t destQpn = 0;
    std::deque<std::pair<ibv_recv_wr, ibv_sge>> recvs;
  };
  std::deque<Qp> qpObjs;
  struct Cq {
    ibv_cq cq{};
    std::deque<ibv_wc> wcs;
    bool armed = false;
  };
  std::deque<Cq> cqObjs;
  std::deque<ibv_mr> mrObjs;
  std::deque<bool> mrZeroBased;  // by mrObjs index: on-NIC memory, addressed by offset
  // On-NIC memory: page-aligned host buffers standing in for the NIC's BAR.
  struct Dm {
    ibv_dm dm{};
    char* buf = nullptr;
    size_t bytes = 0;
  };
  std::deque<Dm> dmObjs;
  std::vector<uint32_t> writeImmLengths;  // of every RDMA WRITE WITH IMMEDIATE carried
  // Every double holds this: ranks of a test may be threads that share the fake NIC.
  std::recursive_mutex mu;
  // Ring memory as libmlx5 would allocate it, and the UAR page: the first direct QP's and CQ's
  // (later ones get pages of their own, so that ranks of a test map disjoint rings).
  char* sq = nullptr;
  char* dbrecPage = nullptr;
  char* cqBuf = nullptr;
  char* uarPage = nullptr;
  struct DirectQp {
    ibv_qp* qp = nullptr;
    char* sq = nullptr;
    char* dbrec = nullptr;  // the QP's doorbell record (receive word, send word)
    char* bf = nullptr;     // the BlueFlame register, also the UAR doorbell
    uint32_t wqeCnt = 0;
    uint32_t ci = 0;        // WQEs executed (blocks)
    uint64_t lastRung = 0;  // the doorbell word last seen in the UAR
    bool destroyed = false;
  };
  struct DirectCq {
    ibv_cq_ex cqx{};
    char* buf = nullptr;
    char* dbrec = nullptr;
    uint32_t cqeCnt = 0;
    uint32_t pi = 0;
  };
  std::deque<DirectQp> directQpObjs;
  std::deque<DirectCq> directCqObjs;
  std::vector<char*> ringPages;  // pages of the later direct queues
  uint64_t directWqes = 0;       // WQEs executed from direct send queues
  uint64_t uarRings = 0;         // UAR doorbell writes noticed

  bool mlx5Supported = true;
  int failCreateCqErrno = 0;
  int failCreateQpErrno = 0;
  int failInitObjQp = 0;  // the return value of mlx5dv_init_obj(QP)
  uint64_t maxDm = 128 << 10;

  int opened = 0, closed = 0, pds = 0, pdsFreed = 0, channels = 0, channelsFreed = 0;
  int cqs = 0, cqsFreed = 0, qps = 0, qpsFreed = 0, dms = 0, dmsFreed = 0, mrs = 0, mrsFreed = 0;
  int directQps = 0;

  FakeNic() {
    auto page = [](size_t n) {
      char* p = static_cast<char*>(std::aligned_alloc(pageBytes(), n * pageBytes()));
      std::memset(p, 0, n * pageBytes());
      return p;
    };
    sq = page(1);
    dbrecPage = page(1);
    cqBuf = page(1);
    uarPage = page(1);
    context.device = &device;
    // The completion channel's fd: written when an armed CQ gets a completion.
    channel.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  }
  ~FakeNic() {
    for (char* p : {sq, dbrecPage, cqBuf, uarPage}) std::free(p);
    for (char* p : ringPages) std::free(p);
    for (Dm& d : dmObjs) std::free(d.buf);
    close(channel.fd);
  }
  bool balanced() const {
    return opened == closed && pds == pdsFreed && channels == channelsFreed && cqs == cqsFreed &&
           qps == qpsFreed && dms == dmsFreed && mrs == mrsFreed;
  }
};

inline FakeNic* gNic = nullptr;

// ---- the doubles ----
inline ibv_device** fakeGetDeviceList(int* n) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  *n = 1;
  return gNic->list;
}
inline void fakeFreeDeviceList(ibv_device**) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
}
inline const char* fakeGetDeviceName(ibv_device*) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  return "mlx5_fake";
}
inline ibv_context* fakeOpenDevice(ibv_device*) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  ++gNic->opened;
  return &gNic->context;
}
inline int fakeCloseDevice(ibv_context*) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  ++gNic->closed;
  return 0;
}
inline int fakeQueryDeviceEx(ibv_context*, ibv_device_attr_ex* a) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  std::memset(a, 0, sizeof *a);
  a->orig_attr.max_mr_size = 1ull << 40;
  a->orig_attr.max_qp_wr = 32768;
  a->orig_attr.max_cqe = 1 << 22;
  a->orig_attr.phys_port_cnt = 1;
  a->max_dm_size = gNic->maxDm;
  return 0;
}
inline int fakeQueryPort(ibv_context*, uint8_t, ibv_port_attr* p) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  std::memset(p, 0, sizeof *p);
  p->state = IBV_PORT_ACTIVE;
  p->active_mtu = IBV_MTU_4096;
  return 0;
}
inline ibv_pd* fakeAllocPd(ibv_context*) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  ++gNic->pds;
  return &gNic->pd;
}
inline int fakeDeallocPd(ibv_pd*) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  ++gNic->pdsFreed;
  return 0;
}
inline ibv_comp_channel* fakeCreateCompChannel(ibv_context*) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  ++gNic->channels;
  return &gNic->channel;
}
inline int fakeDestroyCompChannel(ibv_comp_channel*) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  ++gNic->channelsFreed;
  return 0;
}
inline ibv_cq* fakeCreateCq(ibv_context*, int, void*, ibv_comp_channel*, int) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  ++gNic->cqs;
  gNic->cqObjs.emplace_back();
  return &gNic->cqObjs.back().cq;
}
inline int fakeDestroyCq(ibv_cq*) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  ++gNic->cqsFreed;
  return 0;
}
inline ibv_qp* newFakeQp(ibv_cq* sendCq, ibv_cq* recvCq) {
  ++gNic->qps;
  FakeNic::Qp& q = gNic->qpObjs.emplace_back();
  q.qp.qp_num = FakeNic::kFirstQpn + static_cast<uint32_t>(gNic->qpObjs.size() - 1);
  q.sendCq = sendCq;
  q.recvCq = recvCq;
  return &q.qp;
}
inline ibv_qp* fakeCreateQp(ibv_pd*, ibv_qp_init_attr* init) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  return newFakeQp(init->send_cq, init->recv_cq);
}
inline FakeNic::DirectQp* fakeDirectQp(const ibv_qp* qp);
inline int fakeDestroyQp(ibv_qp* qp) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  ++gNic->qpsFreed;
  qp->state = IBV_QPS_ERR;  // a peer sending to it gets no answer
  if (FakeNic::DirectQp* d = fakeDirectQp(qp)) d->destroyed = true;
  return 0;
}
inline ibv_dm* fakeAllocDm(ibv_context*, ibv_alloc_dm_attr* a) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  if (a->length > gNic->maxDm) {
    errno = ENOMEM;
    return nullptr;
  }
  ++gNic->dms;
  FakeNic::Dm& d = gNic->dmObjs.emplace_back();
  d.dm.context = &gNic->context;
  d.bytes = (a->length + pageBytes() - 1) / pageBytes() * pageBytes();
  d.buf = static_cast<char*>(std::aligned_alloc(pageBytes(), d.bytes));
  return &d.dm;
}
inline FakeNic::Dm* fakeDm(ibv_dm* dm) {
  for (FakeNic::Dm& d : gNic->dmObjs)
    if (&d.dm == dm) return &d;
  return nullptr;
}
inline int fakeFreeDm(ibv_dm* dm) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  ++gNic->dmsFreed;
  FakeNic::Dm* d = fakeDm(dm);
  std::free(d->buf);
  d->buf = nullptr;
  return 0;
}
inline ibv_mr* newFakeMr(void* addr, size_t length, bool zeroBased) {
  ++gNic->mrs;
  ibv_mr& m = gNic->mrObjs.emplace_back();
  gNic->mrZeroBased.push_back(zeroBased);
  m.addr = addr;
  m.length = length;
  m.lkey = 100 + static_cast<uint32_t>(gNic->mrObjs.size());
  m.rkey = 200 + static_cast<uint32_t>(gNic->mrObjs.size());
  return &m;
}
inline ibv_mr* fakeRegDmMr(ibv_pd*, ibv_dm* dm, uint64_t offset, size_t length, unsigned) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  return newFakeMr(fakeDm(dm)->buf + offset, length, true);
}
inline ibv_mr* fakeRegMr(ibv_pd*, void* addr, size_t length, int) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  return newFakeMr(addr, length, false);
}
inline int fakeDeregMr(ibv_mr* mr) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  ++gNic->mrsFreed;
  // Its keys no longer name memory (the memory may be freed next).
  mr->length = 0;
  return 0;
}
inline bool fakeIsSupported(ibv_device*) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  return gNic->mlx5Supported;
}
inline char* fakeRingPages(size_t bytes) {
  const size_t n = (bytes + pageBytes() - 1) / pageBytes() * pageBytes();
  char* p = static_cast<char*>(std::aligned_alloc(pageBytes(), n));
  std::memset(p, 0, n);
  gNic->ringPages.push_back(p);
  return p;
}
inline uint32_t ex_cqe(const ibv_cq_init_attr_ex* attr) {
  return attr ? attr->cqe : 0;
}
inline ibv_cq_ex* fakeMlx5CreateCq(ibv_context*, ibv_cq_init_attr_ex* attr, mlx5dv_cq_init_attr* dv) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  if (gNic->failCreateCqErrno) {
    errno = gNic->failCreateCqErrno;
    return nullptr;
  }
  // The provider asks for 64-byte CQEs explicitly.
  if (!(dv->comp_mask & MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE) || dv->cqe_size != 64) {
    errno = EINVAL;
    return nullptr;
  }
  ++gNic->cqs;
  FakeNic::DirectCq& c = gNic->directCqObjs.emplace_back();
  uint32_t n = 32;
  while (n < ex_cqe(attr)) n *= 2;
  c.cqeCnt = n;
  const bool first = gNic->directCqObjs.size() == 1 && n * 64 <= pageBytes();
  c.buf = first ? gNic->cqBuf : fakeRingPages(n * 64);
  c.dbrec = first ? gNic->dbrecPage + 64 : fakeRingPages(64);
  // Every entry INVALID with owner 0, as libmlx5 leaves a new CQ.
  for (uint32_t i = 0; i < n; ++i) reinterpret_cast<mlx5::Cqe64*>(c.buf)[i].opOwn = mlx5::kCqeInitOpOwn;
  return &c.cqx;
}
inline ibv_qp* fakeMlx5CreateQp(ibv_context*, ibv_qp_init_attr_ex* ex, mlx5dv_qp_init_attr* dv) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  if (gNic->failCreateQpErrno) {
    errno = gNic->failCreateQpErrno;
    return nullptr;
  }
  if (ex->pd != &gNic->pd || !(dv->create_flags & MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE)) {
    errno = EINVAL;
    return nullptr;
  }
  ++gNic->directQps;
  FakeNic::DirectQp& d = gNic->directQpObjs.emplace_back();
  d.qp = newFakeQp(ex->send_cq, ex->recv_cq);
  uint32_t n = 16;
  while (n < ex->cap.max_send_wr) n *= 2;
  d.wqeCnt = n;
  const bool first = gNic->directQpObjs.size() == 1 && n * 64 <= pageBytes();
  d.sq = first ? gNic->sq : fakeRingPages(n * 64);
  d.dbrec = first ? gNic->dbrecPage : fakeRingPages(64);
  d.bf = (first ? gNic->uarPage : fakeRingPages(pageBytes())) + 0x800;
  return d.qp;
}
inline FakeNic::DirectQp* fakeDirectQp(const ibv_qp* qp) {
  for (FakeNic::DirectQp& d : gNic->directQpObjs)
    if (d.qp == qp && !d.destroyed) return &d;
  return nullptr;
}
inline FakeNic::DirectCq* fakeDirectCq(const ibv_cq* cq) {
  for (FakeNic::DirectCq& c : gNic->directCqObjs)
    if (reinterpret_cast<const ibv_cq*>(&c.cqx) == cq) return &c;
  return nullptr;
}
inline int fakeMlx5InitObj(mlx5dv_obj* obj, uint64_t type) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  if (type & MLX5DV_OBJ_QP) {
    if (gNic->failInitObjQp) return gNic->failInitObjQp;
    FakeNic::DirectQp* d = fakeDirectQp(obj->qp.in);
    obj->qp.out->dbrec = reinterpret_cast<__be32*>(d->dbrec);
    obj->qp.out->sq.buf = d->sq;
    obj->qp.out->sq.wqe_cnt = d->wqeCnt;
    obj->qp.out->sq.stride = 64;
    obj->qp.out->bf.reg = d->bf;
    obj->qp.out->bf.size = 256;
  }
  if (type & MLX5DV_OBJ_CQ) {
    FakeNic::DirectCq* c = fakeDirectCq(obj->cq.in);
    obj->cq.out->buf = c->buf;
    obj->cq.out->dbrec = reinterpret_cast<__be32*>(c->dbrec);
    obj->cq.out->cqe_cnt = c->cqeCnt;
    obj->cq.out->cqe_size = 64;
    obj->cq.out->cqn = 0x55;
  }
  if (type & MLX5DV_OBJ_DM) {
    FakeNic::Dm* d = fakeDm(obj->dm.in);
    obj->dm.out->buf = d->buf;
    obj->dm.out->length = d->bytes;
  }
  return 0;
}

// ---- the data path: a loopback NIC ----
inline FakeNic::Qp* fakeQp(uint32_t qpn) {
  const uint32_t i = qpn - FakeNic::kFirstQpn;
  return i < gNic->qpObjs.size() ? &gNic->qpObjs[i] : nullptr;
}
inline FakeNic::Cq* fakeCq(ibv_cq* cq) {
  for (FakeNic::Cq& c : gNic->cqObjs)
    if (&c.cq == cq) return &c;
  return nullptr;
}
// Where [addr, addr + bytes) of the region with `key` (as lkey, or as rkey) is in this process,
// or null when no region with that key covers it. On-NIC memory is addressed by offset.
inline char* fakeResolve(uint32_t key, bool remote, uint64_t addr, size_t bytes) {
  for (size_t i = 0; i < gNic->mrObjs.size(); ++i) {
    const ibv_mr& m = gNic->mrObjs[i];
    const uint64_t base = gNic->mrZeroBased[i] ? 0 : reinterpret_cast<uint64_t>(m.addr);
    if ((remote ? m.rkey : m.lkey) == key && addr >= base && addr + bytes <= base + m.length)
      return static_cast<char*>(m.addr) + (addr - base);
  }
  return nullptr;
}
inline int fakeModifyQp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  if (mask & IBV_QP_DEST_QPN) fakeQp(qp->qp_num)->destQpn = attr->dest_qp_num;
  return 0;
}
inline int fakeQueryGid(ibv_context*, uint8_t, int, ibv_gid* gid) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  std::memset(gid, 0, sizeof *gid);
  return 0;
}
inline int fakePostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr**) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  for (; wr; wr = wr->next) {
    ibv_sge sge{};
    if (wr->num_sge) sge = wr->sg_list[0];
    fakeQp(qp->qp_num)->recvs.push_back({*wr, sge});
  }
  return 0;
}
inline void fakeComplete(ibv_cq* cq, uint64_t wrId, ibv_wc_status status, ibv_wc_opcode op, uint32_t bytes,
                         uint32_t qpn, bool withImm, uint32_t immBe) {
  ibv_wc wc{};
  wc.wr_id = wrId;
  wc.status = status;
  wc.opcode = op;
  wc.byte_len = bytes;
  wc.qp_num = qpn;
  if (withImm) {
    wc.wc_flags = IBV_WC_WITH_IMM;
    wc.imm_data = immBe;
  }
  FakeNic::Cq* c = fakeCq(cq);
  c->wcs.push_back(wc);
  if (c->armed) {
    c->armed = false;
    const uint64_t one = 1;
    (void)!write(gNic->channel.fd, &one, sizeof one);
  }
}
inline int fakeReqNotifyCq(ibv_cq* cq, int) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  fakeCq(cq)->armed = true;
  return 0;
}
inline int fakeGetCqEvent(ibv_comp_channel* ch, ibv_cq** cq, void** ctx) {
  uint64_t n = 0;
  // Several CQs share the one channel here: the event names none of them (callers only use it
  // as "look again"), and a waiter that finds the count already taken has a spurious wake-up.
  if (read(ch->fd, &n, sizeof n) != static_cast<ssize_t>(sizeof n)) return -1;
  *cq = nullptr;
  *ctx = nullptr;
  return 0;
}
inline void fakeAckCqEvents(ibv_cq*, unsigned) {}
// Executes each work request at once, as a loopback NIC would once it ran.
inline int fakePostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr**) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  FakeNic::Qp* src = fakeQp(qp->qp_num);
  FakeNic::Qp* dst = fakeQp(src->destQpn);
  for (; wr; wr = wr->next) {
    const ibv_sge sge = wr->num_sge ? wr->sg_list[0] : ibv_sge{};
    ibv_wc_status status = IBV_WC_SUCCESS;
    ibv_wc_opcode op = IBV_WC_RDMA_WRITE;
    const bool write = wr->opcode == IBV_WR_RDMA_WRITE || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    const bool send = wr->opcode == IBV_WR_SEND || wr->opcode == IBV_WR_SEND_WITH_IMM;
    const bool imm = wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM || wr->opcode == IBV_WR_SEND_WITH_IMM;
    char* local = sge.length ? fakeResolve(sge.lkey, false, sge.addr, sge.length) : nullptr;
    char* remote = nullptr;
    if (!dst || dst->qp.state == IBV_QPS_ERR) {
      status = IBV_WC_RETRY_EXC_ERR;  // the peer's QP is gone
    } else if (sge.length && !local) {
      status = IBV_WC_LOC_PROT_ERR;
    } else if (write || wr->opcode == IBV_WR_RDMA_READ) {
      if (sge.length &&
          !(remote = fakeResolve(wr->wr.rdma.rkey, true, wr->wr.rdma.remote_addr, sge.length))) {
        status = IBV_WC_REM_ACCESS_ERR;
      } else if (write) {
        if (sge.length) std::memcpy(remote, local, sge.length);
      } else {
        op = IBV_WC_RDMA_READ;
        std::memcpy(local, remote, sge.length);
      }
    } else if (send) {
      op = IBV_WC_SEND;
    }
    if (status == IBV_WC_SUCCESS && (send || imm)) {
      if (dst->recvs.empty()) {
        status = IBV_WC_RNR_RETRY_EXC_ERR;
      } else {
        auto [rwr, rsge] = dst->recvs.front();
        dst->recvs.pop_front();
        if (send && sge.length) std::memcpy(reinterpret_cast<void*>(rsge.addr), local, sge.length);
        fakeComplete(dst->recvCq, rwr.wr_id, IBV_WC_SUCCESS, send ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM,
                     sge.length, dst->qp.qp_num, imm, wr->imm_data);
      }
    }
    if (wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM && status == IBV_WC_SUCCESS)
      gNic->writeImmLengths.push_back(sge.length);
    if ((wr->send_flags & IBV_SEND_SIGNALED) || status != IBV_WC_SUCCESS)
      fakeComplete(src->sendCq, wr->wr_id, status, op, sge.length, src->qp.qp_num, false, 0);
  }
  return 0;
}
// The NIC's side of the direct queues: for every direct QP whose UAR doorbell was written since
// it last looked (the doorbell word changed), executes the WQEs its doorbell record publishes,
// in order, like fakePostSend (RDMA WRITE with or without immediate, inline or from a region,
// NOP), and writes an mlx5 CQE into its direct send CQ for each that asks (CQ_UPDATE) or
// fails. A WQE whose index is not the consumer index is malformed: error CQE. Returns how many
// WQEs it executed. Tests call it from a thread of their own (the NIC's engine).
inline void fakeDirectCqe(FakeNic::DirectCq* c, uint8_t opcode, uint8_t wqeOpcode, uint16_t counter,
                          uint32_t qpn, uint32_t bytes, uint8_t syndrome) {
  const uint32_t log2 = static_cast<uint32_t>(__builtin_ctz(c->cqeCnt));
  mlx5::Cqe64* e = reinterpret_cast<mlx5::Cqe64*>(c->buf) + (c->pi & (c->cqeCnt - 1));
  mlx5::encodeCqe(e, opcode, wqeOpcode, counter, qpn, bytes, 0, syndrome);
  mlx5::releaseFence();  // the fields before op_own
  reinterpret_cast<volatile mlx5::Cqe64*>(e)->opOwn = mlx5::makeOpOwn(opcode, c->pi, log2);
  c->pi += 1;
}
inline int fakeServeDirectRings() {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  int done = 0;
  for (FakeNic::DirectQp& d : gNic->directQpObjs) {
    if (d.destroyed) continue;
    const uint64_t rung = *reinterpret_cast<volatile uint64_t*>(d.bf);
    if (rung == d.lastRung) continue;
    d.lastRung = rung;
    gNic->uarRings += 1;
    mlx5::acquireFence();
    const uint32_t pi =
        mlx5::be32(reinterpret_cast<volatile uint32_t*>(d.dbrec)[mlx5::kSendDbrWord]) & 0xffff;
    FakeNic::Qp* src = fakeQp(d.qp->qp_num);
    FakeNic::Qp* dst = fakeQp(src->destQpn);
    FakeNic::DirectCq* cq = fakeDirectCq(src->sendCq);
    while ((d.ci & 0xffff) != pi) {
      const uint8_t* wqe = reinterpret_cast<const uint8_t*>(d.sq) + (d.ci & (d.wqeCnt - 1)) * 64;
      mlx5::WqeFields f;
      uint8_t syndrome = 0;
      const bool wellFormed =
          mlx5::decodeWqe(wqe, &f) && f.wqeIndex == (d.ci & 0xffff) && f.qpn == d.qp->qp_num;
      const uint32_t bbs = wellFormed ? mlx5::wqeBbs(f.ds) : 1;
      const bool write = f.opcode == mlx5::kOpRdmaWrite || f.opcode == mlx5::kOpRdmaWriteImm;
      if (!wellFormed || !(write || f.opcode == mlx5::kOpNop)) {
        syndrome = 0x02;  // local QP operation error
      } else if (write) {
        const char* local = f.isInline ? reinterpret_cast<const char*>(wqe) + f.inlineOffset
                            : f.bytes  ? fakeResolve(f.lkey, false, f.laddr, f.bytes)
                                       : nullptr;
        char* remote = f.bytes ? fakeResolve(f.rkey, true, f.raddr, f.bytes) : nullptr;
        if (!dst || dst->qp.state == IBV_QPS_ERR) {
          syndrome = 0x15;  // transport retry counter exceeded
        } else if (f.bytes && !local) {
          syndrome = 0x04;  // local protection error
        } else if (f.bytes && !remote) {
          syndrome = 0x13;  // remote access error
        } else {
          if (f.bytes) std::memcpy(remote, local, f.bytes);
          if (f.opcode == mlx5::kOpRdmaWriteImm) {
            if (dst->recvs.empty()) {
              syndrome = 0x16;  // RNR retry counter exceeded
            } else {
              const ibv_recv_wr rwr = dst->recvs.front().first;
              dst->recvs.pop_front();
              fakeComplete(dst->recvCq, rwr.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, f.bytes,
                           dst->qp.qp_num, true, __builtin_bswap32(f.imm));
              gNic->writeImmLengths.push_back(f.bytes);
            }
          }
        }
      }
      if (syndrome != 0)
        fakeDirectCqe(cq, mlx5::kCqeReqErr, f.opcode, static_cast<uint16_t>(d.ci), d.qp->qp_num, 0, syndrome);
      else if (f.fmCeSe & mlx5::kCtrlCqUpdate)
        fakeDirectCqe(cq, mlx5::kCqeReq, f.opcode, static_cast<uint16_t>(d.ci), d.qp->qp_num, f.bytes, 0);
      d.ci += bbs;
      gNic->directWqes += 1;
      ++done;
    }
  }
  return done;
}

inline int fakePollCq(ibv_cq* cq, int n, ibv_wc* wc) {
  std::lock_guard<std::recursive_mutex> lock(gNic->mu);
  FakeNic::Cq* c = fakeCq(cq);
  int got = 0;
  for (; got < n && !c->wcs.empty(); ++got) {
    wc[got] = c->wcs.front();
    c->wcs.pop_front();
  }
  return got;
}

inline IbvApi fakeApi(bool withMlx5) {
  IbvApi a;
  a.getDeviceList = fakeGetDeviceList;
  a.freeDeviceList = fakeFreeDeviceList;
  a.getDeviceName = fakeGetDeviceName;
  a.openDevice = fakeOpenDevice;
  a.closeDevice = fakeCloseDevice;
  a.queryDeviceEx = fakeQueryDeviceEx;
  a.queryPort = fakeQueryPort;
  a.allocPd = fakeAllocPd;
  a.deallocPd = fakeDeallocPd;
  a.createCompChannel = fakeCreateCompChannel;
  a.destroyCompChannel = fakeDestroyCompChannel;
  a.createCq = fakeCreateCq;
  a.destroyCq = fakeDestroyCq;
  a.createQp = fakeCreateQp;
  a.destroyQp = fakeDestroyQp;
  a.allocDm = fakeAllocDm;
  a.freeDm = fakeFreeDm;
  a.regDmMr = fakeRegDmMr;
  a.deregMr = fakeDeregMr;
  a.regMr = fakeRegMr;
  a.modifyQp = fakeModifyQp;
  a.queryGid = fakeQueryGid;
  a.postSend = fakePostSend;
  a.postRecv = fakePostRecv;
  a.pollCq = fakePollCq;
  a.reqNotifyCq = fakeReqNotifyCq;
  a.getCqEvent = fakeGetCqEvent;
  a.ackCqEvents = fakeAckCqEvents;
  if (withMlx5) {
    a.mlx5IsSupported = fakeIsSupported;
    a.mlx5CreateCq = fakeMlx5CreateCq;
    a.mlx5CreateQp = fakeMlx5CreateQp;
    a.mlx5InitObj = fakeMlx5InitObj;
  } else {
    a.mlx5Missing = "cannot load libmlx5.so.1 (test double: absent)";
  }
  return a;
}

}  // namespace verbs_test
}  // namespace ridge
