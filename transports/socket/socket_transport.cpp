// TCP transport: connects ranks on different hosts (or, with RIDGE_SHM=0, on one host)
// through several TCP connections ("streams") per pair of ranks.
//
// Threads. The algorithm thread sees only the slot FIFOs of transport.h. Two progress
// threads per transport ("lanes") move bytes between those FIFOs and the sockets: the
// send lane writes posted slots, the receive lane reads pieces into free slots. So the
// coroutines never make a system call (but a thread that only waits for its sends, which
// writes them itself: SockSend::sendsComplete), a reduction of one chunk overlaps the transfer of
// the next, and the kernel's copies in the two directions run on two cores when there
// are two. Each FIFO is a single-producer single-consumer ring in this process's memory:
//   send FIFO:  `head` counts posts (algorithm), `tail` counts slots fully written to
//               the sockets (send lane);
//   recv FIFO:  `head` counts slots fully received (receive lane), `tail` counts
//               releases (algorithm).
// Counters grow forever and wrap at 2^32. A post stores the slot's metadata, then
// publishes `head` with release ordering; the reader acquires it before the payload.
//
// Wire format. A slot of `bytes` payload is cut into `pieces` pieces (1 below 128 KiB,
// else up to one per stream, 4 KiB aligned); piece j of slot sequence number `seq`
// travels on stream (seq + j) % streams, prefixed by a 16-byte PieceHeader. Every stream
// thus carries its pieces in increasing `seq` order, and the receiver writes each one
// straight into the right offset of recv slot seq % nslots; the slot is complete when all
// of its pieces are in. Flow control is TCP's: a receiver reads a piece only once its
// slot is free, so a full FIFO leaves the data in the socket buffers and the sender's
// send() meets EAGAIN.
//
// Sleeping. Each side announces sleep in a flag, re-checks its work, then sleeps (the
// algorithm on a futex word, each lane in epoll_wait with an eventfd of its own). The
// other side publishes its counter, issues a full fence and only when the flag is set
// makes the wake-up system call, so a busy pipeline makes none.
//
// Failures. A connection that is reset, ends inside a chunk, or sends a malformed header
// marks its peer failed (ridgeRemoteError with the reason); so does the orderly end of
// all of a peer's connections (nothing more can arrive). checkPeer reports it, so only an
// operation that waits on that peer fails. Waits are bounded by the executor's
// RIDGE_TIMEOUT; connection set-up by RIDGE_TIMEOUT and the abort flag. Destruction
// first lets the send lane finish the posted slots, so a peer that left right after its
// last collective still delivers its data.
#include <linux/futex.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <ctime>
#include <deque>
#include <thread>

#include "bootstrap/bootstrap.h"
#include "bootstrap/socket.h"
#include "core/cpus.h"
#include "core/log.h"
#include "core/settings.h"
#include "transports/socket/socket_hooks.h"
#include "transports/socket/socket_pieces.h"
#include "transports/transport.h"

namespace ridge {

extern const TransportTable kSocketTransportTable;

namespace {

constexpr uint32_t kLastFlag = 1u << 31;
// In a receive FIFO's meta: the chunk landed at the destination declared by tryExpect.
constexpr uint32_t kLandedFlag = 1u << 30;
constexpr uint32_t kSizeMask = kLandedFlag - 1;
constexpr uint32_t kPieceMagic = 0x52534b54u;  // "RSKT"
constexpr uint32_t kHelloMagic = 0x52534b48u;  // "RSKH"
constexpr uint32_t kMaxSlots = 64;
constexpr int kMaxStreams = 16;
// Pieces are at least this large: below it the cost of a header and a system call per
// stream is larger than what striping gains.
constexpr uint32_t kMinPiece = 64 << 10;
constexpr uint32_t kPieceAlign = 4096;
// SockSend::directSendMinBytes.
constexpr size_t kDirectSendMin = 128 << 10;
constexpr size_t kLine = 64;

struct PieceHeader {
  uint32_t seq;
  uint32_t sizeAndLast;  // payload bytes of the whole slot | kLastFlag
  uint16_t piece;
  uint16_t pieces;
  uint32_t check;  // kPieceMagic ^ seq ^ sizeAndLast: catches a stream out of step
};
static_assert(sizeof(PieceHeader) == 16);

uint32_t headerCheck(const PieceHeader& h) {
  return kPieceMagic ^ h.seq ^ h.sizeAndLast ^ (uint32_t{h.piece} << 16 | h.pieces);
}

// First message on every connection, from the connecting rank.
struct Hello {
  uint32_t magic;
  int32_t fromRank;
  uint32_t stream;
  uint32_t streams;
  uint64_t token;  // the accepting rank's token: proves the connection belongs to this communicator
};
static_assert(sizeof(Hello) == 24, "docs/transports.md gives the hello's size");

// What every rank publishes through the bootstrap at set-up.
struct Endpoint {
  uint8_t addr[sizeof(sockaddr_storage)];
  uint32_t addrLen;
  uint32_t streams;
  uint64_t token;
  uint64_t slotBytes;
  uint32_t nslots;
  uint32_t streamsAuto;  // 1: `streams` is this rank's RIDGE_SOCKET_STREAMS=0 proposal
};

SocketAddress endpointAddress(const Endpoint& e) {
  return SocketAddress::fromSockaddr(reinterpret_cast<const sockaddr*>(e.addr), e.addrLen);
}

uint32_t piecesFor(uint32_t bytes, int streams) {
  // Every piece but a rounded-off last one holds at least kMinPiece.
  return std::clamp<uint32_t>(bytes / kMinPiece, 1, static_cast<uint32_t>(streams));
}

void pieceRange(uint32_t bytes, uint32_t pieces, uint32_t j, uint32_t* off, uint32_t* len) {
  uint64_t per = (uint64_t{bytes} + pieces - 1) / pieces;
  per = (per + kPieceAlign - 1) / kPieceAlign * kPieceAlign;
  uint64_t begin = std::min<uint64_t>(bytes, per * j);
  uint64_t end = std::min<uint64_t>(bytes, begin + per);
  *off = static_cast<uint32_t>(begin);
  *len = static_cast<uint32_t>(end - begin);
}

long futexCall(std::atomic<uint32_t>* word, int op, uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, ts, nullptr, 0);
}

// Shared between the algorithm thread and the progress thread, one per direction and
// peer. The two counters sit on their own cache lines.
struct Fifo {
  alignas(kLine) std::atomic<uint32_t> head{0};
  alignas(kLine) std::atomic<uint32_t> tail{0};
  // Receive FIFO only: positions below `grant` have a declared landing place (dest[],
  // null = the slot), written by the algorithm before it publishes `grant`. The lane reads
  // a chunk only once it is granted; grant - tail never exceeds the slot count.
  alignas(kLine) std::atomic<uint32_t> grant{0};
  alignas(kLine) uint32_t meta[kMaxSlots] = {};  // bytes | kLastFlag (| kLandedFlag), written before head
  // Send FIFO: caller memory of a direct post (null: the slot). Receive FIFO: declared
  // destination and its room. Written before the counter that publishes the position.
  const char* src[kMaxSlots] = {};
  char* dest[kMaxSlots] = {};
  uint32_t destCap[kMaxSlots] = {};
  char* data = nullptr;
};

class SocketTransport;

class SockSend final : public SendConnector {
 public:
  SockSend(int peer, Fifo* fifo, uint32_t nslots, size_t slotBytes, SocketTransport* t, bool direct)
      : SendConnector(slotBytes, peer), fifo_(fifo), nslots_(nslots), transport_(t), direct_(direct) {}
  void* tryAcquire() override {
    if (!hasRoom()) return nullptr;
    return fifo_->data + static_cast<size_t>(head_ % nslots_) * slotBytes();
  }
  void post(uint32_t bytes, bool last) override {
    fifo_->src[head_ % nslots_] = nullptr;
    publish(bytes, last);
  }
  // The send FIFO, then as many positions as the receiver declares ahead (its FIFO's
  // size); RIDGE_SOCKET_SLOTS is the same on every rank.
  uint32_t chunksInFlight() const override { return 2 * nslots_; }
  uint32_t directVersion() const override { return direct_ ? kDirectTransferVersion : 0; }
  bool tryPostDirect(const void* src, uint32_t bytes, bool last) override {
    if (!hasRoom()) return false;
    fifo_->src[head_ % nslots_] = static_cast<const char*>(src);
    publish(bytes, last);
    directEnd_ = head_;
    return true;
  }
  bool sendsComplete() override;
  void withdrawDirect() override;
  // From 128 KiB a direct send is faster (issue 21, docs/performance.md "Sendrecv over TCP
  // at 256 KiB"): the caller, which waits for its sends anyway, writes the message itself
  // (sendsComplete), where a copied slot costs a memcpy plus waking the send lane and
  // waiting for it to be scheduled, and a two-core host then runs the caller's receive,
  // both lanes and the peer's threads at once. Below it the copy is cheap and the call
  // returns without waiting for the socket.
  size_t directSendMinBytes() const override { return std::min<size_t>(slotBytes(), kDirectSendMin); }
  // The first queued position (posted, not yet handed back) that holds caller memory, or
  // the FIFO's head when none does: the slots before it are the transport's own memory.
  uint32_t firstQueuedDirect() const {
    uint32_t pos = fifo_->tail.load(std::memory_order_acquire);
    while (pos != head_ && !fifo_->src[pos % nslots_]) ++pos;
    return pos;
  }

