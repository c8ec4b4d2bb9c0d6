// The software NIC: verbs objects over shared rings, and the engine thread that executes
// them. See softnic.h for the model and docs/transports.md for the wire format.
//
// Queues. Every queue is in the mlx5 wire format (kernels/gdr/mlx5_wire.h): the send queue a
// ring of 64-byte WQE blocks, the receive queue a ring of data segments, the doorbell record
// big-endian 16-bit producer indices, the doorbell a UAR word (or a BlueFlame register), the
// CQs 64-byte CQEs with owner bits. The engine parses and writes exactly the bytes a ConnectX
// NIC would; postSend/postRecv/poll encode and decode them (as libmlx5 does). What the engine
// keeps beside (its consumer indices) no producer sees: credits come back as CQEs.
//
// Threads. The user threads own the producer sides (WQE rings, receive ring, doorbell
// record and UAR) and the consumer side of CQs; the engine thread owns everything else
// (connections, packets, staging chunks, CQ producer indices). They meet only in those
// rings and in a mailbox of control commands (QP attach/reset/destroy, device memory)
// that the engine runs between iterations: the data path takes no lock.
//
// Sleeping. The engine sleeps in epoll_wait on its sockets and an eventfd. A CPU producer
// that rings a doorbell writes the eventfd only when the engine announced it may sleep
// (one load otherwise), and a producer that cannot make system calls (a GPU, next issue)
// is noticed at the latest when the engine's idle timeout expires.
#include "transports/softnic/softnic.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/socket.h"
#include "core/log.h"
#include "core/settings.h"
#include "kernels/gdr/mlx5_wire.h"

