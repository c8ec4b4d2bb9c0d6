// The queue pair's verbs: creation, address, state transitions (RTS connects to the target
// NIC), and posting, which encodes WQEs and receives into the mlx5 queues as libmlx5 does.
#include "transports/softnic/queues.h"

#include <cstdio>
#include <cstring>

#include "bootstrap/bootstrap.h"
#include "bootstrap/socket.h"
#include "core/log.h"
#include "core/settings.h"
#include "transports/softnic/mlx5_codec.h"

namespace ridge {
namespace softnic {

using namespace verbs;

SoftQp::SoftQp(std::shared_ptr<Nic> nic, SoftCq* scq, SoftCq* rcq, const QpCaps& caps)
    : nic_(std::move(nic)), scq_(scq), rcq_(rcq) {
  qpn_ = nic_->newQpn();
  sqSize_ = roundUpPow2(std::max<uint32_t>(caps.maxSendWr, 1), &sqLog_);
  rqSize_ = roundUpPow2(std::max<uint32_t>(caps.maxRecvWr, 1), &rqLog_);
  sq_ = static_cast<uint8_t*>(allocQueuePages(size_t{mlx5::kWqeBbBytes} * sqSize_));
  rq_ = static_cast<mlx5::DataSeg*>(
      std::aligned_alloc(64, sizeof(mlx5::DataSeg) * std::max<uint32_t>(rqSize_, 4)));
  std::memset(sq_, 0, size_t{mlx5::kWqeBbBytes} * sqSize_);
  std::memset(rq_, 0, sizeof(mlx5::DataSeg) * rqSize_);
  sqWrId_.assign(sqSize_, 0);
  rqWrId_.assign(rqSize_, 0);
  // In flight: every staging chunk could belong to this QP, plus zero-length packets.
  uint32_t cap = roundUpPow2(std::max<uint32_t>(
      static_cast<uint32_t>(nic_->options().stagingBytes / std::max<size_t>(nic_->options().mtu, 64)) +
          sqSize_,
      64));
  inflight_.resize(cap);
  view_ = mlx5::SqView{
      sq_, &dbrec_[mlx5::kSendDbrWord], &uar_.doorbell, uar_.blueFlame, kBlueFlameBytes, sqLog_, qpn_, 0};
  SoftQp* self = this;
  nic_->runOnEngine([&] { nic_->engineAddQp(self); });
}

SoftQp::~SoftQp() {
  SoftQp* self = this;
  nic_->runOnEngine([&] { nic_->engineRemoveQp(self); });
  std::free(sq_);
  std::free(rq_);
}

Status SoftQp::localAddress(QpAddress* out) const {
  SoftQpAddress a{};
  a.magic = kHelloMagic;
  a.qpn = qpn_;
  std::snprintf(a.endpoint, sizeof a.endpoint, "%s", nic_->endpoint().c_str());
  std::memset(out, 0, sizeof *out);
  std::memcpy(out->bytes, &a, sizeof a);
  return Status::ok();
}

Status SoftQp::modify(QpState to, const QpAddress* remote) {
  const QpState from = state();
  if (!qpTransitionAllowed(from, to))
    return makeError(ridgeInvalidUsage, "softnic: QP %u: illegal transition %s -> %s", qpn_,
                     qpStateName(from), qpStateName(to));
  switch (to) {
    case QpState::Reset: {
      SoftQp* self = this;
      state_.store(QpState::Reset, std::memory_order_release);
      nic_->runOnEngine([&] { nic_->engineResetQp(self); });
      sqPi_ = rqPi_ = 0;
      dbrec_[0] = dbrec_[1] = 0;
      std::memset(&uar_, 0, sizeof uar_);
      return Status::ok();
    }
    case QpState::Init: state_.store(QpState::Init, std::memory_order_release); return Status::ok();
    case QpState::Rtr: {
      if (!remote)
        return makeError(ridgeInvalidArgument, "softnic: QP %u: RTR needs the remote address", qpn_);
      SoftQpAddress a;
      std::memcpy(&a, remote->bytes, sizeof a);
      a.endpoint[sizeof a.endpoint - 1] = 0;
      if (a.magic != kHelloMagic)
        return makeError(ridgeInvalidArgument, "softnic: QP %u: the remote address is not a softnic address",
                         qpn_);
      remoteEndpoint_ = a.endpoint;
      remoteQpn_ = a.qpn;
      state_.store(QpState::Rtr, std::memory_order_release);
      return Status::ok();
    }
    case QpState::Rts: {
      // Connect to the target NIC now, so that posting never waits for a connection.
      SocketAddress addr;
      RIDGE_TRY(parseHostPort(remoteEndpoint_, &addr));
      Deadline d = Deadline::after(std::max<int>(5, static_cast<int>(settingInt(Setting::TIMEOUT))));
      const std::string who =
          format("softnic: QP %u -> NIC %s QP %u", qpn_, remoteEndpoint_.c_str(), remoteQpn_);
      Socket s;
      RIDGE_TRY(connectWithRetry(addr, d, who, &s));
      Hello h{kHelloMagic,
              kWireVersion,
              qpn_,
              remoteQpn_,
              static_cast<int32_t>(getpid()),
              nic_->options().forceTcpPayload ? 0u : 1u,
              hostHash(),
              nic_->probeWordAddr(),
              nic_->probeWord()};
      RIDGE_TRY(sendAll(s.fd(), &h, sizeof h, d, who));
      HelloReply r{};
      RIDGE_TRY(recvAll(s.fd(), &r, sizeof r, d, who));
      if (r.magic != kHelloMagic || r.status != 0)
        return makeError(ridgeRemoteError, "%s: the target has no such queue pair", who.c_str());
      int fd = s.release();
      SoftQp* self = this;
      const bool cma = r.cma != 0;
      nic_->runOnEngine([&] { nic_->engineAttachOut(self, fd, cma, 0); });
      state_.store(QpState::Rts, std::memory_order_release);
      RIDGE_INFO("%s connected, payload %s", who.c_str(),
                 cma ? "read by the target (process_vm_readv)" : "inline");
      return Status::ok();
    }
    case QpState::Error: {
      // On the engine thread, between its iterations: when this returns, no payload is
      // being read from the QP's sources or landed for it, and none will be (what a caller
      // withdrawing its buffers relies on, transport.h withdrawDirect).
      SoftQp* self = this;
      nic_->runOnEngine([&] { self->state_.store(QpState::Error, std::memory_order_release); });
      nic_->kick();
      return Status::ok();
    }
  }
  return Status::ok();
}

Status SoftQp::postSend(const Wqe& wqe) {
  const QpState st = state();
  if (st != QpState::Rts && st != QpState::Error)
    return makeError(ridgeInvalidUsage, "softnic: QP %u: postSend in state %s (needs RTS)", qpn_,
                     qpStateName(st));
  if (sqPi_ - loadAcquire(&sqRetired_) >= sqSize_)
    return Status(ridgeInternalError, "softnic: send queue full");
  // What libmlx5 does for ibv_post_send: one mlx5 WQE (one block), the record, the doorbell.
  mlx5::WqeBuf w;
  const uint8_t fm = static_cast<uint8_t>(((wqe.flags & kWqeSignaled) ? mlx5::kCtrlCqUpdate : 0) |
                                          ((wqe.flags & kWqeFence) ? mlx5::kCtrlFence : 0));
  const uint8_t op = mlx5OpcodeOf(wqe.opcode);
  if (op == mlx5::kOpNop && wqe.opcode != kWqeNop)
    return makeError(ridgeInvalidArgument, "softnic: QP %u: WQE opcode %u is not in the subset", qpn_,
                     wqe.opcode);
  const uint32_t ds = op == mlx5::kOpNop
                          ? mlx5::buildNop(&w, static_cast<uint16_t>(sqPi_), qpn_, fm)
                          : mlx5::buildWqe(&w, op, static_cast<uint16_t>(sqPi_), qpn_, fm, wqe.immData,
                                           wqe.remoteAddr, wqe.rkey, wqe.localAddr, wqe.lkey, wqe.length);
  mlx5::copyToRing(view_, sqPi_, w, mlx5::wqeBbs(ds));
  sqWrId_[sqPi_ & (sqSize_ - 1)] = wqe.wrId;
  ++sqPi_;
  mlx5::publishDbr(view_, sqPi_);
  mlx5::ringDoorbell(view_, w);
  nic_->kick();
  return Status::ok();
}

Status SoftQp::postRecv(const RecvWqe& wqe) {
  const QpState st = state();
  if (st == QpState::Reset)
    return makeError(ridgeInvalidUsage, "softnic: QP %u: postRecv in state RESET (needs INIT or later)",
                     qpn_);
  if (rqPi_ - loadAcquire(&rqConsumed_) >= rqSize_)
    return Status(ridgeInternalError, "softnic: receive queue full");
  rq_[rqPi_ & (rqSize_ - 1)] = mlx5::makeData(wqe.length, wqe.lkey, wqe.addr);
  rqWrId_[rqPi_ & (rqSize_ - 1)] = wqe.wrId;
  ++rqPi_;
  mlx5::releaseFence();
  storeRelease(&dbrec_[mlx5::kRecvDbrWord], mlx5::be32(rqPi_ & 0xffffu));
  nic_->kick();
  return Status::ok();
}

}  // namespace softnic
}  // namespace ridge
