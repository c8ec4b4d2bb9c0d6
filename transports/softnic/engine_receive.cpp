// What arrives at a NIC: data packets (the target side: rkey checks, landing payload, receive
// completions), acknowledgements (the sender side), RDMA READ requests and their responses.
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "kernels/gdr/mlx5_wire.h"
#include "transports/softnic/nic.h"
#include "transports/softnic/queues.h"

namespace ridge {
namespace softnic {

using namespace verbs;

// The target side of one data packet.
void Nic::handleData(Conn* c, const FrameHeader& h, const char* inlinePayload) {
  SoftQp* qp = c->qp;
  if (!qp || c->outbound) return;
  ctr_.packetsReceived.fetch_add(1, std::memory_order_relaxed);
  const QpState st = qp->state();
  if (st != QpState::Rtr && st != QpState::Rts) return;  // not ready: the sender resends
  if (h.seq != qp->expectedSeq_) {
    if (seqBefore(h.seq, qp->expectedSeq_)) {
      ctr_.duplicatesDiscarded.fetch_add(1, std::memory_order_relaxed);
      qp->ackPending_ = true;  // its ack may have been lost
      // A read asked again: its response may have been lost, so answer again (reads change
      // nothing here; the requester takes each piece once).
      if (h.opcode == kWqeRdmaRead && executeRead(qp, h))
        ctr_.readsReexecuted.fetch_add(1, std::memory_order_relaxed);
    } else {
      ctr_.outOfOrderDiscarded.fetch_add(1, std::memory_order_relaxed);
      if (qp->nakSentFor_ != qp->expectedSeq_) {
        qp->nakSentFor_ = qp->expectedSeq_;
        sendAck(qp, kAckNak, kCqeOk);
      }
    }
    return;
  }
  if (h.opcode == kWqeRdmaRead) {
    if (!executeRead(qp, h)) {
      ctr_.remoteAccessErrors.fetch_add(1, std::memory_order_relaxed);
      sendAck(qp, kAckError, kCqeRemoteAccessError);
      return;
    }
    ctr_.readsExecuted.fetch_add(1, std::memory_order_relaxed);
    ++qp->expectedSeq_;
    qp->ackPending_ = true;
    return;
  }
  const bool isSend = h.opcode == kWqeSend || h.opcode == kWqeSendImm;
  const bool needsRecv = isSend || h.opcode == kWqeRdmaWriteImm;
  const bool completes = needsRecv && (h.flags & kFrameLast);
  char* dst = nullptr;
  uint8_t bad = kCqeOk;
  RecvWqe recvWqe{};
  const RecvWqe* recv = nullptr;
  if (needsRecv && (isSend || completes)) {
    if (qp->rqPosted() == 0 || (completes && !qp->rcq_->hasRoom())) {
      // Receiver not ready: refuse without acknowledging; the sender resends after its timeout.
      ctr_.rnrDiscards.fetch_add(1, std::memory_order_relaxed);
      sendAck(qp, kAckRnr, kCqeOk);
      return;
    }
    const mlx5::DataSeg& d = qp->rq_[qp->rqCi_ & (qp->rqSize_ - 1)];
    recvWqe.addr = mlx5::be64(d.addr);
    recvWqe.lkey = mlx5::be32(d.lkey);
    recvWqe.length = mlx5::be32(d.byteCount);
    recv = &recvWqe;
  }
  if (h.length) {
    if (isSend) {
      if (static_cast<uint64_t>(h.msgOffset) + h.length > recv->length)
        bad = kCqeLocalLengthError;
      else if (!(dst = translate(recv->lkey, recv->addr + h.msgOffset, h.length, kAccessLocalWrite)))
        bad = kCqeLocalProtectionError;
    } else if (!(dst = translate(h.rkey, h.remoteAddr, h.length, kAccessRemoteWrite))) {
      bad = kCqeRemoteAccessError;
    }
  }
  if (bad != kCqeOk) {
    ctr_.remoteAccessErrors.fetch_add(1, std::memory_order_relaxed);
    sendAck(qp, kAckError, bad == kCqeRemoteAccessError ? kCqeRemoteAccessError : kCqeRemoteInvalidRequest);
    return;
  }
  if (h.length) {
    if (inlinePayload) {
      std::memcpy(dst, inlinePayload, h.length);
      ctr_.inlinePayloads.fetch_add(1, std::memory_order_relaxed);
    } else {
      size_t done = 0;
      while (done < h.length) {
        iovec l{dst + done, h.length - done};
        iovec r{reinterpret_cast<void*>(h.stagingAddr + done), h.length - done};
        ssize_t n = process_vm_readv(c->peerPid, &l, 1, &r, 1, 0);
        if (n <= 0) {
          if (n < 0 && errno == EINTR) continue;
          closeConn(c, "process_vm_readv from the peer NIC failed");
          return;
        }
        done += static_cast<size_t>(n);
      }
      ctr_.cmaPayloadReads.fetch_add(1, std::memory_order_relaxed);
    }
    ctr_.payloadBytesLanded.fetch_add(h.length, std::memory_order_relaxed);
  }
  if (completes) {
    const uint8_t op = h.opcode == kWqeRdmaWriteImm ? mlx5::kCqeRespWrImm
                       : h.opcode == kWqeSendImm    ? mlx5::kCqeRespSendImm
                                                    : mlx5::kCqeRespSend;
    // The receive slot is free before the completion is visible (the poller reposts at once).
    const uint32_t index = qp->rqCi_++;
    const uint64_t wrId = qp->rqWrId_[index & (qp->rqSize_ - 1)];
    storeRelease(&qp->rqConsumed_, qp->rqCi_);
    qp->rcq_->push(op, 0, index, qp->qpn_, h.msgLength, h.immData, 0, wrId);
  }
  ++qp->expectedSeq_;
  qp->ackPending_ = true;
}

// The sender side of an acknowledgement.
void Nic::handleAck(Conn* c, const FrameHeader& h) {
  SoftQp* qp = c->qp;
  if (!qp || !c->outbound) return;
  const int64_t now = nowNs();
  // Cumulative: never move backwards, never past what was sent.
  if (seqBefore(qp->ackedUpTo_, h.seq) && !seqBefore(qp->nextSeq_, h.seq)) {
    qp->ackedUpTo_ = h.seq;
    qp->lastProgressNs_ = now;
    qp->retries_ = 0;
  }
  if (h.opcode == kAckError) {
    retireAcked(qp);
    setError(qp, h.status, "the target refused a packet");
    return;
  }
  if (h.opcode == kAckNak) {
    // Resend from the first missing packet, but only once per gap and timeout quarter so
    // that a burst of out-of-order arrivals does not multiply the resends.
    if (h.seq != qp->lastNakSeq_ || now - qp->lastRetxNs_ > opt_.rtoNs / 4) {
      qp->lastNakSeq_ = h.seq;
      retireAcked(qp);
      goBackN(qp, now);
    }
  }
}

// The target side of an RDMA READ request: checks the rkey for remote read and sends the
// bytes back in MTU-sized response frames on the connection the request came in on. False
// (nothing sent) when the range is not readable with that key.
bool Nic::executeRead(SoftQp* qp, const FrameHeader& request) {
  const char* src = nullptr;
  if (request.msgLength &&
      !(src = translate(request.rkey, request.remoteAddr, request.msgLength, kAccessRemoteRead)))
    return false;
  uint32_t offset = 0;
  do {
    const uint32_t len = std::min<uint32_t>(request.msgLength - offset, static_cast<uint32_t>(chunkBytes_));
    FrameHeader r{};
    r.magic = kFrameMagic;
    r.type = kFrameReadResp;
    r.flags = static_cast<uint8_t>((offset == 0 ? kFrameFirst : 0) |
                                   (offset + len == request.msgLength ? kFrameLast : 0));
    r.opcode = kWqeRdmaRead;
    r.seq = request.seq;
    r.length = len;
    r.msgLength = request.msgLength;
    r.msgOffset = offset;
    emitResponse(qp, r, src ? src + offset : nullptr);
    offset += len;
  } while (offset < request.msgLength);
  return true;
}

// The requester side of a read response frame: lands the next expected piece of a read
// still in flight; anything else (a duplicate, a piece after a lost one, a frame for a read
// already completed) is discarded. The whole response also acknowledges the request and
// everything before it (the target executed them in order).
void Nic::handleReadResponse(Conn* c, const FrameHeader& h, const char* payload) {
  SoftQp* qp = c->qp;
  if (!qp || !c->outbound || qp->state() == QpState::Error) return;
  ctr_.packetsReceived.fetch_add(1, std::memory_order_relaxed);
  const uint32_t mask = static_cast<uint32_t>(qp->inflight_.size() - 1);
  Packet* read = nullptr;
  for (uint32_t i = qp->inflightHead_; i != qp->inflightTail_ && !read; ++i) {
    Packet& p = qp->inflight_[i & mask];
    if (p.hdr.seq == h.seq && p.hdr.opcode == kWqeRdmaRead) read = &p;
  }
  if (!read || read->readComplete || h.msgOffset != read->readDone || h.msgLength != read->hdr.msgLength ||
      h.length > read->hdr.msgLength - read->readDone) {
    ctr_.readResponseDiscards.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (h.length) {
    char* dst = translate(read->readLkey, read->readLocal + h.msgOffset, h.length, kAccessLocalWrite);
    if (!dst) {
      setError(qp, kCqeLocalProtectionError, "a read response lands outside its lkey's region");
      return;
    }
    std::memcpy(dst, payload, h.length);
    ctr_.payloadBytesLanded.fetch_add(h.length, std::memory_order_relaxed);
    ctr_.inlinePayloads.fetch_add(1, std::memory_order_relaxed);
  }
  read->readDone += h.length;
  qp->lastProgressNs_ = nowNs();
  if (read->readDone == read->hdr.msgLength) {
    read->readComplete = true;
    const uint32_t next = h.seq + 1;
    if (seqBefore(qp->ackedUpTo_, next) && !seqBefore(qp->nextSeq_, next)) qp->ackedUpTo_ = next;
    qp->retries_ = 0;
  }
}

}  // namespace softnic
}  // namespace ridge
