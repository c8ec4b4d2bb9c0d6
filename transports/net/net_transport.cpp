// RDMA-style network transport: the slot FIFOs of transport.h over the verbs subset, with
// either provider (RIDGE_NET=softnic or RIDGE_NET=verbs).
//
// Per pair of ranks there is one RC queue pair. Each rank owns, per peer, a receive ring
// of `nslots` slots (registered for remote write) and a send area of as many slots
// (registered for local access). A post is one RDMA WRITE WITH IMMEDIATE from send slot
// i into the peer's ring slot i (i = post count mod nslots); the immediate carries the
// payload size and the last-of-message flag, and its receive completion is what the
// receiver's tryPeek sees. RC delivers in order, so the slot index needs no field.
//
// Flow control is by credits: the sender may have at most `nslots` posts that the
// receiver has not released. A release returns a credit as a zero-byte WRITE WITH
// IMMEDIATE whose immediate says "credit, n slots" (batched while the send queue is
// busy). A send slot is reused only after the local send completion of its write, which
// on both providers comes after the target acknowledged it.
//
// Receive rings in GPU memory (NetRingAllocator, net_transport.h) are registered for
// GPUDirect RDMA. The NIC's completion of a write into GPU memory does not by itself make
// the bytes visible to the GPU in order on every platform, so, unless RIDGE_GDR_FLUSH says
// otherwise, each arrived chunk is flushed before tryPeek hands it out: an 8-byte RDMA READ
// of its slot through a loopback queue pair (this NIC's QP connected to itself, created at
// connect), whose completion means the NIC's earlier writes to that memory are done. A
// chunk is visible once its flush completed (`ready`); a flush that fails fails the peer.
//
// Direct transfers (transport.h, kDirectTransferVersion; RIDGE_NET_DIRECT). tryPostDirect
// writes a chunk straight from caller memory (registered once per mapping window through
// the registration cache) instead of from a send slot. tryExpect tells the sender where the
// next chunk should land: an "advert" {address, rkey, capacity, position} written with
// immediate into the sender's advert ring. The sender takes an advert only when it names
// exactly the position it is posting and the chunk fits; it then writes into that
// destination (from its slot or from caller memory) and sets the immediate's direct bit, so
// the receiver knows where the chunk is; otherwise the chunk goes to the ring slot as
// always (an advert that arrives late is dropped). Each rank decides for itself, and the
// peer cannot tell. withdrawDirect fails the peer and moves the QP to ERROR when the NIC
// could still touch caller memory.
//
// Every operation of the connectors is non-blocking: each first drains the shared CQ
// (one owner-byte load when it is empty) and dispatches completions to the peers by QP
// number. No allocation, lock or system call on this path beyond what the provider's
// post makes (softnic: none unless its engine sleeps).
#include "transports/net/net_transport.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "bootstrap/bootstrap.h"
#include "core/log.h"
#include "core/settings.h"
#include "device/runtime.h"
#include "topo/gdr_advisor.h"
#include "transports/net/device_registration.h"
#include "transports/net/reg_cache.h"
#include "transports/transport.h"
#include "transports/verbs/verbs.h"

namespace ridge {

extern const TransportTable kNetTransportTable;

bool netCanConnect(const TransportSetup& setup, int a, int b);

namespace {

using namespace verbs;

// Immediate of a WRITE_WITH_IMM. Data: last-of-message bit, direct bit (landed at the
// destination the receiver advertised), payload bytes (at most 256M < 2^29). Credit: the
// credit bit and a count. Advert: credit and direct bits together, and the advert ring index.
constexpr uint32_t kImmLast = 1u << 31;
constexpr uint32_t kImmCredit = 1u << 30;
constexpr uint32_t kImmDirect = 1u << 29;
constexpr uint32_t kImmAdvert = kImmCredit | kImmDirect;
constexpr uint32_t kImmCountMask = kImmDirect - 1;
constexpr uint32_t kMaxSlots = 64;
enum WrKind : uint64_t { kWrData = 1, kWrCredit = 2, kWrRecv = 3, kWrFlush = 4, kWrAdvert = 5 };

// Where the receiver wants FIFO position `seq` to land. 24 bytes on the wire.
struct Advert {
  uint64_t addr;
  uint32_t rkey;
  uint32_t capacity;
  uint32_t seq;
  uint32_t valid;  // sender's copy: taken from a completed advert write
};
static_assert(sizeof(Advert) == 24, "an advert is 24 bytes");
constexpr uint32_t kFlushBytes = 8;
// A remote key no registration has (softnic keys are index << 8 | generation, generation
// never 0), for netBreakFlushReadsForTesting.
constexpr uint32_t kRefusedRkey = 0;

NetRingAllocator* gRingAllocator = nullptr;

// Every net transport of the process, and the sum of those already destroyed, for
// netProcessStats.
class NetTransport;
std::mutex gStatsMutex;
std::vector<NetTransport*> gLiveTransports;
NetTransportStats gRetiredStats;

void addStats(NetTransportStats* sum, const NetTransportStats& s) {
  sum->recvRingsOnDevice = sum->recvRingsOnDevice || s.recvRingsOnDevice;
  sum->flushing = sum->flushing || s.flushing;
  sum->loopbackQps += s.loopbackQps;
  sum->chunksArrived += s.chunksArrived;
  sum->flushesIssued += s.flushesIssued;
  sum->flushesCompleted += s.flushesCompleted;
  sum->flushErrors += s.flushErrors;
  sum->directSends += s.directSends;
  sum->chunksToAdvertised += s.chunksToAdvertised;
  sum->chunksLandedDirect += s.chunksLandedDirect;
  sum->advertsSent += s.advertsSent;
  sum->advertsReceived += s.advertsReceived;
  sum->advertsCompleted += s.advertsCompleted;
  sum->advertsLate += s.advertsLate;
  sum->withdrawals += s.withdrawals;
  sum->registrations += s.registrations;
}

inline uint64_t wrId(int peer, WrKind kind) {
  return (static_cast<uint64_t>(peer) << 8) | kind;
}

class NetTransport;

// Everything about one peer: its QP, the two slot rings and the counters of the FIFOs.
struct NetPeer {
  int peer = -1;
  std::unique_ptr<QueuePair> qp;
  uint32_t nslots = 0;
  size_t slotBytes = 0;
  // Send direction.
  char* sendSlots = nullptr;
  MemoryRegion* sendMr = nullptr;
  uint64_t remoteRing = 0;
  uint32_t remoteRkey = 0;
  uint32_t posted = 0;                 // writes posted
  uint32_t sendDone = 0;               // their local completions
  uint32_t creditsIn = 0;              // slots the receiver released
  uint64_t directInFlight = 0;         // bit (position mod nslots): a direct chunk not yet complete
  Advert* advertsIn = nullptr;         // 2·nslots entries the receiver writes (position mod 2·nslots)
  Advert adverts[2 * kMaxSlots] = {};  // copies taken when their write completed
  uint64_t remoteAdverts = 0;          // the peer's advert ring for our receives
  uint32_t remoteAdvertRkey = 0;
  // Receive direction.
  char* recvSlots = nullptr;
  uint32_t arrived = 0;  // write completions seen
  uint32_t ready = 0;    // of those, visible to tryPeek (flushed where flushing)
  uint32_t consumed = 0;
  uint32_t meta[kMaxSlots] = {};
  uint32_t creditsOwed = 0;  // released but not yet returned
  uint32_t creditSendsInFlight = 0;
  uint32_t creditBudget = 0;  // send-queue entries credits may use
  uint32_t recvPosted = 0;
  uint32_t declared = 0;          // positions declared (tryExpect, or a peek)
  void* declDst[kMaxSlots] = {};  // position mod nslots: its declared destination
  uint64_t advertised = 0;        // bit (position mod nslots): an advert was sent
  Advert* advertsOut = nullptr;   // nslots source entries of advert writes
  uint32_t advertsPosted = 0;
  uint32_t advertsDone = 0;
  bool flushFailed = false;  // a flush READ of one of its chunks failed or could not be posted
  Status failure;
};

class NetSend final : public SendConnector {
 public:
  NetSend(NetTransport* t, NetPeer* p) : SendConnector(p->slotBytes, p->peer), t_(t), p_(p) {}
  void* tryAcquire() override;
  void post(uint32_t bytes, bool lastOfMessage) override;
  uint32_t directVersion() const override;
  bool tryPostDirect(const void* src, uint32_t bytes, bool lastOfMessage) override;
  bool sendsComplete() override;
  void withdrawDirect() override;