 private:
  bool hasRoom() {
    if (head_ - cachedTail_ < nslots_) return true;
    cachedTail_ = fifo_->tail.load(std::memory_order_acquire);
    return head_ - cachedTail_ < nslots_;
  }
  void publish(uint32_t bytes, bool last);

  Fifo* fifo_;
  uint32_t nslots_;
  SocketTransport* transport_;
  uint32_t head_ = 0;
  uint32_t cachedTail_ = 0;
  uint32_t directEnd_ = 0;  // head_ after the latest direct post
  // The tail when an inline pump last found the socket full: no new attempt (and system
  // call) until the lane has moved the tail on.
  uint32_t inlineStallTail_ = 0;
  bool inlineStalled_ = false;
  bool direct_;  // RIDGE_SOCKET_DIRECT
};

class SockRecv final : public RecvConnector {
 public:
  SockRecv(int peer, Fifo* fifo, uint32_t nslots, size_t slotBytes, SocketTransport* t, bool direct)
      : RecvConnector(slotBytes, peer), fifo_(fifo), nslots_(nslots), transport_(t), direct_(direct) {}
  const void* tryPeek(SlotInfo* info) override {
    if (tail_ == cachedHead_) {
      // A slot-only user declares nothing: read ahead into every free slot, as before the
      // direct extension existed.
      if (tail_ == grant_) grantSlotsAhead();
      cachedHead_ = fifo_->head.load(std::memory_order_acquire);
      if (tail_ == cachedHead_) return nullptr;
    }
    const uint32_t i = tail_ % nslots_;
    uint32_t meta = fifo_->meta[i];
    info->bytes = meta & kSizeMask;
    info->lastOfMessage = (meta & kLastFlag) != 0;
    if (meta & kLandedFlag) return fifo_->dest[i];
    return fifo_->data + static_cast<size_t>(i) * slotBytes();
  }
  void release() override;
  uint32_t directVersion() const override { return direct_ ? kDirectTransferVersion : 0; }
  bool tryExpect(void* dst, uint32_t capacity) override;
  uint32_t declaredAhead() const override { return grant_ - tail_; }
  void endReadAhead() override { readAhead_ = false; }
  void withdrawDirect() override;

 private:
  void grantSlotsAhead();
  void publishGrant();

  Fifo* fifo_;
  uint32_t nslots_;
  SocketTransport* transport_;
  uint32_t tail_ = 0;
  uint32_t cachedHead_ = 0;
  uint32_t grant_ = 0;
  // Slot-only use: every release declares one more slot. Cleared by the first tryExpect or
  // by endReadAhead, set again when a tryPeek finds nothing declared.
  bool readAhead_ = true;
  uint32_t directEnd_ = 0;  // grant_ after the latest declaration with a destination
  bool direct_;             // RIDGE_SOCKET_DIRECT
};

// Progress-thread state of one TCP connection.
struct Stream {
  int fd = -1;
  int peer = -1;
  int index = 0;
  // Set by whichever lane sees the connection fail; both lanes then leave it alone.
  std::atomic<bool> dead{false};
  // Edge-triggered readiness: set by epoll, cleared when a call meets EAGAIN (readable by
  // the receive lane only; writable written by the send lane only, read by the algorithm
  // thread too before it writes in the lane's place, SockSend::sendsComplete).
  bool readable = true;
  std::atomic<bool> writable{true};
  // Sending: the next slot sequence number to look at (while `sending`: the chunk of the
  // first piece not fully written), and the pieces being written, up to kSendBatch queued
  // ones in one system call: a collective's header chunk goes out with its data chunk in
  // one sendmsg and one segment train, so the receiver wakes once instead of once for the
  // header alone (issue 21).
  static constexpr int kSendBatch = 4;
  uint32_t sendSeq = 0;
  bool sending = false;
  int sendCount = 0;      // pieces in the batch
  int sendFirst = 0;      // the first piece of the batch not fully written
  uint32_t sendDone = 0;  // bytes of that piece's header + payload written
  PieceHeader sendHdr[kSendBatch]{};
  const char* sendPayload[kSendBatch] = {};
  uint32_t sendLen[kSendBatch] = {};
  // Receiving: header bytes so far, then the payload of the current piece.
  PieceHeader recvHdr{};
  uint32_t hdrGot = 0;
  bool inPayload = false;
  char* recvPayload = nullptr;
  uint32_t recvLen = 0;
  uint32_t recvGot = 0;
  uint32_t recvSeq = 0;  // of the piece in the payload phase (recvHdr may hold the next one)
  uint32_t lastRecvSeq = 0;
  bool anyRecv = false;
  // The peer closed its side in an orderly way (end of stream at a piece boundary): all it
  // sent on this stream has been read. Receive lane only.
  bool eof = false;
};

// Progress-thread state of one peer.
struct PeerState {
  bool connected = false;
  Fifo send;
  Fifo recv;
  std::vector<char> sendData, recvData;
  // Send side: tail as the progress thread knows it.
  uint32_t sendTail = 0;
  // Held by whichever thread writes the peer's send state (its streams' send fields,
  // sendTail): the send lane, or the algorithm thread pumping in its place while it waits
  // for its sends to complete (SocketTransport::pumpSendsInline).
  std::atomic<bool> sendBusy{false};
  // Recv side: pieces received per slot, and each slot's header fields.
  uint32_t recvHead = 0;
  uint8_t recvGotCount[kMaxSlots] = {};
  uint8_t recvPieces[kMaxSlots] = {};
  uint32_t recvSize[kMaxSlots] = {};  // sizeAndLast; 0xffffffff = no piece seen yet
  char* recvBase[kMaxSlots] = {};     // where the chunk lands: its slot or its declared destination
  bool recvLanded[kMaxSlots] = {};    // recvBase is the declared destination
  std::vector<int> streams;           // indices into SocketTransport::streams_
  // Failure, published once by the first lane to see one (message first, then the flag).
  std::atomic<int> failClaimed{0};
  int eofStreams = 0;  // receive lane only
  std::string failure;
  std::atomic<int> failed{0};
  // Each lane's pass counter when the failure was published (before `failed`): the failure is
  // final once both lanes finished that pass, since a pass in flight may still hand back a
  // slot it wrote or complete a chunk it read (checkPeer).
  uint64_t failedAtPass[2] = {};
  std::string name;  // "rank 3 at 10.0.0.2:41234" for messages
};

// One progress thread with its epoll set, wake-up eventfd and sleep flag.
struct Lane {
  bool sends = false;  // the send lane; else the receive lane
  int epollFd = -1;
  int eventFd = -1;
  std::thread thread;
  alignas(kLine) std::atomic<uint32_t> sleeping{0};
  // Passes of the progress loop completed, and whether the loop has ended: withdrawDirect
  // waits for the pass in flight so that no system call still uses caller memory.
  std::atomic<uint64_t> passes{0};
  std::atomic<bool> exited{false};
  // Wakes the lane if it announced that it may sleep; the fence orders the caller's
  // counter publish before the read of the flag (the lane fences the other way). The first
  // waker clears the flag, so a burst of posts (a header and its data chunk) writes the
  // eventfd once: the later ones find the wake-up on its way.
  void wake() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sleeping.load(std::memory_order_relaxed) && sleeping.exchange(0, std::memory_order_relaxed))
        [[unlikely]] {
      uint64_t one = 1;
      ssize_t n = ::write(eventFd, &one, sizeof one);
      (void)n;  // EAGAIN means a wake-up is pending already
    }
  }
};

