// The engine loop and the requester side: taking WQEs into staging and cutting them into
// packets, retiring acknowledged WQEs, flushing a QP in error, go-back-N retransmission.
#include <sys/epoll.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "core/log.h"
#include "kernels/gdr/mlx5_wire.h"
#include "transports/softnic/mlx5_codec.h"
#include "transports/softnic/nic.h"
#include "transports/softnic/queues.h"

namespace ridge {
namespace softnic {

using namespace verbs;

void Nic::setError(SoftQp* qp, uint8_t status, const char* why) {
  if (qp->errorStatus_ == kCqeOk) qp->errorStatus_ = status;
  if (qp->state() != QpState::Error) {
    RIDGE_INFO("softnic %s: QP %u -> ERROR: %s", attr_.name.c_str(), qp->qpn_, why);
    qp->state_.store(QpState::Error, std::memory_order_release);
  }
}

// Whether a QP has WQEs that pumpSend could take right now (so the engine must not sleep).
bool Nic::anyDoorbellPending() {
  const size_t highWater = 4 * (chunkBytes_ + sizeof(FrameHeader)) + (64 << 10);
  for (SoftQp* qp : qps_) {
    if (qp->doorbellWords() != qp->lastPage_) return true;
    if (qp->state() == QpState::Error && (qp->inflightHead_ != qp->inflightTail_ || qp->sqPosted(false) != 0))
      return true;
    if (!qp->haveCur_ && qp->sqPosted(false) == 0) continue;
    if (qp->readPending_) continue;  // the next WQE waits for a read's response
    Conn* c = qp->out_;
    if (qp->stalledOnStaging_ || !c || c->closed || c->out.size() - c->outDone >= highWater) continue;
    if (qp->inflightTail_ - qp->inflightHead_ >= qp->inflight_.size()) continue;
    if (qp->state() == QpState::Rts) return true;
  }
  return false;
}

void Nic::run() {
  std::vector<epoll_event> events(64);
  bool busy = true;
  while (!stop_.load(std::memory_order_relaxed)) {
    if (mailboxPending_.load(std::memory_order_acquire)) {
      std::vector<std::function<void()>> work;
      {
        std::lock_guard<std::mutex> g(mailboxMutex_);
        work.swap(mailbox_);
        mailboxPending_.store(0, std::memory_order_relaxed);
      }
      for (auto& fn : work) fn();
      {
        std::lock_guard<std::mutex> g(mailboxMutex_);
        mailboxServed_ += work.size();
      }
      mailboxDone_.notify_all();
      busy = true;
    }
    int timeoutMs = 0;
    if (!busy) {
      int64_t now = nowNs();
      int64_t next = now + kIdleSleepMs * 1000000;
      for (SoftQp* qp : qps_) {
        if (qp->inflightHead_ != qp->inflightTail_) {
          int64_t rto = opt_.rtoNs << std::min(qp->retries_, 5);
          next = std::min(next, qp->inflight_[qp->inflightHead_ & (qp->inflight_.size() - 1)].sentNs + rto);
        }
        for (uint32_t i = 0; i < qp->heldCount_; ++i)
          if (qp->held_[i].releaseNs) next = std::min(next, qp->held_[i].releaseNs);
        if (qp->stalledOnStaging_) next = std::min(next, now + 1000000);
      }
      timeoutMs = static_cast<int>(std::max<int64_t>(0, (next - now + 999999) / 1000000));
      sleeping_.store(1, std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (anyDoorbellPending() || mailboxPending_.load()) timeoutMs = 0;
    }
    int n = epoll_wait(epollFd_, events.data(), static_cast<int>(events.size()), timeoutMs);
    sleeping_.store(0, std::memory_order_relaxed);
    busy = false;
    for (int i = 0; i < n; ++i) {
      const epoll_event& ev = events[i];
      if (ev.data.u64 == 1) {
        acceptAll();
        busy = true;
      } else if (ev.data.u64 == 2) {
        uint64_t v;
        while (::read(eventFd_, &v, sizeof v) > 0) {
        }
        busy = true;
      } else {
        Conn* c = static_cast<Conn*>(ev.data.ptr);
        if (c->closed) continue;
        if (ev.events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) readConn(c);
        if (!c->closed && (ev.events & EPOLLOUT)) flushConn(c);
        busy = true;
      }
    }
    const int64_t now = nowNs();
    for (SoftQp* qp : qps_) busy |= serviceQp(qp, now);
    for (Conn* c : conns_)
      if (!c->closed && c->outDone < c->out.size()) flushConn(c);
    if (busy) {
      // What this iteration wrote (landed bytes, CQEs, retired counters) before the check.
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (activityWaiters_.load(std::memory_order_relaxed)) {
        activityWord_.fetch_add(1, std::memory_order_release);
        futexCall(&activityWord_, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr);
      }
    }
    // Free connections closed during this iteration.
    for (size_t i = 0; i < conns_.size();) {
      if (conns_[i]->closed) {
        delete conns_[i];
        conns_[i] = conns_.back();
        conns_.pop_back();
      } else {
        ++i;
      }
    }
  }
}

bool Nic::serviceQp(SoftQp* qp, int64_t now) {
  bool did = false;
  qp->lastPage_ = qp->doorbellWords();
  if (qp->state() == QpState::Error) return flushQp(qp);
  did |= retireAcked(qp);
  if (qp->state() == QpState::Rts && qp->out_) did |= pumpSend(qp, now);
  if (qp->heldCount_) did |= releaseHeld(qp, now, false);
  if (qp->inflightHead_ != qp->inflightTail_ && qp->out_) {
    const Packet& oldest = qp->inflight_[qp->inflightHead_ & (qp->inflight_.size() - 1)];
    const int64_t rto = opt_.rtoNs << std::min(qp->retries_, 5);
    if (now - oldest.sentNs >= rto) {
      if (now - qp->lastProgressNs_ > kGiveUpNs) {
        setError(qp, kCqeTransportRetryExceeded, "no acknowledgement for 15 s");
        return true;
      }
      ctr_.retransmitTimeouts.fetch_add(1, std::memory_order_relaxed);
      ++qp->retries_;
      goBackN(qp, now);
      did = true;
    }
  }
  if (qp->ackPending_ && qp->in_) {
    sendAck(qp, kAckOk, kCqeOk);
    did = true;
  }
  return did;
}

// Takes WQEs into staging as long as there is room, and sends their packets.
bool Nic::pumpSend(SoftQp* qp, int64_t now) {
  bool did = false;
  Conn* c = qp->out_;
  const size_t highWater = 4 * (chunkBytes_ + sizeof(FrameHeader)) + (64 << 10);
  const uint32_t ringMask = static_cast<uint32_t>(qp->inflight_.size() - 1);
  qp->stalledOnStaging_ = false;
  while (c && !c->closed && c->out.size() - c->outDone < highWater) {
    if (!qp->haveCur_) {
      if (qp->readPending_) break;
      if (qp->sqPosted(true) == 0) break;
      if (!takeWqe(qp)) return true;
      const uint8_t op = qp->cur_.opcode;
      // A read lands in local memory: its region must allow local writes.
      const uint32_t localAccess = op == kWqeRdmaRead ? uint32_t{kAccessLocalWrite} : 0u;
      if (!qp->curInline_ && qp->cur_.length &&
          !translate(qp->cur_.lkey, qp->cur_.localAddr, qp->cur_.length, localAccess)) {
        setError(qp, kCqeLocalProtectionError, "WQE names memory outside its lkey's region");
        return true;
      }
    }
    if (qp->inflightTail_ - qp->inflightHead_ > ringMask) break;
    const Wqe& w = qp->cur_;
    const bool isRead = w.opcode == kWqeRdmaRead;
    // A read request is one packet without payload, whatever the length it asks for.
    const uint32_t len =
        isRead ? 0 : std::min<uint32_t>(w.length - qp->curOffset_, static_cast<uint32_t>(chunkBytes_));
    int32_t chunk = -1;
    char* payload = nullptr;
    if (len) {
      char* src = qp->curInline_ ? reinterpret_cast<char*>(qp->curWqe_.bytes) + w.localAddr + qp->curOffset_
                                 : translate(w.lkey, w.localAddr + qp->curOffset_, len, 0);
      if (inStaging(src, len)) {
        // Device memory is carved out of this staging: the bytes already sit where packets
        // are sent and resent from, and the producer leaves them alone until the WQE
        // retires (the gdr transport's credit), so no copy.
        payload = src;
        ctr_.zeroCopyPackets.fetch_add(1, std::memory_order_relaxed);
      } else {
        chunk = allocChunk();
        if (chunk < 0) {
          // Back-pressure: the WQE stays in the send queue until acks free staging.
          if (!qp->stalledOnStaging_) ctr_.stagingStalls.fetch_add(1, std::memory_order_relaxed);
          qp->stalledOnStaging_ = true;
          break;
        }
        payload = staging_ + static_cast<size_t>(chunk) * chunkBytes_;
        std::memcpy(payload, src, len);
      }
    }
    Packet& p = qp->inflight_[qp->inflightTail_ & ringMask];
    const bool first = qp->curOffset_ == 0;
    const bool last = isRead || qp->curOffset_ + len == w.length;
    p.hdr = FrameHeader{};
    p.hdr.magic = kFrameMagic;
    p.hdr.type = kFrameData;
    p.hdr.flags = static_cast<uint8_t>((first ? kFrameFirst : 0) | (last ? kFrameLast : 0));
    p.hdr.opcode = w.opcode == kWqeNop ? uint8_t{kWqeRdmaWrite} : w.opcode;  // a NOP: 0 bytes, in order
    p.hdr.seq = qp->nextSeq_++;
    p.hdr.length = len;
    p.hdr.immData = w.immData;
    p.hdr.msgLength = w.length;
    p.hdr.remoteAddr = w.remoteAddr + qp->curOffset_;
    p.hdr.rkey = w.rkey;
    p.hdr.msgOffset = qp->curOffset_;
    p.payload = payload;
    p.chunk = chunk;
    p.wqeIndex = qp->sqCi_;
    p.lastOfWqe = last;
    p.wqeBbs = qp->curBbs_;
    p.mlx5Opcode = qp->curMlx5Opcode_;
    p.wqeFlags = w.flags;
    p.wrId = qp->curWrId_;
    p.sentNs = now;
    p.readLocal = w.localAddr;
    p.readLkey = w.lkey;
    p.readDone = 0;
    p.readComplete = false;
    if (isRead) qp->readPending_ = true;
    if (qp->inflightHead_ == qp->inflightTail_) qp->lastProgressNs_ = now;
    ++qp->inflightTail_;
    transmit(qp, p.hdr, payload, now);
    qp->curOffset_ += len;
    if (last) {
      qp->haveCur_ = false;
      qp->sqCi_ += qp->curBbs_;
    }
    did = true;
  }
  return did;
}

// Completes WQEs whose last packet the target acknowledged, in order.
bool Nic::retireAcked(SoftQp* qp) {
  bool did = false;
  const uint32_t mask = static_cast<uint32_t>(qp->inflight_.size() - 1);
  while (qp->inflightHead_ != qp->inflightTail_) {
    Packet& p = qp->inflight_[qp->inflightHead_ & mask];
    if (!seqBefore(p.hdr.seq, qp->ackedUpTo_)) break;
    // A read is done when its whole response landed, not when the request was acknowledged.
    const bool isRead = p.hdr.opcode == kWqeRdmaRead;
    if (isRead && !p.readComplete) break;
    if (p.lastOfWqe && (p.wqeFlags & kWqeSignaled)) {
      if (!qp->scq_->hasRoom()) {
        ctr_.cqFullStalls.fetch_add(1, std::memory_order_relaxed);
        break;
      }
      // Slot free before the completion is visible: a poller may post again at once.
      storeRelease(&qp->sqRetired_, p.wqeIndex + p.wqeBbs);
      qp->scq_->push(mlx5::kCqeReq, p.mlx5Opcode, p.wqeIndex, qp->qpn_, p.hdr.msgLength, 0, 0, p.wrId);
    }
    freeChunk(p.chunk);
    if (p.lastOfWqe) storeRelease(&qp->sqRetired_, p.wqeIndex + p.wqeBbs);
    if (isRead) qp->readPending_ = false;
    ++qp->inflightHead_;
    did = true;
  }
  return did;
}

// The QP is in the error state: complete every outstanding WQE (the first with the error
// that caused it, the rest as flushed), and every posted receive as flushed.
bool Nic::flushQp(SoftQp* qp) {
  bool did = false;
  const uint32_t mask = static_cast<uint32_t>(qp->inflight_.size() - 1);
  qp->heldCount_ = 0;
  qp->ackPending_ = false;
  qp->readPending_ = false;
  auto nextStatus = [&]() -> uint8_t {
    if (qp->errorReported_ || qp->errorStatus_ == kCqeOk) return kCqeFlushed;
    qp->errorReported_ = true;
    return qp->errorStatus_;
  };
  // Packets of WQEs already taken: one completion per WQE.
  while (qp->inflightHead_ != qp->inflightTail_) {
    Packet& p = qp->inflight_[qp->inflightHead_ & mask];
    if (p.lastOfWqe) {
      if (!qp->scq_->hasRoom()) return did;
      storeRelease(&qp->sqRetired_, p.wqeIndex + p.wqeBbs);
      qp->scq_->push(mlx5::kCqeReqErr, p.mlx5Opcode, p.wqeIndex, qp->qpn_, 0, 0, syndromeOf(nextStatus()),
                     p.wrId);
    }
    freeChunk(p.chunk);
    ++qp->inflightHead_;
    did = true;
  }
  // The WQE being cut into packets and the ones not yet taken. A flushed WQE is consumed
  // too (its error CQE says so), so the trace gets its line like a taken one; the one being
  // cut was traced when it was taken.
  bool tracedCurrent = qp->haveCur_;
  while (qp->sqPosted(true) != 0) {
    if (!qp->scq_->hasRoom()) return did;
    mlx5::WqeFields f{};
    mlx5::decodeCtrl(qp->sq_ + static_cast<size_t>(qp->sqCi_ & (qp->sqSize_ - 1)) * mlx5::kWqeBbBytes, &f);
    const uint32_t bbs = std::max<uint32_t>(1, mlx5::wqeBbs(f.ds));
    if (!tracedCurrent && Trace::get().on() && bbs <= mlx5::kMaxWqeBbs) {
      for (uint32_t b = 0; b < bbs; ++b)
        std::memcpy(qp->curWqe_.bytes + b * mlx5::kWqeBbBytes,
                    qp->sq_ + static_cast<size_t>((qp->sqCi_ + b) & (qp->sqSize_ - 1)) * mlx5::kWqeBbBytes,
                    mlx5::kWqeBbBytes);
      Trace::get().wqe(qp->qpn_, qp->sqCi_, qp->curWqe_.bytes, bbs * mlx5::kWqeBbBytes);
    }
    tracedCurrent = false;
    qp->scq_->push(mlx5::kCqeReqErr, f.opcode, qp->sqCi_, qp->qpn_, 0, 0, syndromeOf(nextStatus()),
                   qp->sqWrId_[qp->sqCi_ & (qp->sqSize_ - 1)]);
    qp->sqCi_ += bbs;
    storeRelease(&qp->sqRetired_, qp->sqCi_);
    did = true;
  }
  qp->haveCur_ = false;
  while (qp->rqPosted() != 0) {
    if (!qp->rcq_->hasRoom()) return did;
    qp->rcq_->push(mlx5::kCqeRespErr, 0, qp->rqCi_, qp->qpn_, 0, 0, mlx5::kSyndWrFlush,
                   qp->rqWrId_[qp->rqCi_ & (qp->rqSize_ - 1)]);
    ++qp->rqCi_;
    storeRelease(&qp->rqConsumed_, qp->rqCi_);
    did = true;
  }
  return did;
}

void Nic::goBackN(SoftQp* qp, int64_t now) {
  const uint32_t mask = static_cast<uint32_t>(qp->inflight_.size() - 1);
  for (uint32_t i = qp->inflightHead_; i != qp->inflightTail_; ++i) {
    Packet& p = qp->inflight_[i & mask];
    p.sentNs = now;
    ctr_.retransmittedPackets.fetch_add(1, std::memory_order_relaxed);
    transmit(qp, p.hdr, p.payload, now);
  }
  qp->lastRetxNs_ = now;
}

}  // namespace softnic
}  // namespace ridge
