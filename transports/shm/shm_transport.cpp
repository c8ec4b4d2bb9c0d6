// Host shared-memory transport: one segment per host per communicator, holding a slot
// FIFO for every ordered pair of ranks on the host plus a control block per rank.
//
// Layout (every part cache-line or page aligned so that the words written by the
// sender and those written by the receiver never share a line):
//
//   [Header][RankCtl x P][FifoCtl x P*P][slot data: P*P FIFOs x nslots x slotBytes]
//
// A FIFO from local rank s to local rank d is FifoCtl[s*P+d] and its data area.
// `head` counts posts (written by s only), `tail` counts releases (written by d only);
// both increase forever and wrap at 2^32, so `head - tail` is the number of slots in
// flight. A post stores the slot's metadata, then publishes `head` with release
// ordering; the receiver reads `head` with acquire ordering before the payload.
//
// Sleeping: a rank with nothing to do announces itself in RankCtl::sleeping, re-checks
// its work, and futex-waits on RankCtl::wakeWord. Whoever posts to it or releases one
// of its slots issues a full fence, and only if `sleeping` is set bumps wakeWord and
// calls futex_wake. So the common (busy) case costs one fence and no system call.
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "bootstrap/bootstrap.h"
#include "bootstrap/init_stage.h"
#include "core/log.h"
#include "core/settings.h"
#include "core/shared_segments.h"
#include "transports/transport.h"