class SocketTransport final : public Transport {
 public:
  ~SocketTransport() override { shutdown(); }
  const char* name() const override { return "socket"; }
  SendConnector* sendTo(int peer) override {
    return peer >= 0 && peer < static_cast<int>(send_.size()) ? send_[peer].get() : nullptr;
  }
  RecvConnector* recvFrom(int peer) override {
    return peer >= 0 && peer < static_cast<int>(recv_.size()) ? recv_[peer].get() : nullptr;
  }

  void waitForActivity(int64_t maxWaitNs, bool (*stillIdle)(void*), void* arg) override {
    uint32_t word = wakeWord_.load(std::memory_order_acquire);
    algoSleeping_.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (stillIdle(arg)) {
      timespec ts{static_cast<time_t>(maxWaitNs / 1000000000), static_cast<long>(maxWaitNs % 1000000000)};
      futexCall(&wakeWord_, FUTEX_WAIT_PRIVATE, word, &ts);
    }
    algoSleeping_.store(0, std::memory_order_relaxed);
  }

  int progressThreads() const override { return 2; }  // the send and receive lanes

  // What is queued for a peer whose send lane is not at it goes out from this thread, as a
  // waiting sender's chunks do (SockSend::sendsComplete): a header with the data chunk posted
  // behind it in one write. The lane was woken by the posts; it finds the work done. Only a
  // few small chunks (at most kDirectSendMin in all: headers, messages copied into a slot):
  // larger ones stay with the lane, which writes them on another core while this thread
  // goes on with what arrives (a ring's next chunk), and a direct message's caller writes
  // its own when it waits for it.
  void flushSends() override {
    for (int peer : activePeers_) {
      PeerState& p = *peers_[peer];
      const uint32_t head = p.send.head.load(std::memory_order_relaxed);  // this thread posts
      uint32_t pos = p.send.tail.load(std::memory_order_acquire);
      if (pos == head || p.sendBusy.load(std::memory_order_relaxed)) continue;
      size_t queued = 0;
      for (; pos != head && queued <= kDirectSendMin; ++pos) queued += p.send.meta[pos % nslots_] & kSizeMask;
      if (queued <= kDirectSendMin) (void)pumpSendsInline(peer);
    }
  }

  Status checkPeer(int peer) override {
    if (peer < 0 || peer >= static_cast<int>(peers_.size()) || !peers_[peer] || !peers_[peer]->connected)
      return Status::ok();
    PeerState& p = *peers_[peer];
    if (p.failed.load(std::memory_order_acquire)) {
      // Not yet final while a lane is still in the pass during which the peer failed: the
      // send lane may have written a chunk and not yet handed its slot back (a peer that got
      // our last chunk, finished and closed its connections, all before that), and the receive
      // lane may complete one more chunk. Passes are short (a lane never blocks inside one):
      // wait a little here, else the caller checks again at its next idle round.
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
      for (Lane& lane : lanes_) {
        while (lane.thread.joinable() && !lane.exited.load(std::memory_order_acquire) &&
               lane.passes.load(std::memory_order_seq_cst) == p.failedAtPass[lane.sends ? 0 : 1]) {
          if (std::chrono::steady_clock::now() >= until) return Status::ok();
          lane.wake();
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
      }
      return Status(ridgeRemoteError, p.failure);
    }
    if (progressFailed_.load(std::memory_order_acquire)) return Status(ridgeSystemError, progressFailure_);
    return Status::ok();
  }

  // Set-up: the phases below, in order (connect says which).
  Status connect(const TransportSetup& setup);

  // Called by the connectors after publishing a counter: a post concerns the send lane,
  // a release the receive lane (a piece may wait for that slot).
  void wakeSendLane() { lanes_[0].wake(); }
  void wakeRecvLane() { lanes_[1].wake(); }
  // An operation gave up while caller memory of `peer` was queued or declared: fail the
  // peer (its streams are then skipped) and wait until the lane's pass in flight is over.
  void withdrawDirect(int peer, bool sendSide);
  // The algorithm thread, waiting for its sends to `peer` to complete, writes the queued
  // pieces itself when the send lane is not at them. False when it left some (the socket
  // was full, or the lane holds the peer): the lane carries on.
  bool pumpSendsInline(int peer);

 private:
  // As Lane::wake: only the first waker of a sleep makes the system call.
  void wakeAlgorithm() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (algoSleeping_.load(std::memory_order_relaxed) && algoSleeping_.exchange(0, std::memory_order_relaxed))
        [[unlikely]] {
      wakeWord_.fetch_add(1, std::memory_order_release);
      futexCall(&wakeWord_, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr);
    }
  }
  void choosePeers(const TransportSetup& setup);
  void readGeometrySettings(const TransportSetup& setup, bool* streamsAuto);
  Status exchangeEndpoints(const TransportSetup& setup, bool streamsAuto, Socket* listener,
                           SocketAddress* bound, std::string* ifName, std::vector<Endpoint>* endpoints);
  Status openStreams(const TransportSetup& setup, const Socket& listener, const std::vector<Endpoint>& eps);
  void createConnectors();
  Status startProgressLanes();
  void shutdown();
  void progressLoop(Lane& lane);
  void progressPasses(Lane& lane);
  // inLane: the send lane's own pass (it alone records EAGAIN in `writable`; a pump by the
  // algorithm thread stops there and leaves the rest to the lane, which then meets EAGAIN
  // itself, so that no readiness edge from epoll is overwritten). *full: EAGAIN was met.
  bool pumpSend(Stream& s, PeerState& p, bool inLane, bool* full = nullptr);
  void retireSentSlots(PeerState& p);
  uint32_t pieceIndexOf(const Stream& s, uint32_t seq) const {
    return pieceOnStream(static_cast<uint32_t>(s.index), seq, static_cast<uint32_t>(nstreams_));
  }
  bool pumpRecv(Stream& s, PeerState& p);
  bool hasWork(const Lane& lane);
  bool acceptPiece(Stream& s, PeerState& p);
  void completeRecvPiece(Stream& s, PeerState& p);
  void failPeer(PeerState& p, Stream& s, const std::string& why);
  void failPeer(PeerState& p, std::string failure);