namespace ridge {
namespace softnic {

using namespace verbs;

namespace {

int64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Sequence numbers wrap at 2^32: a is before b when the signed distance is negative.
inline bool seqBefore(uint32_t a, uint32_t b) {
  return static_cast<int32_t>(a - b) < 0;
}

long futexCall(std::atomic<uint32_t>* word, int op, uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, ts, nullptr, 0);
}

template <typename T>
T loadAcquire(const T* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
template <typename T>
void storeRelease(T* p, T v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

// ---- Wire format -----------------------------------------------------------------------

constexpr uint32_t kFrameMagic = 0x4e534452u;  // "RDSN"
constexpr uint32_t kHelloMagic = 0x4f4c4548u;  // "HELO"
constexpr uint32_t kWireVersion = 2;           // 2: RDMA READ (request and response frames)

// kFrameReadResp: target -> requester on the inbound connection, always with inline payload;
// `seq` names the read request it answers, `msgOffset` the piece.
enum FrameType : uint8_t { kFrameData = 1, kFrameAck = 2, kFrameReadResp = 3 };
enum FrameFlags : uint8_t { kFrameFirst = 1, kFrameLast = 2, kFrameCmaPayload = 4 };
enum AckKind : uint8_t {
  kAckOk = 0,     // everything before `seq` arrived
  kAckNak = 1,    // same, and a later packet arrived out of order: resend from `seq` now
  kAckRnr = 2,    // same, but `seq` found no posted receive (or a full CQ): resend later
  kAckError = 3,  // `seq` was refused for good; `status` says why
};

// One packet header. Data frames are followed by `length` payload bytes unless
// kFrameCmaPayload says the target reads them from `stagingAddr` in the sender process.
struct FrameHeader {
  uint32_t magic;
  uint8_t type;
  uint8_t flags;
  uint8_t opcode;  // WqeOpcode (data) or AckKind (ack)
  uint8_t status;  // CqeStatus of a kAckError
  uint32_t seq;    // data: this packet; ack: the next sequence number expected
  uint32_t length;
  uint32_t immData;
  uint32_t msgLength;   // bytes of the whole message
  uint64_t remoteAddr;  // WRITE: where this packet lands
  uint32_t rkey;
  uint32_t msgOffset;  // offset of this packet in its message
  uint64_t stagingAddr;
};
static_assert(sizeof(FrameHeader) == 48, "frame header is 48 bytes");

// First bytes on a new connection (sender -> target), and the answer.
struct Hello {
  uint32_t magic;
  uint32_t version;
  uint32_t srcQpn;
  uint32_t dstQpn;
  int32_t pid;
  uint32_t wantCma;
  uint64_t hostHash;
  uint64_t probeAddr;  // a word in the sender process the target tries to read
  uint64_t probeValue;
};
struct HelloReply {
  uint32_t magic;
  uint32_t status;  // 0 accepted, 1 no such QP
  uint32_t cma;     // 1: the target will read payloads out of our staging memory
  uint32_t pad;
};

// The bytes of QpAddress for softnic.
struct SoftQpAddress {
  uint32_t magic;
  uint32_t qpn;
  char endpoint[80];  // "host:port" of the NIC's engine
};
static_assert(sizeof(SoftQpAddress) <= sizeof(QpAddress), "softnic address fits QpAddress");

std::atomic<uint32_t> gNicSerial{0};

// ---- Process-wide counter registry ------------------------------------------------------

// Every field of Counters, for the declarations, copies and sums below.
// clang-format off
#define RIDGE_SOFTNIC_COUNTERS(X) \
  X(packetsSent) \
  X(packetsReceived) \
  X(payloadBytesLanded) \
  X(acksSent) \
  X(injectedDrops) \
  X(injectedDups) \
  X(injectedReorders) \
  X(injectedDelays) \
  X(injectedStagingExhaust) \
  X(retransmittedPackets) \
  X(retransmitTimeouts) \
  X(naksSent) \
  X(duplicatesDiscarded) \
  X(outOfOrderDiscarded) \
  X(rnrDiscards) \
  X(stagingStalls) \
  X(cqFullStalls) \
  X(cmaPayloadReads) \
  X(inlinePayloads) \
  X(zeroCopyPackets) \
  X(remoteAccessErrors) \
  X(readsExecuted) \
  X(readsReexecuted) \
  X(readResponseDiscards) \
  X(injectedResponseDrops) \
  X(injectedResponseDups) \
  X(injectedResponseReorders)
// clang-format on
struct AtomicCounters {
#define RIDGE_DECLARE(name) std::atomic<uint64_t> name{0};
  RIDGE_SOFTNIC_COUNTERS(RIDGE_DECLARE)
#undef RIDGE_DECLARE
  Counters snapshot() const {
    Counters c;
#define RIDGE_COPY(name) c.name = name.load(std::memory_order_relaxed);
    RIDGE_SOFTNIC_COUNTERS(RIDGE_COPY)
#undef RIDGE_COPY
    return c;
  }
};

void addCounters(Counters* sum, const Counters& c) {
#define RIDGE_ADD(name) sum->name += c.name;
  RIDGE_SOFTNIC_COUNTERS(RIDGE_ADD)
#undef RIDGE_ADD
}

// ---- mlx5 <-> verbs-subset translations and the trace ----------------------------------------

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

// RIDGE_SOFTNIC_TRACE: one line per consumed WQE and per new doorbell-record value, each
// written with one write() to an O_APPEND file, so the lines of several NICs and processes
// never interleave mid-line. Off (one branch) unless the setting names a file.
class Trace {
 public:
  static Trace& get() {
    static Trace t;
    return t;
  }
  bool on() const { return fd_ >= 0; }
  void wqe(uint32_t qpn, uint32_t pi, const uint8_t* bytes, uint32_t n) {
    char line[64 + 2 * mlx5::kMaxWqeBbs * mlx5::kWqeBbBytes];
    int at = std::snprintf(line, 64, "wqe %u %u ", qpn, pi);
    static const char kHex[] = "0123456789abcdef";
    for (uint32_t i = 0; i < n; ++i) {
      line[at++] = kHex[bytes[i] >> 4];
      line[at++] = kHex[bytes[i] & 15];
    }
    line[at++] = '\n';
    emit(line, at);
  }
  void dbr(uint32_t qpn, uint32_t beWord) {
    char line[64];
    // The word as it sits in memory, read as a big-endian number.
    const int at = std::snprintf(line, sizeof line, "dbr %u %08x\n", qpn, mlx5::be32(beWord));
    emit(line, at);
  }

 private:
  Trace() {
    const std::string path = settingString(Setting::SOFTNIC_TRACE);
    if (path.empty()) return;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0)
      RIDGE_WARN("softnic: RIDGE_SOFTNIC_TRACE=%s: %s (no trace)", path.c_str(), std::strerror(errno));
  }
  void emit(const char* line, int n) {
    if (::write(fd_, line, static_cast<size_t>(n)) != n) {
    }
  }
  int fd_ = -1;
};

// First QP number of a NIC: distinct across the NICs of a run (as on hardware, where each
// NIC numbers its own QPs, they would collide between processes and the lines of a shared
// RIDGE_SOFTNIC_TRACE file could not be told apart); 4096 QPs per NIC, 24-bit numbers.
uint32_t qpnBase() {
  static std::atomic<uint32_t> nics{0};
  const uint32_t h = static_cast<uint32_t>(getpid()) * 2654435761u ^ nics.fetch_add(1) * 0x9e3779b9u;
  return (((h >> 8) & 0xfffu) << 12) | 1u;
}

class Nic;
std::mutex gRegistryMutex;
std::vector<Nic*> gLiveNics;
Counters gRetiredCounters;

// ---- Objects ----------------------------------------------------------------------------

constexpr uint32_t kMaxRegions = 4096;
constexpr uint32_t kHeldMax = 32;
constexpr int64_t kIdleSleepMs = 20;
constexpr int64_t kGiveUpNs = 15ll * 1000000000;  // no ack progress for this long: QP error

struct RegionEntry {
  std::atomic<uint32_t> key{0};  // 0: free; published last
  char* base = nullptr;          // where addr `start` lives in this process
  uint64_t start = 0;            // the address WQEs use (0 for zero-based device memory)
  uint64_t length = 0;
  uint32_t access = 0;
};

class SoftCq;
struct SoftQp;

// One TCP connection of a QP: outbound (we send data, receive acks) or inbound.
struct Conn {
  int fd = -1;
  bool outbound = false;
  bool cma = false;  // outbound: the target reads our staging; inbound: we read the sender's
  pid_t peerPid = 0;
  SoftQp* qp = nullptr;
  std::vector<char> out;  // bytes queued for the socket
  size_t outDone = 0;     // of `out`, already written
  bool pollingOut = false;
  std::vector<char> in;
  size_t inLen = 0;
  bool closed = false;
};

struct Packet {
  FrameHeader hdr;
  char* payload;      // in staging; nullptr for 0 bytes
  int32_t chunk;      // staging chunk, -1 for none
  uint32_t wqeIndex;  // first block of the WQE in the send queue
  bool lastOfWqe;
  uint8_t wqeBbs;
  uint8_t mlx5Opcode;  // the WQE's, for its CQE
  uint8_t wqeFlags;
  uint64_t wrId;  // the provider's, handed to its poll beside the CQE
  int64_t sentNs;
  // RDMA READ request: where the response lands, and how much of it has (pieces are taken
  // only in order, so a duplicate or late one never lands twice or after completion).
  uint64_t readLocal;
  uint32_t readLkey;
  uint32_t readDone;
  bool readComplete;
};

struct HeldPacket {
  FrameHeader hdr;
  const char* payload;
  int64_t releaseNs;  // 0: after the next packet
};

class Nic {
 public:
  explicit Nic(const Options& o);
  ~Nic();
  Status start();

  // Control path ----------------------------------------------------------------------
  // Runs `fn` on the engine thread between iterations and waits for it.
  void runOnEngine(const std::function<void()>& fn);
  void kick() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_relaxed)) {
      uint64_t one = 1;
      ssize_t w = ::write(eventFd_, &one, sizeof one);
      (void)w;
    }
  }
  // Sleeps until the engine next does something (lands, retires, acknowledges) or maxWaitNs
  // pass, unless stillIdle says there is work already.
  void waitActivity(int64_t maxWaitNs, bool (*stillIdle)(void*), void* arg) {
    activityWaiters_.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t word = activityWord_.load(std::memory_order_acquire);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (stillIdle == nullptr || stillIdle(arg)) {
      timespec ts{static_cast<time_t>(maxWaitNs / 1000000000), static_cast<long>(maxWaitNs % 1000000000)};
      futexCall(&activityWord_, FUTEX_WAIT_PRIVATE, word, &ts);
    }
    activityWaiters_.fetch_sub(1, std::memory_order_relaxed);
  }
  Status registerRegion(char* base, uint64_t start, uint64_t length, uint32_t access, uint32_t* key);
  void deregisterRegion(uint32_t key);
  const std::string& endpoint() const { return endpoint_; }
  uint32_t newQpn() { return nextQpn_.fetch_add(1); }
  const Options& options() const { return opt_; }
  const DeviceAttributes& attributes() const { return attr_; }
  Counters counters() const { return ctr_.snapshot(); }
  uint64_t probeWordAddr() const { return reinterpret_cast<uint64_t>(&probeWord_); }
  uint64_t probeWord() const { return probeWord_; }
  Status reserveStaging(size_t bytes, char** out, std::vector<int32_t>* chunks);
  void releaseStaging(const std::vector<int32_t>& chunks);

