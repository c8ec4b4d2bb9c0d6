// The gdr transport (see gdr_transport.h and docs/gdr-write.md).
//
// Per peer there are two queue pairs, one per direction of data:
//   out: our data QP -> the peer's landing QP. We post RDMA WRITE WITH IMMEDIATE from our
//        staging (or source) slots into the peer's landing ring; the peer's credit writes land
//        in our CreditRecord through the same connection.
//   in:  the peer's data QP -> our landing QP. Each landed slot completes a posted receive on
//        our landing CQ; releasing it writes our consumed count back (plain RDMA WRITE).
// The producer side of both queues (mlx5 WQEs, doorbell record, UAR doorbell, CQ polling) is
// driven through the device-side subset in transports/gdr/gdr_device.h, except in host-staged
// mode, where a CPU proxy posts and polls through the provider (postSend / poll), as its name
// says.
#include "transports/gdr/gdr_transport.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "core/log.h"
#include "core/settings.h"
#include "device/runtime.h"
#include "transports/net/device_registration.h"
#include "transports/net/net_transport.h"
#include "transports/softnic/softnic.h"
#include "transports/verbs/gpu_ring_mapping.h"
#include "transports/verbs/verbs.h"
#ifdef RIDGE_HAVE_CUDA
#include "transports/gdr/gdr_kernels.h"
#endif

namespace ridge::gdr {

using verbs::Cqe;
using verbs::QpAddress;
using verbs::QpState;

namespace {

int64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// ---- Process-wide counters ------------------------------------------------------------

void addCounters(Counters* sum, const Counters& c) {
  sum->slotsWritten += c.slotsWritten;
  sum->creditsConsumed += c.creditsConsumed;
  sum->creditsReturned += c.creditsReturned;
  sum->creditStalls += c.creditStalls;
  sum->remoteStalls += c.remoteStalls;
  sum->doorbells += c.doorbells;
  sum->stagedLost += c.stagedLost;
  sum->slotsLanded += c.slotsLanded;
  sum->creditWrites += c.creditWrites;
  sum->completionErrors += c.completionErrors;
  sum->remoteReads += c.remoteReads;
  sum->devicePosts += c.devicePosts;
}

std::atomic<uint64_t> gCpuDoorbells{0};
std::mutex gCountersMutex;
std::vector<const Counters*> gLiveCounters;
Counters gRetiredCounters{};
SetupReport gLastReport;
// withholdCreditsForTesting: release() updates the credit record but never writes it to the peer.
std::atomic<bool> gWithholdCreditsForTesting{false};

// Page-aligned zeroed memory standing in for GPU memory or pinned host memory.
struct Buffer {
  char* p = nullptr;
  size_t bytes = 0;
  Status allocate(size_t n) {
    bytes = (n + 4095) & ~size_t(4095);
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return systemError("gdr: mmap");
    p = static_cast<char*>(m);
    return Status::ok();
  }
  ~Buffer() {
    if (p) munmap(p, bytes);
  }
};

// Binds [p, p + bytes) (not yet touched) to NUMA node `node` with mbind(MPOL_BIND, move), the
// system call itself so that no libnuma is needed; says what happened, for the INFO line.
std::string bindToNode(void* p, size_t bytes, int node) {
  constexpr int kMpolBind = 2;
  constexpr unsigned kMpolMfMove = 1u << 1;
  if (node >= 1024) return format("NIC on NUMA node %d: beyond the node mask, not bound", node);
  unsigned long mask[1024 / (8 * sizeof(unsigned long))] = {};
  mask[node / (8 * sizeof(unsigned long))] = 1ul << (node % (8 * sizeof(unsigned long)));
  if (syscall(SYS_mbind, p, bytes, kMpolBind, mask, 1024ul, kMpolMfMove) != 0)
    return format("NIC on NUMA node %d: mbind failed (%s), first touch by this thread", node,
                  std::strerror(errno));
  return format("NIC on NUMA node %d (pages bound there with mbind)", node);
}

// What each rank tells a peer about the link to it.
struct Endpoint {
  QpAddress dataQp;     // our data QP (sends to the peer)
  QpAddress landingQp;  // our landing QP (receives from the peer)
  uint64_t landingAddr;
  uint64_t creditAddr;  // our CreditRecord for the peer's credit writes
  uint32_t landingRkey;
  uint32_t creditRkey;
  uint32_t slotStride;
  uint32_t landingSlots;
};

class GdrTransport;

// The page the host and a device-side producer share (ProducerShared), alone on it so that it
// can be mapped into a GPU without taking other memory along.
struct SharedPage {
  static constexpr size_t kBytes = 4096;
  static_assert(sizeof(ProducerShared) <= kBytes, "the shared producer state fits a page");
  ProducerShared* p;
  SharedPage() : p(new (::operator new (kBytes, std::align_val_t{kBytes})) ProducerShared{}) {}
  ~SharedPage() {
    p->~ProducerShared();
    ::operator delete (p, std::align_val_t{kBytes});
  }
  SharedPage(const SharedPage&) = delete;
  SharedPage& operator=(const SharedPage&) = delete;
};

struct Link {
  SharedPage shared;  // first: the references below point into it
  int peer = -1;
  Mode mode = Mode::Write;
  uint32_t payloadCapacity = 0;
  uint32_t stride = 0;
  Counters ctr{};
  Counters& deviceCtr = shared.p->ctr;  // the device-side producer's (not shared with ctr)
  Status error;
  GdrTransport* transport = nullptr;
  Status deviceSendStatus;  // the last device-side send's; read once the device ran it
  // Collectives on device buffers (DeviceProducer::bindDeviceQueue): post() queues the slot's
  // post as device code; at most one is outstanding (tryAcquire waits for it), so its size
  // and last flag travel here. shared.p->postsRun is the device's, the rest the host's.
  DeviceProducer::Launch deviceLaunch = nullptr;
  void* deviceQueue = nullptr;
  uint64_t devicePostsQueued = 0;
  uint64_t devicePostsNoticed = 0;  // GPU producer: posts the host told the software NIC about
  uint64_t postsRun() const { return __atomic_load_n(&shared.p->postsRun, __ATOMIC_ACQUIRE); }
  bool devicePostLast = false;

  // Out: data QP and what it sends from.
  std::unique_ptr<verbs::CompletionQueue> dataCq;
  std::unique_ptr<verbs::QueuePair> dataQp;
  std::unique_ptr<verbs::DeviceMemory> dm;  // staging in NIC memory (gdr-write, tier nic)
  Buffer slots;                             // staging in host memory / "GPU" source ring
  // read: the producer's slots in device memory (the NetRingAllocator's), when there is one.
  NetRingAllocator* deviceSlotsFrom = nullptr;
  void* deviceSlots = nullptr;
  size_t deviceSlotsBytes = 0;
  std::unique_ptr<verbs::MemoryRegion> slotsMr;
  Buffer gpuSlot;  // host-staged: the producer's slot the copy engine reads
  Buffer creditIn;
  std::unique_ptr<verbs::MemoryRegion> creditInMr;
  SendChannel ch{};
  SendState& st = shared.p->st;  // one writer at a time: the host, or the device's post
  Pacer pacer;
  struct PendingRing {
    uint32_t pi;     // producer index to ring with
    uint64_t ctrl8;  // the doorbell word of the WQE below pi
    int64_t due;     // when the model lets it ring
    verbs::Wqe wqe;  // host-staged: what the proxy posts then
  };
  std::vector<PendingRing> pendingRings;  // paced sends not yet rung, oldest first
  size_t pendingHead = 0;

  // In: landing QP, ring and the credit word we write back.
  std::unique_ptr<verbs::CompletionQueue> landCq;
  std::unique_ptr<verbs::CompletionQueue> creditCq;
  std::unique_ptr<verbs::QueuePair> landQp;
  Buffer landing;
  std::unique_ptr<verbs::MemoryRegion> landingMr;
  Buffer creditOut;
  std::unique_ptr<verbs::MemoryRegion> creditOutMr;
  uint32_t landingSlots = 0;
  uint64_t recvSeq = 0;  // slots released
  bool peeked = false;
  SlotInfo peekInfo;
  uint32_t landCi = 0;
  uint32_t creditCi = 0;
  uint32_t creditPi = 0;
  uint32_t creditRetired = 0;  // credit writes completed (every one asks for a CQE)
  uint32_t creditBfOffset = 0;
  bool creditDirty = false;
  uint64_t remoteCreditAddr = 0;
  uint32_t remoteCreditRkey = 0;
  // A credit write that failed: the peer's receive side is gone. Not an error for slots that
  // landed before (a finished peer leaves that way); reported once nothing landed is left.
  Status creditError;

  std::unique_ptr<SendConnector> sendConn;
  std::unique_ptr<RecvConnector> recvConn;

  // The doorbell rungs (RIDGE_NET=verbs, write; docs/gdr-write.md, "Fallback ladder"): the data
  // QP and CQ are mlx5-direct, the NIC's own rings. devCh is the channel as the device-side
  // producer sees it: send queue, doorbell record, CQ, credit record and staging mapped into
  // the GPU (gpuMap), the UAR too on gpu-doorbell; on cpu-doorbell it has no UAR and a CPU
  // thread (doorbellLoop) rings for it, for the host stand-in as well.
  SendChannel devCh{};
  mlx5::SqView devSq{};  // with gpuMap: the device's addresses of the queues, staging, credits
  mlx5::CqView devCq{};
  char* devStaging = nullptr;
  const CreditRecord* devCredit = nullptr;
  ProducerShared* devShared = nullptr;  // with gpuPosts: the device's address of `shared`
  bool gpuPosts = false;                // a GPU posts through the kernel twin: shared page and landing mapped
  bool cpuRings = false;
  uint64_t* cpuUar = nullptr;                     // cpuRings: the UAR doorbell the CPU thread stores to
  uint32_t cpuRungPi = 0;                         // cpuRings: the doorbell record value last rung (16 bits)
  std::unique_ptr<verbs::GpuRingMapping> gpuMap;  // last: unmapped before the NIC objects go

  ~Link() {
    slotsMr.reset();  // deregistered before the memory goes
    if (deviceSlots) deviceSlotsFrom->release(deviceSlots, deviceSlotsBytes);
  }
};

class GdrTransport final : public Transport {
 public:
  ~GdrTransport() override;
  const char* name() const override { return "gdr"; }
  SendConnector* sendTo(int peer) override;
  RecvConnector* recvFrom(int peer) override;
  void waitForActivity(int64_t maxWaitNs, bool (*stillIdle)(void*), void* arg) override;
  Status checkPeer(int peer) override;
  Status connect(const TransportSetup& setup);