  int rank_ = -1;
  int timeoutSeconds_ = 0;
  const std::atomic<bool>* abortFlag_ = nullptr;  // an aborted communicator skips the flush
  int nstreams_ = 2;
  uint32_t nslots_ = 4;
  size_t slotBytes_ = 0;
  std::vector<std::unique_ptr<PeerState>> peers_;  // by rank; null when not ours
  std::vector<int> activePeers_;
  std::deque<Stream> streams_;  // deque: a Stream (atomic flag) never moves; each owns its fd
  std::vector<std::unique_ptr<SockSend>> send_;
  std::vector<std::unique_ptr<SockRecv>> recv_;

  Lane lanes_[2];  // send, receive
  std::atomic<bool> stop_{false};
  alignas(kLine) std::atomic<uint32_t> wakeWord_{0};
  std::atomic<uint32_t> algoSleeping_{0};
  std::atomic<int> progressClaimed_{0};
  std::string progressFailure_;
  std::atomic<bool> progressFailed_{false};
};

void SockSend::publish(uint32_t bytes, bool last) {
  fifo_->meta[head_ % nslots_] = bytes | (last ? kLastFlag : 0);
  ++head_;
  fifo_->head.store(head_, std::memory_order_release);
  transport_->wakeSendLane();
}

bool SockSend::sendsComplete() {
  cachedTail_ = fifo_->tail.load(std::memory_order_acquire);
  if (cachedTail_ == head_) return true;
  // The caller has nothing to do but wait: write what is queued now rather than wait for
  // the lane to be scheduled and then to wake us (issue 21: the root of a broadcast over
  // TCP, like Gloo's, then writes its message from its own thread). Once per stall: the
  // executor polls this while it spins.
  if (inlineStalled_ && cachedTail_ == inlineStallTail_) return false;
  inlineStalled_ = !transport_->pumpSendsInline(peer());
  cachedTail_ = fifo_->tail.load(std::memory_order_acquire);
  inlineStallTail_ = cachedTail_;
  return cachedTail_ == head_;
}

void SockSend::withdrawDirect() {
  // Nothing of the caller's is queued once the lane is past the latest direct post.
  if (static_cast<int32_t>(directEnd_ - fifo_->tail.load(std::memory_order_acquire)) > 0)
    transport_->withdrawDirect(peer(), true);
}

void SockRecv::publishGrant() {
  fifo_->grant.store(grant_, std::memory_order_release);
  transport_->wakeRecvLane();
}

void SockRecv::grantSlotsAhead() {
  readAhead_ = true;
  for (; grant_ - tail_ < nslots_; ++grant_) fifo_->dest[grant_ % nslots_] = nullptr;
  publishGrant();
}

void SockRecv::release() {
  ++tail_;
  fifo_->tail.store(tail_, std::memory_order_release);
  if (readAhead_) {
    fifo_->dest[grant_ % nslots_] = nullptr;
    ++grant_;
    publishGrant();
  }
}

bool SockRecv::tryExpect(void* dst, uint32_t capacity) {
  readAhead_ = false;  // from now on the caller declares every chunk
  if (grant_ - tail_ >= nslots_) return false;
  const uint32_t i = grant_ % nslots_;
  fifo_->dest[i] = static_cast<char*>(dst);
  fifo_->destCap[i] = capacity;
  ++grant_;
  if (dst) directEnd_ = grant_;
  publishGrant();
  return true;
}

void SockRecv::withdrawDirect() {
  // Destinations of chunks already peeked are no longer written to.
  if (static_cast<int32_t>(directEnd_ - tail_) > 0) transport_->withdrawDirect(peer(), false);
}