  // Engine-side bookkeeping reached from the QP object through runOnEngine.
  void engineAddQp(SoftQp* qp) { qps_.push_back(qp); }
  void engineRemoveQp(SoftQp* qp);
  void engineResetQp(SoftQp* qp);
  void engineAttachOut(SoftQp* qp, int fd, bool cma, pid_t peerPid);

  AtomicCounters ctr_;

 private:
  void run();
  bool serviceQp(SoftQp* qp, int64_t now);
  bool pumpSend(SoftQp* qp, int64_t now);
  bool takeWqe(SoftQp* qp);
  bool retireAcked(SoftQp* qp);
  bool flushQp(SoftQp* qp);
  void goBackN(SoftQp* qp, int64_t now);
  void transmit(SoftQp* qp, const FrameHeader& hdr, const char* payload, int64_t now, bool fromHeld = false);
  void emitData(Conn* c, const FrameHeader& hdr, const char* payload);
  void sendAck(SoftQp* qp, uint8_t kind, uint8_t status);
  bool releaseHeld(SoftQp* qp, int64_t now, bool afterNext);
  void acceptAll();
  void handleAccepted(int fd);
  void readConn(Conn* c);
  void handleData(Conn* c, const FrameHeader& h, const char* inlinePayload);
  void handleAck(Conn* c, const FrameHeader& h);
  bool executeRead(SoftQp* qp, const FrameHeader& request);
  void emitResponse(SoftQp* qp, const FrameHeader& hdr, const char* payload);
  void handleReadResponse(Conn* c, const FrameHeader& h, const char* payload);
  void flushConn(Conn* c);
  void closeConn(Conn* c, const char* why);
  void detachConn(Conn* c);
  char* translate(uint32_t key, uint64_t addr, uint64_t len, uint32_t needAccess);
  int32_t allocChunk();
  bool inStaging(const char* p, size_t len) const {
    return p >= staging_ && len <= opt_.stagingBytes &&
           static_cast<size_t>(p - staging_) <= opt_.stagingBytes - len;
  }
  void freeChunk(int32_t chunk) {
    if (chunk >= 0) freeChunks_.push_back(chunk);
  }
  double random01() {
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 7;
    rng_ ^= rng_ << 17;
    return static_cast<double>(rng_ >> 11) * (1.0 / 9007199254740992.0);
  }
  void setError(SoftQp* qp, uint8_t status, const char* why);
  bool anyDoorbellPending();

  Options opt_;
  DeviceAttributes attr_;
  std::string endpoint_;
  int listenFd_ = -1;
  int eventFd_ = -1;
  int epollFd_ = -1;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint32_t> sleeping_{0};
  // waitActivity: a futex word the engine bumps after an iteration that did something, only
  // while someone waits (one fence and one load per iteration otherwise).
  std::atomic<uint32_t> activityWord_{0};
  std::atomic<uint32_t> activityWaiters_{0};
  std::atomic<uint32_t> nextQpn_{qpnBase()};
  uint64_t probeWord_ = 0;
  uint64_t rng_ = 1;

  std::mutex mailboxMutex_;
  std::condition_variable mailboxDone_;
  std::vector<std::function<void()>> mailbox_;
  std::atomic<uint32_t> mailboxPending_{0};
  uint64_t mailboxServed_ = 0;
  uint64_t mailboxPosted_ = 0;

  std::mutex regionMutex_;
  std::vector<RegionEntry> regions_;
  uint32_t keyGeneration_ = 1;

  // Engine-only state.
  char* staging_ = nullptr;
  size_t chunkBytes_ = 0;
  std::vector<int32_t> freeChunks_;
  std::vector<uint8_t> chunkIsDm_;
  std::vector<SoftQp*> qps_;
  std::vector<Conn*> conns_;
  std::vector<Conn*> pendingOut_;
  std::vector<char> scratch_;  // payload of discarded inline packets is read into it
};

class SoftCq final : public CompletionQueue {
 public:
  SoftCq(std::shared_ptr<Nic> nic, uint32_t entries) : nic_(std::move(nic)) {
    size_ = roundUpPow2(std::max<uint32_t>(entries, 2), &log2_);
    cqes_ = static_cast<mlx5::Cqe64*>(std::aligned_alloc(64, sizeof(mlx5::Cqe64) * size_));
    wrIds_.assign(size_, 0);
    std::memset(cqes_, 0, sizeof(mlx5::Cqe64) * size_);
    // Opcode INVALID: nothing is a completion until the NIC writes it.
    for (uint32_t i = 0; i < size_; ++i) cqes_[i].opOwn = mlx5::kCqeInitOpOwn;
    view_ = mlx5::CqView{cqes_, &dbrec_[0], log2_, 0};
  }
  ~SoftCq() override { std::free(cqes_); }
  int poll(Cqe* out, int max) override;
  void wait(int64_t maxWaitNs, bool (*stillIdle)(void*), void* arg) override {
    uint32_t word = wakeWord_.load(std::memory_order_acquire);
    sleeping_.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const uint8_t opOwn = __atomic_load_n(&cqes_[ci_ & (size_ - 1)].opOwn, __ATOMIC_ACQUIRE);
    if (!mlx5::cqeIsNew(opOwn, ci_, log2_) && (stillIdle == nullptr || stillIdle(arg))) {
      timespec ts{static_cast<time_t>(maxWaitNs / 1000000000), static_cast<long>(maxWaitNs % 1000000000)};
      futexCall(&wakeWord_, FUTEX_WAIT_PRIVATE, word, &ts);
    }
    sleeping_.store(0, std::memory_order_relaxed);
  }
  const mlx5::CqView* mlx5Cq() const override { return &view_; }