  // Progress that must not depend on which connector the executor polls: paced doorbells
  // that came due and credit writes that found the send queue full.
  void progress();
  void* tryAcquire(Link* l);
  void post(Link* l, uint32_t bytes, bool last);
  const void* tryPeek(Link* l, SlotInfo* info);
  void release(Link* l);
  static void runDeviceSend(void* link, const void* src, size_t bytes);
  static void runDevicePost(void* link, const void* slot, size_t bytes);
  // runDevicePost's kernel twin (CUDA): the same post as a kernel on the stream.
  static Status launchDevicePostOnGpu(void* link, const void* slot, size_t bytes, ridgeStream_t stream);

 private:
  // What set-up decides before it creates anything, and carries from phase to phase.
  struct SetupPlan {
    std::vector<int> peers;
    Mode mode = Mode::Write;
    std::string modeWhy;
    int64_t slots = 0, landingSlots = 0;
    uint32_t capacity = 0, stride = 0;
    std::optional<verbs::GdrLadderDecision> ladder;
    verbs::GdrLadderFacts ladderFacts;
    bool directRings = false;  // a doorbell rung: the data queues are the NIC's own mlx5 rings
    std::string tierName, tierWhy, readSlots;
  };
  Status plan(const TransportSetup& setup, SetupPlan* p);
  Status openNic(const SetupPlan& p);
  void consultLadder(SetupPlan* p);
  Status createQueues(Link* l, const SetupPlan& p);
  Status setUpLink(int peer, SetupPlan* p, Endpoint* e);
  Status connectLinks(const TransportSetup& setup, const SetupPlan& p, const std::vector<Endpoint>& mine);
  void goLive(const SetupPlan& p);
  Status chooseMode(Mode* mode, std::string* why);
  Status setUpStaging(Link* l, const verbs::GdrLadderDecision* ladder, std::string* tier, std::string* why);
  Status setUpProducerSlots(Link* l, size_t bytes, bool deviceMemory, std::string* where);
  void fail(Link* l, Status s);
  void pollDataCompletions(Link* l);
  void postStaged(Link* l, const verbs::Wqe& w);
  void pumpRings(Link* l, int64_t now);
  void returnCredit(Link* l);
  void pollCreditCq(Link* l);
  void noticeDoorbell() { softnic::notifyDoorbell(device_.get()); }
  // The device-side producer runs where the device reaches the queues: the software NIC's (host
  // memory), or an rdma-core NIC's direct rings mapped into the GPU (doorbell rungs). The
  // emulated runtime runs its host-compiled code; a GPU runs its kernel twin (runDevicePost as
  // gdrPostKernel), once queues, staging, landing slots (the device data ops read them) and the
  // shared producer state are mapped into it (gpuPosts).
  bool deviceProducerUsable(const Link* l) const {
    const device::DeviceRuntime* rt = device::activeRuntime();
    if (l->mode != Mode::Write || paced_ || !rt) return false;
    if (rt->runsDeviceFunctions()) return wakingNic_ || l->gpuMap;
    return l->gpuPosts && rt->runsDeviceFunction(&GdrTransport::runDevicePost);
  }
  // Whether a GPU of this process will post (CUDA with a device and the kernel twin): the
  // software NIC's queues are then mapped into it (mapSoftnicForGpu).
  bool gpuProducerPlanned(Mode mode) const {
    const device::DeviceRuntime* rt = device::activeRuntime();
    return mode == Mode::Write && !paced_ && rt && !rt->runsDeviceFunctions() &&
           rt->runsDeviceFunction(&GdrTransport::runDevicePost);
  }
  Status mapSoftnicForGpu(Link* l);
  void mapProducerStateForGpu(Link* l);
  bool devicePostsPending() const {
    for (const Link* l : active_)
      if (l->gpuPosts && l->postsRun() != l->devicePostsQueued) return true;
    return false;
  }
  Status useDirectRings(Link* l, const verbs::GdrLadderFacts& facts, verbs::GdrRung rung);
  void doorbellLoop();
  void drainPostedWrites();
  static bool landedPending(const Link* l);

  int rank_ = 0;
  bool wakingNic_ = false;  // the software NIC: idle ranks sleep until its engine does something
  bool gpuQueues_ = false;  // gpuProducerPlanned over the software NIC: its queues mapped for the GPU
  static constexpr int64_t kNicWaitCapNs = 1000000;
  const std::atomic<bool>* abortFlag_ = nullptr;
  int timeoutSeconds_ = 10;
  std::unique_ptr<verbs::Provider> provider_;
  std::unique_ptr<verbs::Device> device_;
  std::unique_ptr<verbs::ProtectionDomain> pd_;
  std::vector<std::unique_ptr<Link>> links_;  // by peer; null for self and peers of other transports
  std::vector<Link*> active_;
  ModelView model_;
  bool paced_ = false;
  std::atomic<bool> anyPending_{false};
  // Paced mode only: the modeled bus delivers a send when its time comes even if the caller
  // never touches this transport again (ring algorithms post their last chunk with
  // lastOfMessage false), so a thread rings what came due. pacedMutex_ makes it and the
  // caller one producer per ring.
  std::mutex pacedMutex_;
  std::thread pacerThread_;
  std::atomic<bool> stopPacer_{false};
  void pacerLoop();
  // cpu-doorbell with a GPU producer: the thread that rings the UAR for it.
  std::thread doorbellThread_;
  std::atomic<bool> stopDoorbell_{false};
  // A GPU posting to the software NIC: the thread that sees its doorbells (snoopLoop).
  std::thread snoopThread_;
  void snoopLoop();
};

class GdrSend final : public SendConnector, public DeviceProducer {
 public:
  GdrSend(GdrTransport* t, Link* l, bool deviceProducer)
      : SendConnector(l->payloadCapacity, l->peer), t_(t), l_(l), deviceProducer_(deviceProducer) {}
  void* tryAcquire() override { return t_->tryAcquire(l_); }
  void post(uint32_t bytes, bool lastOfMessage) override { t_->post(l_, bytes, lastOfMessage); }
  DeviceProducer* deviceProducer() override { return deviceProducer_ ? this : nullptr; }
  Fn deviceFunction(void** arg) override {
    *arg = l_;
    return &GdrTransport::runDeviceSend;
  }
  Status finishDeviceSend() override {
    Status s = std::move(l_->deviceSendStatus);
    l_->deviceSendStatus = Status::ok();
    return s;
  }
  void bindDeviceQueue(Launch launch, void* queue) override {
    l_->deviceLaunch = launch;
    l_->deviceQueue = queue;
  }

 private:
  GdrTransport* t_;
  Link* l_;
  const bool deviceProducer_;
};

class GdrRecv final : public RecvConnector {
 public:
  GdrRecv(GdrTransport* t, Link* l) : RecvConnector(l->payloadCapacity, l->peer), t_(t), l_(l) {}
  const void* tryPeek(SlotInfo* info) override { return t_->tryPeek(l_, info); }
  void release() override { t_->release(l_); }