namespace ridge {

// Tests only (tests/chaos/chaos_leaks.cpp): every rank behaves as if it could not open the
// creator's memfd, so the named-segment fallback runs.
std::atomic<bool> gShmForceNamedSegmentForTesting{false};

namespace {

constexpr uint64_t kSegmentMagic = 0x52494447455348ull;  // "RIDGESH"
constexpr size_t kLine = 64;
constexpr uint32_t kLastFlag = 1u << 31;

struct alignas(kLine) SegmentHeader {
  uint64_t magic;
  uint32_t localRanks;
  uint32_t nslots;
  uint64_t slotBytes;
};

struct alignas(kLine) RankCtl {
  std::atomic<uint32_t> wakeWord;  // futex word, bumped by wakers
  std::atomic<uint32_t> sleeping;  // 1 while the rank may be in futex_wait
  char pad[kLine - 8];
};
static_assert(sizeof(RankCtl) == kLine);

constexpr uint32_t kMaxSlots = 64;
// A slot's metadata: its size and flag, and the tag of a tagged post (0 otherwise) in the
// same 16 bytes, so the receiver's one read of the entry brings both.
struct SlotMeta {
  uint32_t word;  // bytes | kLastFlag
  uint32_t reserved;
  uint64_t tag;
};
// `head` and the first three slots' metadata share a line: a receiver's peek of those slots
// fetches one line that the sender wrote, not two, and a post writes one. Every hand-off of a
// collective waits for that fetch (issue 21: the small collectives' fixed cost against Open
// MPI's shared-memory transport). With the default 4 slots the fourth slot's entry starts the
// next line (the 16-byte entries carry the signature tag, issue 19).
struct FifoCtl {
  alignas(kLine) std::atomic<uint32_t> head;  // sender-written
  SlotMeta meta[kMaxSlots];                   // sender-written
  alignas(kLine) std::atomic<uint32_t> tail;  // receiver-written
};
static_assert(offsetof(FifoCtl, meta) + 3 * sizeof(SlotMeta) <= kLine,
              "the first three slots' metadata share head's line");
static_assert(offsetof(FifoCtl, tail) % kLine == 0, "tail has a line of its own");

long futexCall(std::atomic<uint32_t>* word, int op, uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, ts, nullptr, 0);
}

// Wakes `ctl`'s rank if it announced that it may sleep. The fence orders our earlier
// publish (head or tail store) before the read of `sleeping`; the sleeper orders its
// `sleeping` store before re-checking our counters the same way.
inline void wakeIfSleeping(RankCtl* ctl) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (ctl->sleeping.load(std::memory_order_relaxed)) [[unlikely]] {
    ctl->wakeWord.fetch_add(1, std::memory_order_release);
    futexCall(&ctl->wakeWord, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

class ShmSend final : public SendConnector {
 public:
  ShmSend(int peer, FifoCtl* ctl, char* data, uint32_t nslots, size_t slotBytes, RankCtl* receiver)
      : SendConnector(slotBytes, peer), ctl_(ctl), data_(data), nslots_(nslots), receiver_(receiver) {}
  void* tryAcquire() override {
    if (head_ - cachedTail_ >= nslots_) {
      cachedTail_ = ctl_->tail.load(std::memory_order_acquire);
      if (head_ - cachedTail_ >= nslots_) return nullptr;
    }
    return data_ + static_cast<size_t>(head_ % nslots_) * slotBytes();
  }
  void post(uint32_t bytes, bool last) override { postTagged(bytes, last, 0); }
  // Slots are the segment's memory, mapped by both ranks: the tag extension holds.
  bool carriesTags() const override { return true; }
  void postTagged(uint32_t bytes, bool last, uint64_t tag) override {
    SlotMeta& m = ctl_->meta[head_ % nslots_];
    m.word = bytes | (last ? kLastFlag : 0);
    m.tag = tag;
    ++head_;
    ctl_->head.store(head_, std::memory_order_release);
    wakeIfSleeping(receiver_);
  }
  int64_t unreleasedChunks() override {
    cachedTail_ = ctl_->tail.load(std::memory_order_acquire);
    return static_cast<int64_t>(head_ - cachedTail_);
  }

 private:
  FifoCtl* ctl_;
  char* data_;
  uint32_t nslots_;
  RankCtl* receiver_;
  uint32_t head_ = 0;
  uint32_t cachedTail_ = 0;
};

class ShmRecv final : public RecvConnector {
 public:
  ShmRecv(int peer, FifoCtl* ctl, char* data, uint32_t nslots, size_t slotBytes, RankCtl* sender)
      : RecvConnector(slotBytes, peer), ctl_(ctl), data_(data), nslots_(nslots), sender_(sender) {}
  const void* tryPeek(SlotInfo* info) override {
    if (tail_ == cachedHead_) {
      cachedHead_ = ctl_->head.load(std::memory_order_acquire);
      if (tail_ == cachedHead_) return nullptr;
    }
    const SlotMeta& m = ctl_->meta[tail_ % nslots_];
    const uint32_t meta = m.word;
    info->bytes = meta & ~kLastFlag;
    info->lastOfMessage = (meta & kLastFlag) != 0;
    info->tag = m.tag;
    return data_ + static_cast<size_t>(tail_ % nslots_) * slotBytes();
  }
  bool carriesTags() const override { return true; }
  void release() override {
    ++tail_;
    ctl_->tail.store(tail_, std::memory_order_release);
    wakeIfSleeping(sender_);
  }

 private:
  FifoCtl* ctl_;
  char* data_;
  uint32_t nslots_;
  RankCtl* sender_;
  uint32_t tail_ = 0;
  uint32_t cachedHead_ = 0;
};

size_t alignUp(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

// Peer memory on one host. Cross-memory attach by default: the kernel copies straight between
// the two address spaces, so a transfer touches each byte once. Needs ptrace-level access to
// the peer (same user, and no Yama/ seccomp/container policy against it), which the init probe
// checks.
//
// Mapped segments (issue 21): the peer's shareable buffers (ridgeMemAlloc host memory,
// core/shared_segments.h) are listed in the peer's segment table, which this object maps
// read-only at connect. An access to a range inside one of them maps that segment once
// (/proc/<pid>/fd/<fd>, MAP_SHARED) and from then on copies with memcpy, or hands the
// algorithm the mapped address to reduce from: no system call, no page pinning, no lock.
//
// Staleness: a cached mapping remembers its table entry and the entry's sequence. Each access
// re-reads that sequence with one acquire load of the peer's table; a peer that freed the
// segment (and perhaps allocated another at the same address) has changed it, so the mapping
// is dropped and the table scanned again. The acquire load sees the peer's latest publication
// for any address that reached this rank in a collective's descriptor, because the peer
// published the entry (release) before it posted the descriptor (release store of the FIFO
// head), which this rank read with an acquire load before looking the address up
// (shared_segments.h, "Ordering").
class ShmPeerMemory final : public PeerMemory {
 public:
  ShmPeerMemory(int peerRank, pid_t pid, const SharedSegmentTable* table)
      : peerRank_(peerRank), pid_(pid), table_(table) {}
  ~ShmPeerMemory() override {
    for (uint32_t i = 0; i < cached_; ++i) munmap(cache_[i].local, cache_[i].bytes);
    if (table_) munmap(const_cast<SharedSegmentTable*>(table_), sharedSegmentTableBytes());
  }
  Status read(void* local, uint64_t remoteAddr, size_t bytes) override {
    if (char* p = lookup(remoteAddr, bytes)) {
      std::memcpy(local, p, bytes);
      return Status::ok();
    }
    return copy(local, remoteAddr, bytes, false);
  }
  Status write(uint64_t remoteAddr, const void* local, size_t bytes) override {
    if (char* p = lookup(remoteAddr, bytes)) {
      std::memcpy(p, local, bytes);
      return Status::ok();
    }
    return copy(const_cast<void*>(local), remoteAddr, bytes, true);
  }
  const void* mapped(uint64_t remoteAddr, size_t bytes) override { return lookup(remoteAddr, bytes); }
  void* mappedForWrite(uint64_t remoteAddr, size_t bytes) override { return lookup(remoteAddr, bytes); }
  PeerMemoryCounters counters() const override { return counters_; }

 private:
  // A peer segment mapped here.
  struct Mapping {
    uint64_t base;  // in the peer's address space
    size_t bytes;
    char* local;
    uint32_t entry;  // its entry in the peer's table
    uint64_t sequence;
  };
  static constexpr uint32_t kCachedMappings = 8;

  // The local address of the peer's [remote, remote + bytes), or nullptr (then CMA).
  char* lookup(uint64_t remote, size_t bytes) {
    if (!table_) return nullptr;
    for (uint32_t i = 0; i < cached_;) {
      Mapping& m = cache_[i];
      if (!rangeInside(m.base, m.bytes, remote, bytes)) {
        ++i;
        continue;
      }
      if (table_->entries[m.entry].sequence.load(std::memory_order_acquire) == m.sequence) {
        ++counters_.mappedAccesses;
        return m.local + (remote - m.base);
      }
      ++counters_.staleMappings;
      drop(i);  // the peer freed it: the slot now holds the last mapping, look at it next
    }
    char* p = mapFromTable(remote, bytes);
    if (p) ++counters_.mappedAccesses;
    return p;
  }

  void drop(uint32_t i) {
    munmap(cache_[i].local, cache_[i].bytes);
    cache_[i] = cache_[--cached_];
  }

  // Scans the used entries of the peer's table (seqlock reads) for a live segment holding the
  // range, maps it and caches the mapping. Misses cost one load per used entry.
  char* mapFromTable(uint64_t remote, size_t bytes) {
    LiveSegment seg;
    if (!findLiveSegment(*table_, remote, bytes, &seg)) return nullptr;
    return mapSegment(seg.entry, seg.sequence, seg.base, seg.bytes, static_cast<int>(seg.fd), remote);
  }

  char* mapSegment(uint32_t entry, uint64_t seq, uint64_t base, uint64_t size, int fd, uint64_t remote) {
    if (unmappable_) return nullptr;
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/fd/%d", static_cast<int>(pid_), fd);
    const int local = ::open(path, O_RDWR | O_CLOEXEC);
    struct stat st {};
    void* p = MAP_FAILED;
    if (local >= 0 && fstat(local, &st) == 0 && static_cast<uint64_t>(st.st_size) >= size)
      p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, local, 0);
    const int err = errno;
    if (local >= 0) ::close(local);
    // The owner retires the entry before it closes the descriptor (with a full fence): if the
    // entry still reads `seq` now, the descriptor opened above was that segment's.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const bool stillLive = table_->entries[entry].sequence.load(std::memory_order_acquire) == seq;
    if (p == MAP_FAILED || !stillLive) {
      if (p != MAP_FAILED) munmap(p, size);
      if (stillLive) {
        // Not a race with a free: this peer's segments cannot be mapped (permissions, limits).
        unmappable_ = true;
        RIDGE_INFO("shm: cannot map rank %d's shared buffers (%s: %s); using cross-memory attach", peerRank_,
                   path, local < 0 ? std::strerror(err) : "mmap or size check failed");
      }
      return nullptr;
    }
    if (cached_ == kCachedMappings) drop(nextVictim_++ % kCachedMappings);
    cache_[cached_++] = {base, static_cast<size_t>(size), static_cast<char*>(p), entry, seq};
    ++counters_.segmentsMapped;
    return static_cast<char*>(p) + (remote - base);
  }

  Status copy(void* local, uint64_t remote, size_t bytes, bool toPeer) {
    ++counters_.copiedAccesses;
    size_t done = 0;
    while (done < bytes) {
      iovec l{static_cast<char*>(local) + done, bytes - done};
      iovec r{reinterpret_cast<void*>(remote + done), bytes - done};
      ssize_t n = toPeer ? process_vm_writev(pid_, &l, 1, &r, 1, 0) : process_vm_readv(pid_, &l, 1, &r, 1, 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        return makeError(errno == ESRCH ? ridgeRemoteError : ridgeSystemError,
                         "shm: %s of %zu bytes %s rank %d (pid %d) failed: %s",
                         toPeer ? "process_vm_writev" : "process_vm_readv", bytes - done,
                         toPeer ? "to" : "from", peerRank_, static_cast<int>(pid_), std::strerror(err));
      }
      if (n == 0)
        return makeError(ridgeSystemError, "shm: cross-memory copy with rank %d made no progress", peerRank_);
      done += static_cast<size_t>(n);
    }
    return Status::ok();
  }
  int peerRank_;
  pid_t pid_;
  const SharedSegmentTable* table_;  // the peer's table, mapped read-only; null: CMA only
  Mapping cache_[kCachedMappings] = {};
  uint32_t cached_ = 0;
  uint32_t nextVictim_ = 0;
  bool unmappable_ = false;
  PeerMemoryCounters counters_;
};

// Read by peers in the init probe: if they can read this value out of our memory,
// cross-memory attach works between us.
volatile uint64_t gCmaProbeWord = 0;

class ShmTransport final : public Transport {
 public:
  ~ShmTransport() override {
    send_.clear();
    recv_.clear();
    cma_.clear();
    if (holdsSegmentTable_) releaseSharedSegmentTable();
    if (base_ && base_ != MAP_FAILED) munmap(base_, bytes_);
  }
  const char* name() const override { return "shm"; }
  SendConnector* sendTo(int peer) override {
    return peer >= 0 && peer < static_cast<int>(send_.size()) ? send_[peer].get() : nullptr;
  }
  RecvConnector* recvFrom(int peer) override {
    return peer >= 0 && peer < static_cast<int>(recv_.size()) ? recv_[peer].get() : nullptr;
  }
  PeerMemory* peerMemory(int peer) override {
    return peer >= 0 && peer < static_cast<int>(cma_.size()) ? cma_[peer].get() : nullptr;
  }

  void waitForActivity(int64_t maxWaitNs, bool (*stillIdle)(void*), void* arg) override {
    RankCtl* me = myCtl_;
    uint32_t word = me->wakeWord.load(std::memory_order_acquire);
    me->sleeping.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (stillIdle(arg)) {
      timespec ts{static_cast<time_t>(maxWaitNs / 1000000000), static_cast<long>(maxWaitNs % 1000000000)};
      futexCall(&me->wakeWord, FUTEX_WAIT, word, &ts);
    }
    me->sleeping.store(0, std::memory_order_relaxed);
  }

  Status checkPeer(int peer) override {
    for (size_t i = 0; i < localRanks_.size(); ++i) {
      if (localRanks_[i] != peer || pids_[i] == selfPid_) continue;
      if (!processAlive(pids_[i]))
        return makeError(ridgeRemoteError, "shm: rank %d (pid %d) on this host has exited", peer, pids_[i]);
    }
    return Status::ok();
  }

  Status connect(const TransportSetup& setup);

 private:
  Status probeCma(const TransportSetup& setup);
  Status mapSegment(const TransportSetup& setup, bool leader, uint32_t P, uint32_t nslots, int64_t slotBytes);
  Status mapNamedSegment(const TransportSetup& setup, bool leader);
  void writeHeader(uint32_t P, uint32_t nslots, int64_t slotBytes);

  static bool processAlive(int pid) {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE* f = std::fopen(path, "r");
    if (!f) return false;
    char buf[512];
    size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    buf[n] = 0;
    // The state follows the last ')' (the command name may contain spaces or parens).
    const char* close = std::strrchr(buf, ')');
    if (!close || close[1] == 0 || close[2] == 0) return true;
    char state = close[2];
    return state != 'Z' && state != 'X' && state != 'x';
  }

  int rank_ = -1;
  int selfPid_ = 0;
  std::vector<int> localRanks_;  // global ranks on this host, ascending
  std::vector<int> pids_;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  RankCtl* myCtl_ = nullptr;
  std::vector<std::unique_ptr<ShmSend>> send_;  // indexed by global rank
  std::vector<std::unique_ptr<ShmRecv>> recv_;
  std::vector<std::unique_ptr<ShmPeerMemory>> cma_;  // empty unless every rank can use CMA
  bool holdsSegmentTable_ = false;                   // holdSharedSegmentTable: released at destruction
};

// Maps `peer`'s table of shareable buffers read-only (ShmPeerMemory), or returns null: the
// peer's buffers are then reached by cross-memory attach alone. Checked by inode and device,
// as the transport's segment is (another pid namespace would name another process).
const SharedSegmentTable* mapPeerSegmentTable(int peer, int pid, const SharedSegmentTableRef& ref) {
  if (ref.fd < 0) return nullptr;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, ref.fd);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  struct stat st {};
  void* p = MAP_FAILED;
  if (fd >= 0 && fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_ino) == ref.ino &&
      static_cast<uint64_t>(st.st_dev) == ref.dev &&
      static_cast<uint64_t>(st.st_size) >= sharedSegmentTableBytes())
    p = mmap(nullptr, sharedSegmentTableBytes(), PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (p != MAP_FAILED && static_cast<const SharedSegmentTable*>(p)->magic == kSharedSegmentTableMagic)
    return static_cast<const SharedSegmentTable*>(p);
  if (p != MAP_FAILED) munmap(p, sharedSegmentTableBytes());
  RIDGE_INFO("shm: rank %d's shareable buffers are reached by cross-memory attach (%s: %s)", peer, path,
             fd < 0 ? std::strerror(err) : "not its table");
  return nullptr;
}

Status ShmTransport::probeCma(const TransportSetup& setup) {
  const std::string mode = settingString(Setting::CMA);
  const bool wanted = mode != "0";
  struct Probe {
    uint64_t addr;
    uint64_t value;
    int32_t canRead;  // this rank could read every local peer's probe word
    int32_t pad;
    SharedSegmentTableRef segments;  // where this rank's table of shareable buffers is
  };
  if (gCmaProbeWord == 0) gCmaProbeWord = randomNonce() | 1;
  std::vector<Probe> probes(setup.nranks);
  SharedSegmentTableRef table;
  if (wanted && setup.nranks > 1 && localRanks_.size() > 1) {
    table = holdSharedSegmentTable();
    holdsSegmentTable_ = table.fd >= 0;
  }
  probes[setup.rank] = {reinterpret_cast<uint64_t>(&gCmaProbeWord), gCmaProbeWord, 0, 0, table};
  RIDGE_TRY(setup.bootstrap->allGather(probes.data(), sizeof(Probe)));
  std::vector<SharedSegmentTableRef> tables(setup.nranks);
  for (int r = 0; r < setup.nranks; ++r) tables[r] = probes[r].segments;
  bool ok = wanted;
  std::string why = wanted ? "" : "RIDGE_CMA=0";
  for (int peer : localRanks_) {
    if (!ok || peer == setup.rank || setup.pidOfRank[peer] == selfPid_) continue;
    uint64_t got = 0;
    iovec l{&got, sizeof got};
    iovec r{reinterpret_cast<void*>(probes[peer].addr), sizeof got};
    if (process_vm_readv(setup.pidOfRank[peer], &l, 1, &r, 1, 0) != static_cast<ssize_t>(sizeof got) ||
        got != probes[peer].value) {
      ok = false;
      why = format("process_vm_readv from rank %d: %s", peer, got ? "wrong value" : std::strerror(errno));
    }
  }
  probes.assign(setup.nranks, Probe{});
  probes[setup.rank].canRead = ok ? 1 : 0;
  RIDGE_TRY(setup.bootstrap->allGather(probes.data(), sizeof(Probe)));
  // Direct algorithms are chosen identically on every rank, so CMA is on for all or
  // none; and only within one host (every rank local).
  bool all = localRanks_.size() == static_cast<size_t>(setup.nranks);
  if (!all && why.empty()) why = "ranks span several hosts";
  for (int r = 0; r < setup.nranks && all; ++r) {
    if (!probes[r].canRead) {
      all = false;
      if (why.empty()) why = format("rank %d cannot use it", r);
    }
  }
  if (!all && mode == "1")
    return makeError(ridgeSystemError,
                     "shm: RIDGE_CMA=1 but single-copy cross-memory attach is unavailable (%s)", why.c_str());
  if (all && setup.nranks > 1) {
    cma_.resize(setup.nranks);
    for (int peer : localRanks_)
      if (peer != setup.rank)
        cma_[peer] = std::make_unique<ShmPeerMemory>(
            peer, setup.pidOfRank[peer], mapPeerSegmentTable(peer, setup.pidOfRank[peer], tables[peer]));
  }
  RIDGE_INFO("shm: single-copy (CMA) %s%s%s", all ? "enabled" : "disabled", why.empty() ? "" : ": ",
             why.c_str());
  return Status::ok();
}

void ShmTransport::writeHeader(uint32_t P, uint32_t nslots, int64_t slotBytes) {
  auto* hdr = static_cast<SegmentHeader*>(base_);
  hdr->magic = kSegmentMagic;
  hdr->localRanks = P;
  hdr->nslots = nslots;
  hdr->slotBytes = static_cast<uint64_t>(slotBytes);
}

// How the creator's segment is found by the others (one bootstrap all-gather entry per rank).
struct SegmentRef {
  int32_t pid;  // creator's pid and descriptor of its memfd: /proc/<pid>/fd/<fd>
  int32_t fd;
  uint64_t ino;  // the memfd's identity, checked after opening (pid namespaces may differ)
  uint64_t dev;
  uint64_t bytes;
  char pad[32];
};
static_assert(sizeof(SegmentRef) == 64);

// The segment is a memfd: it has no name, so nothing can outlive the processes that map it,
// whichever of them is killed when. The creator keeps its descriptor open until every local
// rank has opened its own through /proc/<creator pid>/fd/<fd> (same user, same pid namespace),
// then closes it. Only when some rank cannot open it that way (another pid namespace, a
// /proc mounted with hidepid) do the ranks fall back to a named POSIX segment
// (mapNamedSegment), which a rank killed inside its short creation window could leave behind.
Status ShmTransport::mapSegment(const TransportSetup& setup, bool leader, uint32_t P, uint32_t nslots,
                                int64_t slotBytes) {
  SegmentRef mine{};
  int memfd = -1;
  auto closeMemfd = [&memfd] {
    if (memfd >= 0) ::close(memfd);
    memfd = -1;
  };
  if (leader) {
    memfd = static_cast<int>(syscall(SYS_memfd_create, "ridge-shm", 1u /* MFD_CLOEXEC */));
    if (memfd < 0) return systemError("shm: memfd_create");
    struct stat st {};
    if (ftruncate(memfd, static_cast<off_t>(bytes_)) != 0 || fstat(memfd, &st) != 0) {
      Status s = systemError("shm: sizing the shared segment (is there enough memory for it?)");
      closeMemfd();
      return s;
    }
    base_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (base_ == MAP_FAILED) {
      base_ = nullptr;
      Status s = systemError("shm: mmap of the shared segment");
      closeMemfd();
      return s;
    }
    writeHeader(P, nslots, slotBytes);
    mine = {selfPid_, memfd, static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_dev), bytes_, {}};
    initStage(InitStage::ShmSegmentCreated);
  }
  std::vector<SegmentRef> refs(setup.nranks);
  refs[setup.rank] = mine;
  Status s = setup.bootstrap->allGather(refs.data(), sizeof(SegmentRef));
  if (!s.isOk()) {
    closeMemfd();
    return s;
  }
  std::string why;
  if (!leader) {
    const SegmentRef& ref = refs[localRanks_[0]];
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/fd/%d", ref.pid, ref.fd);
    const bool forced = gShmForceNamedSegmentForTesting.load();
    int fd = forced ? -1 : ::open(path, O_RDWR | O_CLOEXEC);
    struct stat st {};
    if (fd < 0) {
      why = format("open %s: %s", path,
                   forced ? "not tried (a test forces the fallback)" : std::strerror(errno));
    } else if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_ino) != ref.ino ||
               static_cast<uint64_t>(st.st_dev) != ref.dev || ref.bytes != bytes_) {
      why = format("%s is not rank %d's segment (another pid namespace?)", path, localRanks_[0]);
    } else {
      base_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (base_ == MAP_FAILED) {
        base_ = nullptr;
        why = format("mmap: %s", std::strerror(errno));
      }
    }
    if (fd >= 0) ::close(fd);
    if (base_) initStage(InitStage::ShmSegmentAttached);
  }
  // Everyone has opened its own descriptor (or failed) before the creator lets go of its own.
  std::vector<int32_t> attached(setup.nranks, 0);
  attached[setup.rank] = base_ ? 1 : 0;
  s = setup.bootstrap->allGather(attached.data(), sizeof(int32_t));
  closeMemfd();
  RIDGE_TRY(s);
  // Every rank (of every host: all of them run this, and the fallback's bootstrap calls must
  // match) sees the same table, so all fall back together or none does.
  bool allAttached = true;
  for (int r = 0; r < setup.nranks; ++r) allAttached = allAttached && attached[r];
  if (allAttached) return Status::ok();
  if (!why.empty())
    RIDGE_WARN("shm: rank %d cannot open the host's shared segment through /proc (%s); using a named segment",
               setup.rank, why.c_str());
  if (base_) munmap(base_, bytes_);
  base_ = nullptr;
  RIDGE_TRY(mapNamedSegment(setup, leader));
  if (leader) writeHeader(P, nslots, slotBytes);
  return setup.bootstrap->barrier();  // the header is written before anyone checks it
}