void SocketTransport::shutdown() {
  // A collective returns once its last chunk is posted, and the peer may still need it:
  // let the send lane hand every posted slot to the kernel before the sockets close
  // (closing then delivers the data ahead of the end of stream). Bounded by RIDGE_TIMEOUT
  // and ends early for peers that failed or when the communicator was aborted.
  if (lanes_[0].thread.joinable()) {
    const auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(std::max(1, timeoutSeconds_));
    for (int peer : activePeers_) {
      PeerState& p = *peers_[peer];
      while (p.send.tail.load(std::memory_order_acquire) != p.send.head.load(std::memory_order_relaxed) &&
             !p.failed.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < giveUp &&
             !(abortFlag_ && abortFlag_->load(std::memory_order_relaxed)))
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  stop_.store(true);
  for (Lane& lane : lanes_) {
    if (!lane.thread.joinable()) continue;
    lane.sleeping.store(1);
    lane.wake();
    lane.thread.join();
  }
  for (Stream& s : streams_)
    if (s.fd >= 0) ::close(s.fd);
  streams_.clear();
  for (Lane& lane : lanes_) {
    if (lane.epollFd >= 0) ::close(lane.epollFd);
    if (lane.eventFd >= 0) ::close(lane.eventFd);
    lane.epollFd = lane.eventFd = -1;
  }
}

void SocketTransport::failPeer(PeerState& p, Stream& s, const std::string& why) {
  failPeer(p, format("socket: rank %d: connection %d of %d to %s: %s", rank_, s.index + 1, nstreams_,
                     p.name.c_str(), why.c_str()));
}

void SocketTransport::failPeer(PeerState& p, std::string failure) {
  // The sockets stay open (and registered) until the transport is destroyed, so the other
  // lane never touches a closed descriptor; both lanes skip dead streams.
  for (int idx : p.streams) streams_[idx].dead.store(true, std::memory_order_relaxed);
  int expected = 0;
  if (!p.failClaimed.compare_exchange_strong(expected, 1)) return;
  p.failure = std::move(failure);
  // Pairs with the fence at the start of each pass (as in withdrawDirect): a pass that starts
  // after the recorded count sees the streams dead, so only the one in flight can still move.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (int l = 0; l < 2; ++l) p.failedAtPass[l] = lanes_[l].passes.load(std::memory_order_seq_cst);
  p.failed.store(1, std::memory_order_release);
  // Logged at INFO only: a peer that finished and left is no error unless someone waits on it.
  RIDGE_INFO("%s", p.failure.c_str());
  wakeAlgorithm();
}

void SocketTransport::withdrawDirect(int peer, bool sendSide) {
  PeerState& p = *peers_[peer];
  // Failing the peer stops both directions, also for what was posted from slots ahead of the
  // first chunk of caller memory: the operation's header, typically, which the peer needs to
  // report the mismatch instead of waiting for RIDGE_TIMEOUT (the header of an operation
  // whose message is below a slot is not awaited before its direct chunks are queued,
  // coll/signature.cpp HeaderSent). Those slots are our memory: let the send lane hand them
  // to the kernel first (it may go on with the caller's chunks meanwhile; the caller waits
  // here). Bounded: a peer that reads nothing may never take them.
  const uint32_t upTo = send_[peer]->firstQueuedDirect();
  const auto flushUntil = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (static_cast<int32_t>(p.send.tail.load(std::memory_order_acquire) - upTo) < 0 &&
         !p.failed.load(std::memory_order_acquire) && !lanes_[0].exited.load(std::memory_order_acquire) &&
         lanes_[0].thread.joinable() && !(abortFlag_ && abortFlag_->load(std::memory_order_relaxed)) &&
         std::chrono::steady_clock::now() < flushUntil) {
    lanes_[0].wake();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  failPeer(p, format("socket: rank %d: connections to %s closed: a collective failed while its buffers were "
                     "queued for this peer",
                     rank_, p.name.c_str()));
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // The pass in flight may have read the stream as alive before the flag was set; the
  // next one will not. Lanes never block inside a pass, so this is short.
  Lane& lane = lanes_[sendSide ? 0 : 1];
  const uint64_t pass = lane.passes.load(std::memory_order_seq_cst);
  const auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (lane.passes.load(std::memory_order_seq_cst) == pass &&
         !lane.exited.load(std::memory_order_acquire) && lane.thread.joinable() &&
         std::chrono::steady_clock::now() < giveUp) {
    lane.wake();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// Writes as much of this stream's share of the posted slots as the socket takes.
bool SocketTransport::pumpSend(Stream& s, PeerState& p, bool inLane, bool* full) {
  bool progressed = false;
  while (!s.dead.load(std::memory_order_relaxed) && s.writable.load(std::memory_order_relaxed)) {
    if (!s.sending) {
      // The next posted slots that have a piece for this stream, up to a batch.
      const uint32_t head = p.send.head.load(std::memory_order_acquire);
      s.sendCount = s.sendFirst = 0;
      s.sendDone = 0;
      for (uint32_t seq = s.sendSeq; seq != head && s.sendCount < Stream::kSendBatch; ++seq) {
        const uint32_t meta = p.send.meta[seq % nslots_];
        const uint32_t bytes = meta & kSizeMask;
        const uint32_t pieces = piecesFor(bytes, nstreams_);
        const uint32_t j = pieceIndexOf(s, seq);
        if (j >= pieces) {
          if (s.sendCount == 0) ++s.sendSeq;  // passed: no piece of it is ours
          continue;
        }
        uint32_t off = 0, len = 0;
        pieceRange(bytes, pieces, j, &off, &len);
        const int k = s.sendCount++;
        s.sendHdr[k] = PieceHeader{seq, meta, static_cast<uint16_t>(j), static_cast<uint16_t>(pieces), 0};
        s.sendHdr[k].check = headerCheck(s.sendHdr[k]);
        const char* direct = p.send.src[seq % nslots_];
        s.sendPayload[k] =
            (direct ? direct : p.send.data + static_cast<size_t>(seq % nslots_) * slotBytes_) + off;
        s.sendLen[k] = len;
      }
      if (s.sendCount == 0) return progressed;
      s.sending = true;
    }
    iovec iov[2 * Stream::kSendBatch];
    int n = 0;
    for (int k = s.sendFirst; k < s.sendCount; ++k) {
      const uint32_t done = k == s.sendFirst ? s.sendDone : 0;
      if (done < sizeof(PieceHeader)) {
        iov[n++] = {reinterpret_cast<char*>(&s.sendHdr[k]) + done, sizeof(PieceHeader) - done};
        if (s.sendLen[k]) iov[n++] = {const_cast<char*>(s.sendPayload[k]), s.sendLen[k]};
      } else {
        const uint32_t off = done - static_cast<uint32_t>(sizeof(PieceHeader));
        iov[n++] = {const_cast<char*>(s.sendPayload[k]) + off, s.sendLen[k] - off};
      }
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    ssize_t w = ::sendmsg(s.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        if (inLane) s.writable.store(false, std::memory_order_relaxed);
        if (full) *full = true;
        return progressed;
      }
      failPeer(p, s,
               err == ECONNRESET ? "connection reset by the peer (it exited or aborted)"
               : err == EPIPE    ? "the peer closed the connection"
                                 : format("send failed: %s", std::strerror(err)));
      return true;
    }
    progressed = true;
    if (inLane) sendLaneStage(SendLaneStage::AfterWrite, s.peer);
    // Step over the pieces the call wrote in full.
    size_t written = static_cast<size_t>(w);
    bool anyDone = false;
    while (s.sendFirst < s.sendCount) {
      const size_t rest = sizeof(PieceHeader) + s.sendLen[s.sendFirst] - s.sendDone;
      if (written < rest) {
        s.sendDone += static_cast<uint32_t>(written);
        break;
      }
      written -= rest;
      // Piece written: the stream is past its chunk.
      if (inLane) sendLaneStage(SendLaneStage::AfterPiece, s.peer);
      s.sendSeq = s.sendHdr[s.sendFirst].seq + 1;
      ++s.sendFirst;
      s.sendDone = 0;
      anyDone = true;
    }
    if (s.sendFirst == s.sendCount) s.sending = false;
    // Hand back the slots every stream is done with.
    if (anyDone) retireSentSlots(p);
  }
  return progressed;
}

bool SocketTransport::pumpSendsInline(int peer) {
  PeerState& p = *peers_[peer];
  // A test's hook stretches the lane's windows (socket_hooks.h): leave every piece to the lane.
  if ((sendLaneHook().load(std::memory_order_relaxed) &&
       !sendLaneHookAllowsInline().load(std::memory_order_relaxed)) ||
      p.failed.load(std::memory_order_acquire))
    return false;
  if (p.sendBusy.exchange(true, std::memory_order_acquire)) return false;
  bool left = false;
  for (int index : p.streams) {
    Stream& s = streams_[index];
    bool full = false;
    pumpSend(s, p, false, &full);
    left = left || full || s.dead.load(std::memory_order_relaxed) || s.sending ||
           s.sendSeq != p.send.head.load(std::memory_order_acquire);
  }
  p.sendBusy.store(false, std::memory_order_release);
  // The lane may have skipped the peer while we held it, and gone to sleep: its sleep flag
  // is read after the release (wake's fence), so a lane that checked before it sees the
  // work itself, and one that checked after is woken here.
  if (left) wakeSendLane();
  return !left;
}

// Hands back to the algorithm every leading slot that all of the peer's streams have
// passed: each has written its piece of the chunk or found that it has none. Counting the
// pieces written is not enough: a stream with no piece in a chunk (a chunk of one piece)
// learns that only by reading the slot's size, and if the slot were handed back and
// refilled first, it would send a piece of the new chunk under the old sequence number.
// So idle streams step over the chunks without a piece for them here (slots in
// [tail, head) stay valid until this function hands them back). Send lane only.
void SocketTransport::retireSentSlots(PeerState& p) {
  const uint32_t head = p.send.head.load(std::memory_order_acquire);
  uint32_t passed = head - p.sendTail;  // chunks every stream is past, counted from the tail
  for (int index : p.streams) {
    Stream& t = streams_[index];
    if (!t.sending) {
      while (t.sendSeq != head &&
             pieceIndexOf(t, t.sendSeq) >= piecesFor(p.send.meta[t.sendSeq % nslots_] & kSizeMask, nstreams_))
        ++t.sendSeq;
    }
    passed = std::min(passed, t.sendSeq - p.sendTail);
  }
  if (passed == 0) return;
  p.sendTail += passed;
  p.send.tail.store(p.sendTail, std::memory_order_release);
  wakeAlgorithm();
}

// Header of the next piece is complete: checks it and, once its slot is free, points the
// payload phase at the right place in the slot. False while the slot is still in use.
bool SocketTransport::acceptPiece(Stream& s, PeerState& p) {
  const PieceHeader& h = s.recvHdr;
  const uint32_t bytes = h.sizeAndLast & ~kLastFlag;
  const bool sane =
      h.check == headerCheck(h) && h.pieces >= 1 && h.pieces <= nstreams_ && h.piece < h.pieces &&
      bytes <= slotBytes_ && h.pieces == piecesFor(bytes, nstreams_) &&
      streamOfPiece(h.seq, h.piece, static_cast<uint32_t>(nstreams_)) == static_cast<uint32_t>(s.index) &&
      (!s.anyRecv || static_cast<int32_t>(h.seq - s.lastRecvSeq) > 0) &&
      static_cast<int32_t>(h.seq - p.recvHead) >= 0;
  if (!sane) {
    failPeer(p, s,
             format("malformed piece header (seq %u, size %u, piece %u of %u): the peer runs a "
                    "different Ridge build or settings (RIDGE_SOCKET_STREAMS/CHUNK must match)",
                    h.seq, bytes, h.piece, h.pieces));
    return false;
  }
  // The algorithm must have declared where the chunk goes (which also means its slot is
  // free: at most nslots are declared and not released).
  const uint32_t grant = p.recv.grant.load(std::memory_order_acquire);
  if (static_cast<int32_t>(h.seq - grant) >= 0) return false;
  const uint32_t slot = h.seq % nslots_;
  if (p.recvSize[slot] == 0xffffffffu) {
    p.recvSize[slot] = h.sizeAndLast;
    p.recvPieces[slot] = static_cast<uint8_t>(h.pieces);
    // A chunk larger than its declared destination lands in the slot: the algorithm then
    // sees the size and reports the mismatch.
    char* dest = p.recv.dest[slot];
    // (An empty chunk never "lands": a null destination would read as nothing arrived.)
    p.recvLanded[slot] = dest && bytes > 0 && bytes <= p.recv.destCap[slot];
    p.recvBase[slot] = p.recvLanded[slot] ? dest : p.recv.data + static_cast<size_t>(slot) * slotBytes_;
  } else if (p.recvSize[slot] != h.sizeAndLast || p.recvPieces[slot] != h.pieces) {
    failPeer(p, s, format("streams disagree on the size of chunk %u", h.seq));
    return false;
  }
  uint32_t off = 0, len = 0;
  pieceRange(bytes, h.pieces, h.piece, &off, &len);
  s.recvPayload = p.recvBase[slot] + off;
  s.recvLen = len;
  s.recvGot = 0;
  s.inPayload = true;
  s.recvSeq = h.seq;
  s.lastRecvSeq = h.seq;
  s.anyRecv = true;
  return true;
}

void SocketTransport::completeRecvPiece(Stream& s, PeerState& p) {
  s.inPayload = false;
  s.hdrGot = 0;
  const uint32_t slot = s.recvSeq % nslots_;
  ++p.recvGotCount[slot];
  bool advanced = false;
  while (true) {
    const uint32_t h = p.recvHead % nslots_;
    if (p.recvSize[h] == 0xffffffffu || p.recvGotCount[h] < p.recvPieces[h]) break;
    p.recv.meta[h] = p.recvSize[h] | (p.recvLanded[h] ? kLandedFlag : 0);
    p.recvSize[h] = 0xffffffffu;
    p.recvGotCount[h] = 0;
    ++p.recvHead;
    advanced = true;
  }
  if (advanced) {
    p.recv.head.store(p.recvHead, std::memory_order_release);
    wakeAlgorithm();
  }
}

// Reads pieces into free recv slots until the socket is empty or the next slot is busy.
bool SocketTransport::pumpRecv(Stream& s, PeerState& p) {
  bool progressed = false;
  while (!s.dead.load(std::memory_order_relaxed) && !s.eof && s.readable) {
    iovec iov[2];
    int n = 0;
    const bool headerPhase = !s.inPayload;
    if (headerPhase && s.hdrGot == sizeof(PieceHeader)) {
      // A whole header is buffered (read together with the previous payload).
      if (!acceptPiece(s, p)) return progressed;
      if (s.recvLen == 0) {
        completeRecvPiece(s, p);
        progressed = true;
      }
      continue;
    }
    if (headerPhase) {
      iov[n++] = {reinterpret_cast<char*>(&s.recvHdr) + s.hdrGot, sizeof(PieceHeader) - s.hdrGot};
    } else {
      // The rest of the payload, and the next header behind it in the same call.
      iov[n++] = {s.recvPayload + s.recvGot, s.recvLen - s.recvGot};
      iov[n++] = {reinterpret_cast<char*>(&s.recvHdr), sizeof(PieceHeader)};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    ssize_t r = ::recvmsg(s.fd, &msg, MSG_DONTWAIT);
    if (r < 0) {
      int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        s.readable = false;
        return progressed;
      }
      failPeer(p, s,
               err == ECONNRESET ? "connection reset by the peer (it exited or aborted)"
                                 : format("receive failed: %s", std::strerror(err)));
      return true;
    }
    if (r == 0) {
      if (s.inPayload || s.hdrGot) {
        failPeer(p, s, "the peer closed the connection in the middle of a chunk");
        return true;
      }
      // A peer that finished and left closes every stream after its last data; another
      // stream may still hold data we have not read (its slot was busy). Only when every
      // stream has ended can nothing more arrive: then a wait on this peer is an error.
      s.eof = true;
      s.readable = false;
      if (++p.eofStreams == nstreams_)
        failPeer(p, s, "the peer closed its connections (it exited or destroyed its communicator)");
      return true;
    }
    progressed = true;
    uint32_t got = static_cast<uint32_t>(r);
    if (headerPhase) {
      s.hdrGot += got;
      continue;
    }
    const uint32_t toPayload = std::min(got, s.recvLen - s.recvGot);
    s.recvGot += toPayload;
    if (s.recvGot == s.recvLen) {
      const uint32_t extra = got - toPayload;
      completeRecvPiece(s, p);  // resets hdrGot
      s.hdrGot = extra;
    }
  }
  return progressed;
}

bool SocketTransport::hasWork(const Lane& lane) {
  for (Stream& s : streams_) {
    if (s.dead.load(std::memory_order_relaxed)) continue;
    PeerState& p = *peers_[s.peer];
    if (lane.sends) {
      // The algorithm thread pumping this peer wakes the lane if it leaves work.
      if (p.sendBusy.exchange(true, std::memory_order_acquire)) continue;
      const bool work = s.writable.load(std::memory_order_relaxed) &&
                        (s.sending || s.sendSeq != p.send.head.load(std::memory_order_acquire));
      p.sendBusy.store(false, std::memory_order_release);
      if (work) return true;
      continue;
    }
    if (!s.readable || s.eof) continue;
    if (s.inPayload || s.hdrGot < sizeof(PieceHeader)) return true;
    // A buffered header waits for its slot.
    if (static_cast<int32_t>(s.recvHdr.seq - p.recv.grant.load(std::memory_order_acquire)) < 0) return true;
  }
  return false;
}

void SocketTransport::progressLoop(Lane& lane) {
  progressPasses(lane);
  lane.exited.store(true, std::memory_order_release);
}

void SocketTransport::progressPasses(Lane& lane) {
  epoll_event events[64];
  for (;; lane.passes.fetch_add(1, std::memory_order_seq_cst)) {
    // Pairs with the fence in withdrawDirect (store-buffering pattern): a pass that starts
    // after the counter moved must see the streams withdrawDirect marked dead, on any CPU
    // (x86's locked add is a full barrier already; weaker memory models need the fence).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (stop_.load(std::memory_order_relaxed)) return;
    if (lane.sends) sendLaneStage(SendLaneStage::BeforePass, -1);
    bool progressed = false;
    for (Stream& s : streams_) {
      if (s.dead.load(std::memory_order_relaxed)) continue;
      PeerState& p = *peers_[s.peer];
      if (!lane.sends) {
        progressed |= pumpRecv(s, p);
        continue;
      }
      // Skipped while the algorithm thread pumps the peer (it wakes the lane if it leaves work).
      if (p.sendBusy.exchange(true, std::memory_order_acquire)) continue;
      progressed |= pumpSend(s, p, true);
      p.sendBusy.store(false, std::memory_order_release);
    }
    int timeoutMs = 0;
    if (!progressed) {
      lane.sleeping.store(1, std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      // Long sleeps are fine: posts, releases, socket events and shutdown all wake us.
      timeoutMs = hasWork(lane) || stop_.load() ? 0 : 1000;
    }
    // With progress, a zero-timeout poll still collects readiness edges of the streams
    // that met EAGAIN, so that a busy stream cannot starve an idle one.
    int n = epoll_wait(lane.epollFd, events, 64, timeoutMs);
    lane.sleeping.store(0, std::memory_order_relaxed);
    if (n < 0) {
      if (errno == EINTR) continue;
      int expected = 0;
      if (progressClaimed_.compare_exchange_strong(expected, 1)) {
        progressFailure_ = format("socket: rank %d: epoll_wait failed: %s", rank_, std::strerror(errno));
        progressFailed_.store(true, std::memory_order_release);
      }
      wakeAlgorithm();
      return;
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t key = events[i].data.u64;
      if (key == UINT64_MAX) {
        uint64_t v;
        ssize_t r = ::read(lane.eventFd, &v, sizeof v);
        (void)r;
        continue;
      }
      Stream& s = streams_[key];
      const uint32_t ev = events[i].events;
      if (lane.sends && (ev & (EPOLLOUT | EPOLLHUP | EPOLLERR)))
        s.writable.store(true, std::memory_order_relaxed);
      if (!lane.sends && (ev & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP))) s.readable = true;
    }
  }
}

// Set-up runs in named phases, in this order; each leaves the members it fills for the next.
Status SocketTransport::connect(const TransportSetup& setup) {
  rank_ = setup.rank;
  timeoutSeconds_ = setup.timeoutSeconds;
  abortFlag_ = setup.abortFlag;
  choosePeers(setup);
  bool streamsAuto = false;
  readGeometrySettings(setup, &streamsAuto);
  Socket listener;
  SocketAddress bound;
  std::string ifName;
  std::vector<Endpoint> eps;
  RIDGE_TRY(exchangeEndpoints(setup, streamsAuto, &listener, &bound, &ifName, &eps));
  RIDGE_TRY(openStreams(setup, listener, eps));
  createConnectors();
  RIDGE_TRY(startProgressLanes());
  RIDGE_INFO("socket: rank %d: %zu peers over %s (%s), %d streams each, %u slots of %zu bytes", rank_,
             activePeers_.size(), ifName.c_str(), bound.toString().c_str(), nstreams_, nslots_, slotBytes_);
  return Status::ok();
}

// Which peers this transport serves: those no earlier transport (shm) takes.
void SocketTransport::choosePeers(const TransportSetup& setup) {
  const int P = setup.nranks;
  peers_.resize(P);
  send_.resize(P);
  recv_.resize(P);
  for (int peer = 0; peer < P; ++peer) {
    if (peer == rank_ || connectedBefore(&kSocketTransportTable, setup, rank_, peer) ||
        !kSocketTransportTable.canConnect(setup, rank_, peer))
      continue;
    peers_[peer] = std::make_unique<PeerState>();
    activePeers_.push_back(peer);
  }
}

// Streams per peer, slots and chunk size from the settings (this rank's proposal; the
// endpoint exchange checks that every rank agrees).
void SocketTransport::readGeometrySettings(const TransportSetup& setup, bool* streamsAuto) {
  int64_t streams = settingInt(Setting::SOCKET_STREAMS);
  *streamsAuto = streams == 0;
  if (*streamsAuto) {
    streams = autoSocketStreams(usableCpus());
  } else if (streams < 1 || streams > kMaxStreams) {
    RIDGE_WARN("RIDGE_SOCKET_STREAMS=%lld is outside 0..%d; using 2", static_cast<long long>(streams),
               kMaxStreams);
    streams = 2;
  }
  const int64_t slots = settingSlotCount(Setting::SOCKET_SLOTS, kMaxSlots, 4);
  int64_t chunk = settingSize(Setting::SOCKET_CHUNK);
  if (chunk < 4096 || chunk > (64ll << 20)) {
    RIDGE_WARN("RIDGE_SOCKET_CHUNK=%lld is outside 4K..64M; using 1M", static_cast<long long>(chunk));
    chunk = 1 << 20;
  }
  chunk = slotBytesBesideShm(&kSocketTransportTable, setup, (chunk + 4095) / 4096 * 4096);
  nstreams_ = static_cast<int>(streams);
  nslots_ = static_cast<uint32_t>(slots);
  slotBytes_ = static_cast<size_t>(chunk);
}

// Listens on the interface the bootstrap rules pick, all-gathers every rank's address, token
// and geometry, agrees on the stream count and checks the rest is the same everywhere.
Status SocketTransport::exchangeEndpoints(const TransportSetup& setup, bool streamsAuto, Socket* listener,
                                          SocketAddress* bound, std::string* ifName,
                                          std::vector<Endpoint>* endpoints) {
  const int P = setup.nranks;
  SocketAddress addr;
  RIDGE_TRY(selectInterface(AF_UNSPEC, &addr, ifName));
  addr.setPort(0);
  RIDGE_TRY(listenOn(addr, listener, bound));
  std::vector<Endpoint>& eps = *endpoints;
  eps.assign(P, Endpoint{});
  Endpoint& me = eps[rank_];
  std::memcpy(me.addr, &bound->storage, bound->length);
  me.addrLen = bound->length;
  me.streams = static_cast<uint32_t>(nstreams_);
  me.token = randomNonce();
  me.slotBytes = slotBytes_;
  me.nslots = nslots_;
  me.streamsAuto = streamsAuto ? 1 : 0;
  RIDGE_TRY(setup.bootstrap->allGather(eps.data(), sizeof(Endpoint)));
  bool allAuto = true;
  for (int r = 0; r < P; ++r) allAuto = allAuto && eps[r].streamsAuto == 1;
  if (allAuto) {
    // Every rank left the count to Ridge: all take the smallest proposal.
    std::vector<uint32_t> proposals(P);
    for (int r = 0; r < P; ++r) proposals[r] = eps[r].streams;
    nstreams_ = static_cast<int>(agreedSocketStreams(proposals.data(), P));
    for (int r = 0; r < P; ++r) eps[r].streams = static_cast<uint32_t>(nstreams_);
    me.streams = static_cast<uint32_t>(nstreams_);
  }
  for (int r = 0; r < P; ++r) {
    if (eps[r].streams != me.streams || eps[r].slotBytes != me.slotBytes || eps[r].nslots != me.nslots ||
        eps[r].streamsAuto != me.streamsAuto)
      return makeError(ridgeInvalidUsage,
                       "socket: rank %d uses %u streams, %llu-byte chunks, %u slots but rank %d uses %u, "
                       "%llu, %u: RIDGE_SOCKET_STREAMS (0 or unset on every rank, or the same count), "
                       "RIDGE_SOCKET_CHUNK and RIDGE_SOCKET_SLOTS must be the same on every rank",
                       rank_, me.streams, static_cast<unsigned long long>(me.slotBytes), me.nslots, r,
                       eps[r].streams, static_cast<unsigned long long>(eps[r].slotBytes), eps[r].nslots);
  }
  for (int peer : activePeers_) {
    PeerState& p = *peers_[peer];
    p.name = format("rank %d at %s", peer, endpointAddress(eps[peer]).toString().c_str());
    p.streams.assign(nstreams_, -1);
  }
  return Status::ok();
}

// Connects to higher ranks (the kernel completes the handshake from the listen backlog, so
// nobody waits for the other side's accept), then accepts from lower ranks; every stream
// opens with a hello that names its rank, index and the target's token.
Status SocketTransport::openStreams(const TransportSetup& setup, const Socket& listener,
                                    const std::vector<Endpoint>& eps) {
  const Endpoint& me = eps[rank_];
  const int64_t bufBytes = settingSize(Setting::SOCKET_BUFFER);
  auto tune = [&](int fd) {
    if (bufBytes > 0) {
      int v = static_cast<int>(std::min<int64_t>(bufBytes, INT_MAX));
      setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v);
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v);
    }
  };
  const Deadline deadline = Deadline::after(setup.timeoutSeconds, setup.abortFlag);
  auto addStream = [&](int peer, int index, Socket sock) {
    tune(sock.fd());
    peers_[peer]->streams[index] = static_cast<int>(streams_.size());
    Stream& s = streams_.emplace_back();
    s.fd = sock.release();  // closed by shutdown(), also when connect() fails below
    s.peer = peer;
    s.index = index;
  };
  int expectAccepts = 0;
  for (int peer : activePeers_) {
    if (peer < rank_) {
      expectAccepts += nstreams_;
      continue;
    }
    const SocketAddress to = endpointAddress(eps[peer]);
    for (int i = 0; i < nstreams_; ++i) {
      std::string who = format("socket: rank %d: connection %d of %d to rank %d at %s", rank_, i + 1,
                               nstreams_, peer, to.toString().c_str());
      Socket sock;
      RIDGE_TRY(connectWithRetry(to, deadline, who, &sock));
      Hello h{kHelloMagic, rank_, static_cast<uint32_t>(i), static_cast<uint32_t>(nstreams_),
              eps[peer].token};
      RIDGE_TRY(sendAll(sock.fd(), &h, sizeof h, deadline, who));
      addStream(peer, i, std::move(sock));
    }
  }
  for (int got = 0; got < expectAccepts;) {
    Socket sock;
    SocketAddress from;
    std::string who = format("socket: rank %d: waiting for %d more connections from lower ranks", rank_,
                             expectAccepts - got);
    RIDGE_TRY(acceptWithDeadline(listener, deadline, who, &sock, &from));
    Hello h{};
    Status s = recvAll(sock.fd(), &h, sizeof h, deadline.capped(std::chrono::milliseconds(5000)),
                       "socket: hello from " + from.toString());
    if (!s.isOk() || h.magic != kHelloMagic || h.token != me.token || h.fromRank < 0 || h.fromRank >= rank_ ||
        !peers_[h.fromRank] || h.streams != static_cast<uint32_t>(nstreams_) ||
        h.stream >= static_cast<uint32_t>(nstreams_) || peers_[h.fromRank]->streams[h.stream] >= 0) {
      // Not one of ours (another communicator, a port scanner, a duplicate): drop it.
      RIDGE_INFO("socket: rank %d: dropped an unexpected connection from %s", rank_, from.toString().c_str());
      continue;
    }
    addStream(h.fromRank, static_cast<int>(h.stream), std::move(sock));
    ++got;
  }
  return Status::ok();
}

// Slot memory and connectors. Whether the connectors move chunks straight from and into
// user buffers is each rank's own choice: the wire is the same either way.
void SocketTransport::createConnectors() {
  const bool direct = settingInt(Setting::SOCKET_DIRECT) != 0;
  for (int peer : activePeers_) {
    PeerState& p = *peers_[peer];
    p.sendData.assign(nslots_ * slotBytes_, 0);
    p.recvData.assign(nslots_ * slotBytes_, 0);
    p.send.data = p.sendData.data();
    p.recv.data = p.recvData.data();
    std::fill(std::begin(p.recvSize), std::end(p.recvSize), 0xffffffffu);
    p.connected = true;
    send_[peer] = std::make_unique<SockSend>(peer, &p.send, nslots_, slotBytes_, this, direct);
    recv_[peer] = std::make_unique<SockRecv>(peer, &p.recv, nslots_, slotBytes_, this, direct);
  }
}

// The send and receive lanes: an epoll set over every stream and a wake-up eventfd each,
// and their progress threads.
Status SocketTransport::startProgressLanes() {
  for (int l = 0; l < 2; ++l) {
    Lane& lane = lanes_[l];
    lane.sends = l == 0;
    lane.epollFd = epoll_create1(EPOLL_CLOEXEC);
    lane.eventFd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (lane.epollFd < 0 || lane.eventFd < 0) return systemError("socket: epoll_create1/eventfd");
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = UINT64_MAX;
    if (epoll_ctl(lane.epollFd, EPOLL_CTL_ADD, lane.eventFd, &ev) != 0)
      return systemError("socket: epoll_ctl(eventfd)");
    for (size_t i = 0; i < streams_.size(); ++i) {
      ev.events = (lane.sends ? EPOLLOUT : EPOLLIN | EPOLLRDHUP) | EPOLLET;
      ev.data.u64 = i;
      if (epoll_ctl(lane.epollFd, EPOLL_CTL_ADD, streams_[i].fd, &ev) != 0)
        return systemError("socket: epoll_ctl");
    }
  }
  for (Lane& lane : lanes_) lane.thread = std::thread([this, &lane] { progressLoop(lane); });
  return Status::ok();
}

bool socketCanConnect(const TransportSetup& setup, int a, int b) {
  // Between hosts always (RIDGE_NET auto or socket); within a host only when shm is off.
  const std::string net = settingString(Setting::NET);
  if (net != "auto" && net != "socket" && net != "AUTO") return false;
  if (setup.hostHashOfRank[a] != setup.hostHashOfRank[b]) return true;
  return settingInt(Setting::SHM) == 0;
}

Status socketCreate(const TransportSetup& setup, std::unique_ptr<Transport>* out) {
  auto t = std::make_unique<SocketTransport>();
  RIDGE_TRY(t->connect(setup));
  *out = std::move(t);
  return Status::ok();
}

}  // namespace

extern const TransportTable kSocketTransportTable = {sizeof(TransportTable), kTransportTableVersion, "socket",
                                                     socketCanConnect, socketCreate};

}  // namespace ridge