 private:
  GdrTransport* t_;
  Link* l_;
};

void GdrTransport::pacerLoop() {
  while (!stopPacer_.load(std::memory_order_relaxed)) {
    int64_t next = nowNs() + 1000000;
    {
      std::lock_guard<std::mutex> g(pacedMutex_);
      const int64_t now = nowNs();
      for (Link* l : active_) {
        pumpRings(l, now);
        if (l->pendingHead < l->pendingRings.size())
          next = std::min(next, l->pendingRings[l->pendingHead].due);
      }
    }
    const int64_t wait = std::max<int64_t>(next - nowNs(), 20000);
    timespec ts{0, static_cast<long>(std::min<int64_t>(wait, 1000000))};
    nanosleep(&ts, nullptr);
  }
}

// Before the queue pairs go away: ring every paced doorbell still queued (the rank is leaving,
// the model's timing no longer matters) and wait until the NIC has retired every data send
// and credit write this rank posted. A rank that finished its part of a collective may leave
// while its last chunk is still queued or on the wire and its peer still waits for it; on one
// host the peer's NIC even reads the payload out of this process's staging. Bounded by
// RIDGE_TIMEOUT; skipped after an abort; links whose queue pairs failed are not waited for.
void GdrTransport::drainPostedWrites() {
  if (active_.empty() || (abortFlag_ && abortFlag_->load())) return;
  const int64_t deadline = nowNs() + static_cast<int64_t>(timeoutSeconds_) * 1000000000;
  for (;;) {
    {
      std::lock_guard<std::mutex> g(pacedMutex_);
      for (Link* l : active_) pumpRings(l, INT64_MAX);
      anyPending_ = false;
    }
    bool pending = false;
    for (Link* l : active_) {
      if (l->dataQp->state() == QpState::Error || l->landQp->state() == QpState::Error) continue;
      if (l->creditDirty) returnCredit(l);
      pollCreditCq(l);
      pollDataCompletions(l);
      // Only WQEs that asked for a CQE report back: put a signaled NOP behind an unsignaled last.
      if (l->st.signaledPi != l->st.pi && l->st.rungPi == l->st.pi) {
        if (l->mode == Mode::Staged) {
          verbs::Wqe nop{};
          nop.opcode = verbs::kWqeNop;
          nop.flags = verbs::kWqeSignaled;
          l->st.pi += 1;
          postStaged(l, nop);
          l->st.signaledPi = l->st.pi;
        } else if (postCompletionMarker(l->ch, &l->st, &l->ctr)) {
          noticeDoorbell();
        }
      }
      pending = pending || l->st.retired != l->st.rungPi || l->creditRetired != l->creditPi || l->creditDirty;
    }
    if (!pending || nowNs() > deadline || (abortFlag_ && abortFlag_->load())) return;
    noticeDoorbell();
    timespec ts{0, 50000};
    nanosleep(&ts, nullptr);
  }
}

// A landed slot not yet peeked. (A slot already peeked does not count: it is in the caller's
// hands, and a caller holding one while it waits for something else from the same peer, a
// send credit in a 2-rank ring, must learn that the peer is gone at once, not at
// RIDGE_TIMEOUT.)
bool GdrTransport::landedPending(const Link* l) {
  const mlx5::CqView& cq = *l->landCq->mlx5Cq();
  const uint8_t opOwn =
      reinterpret_cast<const volatile mlx5::Cqe64*>(cq.cqes + (l->landCi & ((1u << cq.log2Size) - 1u)))
          ->opOwn;
  return mlx5::cqeIsNew(opOwn, l->landCi, cq.log2Size) && mlx5::cqeOpcode(opOwn) != mlx5::kCqeRespErr;
}

GdrTransport::~GdrTransport() {
  drainPostedWrites();
  if (doorbellThread_.joinable() || snoopThread_.joinable()) {
    stopDoorbell_.store(true);
    if (doorbellThread_.joinable()) doorbellThread_.join();
    if (snoopThread_.joinable()) snoopThread_.join();
  }
  if (pacerThread_.joinable()) {
    stopPacer_.store(true);
    pacerThread_.join();
  }
  Counters mine{};
  for (Link* l : active_) {
    addCounters(&mine, l->ctr);
    addCounters(&mine, l->deviceCtr);
  }
  // Proof, for runs that see only the public API (ridge-bench), that the gdr transport carried
  // the traffic and lost nothing.
  if (!active_.empty()) RIDGE_INFO("gdr: rank %d: closing: %s", rank_, countersToString(mine).c_str());
  std::lock_guard<std::mutex> g(gCountersMutex);
  for (Link* l : active_) {
    gLiveCounters.erase(std::remove(gLiveCounters.begin(), gLiveCounters.end(), &l->ctr),
                        gLiveCounters.end());
    gLiveCounters.erase(std::remove(gLiveCounters.begin(), gLiveCounters.end(), &l->deviceCtr),
                        gLiveCounters.end());
    addCounters(&gRetiredCounters, l->ctr);
    addCounters(&gRetiredCounters, l->deviceCtr);
  }
}

SendConnector* GdrTransport::sendTo(int peer) {
  return peer >= 0 && peer < static_cast<int>(links_.size()) && links_[peer] ? links_[peer]->sendConn.get()
                                                                             : nullptr;
}

RecvConnector* GdrTransport::recvFrom(int peer) {
  return peer >= 0 && peer < static_cast<int>(links_.size()) && links_[peer] ? links_[peer]->recvConn.get()
                                                                             : nullptr;
}

void GdrTransport::fail(Link* l, Status s) {
  if (l->error.isOk()) {
    RIDGE_WARN("gdr: rank %d, peer %d: %s", rank_, l->peer, s.message().c_str());
    l->error = s;
  }
}

Status GdrTransport::checkPeer(int peer) {
  if (peer < 0 || peer >= static_cast<int>(links_.size()) || !links_[peer]) return Status::ok();
  Link* l = links_[peer].get();
  progress();
  if (!l->error.isOk()) return l->error;
  // Slots that landed before the peer left can still be consumed: a finished peer closes once
  // its last write was acknowledged. Not while this rank waits for a send credit from it: a
  // peer that left (or broke the communicator on a mismatch and went) returns none, whatever
  // landed here, and a finished peer returned every credit before it closed (issue 23).
  if (landedPending(l) && !l->st.stalledRemote) return Status::ok();
  if (!l->creditError.isOk()) return l->creditError;
  if (l->dataQp->state() == QpState::Error || l->landQp->state() == QpState::Error)
    return makeError(ridgeRemoteError, "gdr: rank %d: the queue pair to rank %d failed (peer NIC gone?)",
                     rank_, peer);
  return Status::ok();
}

void GdrTransport::waitForActivity(int64_t maxWaitNs, bool (*stillIdle)(void*), void* arg) {
  progress();
  // Credits and landed data arrive as memory writes by the NIC. The software NIC wakes a
  // sleeper when its engine did something; other NICs give no such event, so the idle rank
  // naps briefly and looks again. A paced doorbell coming due shortens either.
  int64_t waitNs = std::min<int64_t>(maxWaitNs, wakingNic_ ? kNicWaitCapNs : 50000);
  if (anyPending_) {
    std::lock_guard<std::mutex> g(pacedMutex_);
    const int64_t now = nowNs();
    for (Link* l : active_)
      if (l->pendingHead < l->pendingRings.size())
        waitNs = std::min<int64_t>(waitNs, std::max<int64_t>(0, l->pendingRings[l->pendingHead].due - now));
  }
  // A GPU post queued and not yet seen run: the engine cannot wake us for it (it has not been
  // told of the doorbell), so look again shortly.
  const bool devicePending = gpuQueues_ && devicePostsPending();
  if (devicePending) waitNs = std::min<int64_t>(waitNs, 20000);
  if (waitNs > 0 && wakingNic_ && !devicePending) {
    // Bounded anyway (kNicWaitCapNs): a wake-up lost to a race costs a millisecond, not a hang.
    softnic::waitForNicActivity(device_.get(), waitNs, stillIdle, arg);
  } else {
    if (stillIdle && !stillIdle(arg)) return;
    if (waitNs > 0) {
      timespec ts{0, static_cast<long>(waitNs)};
      nanosleep(&ts, nullptr);
    }
  }
  progress();
}

// The device-side producer of a device buffer's message (DeviceProducer): what the GPU kernel
// of transports/gdr/gdr_kernels.cu runs, the same gdr_device.h calls (credits from its own CQ,
// payload from device memory straight into staging, mlx5 WQE, doorbell record, UAR), here on
// the emulated device's stream thread. The emulation of the NIC around it (telling the
// software NIC's engine about the doorbell, sleeping until it did something) is not device
// code. Owns the link's send side until it returns: the host touches it only after the stream
// has passed this (the strand awaits the settle).
void GdrTransport::runDeviceSend(void* link, const void* src, size_t bytes) {
  Link* l = static_cast<Link*>(link);
  GdrTransport* t = l->transport;
  const char* from = static_cast<const char*>(src);
  const int64_t deadline = nowNs() + static_cast<int64_t>(t->timeoutSeconds_) * 1000000000;
  size_t done = 0;
  bool first = true;
  while (done < bytes || first) {
    first = false;
    const uint32_t chunk = static_cast<uint32_t>(std::min<size_t>(bytes - done, l->payloadCapacity));
    char* slot = nullptr;
    while ((slot = tryAcquireSlot(l->devCh, &l->st, &l->deviceCtr)) == nullptr) {
      if (l->st.failedSyndrome != 0 || (t->abortFlag_ && t->abortFlag_->load()) || nowNs() > deadline) {
        l->deviceSendStatus = makeError(
            l->st.failedSyndrome ? ridgeRemoteError : ridgeTimeout,
            "gdr: rank %d: device-side send to rank %d: %s", t->rank_, l->peer,
            l->st.failedSyndrome ? "a send failed (mlx5 error CQE)" : "no credit within RIDGE_TIMEOUT");
        return;
      }
      if (!softnic::waitForNicActivity(t->device_.get(), kNicWaitCapNs, nullptr, nullptr)) {
        timespec nap{0, 20000};  // a NIC that wakes nobody: poll the CQ again shortly
        nanosleep(&nap, nullptr);
      }
    }
    writeStaging(slot, from + done, chunk, 0, 1);
    postSlot(l->devCh, &l->st, chunk, done + chunk == bytes, &l->deviceCtr);
    flushDoorbell(l->devCh, &l->st, &l->deviceCtr);
    l->deviceCtr.devicePosts += 1;
    t->noticeDoorbell();
    done += chunk;
  }
}

// The device-side post of a slot whose payload the device data ops wrote (collectives on
// device buffers): seal, mlx5 WQE, doorbell record, UAR, as the kernel's producer does. The
// host acquired the slot (its credits) and waits for this to have run before it acquires the
// next, so the send state has one writer at a time; the stream orders it behind the copy or
// reduction that filled the slot.
void GdrTransport::runDevicePost(void* link, const void* /*slot*/, size_t bytes) {
  Link* l = static_cast<Link*>(link);
  postSlot(l->devCh, &l->st, static_cast<uint32_t>(bytes), l->devicePostLast, &l->deviceCtr);
  flushDoorbell(l->devCh, &l->st, &l->deviceCtr);
  l->deviceCtr.devicePosts += 1;
  __atomic_fetch_add(&l->shared.p->postsRun, 1, __ATOMIC_RELEASE);
  // (Standing for a GPU's kernel: the host tells the engine, as it does for the kernel's.)
  if (!l->transport->gpuQueues_) l->transport->noticeDoorbell();
}

// On a GPU: runDevicePost as gdrPostKernel on the data ops' stream, on the device's addresses
// of the queues and of the shared state. The software NIC learns of its doorbell from the host
// (progress: a UAR write in host memory wakes no engine), as a NIC would see it at once.
Status GdrTransport::launchDevicePostOnGpu(void* link, const void* /*slot*/, size_t bytes,
                                           ridgeStream_t stream) {
#ifdef RIDGE_HAVE_CUDA
  Link* l = static_cast<Link*>(link);
  const cudaError_t e = launchGdrPost(l->devCh, l->devShared, static_cast<uint32_t>(bytes), l->devicePostLast,
                                      reinterpret_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return makeError(ridgeUnhandledCudaError, "gdr: rank %d: device-side post to rank %d: %s",
                     l->transport->rank_, l->peer, cudaGetErrorString(e));
  }
  return Status::ok();
#else
  return Status(ridgeInvalidUsage, "gdr: no GPU kernels in this build");
#endif
}

namespace {
template <class T>
Status mapForDevice(verbs::GpuRingMapping* m, T* p, size_t bytes, device::DeviceRuntime::HostRangeKind kind,
                    T** out) {
  uint64_t a = 0;
  RIDGE_TRY(m->map(p, bytes, kind, &a));
  *out = reinterpret_cast<T*>(a);
  return Status::ok();
}
}  // namespace

// A doorbell rung: the data QP and CQ are the NIC's own mlx5 rings (created through mlx5 direct
// verbs). With a GPU producer they are mapped into the GPU (GpuRingMapping: send queue, doorbell
// record, CQ, the credit record and staging; the UAR as I/O memory on gpu-doorbell) and the
// device-side producer works on those addresses; on cpu-doorbell it only publishes the doorbell
// record and doorbellLoop rings the UAR (the host stand-in, standing in for the GPU, alike).
// Without a GPU (cpu-doorbell) the CPU writes the WQEs and rings itself: nothing to map.
Status GdrTransport::useDirectRings(Link* l, const verbs::GdrLadderFacts& facts, verbs::GdrRung rung) {
  if (facts.gpu.value != verbs::Fact::Yes) return Status::ok();
  using Kind = device::DeviceRuntime::HostRangeKind;
  auto map = std::make_unique<verbs::GpuRingMapping>(device::activeRuntime());
  verbs::GpuRingMapping* m = map.get();
  const mlx5::SqView& sq = l->ch.sq;
  const mlx5::CqView& cq = l->ch.cq;
  l->devSq = sq;
  l->devCq = cq;
  const size_t stagingBytes = static_cast<size_t>(l->ch.slotCount) * l->ch.slotStrideBytes;
  Status s = mapForDevice(m, sq.ring, size_t(mlx5::kWqeBbBytes) << sq.log2Bbs, Kind::Memory, &l->devSq.ring);
  if (s.isOk()) s = mapForDevice(m, sq.dbrec, sizeof(uint32_t), Kind::Memory, &l->devSq.dbrec);
  if (s.isOk())
    s = mapForDevice(m, cq.cqes, sizeof(mlx5::Cqe64) << cq.log2Size, Kind::Memory, &l->devCq.cqes);
  if (s.isOk()) s = mapForDevice(m, cq.dbrec, sizeof(uint32_t), Kind::Memory, &l->devCq.dbrec);
  if (s.isOk()) s = mapForDevice(m, l->ch.remoteConsumed, sizeof(CreditRecord), Kind::Memory, &l->devCredit);
  // (On-NIC staging chosen explicitly where the GPU cannot map I/O memory fails here.)
  if (s.isOk())
    s = mapForDevice(m, l->ch.staging, stagingBytes, l->dm ? Kind::IoMemory : Kind::Memory, &l->devStaging);
  if (s.isOk() && rung == verbs::GdrRung::GpuDoorbell) {
    s = mapForDevice(m, sq.uarDoorbell, sizeof(uint64_t), Kind::IoMemory, &l->devSq.uarDoorbell);
    if (s.isOk() && sq.blueFlame)
      s = mapForDevice(m, sq.blueFlame, 2 * size_t(sq.bfBytes), Kind::IoMemory, &l->devSq.blueFlame);
  }
  if (!s.isOk()) {
    // The CPU still drives the NIC's own rings, ringing them itself; device buffers take the
    // copy path.
    RIDGE_WARN(
        "gdr: rank %d, peer %d: the queues could not be handed to the device-side producer (%s); "
        "the CPU posts",
        rank_, l->peer, s.message().c_str());
    return Status::ok();
  }
  l->gpuMap = std::move(map);
  if (rung == verbs::GdrRung::GpuDoorbell) return Status::ok();
  l->cpuRings = true;
  l->cpuUar = sq.uarDoorbell;
  for (mlx5::SqView* v : {&l->devSq, &l->ch.sq}) {
    v->uarDoorbell = nullptr;
    v->blueFlame = nullptr;
    v->bfBytes = 0;
  }
  return Status::ok();
}

// The software NIC's queues for a GPU producer (CUDA): its data send queue, the queue pair's
// doorbell record and UAR (members of the queue object, which has its pages to itself), the data
// CQ and its record, the credit record and the staging slots, mapped into the GPU as host memory
// (the software NIC is host memory throughout); then the shared state and landing slots.
// A mapping that fails is logged and leaves the host posting (device buffers: the copy path).
Status GdrTransport::mapSoftnicForGpu(Link* l) {
  using Kind = device::DeviceRuntime::HostRangeKind;
  auto map = std::make_unique<verbs::GpuRingMapping>(device::activeRuntime());
  verbs::GpuRingMapping* m = map.get();
  const mlx5::SqView& sq = l->ch.sq;
  const mlx5::CqView& cq = l->ch.cq;
  l->devSq = sq;
  l->devCq = cq;
  const size_t stagingBytes = static_cast<size_t>(l->ch.slotCount) * l->ch.slotStrideBytes;
  // One span for the record and the UAR (BlueFlame included): they share the queue's pages.
  const uintptr_t dbrec = reinterpret_cast<uintptr_t>(sq.dbrec);
  const uintptr_t uar = reinterpret_cast<uintptr_t>(sq.uarDoorbell);
  const uintptr_t bf = reinterpret_cast<uintptr_t>(sq.blueFlame);
  uintptr_t lo = dbrec, hi = dbrec + sizeof(uint32_t);
  if (uar) lo = std::min(lo, uar), hi = std::max<uintptr_t>(hi, uar + sizeof(uint64_t));
  if (bf) lo = std::min(lo, bf), hi = std::max<uintptr_t>(hi, bf + 2 * size_t(sq.bfBytes));
  uint64_t span = 0;
  Status s = mapForDevice(m, sq.ring, size_t(mlx5::kWqeBbBytes) << sq.log2Bbs, Kind::Memory, &l->devSq.ring);
  if (s.isOk()) s = m->map(reinterpret_cast<void*>(lo), hi - lo, Kind::Memory, &span);
  if (s.isOk()) {
    l->devSq.dbrec = reinterpret_cast<uint32_t*>(span + (dbrec - lo));
    if (uar) l->devSq.uarDoorbell = reinterpret_cast<uint64_t*>(span + (uar - lo));
    if (bf) l->devSq.blueFlame = reinterpret_cast<uint8_t*>(span + (bf - lo));
  }
  if (s.isOk())
    s = mapForDevice(m, cq.cqes, sizeof(mlx5::Cqe64) << cq.log2Size, Kind::Memory, &l->devCq.cqes);
  if (s.isOk()) s = mapForDevice(m, cq.dbrec, sizeof(uint32_t), Kind::Memory, &l->devCq.dbrec);
  if (s.isOk()) s = mapForDevice(m, l->ch.remoteConsumed, sizeof(CreditRecord), Kind::Memory, &l->devCredit);
  if (s.isOk()) s = mapForDevice(m, l->ch.staging, stagingBytes, Kind::Memory, &l->devStaging);
  // The device data ops (copies and reductions) write staging slots and read landing slots
  // at the addresses the connectors hand out, the host's: the device must see them there.
  if (s.isOk() && l->devStaging != l->ch.staging)
    s = makeError(ridgeInvalidUsage, "the device sees the staging slots at %p, not at their host address %p",
                  static_cast<void*>(l->devStaging), static_cast<void*>(l->ch.staging));
  if (!s.isOk()) {
    RIDGE_WARN(
        "gdr: rank %d, peer %d: the software NIC's queues could not be mapped into the GPU (%s); the "
        "CPU posts",
        rank_, l->peer, s.message().c_str());
    return Status::ok();
  }
  l->gpuMap = std::move(map);
  mapProducerStateForGpu(l);
  return Status::ok();
}

// With the queues mapped (gpuMap): the shared producer state and the landing slots too, so
// that the kernel twin can post and the device data ops read landed slots in place. Sets
// gpuPosts when everything is; otherwise device buffers take the copy path.
void GdrTransport::mapProducerStateForGpu(Link* l) {
  device::DeviceRuntime* rt = device::activeRuntime();
  if (!l->gpuMap || !rt || rt->runsDeviceFunctions() || !rt->runsDeviceFunction(&runDevicePost)) return;
  using Kind = device::DeviceRuntime::HostRangeKind;
  char* landing = nullptr;
  Status s = mapForDevice(l->gpuMap.get(), l->shared.p, SharedPage::kBytes, Kind::Memory, &l->devShared);
  if (s.isOk()) s = mapForDevice(l->gpuMap.get(), l->landing.p, l->landing.bytes, Kind::Memory, &landing);
  if (s.isOk() && landing != l->landing.p)
    s = makeError(ridgeInvalidUsage, "the device sees the landing slots at %p, not at their host address %p",
                  static_cast<void*>(landing), static_cast<void*>(l->landing.p));
#ifdef RIDGE_HAVE_CUDA
  // Loaded now, not at the first post: a lazily loaded kernel's first launch may wait for the
  // device while a user's stream is parked behind the batch (docs/gpu.md).
  if (s.isOk() && rt == device::cudaRuntime()) {
    const cudaError_t e = preloadGdrKernels();
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      s = makeError(ridgeUnhandledCudaError, "loading the gdr kernels: %s", cudaGetErrorString(e));
    }
  }
#endif
  if (!s.isOk()) {
    RIDGE_WARN(
        "gdr: rank %d, peer %d: the device-side post is not offered (%s); device buffers take the copy path",
        rank_, l->peer, s.message().c_str());
    return;
  }
  l->gpuPosts = true;
}

// cpu-doorbell: rings the UAR for a producer that cannot: when a send queue's doorbell record
// moved, stores the doorbell word of the WQE below it (its control segment's first 8 bytes; the
// data queue's WQEs are one block each) after a release fence. Polls; naps 20 us when idle.
void GdrTransport::doorbellLoop() {
  while (!stopDoorbell_.load(std::memory_order_relaxed)) {
    bool rang = false;
    for (Link* l : active_) {
      if (!l->cpuRings) continue;
      const mlx5::SqView& sq = l->ch.sq;
      const uint32_t pi = mlx5::be32(loadVolatile32(sq.dbrec)) & 0xffffu;
      if (pi == l->cpuRungPi) continue;
      verbs::verbsAcquireFence();  // the WQE was written before the record
      const uint32_t last = (pi - 1u) & ((1u << sq.log2Bbs) - 1u);
      const uint64_t ctrl8 =
          loadVolatile64(reinterpret_cast<const uint64_t*>(sq.ring + size_t(last) * mlx5::kWqeBbBytes));
      mlx5::SqView ring = sq;
      ring.uarDoorbell = l->cpuUar;
      mlx5::ringDoorbellWord(ring, ctrl8);
      l->cpuRungPi = pi;
      gCpuDoorbells.fetch_add(1, std::memory_order_relaxed);
      rang = true;
    }
    if (!rang) {
      timespec nap{0, 20000};
      nanosleep(&nap, nullptr);
    }
  }
}

// A GPU's UAR write into the software NIC's host memory wakes no engine; a NIC would see it at
// once. The host tells the engine when it polls (progress), but a batch may end with its last
// post still on the stream and nobody polling: this thread watches the posts run and tells the
// engine (emulation of the NIC's doorbell, not a step of the device-side code). Polls every
// 10 us for a millisecond after a post ran, every 500 us otherwise.
void GdrTransport::snoopLoop() {
  uint64_t seen = 0;
  int64_t lastChange = 0;
  while (!stopDoorbell_.load(std::memory_order_relaxed)) {
    uint64_t run = 0;
    for (const Link* l : active_)
      if (l->gpuPosts) run += l->postsRun();
    const int64_t now = nowNs();
    if (run != seen) {
      seen = run;
      lastChange = now;
      noticeDoorbell();
    }
    timespec nap{0, now - lastChange < 1000000 ? 10000 : 500000};
    nanosleep(&nap, nullptr);
  }
}

void GdrTransport::pumpRings(Link* l, int64_t now) {
  size_t last = l->pendingHead;
  while (last < l->pendingRings.size() && l->pendingRings[last].due <= now) ++last;
  if (last == l->pendingHead) return;
  if (l->mode == Mode::Staged) {
    // The proxy posts each WQE whose modeled copy is done.
    for (size_t i = l->pendingHead; i < last; ++i) postStaged(l, l->pendingRings[i].wqe);
  } else {
    // Ringing with the newest due index publishes every WQE below it: one doorbell for all.
    const uint32_t pi = l->pendingRings[last - 1].pi;
    ringTo(l->ch.sq, pi, l->pendingRings[last - 1].ctrl8, &l->ctr);
    l->st.rungPi = pi;
    noticeDoorbell();
  }
  l->pendingHead = last;
  if (l->pendingHead == l->pendingRings.size()) {
    l->pendingRings.clear();
    l->pendingHead = 0;
  }
}

void GdrTransport::progress() {
  if (anyPending_) {
    std::lock_guard<std::mutex> g(pacedMutex_);
    const int64_t now = nowNs();
    bool still = false;
    for (Link* l : active_) {
      pumpRings(l, now);
      still = still || l->pendingHead < l->pendingRings.size();
    }
    anyPending_ = still;
  }
  for (Link* l : active_) {
    if (l->creditDirty) returnCredit(l);
    // A GPU's UAR write into the software NIC's host memory wakes no engine: tell it.
    if (gpuQueues_ && l->gpuPosts) {
      const uint64_t run = l->postsRun();
      if (run != l->devicePostsNoticed) {
        l->devicePostsNoticed = run;
        noticeDoorbell();
      }
    }
  }
}

// The proxy of host-staged mode posts through the provider, in the order the slots were
// sealed (st.pi counted them), so the WQE index it lands at is the one rungPi names.
void GdrTransport::postStaged(Link* l, const verbs::Wqe& w) {
  Status s = l->dataQp->postSend(w);
  if (!s.isOk()) {
    fail(l, s);
    return;
  }
  l->st.rungPi += 1;
  l->ctr.doorbells += 1;
}

// Staging credits and send failures come back as CQEs (every k-th WQE asks for one; a QP in
// error flushes every outstanding WQE with an error CQE). The device-side producer polls the
// CQ itself (in tryAcquireSlot); host-staged mode polls through the provider, as any
// rdma-core device allows.
void GdrTransport::pollDataCompletions(Link* l) {
  if (l->mode == Mode::Staged) {
    Cqe c[16];
    const int n = l->dataCq->poll(c, 16);
    for (int i = 0; i < n; ++i) {
      if (c[i].status == verbs::kCqeOk) {
        const uint32_t upTo = l->st.retired + static_cast<uint16_t>(c[i].wqeCounter + 1u - l->st.retired);
        l->ctr.creditsReturned += upTo - l->st.retired;
        l->st.retired = upTo;
      } else {
        l->ctr.completionErrors += 1;
        fail(l, makeError(ridgeRemoteError, "gdr: rank %d: send to rank %d failed: %s", rank_, l->peer,
                          verbs::cqeStatusName(c[i].status)));
      }
    }
  } else {
    pollSendCq(l->ch, &l->st, &l->ctr);
  }
  if (l->st.failedSyndrome != 0)
    fail(l, makeError(ridgeRemoteError, "gdr: rank %d: send to rank %d failed (mlx5 CQE syndrome 0x%02x)",
                      rank_, l->peer, l->st.failedSyndrome));
}

void* GdrTransport::tryAcquire(Link* l) {
  progress();
  if (!l->error.isOk()) return nullptr;
  // The device still has to post the last slot (collectives on device buffers): the send
  // state is its until then.
  if (l->deviceLaunch && l->postsRun() != l->devicePostsQueued) return nullptr;
  if (l->mode == Mode::Staged) pollDataCompletions(l);
  char* payload = tryAcquireSlot(l->ch, &l->st, &l->ctr);
  if (!payload) {
    pollDataCompletions(l);
    return nullptr;
  }
  // host-staged: the producer writes its own (GPU) slot; the copy to the host slot is post's.
  return l->mode == Mode::Staged ? l->gpuSlot.p : payload;
}

// The host-staged proxy's work request for a sealed slot.
verbs::Wqe stagedWqe(const Link* l, const SlotSend& s) {
  verbs::Wqe w{};
  w.opcode = verbs::kWqeRdmaWriteImm;
  w.flags = s.signaled ? uint8_t{verbs::kWqeSignaled} : uint8_t{0};
  w.immData = s.imm;
  w.length = s.bytes;
  w.remoteAddr = s.remoteAddr;
  w.rkey = l->ch.remoteRkey;
  w.localAddr = s.localAddr;
  w.lkey = l->ch.stagingLkey;
  w.wrId = s.imm;
  return w;
}

void GdrTransport::post(Link* l, uint32_t bytes, bool last) {
  if (l->deviceLaunch) {
    // Bound to a device queue (only where deviceProducerUsable: write mode, not paced): the
    // device posts the slot it filled, behind the data op that filled it.
    l->devicePostLast = last;
    l->devicePostsQueued += 1;
    char* payload = stagingSlot(l->ch, l->st.seq) + kSlotHeaderBytes;
    if (l->deviceLaunch(l->deviceQueue, &GdrTransport::runDevicePost, l, payload, bytes).isOk()) return;
    l->devicePostsQueued -= 1;  // refused: nothing queued, the host posts
  }
  if (l->mode == Mode::Staged) {
    // Copy engine: GPU slot -> pinned host slot; then the CPU proxy posts the WQE through the
    // provider. The slot's header, trailer and WQE are the same as the other modes'.
    char* hostSlot = stagingSlot(l->ch, l->st.seq) + kSlotHeaderBytes;
    writeStaging(hostSlot, l->gpuSlot.p, bytes, 0, 1);
  }
  if (l->pacer.enabled()) {
    std::unique_lock<std::mutex> g(pacedMutex_);
    const int64_t now = nowNs();
    const int64_t due = l->pacer.dueNs(now, bytes);
    Link::PendingRing p{};
    if (l->mode == Mode::Staged) {
      const SlotSend sealed = sealSlot(l->ch, &l->st, bytes, last, &l->ctr);
      p.wqe = stagedWqe(l, sealed);
      l->st.pi += 1;
      if (sealed.signaled) l->st.signaledPi = l->st.pi;
      p.pi = l->st.pi;
    } else {
      postSlot(l->ch, &l->st, bytes, last, &l->ctr);
      p.pi = l->st.pi;
      p.ctrl8 = l->st.lastCtrl8;
    }
    p.due = due;
    l->pendingRings.push_back(p);
    anyPending_ = true;
    // The last chunk of a message is rung before post returns: the caller may not touch
    // this transport again, and the bytes must still reach the NIC (a bounded wait: the
    // modeled time of what is queued).
    if (last) {
      while (nowNs() < due) {
      }
    }
    pumpRings(l, last ? due : now);
    return;
  }
  if (l->mode == Mode::Staged) {
    // The CPU proxy posts the send the device-side code seals, through the provider.
    const SlotSend sealed = sealSlot(l->ch, &l->st, bytes, last, &l->ctr);
    l->st.pi += 1;
    if (sealed.signaled) l->st.signaledPi = l->st.pi;
    postStaged(l, stagedWqe(l, sealed));
    return;
  }
  postSlot(l->ch, &l->st, bytes, last, &l->ctr);
  flushDoorbell(l->ch, &l->st, &l->ctr);
  noticeDoorbell();
}

const void* GdrTransport::tryPeek(Link* l, SlotInfo* info) {
  progress();
  if (!l->error.isOk()) return nullptr;
  const char* slot = l->landing.p + static_cast<size_t>(l->recvSeq % l->landingSlots) * l->stride;
  if (l->peeked) {
    *info = l->peekInfo;
    return slot + kSlotHeaderBytes;
  }
  mlx5::CqeFields c;
  if (!mlx5::pollCq(*l->landCq->mlx5Cq(), &l->landCi, &c)) return nullptr;
  if (c.opcode != mlx5::kCqeRespWrImm) {
    l->ctr.completionErrors += 1;
    fail(l, makeError(ridgeRemoteError,
                      "gdr: rank %d: receive from rank %d failed (mlx5 CQE opcode %u, syndrome 0x%02x)",
                      rank_, l->peer, c.opcode, c.syndrome));
    return nullptr;
  }
  // The receive buffer was consumed: give the NIC a new one for a later slot.
  verbs::RecvWqe r{};
  r.wrId = c.wqeCounter;
  Status s = l->landQp->postRecv(r);
  if (!s.isOk()) {
    fail(l, s);
    return nullptr;
  }
  const uint64_t expect = l->recvSeq + 1;
  const uint32_t check = checkLanded(slot, l->payloadCapacity, expect, c.imm, c.byteCnt);
  if (check != kLandedOk) {
    l->ctr.stagedLost += 1;
    static const char* const kWhat[] = {"ok", "a slot was dropped or repeated (immediate)",
                                        "the slot header was overwritten in staging",
                                        "the slot trailer was overwritten in staging", "bad slot size"};
    fail(l, makeError(ridgeInternalError, "gdr: rank %d: slot %llu from rank %d: %s (immediate %u)", rank_,
                      static_cast<unsigned long long>(expect), l->peer, kWhat[check < 5 ? check : 4], c.imm));
    return nullptr;
  }
  const SlotHeader* h = reinterpret_cast<const SlotHeader*>(slot);
  l->peekInfo.bytes = h->bytes;
  l->peekInfo.lastOfMessage = (h->flags & kSlotLast) != 0;
  l->peeked = true;
  l->ctr.slotsLanded += 1;
  // Real GPUs need the landed bytes ordered before the consumer reads them (a flush read or
  // an acquire on the completion, docs/gdr-write.md); the host build's acquire is in pollCq.
  *info = l->peekInfo;
  return slot + kSlotHeaderBytes;
}

void GdrTransport::release(Link* l) {
  if (!l->peeked) return;
  l->peeked = false;
  l->recvSeq += 1;
  CreditRecord* rec = reinterpret_cast<CreditRecord*>(l->creditOut.p);
  // Check word after the count: a NIC that copies the record mid-update sends a pair that
  // fails the check, and the write posted below carries the consistent one.
  storeVolatile64(&rec->count, l->recvSeq);
  storeVolatile64(&rec->check, l->recvSeq ^ kCreditCheck);
  if (gWithholdCreditsForTesting.load(std::memory_order_relaxed)) return;
  l->creditDirty = true;
  returnCredit(l);
}

// Every credit write asks for its CQE: completions move creditRetired, failures are kept.
void GdrTransport::pollCreditCq(Link* l) {
  mlx5::CqeFields c;
  for (int i = 0; i < 16 && mlx5::pollCq(*l->creditCq->mlx5Cq(), &l->creditCi, &c); ++i) {
    if (c.opcode == mlx5::kCqeReq) {
      l->creditRetired += static_cast<uint16_t>(c.wqeCounter + 1u - l->creditRetired);
    } else {
      l->ctr.completionErrors += 1;
      if (l->creditError.isOk())
        l->creditError = makeError(ridgeRemoteError,
                                   "gdr: rank %d: credit write to rank %d failed (mlx5 CQE syndrome 0x%02x)",
                                   rank_, l->peer, c.syndrome);
    }
  }
}

void GdrTransport::returnCredit(Link* l) {
  pollCreditCq(l);
  // The record travels inline in the WQE (16 bytes): the NIC reads no buffer for it.
  if (postInlineWrite(*l->landQp->mlx5Sq(), &l->creditPi, l->creditRetired, &l->creditBfOffset,
                      l->creditOut.p, sizeof(CreditRecord), l->remoteCreditAddr, l->remoteCreditRkey,
                      &l->ctr)) {
    l->creditDirty = false;
    l->ctr.creditWrites += 1;
    noticeDoorbell();
  }
}

Status GdrTransport::chooseMode(Mode* mode, std::string* why) {
  topo::GdrModeSetting setting;
  RIDGE_TRY(topo::readGdrModeSetting(&setting));
  if (setting.kind == topo::GdrModeSetting::Kind::Forced) {
    *mode = fromGdrOption(setting.forced);
    *why = "forced by RIDGE_GDR_MODE";
    return Status::ok();
  }
  // Off does not reach here (gdrModeOn); auto asks the advisor.
  if (paced_) {
    *mode = fromGdrOption(model_.advice.chosen);
    *why = "GDR advisor: " + model_.advice.reason;
    return Status::ok();
  }
  // Without a placement to judge, the mode this transport exists for.
  *mode = Mode::Write;
  *why = "auto without a PCIe model (RIDGE_SOFTNIC_PCIE_MODEL unset): gdr-write";
  return Status::ok();
}

// The producer's slots, which the NIC reads where the producer wrote them. read mode, in a
// process that hands out device memory for the NIC (a NetRingAllocator, as the device network's
// rings have): device memory registered as GPU memory, dma-buf first, then peer memory
// (transports/net/device_registration.h). Otherwise host memory.
Status GdrTransport::setUpProducerSlots(Link* l, size_t bytes, bool deviceMemory, std::string* where) {
  if (NetRingAllocator* from = deviceMemory ? netRingAllocator() : nullptr) {
    bytes = (bytes + 4095) & ~size_t(4095);  // whole pages: a dma-buf export covers whole pages
    RIDGE_TRY(from->allocate(bytes, &l->deviceSlots));
    l->deviceSlotsFrom = from;
    l->deviceSlotsBytes = bytes;
    DeviceRegPath path = DeviceRegPath::DmaBuf;
    RIDGE_TRY(registerDeviceRange(pd_.get(), from->registrar(), l->deviceSlots, bytes,
                                  verbs::kAccessLocalWrite, &l->slotsMr, &path));
    l->ch.staging = static_cast<char*>(l->deviceSlots);
    *where = format("device memory (%s)", deviceRegPathName(path));
  } else {
    RIDGE_TRY(l->slots.allocate(bytes));
    RIDGE_TRY(pd_->registerMemory(l->slots.p, l->slots.bytes, verbs::kAccessLocalWrite, &l->slotsMr));
    l->ch.staging = l->slots.p;
    *where = "host memory";
  }
  l->ch.stagingWqeAddr = reinterpret_cast<uint64_t>(l->ch.staging);
  l->ch.stagingLkey = l->slotsMr->lkey();
  return Status::ok();
}

// `ladder`: the GDR-write ladder's decision on an rdma-core device (null elsewhere); with
// RIDGE_GDR_STAGING auto its staging place decides between on-NIC and host memory.
Status GdrTransport::setUpStaging(Link* l, const verbs::GdrLadderDecision* ladder, std::string* tier,
                                  std::string* why) {
  const uint32_t slots = l->ch.slotCount;
  const size_t bytes = static_cast<size_t>(slots) * l->stride;
  const std::string want = settingString(Setting::GDR_STAGING);
  const bool isAuto = want == "auto" || want == "AUTO";
  if (want != "nic-gpu" && want != "nic" && want != "host" && !isAuto)
    return makeError(ridgeInvalidArgument, "RIDGE_GDR_STAGING='%s': expected auto, nic-gpu, nic or host",
                     want.c_str());
  std::string notes;
  // (a) NIC memory mapped into the GPU: needs a GPU producer, the rdma-core provider and a
  // way to map device memory for the GPU (mlx5dv_dm_map_op_addr + cudaHostRegister with the
  // I/O-memory flag), which no public source shows working. This build's producer is the
  // CPU stand-in, so the tier is detected as absent.
  const char* noGpuMap =
      "no GPU producer in this process (CPU stand-in), and NIC memory mapped into a GPU "
      "is unverified (ibv_alloc_dm + mlx5dv_dm_map_op_addr + cudaHostRegister I/O memory)";
  if (want == "nic-gpu") return makeError(ridgeInvalidUsage, "RIDGE_GDR_STAGING=nic-gpu: %s", noGpuMap);
  notes = std::string("nic-gpu skipped: ") + noGpuMap;
  // With a PCIe model the advisor has weighed NIC memory (small: its credits cap the rate)
  // against host memory; auto follows its pick.
  bool hostPreferred = false;
  if (isAuto && ladder && ladder->staging == verbs::GdrStagingPlace::HostMemory) {
    hostPreferred = true;
    notes += "; nic skipped: the ladder places staging in host memory (" + ladder->stagingReason + ")";
  } else if (isAuto && ladder && ladder->staging == verbs::GdrStagingPlace::NicMemory) {
    notes += "; the ladder places staging in on-NIC memory (" + ladder->stagingReason + ")";
  }
  if (isAuto && !hostPreferred && gpuQueues_) {
    // The software NIC's memory is carved from its packet staging, so two links' slots may
    // share a page, and a page can be mapped into the GPU only once.
    hostPreferred = true;
    notes += "; nic skipped: a GPU posts, and the software NIC's memory is not page-granular for its mapping";
  }
  if (isAuto && !hostPreferred && paced_ &&
      model_.advice.estimate(topo::GdrOption::GdrWrite).staging == topo::StagingTier::HostMemory) {
    hostPreferred = true;
    notes += "; nic skipped: the PCIe model puts host-memory staging ahead (" +
             model_.advice.estimate(topo::GdrOption::GdrWrite).otherTier + ")";
  }
  // (c) The NIC's own staging memory, when the provider maps it for the CPU: the stand-in
  // writes it directly, as a GPU would write NIC memory mapped into it.
  if ((isAuto && !hostPreferred) || want == "nic") {
    std::unique_ptr<verbs::DeviceMemory> dm;
    Status s = pd_->allocDeviceMemory(bytes, verbs::kAccessLocalWrite, &dm);
    if (s.isOk() && dm->mapped()) {
      l->dm = std::move(dm);
      std::memset(l->dm->mapped(), 0, bytes);
      l->ch.staging = static_cast<char*>(l->dm->mapped());
      l->ch.stagingWqeAddr = 0;  // device memory is zero-based
      l->ch.stagingLkey = l->dm->region()->lkey();
      *tier = "nic";
      *why = format("NIC device memory of %s (%zu bytes, CPU-mapped for the stand-in); %s",
                    device_->attributes().name.c_str(), bytes, notes.c_str());
      return Status::ok();
    }
    const std::string reason = s.isOk() ? "the provider does not map its device memory" : s.message();
    if (want == "nic") return makeError(ridgeInvalidUsage, "RIDGE_GDR_STAGING=nic: %s", reason.c_str());
    notes += "; nic skipped: " + reason;
  }
  // (b) Pinned host memory on the NIC's NUMA node: the NIC reads it locally. The pages are
  // bound to that node (mbind, before mlock faults them in), not left to first touch.
  RIDGE_TRY(l->slots.allocate(bytes));
  std::string numa = "the NIC's NUMA node is unknown (software NIC): local node";
  {
    std::ifstream f("/sys/class/infiniband/" + device_->attributes().name + "/device/numa_node");
    int node = -1;
    if (f >> node && node >= 0) numa = bindToNode(l->slots.p, l->slots.bytes, node);
  }
  if (mlock(l->slots.p, l->slots.bytes) != 0) notes += "; mlock failed (memory not pinned)";
  RIDGE_TRY(pd_->registerMemory(l->slots.p, l->slots.bytes, verbs::kAccessLocalWrite, &l->slotsMr));
  l->ch.staging = l->slots.p;
  l->ch.stagingWqeAddr = reinterpret_cast<uint64_t>(l->slots.p);
  l->ch.stagingLkey = l->slotsMr->lkey();
  *tier = "host";
  *why = format("pinned host memory (%zu bytes), %s; %s", bytes, numa.c_str(), notes.c_str());
  return Status::ok();
}

// ---- Set-up, in phases: plan (peers, mode, sizes), open the NIC, consult the ladder (verbs,
// write), set up each link (queues, slots, credit records, landing ring), connect the links
// (endpoints, RTR, RTS), go live (connectors, counters, threads, the INFO lines).

Status GdrTransport::plan(const TransportSetup& setup, SetupPlan* p) {
  rank_ = setup.rank;
  abortFlag_ = setup.abortFlag;
  if (setup.timeoutSeconds > 0) timeoutSeconds_ = setup.timeoutSeconds;
  links_.resize(setup.nranks);
  for (int peer = 0; peer < setup.nranks; ++peer) {
    if (peer == rank_ || connectedBefore(&kGdrTransportTable, setup, rank_, peer)) continue;
    if (kGdrTransportTable.canConnect(setup, rank_, peer)) p->peers.push_back(peer);
  }
  const std::string modelSpec = settingString(Setting::SOFTNIC_PCIE_MODEL);
  if (!modelSpec.empty()) {
    RIDGE_TRY(loadModel(modelSpec, settingString(Setting::GDR_PAIR), &model_));
    paced_ = true;
  }
  RIDGE_TRY(chooseMode(&p->mode, &p->modeWhy));

  p->slots = settingInt(Setting::GDR_STAGING_SLOTS);
  p->landingSlots = settingInt(Setting::GDR_RECV_SLOTS);
  int64_t payload = settingSize(Setting::GDR_SLOT_BYTES);
  if (p->slots < 1 || p->slots > 64)
    return makeError(ridgeInvalidArgument, "RIDGE_GDR_STAGING_SLOTS=%lld: expected 1 to 64",
                     static_cast<long long>(p->slots));
  if (p->landingSlots < 1 || p->landingSlots > 256)
    return makeError(ridgeInvalidArgument, "RIDGE_GDR_RECV_SLOTS=%lld: expected 1 to 256",
                     static_cast<long long>(p->landingSlots));
  if (payload < 64 || payload > (16 << 20))
    return makeError(ridgeInvalidArgument, "RIDGE_GDR_SLOT_BYTES=%lld: expected 64 to 16M",
                     static_cast<long long>(payload));
  const int64_t besideShm = slotBytesBesideShm(&kGdrTransportTable, setup, payload);
  if (besideShm != payload)
    RIDGE_INFO(
        "gdr: rank %d: slot payload %lld bytes (RIDGE_SHM_SLOT_BYTES: shared memory carries some pairs "
        "and every rank must cut messages alike) instead of RIDGE_GDR_SLOT_BYTES=%lld",
        rank_, static_cast<long long>(besideShm), static_cast<long long>(payload));
  if (besideShm > (16 << 20))
    return makeError(ridgeInvalidArgument,
                     "RIDGE_SHM_SLOT_BYTES=%lld: shared memory carries some pairs, so the gdr slot must be "
                     "as large, but the gdr transport's slots hold at most 16M",
                     static_cast<long long>(besideShm));
  p->capacity = static_cast<uint32_t>(besideShm) & ~63u;
  p->stride = slotStride(p->capacity);
  return Status::ok();
}

// One NIC per transport, with staging room for every peer's slots next to its packets.
Status GdrTransport::openNic(const SetupPlan& p) {
  if (netProvider() == "verbs") {
    RIDGE_TRY(verbs::openProvider("verbs", &provider_));
    RIDGE_TRY(provider_->open(0, &device_));
  } else {
    softnic::Options o = softnic::Options::fromSettings();
    // One packet per slot unless RIDGE_SOFTNIC_MTU says otherwise: a slot cut at 16 KiB costs
    // the engines a frame, a payload read and an acknowledgement per piece, and a slot one
    // header larger than the MTU a second packet of 72 bytes.
    // (At most the 1M RIDGE_SOFTNIC_MTU allows: larger slots go as several packets.)
    if (!settingIsSet(Setting::SOFTNIC_MTU))
      o.mtu = std::max<size_t>(o.mtu, std::min<size_t>((p.stride + 63) & ~63u, 1 << 20));
    const size_t dmBytes = p.peers.size() * static_cast<size_t>(p.slots) * p.stride;
    o.stagingBytes = std::max(o.stagingBytes, 2 * dmBytes + 4 * o.mtu + (64 << 10));
    o.stagingBytes = (o.stagingBytes + 4095) & ~size_t(4095);
    RIDGE_TRY(softnic::openDevice(o, &device_));
    wakingNic_ = true;
  }
  return device_->allocPd(&pd_);
}

// On an rdma-core device, write mode asks the GDR-write ladder which rung this NIC and GPU
// allow, with the staging this transport needs, says so at init and builds what it says: the
// doorbell rungs' data queues through mlx5 direct verbs (useDirectRings), the staging where
// its `staging` points (setUpStaging).
void GdrTransport::consultLadder(SetupPlan* p) {
  if (p->mode != Mode::Write || netProvider() != "verbs") return;
  const uint64_t stagingBytes =
      static_cast<uint64_t>(p->peers.size()) * static_cast<uint64_t>(p->slots) * p->stride;
  p->ladderFacts = verbs::probeGdrLadder(device_.get(), device::activeRuntime(), stagingBytes);
  p->ladder = verbs::decideGdrLadder(p->ladderFacts);
  p->directRings =
      p->ladder->rung == verbs::GdrRung::GpuDoorbell || p->ladder->rung == verbs::GdrRung::CpuDoorbell;
  RIDGE_INFO(
      "gdr: rank %d: ladder rung %s; %s; staging where the ladder says unless RIDGE_GDR_STAGING is set",
      rank_, verbs::gdrLadderLine(*p->ladder).c_str(),
      p->directRings ? "data queues through mlx5 direct verbs" : "the provider's proxied mlx5 rings");
}

// The link's queue pairs and CQs: data QP -> the peer's landing QP, landing QP (receives,
// and the credit writes back), each with its CQ, moved to INIT.
Status GdrTransport::createQueues(Link* l, const SetupPlan& p) {
  const uint32_t sqEntries = verbs::roundUpPow2(static_cast<uint32_t>(p.slots));
  if (p.directRings)
    RIDGE_TRY(pd_->createMlx5Cq(2 * sqEntries + 8, &l->dataCq));
  else
    RIDGE_TRY(pd_->createCq(2 * sqEntries + 8, &l->dataCq));
  verbs::QpCaps dataCaps;
  dataCaps.maxSendWr = sqEntries;
  dataCaps.maxRecvWr = 1;
  dataCaps.mlx5Direct = p.directRings;
  RIDGE_TRY(pd_->createQp(l->dataCq.get(), l->dataCq.get(), dataCaps, &l->dataQp));
  const uint32_t creditEntries =
      verbs::roundUpPow2(static_cast<uint32_t>(std::max<int64_t>(64, 4 * p.landingSlots)));
  RIDGE_TRY(pd_->createCq(static_cast<uint32_t>(p.landingSlots) + 8, &l->landCq));
  RIDGE_TRY(pd_->createCq(2 * creditEntries, &l->creditCq));
  verbs::QpCaps landCaps;
  landCaps.maxSendWr = creditEntries;
  landCaps.maxRecvWr = static_cast<uint32_t>(p.landingSlots);
  RIDGE_TRY(pd_->createQp(l->creditCq.get(), l->landCq.get(), landCaps, &l->landQp));
  // The producer of read and write writes mlx5 WQEs and polls its CQ itself; host-staged
  // posts its data through postSend and polls through the provider (any provider, no raw
  // data queue). Every mode's receive side polls the landing and credit CQs and posts the
  // inline credit writes itself. (An rdma-core device gives these as the proxy's rings in
  // host memory: transports/verbs/ibv_provider.cpp, RingProxy.)
  const bool producerRings = p.mode != Mode::Staged;
  const char* missing = nullptr;
  if (producerRings && !l->dataQp->mlx5Sq()) missing = "the data send queue";
  if (!missing && producerRings && !l->dataCq->mlx5Cq()) missing = "the data CQ";
  if (!missing && !l->landQp->mlx5Sq()) missing = "the credit send queue";
  if (!missing && !l->landCq->mlx5Cq()) missing = "the landing CQ";
  if (!missing && !l->creditCq->mlx5Cq()) missing = "the credit CQ";
  if (missing)
    return makeError(ridgeInvalidUsage, "gdr: the %s provider does not expose %s as an mlx5 queue (mode %s)",
                     device_->attributes().provider.c_str(), missing, modeName(p.mode));
  RIDGE_TRY(l->dataQp->modify(QpState::Init));
  RIDGE_TRY(l->landQp->modify(QpState::Init));
  if (producerRings) {
    l->ch.sq = *l->dataQp->mlx5Sq();
    l->ch.cq = *l->dataCq->mlx5Cq();
  }
  return Status::ok();
}

// One peer's link: queues, the producer's slots (staging or its own), the credit record the
// peer writes, the landing ring with its receives posted; what the peer needs goes into `e`.
Status GdrTransport::setUpLink(int peer, SetupPlan* p, Endpoint* e) {
  auto l = std::make_unique<Link>();
  l->peer = peer;
  l->mode = p->mode;
  l->payloadCapacity = p->capacity;
  l->stride = p->stride;
  l->landingSlots = static_cast<uint32_t>(p->landingSlots);
  if (paced_) {
    ModeTiming t = model_.timing[static_cast<int>(p->mode)];
    const double scale =
        static_cast<double>(std::clamp<int64_t>(settingInt(Setting::GDR_PACE_SCALE), 1, 1000));
    t.latencyNs *= scale;
    t.bandwidthGBs /= scale;
    l->pacer.configure(t);
    // At most one pending ring per staging slot (a slot is not reused before its send
    // retires, which needs its doorbell): post never allocates.
    l->pendingRings.reserve(static_cast<size_t>(p->slots));
  }
  RIDGE_TRY(createQueues(l.get(), *p));
  l->ch.signalEvery = std::max<uint32_t>(1, static_cast<uint32_t>(p->slots) / 2);
  l->ch.slotCount = static_cast<uint32_t>(p->slots);
  l->ch.slotStrideBytes = p->stride;
  l->ch.payloadCapacity = p->capacity;
  if (p->mode == Mode::Write) {
    RIDGE_TRY(setUpStaging(l.get(), p->ladder ? &*p->ladder : nullptr, &p->tierName, &p->tierWhy));
  } else {
    // read: the producer's slots, which the NIC reads; staged: pinned host slots the copy
    // engine fills from one GPU slot.
    RIDGE_TRY(setUpProducerSlots(l.get(), static_cast<size_t>(p->slots) * p->stride, p->mode == Mode::Read,
                                 &p->readSlots));
    if (p->mode == Mode::Staged) RIDGE_TRY(l->gpuSlot.allocate(p->capacity));
  }
  RIDGE_TRY(l->creditIn.allocate(sizeof(CreditRecord)));
  RIDGE_TRY(pd_->registerMemory(l->creditIn.p, l->creditIn.bytes,
                                verbs::kAccessLocalWrite | verbs::kAccessRemoteWrite, &l->creditInMr));
  l->ch.remoteConsumed = reinterpret_cast<const CreditRecord*>(l->creditIn.p);
  l->ch.remoteSlotCount = l->landingSlots;
  if (p->directRings) RIDGE_TRY(useDirectRings(l.get(), p->ladderFacts, p->ladder->rung));

  RIDGE_TRY(l->landing.allocate(static_cast<size_t>(p->landingSlots) * p->stride));
  RIDGE_TRY(pd_->registerMemory(l->landing.p, l->landing.bytes,
                                verbs::kAccessLocalWrite | verbs::kAccessRemoteWrite, &l->landingMr));
  RIDGE_TRY(l->creditOut.allocate(sizeof(CreditRecord)));
  RIDGE_TRY(
      pd_->registerMemory(l->creditOut.p, l->creditOut.bytes, verbs::kAccessLocalWrite, &l->creditOutMr));
  if (gpuQueues_)
    RIDGE_TRY(mapSoftnicForGpu(l.get()));
  else if (p->directRings)
    mapProducerStateForGpu(l.get());
  for (int64_t i = 0; i < p->landingSlots; ++i) {
    verbs::RecvWqe r{};
    r.wrId = static_cast<uint64_t>(i);
    RIDGE_TRY(l->landQp->postRecv(r));
  }
  RIDGE_TRY(l->dataQp->localAddress(&e->dataQp));
  RIDGE_TRY(l->landQp->localAddress(&e->landingQp));
  e->landingAddr = reinterpret_cast<uint64_t>(l->landing.p);
  e->landingRkey = l->landingMr->rkey();
  e->creditAddr = reinterpret_cast<uint64_t>(l->creditIn.p);
  e->creditRkey = l->creditInMr->rkey();
  e->slotStride = p->stride;
  e->landingSlots = l->landingSlots;
  links_[peer] = std::move(l);
  return Status::ok();
}

// Everyone's endpoints for everyone (small: P x P entries), then both QPs of every link
// through RTR and RTS, with a barrier between (no peer sends to a QP not yet ready).
Status GdrTransport::connectLinks(const TransportSetup& setup, const SetupPlan& p,
                                  const std::vector<Endpoint>& mine) {
  const int P = setup.nranks;
  std::vector<Endpoint> theirs(static_cast<size_t>(P) * P);
  std::memcpy(&theirs[static_cast<size_t>(rank_) * P], mine.data(), sizeof(Endpoint) * P);
  RIDGE_TRY(setup.bootstrap->allGather(theirs.data(), sizeof(Endpoint) * P));
  for (int peer : p.peers) {
    Link* l = links_[peer].get();
    const Endpoint& e = theirs[static_cast<size_t>(peer) * P + rank_];
    if (e.slotStride != p.stride || e.landingSlots != l->landingSlots)
      return makeError(ridgeInvalidUsage,
                       "gdr: rank %d and rank %d disagree on RIDGE_GDR_SLOT_BYTES or RIDGE_GDR_RECV_SLOTS",
                       rank_, peer);
    RIDGE_TRY(l->dataQp->modify(QpState::Rtr, &e.landingQp));
    RIDGE_TRY(l->landQp->modify(QpState::Rtr, &e.dataQp));
    l->ch.remoteAddr = e.landingAddr;
    l->ch.remoteRkey = e.landingRkey;
    l->remoteCreditAddr = e.creditAddr;
    l->remoteCreditRkey = e.creditRkey;
    // The device-side producer's view: the same channel, with the device's addresses where
    // the queues were mapped into the GPU.
    l->devCh = l->ch;
    if (l->gpuMap) {
      l->devCh.sq = l->devSq;
      l->devCh.cq = l->devCq;
      l->devCh.staging = l->devStaging;
      l->devCh.remoteConsumed = l->devCredit;
    }
  }
  RIDGE_TRY(setup.bootstrap->barrier());
  for (int peer : p.peers) {
    RIDGE_TRY(links_[peer]->dataQp->modify(QpState::Rts));
    RIDGE_TRY(links_[peer]->landQp->modify(QpState::Rts));
  }
  return setup.bootstrap->barrier();
}

// Connectors, the process-wide counters and report, the pacer and doorbell threads, and what
// set-up decided at INFO.
void GdrTransport::goLive(const SetupPlan& p) {
  for (int peer : p.peers) {
    Link* l = links_[peer].get();
    l->transport = this;
    l->sendConn = std::make_unique<GdrSend>(this, l, deviceProducerUsable(l));
    l->recvConn = std::make_unique<GdrRecv>(this, l);
    active_.push_back(l);
  }
  const Mode mode = p.mode;
  {
    std::lock_guard<std::mutex> g(gCountersMutex);
    for (Link* l : active_) {
      gLiveCounters.push_back(&l->ctr);
      gLiveCounters.push_back(&l->deviceCtr);
    }
    gLastReport.mode = mode;
    gLastReport.modeReason = p.modeWhy;
    gLastReport.stagingTier = mode == Mode::Write ? p.tierName : "";
    gLastReport.stagingReason = mode == Mode::Write ? p.tierWhy : "";
    gLastReport.readSlots = mode == Mode::Read ? p.readSlots : "";
    gLastReport.rung = p.ladder ? verbs::gdrRungName(p.ladder->rung) : "";
    gLastReport.directQueues = p.directRings;
    gLastReport.queuesMappedForGpu = !active_.empty() && active_.front()->gpuMap != nullptr;
    gLastReport.paced = paced_;
    gLastReport.model = paced_ ? model_.describe() : "";
  }
  if (paced_ && !active_.empty()) pacerThread_ = std::thread([this] { pacerLoop(); });
  bool cpuRings = false;
  for (Link* l : active_) cpuRings = cpuRings || l->cpuRings;
  if (cpuRings) doorbellThread_ = std::thread([this] { doorbellLoop(); });
  bool gpuPosts = false;
  for (Link* l : active_) gpuPosts = gpuPosts || (gpuQueues_ && l->gpuPosts);
  if (gpuPosts) snoopThread_ = std::thread([this] { snoopLoop(); });
  RIDGE_INFO("gdr: rank %d: %zu peers, mode %s (%s), %lld staging slots of %u bytes, %lld landing slots",
             rank_, p.peers.size(), modeName(mode), p.modeWhy.c_str(), static_cast<long long>(p.slots),
             p.capacity, static_cast<long long>(p.landingSlots));
  if (mode == Mode::Write)
    RIDGE_INFO("gdr: rank %d: staging tier %s: %s", rank_, p.tierName.c_str(), p.tierWhy.c_str());
  if (mode == Mode::Read) RIDGE_INFO("gdr: rank %d: read slots in %s", rank_, p.readSlots.c_str());
  if (mode == Mode::Write && !active_.empty()) {
    const Link* l = active_.front();
    const device::DeviceRuntime* rt = device::activeRuntime();
    RIDGE_INFO("gdr: rank %d: device buffers: %s", rank_,
               !deviceProducerUsable(l)          ? "the copy path (no device-side producer offered)"
               : rt && rt->runsDeviceFunctions() ? "device-side producer on the emulated device's threads"
                                                 : "device-side post by the GPU kernel (gdrPostKernel)");
  }
  if (paced_) {
    const ModeTiming& t = model_.timing[static_cast<int>(mode)];
    RIDGE_INFO("gdr: rank %d: paced by the PCIe model (modeled: %.2f us latency, %.1f GB/s): %s", rank_,
               t.latencyNs / 1000, t.bandwidthGBs, model_.describe().c_str());
  }
}

Status GdrTransport::connect(const TransportSetup& setup) {
  SetupPlan p;
  RIDGE_TRY(plan(setup, &p));
  // (In every build: the emulated runtime standing for a GPU runs functions that have a twin.)
  device::DeviceRuntime::registerKernelTwin(&GdrTransport::runDevicePost,
                                            &GdrTransport::launchDevicePostOnGpu);
  RIDGE_TRY(openNic(p));
  gpuQueues_ = wakingNic_ && gpuProducerPlanned(p.mode);
  consultLadder(&p);
  std::vector<Endpoint> mine(setup.nranks);
  for (int peer : p.peers) RIDGE_TRY(setUpLink(peer, &p, &mine[peer]));
  RIDGE_TRY(connectLinks(setup, p, mine));
  goLive(p);
  return Status::ok();
}

// The pairs the net transport would take, when RIDGE_GDR_MODE is on (the net transport then
// steps aside: transports/net/net_transport.h).
bool gdrCanConnect(const TransportSetup& setup, int a, int b) {
  return gdrModeOn() && netPairReachable(setup, a, b);
}

Status gdrCreate(const TransportSetup& setup, std::unique_ptr<Transport>* out) {
  auto t = std::make_unique<GdrTransport>();
  RIDGE_TRY(t->connect(setup));
  *out = std::move(t);
  return Status::ok();
}

}  // namespace