  // Engine side: room while the consumer index published in the record is less than a pass
  // behind (24 bits of it, as the hardware reads it).
  bool hasRoom() const {
    const uint32_t ci = mlx5::be32(loadAcquire(&dbrec_[0])) & 0xffffffu;
    return ((pi_ - ci) & 0xffffffu) < size_;
  }
  // `wrId` goes into the provider's side array, not the CQE (which has no room for it): libmlx5
  // keeps wrIds beside its queues too. Written before op_own, so poll() finds it with the CQE.
  void push(uint8_t opcode, uint8_t wqeOpcode, uint32_t wqeCounter, uint32_t qpn, uint32_t byteCnt,
            uint32_t imm, uint8_t syndrome, uint64_t wrId) {
    mlx5::Cqe64* slot = &cqes_[pi_ & (size_ - 1)];
    wrIds_[pi_ & (size_ - 1)] = wrId;
    mlx5::encodeCqe(slot, opcode, wqeOpcode, static_cast<uint16_t>(wqeCounter), qpn, byteCnt, imm, syndrome);
    mlx5::releaseFence();  // every field before op_own
    __atomic_store_n(&slot->opOwn, mlx5::makeOpOwn(opcode, pi_, log2_), __ATOMIC_RELEASE);
    ++pi_;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_relaxed)) {
      wakeWord_.fetch_add(1, std::memory_order_release);
      futexCall(&wakeWord_, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr);
    }
  }

 private:
  std::shared_ptr<Nic> nic_;
  mlx5::Cqe64* cqes_ = nullptr;
  uint32_t size_ = 0;
  uint32_t log2_ = 0;
  alignas(64) uint32_t dbrec_[2] = {0, 0};
  mlx5::CqView view_{};
  uint32_t ci_ = 0;              // poller
  uint32_t pi_ = 0;              // engine
  std::vector<uint64_t> wrIds_;  // by CQ index, engine-written
  alignas(64) std::atomic<uint32_t> wakeWord_{0};
  std::atomic<uint32_t> sleeping_{0};
};

struct SoftQp final : public QueuePair {
  SoftQp(std::shared_ptr<Nic> nic, SoftCq* scq, SoftCq* rcq, const QpCaps& caps);
  ~SoftQp() override;
  uint32_t qpn() const override { return qpn_; }
  QpState state() const override { return state_.load(std::memory_order_acquire); }
  Status localAddress(QpAddress* out) const override;
  Status modify(QpState to, const QpAddress* remote) override;
  Status postSend(const Wqe& wqe) override;
  Status postRecv(const RecvWqe& wqe) override;
  uint32_t sendSlotsFree() const override { return sqSize_ - (sqPi_ - loadAcquire(&sqRetired_)); }
  const mlx5::SqView* mlx5Sq() const override { return &view_; }
  // Engine: new send/receive blocks the doorbell record announces (16-bit indices, as mlx5).
  uint32_t sqPosted(bool trace) {
    const uint32_t raw = loadAcquire(&dbrec_[mlx5::kSendDbrWord]);
    if (trace && raw != lastDbrTraced_ && Trace::get().on()) {
      lastDbrTraced_ = raw;
      Trace::get().dbr(qpn_, raw);
    }
    return static_cast<uint16_t>((mlx5::be32(raw) & 0xffffu) - sqCi_);
  }
  uint32_t rqPosted() const {
    return static_cast<uint16_t>((mlx5::be32(loadAcquire(&dbrec_[mlx5::kRecvDbrWord])) & 0xffffu) - rqCi_);
  }
  // The doorbell words a producer writes (UAR, either BlueFlame half): any change = "look now".
  uint64_t doorbellWords() const {
    return __atomic_load_n(&uar_.doorbell, __ATOMIC_ACQUIRE) ^
           __atomic_load_n(reinterpret_cast<const uint64_t*>(uar_.blueFlame), __ATOMIC_ACQUIRE) ^
           __atomic_load_n(reinterpret_cast<const uint64_t*>(uar_.blueFlame + kBlueFlameBytes),
                           __ATOMIC_ACQUIRE);
  }

  std::shared_ptr<Nic> nic_;
  uint32_t qpn_ = 0;
  std::atomic<QpState> state_{QpState::Reset};
  SoftCq* scq_;
  SoftCq* rcq_;
  uint8_t* sq_ = nullptr;  // mlx5 send queue: sqSize_ blocks of 64 bytes
  uint32_t sqSize_ = 0, sqLog_ = 0;
  mlx5::DataSeg* rq_ = nullptr;  // mlx5 receive queue: one data segment per receive
  uint32_t rqSize_ = 0, rqLog_ = 0;
  alignas(64) uint32_t dbrec_[2] = {0, 0};  // mlx5 doorbell record (BE16 indices in BE32 words)
  static constexpr uint32_t kBlueFlameBytes = 256;
  struct alignas(64) Uar {
    uint64_t doorbell;
    uint64_t reserved[7];
    alignas(64) uint8_t blueFlame[2 * kBlueFlameBytes];
  } uar_{};
  // The engine's consumer indices, for postSend/postRecv's "queue full" (the provider's own
  // bookkeeping, as libmlx5's; producers that bypass the provider see CQEs only).
  alignas(64) uint32_t sqRetired_ = 0;  // engine-written
  uint32_t rqConsumed_ = 0;             // engine-written
  mlx5::SqView view_{};
  std::vector<uint64_t> sqWrId_;  // by send-queue block index (provider side)
  std::vector<uint64_t> rqWrId_;
  // Poster side.
  alignas(64) uint32_t sqPi_ = 0;
  uint32_t rqPi_ = 0;
  std::string remoteEndpoint_;
  uint32_t remoteQpn_ = 0;

