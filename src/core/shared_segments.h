// Shareable host memory: the host buffers of ridgeMemAlloc, which a peer process of the same
// host maps once and then reads and writes with plain loads and stores, instead of a
// cross-memory-attach system call (and page pinning) per access.
//
// Each segment is a memfd (no name, nothing outlives the processes mapping it) mapped
// MAP_SHARED, whose descriptor stays open while the segment lives. The process publishes its
// live segments in a table of its own, itself a memfd mapped shared, that every shm transport
// peer maps read-only at connect (/proc/<pid>/fd/<fd>, the same way as the transport's
// segment): there is one table per process, written only by this process under the registry's
// mutex, so no transport has to be told about allocations and frees.
//
// The table is a seqlock per entry. `sequence` is odd while the entry is free (or being
// rewritten) and even while base/bytes/fd describe a live segment; every change bumps it by
// one, so a value never names two segments: a reader that cached a mapping with sequence s
// knows the segment is still the same one as long as the entry still reads s. ridgeMemFree
// retires the entry (odd) before it unmaps and closes, so a reader that opened the
// descriptor and then still sees s has the right file.
//
// Ordering with the collectives: an allocation stores the entry's sequence (release) before
// ridgeMemAlloc returns; the buffer's address reaches a peer only inside a later collective's
// descriptor, which the transport posts with a release store that the peer reads with an
// acquire load before it looks the address up, so the peer's acquire load of the entry sees
// the publication or something later (happens-before is transitive). A thread other than the
// allocating one uses the buffer only after synchronising with it, which extends the chain.
//
// A forked child inherits the parent's table mapping, which stays the parent's: the first
// call in the child (getpid() differs) drops it and publishes the inherited segments in a
// table of its own. Note that the segments themselves stay shared with a forked child, unlike
// private memory (docs: ridgeMemAlloc).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace ridge {

constexpr uint64_t kSharedSegmentTableMagic = 0x52494447455345ull;  // "RIDGESE"
constexpr uint32_t kSharedSegmentEntries = 500;

// One entry of a process's table (see the seqlock above). All fields are atomics so that the
// reader's racy reads (retried when the sequence moved) are defined behaviour.
struct SharedSegmentEntry {
  std::atomic<uint64_t> sequence;  // odd: free; even: base/bytes/fd are a live segment
  std::atomic<uint64_t> base;      // the segment's address in the owner's address space
  std::atomic<uint64_t> bytes;     // its mapped length (whole pages)
  std::atomic<uint64_t> fd;        // the owner's descriptor of its memfd
};

struct SharedSegmentTable {
  uint64_t magic;
  // Entries [0, usedEntries) have been used at least once; readers scan only those.
  std::atomic<uint32_t> usedEntries;
  uint32_t pad[13];
  SharedSegmentEntry entries[kSharedSegmentEntries];
};

// Whether [addr, addr + n) lies inside [base, base + bytes), without overflow.
inline bool rangeInside(uint64_t base, uint64_t bytes, uint64_t addr, uint64_t n) {
  return addr >= base && addr - base <= bytes && n <= bytes - (addr - base);
}

// A live entry of a table as one consistent seqlock read.
struct LiveSegment {
  uint32_t entry;
  uint64_t sequence;
  uint64_t base;
  uint64_t bytes;
  uint64_t fd;
};

// Scans the used entries of `table` (the owner's or a peer's mapping of it) for a live segment
// holding [addr, addr + n): true and `*out` filled, or false. One load per used entry; an
// entry being rewritten meanwhile is skipped.
bool findLiveSegment(const SharedSegmentTable& table, uint64_t addr, uint64_t n, LiveSegment* out);

// Where a peer finds a process's table: /proc/<pid>/fd/<fd>, checked by inode and device.
struct SharedSegmentTableRef {
  int32_t fd = -1;  // -1: this process has no table (memfd unavailable)
  int32_t pad = 0;
  uint64_t ino = 0;
  uint64_t dev = 0;
};

// This process's table, created when needed, for a transport to hand to its peers; fd -1 when
// it cannot be created. Every call that returns a table takes a hold on it that
// releaseSharedSegmentTable gives back: the table (and its descriptor) lives while a hold or a
// segment does.
SharedSegmentTableRef holdSharedSegmentTable();
void releaseSharedSegmentTable();
size_t sharedSegmentTableBytes();

// `bytes` (rounded up to whole pages, zero-filled) of shareable memory, published in the
// table; nullptr when memfd_create, ftruncate or mmap fail or the process holds as many
// segments as it may (each keeps a descriptor open: at most a quarter of the soft
// RLIMIT_NOFILE, and kSharedSegmentEntries): the caller falls back to private memory, which
// peers reach by cross-memory attach like any other memory.
void* allocateSharedSegment(size_t bytes);
// Retires, unmaps and closes a segment of allocateSharedSegment; false (nothing done) when
// `base` is not the start of one.
bool freeSharedSegment(void* base);

// Whether [p, p + bytes) lies in one live, published segment of this process, so that a peer
// holding this process's table can map it: a lock-free read of the table, for a collective to
// tell its peers (the direct broadcast's split). Only while a transport holds the table.
bool isOwnSharedMemory(const void* p, size_t bytes);
// The same under the registry's mutex, at any time (tests).
bool isPublishedSharedSegment(const void* p, size_t bytes);

}  // namespace ridge
