// The NIC's TCP connections: accepting a sender (hello, CMA probe), reading frames off a
// socket and dispatching them, queueing data and acknowledgement frames, writing queued
// bytes, closing.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "bootstrap/bootstrap.h"
#include "bootstrap/socket.h"
#include "transports/softnic/nic.h"
#include "transports/softnic/queues.h"

namespace ridge {
namespace softnic {

using namespace verbs;

void Nic::detachConn(Conn* c) {
  if (c->qp) {
    if (c->qp->out_ == c) c->qp->out_ = nullptr;
    if (c->qp->in_ == c) c->qp->in_ = nullptr;
    c->qp = nullptr;
  }
}

void Nic::closeConn(Conn* c, const char* why) {
  if (c->closed) return;
  c->closed = true;
  SoftQp* qp = c->qp;
  if (why && qp && c->outbound && qp->state() != QpState::Error) {
    // The target is gone: everything not yet acknowledged can never complete.
    setError(qp, kCqeTransportRetryExceeded, why);
  }
  detachConn(c);
  if (c->fd >= 0) {
    epoll_ctl(epollFd_, EPOLL_CTL_DEL, c->fd, nullptr);
    ::close(c->fd);
    c->fd = -1;
  }
  // Freed at the end of the engine iteration (an event for it may still be in hand).
}

void Nic::emitData(Conn* c, const FrameHeader& hdr, const char* payload) {
  FrameHeader h = hdr;
  const bool inlinePayload = !c->cma && h.length > 0;
  if (c->cma && h.length) {
    h.flags |= kFrameCmaPayload;
    h.stagingAddr = reinterpret_cast<uint64_t>(payload);
  }
  const size_t at = c->out.size();
  c->out.resize(at + sizeof h + (inlinePayload ? h.length : 0));
  std::memcpy(c->out.data() + at, &h, sizeof h);
  if (inlinePayload) std::memcpy(c->out.data() + at + sizeof h, payload, h.length);
  ctr_.packetsSent.fetch_add(1, std::memory_order_relaxed);
}

void Nic::sendAck(SoftQp* qp, uint8_t kind, uint8_t status) {
  Conn* c = qp->in_;
  qp->ackPending_ = false;
  if (!c || c->closed) return;
  if (opt_.faults.drop > 0 && random01() < opt_.faults.drop) {
    ctr_.injectedDrops.fetch_add(1, std::memory_order_relaxed);
    return;  // a later ack (cumulative) or the sender's resend repairs it
  }
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.type = kFrameAck;
  h.opcode = kind;
  h.status = status;
  h.seq = qp->expectedSeq_;
  const size_t at = c->out.size();
  c->out.resize(at + sizeof h);
  std::memcpy(c->out.data() + at, &h, sizeof h);
  ctr_.acksSent.fetch_add(1, std::memory_order_relaxed);
  if (kind == kAckNak) ctr_.naksSent.fetch_add(1, std::memory_order_relaxed);
}

void Nic::flushConn(Conn* c) {
  while (c->outDone < c->out.size()) {
    ssize_t w =
        ::send(c->fd, c->out.data() + c->outDone, c->out.size() - c->outDone, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      c->outDone += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    closeConn(c, "the peer NIC closed the connection");
    return;
  }
  if (c->outDone == c->out.size()) {
    c->out.clear();
    c->outDone = 0;
  } else if (c->outDone > (1u << 20)) {
    c->out.erase(c->out.begin(), c->out.begin() + static_cast<ptrdiff_t>(c->outDone));
    c->outDone = 0;
  }
  const bool want = c->outDone < c->out.size();
  if (want != c->pollingOut) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP | (want ? static_cast<uint32_t>(EPOLLOUT) : 0u);
    ev.data.ptr = c;
    epoll_ctl(epollFd_, EPOLL_CTL_MOD, c->fd, &ev);
    c->pollingOut = want;
  }
}

void Nic::acceptAll() {
  for (;;) {
    int fd = ::accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    handleAccepted(fd);
  }
}

// A sender connects: read its hello (sent right after connect, so this wait is short and
// bounded), bind the connection to the named QP, and say whether we will read payloads
// out of its memory.
void Nic::handleAccepted(int fd) {
  if (!configureSocket(fd).isOk()) {
    ::close(fd);
    return;
  }
  Hello hello{};
  Deadline d = Deadline::after(5);
  if (!recvAll(fd, &hello, sizeof hello, d, "softnic: hello").isOk() || hello.magic != kHelloMagic ||
      hello.version != kWireVersion) {
    ::close(fd);
    return;
  }
  SoftQp* qp = nullptr;
  for (SoftQp* q : qps_)
    if (q->qpn_ == hello.dstQpn) qp = q;
  HelloReply reply{kHelloMagic, qp ? 0u : 1u, 0, 0};
  if (qp && hello.wantCma && hello.hostHash == hostHash()) {
    uint64_t got = 0;
    iovec l{&got, sizeof got};
    iovec r{reinterpret_cast<void*>(hello.probeAddr), sizeof got};
    if (process_vm_readv(hello.pid, &l, 1, &r, 1, 0) == static_cast<ssize_t>(sizeof got) &&
        got == hello.probeValue)
      reply.cma = 1;
  }
  if (!sendAll(fd, &reply, sizeof reply, d, "softnic: hello reply").isOk() || !qp) {
    ::close(fd);
    return;
  }
  if (qp->in_) closeConn(qp->in_, nullptr);
  Conn* c = new Conn;
  c->fd = fd;
  c->outbound = false;
  c->cma = reply.cma != 0;
  c->peerPid = hello.pid;
  c->qp = qp;
  c->in.resize(4 * (chunkBytes_ + sizeof(FrameHeader)));
  conns_.push_back(c);
  qp->in_ = c;
  qp->expectedSeq_ = 0;
  qp->nakSentFor_ = UINT32_MAX;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.ptr = c;
  epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd, &ev);
}

void Nic::readConn(Conn* c) {
  for (int rounds = 0; rounds < 16 && !c->closed; ++rounds) {
    if (c->inLen == c->in.size()) c->in.resize(c->in.size() * 2);  // a frame larger than the buffer
    ssize_t got = ::recv(c->fd, c->in.data() + c->inLen, c->in.size() - c->inLen, MSG_DONTWAIT);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      closeConn(c, "the peer NIC closed the connection");
      return;
    }
    if (got < 0) return;
    c->inLen += static_cast<size_t>(got);
    size_t pos = 0;
    while (!c->closed && c->inLen - pos >= sizeof(FrameHeader)) {
      FrameHeader h;
      std::memcpy(&h, c->in.data() + pos, sizeof h);
      if (h.magic != kFrameMagic) {
        closeConn(c, "malformed frame from the peer NIC");
        return;
      }
      const bool hasInline =
          (h.type == kFrameData && !(h.flags & kFrameCmaPayload)) || h.type == kFrameReadResp;
      const size_t frameBytes = sizeof h + (hasInline ? h.length : 0);
      if (c->inLen - pos < frameBytes) {
        if (frameBytes > c->in.size()) c->in.resize(frameBytes);
        break;
      }
      if (h.type == kFrameData)
        handleData(c, h, hasInline ? c->in.data() + pos + sizeof h : nullptr);
      else if (h.type == kFrameAck)
        handleAck(c, h);
      else if (h.type == kFrameReadResp)
        handleReadResponse(c, h, c->in.data() + pos + sizeof h);
      pos += frameBytes;
    }
    if (c->closed) return;
    if (pos) {
      std::memmove(c->in.data(), c->in.data() + pos, c->inLen - pos);
      c->inLen -= pos;
    }
    if (static_cast<size_t>(got) < c->in.size() / 2) return;  // drained for now
  }
}

}  // namespace softnic
}  // namespace ridge