Counters processCounters() {
  std::lock_guard<std::mutex> g(gCountersMutex);
  Counters sum = gRetiredCounters;
  for (const Counters* c : gLiveCounters) addCounters(&sum, *c);
  return sum;
}

std::string countersToString(const Counters& c) {
  return format(
      "slotsWritten=%llu creditsConsumed=%llu creditsReturned=%llu creditStalls=%llu remoteStalls=%llu "
      "doorbells=%llu stagedLost=%llu slotsLanded=%llu creditWrites=%llu completionErrors=%llu "
      "remoteReads=%llu devicePosts=%llu",
      (unsigned long long)c.slotsWritten, (unsigned long long)c.creditsConsumed,
      (unsigned long long)c.creditsReturned, (unsigned long long)c.creditStalls,
      (unsigned long long)c.remoteStalls, (unsigned long long)c.doorbells, (unsigned long long)c.stagedLost,
      (unsigned long long)c.slotsLanded, (unsigned long long)c.creditWrites,
      (unsigned long long)c.completionErrors, (unsigned long long)c.remoteReads,
      (unsigned long long)c.devicePosts);
}

void withholdCreditsForTesting(bool withhold) {
  gWithholdCreditsForTesting.store(withhold);
}

uint64_t cpuDoorbellsRung() {
  return gCpuDoorbells.load();
}

SetupReport lastSetupReport() {
  std::lock_guard<std::mutex> g(gCountersMutex);
  return gLastReport;
}

extern const TransportTable kGdrTransportTable = {sizeof(TransportTable), kTransportTableVersion, "gdr",
                                                  gdrCanConnect, gdrCreate};

}  // namespace ridge::gdr
