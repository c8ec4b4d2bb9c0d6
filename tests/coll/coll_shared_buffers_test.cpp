// Shareable ridgeMemAlloc host buffers (issue 21, core/shared_segments.h): a peer of the same
// host maps them once and copies (or reduces) with plain loads and stores instead of a
// cross-memory-attach call per access. Forked ranks (tests/coll/rank_launcher.h), random
// inputs exact in float, poisoned outputs, a reference in double. Each case checks through the
// peer-memory counters which way the bytes went (PeerMemory::counters), and that a peer never
// reads through a mapping of a segment the owner freed. Links the static library to read the
// counters.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "coll/comm.h"
#include "core/shared_segments.h"
#include "rank_launcher.h"
#include "transports/transport.h"

namespace ridgetest {
namespace {

constexpr float kPoison = -12345.75f;

// Rank r's element i of call `call`: pseudo-random (a 64-bit mix of the three), multiples of
// 1/8 below 2^10, so sums of a few are exact.
float inputOf(int r, uint32_t call, size_t i) {
  uint64_t x = (uint64_t(uint32_t(r)) << 48) ^ (uint64_t(call) << 32) ^ i;
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<float>(x % 8192) / 8.0f;
}

// Every peer's counters of this rank's peer memory, summed.
ridge::PeerMemoryCounters peerCounters(ridgeComm_t comm) {
  ridge::PeerMemoryCounters sum;
  for (ridge::PeerMemory* pm : comm->peerMemory) {
    if (!pm) continue;
    const ridge::PeerMemoryCounters c = pm->counters();
    sum.mappedAccesses += c.mappedAccesses;
    sum.copiedAccesses += c.copiedAccesses;
    sum.segmentsMapped += c.segmentsMapped;
    sum.staleMappings += c.staleMappings;
  }
  return sum;
}

std::string countersText(const ridge::PeerMemoryCounters& c) {
  return "mapped=" + std::to_string(c.mappedAccesses) + " copied=" + std::to_string(c.copiedAccesses) +
         " segments=" + std::to_string(c.segmentsMapped) + " stale=" + std::to_string(c.staleMappings);
}

// A rank's two buffers: from ridgeMemAlloc (shareable) or from malloc (private).
struct Buffers {
  float* send = nullptr;
  float* recv = nullptr;
  bool shared = false;
  bool make(bool fromRidge, size_t elems, Reporter& rep) {
    shared = fromRidge;
    if (!fromRidge) {
      send = static_cast<float*>(std::malloc(elems * sizeof(float)));
      recv = static_cast<float*>(std::malloc(elems * sizeof(float)));
      return send && recv;
    }
    void *s = nullptr, *r = nullptr;
    if (ridgeMemAlloc(&s, elems * sizeof(float)) != ridgeSuccess ||
        ridgeMemAlloc(&r, elems * sizeof(float)) != ridgeSuccess) {
      rep.fail("ridgeMemAlloc", ridgeGetLastError(nullptr));
      return false;
    }
    send = static_cast<float*>(s);
    recv = static_cast<float*>(r);
    if (!ridge::isPublishedSharedSegment(send, elems * sizeof(float))) {
      rep.fail("ridgeMemAlloc", "the buffer is not a published shareable segment");
      return false;
    }
    return true;
  }
  ~Buffers() {
    if (shared) {
      (void)ridgeMemFree(send);
      (void)ridgeMemFree(recv);
    } else {
      std::free(send);
      std::free(recv);
    }
  }
};

enum class Op { AllGather, Broadcast, AlltoAll, AllReduce, Reduce, ReduceScatter, SendRecv };
const char* opName(Op op) {
  switch (op) {
    case Op::AllGather: return "allgather";
    case Op::Broadcast: return "broadcast";
    case Op::AlltoAll: return "alltoall";
    case Op::AllReduce: return "allreduce";
    case Op::Reduce: return "reduce";
    case Op::ReduceScatter: return "reducescatter";
    case Op::SendRecv: return "sendrecv";
  }
  return "?";
}

// Runs `op` on `count` elements per rank (root P-1 where there is one; send/recv: every rank
// sends to the next and receives from the previous, in a group) out of place in `b`, and
// checks the output; empty when right.
std::string runAndCheck(Op op, uint32_t call, size_t count, Buffers& b, ridgeComm_t comm, int me, int P) {
  const int root = P - 1;
  const bool blocksIn = op == Op::AlltoAll || op == Op::ReduceScatter;
  const bool blocksOut = op == Op::AllGather || op == Op::AlltoAll;
  const size_t inCount = blocksIn ? count * size_t(P) : count;
  const size_t outCount = blocksOut ? count * size_t(P) : count;
  for (size_t i = 0; i < inCount; ++i) b.send[i] = inputOf(me, call, i);
  for (size_t i = 0; i < outCount; ++i) b.recv[i] = kPoison;
  ridgeResult_t rc = ridgeSuccess;
  switch (op) {
    case Op::AllGather: rc = ridgeAllGather(b.send, b.recv, count, ridgeFloat32, comm, nullptr); break;
    case Op::Broadcast: rc = ridgeBroadcast(b.send, b.recv, count, ridgeFloat32, root, comm, nullptr); break;
    case Op::AlltoAll: rc = ridgeAlltoAll(b.send, b.recv, count, ridgeFloat32, comm, nullptr); break;
    case Op::AllReduce:
      rc = ridgeAllReduce(b.send, b.recv, count, ridgeFloat32, ridgeSum, comm, nullptr);
      break;
    case Op::Reduce:
      rc = ridgeReduce(b.send, b.recv, count, ridgeFloat32, ridgeSum, root, comm, nullptr);
      break;
    case Op::ReduceScatter:
      rc = ridgeReduceScatter(b.send, b.recv, count, ridgeFloat32, ridgeSum, comm, nullptr);
      break;
    case Op::SendRecv:
      rc = ridgeGroupStart();
      if (rc == ridgeSuccess) rc = ridgeSend(b.send, count, ridgeFloat32, (me + 1) % P, comm, nullptr);
      if (rc == ridgeSuccess) rc = ridgeRecv(b.recv, count, ridgeFloat32, (me + P - 1) % P, comm, nullptr);
      if (rc == ridgeSuccess) rc = ridgeGroupEnd();
      break;
  }
  const std::string what = std::string(opName(op)) + " count " + std::to_string(count) + ": ";
  if (rc != ridgeSuccess) return what + describeResult(rc, comm);
  if (op == Op::Reduce && me != root) return "";
  for (size_t i = 0; i < outCount; ++i) {
    double want = 0;
    const size_t block = i / count, at = i % count;
    switch (op) {
      case Op::AllGather: want = inputOf(int(block), call, at); break;
      case Op::Broadcast: want = inputOf(root, call, i); break;
      case Op::AlltoAll: want = inputOf(int(block), call, size_t(me) * count + at); break;
      case Op::AllReduce:
      case Op::Reduce:
        for (int r = 0; r < P; ++r) want += inputOf(r, call, i);
        break;
      case Op::ReduceScatter:
        for (int r = 0; r < P; ++r) want += inputOf(r, call, size_t(me) * count + i);
        break;
      case Op::SendRecv: want = inputOf((me + P - 1) % P, call, i); break;
    }
    if (static_cast<double>(b.recv[i]) != want)
      return what + "element " + std::to_string(i) + " is " + std::to_string(b.recv[i]) + ", expected " +
             std::to_string(want);
  }
  return "";
}

// A communicator whose collectives all take their direct (single-copy) algorithm, at every
// size; null with the child's exit code when init failed (2) or there is no peer memory here
// (0, a SKIP line reported).
int initDirect(int P, const ridgeUniqueId& id, int me, Reporter& rep, ridgeComm_t* out) {
  setenv("RIDGE_ALGO",
         "allreduce:0-:direct;allgather:0-:direct;broadcast:0-:direct;alltoall:0-:direct;"
         "reduce:0-:direct;reducescatter:0-:direct",
         1);
  ridgeComm_t comm = initRank(P, id, me, rep);
  if (!comm) return 2;
  if (comm->p2pCopy.minBytes == SIZE_MAX) {
    rep.line("SKIP single-copy peer memory (CMA) is not available here");
    ridgeCommDestroy(comm);
    return 0;
  }
  *out = comm;
  return 0;
}

void reportOrSkip(const LaunchResult& res, const char* what) {
  reportChildFailures(res, what);
  for (const RankResult& rr : res.ranks)
    if (!linesWith(rr, "SKIP ").empty()) GTEST_SKIP() << linesWith(rr, "SKIP ").front();
}

// Every collective and send/recv on buffers of `shared[rank]` kind, a count below a bounce
// chunk and one above (several chunks of the reductions). A rank whose peers all allocated with
// ridgeMemAlloc reads every byte of theirs through a mapping (no CMA call at all); a peer of a
// malloc rank reaches that rank's memory by CMA.
// `streamMin`: RIDGE_STREAM_MIN, low enough for the copies through a mapping to take their
// streaming-store form at these sizes (allgather, broadcast, alltoall, the allreduce's writes
// into the peers' outputs, the single-copy receive); empty: the default (above them).
void allCollectives(int P, std::vector<bool> shared, const char* streamMin = nullptr) {
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(P, 150, [&](int me, Reporter& rep) {
    if (streamMin) setenv("RIDGE_STREAM_MIN", streamMin, 1);
    ridgeComm_t comm = nullptr;
    if (const int rc = initDirect(P, id, me, rep, &comm); !comm) return rc;
    const size_t maxCount = 70001;  // floats: past a bounce chunk
    const size_t p2pCount = std::max<size_t>(maxCount, comm->p2pCopy.minBytes / sizeof(float) + 3);
    Buffers b;
    if (!b.make(shared[size_t(me)], std::max(maxCount, p2pCount) * size_t(P), rep)) return 1;
    uint32_t call = 0, collectives = 0;
    const uint64_t singleCopyBefore = comm->p2pCopy.singleCopyRecvs;
    for (Op op : {Op::AllGather, Op::Broadcast, Op::AlltoAll, Op::AllReduce, Op::Reduce, Op::ReduceScatter,
                  Op::SendRecv})
      for (size_t count : {size_t(4099), op == Op::SendRecv ? p2pCount : maxCount}) {
        std::string bad = runAndCheck(op, ++call, count, b, comm, me, P);
        if (!bad.empty()) rep.fail(opName(op), bad);
        if (op != Op::SendRecv) ++collectives;
      }
    const uint64_t directRuns = comm->algoRuns[static_cast<int>(ridge::Algo::Direct)];
    if (directRuns != collectives)
      rep.fail("paths", std::to_string(directRuns) + " of " + std::to_string(collectives) + " calls direct");
    if (comm->p2pCopy.singleCopyRecvs == singleCopyBefore) rep.fail("paths", "no send/recv went single copy");
    bool peersShared = true, peersPrivate = true;
    for (int r = 0; r < P; ++r)
      if (r != me) (shared[size_t(r)] ? peersPrivate : peersShared) = false;
    const ridge::PeerMemoryCounters c = peerCounters(comm);
    rep.line("INFO rank " + std::to_string(me) + ": " + countersText(c));
    if (peersShared && (c.copiedAccesses != 0 || c.mappedAccesses == 0))
      rep.fail("paths", "every peer's buffers are shareable, yet " + countersText(c));
    if (peersPrivate && c.mappedAccesses != 0)
      rep.fail("paths", "no peer's buffer is shareable, yet " + countersText(c));
    if (!peersShared && !peersPrivate && (c.copiedAccesses == 0 || c.mappedAccesses == 0))
      rep.fail("paths", "mixed peers should take both ways: " + countersText(c));
    // Each peer segment is mapped once (two buffers per peer), not per call.
    if (peersShared && c.segmentsMapped > 2 * uint64_t(P - 1))
      rep.fail("paths", "segments mapped more than once: " + countersText(c));
    ridgeCommDestroy(comm);
    return 0;
  });
  reportOrSkip(res, "shared buffers");
}

TEST(SharedBuffers, EveryCollectiveReadsPeersThroughTheMappingTwoRanks) {
  allCollectives(2, {true, true});
}
TEST(SharedBuffers, EveryCollectiveReadsPeersThroughTheMappingWithStreamingStores) {
  allCollectives(2, {true, true}, "16K");
}
TEST(SharedBuffers, EveryCollectiveReadsPeersThroughTheMappingThreeRanks) {
  allCollectives(3, {true, true, true});
}
// One rank's buffers from ridgeMemAlloc, the other's from malloc: each way where it applies.
TEST(SharedBuffers, MixedSharedAndPrivateBuffers) {
  allCollectives(2, {true, false});
}
TEST(SharedBuffers, MixedSharedAndPrivateBuffersThreeRanks) {
  allCollectives(3, {false, true, true});
}

// The direct broadcast's split on shareable buffers (plan::hostBroadcastRootShareMapped): both
// sides memcpy at one rate, so out of place the root pushes nothing (its own copy takes as long
// as a peer's whole read) and in place it writes 1/P of every peer's output, whatever the size;
// the CMA model's split (about a third in cache, out of place) left the root the slower side.
// Every root, odd counts, results checked; a mixed pair keeps the model's split.
void broadcastSplitOnSharedBuffers(int P, bool allShared) {
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(P, 120, [&](int me, Reporter& rep) {
    ridgeComm_t comm = nullptr;
    if (const int rc = initDirect(P, id, me, rep, &comm); !comm) return rc;
    const size_t maxCount = 262147;
    Buffers b;
    if (!b.make(allShared || me != P - 1, maxCount, rep)) return 1;
    uint32_t call = 100;
    for (bool inPlace : {false, true})
      for (int root = 0; root < P; ++root)
        for (size_t count : {size_t(4099), size_t(70001), maxCount}) {
          ++call;
          float* out = b.recv;
          float* in = inPlace ? b.recv : b.send;
          for (size_t i = 0; i < count; ++i) {
            if (me == root) in[i] = inputOf(root, call, i);
            if (me != root || !inPlace) out[i] = kPoison;
          }
          const uint64_t before = comm->broadcastPushedBytes;
          const std::string where = std::string(inPlace ? "in place" : "out of place") + " root " +
                                    std::to_string(root) + " count " + std::to_string(count);
          const ridgeResult_t rc = ridgeBroadcast(in, out, count, ridgeFloat32, root, comm, nullptr);
          if (rc != ridgeSuccess) {
            rep.fail(where, describeResult(rc, comm));
            continue;
          }
          for (size_t i = 0; i < count; ++i)
            if (static_cast<double>(out[i]) != inputOf(root, call, i)) {
              rep.fail(where, "element " + std::to_string(i) + " is " + std::to_string(out[i]));
              break;
            }
          const size_t bytes = count * sizeof(float);
          const double share =
              allShared ? (inPlace ? 1.0 / P : 0.0) : comm->algos.broadcastRootShare(bytes, !inPlace);
          const uint64_t expected =
              me != root ? 0 : uint64_t(P - 1) * (static_cast<size_t>(double(bytes) * share) & ~size_t{63});
          if (comm->broadcastPushedBytes - before != expected)
            rep.fail(where, "the root pushed " + std::to_string(comm->broadcastPushedBytes - before) +
                                " bytes, expected " + std::to_string(expected));
        }
    ridgeCommDestroy(comm);
    return 0;
  });
  reportOrSkip(res, "broadcast split on shareable buffers");
}

TEST(SharedBuffers, BroadcastSplitForMappedBuffersTwoRanks) {
  broadcastSplitOnSharedBuffers(2, true);
}
TEST(SharedBuffers, BroadcastSplitForMappedBuffersThreeRanks) {
  broadcastSplitOnSharedBuffers(3, true);
}
// The last rank's output is private: the CMA model's split, on every rank alike.
TEST(SharedBuffers, BroadcastSplitWithOnePrivateOutputKeepsTheModel) {
  broadcastSplitOnSharedBuffers(2, false);
}

// Rank 0 frees its send buffer after a peer mapped it and allocates a new one at the same
// address (mmap hands the hole back; bounded tries), with other contents: the peer must read
// the new contents. A peer that trusted its cached mapping (without the entry's sequence)
// would read the freed segment, which its mapping keeps alive with the old contents.
TEST(SharedBuffers, PeerNeverReadsAFreedSegmentAtAReusedAddress) {
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  const int P = 2;
  LaunchResult res = launchRanks(P, 120, [&](int me, Reporter& rep) {
    ridgeComm_t comm = nullptr;
    if (const int rc = initDirect(P, id, me, rep, &comm); !comm) return rc;
    const size_t count = 50000;
    const size_t bytes = count * sizeof(float);
    void *send = nullptr, *recv = nullptr, *flag = nullptr;  // flag: shareable too (no CMA at all)
    if (ridgeMemAlloc(&send, bytes) != ridgeSuccess || ridgeMemAlloc(&recv, bytes * P) != ridgeSuccess ||
        ridgeMemAlloc(&flag, sizeof(int)) != ridgeSuccess) {
      rep.fail("ridgeMemAlloc", ridgeGetLastError(nullptr));
      return 1;
    }
    auto gatherAndCheck = [&](uint32_t call, const char* when) {
      float* s = static_cast<float*>(send);
      float* r = static_cast<float*>(recv);
      for (size_t i = 0; i < count; ++i) s[i] = inputOf(me, call, i);
      for (size_t i = 0; i < count * P; ++i) r[i] = kPoison;
      ridgeResult_t rc = ridgeAllGather(s, r, count, ridgeFloat32, comm, nullptr);
      if (rc != ridgeSuccess) {
        rep.fail(when, describeResult(rc, comm));
        return;
      }
      for (size_t i = 0; i < count * P; ++i)
        if (static_cast<double>(r[i]) != inputOf(int(i / count), call, i % count)) {
          rep.fail(when, "element " + std::to_string(i) + " is " + std::to_string(r[i]) + ", expected " +
                             std::to_string(inputOf(int(i / count), call, i % count)));
          return;
        }
    };
    gatherAndCheck(1, "before the free");
    // Rank 0 replaces its send buffer by one at the same address; the other rank's stays.
    int reused = 1;
    if (me == 0) {
      void* const old = send;
      std::vector<void*> others;
      if (ridgeMemFree(old) != ridgeSuccess) rep.fail("ridgeMemFree", ridgeGetLastError(nullptr));
      send = nullptr;
      for (int tries = 0; tries < 64 && send == nullptr; ++tries) {
        void* p = nullptr;
        if (ridgeMemAlloc(&p, bytes) != ridgeSuccess) break;
        if (p == old)
          send = p;
        else
          others.push_back(p);  // held, so the next try gets another address
      }
      for (void* p : others) (void)ridgeMemFree(p);
      reused = send != nullptr;
      if (!reused && ridgeMemAlloc(&send, bytes) != ridgeSuccess) rep.fail("ridgeMemAlloc", "again");
    }
    // Both ranks learn whether the address came back (a 1-element allreduce of the flag).
    int* both = static_cast<int*>(flag);
    *both = reused;
    if (ridgeAllReduce(both, both, 1, ridgeInt32, ridgeMin, comm, nullptr) != ridgeSuccess)
      rep.fail("allreduce", ridgeGetLastError(comm));
    gatherAndCheck(2, "after the free and the new allocation");
    const ridge::PeerMemoryCounters c = peerCounters(comm);
    rep.line("INFO rank " + std::to_string(me) + ": " + countersText(c));
    if (me == 1 && *both && c.staleMappings == 0)
      rep.fail("stale", "the mapping of the freed segment was not dropped: " + countersText(c));
    if (c.copiedAccesses != 0) rep.fail("paths", "a CMA copy on shareable buffers: " + countersText(c));
    if (me == 0 && !*both) rep.line("SKIP the allocator never gave the freed address back");
    (void)ridgeMemFree(send);
    (void)ridgeMemFree(recv);
    (void)ridgeMemFree(flag);
    ridgeCommDestroy(comm);
    return 0;
  });
  reportOrSkip(res, "reused address");
}

// ---- ridgeMemFree's validation and the table, in this process --------------------------------

int openDescriptors() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d)) ++n;
    closedir(d);
  }
  return n;
}