// The fallback: a named POSIX segment that the creator unlinks once every local rank mapped it.
// The name is one every local rank can compute (the creator's pid and the bootstrap's random
// session nonce, which is this communicator's), so that when the creator dies between creating
// it and the unlink, the survivors unlink it on their way out: only the death of every local
// rank inside that window can leave it behind.
Status ShmTransport::mapNamedSegment(const TransportSetup& setup, bool leader) {
  char name[64] = {0};
  std::snprintf(name, sizeof name, "/ridge-%d-%016llx", setup.pidOfRank[localRanks_[0]],
                static_cast<unsigned long long>(setup.bootstrap->sessionNonce() ^ 0x5348u));
  Status s = Status::ok();
  if (leader) {
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return systemError("shm: shm_open (is /dev/shm mounted and writable?)");
    initStage(InitStage::ShmSegmentCreated);
    if (ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
      Status e = systemError("shm: ftruncate of the shared segment (is /dev/shm large enough?)");
      ::close(fd);
      shm_unlink(name);
      return e;
    }
    base_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (base_ == MAP_FAILED) {
      base_ = nullptr;
      shm_unlink(name);
      return systemError("shm: mmap of the shared segment");
    }
  }
  // The creator has created it (or failed) once this returns.
  s = setup.bootstrap->barrier();
  if (s.isOk() && !leader) {
    int fd = shm_open(name, O_RDWR, 0600);
    if (fd < 0) {
      s = systemError("shm: shm_open of the leader's segment");
    } else {
      base_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      ::close(fd);
      if (base_ == MAP_FAILED) {
        base_ = nullptr;
        s = systemError("shm: mmap of the leader's segment");
      } else {
        initStage(InitStage::ShmSegmentAttached);
      }
    }
  }
  // Everyone must have mapped (or failed) before the name goes away; on any failure every
  // local rank unlinks it (ENOENT when it is gone already or was never made).
  Status b = setup.bootstrap->barrier();
  if (leader || !s.isOk() || !b.isOk()) shm_unlink(name);
  RIDGE_TRY(s);
  return b;
}