 private:
  NetTransport* t_;
  NetPeer* p_;
};

class NetRecv final : public RecvConnector {
 public:
  NetRecv(NetTransport* t, NetPeer* p) : RecvConnector(p->slotBytes, p->peer), t_(t), p_(p) {}
  const void* tryPeek(SlotInfo* info) override;
  void release() override;
  uint32_t directVersion() const override;
  bool tryExpect(void* dst, uint32_t capacity) override;
  uint32_t declaredAhead() const override { return p_->declared - p_->consumed; }
  void withdrawDirect() override;

 private:
  NetTransport* t_;
  NetPeer* p_;
};

// What each rank publishes for each peer during connect.
struct ConnectEntry {
  QpAddress qp;
  uint64_t ringAddr;
  uint32_t rkey;
  uint32_t nslots;
  uint64_t slotBytes;
  uint32_t valid;
  uint32_t advertRkey;
  uint64_t advertAddr;  // where this rank's adverts for its receives from that peer land
};

// What the phases of NetTransport::connect hand on: the slot geometry from the settings,
// the peers served, and the queue depths and area slices derived from them.
struct NetGeometry {
  uint32_t nslots = 0;
  int64_t slotBytes = 0;
  GdrFlushMode flushMode = GdrFlushMode::Auto;
  std::vector<int> peerRanks;
  uint32_t sqDepth = 0;
  uint32_t rqDepth = 0;
  uint32_t loopDepth = 0;  // the loopback (flush) QP's send queue
  size_t perPeer = 0;      // bytes of each peer's slice of the send area and the rings
};

class NetTransport final : public Transport {
 public:
  NetTransport() {
    std::lock_guard<std::mutex> g(gStatsMutex);
    gLiveTransports.push_back(this);
  }
  ~NetTransport() override {
    {
      std::lock_guard<std::mutex> g(gStatsMutex);
      gLiveTransports.erase(std::find(gLiveTransports.begin(), gLiveTransports.end(), this));
      addStats(&gRetiredStats, stats());
    }
    drainPostedWrites();
    send_.clear();
    recv_.clear();
    // QPs before the CQ, regions before the PD, the PD before the device.
    for (auto& p : peers_) p->qp.reset();
    loopQp_.reset();
    flushSinkMr_.reset();
    controlMr_.reset();
    sendMr_.reset();
    recvMr_.reset();
    cache_.reset();
    cq_.reset();
    pd_.reset();
    device_.reset();
    if (sendBase_ && ringAllocator_)
      ringAllocator_->release(sendBase_, areaBytes_);
    else if (sendBase_)
      munmap(sendBase_, areaBytes_);
    if (controlBase_) munmap(controlBase_, controlBytes_);
    if (recvBase_ && ringAllocator_)
      ringAllocator_->release(recvBase_, areaBytes_);
    else if (recvBase_)
      munmap(recvBase_, areaBytes_);
  }
  const char* name() const override { return name_.c_str(); }
  SendConnector* sendTo(int peer) override {
    return peer >= 0 && peer < static_cast<int>(send_.size()) ? send_[peer].get() : nullptr;
  }
  RecvConnector* recvFrom(int peer) override {
    return peer >= 0 && peer < static_cast<int>(recv_.size()) ? recv_[peer].get() : nullptr;
  }
  void waitForActivity(int64_t maxWaitNs, bool (*stillIdle)(void*), void* arg) override {
    cq_->wait(maxWaitNs, stillIdle, arg);
  }
  Status checkPeer(int peer) override {
    NetPeer* p = peer >= 0 && peer < static_cast<int>(byRank_.size()) ? byRank_[peer] : nullptr;
    if (!p) return Status::ok();
    // Data that already landed can still be consumed: the peer may have closed after its
    // last write was acknowledged, which is how a finished peer leaves. A chunk whose flush
    // has not completed is not consumable yet: a failed flush is the peer's failure. Not
    // while a send to the peer waits for its credits (our chunks fill its ring): a peer that
    // left returns none, whatever it sent before, and a finished peer returned every credit
    // before it closed (issue 23). progress(): credits that came are counted first.
    progress();
    const bool awaitingCredits = p->posted - p->creditsIn >= p->nslots;
    if (p->ready != p->consumed && !awaitingCredits) return Status::ok();
    // Chunks whose flush READ is still on its way will be ready soon, even when the peer has
    // already left (closing the connection) after its last write was acknowledged (review
    // M1). Bounded by the waiter's RIDGE_TIMEOUT should the flush never complete.
    if (p->arrived != p->ready && !p->flushFailed && loopQp_ && loopQp_->state() != QpState::Error)
      return Status::ok();
    if (!p->failure.isOk()) return p->failure;
    if (p->qp->state() == QpState::Error)
      return makeError(ridgeRemoteError, "%s: the connection to rank %d failed (queue pair in error state)",
                       name_.c_str(), peer);
    return Status::ok();
  }

  // Set-up: the phases below, in order (connect says which).
  Status connect(const TransportSetup& setup, const std::string& providerName);