TEST(SharedBuffers, MemFreeRefusesWhatItDidNotAllocate) {
  const int fdsBefore = openDescriptors();
  void* p = nullptr;
  ASSERT_EQ(ridgeMemAlloc(&p, 10000), ridgeSuccess) << ridgeGetLastError(nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  EXPECT_TRUE(ridge::isPublishedSharedSegment(p, 10000)) << "host memory of ridgeMemAlloc is shareable";
  EXPECT_TRUE(ridge::isPublishedSharedSegment(static_cast<char*>(p) + 12000, 288)) << "rounded up to pages";
  EXPECT_FALSE(ridge::isPublishedSharedSegment(p, 3 * 4096 + 1));
  // Zero-filled, writable.
  const auto* bytes = static_cast<const unsigned char*>(p);
  size_t nonzero = 0;
  for (size_t i = 0; i < 10000; ++i) nonzero += bytes[i] != 0;
  EXPECT_EQ(nonzero, 0u);
  std::memset(p, 0x5A, 10000);
  // Inside the segment, not its start: refused, and the segment lives on.
  EXPECT_EQ(ridgeMemFree(static_cast<char*>(p) + 4096), ridgeInvalidArgument);
  EXPECT_NE(std::string(ridgeGetLastError(nullptr)).find("ridgeMemAlloc"), std::string::npos);
  EXPECT_TRUE(ridge::isPublishedSharedSegment(p, 10000));
  void* foreign = std::malloc(64);
  EXPECT_EQ(ridgeMemFree(foreign), ridgeInvalidArgument);
  std::free(foreign);
  EXPECT_EQ(ridgeMemFree(nullptr), ridgeInvalidArgument);
  EXPECT_EQ(static_cast<const unsigned char*>(p)[9999], 0x5A);
  EXPECT_EQ(ridgeMemFree(p), ridgeSuccess);
  EXPECT_FALSE(ridge::isPublishedSharedSegment(p, 1)) << "a freed segment leaves the table";
  EXPECT_EQ(ridgeMemFree(p), ridgeInvalidArgument) << "twice";
  // Neither the segment's descriptor nor the table's outlives the last segment.
  EXPECT_EQ(openDescriptors(), fdsBefore);
}

// This process's table, mapped read-only as a peer maps it; null when that fails.
const ridge::SharedSegmentTable* mapTable(const ridge::SharedSegmentTableRef& ref) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", ref.fd);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  void* map = mmap(nullptr, ridge::sharedSegmentTableBytes(), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return nullptr;
  const auto* table = static_cast<const ridge::SharedSegmentTable*>(map);
  return table->magic == ridge::kSharedSegmentTableMagic ? table : nullptr;
}