  // Engine side.
  Conn* out_ = nullptr;
  Conn* in_ = nullptr;
  uint64_t lastPage_ = 0;
  uint32_t lastDbrTraced_ = 0;
  uint32_t sqCi_ = 0;  // first block of the next WQE to take into staging
  bool haveCur_ = false;
  Wqe cur_{};  // the WQE being cut into packets, decoded
  uint8_t curBbs_ = 1;
  uint8_t curMlx5Opcode_ = 0;
  uint64_t curWrId_ = 0;
  bool curInline_ = false;
  mlx5::WqeBuf curWqe_{};  // its bytes (inline payload is sent from here)
  uint32_t curOffset_ = 0;
  std::vector<Packet> inflight_;  // ring, capacity a power of two
  uint32_t inflightHead_ = 0, inflightTail_ = 0;
  uint32_t nextSeq_ = 0;
  uint32_t ackedUpTo_ = 0;
  int64_t lastProgressNs_ = 0;
  int64_t lastRetxNs_ = 0;
  uint32_t lastNakSeq_ = UINT32_MAX;
  int retries_ = 0;
  bool stalledOnStaging_ = false;
  // An RDMA READ is in flight: later WQEs wait for its response (an implicit fence), so a
  // re-executed read sees the same memory, as far as this QP's own writes go, as the first.
  bool readPending_ = false;
  HeldPacket held_[kHeldMax];
  uint32_t heldCount_ = 0;
  uint8_t errorStatus_ = kCqeOk;  // status for the WQE that failed first
  bool errorReported_ = false;
  // Inbound.
  uint32_t expectedSeq_ = 0;
  bool ackPending_ = false;
  uint32_t nakSentFor_ = UINT32_MAX;
  uint32_t rqCi_ = 0;
  // Read response frames (serialized, payload included) held back by the fault injector
  // until the next response frame goes out.
  std::vector<char> heldResponses_;
};

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

// ---- Nic ---------------------------------------------------------------------------------

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

Status Nic::registerRegion(char* base, uint64_t start, uint64_t length, uint32_t access, uint32_t* key) {
  std::lock_guard<std::mutex> g(regionMutex_);
  for (uint32_t i = 1; i < kMaxRegions; ++i) {
    RegionEntry& e = regions_[i];
    if (e.key.load(std::memory_order_relaxed) != 0) continue;
    e.base = base;
    e.start = start;
    e.length = length;
    e.access = access;
    keyGeneration_ = (keyGeneration_ + 1) & 0xff;
    if (keyGeneration_ == 0) keyGeneration_ = 1;
    *key = (i << 8) | keyGeneration_;
    e.key.store(*key, std::memory_order_release);
    return Status::ok();
  }
  return makeError(ridgeSystemError, "softnic: %u memory regions registered already", kMaxRegions - 1);
}

void Nic::deregisterRegion(uint32_t key) {
  std::lock_guard<std::mutex> g(regionMutex_);
  uint32_t i = key >> 8;
  if (i > 0 && i < kMaxRegions && regions_[i].key.load() == key)
    regions_[i].key.store(0, std::memory_order_release);
}

char* Nic::translate(uint32_t key, uint64_t addr, uint64_t len, uint32_t needAccess) {
  uint32_t i = key >> 8;
  if (i == 0 || i >= kMaxRegions) return nullptr;
  RegionEntry& e = regions_[i];
  if (e.key.load(std::memory_order_acquire) != key) return nullptr;
  if ((e.access & needAccess) != needAccess) return nullptr;
  if (addr < e.start || len > e.length || addr - e.start > e.length - len) return nullptr;
  return e.base + (addr - e.start);
}

Status Nic::reserveStaging(size_t bytes, char** out, std::vector<int32_t>* chunks) {
  bool found = false;
  runOnEngine([&] {
    const size_t n = (bytes + chunkBytes_ - 1) / chunkBytes_;
    const size_t total = chunkIsDm_.size();
    std::vector<uint8_t> isFree(total, 0);
    for (int32_t c : freeChunks_) isFree[c] = 1;
    // From the top down, so device memory and packet staging meet in the middle.
    for (size_t first = total >= n ? total - n + 1 : 0; first-- > 0;) {
      bool ok = true;
      for (size_t k = 0; k < n && ok; ++k) ok = isFree[first + k];
      if (!ok) continue;
      for (size_t k = 0; k < n; ++k) {
        chunkIsDm_[first + k] = 1;
        chunks->push_back(static_cast<int32_t>(first + k));
      }
      freeChunks_.erase(std::remove_if(freeChunks_.begin(), freeChunks_.end(),
                                       [&](int32_t c) { return chunkIsDm_[c] != 0; }),
                        freeChunks_.end());
      *out = staging_ + first * chunkBytes_;
      found = true;
      return;
    }
  });
  if (!found)
    return makeError(ridgeSystemError, "softnic: no %zu contiguous free bytes of staging memory left", bytes);
  return Status::ok();
}

void Nic::releaseStaging(const std::vector<int32_t>& chunks) {
  runOnEngine([&] {
    for (int32_t c : chunks) {
      chunkIsDm_[c] = 0;
      freeChunks_.push_back(c);
    }
  });
}

