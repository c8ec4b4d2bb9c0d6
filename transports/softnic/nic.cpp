// The NIC's life cycle (staging, listening socket, engine thread), its mailbox of control
// commands, and the engine-side bookkeeping of QPs that the mailbox runs.
#include "transports/softnic/nic.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>

#include <algorithm>

#include "bootstrap/bootstrap.h"
#include "bootstrap/socket.h"
#include "core/log.h"
#include "transports/softnic/queues.h"

namespace ridge {
namespace softnic {

using namespace verbs;

namespace {
std::atomic<uint32_t> gNicSerial{0};
}  // namespace

// First QP number of a NIC: distinct across the NICs of a run (as on hardware, where each
// NIC numbers its own QPs, they would collide between processes and the lines of a shared
// RIDGE_SOFTNIC_TRACE file could not be told apart); 4096 QPs per NIC, 24-bit numbers.
uint32_t qpnBase() {
  static std::atomic<uint32_t> nics{0};
  const uint32_t h = static_cast<uint32_t>(getpid()) * 2654435761u ^ nics.fetch_add(1) * 0x9e3779b9u;
  return (((h >> 8) & 0xfffu) << 12) | 1u;
}

Nic::Nic(const Options& o) : opt_(o), regions_(kMaxRegions) {}

Status Nic::start() {
  if (opt_.stagingBytes < 4096) opt_.stagingBytes = 4096;
  chunkBytes_ = std::min(opt_.mtu, opt_.stagingBytes / 4);
  chunkBytes_ = std::max<size_t>(chunkBytes_ & ~size_t(63), 64);
  opt_.mtu = chunkBytes_;
  size_t nchunks = opt_.stagingBytes / chunkBytes_;
  void* p = mmap(nullptr, opt_.stagingBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return systemError("softnic: mmap of the staging memory");
  staging_ = static_cast<char*>(p);
  chunkIsDm_.assign(nchunks, 0);
  for (size_t i = nchunks; i-- > 0;) freeChunks_.push_back(static_cast<int32_t>(i));
  scratch_.resize(chunkBytes_);
  const uint32_t serial = gNicSerial.fetch_add(1);
  rng_ = (opt_.faults.seed * 0x9E3779B97F4A7C15ull) ^ (uint64_t(serial + 1) << 32) ^ uint64_t(getpid());
  if (rng_ == 0) rng_ = 1;
  probeWord_ = randomNonce();

  SocketAddress addr;
  std::string ifName;
  RIDGE_TRY(selectInterface(preferredFamily(), &addr, &ifName));
  Socket listener;
  SocketAddress bound;
  RIDGE_TRY(listenOn(addr, &listener, &bound));
  endpoint_ = bound.toString();
  listenFd_ = listener.release();
  eventFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epollFd_ = epoll_create1(EPOLL_CLOEXEC);
  if (eventFd_ < 0 || epollFd_ < 0) return systemError("softnic: eventfd/epoll_create1");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;
  ev.data.fd = listenFd_;
  ev.data.u64 = 1;
  epoll_ctl(epollFd_, EPOLL_CTL_ADD, listenFd_, &ev);
  ev.data.u64 = 2;
  epoll_ctl(epollFd_, EPOLL_CTL_ADD, eventFd_, &ev);

  attr_.name = format("softnic%u", serial);
  attr_.provider = "softnic";
  attr_.maxMrBytes = 1ull << 40;
  attr_.maxQpWr = 1u << 15;
  attr_.maxCqe = 1u << 20;
  attr_.maxDeviceMemoryBytes = opt_.stagingBytes / 2;
  attr_.portCount = 1;
  attr_.portActive = true;
  attr_.mtuBytes = static_cast<uint32_t>(chunkBytes_);
  {
    std::lock_guard<std::mutex> g(gRegistryMutex);
    gLiveNics.push_back(this);
  }
  thread_ = std::thread([this] { run(); });
  RIDGE_INFO("softnic: %s listening on %s (%s), staging %zu bytes in %zu chunks of %zu, faults %s",
             attr_.name.c_str(), endpoint_.c_str(), ifName.c_str(), opt_.stagingBytes, nchunks, chunkBytes_,
             opt_.faults.any() ? "on" : "off");
  return Status::ok();
}

Nic::~Nic() {
  if (thread_.joinable()) {
    stop_.store(true);
    uint64_t one = 1;
    ssize_t w = ::write(eventFd_, &one, sizeof one);
    (void)w;
    thread_.join();
  }
  for (Conn* c : conns_) {
    if (c->fd >= 0) ::close(c->fd);
    delete c;
  }
  if (listenFd_ >= 0) ::close(listenFd_);
  if (eventFd_ >= 0) ::close(eventFd_);
  if (epollFd_ >= 0) ::close(epollFd_);
  if (staging_) munmap(staging_, opt_.stagingBytes);
  std::lock_guard<std::mutex> g(gRegistryMutex);
  gLiveNics.erase(std::remove(gLiveNics.begin(), gLiveNics.end(), this), gLiveNics.end());
  addCounters(&gRetiredCounters, ctr_.snapshot());
}

void Nic::runOnEngine(const std::function<void()>& fn) {
  if (std::this_thread::get_id() == thread_.get_id()) {
    fn();
    return;
  }
  std::unique_lock<std::mutex> lk(mailboxMutex_);
  mailbox_.push_back(fn);
  const uint64_t ticket = ++mailboxPosted_;
  mailboxPending_.store(1, std::memory_order_release);
  uint64_t one = 1;
  ssize_t w = ::write(eventFd_, &one, sizeof one);
  (void)w;
  mailboxDone_.wait(lk, [&] { return mailboxServed_ >= ticket; });
}

void Nic::engineRemoveQp(SoftQp* qp) {
  engineResetQp(qp);
  qps_.erase(std::remove(qps_.begin(), qps_.end(), qp), qps_.end());
}

void Nic::engineResetQp(SoftQp* qp) {
  if (qp->out_) closeConn(qp->out_, nullptr);
  if (qp->in_) closeConn(qp->in_, nullptr);
  for (uint32_t i = qp->inflightHead_; i != qp->inflightTail_; ++i)
    freeChunk(qp->inflight_[i & (qp->inflight_.size() - 1)].chunk);
  qp->inflightHead_ = qp->inflightTail_ = 0;
  qp->haveCur_ = false;
  qp->curOffset_ = 0;
  qp->sqCi_ = 0;
  qp->rqCi_ = 0;
  qp->nextSeq_ = qp->ackedUpTo_ = qp->expectedSeq_ = 0;
  qp->heldCount_ = 0;
  qp->ackPending_ = false;
  qp->nakSentFor_ = UINT32_MAX;
  qp->lastNakSeq_ = UINT32_MAX;
  qp->retries_ = 0;
  qp->errorStatus_ = kCqeOk;
  qp->errorReported_ = false;
  qp->readPending_ = false;
  qp->heldResponses_.clear();
  qp->lastPage_ = 0;
  qp->lastDbrTraced_ = 0;
  storeRelease(&qp->sqRetired_, 0u);
  storeRelease(&qp->rqConsumed_, 0u);
}

void Nic::engineAttachOut(SoftQp* qp, int fd, bool cma, pid_t peerPid) {
  if (qp->out_) closeConn(qp->out_, nullptr);
  Conn* c = new Conn;
  c->fd = fd;
  c->outbound = true;
  c->cma = cma;
  c->peerPid = peerPid;
  c->qp = qp;
  c->in.resize(64 * sizeof(FrameHeader));
  conns_.push_back(c);
  qp->out_ = c;
  qp->nextSeq_ = qp->ackedUpTo_ = 0;
  qp->lastProgressNs_ = nowNs();
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.ptr = c;
  epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd, &ev);
}

}  // namespace softnic
}  // namespace ridge
