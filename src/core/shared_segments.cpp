// Shareable host memory (shared_segments.h).
#include "core/shared_segments.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "core/log.h"

namespace ridge {
namespace {

constexpr size_t kPage = 4096;
static_assert(offsetof(SharedSegmentTable, entries) == 64, "the entries start on a line of their own");

size_t tableBytes() {
  return (sizeof(SharedSegmentTable) + kPage - 1) / kPage * kPage;
}

int createMemfd(const char* name) {
  return static_cast<int>(syscall(SYS_memfd_create, name, 1u /* MFD_CLOEXEC */));
}

struct Segment {
  size_t bytes;
  int fd;
  int entry;  // index in the table, -1 when not published (table full or absent)
};

// The process-wide registry. Everything under `mutex`; the table is written only here.
struct Registry {
  std::mutex mutex;
  int ownerPid = 0;  // the process the table belongs to (a forked child makes its own)
  int tableFd = -1;
  SharedSegmentTable* table = nullptr;
  std::atomic<const SharedSegmentTable*> published{nullptr};  // `table`, for isOwnSharedMemory
  SharedSegmentTableRef ref;
  bool tableFailed = false;
  int tableUsers = 0;  // holds of holdSharedSegmentTable not yet released (transports)
  std::unordered_map<void*, Segment> segments;

  // After a fork the inherited table is the parent's (shared memory): let go of it here and
  // publish what this process holds in a new one.
  void adoptAfterFork() {
    const int pid = static_cast<int>(getpid());
    if (ownerPid == pid) return;
    const bool inherited = ownerPid != 0;
    ownerPid = pid;
    if (!inherited) return;
    published.store(nullptr, std::memory_order_release);
    if (table) munmap(table, tableBytes());
    if (tableFd >= 0) ::close(tableFd);
    table = nullptr;
    tableFd = -1;
    ref = {};
    tableFailed = false;
    tableUsers = 0;  // the parent's transports are the parent's
    for (auto& [base, seg] : segments) seg.entry = -1;
    if (!ensureTable()) return;
    for (auto& [base, seg] : segments) publish(base, seg);
  }

  bool ensureTable() {
    if (table) return true;
    if (tableFailed) return false;
    int fd = createMemfd("ridge-segments");
    struct stat st {};
    void* p = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(tableBytes())) == 0 && fstat(fd, &st) == 0)
      p = mmap(nullptr, tableBytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      RIDGE_INFO("shared segments: no table of shareable buffers (memfd: %s); peers use cross-memory attach",
                 std::strerror(errno));
      if (fd >= 0) ::close(fd);
      tableFailed = true;
      return false;
    }
    table = static_cast<SharedSegmentTable*>(p);  // zero-filled: every sequence 0 (even, but
    for (auto& e : table->entries) e.sequence.store(1, std::memory_order_relaxed);  // now free)
    table->usedEntries.store(0, std::memory_order_relaxed);
    table->magic = kSharedSegmentTableMagic;
    std::atomic_thread_fence(std::memory_order_release);
    tableFd = fd;
    ref = {fd, 0, static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_dev)};
    published.store(table, std::memory_order_release);
    return true;
  }

  // The table lives while a transport holds it or a segment is listed in it, so that a process
  // that neither communicates nor holds shareable buffers keeps no descriptor open for it (the
  // leak checks count descriptors around a communicator's life). Peers keep their own mappings.
  void dropTableIfUnused() {
    if (!table || tableUsers > 0 || !segments.empty()) return;
    published.store(nullptr, std::memory_order_release);
    munmap(table, tableBytes());
    ::close(tableFd);
    table = nullptr;
    tableFd = -1;
    ref = {};
    tableFailed = false;
  }

  // Seqlock write: the entry is free (odd) while its fields change, and the store that makes
  // it even is a release, so a reader whose acquire load sees the even value sees the fields.
  void publish(void* base, Segment& seg) {
    if (!table) return;
    for (uint32_t i = 0; i < kSharedSegmentEntries; ++i) {
      SharedSegmentEntry& e = table->entries[i];
      const uint64_t s = e.sequence.load(std::memory_order_relaxed);
      if ((s & 1) == 0) continue;
      e.base.store(reinterpret_cast<uint64_t>(base), std::memory_order_relaxed);
      e.bytes.store(seg.bytes, std::memory_order_relaxed);
      e.fd.store(static_cast<uint64_t>(seg.fd), std::memory_order_relaxed);
      if (i >= table->usedEntries.load(std::memory_order_relaxed))
        table->usedEntries.store(i + 1, std::memory_order_release);
      e.sequence.store(s + 1, std::memory_order_release);
      seg.entry = static_cast<int>(i);
      return;
    }
    RIDGE_INFO("shared segments: table full (%u segments): a new buffer is reached by cross-memory attach",
               kSharedSegmentEntries);
  }

  // Retires an entry: odd again, and a full fence before the caller unmaps and closes, so a
  // reader that opens the descriptor afterwards and re-reads the sequence sees the change.
  void retire(Segment& seg) {
    if (!table || seg.entry < 0) return;
    SharedSegmentEntry& e = table->entries[seg.entry];
    e.sequence.fetch_add(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    seg.entry = -1;
  }
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: buffers may be freed from atexit handlers
  return *r;
}

}  // namespace