// The table a peer maps lists every live segment once, with a sequence that changes on every
// free and allocation, so a peer never takes a new segment for an old one.
TEST(SharedBuffers, TableEntriesChangeSequenceOnEveryFree) {
  const ridge::SharedSegmentTableRef ref = ridge::holdSharedSegmentTable();
  if (ref.fd < 0) GTEST_SKIP() << "no memfd here";
  const ridge::SharedSegmentTable* table = mapTable(ref);
  ASSERT_NE(table, nullptr);
  auto entryOf = [&](const void* p) -> int {
    for (uint32_t i = 0; i < table->usedEntries.load(); ++i)
      if (table->entries[i].sequence.load() % 2 == 0 &&
          table->entries[i].base.load() == reinterpret_cast<uint64_t>(p))
        return static_cast<int>(i);
    return -1;
  };
  std::vector<uint64_t> seen;
  for (int round = 0; round < 4; ++round) {
    void* p = nullptr;
    ASSERT_EQ(ridgeMemAlloc(&p, 8192), ridgeSuccess);
    const int e = entryOf(p);
    ASSERT_GE(e, 0) << "round " << round << ": the new segment is not in the table";
    EXPECT_EQ(table->entries[e].bytes.load(), 8192u);
    const uint64_t seq = table->entries[e].sequence.load();
    for (uint64_t s : seen) EXPECT_NE(s, seq) << "a sequence value came back";
    seen.push_back(seq);
    ASSERT_EQ(ridgeMemFree(p), ridgeSuccess);
    EXPECT_EQ(entryOf(p), -1) << "the freed segment is still listed";
    EXPECT_NE(table->entries[e].sequence.load(), seq);
  }
  munmap(const_cast<ridge::SharedSegmentTable*>(table), ridge::sharedSegmentTableBytes());
  ridge::releaseSharedSegmentTable();
}