  // Before the QPs go away, waits until every write this rank posted was acknowledged.
  // A rank that finished its last collective may destroy its communicator while its last
  // slots are still on the wire (or, on one host, still to be read from its staging memory
  // by the peer's NIC); closing then would lose them and the peer would see a closed
  // connection instead of its data. Bounded by RIDGE_TIMEOUT, skipped after an abort.
  void drainPostedWrites() {
    if (!cq_ || (abortFlag_ && abortFlag_->load())) return;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSeconds_);
    for (;;) {
      bool pending = false;
      for (auto& p : peers_)
        pending = pending || (p->failure.isOk() && (p->sendDone != p->posted || p->creditSendsInFlight != 0 ||
                                                    p->advertsDone != p->advertsPosted));
      if (!pending || std::chrono::steady_clock::now() > deadline) return;
      progress();
      if (abortFlag_ && abortFlag_->load()) return;
      cq_->wait(
          1000000, [](void*) { return true; }, nullptr);
    }
  }

  // Drains the CQ and dispatches completions; returns credits that are owed.
  void progress() {
    Cqe buf[32];
    int n = cq_->poll(buf, 32);
    while (n > 0) {
      for (int i = 0; i < n; ++i) dispatch(buf[i]);
      n = n == 32 ? cq_->poll(buf, 32) : 0;
    }
    // returnCredits may drop the peer from owing_: walk it from the back.
    for (size_t i = owing_.size(); i-- > 0;) returnCredits(owing_[i]);
  }

  // Every message of this transport is one signaled RDMA WRITE WITH IMMEDIATE to the peer
  // (data, credits, adverts). A refused post means the QP broke: the peer is failed (the
  // waiting side learns it from checkPeer) and false returned.
  bool postWriteImm(NetPeer* p, WrKind kind, uint32_t imm, uint64_t localAddr, uint32_t lkey, uint32_t length,
                    uint64_t remoteAddr, uint32_t rkey) {
    Wqe w{};
    w.opcode = kWqeRdmaWriteImm;
    w.flags = kWqeSignaled;
    w.length = length;
    w.immData = imm;
    w.localAddr = localAddr;
    w.lkey = lkey;
    w.remoteAddr = remoteAddr;
    w.rkey = rkey;
    w.wrId = wrId(p->peer, kind);
    Status s = p->qp->postSend(w);
    if (!s.isOk()) fail(p, s);
    return s.isOk();
  }

  void returnCredits(NetPeer* p) {
    if (!p->creditsOwed || p->creditSendsInFlight >= p->creditBudget || !p->failure.isOk()) return;
    if (p->qp->sendSlotsFree() == 0) return;
    if (!postWriteImm(p, kWrCredit, kImmCredit | p->creditsOwed, 0, 0, 0, p->remoteRing, p->remoteRkey))
      return;
    ++p->creditSendsInFlight;
    p->creditsOwed = 0;
    setOwing(p, false);
  }

  void setOwing(NetPeer* p, bool owing) {
    auto it = std::find(owing_.begin(), owing_.end(), p);
    if (owing && it == owing_.end())
      owing_.push_back(p);  // at most one entry per peer: capacity reserved at connect
    else if (!owing && it != owing_.end())
      owing_.erase(it);
  }

  // Records the peer's failure and stops its QP: a failed peer's QP must not go on reading
  // or writing caller memory (direct chunks, adverts) once callers are told the operation
  // ended (review M2). Softnic stops it synchronously with its engine.
  void fail(NetPeer* p, const Status& s) {
    if (p->failure.isOk()) p->failure = s;
    if (p->qp && p->qp->state() != QpState::Error) (void)p->qp->modify(QpState::Error);
  }

  NetTransportStats stats() const {
    NetTransportStats s = stats_;
    s.registrations = cache_ ? cache_->misses() : 0;
    s.recvRingsOnDevice = ringsOnDevice_;
    s.flushing = loopQp_ != nullptr;
    s.loopbackQps = loopQp_ ? 1 : 0;
    return s;
  }
  void breakFlushReads() { flushRkey_ = kRefusedRkey; }
  void failPeerForTesting(int peer) {
    if (peer >= 0 && peer < static_cast<int>(byRank_.size()) && byRank_[peer])
      fail(byRank_[peer], makeError(ridgeRemoteError, "%s: rank %d failed by a test", name_.c_str(), peer));
  }

  bool direct() const { return direct_; }
  // Whether a posted direct chunk or an advert of any peer may still name caller memory:
  // the registration cache must then not evict (review B1), as the region it would drop
  // may be the one named. Called on cache misses only.
  bool callerMemoryInUse() const {
    for (const auto& p : peers_) {
      if (p->directInFlight || p->advertsPosted != p->advertsDone) return true;
      if (static_cast<int32_t>(p->declared - p->arrived) > 0)
        for (uint32_t s = p->arrived; s != p->declared; ++s)
          if ((p->advertised >> (s % p->nslots)) & 1) return true;
    }
    return false;
  }
  RegistrationCache* cache() { return cache_.get(); }
  void countDirectSend() { ++stats_.directSends; }

  // Posts the next chunk (position p->posted) from local memory: into the destination the
  // receiver advertised for this position when there is one and the chunk fits, else into
  // the ring slot. The caller checked credits and the send queue.
  void postChunk(NetPeer* p, uint64_t localAddr, uint32_t lkey, uint32_t bytes, bool last, bool fromCaller) {
    const uint32_t seq = p->posted;
    const uint32_t idx = seq % p->nslots;
    uint32_t imm = bytes | (last ? kImmLast : 0);
    uint64_t remoteAddr = p->remoteRing + idx * p->slotBytes;
    uint32_t rkey = p->remoteRkey;
    Advert& a = p->adverts[seq % (2 * p->nslots)];
    if (a.valid && a.seq == seq) {
      a.valid = 0;
      // An empty chunk needs no destination; one larger than the room goes to the slot, and
      // the receiver sees its size and reports the mismatch.
      if (bytes && bytes <= a.capacity) {
        remoteAddr = a.addr;
        rkey = a.rkey;
        imm |= kImmDirect;
        ++stats_.chunksToAdvertised;
      }
    }
    // The send queue has room for every data slot plus the credit and advert budgets, so
    // this fails only when the QP broke.
    (void)postWriteImm(p, kWrData, imm, localAddr, lkey, bytes, remoteAddr, rkey);
    if (fromCaller)
      p->directInFlight |= 1ull << idx;
    else
      p->directInFlight &= ~(1ull << idx);
    ++p->posted;
  }