int32_t Nic::allocChunk() {
  if (freeChunks_.empty()) return -1;
  if (opt_.faults.stagingExhaust > 0 && random01() < opt_.faults.stagingExhaust) {
    ctr_.injectedStagingExhaust.fetch_add(1, std::memory_order_relaxed);
    return -1;
  }
  int32_t c = freeChunks_.back();
  freeChunks_.pop_back();
  return c;
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
  // The WQE being cut into packets and the ones not yet taken.
  while (qp->sqPosted(true) != 0) {
    if (!qp->scq_->hasRoom()) return did;
    mlx5::WqeFields f{};
    mlx5::decodeCtrl(qp->sq_ + static_cast<size_t>(qp->sqCi_ & (qp->sqSize_ - 1)) * mlx5::kWqeBbBytes, &f);
    const uint32_t bbs = std::max<uint32_t>(1, mlx5::wqeBbs(f.ds));
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

// Puts one data packet on the wire, through the fault injector.
void Nic::transmit(SoftQp* qp, const FrameHeader& hdr, const char* payload, int64_t now, bool fromHeld) {
  Conn* c = qp->out_;
  if (!c || c->closed) return;
  const FaultSpec& f = opt_.faults;
  int copies = 1;
  if (f.any() && !fromHeld) {
    if (f.drop > 0 && random01() < f.drop) {
      ctr_.injectedDrops.fetch_add(1, std::memory_order_relaxed);
      return;  // still unacknowledged: a resend repairs it
    }
    const bool delay = f.delay > 0 && random01() < f.delay;
    const bool reorder = !delay && f.reorder > 0 && random01() < f.reorder;
    if ((delay || reorder) && qp->heldCount_ < kHeldMax) {
      (delay ? ctr_.injectedDelays : ctr_.injectedReorders).fetch_add(1, std::memory_order_relaxed);
      qp->held_[qp->heldCount_++] = HeldPacket{hdr, payload, delay ? now + f.delayNs : 0};
      return;
    }
    if (f.dup > 0 && random01() < f.dup) {
      ctr_.injectedDups.fetch_add(1, std::memory_order_relaxed);
      copies = 2;
    }
  }
  for (int i = 0; i < copies; ++i) emitData(c, hdr, payload);
  // A packet held back "until after the next one" goes out now.
  if (!fromHeld && qp->heldCount_) releaseHeld(qp, now, true);
}

bool Nic::releaseHeld(SoftQp* qp, int64_t now, bool afterNext) {
  bool did = false;
  for (uint32_t i = 0; i < qp->heldCount_;) {
    HeldPacket& h = qp->held_[i];
    const bool due = h.releaseNs == 0 ? afterNext : h.releaseNs <= now;
    if (!due) {
      ++i;
      continue;
    }
    // A held packet the target already has is harmless: it is discarded as a duplicate,
    // and its staging bytes are only read when its sequence number is still expected,
    // which means it was not acknowledged and its chunk is still ours.
    HeldPacket copy = h;
    h = qp->held_[--qp->heldCount_];
    transmit(qp, copy.hdr, copy.payload, now, true);
    did = true;
  }
  return did;
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

// Puts one read response frame on the inbound connection, through the fault injector: a
// dropped frame is repaired by the requester asking again, a held one goes out after the
// next response frame (or never, which the requester repairs the same way).
void Nic::emitResponse(SoftQp* qp, const FrameHeader& hdr, const char* payload) {
  Conn* c = qp->in_;
  if (!c || c->closed) return;
  const FaultSpec& f = opt_.faults;
  auto append = [&](std::vector<char>* out) {
    const size_t at = out->size();
    out->resize(at + sizeof hdr + hdr.length);
    std::memcpy(out->data() + at, &hdr, sizeof hdr);
    if (hdr.length) std::memcpy(out->data() + at + sizeof hdr, payload, hdr.length);
  };
  int copies = 1;
  if (f.any()) {
    if (f.drop > 0 && random01() < f.drop) {
      ctr_.injectedResponseDrops.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    if ((f.reorder > 0 && random01() < f.reorder) || (f.delay > 0 && random01() < f.delay)) {
      ctr_.injectedResponseReorders.fetch_add(1, std::memory_order_relaxed);
      append(&qp->heldResponses_);
      return;
    }
    if (f.dup > 0 && random01() < f.dup) {
      ctr_.injectedResponseDups.fetch_add(1, std::memory_order_relaxed);
      copies = 2;
    }
  }
  for (int i = 0; i < copies; ++i) append(&c->out);
  ctr_.packetsSent.fetch_add(static_cast<uint64_t>(copies), std::memory_order_relaxed);
  if (!qp->heldResponses_.empty()) {
    c->out.insert(c->out.end(), qp->heldResponses_.begin(), qp->heldResponses_.end());
    qp->heldResponses_.clear();
  }
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

// ---- Verbs objects -----------------------------------------------------------------------

SoftQp::SoftQp(std::shared_ptr<Nic> nic, SoftCq* scq, SoftCq* rcq, const QpCaps& caps)
    : nic_(std::move(nic)), scq_(scq), rcq_(rcq) {
  qpn_ = nic_->newQpn();
  sqSize_ = roundUpPow2(std::max<uint32_t>(caps.maxSendWr, 1), &sqLog_);
  rqSize_ = roundUpPow2(std::max<uint32_t>(caps.maxRecvWr, 1), &rqLog_);
  sq_ = static_cast<uint8_t*>(std::aligned_alloc(64, size_t{mlx5::kWqeBbBytes} * sqSize_));
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

class SoftMr final : public MemoryRegion {
 public:
  SoftMr(std::shared_ptr<Nic> nic, uint64_t addr, size_t len, uint32_t key) : nic_(std::move(nic)) {
    addr_ = addr;
    length_ = len;
    lkey_ = rkey_ = key;
  }
  ~SoftMr() override {
    nic_->deregisterRegion(lkey_);
    if (mapping_) munmap(mapping_, mappingBytes_);  // after: the NIC no longer translates into it
  }
  // A mapping the region owns (a registered dma-buf), unmapped when the region goes.
  void ownMapping(void* p, size_t bytes) {
    mapping_ = p;
    mappingBytes_ = bytes;
  }

 private:
  std::shared_ptr<Nic> nic_;
  void* mapping_ = nullptr;
  size_t mappingBytes_ = 0;
};

class SoftDm final : public DeviceMemory {
 public:
  SoftDm(std::shared_ptr<Nic> nic, char* base, size_t bytes, std::vector<int32_t> chunks)
      : nic_(std::move(nic)), base_(base), bytes_(bytes), chunks_(std::move(chunks)) {}
  ~SoftDm() override {
    mr_.reset();
    nic_->releaseStaging(chunks_);
  }
  size_t size() const override { return bytes_; }
  Status copyTo(size_t offset, const void* src, size_t bytes) override {
    if (offset > bytes_ || bytes > bytes_ - offset)
      return makeError(ridgeInvalidArgument, "softnic: copy of %zu bytes at %zu outside device memory of %zu",
                       bytes, offset, bytes_);
    std::memcpy(base_ + offset, src, bytes);
    return Status::ok();
  }
  Status copyFrom(void* dst, size_t offset, size_t bytes) override {
    if (offset > bytes_ || bytes > bytes_ - offset)
      return makeError(ridgeInvalidArgument, "softnic: copy of %zu bytes at %zu outside device memory of %zu",
                       bytes, offset, bytes_);
    std::memcpy(dst, base_ + offset, bytes);
    return Status::ok();
  }
  MemoryRegion* region() override { return mr_.get(); }
  void* mapped() override { return base_; }

  std::shared_ptr<Nic> nic_;
  char* base_;
  size_t bytes_;
  std::vector<int32_t> chunks_;
  std::unique_ptr<SoftMr> mr_;
};

class SoftPd final : public ProtectionDomain {
 public:
  explicit SoftPd(std::shared_ptr<Nic> nic) : nic_(std::move(nic)) {}
  Status registerMemory(void* addr, size_t bytes, uint32_t access,
                        std::unique_ptr<MemoryRegion>* out) override {
    if (!addr || bytes == 0)
      return makeError(ridgeInvalidArgument, "softnic: registration of an empty range");
    uint32_t key = 0;
    RIDGE_TRY(nic_->registerRegion(static_cast<char*>(addr), reinterpret_cast<uint64_t>(addr), bytes, access,
                                   &key));
    *out = std::make_unique<SoftMr>(nic_, reinterpret_cast<uint64_t>(addr), bytes, key);
    return Status::ok();
  }
  // A dma-buf is memory this process can reach only through the fd: softnic maps it
  // (mmap) and serves the region from the mapping, with `iova` as the address WQEs use.
  // Buffers that support mmap work (memfd in tests, udmabuf); a GPU driver's dma-buf
  // usually refuses a CPU mapping, and then the registration fails with the mmap error
  // (the caller falls back to peer memory, which softnic cannot reach either: softnic
  // only emulates GPU memory registration, it does not reach GPU memory).
  Status registerDmaBuf(int fd, uint64_t offset, size_t bytes, uint64_t iova, uint32_t access,
                        std::unique_ptr<MemoryRegion>* out) override {
    if (fd < 0 || bytes == 0)
      return makeError(ridgeInvalidArgument, "softnic: dma-buf registration of fd %d, %zu bytes", fd, bytes);
    // Mapping past the end of the buffer would succeed and then fault (SIGBUS) when the
    // NIC touches it: check the size first (dma-buf and memfd fds report it through lseek;
    // the fd's position is put back).
    const off_t was = lseek(fd, 0, SEEK_CUR);
    const off_t size = was < 0 ? -1 : lseek(fd, 0, SEEK_END);
    if (was >= 0) lseek(fd, was, SEEK_SET);
    if (size >= 0 && (offset > static_cast<uint64_t>(size) || bytes > static_cast<uint64_t>(size) - offset))
      return makeError(ridgeInvalidArgument,
                       "softnic: dma-buf fd %d holds %lld bytes; %zu at offset %llu do not fit", fd,
                       static_cast<long long>(size), bytes, static_cast<unsigned long long>(offset));
    static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    const uint64_t mapOffset = offset & ~(page - 1);
    const size_t mapBytes = static_cast<size_t>(offset - mapOffset) + bytes;
    void* map =
        mmap(nullptr, mapBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(mapOffset));
    if (map == MAP_FAILED)
      return makeError(ridgeSystemError, "softnic: cannot map dma-buf fd %d (%zu bytes at offset %llu): %s",
                       fd, bytes, static_cast<unsigned long long>(offset), std::strerror(errno));
    uint32_t key = 0;
    Status st =
        nic_->registerRegion(static_cast<char*>(map) + (offset - mapOffset), iova, bytes, access, &key);
    if (!st.isOk()) {
      munmap(map, mapBytes);
      return st;
    }
    auto mr = std::make_unique<SoftMr>(nic_, iova, bytes, key);
    mr->ownMapping(map, mapBytes);
    *out = std::move(mr);
    return Status::ok();
  }
  Status allocDeviceMemory(size_t bytes, uint32_t access, std::unique_ptr<DeviceMemory>* out) override {
    if (bytes == 0 || bytes > nic_->attributes().maxDeviceMemoryBytes)
      return makeError(ridgeInvalidArgument, "softnic: device memory of %zu bytes (at most %llu)", bytes,
                       static_cast<unsigned long long>(nic_->attributes().maxDeviceMemoryBytes));
    char* base = nullptr;
    std::vector<int32_t> chunks;
    RIDGE_TRY(nic_->reserveStaging(bytes, &base, &chunks));
    auto dm = std::make_unique<SoftDm>(nic_, base, bytes, std::move(chunks));
    uint32_t key = 0;
    // Zero-based, as on hardware: WQEs address device memory by offset.
    RIDGE_TRY(nic_->registerRegion(base, 0, bytes, access, &key));
    dm->mr_ = std::make_unique<SoftMr>(nic_, 0, bytes, key);
    *out = std::move(dm);
    return Status::ok();
  }
  Status createCq(uint32_t entries, std::unique_ptr<CompletionQueue>* out) override {
    *out = std::make_unique<SoftCq>(nic_, entries);
    return Status::ok();
  }
  Status createQp(CompletionQueue* sendCq, CompletionQueue* recvCq, const QpCaps& caps,
                  std::unique_ptr<QueuePair>* out) override {
    auto* s = dynamic_cast<SoftCq*>(sendCq);
    auto* r = dynamic_cast<SoftCq*>(recvCq);
    if (!s || !r) return makeError(ridgeInvalidArgument, "softnic: createQp needs CQs of the same softnic");
    *out = std::make_unique<SoftQp>(nic_, s, r, caps);
    return Status::ok();
  }

 private:
  std::shared_ptr<Nic> nic_;
};

class SoftDevice final : public Device {
 public:
  explicit SoftDevice(std::shared_ptr<Nic> nic) : nic_(std::move(nic)) {}
  const DeviceAttributes& attributes() const override { return nic_->attributes(); }
  Status allocPd(std::unique_ptr<ProtectionDomain>* out) override {
    *out = std::make_unique<SoftPd>(nic_);
    return Status::ok();
  }
  Counters counters() const { return nic_->counters(); }
  void kick() { nic_->kick(); }
  void waitActivity(int64_t maxWaitNs, bool (*stillIdle)(void*), void* arg) {
    nic_->waitActivity(maxWaitNs, stillIdle, arg);
  }

 private:
  std::shared_ptr<Nic> nic_;
};

class SoftProvider final : public Provider {
 public:
  const char* name() const override { return "softnic"; }
  Status listDevices(std::vector<DeviceAttributes>* out) override {
    DeviceAttributes a;
    Options o = Options::fromSettings();
    a.name = "softnic";
    a.provider = "softnic";
    a.maxDeviceMemoryBytes = o.stagingBytes / 2;
    a.portCount = 1;
    a.portActive = true;
    a.mtuBytes = static_cast<uint32_t>(o.mtu);
    out->assign(1, a);
    return Status::ok();
  }
  Status open(int index, std::unique_ptr<Device>* out) override {
    if (index != 0) return makeError(ridgeInvalidArgument, "softnic: no device %d (only 0)", index);
    return openDevice(Options::fromSettings(), out);
  }
};

double parseNumber(const std::string& s, bool* ok) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  *ok = end != s.c_str() && *end == 0 && v >= 0;
  return v;
}

}  // namespace

Status parseFaults(const std::string& text, FaultSpec* out) {
  FaultSpec f;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(pos, comma - pos);
    pos = comma + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      return makeError(ridgeInvalidArgument, "RIDGE_SOFTNIC_FAULTS: '%s' is not name=value", item.c_str());
    const std::string key = item.substr(0, eq);
    std::string value = item.substr(eq + 1);
    bool ok = false;
    if (key == "seed") {
      char* end = nullptr;
      f.seed = std::strtoull(value.c_str(), &end, 0);
      ok = end != value.c_str() && *end == 0;
    } else if (key == "delay") {
      const size_t colon = value.find(':');
      if (colon != std::string::npos) {
        std::string t = value.substr(colon + 1);
        value = value.substr(0, colon);
        int64_t scale = 1000;  // microseconds unless a unit says otherwise
        auto strip = [&](const char* unit, int64_t s) {
          size_t n = std::strlen(unit);
          if (t.size() > n && t.compare(t.size() - n, n, unit) == 0) {
            t.resize(t.size() - n);
            scale = s;
            return true;
          }
          return false;
        };
        strip("ns", 1) || strip("us", 1000) || strip("ms", 1000000) || strip("s", 1000000000);
        bool tok = false;
        double d = parseNumber(t, &tok);
        if (!tok)
          return makeError(ridgeInvalidArgument, "RIDGE_SOFTNIC_FAULTS: bad delay time in '%s'",
                           item.c_str());
        f.delayNs = static_cast<int64_t>(d * static_cast<double>(scale));
      }
      f.delay = parseNumber(value, &ok);
    } else {
      double v = parseNumber(value, &ok);
      if (key == "drop")
        f.drop = v;
      else if (key == "dup")
        f.dup = v;
      else if (key == "reorder")
        f.reorder = v;
      else if (key == "staging_exhaust")
        f.stagingExhaust = v;
      else
        return makeError(
            ridgeInvalidArgument,
            "RIDGE_SOFTNIC_FAULTS: unknown fault '%s' (drop, dup, reorder, delay, staging_exhaust, seed)",
            key.c_str());
    }
    if (!ok) return makeError(ridgeInvalidArgument, "RIDGE_SOFTNIC_FAULTS: bad value in '%s'", item.c_str());
    if (f.drop > 0.5 || f.dup > 1 || f.reorder > 1 || f.delay > 1 || f.stagingExhaust > 0.9)
      return makeError(
          ridgeInvalidArgument,
          "RIDGE_SOFTNIC_FAULTS: '%s' is out of range (drop <= 0.5, staging_exhaust <= 0.9, others <= 1)",
          item.c_str());
  }
  *out = f;
  return Status::ok();
}

Options Options::fromSettings() {
  Options o;
  int64_t staging = settingSize(Setting::SOFTNIC_STAGING_BYTES);
  o.stagingBytes = static_cast<size_t>(std::clamp<int64_t>(staging, 4096, 1ll << 30));
  int64_t mtu = settingSize(Setting::SOFTNIC_MTU);
  o.mtu = static_cast<size_t>(std::clamp<int64_t>(mtu, 256, 1 << 20));
  o.rtoNs = std::max<int64_t>(settingInt(Setting::SOFTNIC_RTO_US), 50) * 1000;
  o.forceTcpPayload = settingString(Setting::SOFTNIC_WIRE) == "tcp";
  FaultSpec f;
  if (parseFaults(settingString(Setting::SOFTNIC_FAULTS), &f).isOk()) o.faults = f;
  return o;
}

Status openDevice(const Options& options, std::unique_ptr<Device>* out) {
  auto nic = std::make_shared<Nic>(options);
  RIDGE_TRY(nic->start());
  *out = std::make_unique<SoftDevice>(std::move(nic));
  return Status::ok();
}

Counters deviceCounters(const Device* device) {
  auto* d = dynamic_cast<const SoftDevice*>(device);
  return d ? d->counters() : Counters{};
}

void notifyDoorbell(Device* device) {
  if (auto* d = dynamic_cast<SoftDevice*>(device)) d->kick();
}

bool waitForNicActivity(Device* device, int64_t maxWaitNs, bool (*stillIdle)(void*), void* arg) {
  auto* d = dynamic_cast<SoftDevice*>(device);
  if (!d) return false;
  d->waitActivity(maxWaitNs, stillIdle, arg);
  return true;
}

Counters processCounters() {
  std::lock_guard<std::mutex> g(gRegistryMutex);
  Counters sum = gRetiredCounters;
  for (Nic* n : gLiveNics) addCounters(&sum, n->counters());
  return sum;
}

std::string countersToString(const Counters& c) {
  std::string s;
#define RIDGE_PRINT(name) \
  s += format("%s%s=%llu", s.empty() ? "" : " ", #name, static_cast<unsigned long long>(c.name));
  RIDGE_SOFTNIC_COUNTERS(RIDGE_PRINT)
#undef RIDGE_PRINT
  return s;
}

}  // namespace softnic

namespace verbs {
Status createSoftnicProvider(std::unique_ptr<Provider>* out) {
  *out = std::make_unique<softnic::SoftProvider>();
  return Status::ok();
}
}  // namespace verbs

}  // namespace ridge