// A forked child must not write into its parent's table (which it inherits mapped): its first
// call makes a table of its own, lists what it inherited and what it allocates there, and the
// parent's table never lists the child's buffers.
TEST(SharedBuffers, ForkedChildKeepsATableOfItsOwn) {
  void* inherited = nullptr;
  ASSERT_EQ(ridgeMemAlloc(&inherited, 8192), ridgeSuccess);
  const ridge::SharedSegmentTableRef parentRef = ridge::holdSharedSegmentTable();
  if (parentRef.fd < 0) GTEST_SKIP() << "no memfd here";
  LaunchResult res = launchRanks(1, 30, [&](int, Reporter& rep) {
    void* own = nullptr;
    if (ridgeMemAlloc(&own, 8192) != ridgeSuccess) {
      rep.fail("ridgeMemAlloc", ridgeGetLastError(nullptr));
      return 1;
    }
    const ridge::SharedSegmentTableRef childRef = ridge::holdSharedSegmentTable();
    if (childRef.fd < 0 || childRef.ino == parentRef.ino)
      rep.fail("table", "the child lists its buffers in its parent's table");
    if (!ridge::isPublishedSharedSegment(own, 8192)) rep.fail("table", "the child's buffer is not listed");
    if (!ridge::isPublishedSharedSegment(inherited, 8192))
      rep.fail("table", "the inherited buffer is not listed in the child's table");
    rep.line("CHILD " + std::to_string(reinterpret_cast<uintptr_t>(own)));
    ridge::releaseSharedSegmentTable();
    return 0;
  });
  reportChildFailures(res, "fork");
  ASSERT_EQ(res.ranks.size(), 1u);
  const std::vector<std::string> child = linesWith(res.ranks[0], "CHILD ");
  ASSERT_EQ(child.size(), 1u);
  const uint64_t childBuffer = std::strtoull(child[0].c_str(), nullptr, 10);
  const ridge::SharedSegmentTable* table = mapTable(parentRef);
  ASSERT_NE(table, nullptr);
  int listedInherited = 0;
  for (uint32_t i = 0; i < table->usedEntries.load(); ++i) {
    if (table->entries[i].sequence.load() % 2 != 0) continue;
    EXPECT_NE(table->entries[i].base.load(), childBuffer) << "the child's buffer is in the parent's table";
    listedInherited += table->entries[i].base.load() == reinterpret_cast<uint64_t>(inherited);
  }
  EXPECT_EQ(listedInherited, 1);
  munmap(const_cast<ridge::SharedSegmentTable*>(table), ridge::sharedSegmentTableBytes());
  ridge::releaseSharedSegmentTable();
  EXPECT_EQ(ridgeMemFree(inherited), ridgeSuccess);
}