  // Tells the sender where position `seq` should land (dst, `capacity` bytes), when the
  // advert budget allows; otherwise the chunk simply arrives in its slot.
  void advertise(NetPeer* p, uint32_t seq, void* dst, uint32_t capacity) {
    if (p->advertsPosted - p->advertsDone >= p->nslots || !p->failure.isOk()) return;
    // Flushed rings hand chunks on in flush order; a chunk landing elsewhere would overtake
    // the older ones still being flushed. Receives then keep to the ring.
    if (loopQp_) return;
    MemoryRegion* mr = nullptr;
    bool onDevice = false;
    if (!cache_
             ->get(dst, capacity, kAccessLocalWrite | kAccessRemoteWrite, &mr, &onDevice,
                   !callerMemoryInUse())
             .isOk())
      return;
    // Device memory would need the receive-side flush of its destination: such chunks keep
    // to the ring, which is flushed.
    if (onDevice) return;
    Advert& out = p->advertsOut[p->advertsPosted % p->nslots];
    out = Advert{reinterpret_cast<uint64_t>(dst), mr->rkey(), capacity, seq, 1};
    const uint32_t ringIdx = seq % (2 * p->nslots);
    if (!postWriteImm(p, kWrAdvert, kImmAdvert | ringIdx, reinterpret_cast<uint64_t>(&out),
                      controlMr_->lkey(), sizeof(Advert), p->remoteAdverts + ringIdx * sizeof(Advert),
                      p->remoteAdvertRkey))
      return;
    ++p->advertsPosted;
    p->advertised |= 1ull << (seq % p->nslots);
    ++stats_.advertsSent;
  }

  // Withdraws direct work that the NIC could still do on caller memory: fails the peer and
  // stops its QP (synchronously with the NIC, see QueuePair::modify).
  void withdraw(NetPeer* p, const char* what) {
    fail(p,
         makeError(ridgeRemoteError, "%s: %s to rank %d withdrawn: the operation ended before they completed",
                   name_.c_str(), what, p->peer));  // stops the QP
    ++stats_.withdrawals;
  }

 private:
  Status readSettings(const TransportSetup& setup, const std::string& providerName, NetGeometry* g);
  Status openDevice(const TransportSetup& setup, const std::string& providerName);
  Status createCompletionQueue(NetGeometry* g);
  Status allocateSlotAreas(NetGeometry* g);
  Status registerSlotAreas(const NetGeometry& g);
  Status createAdvertRings(const NetGeometry& g);
  Status createPeerQps(const TransportSetup& setup, const NetGeometry& g, ConnectEntry* mine);
  Status connectPeerQps(const TransportSetup& setup, const NetGeometry& g,
                        const std::vector<ConnectEntry>& table);
  Status startSending(const TransportSetup& setup);
  void createConnectors(const TransportSetup& setup);

  // A chunk arrived in peer p's ring slot `idx`: visible now, or after its flush.
  void chunkArrived(NetPeer* p, uint32_t idx, bool landedDirect) {
    ++stats_.chunksArrived;
    if (landedDirect) ++stats_.chunksLandedDirect;
    // Direct chunks (host memory, and only without a flushed ring) are ready at once.
    if (!loopQp_ || landedDirect) {
      ++p->ready;
      return;
    }
    Wqe w{};
    w.opcode = kWqeRdmaRead;
    w.flags = kWqeSignaled;
    w.length = kFlushBytes;
    w.localAddr = reinterpret_cast<uint64_t>(flushSink_);
    w.lkey = flushSinkMr_->lkey();
    w.remoteAddr = reinterpret_cast<uint64_t>(p->recvSlots + static_cast<size_t>(idx) * p->slotBytes);
    w.rkey = flushRkey_;
    w.wrId = wrId(p->peer, kWrFlush);
    // The loopback send queue has room for every slot of every peer, and a peer has at most
    // nslots chunks arrived and not consumed, so this fails only when the QP broke.
    Status s = loopQp_->postSend(w);
    if (!s.isOk()) {
      ++stats_.flushErrors;
      p->flushFailed = true;
      fail(p, makeError(ridgeRemoteError,
                        "%s: the GPUDirect RDMA flush of a chunk from rank %d could not be posted: %s",
                        name_.c_str(), p->peer, s.message().c_str()));
      return;
    }
    ++stats_.flushesIssued;
  }

  // Flush READs complete in posting order on the loopback QP, and each peer's were posted in
  // the order its chunks arrived: a completion makes that peer's oldest unflushed chunk ready.
  void flushDone(const Cqe& c) {
    const int peer = static_cast<int>(c.wrId >> 8);
    NetPeer* p = peer >= 0 && peer < static_cast<int>(byRank_.size()) ? byRank_[peer] : nullptr;
    if (!p) return;
    if (c.status == kCqeOk) {
      ++stats_.flushesCompleted;
      ++p->ready;
      return;
    }
    ++stats_.flushErrors;
    p->flushFailed = true;
    fail(p,
         makeError(ridgeRemoteError,
                   "%s: the GPUDirect RDMA flush (RDMA READ through the loopback queue pair) of a chunk from "
                   "rank %d failed: %s; the chunk is not handed on",
                   name_.c_str(), p->peer, cqeStatusName(c.status)));
  }

  void dispatch(const Cqe& c) {
    if (loopQp_ && c.qpn == loopQpn_) {
      flushDone(c);
      return;
    }
    auto it = byQpn_.find(c.qpn);
    if (it == byQpn_.end()) return;
    NetPeer* p = it->second;
    const WrKind kind = static_cast<WrKind>(c.wrId & 0xff);
    if (c.status != kCqeOk) {
      // Flushed work requests follow a connection that closed: normal when the peer has
      // finished and left, so it is recorded (for checkPeer, asked only while waiting on
      // that peer) without a WARN line. Any other status is the first sign of a failure.
      if (p->failure.isOk() && c.status == kCqeFlushed)
        p->failure = Status(ridgeRemoteError,
                            format("%s: the connection to rank %d was closed", name_.c_str(), p->peer));
      else if (p->failure.isOk())
        p->failure = makeError(ridgeRemoteError, "%s: %s to/from rank %d failed: %s", name_.c_str(),
                               kind == kWrRecv ? "receive" : "RDMA write", p->peer, cqeStatusName(c.status));
      return;
    }
    switch (kind) {
      case kWrData:
        p->directInFlight &= ~(1ull << (p->sendDone % p->nslots));
        ++p->sendDone;
        break;
      case kWrAdvert:
        ++p->advertsDone;
        ++stats_.advertsCompleted;
        break;
      case kWrCredit: --p->creditSendsInFlight; break;
      case kWrFlush: break;  // loopback QP completions go to flushDone
      case kWrRecv: {
        --p->recvPosted;
        if ((c.immData & kImmAdvert) == kImmAdvert) {
          // Copied once its write completed, so the copy is whole; a late one (its position
          // already posted) is never matched.
          const uint32_t ringIdx = (c.immData & kImmCountMask) % (2 * p->nslots);
          p->adverts[ringIdx] = p->advertsIn[ringIdx];
          ++stats_.advertsReceived;
          if (static_cast<int32_t>(p->adverts[ringIdx].seq - p->posted) < 0) ++stats_.advertsLate;
        } else if (c.immData & kImmCredit) {
          p->creditsIn += c.immData & kImmCountMask;
        } else {
          const uint32_t idx = p->arrived % p->nslots;
          p->meta[idx] = c.immData;
          ++p->arrived;
          chunkArrived(p, idx, (c.immData & kImmDirect) != 0);
        }
        RecvWqe r{wrId(p->peer, kWrRecv), 0, 0, 0, 0};
        Status s = p->qp->postRecv(r);
        if (s.isOk())
          ++p->recvPosted;
        else
          fail(p, s);
        break;
      }
    }
  }

