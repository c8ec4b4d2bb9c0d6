// The NIC: one emulated device with its engine thread. The files of transports/softnic/, by
// object: nic.cpp (life cycle, mailbox, QP bookkeeping), engine.cpp (the loop and the
// requester side), engine_receive.cpp (what arrives: data, acks, reads), connections.cpp
// (sockets and frames), faults.cpp (the fault injector), memory.cpp (regions, staging, the
// protection domain), queues.h/.cpp (CQ and QP), mlx5_codec.cpp (WQE and CQE decoding),
// wire.h (softnic's own frames), counters.h/.cpp, trace.h, softnic.cpp (the provider and the
// functions of softnic.h). See softnic.h for the model and docs/transports.md for the wire.
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
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <ctime>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "transports/softnic/counters.h"
#include "transports/softnic/softnic.h"
#include "transports/softnic/wire.h"
#include "transports/verbs/verbs.h"

namespace ridge {
namespace softnic {

using namespace verbs;

inline int64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

inline long futexCall(std::atomic<uint32_t>* word, int op, uint32_t val, const timespec* ts) {
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

uint32_t qpnBase();

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

}  // namespace softnic
}  // namespace ridge