// Every shareable buffer keeps a descriptor open: a process allocating many buffers must not
// run out of descriptors for its own sockets and files. Under a soft RLIMIT_NOFILE of 64 at
// most 16 buffers are shareable; the rest are private memory, as usable and as freeable.
TEST(SharedBuffers, ShareableBuffersLeaveMostDescriptorsToTheApplication) {
  LaunchResult res = launchRanks(1, 30, [&](int, Reporter& rep) {
    rlimit rl{};
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = 64;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
      rep.fail("setrlimit", std::strerror(errno));
      return 1;
    }
    const int fdsBefore = openDescriptors();
    std::vector<void*> buffers;
    int shareable = 0;
    for (int i = 0; i < 40; ++i) {
      void* p = nullptr;
      if (ridgeMemAlloc(&p, 4096) != ridgeSuccess) {
        rep.fail("ridgeMemAlloc " + std::to_string(i), ridgeGetLastError(nullptr));
        break;
      }
      static_cast<char*>(p)[4095] = 1;
      shareable += ridge::isPublishedSharedSegment(p, 4096);
      buffers.push_back(p);
    }
    // One descriptor per shareable buffer and one for the table.
    if (shareable != 16) rep.fail("cap", std::to_string(shareable) + " of 40 buffers shareable, expected 16");
    if (openDescriptors() > fdsBefore + 17)
      rep.fail("descriptors", std::to_string(openDescriptors() - fdsBefore) + " held by 40 buffers");
    for (void* p : buffers)
      if (ridgeMemFree(p) != ridgeSuccess) rep.fail("ridgeMemFree", ridgeGetLastError(nullptr));
    if (openDescriptors() != fdsBefore) rep.fail("descriptors", "left open after every buffer was freed");
    return 0;
  });
  reportChildFailures(res, "descriptor cap");
}

}  // namespace
}  // namespace ridgetest

#include "api_test_main.h"