Status ShmTransport::connect(const TransportSetup& setup) {
  rank_ = setup.rank;
  selfPid_ = getpid();
  const uint64_t myHost = setup.hostHashOfRank[setup.rank];
  int myLocal = -1;
  for (int r = 0; r < setup.nranks; ++r) {
    if (setup.hostHashOfRank[r] != myHost) continue;
    if (r == setup.rank) myLocal = static_cast<int>(localRanks_.size());
    localRanks_.push_back(r);
    pids_.push_back(setup.pidOfRank[r]);
  }
  const uint32_t P = static_cast<uint32_t>(localRanks_.size());

  const int64_t slots = settingSlotCount(Setting::SHM_SLOTS, kMaxSlots, 4);
  const int64_t slotBytes = shmSlotBytes(/*warn=*/true);
  const uint32_t nslots = static_cast<uint32_t>(slots);

  const size_t ctlOff = alignUp(sizeof(SegmentHeader), 4096);
  const size_t fifoOff = alignUp(ctlOff + P * sizeof(RankCtl), 4096);
  const size_t dataOff = alignUp(fifoOff + static_cast<size_t>(P) * P * sizeof(FifoCtl), 4096);
  const size_t fifoData = static_cast<size_t>(nslots) * static_cast<size_t>(slotBytes);
  bytes_ = dataOff + static_cast<size_t>(P) * P * fifoData;

  // The lowest local rank creates the segment; everyone maps it (mapSegment).
  RIDGE_TRY(mapSegment(setup, myLocal == 0, P, nslots, slotBytes));

  auto* hdr = static_cast<SegmentHeader*>(base_);
  if (hdr->magic != kSegmentMagic || hdr->localRanks != P || hdr->nslots != nslots ||
      hdr->slotBytes != static_cast<uint64_t>(slotBytes))
    return makeError(ridgeInvalidUsage,
                     "shm: segment layout differs between ranks (RIDGE_SHM_SLOTS / RIDGE_SHM_SLOT_BYTES "
                     "must be the same on every rank)");

  char* base = static_cast<char*>(base_);
  auto* ctl = reinterpret_cast<RankCtl*>(base + ctlOff);
  auto* fifos = reinterpret_cast<FifoCtl*>(base + fifoOff);
  myCtl_ = &ctl[myLocal];
  send_.resize(setup.nranks);
  recv_.resize(setup.nranks);
  for (uint32_t j = 0; j < P; ++j) {
    if (static_cast<int>(j) == myLocal) continue;
    int peer = localRanks_[j];
    size_t out = static_cast<size_t>(myLocal) * P + j;
    size_t in = static_cast<size_t>(j) * P + myLocal;
    send_[peer] = std::make_unique<ShmSend>(peer, &fifos[out], base + dataOff + out * fifoData, nslots,
                                            static_cast<size_t>(slotBytes), &ctl[j]);
    recv_[peer] = std::make_unique<ShmRecv>(peer, &fifos[in], base + dataOff + in * fifoData, nslots,
                                            static_cast<size_t>(slotBytes), &ctl[j]);
  }
  RIDGE_TRY(probeCma(setup));
  RIDGE_INFO("shm: %u local ranks, %u slots of %lld bytes per pair, segment %zu bytes", P, nslots,
             static_cast<long long>(slotBytes), bytes_);
  return Status::ok();
}

bool shmCanConnect(const TransportSetup& setup, int a, int b) {
  // RIDGE_SHM=0 hands same-host pairs to the network transport (tests, comparisons).
  return settingInt(Setting::SHM) != 0 && setup.hostHashOfRank[a] == setup.hostHashOfRank[b];
}

Status shmCreate(const TransportSetup& setup, std::unique_ptr<Transport>* out) {
  auto t = std::make_unique<ShmTransport>();
  RIDGE_TRY(t->connect(setup));
  *out = std::move(t);
  return Status::ok();
}

}  // namespace

extern const TransportTable kShmTransportTable = {sizeof(TransportTable), kTransportTableVersion, "shm",
                                                  shmCanConnect, shmCreate};

}  // namespace ridge