SharedSegmentTableRef holdSharedSegmentTable() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.adoptAfterFork();
  if (!r.ensureTable()) return {};
  ++r.tableUsers;
  return r.ref;
}

void releaseSharedSegmentTable() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.adoptAfterFork();
  if (r.tableUsers > 0) --r.tableUsers;
  r.dropTableIfUnused();
}

size_t sharedSegmentTableBytes() {
  return tableBytes();
}

// Each segment holds a descriptor for as long as it lives: at most a quarter of the soft
// RLIMIT_NOFILE (the application's sockets and files come first) and one per table entry;
// beyond that ridgeMemAlloc returns private memory, which peers reach by CMA.
size_t segmentCap() {
  rlimit rl{};
  size_t cap = kSharedSegmentEntries;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    cap = std::min<size_t>(cap, static_cast<size_t>(rl.rlim_cur) / 4);
  return cap;
}

void* allocateSharedSegment(size_t bytes) {
  const size_t rounded = (bytes + kPage - 1) / kPage * kPage;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.adoptAfterFork();
  if (r.segments.size() >= segmentCap()) return nullptr;
  int fd = createMemfd("ridge-buffer");
  if (fd < 0) return nullptr;
  void* p = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(rounded)) == 0)
    p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return nullptr;
  }
  Segment& seg = r.segments[p] = Segment{rounded, fd, -1};
  if (r.ensureTable()) r.publish(p, seg);
  return p;
}

bool freeSharedSegment(void* base) {
  Registry& r = registry();
  Segment seg{};
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    r.adoptAfterFork();
    auto it = r.segments.find(base);
    if (it == r.segments.end()) return false;
    r.retire(it->second);
    seg = it->second;
    r.segments.erase(it);
    r.dropTableIfUnused();
  }
  munmap(base, seg.bytes);
  ::close(seg.fd);
  return true;
}

bool findLiveSegment(const SharedSegmentTable& table, uint64_t addr, uint64_t n, LiveSegment* out) {
  const uint32_t used = std::min(table.usedEntries.load(std::memory_order_acquire), kSharedSegmentEntries);
  for (uint32_t i = 0; i < used; ++i) {
    const SharedSegmentEntry& e = table.entries[i];
    const uint64_t seq = e.sequence.load(std::memory_order_acquire);
    if (seq & 1) continue;
    const uint64_t base = e.base.load(std::memory_order_relaxed);
    const uint64_t size = e.bytes.load(std::memory_order_relaxed);
    const uint64_t fd = e.fd.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (e.sequence.load(std::memory_order_relaxed) != seq) continue;  // rewritten meanwhile
    if (!rangeInside(base, size, addr, n)) continue;
    *out = {i, seq, base, size, fd};
    return true;
  }
  return false;
}

bool isOwnSharedMemory(const void* p, size_t bytes) {
  const SharedSegmentTable* t = registry().published.load(std::memory_order_acquire);
  LiveSegment found;
  return t && findLiveSegment(*t, reinterpret_cast<uint64_t>(p), bytes, &found);
}

bool isPublishedSharedSegment(const void* p, size_t bytes) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.adoptAfterFork();
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (const auto& [base, seg] : r.segments) {
    const auto b = reinterpret_cast<uintptr_t>(base);
    if (seg.entry >= 0 && rangeInside(b, seg.bytes, a, bytes)) return true;
  }
  return false;
}

}  // namespace ridge