  std::string name_ = "net";
  std::unique_ptr<Provider> provider_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<ProtectionDomain> pd_;
  std::unique_ptr<CompletionQueue> cq_;
  std::unique_ptr<RegistrationCache> cache_;
  // Receive-side flush (only when the rings are device memory that needs it).
  NetRingAllocator* ringAllocator_ = nullptr;
  bool ringsOnDevice_ = false;
  std::unique_ptr<QueuePair> loopQp_;
  uint32_t loopQpn_ = 0;
  uint32_t flushRkey_ = 0;
  std::unique_ptr<MemoryRegion> flushSinkMr_;
  alignas(64) char flushSink_[64] = {};
  std::unique_ptr<MemoryRegion> sendMr_, recvMr_;  // the send area and the receive rings
  NetTransportStats stats_;
  // Direct transfers: this rank's setting, the advert rings (in and out) of every peer.
  bool direct_ = false;
  char* controlBase_ = nullptr;
  size_t controlBytes_ = 0;
  std::unique_ptr<MemoryRegion> controlMr_;
  std::vector<std::unique_ptr<NetPeer>> peers_;
  std::vector<NetPeer*> byRank_;
  std::unordered_map<uint32_t, NetPeer*> byQpn_;
  std::vector<NetPeer*> owing_;  // peers with credits owed, not yet returned
  std::vector<std::unique_ptr<NetSend>> send_;
  std::vector<std::unique_ptr<NetRecv>> recv_;
  char* sendBase_ = nullptr;
  char* recvBase_ = nullptr;
  size_t areaBytes_ = 0;
  const std::atomic<bool>* abortFlag_ = nullptr;
  int timeoutSeconds_ = 10;
};

void* NetSend::tryAcquire() {
  t_->progress();
  NetPeer* p = p_;
  if (p->posted - p->sendDone >= p->nslots) return nullptr;   // local slot still being sent
  if (p->posted - p->creditsIn >= p->nslots) return nullptr;  // receiver's ring full
  return p->sendSlots + static_cast<size_t>(p->posted % p->nslots) * p->slotBytes;
}

void NetSend::post(uint32_t bytes, bool lastOfMessage) {
  NetPeer* p = p_;
  const size_t idx = p->posted % p->nslots;
  t_->postChunk(p, reinterpret_cast<uint64_t>(p->sendSlots + idx * p->slotBytes), p->sendMr->lkey(), bytes,
                lastOfMessage, false);
}

uint32_t NetSend::directVersion() const {
  return t_->direct() ? kDirectTransferVersion : 0;
}

bool NetSend::tryPostDirect(const void* src, uint32_t bytes, bool lastOfMessage) {
  char* slot = static_cast<char*>(tryAcquire());  // the same FIFO position and credit rules
  if (!slot) return false;
  MemoryRegion* mr = nullptr;
  if (bytes && !t_->cache()->get(src, bytes, 0, &mr, nullptr, !t_->callerMemoryInUse()).isOk()) {
    // Not registrable (e.g. the NIC refuses this memory): copy it into the slot instead.
    std::memcpy(slot, src, bytes);
    post(bytes, lastOfMessage);
    return true;
  }
  t_->countDirectSend();
  t_->postChunk(p_, reinterpret_cast<uint64_t>(src), mr ? mr->lkey() : 0, bytes, lastOfMessage, true);
  return true;
}

// Only completions count: a chunk of a failed connection never completes, so a caller
// waiting for its sends learns the failure from checkPeer instead of returning success.
bool NetSend::sendsComplete() {
  t_->progress();
  return p_->sendDone == p_->posted;
}

// Whether the QP still runs (not just whether a failure was recorded): only a stopped QP is
// certain to read no more caller memory.
void NetSend::withdrawDirect() {
  t_->progress();
  if (p_->directInFlight && p_->qp->state() != QpState::Error) t_->withdraw(p_, "direct sends");
}

const void* NetRecv::tryPeek(SlotInfo* info) {
  t_->progress();
  NetPeer* p = p_;
  if (p->consumed == p->ready) return nullptr;
  if (p->declared == p->consumed) ++p->declared;  // peeked without a declaration: a slot one
  const uint32_t idx = p->consumed % p->nslots;
  const uint32_t imm = p->meta[idx];
  info->bytes = imm & kImmCountMask;
  info->lastOfMessage = (imm & kImmLast) != 0;
  if (imm & kImmDirect) return p->declDst[idx];
  return p->recvSlots + static_cast<size_t>(idx) * p->slotBytes;
}

uint32_t NetRecv::directVersion() const {
  return t_->direct() ? kDirectTransferVersion : 0;
}

bool NetRecv::tryExpect(void* dst, uint32_t capacity) {
  t_->progress();
  NetPeer* p = p_;
  if (p->declared - p->consumed >= p->nslots) return false;
  const uint32_t seq = p->declared++;
  const uint32_t idx = seq % p->nslots;
  p->declDst[idx] = dst;
  p->advertised &= ~(1ull << idx);
  // A chunk that already arrived is in its slot; only later ones can still be redirected.
  if (dst && capacity && static_cast<int32_t>(seq - p->arrived) >= 0) t_->advertise(p, seq, dst, capacity);
  return true;
}

void NetRecv::withdrawDirect() {
  t_->progress();
  NetPeer* p = p_;
  // Adverted positions whose chunk has not arrived: the sender may still write there.
  bool outstanding = false;
  if (static_cast<int32_t>(p->declared - p->arrived) > 0) {
    for (uint32_t s = p->arrived; s != p->declared; ++s) {
      outstanding = outstanding || ((p->advertised >> (s % p->nslots)) & 1);
      p->declDst[s % p->nslots] = nullptr;
    }
  }
  if (outstanding && p->qp->state() != QpState::Error) t_->withdraw(p, "declared receive destinations");
}

void NetRecv::release() {
  NetPeer* p = p_;
  ++p->consumed;
  ++p->creditsOwed;
  t_->setOwing(p, true);
  t_->returnCredits(p);
}

// Set-up runs in named phases, in this order; each leaves the members it fills for the next.
Status NetTransport::connect(const TransportSetup& setup, const std::string& providerName) {
  name_ = "net/" + providerName;
  abortFlag_ = setup.abortFlag;
  if (setup.timeoutSeconds > 0) timeoutSeconds_ = setup.timeoutSeconds;
  NetGeometry g;
  RIDGE_TRY(readSettings(setup, providerName, &g));
  // Peers this transport serves: those the table's canConnect gives us (same rule on
  // every rank, so both ends of a pair agree).
  for (int r = 0; r < setup.nranks; ++r)
    if (r != setup.rank && netCanConnect(setup, setup.rank, r)) g.peerRanks.push_back(r);
  RIDGE_TRY(openDevice(setup, providerName));
  RIDGE_TRY(createCompletionQueue(&g));
  RIDGE_TRY(allocateSlotAreas(&g));
  RIDGE_TRY(registerSlotAreas(g));
  RIDGE_TRY(createAdvertRings(g));
  // Caller buffers of direct transfers, on softnic: one registration per mapping, within
  // 64 MiB windows (softnic translates addresses when it uses them, so a window never goes
  // stale). A real NIC pins the pages present at registration: a window would also pin, and
  // open to remote writes, memory the caller never passed, and go stale when the allocator
  // returns part of it (review M3); there each buffer's own pages are registered.
  if (providerName == "softnic") cache_->setHostWindow(64 << 20);
  RIDGE_INFO("%s: receive rings in %s memory%s", name_.c_str(), ringsOnDevice_ ? "device" : "host",
             !ringsOnDevice_ ? ""
             : loopQp_
                 ? ", each chunk flushed by an RDMA READ through a loopback queue pair (RIDGE_GDR_FLUSH)"
                 : ", not flushed (RIDGE_GDR_FLUSH=off, or the device orders RDMA writes)");
  std::vector<ConnectEntry> table(static_cast<size_t>(setup.nranks) * setup.nranks);
  RIDGE_TRY(createPeerQps(setup, g, &table[static_cast<size_t>(setup.rank) * setup.nranks]));
  // Exchange addresses: every rank's entries for every peer.
  RIDGE_TRY(setup.bootstrap->allGather(table.data(), sizeof(ConnectEntry) * setup.nranks));
  RIDGE_TRY(connectPeerQps(setup, g, table));
  RIDGE_TRY(startSending(setup));
  createConnectors(setup);
  RIDGE_INFO("%s: %zu peers over %s, %u slots of %lld bytes per direction", name_.c_str(), peers_.size(),
             device_->attributes().name.c_str(), g.nslots, static_cast<long long>(g.slotBytes));
  return Status::ok();
}

// Slots and slot size (RIDGE_RDMA_SLOTS, _SLOT_BYTES), the direct extension (RIDGE_NET_DIRECT)
// and the receive-side flush (RIDGE_GDR_FLUSH).
Status NetTransport::readSettings(const TransportSetup& setup, const std::string& providerName,
                                  NetGeometry* g) {
  int64_t slots = settingInt(Setting::RDMA_SLOTS);
  if (slots < 2 || slots > kMaxSlots) {
    RIDGE_WARN("RIDGE_RDMA_SLOTS=%lld is outside 2..%u; using 4", static_cast<long long>(slots), kMaxSlots);
    slots = 4;
  }
  // FIFO positions are 32-bit counters taken mod the slot count: only a power of two keeps
  // that consistent across the wrap at 2^32 (review M4).
  if (slots & (slots - 1)) {
    const int64_t rounded = int64_t{1} << (63 - __builtin_clzll(static_cast<unsigned long long>(slots)));
    RIDGE_WARN("RIDGE_RDMA_SLOTS=%lld is not a power of two; using %lld", static_cast<long long>(slots),
               static_cast<long long>(rounded));
    slots = rounded;
  }
  int64_t slotBytes = settingSize(Setting::RDMA_SLOT_BYTES);
  if (slotBytes < 4096 || slotBytes > (256ll << 20)) {
    RIDGE_WARN("RIDGE_RDMA_SLOT_BYTES=%lld is outside 4K..256M; using 256K",
               static_cast<long long>(slotBytes));
    slotBytes = 256 << 10;
  }
  slotBytes = (slotBytes + 4095) / 4096 * 4096;
  g->slotBytes = slotBytesBesideShm(&kNetTransportTable, setup, slotBytes);
  g->nslots = static_cast<uint32_t>(slots);
  const std::string directText = settingString(Setting::NET_DIRECT);
  if (directText == "auto")
    direct_ = providerName == "softnic";
  else if (directText == "1" || directText == "0")
    direct_ = directText == "1";
  else
    return makeError(ridgeInvalidArgument, "RIDGE_NET_DIRECT='%s': expected auto, 1 or 0",
                     directText.c_str());
  const std::string flushText = settingString(Setting::GDR_FLUSH);
  if (!parseGdrFlush(flushText, &g->flushMode))
    return makeError(ridgeInvalidArgument, "RIDGE_GDR_FLUSH='%s': expected auto, read or off",
                     flushText.c_str());
  return Status::ok();
}

// The provider's device (RIDGE_VERBS_DEVICE, else the first with an active port), its
// protection domain and the registration cache.
Status NetTransport::openDevice(const TransportSetup& setup, const std::string& providerName) {
  RIDGE_TRY(openProvider(providerName, &provider_));
  std::vector<DeviceAttributes> devs;
  RIDGE_TRY(provider_->listDevices(&devs));
  int devIndex = -1;
  const std::string wanted = settingString(Setting::VERBS_DEVICE);
  for (size_t i = 0; i < devs.size() && devIndex < 0; ++i) {
    if (!wanted.empty() ? devs[i].name == wanted : devs[i].portActive) devIndex = static_cast<int>(i);
  }
  if (devIndex < 0)
    return makeError(
        ridgeSystemError, "%s: no usable device (%s)", name_.c_str(),
        wanted.empty() ? "none has an active port" : ("RIDGE_VERBS_DEVICE=" + wanted + " not found").c_str());
  RIDGE_TRY(provider_->open(devIndex, &device_));
  RIDGE_TRY(device_->allocPd(&pd_));
  cache_ = std::make_unique<RegistrationCache>(pd_.get(), 64);
  // GPU buffers that reach this cache are registered as GPU memory (dma-buf, else peer
  // memory); without a CUDA driver every buffer is host memory and nothing changes.
  // Receive rings from an installed allocator are registered through its registrar.
  ringAllocator_ = setup.netRingAllocator ? setup.netRingAllocator : gRingAllocator;
  std::string noDriver;
  if (ringAllocator_)
    cache_->setDeviceRegistrar(ringAllocator_->registrar());
  else if (DeviceMemoryRegistrar* r = cudaDriverRegistrar(&noDriver))
    cache_->setDeviceRegistrar(r);
  return Status::ok();
}

// One CQ for every QP, deep enough for all their queues.
Status NetTransport::createCompletionQueue(NetGeometry* g) {
  // Send queue: the data slots, the credit budget and the advert budget (nslots each, the
  // credits 4 more); the receive queue takes the peer's data, credits and adverts.
  g->sqDepth = 3 * g->nslots + 4;
  g->rqDepth = 3 * g->nslots + 8;
  // The loopback QP's send queue: one flush per ring slot of every peer.
  const uint32_t peerCount = static_cast<uint32_t>(std::max<size_t>(g->peerRanks.size(), 1));
  g->loopDepth = peerCount * g->nslots + 4;
  const uint32_t cqEntries = roundUpPow2(peerCount * (g->sqDepth + g->rqDepth) + g->loopDepth + 64);
  return pd_->createCq(cqEntries, &cq_);
}

// The send area and the receive rings: host memory, or the ring allocator's when one is installed.
Status NetTransport::allocateSlotAreas(NetGeometry* g) {
  g->perPeer = static_cast<size_t>(g->nslots) * static_cast<size_t>(g->slotBytes);
  areaBytes_ = std::max<size_t>(g->perPeer * g->peerRanks.size(), 4096);
  // With an allocator both the send areas and the receive rings are its memory (device
  // memory on the GPUDirect RDMA data path): every slot a sender fills or a receiver reads.
  if (ringAllocator_) {
    void* r = nullptr;
    RIDGE_TRY(ringAllocator_->allocate(areaBytes_, &r));
    sendBase_ = static_cast<char*>(r);
    RIDGE_TRY(ringAllocator_->allocate(areaBytes_, &r));
    recvBase_ = static_cast<char*>(r);
  } else {
    void* m = mmap(nullptr, areaBytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return systemError("net: mmap of the send slots");
    sendBase_ = static_cast<char*>(m);
    m = mmap(nullptr, areaBytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return systemError("net: mmap of the receive rings");
    recvBase_ = static_cast<char*>(m);
  }
  uintptr_t allocBase = 0;
  size_t allocBytes = 0;
  ringsOnDevice_ =
      ringAllocator_ && ringAllocator_->registrar()->deviceAllocation(recvBase_, &allocBase, &allocBytes);
  // The direct extension falls back to a host copy into the send slot and hands out
  // declared host destinations: neither fits slots in device memory, whose users move bytes
  // with device copies. Such an instance keeps to its slots.
  if (ringsOnDevice_ && direct_) {
    RIDGE_INFO("%s: slots in device memory: the direct extension (RIDGE_NET_DIRECT) is off here",
               name_.c_str());
    direct_ = false;
  }
  return Status::ok();
}

// Registers the send area and the receive rings, and creates the loopback QP that flushes
// rings in device memory where the device needs it.
Status NetTransport::registerSlotAreas(const NetGeometry& g) {
  const bool flush = ringsOnDevice_ && gdrFlushNeeded(g.flushMode, ringAllocator_->device());
  // The send area and the rings are registered for the transport's lifetime, outside the
  // cache: the cache evicts its least recently used regions, and these are looked up only
  // here (review B1: evicting them left a dangling lkey and a dead ring rkey).
  // The flush reads the rings back through the loopback QP: remote read on them too. Both
  // areas come from the allocator when one is installed (device memory: dma-buf).
  const uint32_t ringAccess =
      kAccessLocalWrite | kAccessRemoteWrite | (flush ? uint32_t{kAccessRemoteRead} : 0u);
  auto registerArea = [&](char* base, uint32_t access, std::unique_ptr<MemoryRegion>* mr) -> Status {
    uintptr_t allocStart = 0;
    size_t allocLength = 0;
    if (ringAllocator_ && ringAllocator_->registrar()->deviceAllocation(base, &allocStart, &allocLength)) {
      DeviceRegPath path = DeviceRegPath::DmaBuf;
      return registerDeviceRange(pd_.get(), ringAllocator_->registrar(), base, areaBytes_, access, mr, &path);
    }
    return pd_->registerMemory(base, areaBytes_, access, mr);
  };
  RIDGE_TRY(registerArea(sendBase_, kAccessLocalWrite, &sendMr_));
  RIDGE_TRY(registerArea(recvBase_, ringAccess, &recvMr_));
  if (flush) {
    RIDGE_TRY(pd_->registerMemory(flushSink_, sizeof flushSink_, kAccessLocalWrite, &flushSinkMr_));
    QpCaps caps;
    caps.maxSendWr = g.loopDepth;
    caps.maxRecvWr = 1;
    RIDGE_TRY(pd_->createQp(cq_.get(), cq_.get(), caps, &loopQp_));
    QpAddress self;
    RIDGE_TRY(loopQp_->localAddress(&self));
    RIDGE_TRY(loopQp_->modify(QpState::Init));
    RIDGE_TRY(loopQp_->modify(QpState::Rtr, &self));
    RIDGE_TRY(loopQp_->modify(QpState::Rts));
    loopQpn_ = loopQp_->qpn();
    flushRkey_ = recvMr_->rkey();
  }
  return Status::ok();
}

// Advert rings: per peer 2·nslots entries the peer writes and nslots this rank sends from.
Status NetTransport::createAdvertRings(const NetGeometry& g) {
  controlBytes_ = std::max<size_t>(g.peerRanks.size() * 3 * g.nslots * sizeof(Advert), 4096);
  void* m = mmap(nullptr, controlBytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return systemError("net: mmap of the advert rings");
  controlBase_ = static_cast<char*>(m);
  return pd_->registerMemory(controlBase_, controlBytes_, kAccessLocalWrite | kAccessRemoteWrite,
                             &controlMr_);
}

// One QP per peer, its slices of the areas and rings, and this rank's connect entry for it
// (`mine`: the row of the all-gathered table this rank fills, by peer).
Status NetTransport::createPeerQps(const TransportSetup& setup, const NetGeometry& g, ConnectEntry* mine) {
  byRank_.assign(setup.nranks, nullptr);
  for (size_t k = 0; k < g.peerRanks.size(); ++k) {
    auto p = std::make_unique<NetPeer>();
    p->peer = g.peerRanks[k];
    p->nslots = g.nslots;
    p->slotBytes = static_cast<size_t>(g.slotBytes);
    p->sendSlots = sendBase_ + k * g.perPeer;
    p->recvSlots = recvBase_ + k * g.perPeer;
    p->sendMr = sendMr_.get();
    p->creditBudget = g.nslots + 4;
    p->advertsIn = reinterpret_cast<Advert*>(controlBase_) + k * 3 * g.nslots;
    p->advertsOut = p->advertsIn + 2 * g.nslots;
    QpCaps caps;
    caps.maxSendWr = g.sqDepth;
    caps.maxRecvWr = g.rqDepth;
    RIDGE_TRY(pd_->createQp(cq_.get(), cq_.get(), caps, &p->qp));
    ConnectEntry& e = mine[p->peer];
    RIDGE_TRY(p->qp->localAddress(&e.qp));
    e.ringAddr = reinterpret_cast<uint64_t>(p->recvSlots);
    e.rkey = recvMr_->rkey();
    e.nslots = g.nslots;
    e.slotBytes = static_cast<uint64_t>(g.slotBytes);
    e.valid = 1;
    e.advertAddr = reinterpret_cast<uint64_t>(p->advertsIn);
    e.advertRkey = controlMr_->rkey();
    byRank_[p->peer] = p.get();
    byQpn_[p->qp->qpn()] = p.get();
    peers_.push_back(std::move(p));
  }
  owing_.reserve(peers_.size());
  return Status::ok();
}

// Checks each peer's entry for this rank, takes its ring and advert addresses, posts the
// receives and moves the QP to RTR.
Status NetTransport::connectPeerQps(const TransportSetup& setup, const NetGeometry& g,
                                    const std::vector<ConnectEntry>& table) {
  for (auto& p : peers_) {
    const ConnectEntry& theirs = table[static_cast<size_t>(p->peer) * setup.nranks + setup.rank];
    if (!theirs.valid)
      return makeError(ridgeInternalError, "%s: rank %d did not set up a connection to rank %d",
                       name_.c_str(), p->peer, setup.rank);
    if (theirs.nslots != g.nslots || theirs.slotBytes != static_cast<uint64_t>(g.slotBytes))
      return makeError(ridgeInvalidUsage,
                       "%s: rank %d uses %u slots of %llu bytes, this rank %u of %lld (RIDGE_RDMA_SLOTS and "
                       "RIDGE_RDMA_SLOT_BYTES must be the same on every rank)",
                       name_.c_str(), p->peer, theirs.nslots,
                       static_cast<unsigned long long>(theirs.slotBytes), g.nslots,
                       static_cast<long long>(g.slotBytes));
    p->remoteRing = theirs.ringAddr;
    p->remoteRkey = theirs.rkey;
    p->remoteAdverts = theirs.advertAddr;
    p->remoteAdvertRkey = theirs.advertRkey;
    RIDGE_TRY(p->qp->modify(QpState::Init));
    for (uint32_t i = 0; i < g.rqDepth; ++i) {
      RIDGE_TRY(p->qp->postRecv(RecvWqe{wrId(p->peer, kWrRecv), 0, 0, 0, 0}));
      ++p->recvPosted;
    }
    RIDGE_TRY(p->qp->modify(QpState::Rtr, &theirs.qp));
  }
  return Status::ok();
}

// Every QP is ready to receive before any rank may send: barrier, RTS, barrier.
Status NetTransport::startSending(const TransportSetup& setup) {
  RIDGE_TRY(setup.bootstrap->barrier());
  for (auto& p : peers_) RIDGE_TRY(p->qp->modify(QpState::Rts));
  return setup.bootstrap->barrier();
}

void NetTransport::createConnectors(const TransportSetup& setup) {
  send_.resize(setup.nranks);
  recv_.resize(setup.nranks);
  for (auto& p : peers_) {
    send_[p->peer] = std::make_unique<NetSend>(this, p.get());
    recv_[p->peer] = std::make_unique<NetRecv>(this, p.get());
  }
}

Status netCreate(const TransportSetup& setup, std::unique_ptr<Transport>* out) {
  auto t = std::make_unique<NetTransport>();
  RIDGE_TRY(t->connect(setup, netProvider()));
  *out = std::move(t);
  return Status::ok();
}

}  // namespace

Status createNetTransport(const TransportSetup& setup, std::unique_ptr<Transport>* out) {
  return netCreate(setup, out);
}

bool parseGdrFlush(const std::string& text, GdrFlushMode* out) {
  std::string t = text;
  for (char& ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (t == "auto")
    *out = GdrFlushMode::Auto;
  else if (t == "read")
    *out = GdrFlushMode::Read;
  else if (t == "off")
    *out = GdrFlushMode::Off;
  else
    return false;
  return true;
}

bool gdrFlushNeeded(GdrFlushMode mode, int device) {
  if (mode != GdrFlushMode::Auto) return mode == GdrFlushMode::Read;
  device::DeviceRuntime* rt = device::activeRuntime();
  return !(rt && rt->deviceCount() > 0 && rt->rdmaWritesOrdered(device));
}

void setNetRingAllocator(NetRingAllocator* allocator) {
  gRingAllocator = allocator;
}

NetRingAllocator* netRingAllocator() {
  return gRingAllocator;
}

NetTransportStats netTransportStats(Transport* transport) {
  auto* t = dynamic_cast<NetTransport*>(transport);
  return t ? t->stats() : NetTransportStats{};
}

NetTransportStats netProcessStats() {
  std::lock_guard<std::mutex> g(gStatsMutex);
  NetTransportStats sum = gRetiredStats;
  for (NetTransport* t : gLiveTransports) addStats(&sum, t->stats());
  return sum;
}

std::string netStatsToString(const NetTransportStats& s) {
  return format(
      "loopbackQps=%llu chunksArrived=%llu flushesIssued=%llu flushesCompleted=%llu flushErrors=%llu "
      "directSends=%llu chunksToAdvertised=%llu chunksLandedDirect=%llu advertsSent=%llu "
      "advertsReceived=%llu "
      "advertsLate=%llu withdrawals=%llu registrations=%llu",
      static_cast<unsigned long long>(s.loopbackQps), static_cast<unsigned long long>(s.chunksArrived),
      static_cast<unsigned long long>(s.flushesIssued), static_cast<unsigned long long>(s.flushesCompleted),
      static_cast<unsigned long long>(s.flushErrors), static_cast<unsigned long long>(s.directSends),
      static_cast<unsigned long long>(s.chunksToAdvertised),
      static_cast<unsigned long long>(s.chunksLandedDirect), static_cast<unsigned long long>(s.advertsSent),
      static_cast<unsigned long long>(s.advertsReceived), static_cast<unsigned long long>(s.advertsLate),
      static_cast<unsigned long long>(s.withdrawals), static_cast<unsigned long long>(s.registrations));
}

void netBreakFlushReadsForTesting(Transport* transport) {
  if (auto* t = dynamic_cast<NetTransport*>(transport)) t->breakFlushReads();
}

void netFailPeerForTesting(Transport* transport, int peer) {
  if (auto* t = dynamic_cast<NetTransport*>(transport)) t->failPeerForTesting(peer);
}

std::string netProvider() {
  std::string net = settingString(Setting::NET);
  for (char& ch : net) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return net == "softnic" || net == "verbs" ? net : std::string();
}

bool netPairReachable(const TransportSetup& setup, int a, int b) {
  if (netProvider().empty()) return false;
  if (setup.hostHashOfRank[a] != setup.hostHashOfRank[b]) return true;
  return settingInt(Setting::SHM) == 0;
}

bool gdrModeOn() {
  // A value the parser rejects still turns the gdr transport on, which then reports it.
  topo::GdrModeSetting m;
  return !topo::parseGdrModeSetting(settingString(Setting::GDR_MODE), &m) ||
         m.kind != topo::GdrModeSetting::Kind::Off;
}

// Used between hosts when RIDGE_NET names softnic or verbs, and between ranks of one host
// too when RIDGE_SHM=0; not when the gdr transport (earlier in the registry) takes those
// pairs, so that no second set of queue pairs and slot rings is set up beside it.
bool netCanConnect(const TransportSetup& setup, int a, int b) {
  return !gdrModeOn() && netPairReachable(setup, a, b);
}

extern const TransportTable kNetTransportTable = {sizeof(TransportTable), kTransportTableVersion, "net",
                                                  netCanConnect, netCreate};

}  // namespace ridge
