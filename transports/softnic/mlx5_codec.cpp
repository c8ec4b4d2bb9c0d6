// mlx5 <-> verbs subset: the opcode and status translations, and the decoding of WQEs (what
// the NIC reads out of the send queue) and CQEs (what the provider's poll reads back).
#include "transports/softnic/mlx5_codec.h"

#include <cstring>

#include "kernels/gdr/mlx5_wire.h"
#include "transports/softnic/nic.h"
#include "transports/softnic/queues.h"
#include "transports/softnic/trace.h"

namespace ridge {
namespace softnic {

using namespace verbs;

uint8_t mlx5OpcodeOf(uint8_t wqeOpcode) {
  switch (wqeOpcode) {
    case kWqeRdmaWrite: return mlx5::kOpRdmaWrite;
    case kWqeRdmaWriteImm: return mlx5::kOpRdmaWriteImm;
    case kWqeSend: return mlx5::kOpSend;
    case kWqeSendImm: return mlx5::kOpSendImm;
    case kWqeRdmaRead: return mlx5::kOpRdmaRead;
    default: return mlx5::kOpNop;
  }
}

uint8_t verbsOpcodeOf(uint8_t mlx5Opcode) {
  switch (mlx5Opcode) {
    case mlx5::kOpRdmaWrite: return kWqeRdmaWrite;
    case mlx5::kOpRdmaWriteImm: return kWqeRdmaWriteImm;
    case mlx5::kOpSend: return kWqeSend;
    case mlx5::kOpSendImm: return kWqeSendImm;
    case mlx5::kOpRdmaRead: return kWqeRdmaRead;
    default: return kWqeNop;
  }
}

uint8_t syndromeOf(uint8_t status) {
  switch (status) {
    case kCqeLocalLengthError: return mlx5::kSyndLocalLength;
    case kCqeLocalProtectionError: return mlx5::kSyndLocalProt;
    case kCqeRemoteAccessError: return mlx5::kSyndRemoteAccess;
    case kCqeRemoteInvalidRequest: return mlx5::kSyndRemoteInvalReq;
    case kCqeTransportRetryExceeded: return mlx5::kSyndTransportRetryExc;
    case kCqeFlushed: return mlx5::kSyndWrFlush;
    case kCqeBadOpcode: return mlx5::kSyndLocalQpOp;
    default: return mlx5::kSyndRemoteOp;
  }
}

uint8_t statusOfSyndrome(uint8_t syndrome) {
  switch (syndrome) {
    case mlx5::kSyndLocalLength: return kCqeLocalLengthError;
    case mlx5::kSyndLocalProt: return kCqeLocalProtectionError;
    case mlx5::kSyndRemoteAccess: return kCqeRemoteAccessError;
    case mlx5::kSyndRemoteInvalReq: return kCqeRemoteInvalidRequest;
    case mlx5::kSyndTransportRetryExc:
    case mlx5::kSyndRnrRetryExc: return kCqeTransportRetryExceeded;
    case mlx5::kSyndWrFlush: return kCqeFlushed;
    case mlx5::kSyndLocalQpOp: return kCqeBadOpcode;
    default: return kCqeGeneralError;
  }
}

// Decodes mlx5 CQEs into the subset's completions, as libmlx5's poll does (the wrId from the
// provider's side array).
int SoftCq::poll(Cqe* out, int max) {
  int n = 0;
  mlx5::CqeFields f;
  while (n < max) {
    const uint64_t wrId = wrIds_[ci_ & (size_ - 1)];
    if (!mlx5::pollCq(view_, &ci_, &f)) break;
    Cqe& c = out[n++];
    c = Cqe{};
    c.wrId = wrId;
    c.qpn = f.qpn;
    c.wqeCounter = f.wqeCounter;
    c.byteLen = f.byteCnt;
    const bool requester = f.opcode == mlx5::kCqeReq || f.opcode == mlx5::kCqeReqErr;
    if (requester) {
      const uint8_t op = verbsOpcodeOf(f.wqeOpcode);
      c.opcode = op == kWqeRdmaRead                      ? kCqeRdmaRead
                 : (op == kWqeSend || op == kWqeSendImm) ? kCqeSend
                                                         : kCqeRdmaWrite;
    } else {
      c.opcode = f.opcode == mlx5::kCqeRespWrImm ? kCqeRecvRdmaImm : kCqeRecv;
      if (f.opcode == mlx5::kCqeRespWrImm || f.opcode == mlx5::kCqeRespSendImm) {
        c.flags = kCqeHasImm;
        c.immData = f.imm;
      }
    }
    c.status = (f.opcode == mlx5::kCqeReqErr || f.opcode == mlx5::kCqeRespErr) ? statusOfSyndrome(f.syndrome)
                                                                               : uint8_t{kCqeOk};
  }
  return n;
}

// Takes the WQE at sqCi_ out of the send queue: its first block, then as many more as its ds
// says, checked (index, QP number, segments) and traced. False (QP in error) when malformed.
bool Nic::takeWqe(SoftQp* qp) {
  const uint32_t mask = qp->sqSize_ - 1;
  std::memcpy(qp->curWqe_.bytes, qp->sq_ + static_cast<size_t>(qp->sqCi_ & mask) * mlx5::kWqeBbBytes,
              mlx5::kWqeBbBytes);
  mlx5::WqeFields f{};
  mlx5::decodeCtrl(qp->curWqe_.bytes, &f);
  const uint32_t bbs = mlx5::wqeBbs(f.ds);
  if (bbs == 0 || bbs > mlx5::kMaxWqeBbs || bbs > qp->sqPosted(false)) {
    setError(qp, kCqeBadOpcode, "malformed WQE (ds)");
    return false;
  }
  for (uint32_t b = 1; b < bbs; ++b)
    std::memcpy(qp->curWqe_.bytes + b * mlx5::kWqeBbBytes,
                qp->sq_ + static_cast<size_t>((qp->sqCi_ + b) & mask) * mlx5::kWqeBbBytes, mlx5::kWqeBbBytes);
  if (Trace::get().on()) Trace::get().wqe(qp->qpn_, qp->sqCi_, qp->curWqe_.bytes, bbs * mlx5::kWqeBbBytes);
  if (!mlx5::decodeWqe(qp->curWqe_.bytes, &f) || f.wqeIndex != static_cast<uint16_t>(qp->sqCi_) ||
      f.qpn != qp->qpn_) {
    setError(qp, kCqeBadOpcode, "malformed WQE (opcode, segments, index or QP number)");
    return false;
  }
  Wqe& w = qp->cur_;
  w = Wqe{};
  w.opcode = verbsOpcodeOf(f.opcode);
  w.flags = static_cast<uint8_t>(((f.fmCeSe & mlx5::kCtrlCqUpdate) ? kWqeSignaled : 0) |
                                 ((f.fmCeSe & mlx5::kCtrlFence) ? kWqeFence : 0));
  w.immData = f.imm;
  w.length = f.bytes;
  w.remoteAddr = f.raddr;
  w.rkey = f.rkey;
  w.localAddr = f.isInline ? f.inlineOffset : f.laddr;  // inline: offset into curWqe_
  w.lkey = f.lkey;
  qp->curInline_ = f.isInline;
  qp->curBbs_ = static_cast<uint8_t>(bbs);
  qp->curMlx5Opcode_ = f.opcode;
  qp->curWrId_ = qp->sqWrId_[qp->sqCi_ & mask];
  qp->haveCur_ = true;
  qp->curOffset_ = 0;
  return true;
}

}  // namespace softnic
}  // namespace ridge
