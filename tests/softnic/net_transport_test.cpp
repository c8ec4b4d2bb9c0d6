// The net transport over softnic, two ranks as threads of this process. Part one, the
// direct extension (transport.h): chunks sent from caller memory and chunks landing at
// destinations the receiver declared, mixed with slot chunks on both sides, exact under
// faults, each buffer registered once, and withdrawal while chunks are queued or
// destinations declared. Part two, the receive-side GPUDirect RDMA flush: two ranks as threads
// of this process, each with its own software NIC, connected through the transport table
// (RIDGE_NET=softnic, RIDGE_SHM=0). Receive rings come from a memfd-backed allocator that
// stands in for GPU memory (registered through device_registration as a dma-buf), or from
// host memory. Checked: exact bytes and metadata of every chunk; one flush READ per chunk
// that lands in device memory when RIDGE_GDR_FLUSH (or, for auto, the device runtime's
// write ordering) requires it and none otherwise; one loopback QP made at connect, never
// per chunk; a failing flush withholds the chunk and fails the peer with a clear error.
#include "transports/net/net_transport.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "cq_polling.h"
#include "device/emulated_runtime.h"
#include "transports/net/device_memory.h"
#include "transports/net/device_registration.h"
#include "transports/softnic/softnic.h"
#include "transports/transport.h"

namespace ridge {
namespace {

using softnic_test::nowSec;

// "GPU memory" for the receive rings: each allocation is a memfd mapped shared, reported as
// a device allocation and exported as (a dup of) its fd, as a GPU driver exports dma-buf.
class MemfdRingAllocator final : public NetRingAllocator, public DeviceMemoryRegistrar {
 public:
  Status allocate(size_t bytes, void** out) override {
    const int fd = static_cast<int>(syscall(SYS_memfd_create, "ridge-test-ring", 0));
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) return systemError("memfd ring");
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return systemError("mmap of a memfd ring");
    std::lock_guard<std::mutex> g(mu_);
    allocs_.push_back({reinterpret_cast<uintptr_t>(p), bytes, fd});
    *out = p;
    return Status::ok();
  }
  void release(void* p, size_t bytes) override {
    std::lock_guard<std::mutex> g(mu_);
    for (size_t i = 0; i < allocs_.size(); ++i)
      if (allocs_[i].base == reinterpret_cast<uintptr_t>(p)) {
        close(allocs_[i].fd);
        allocs_.erase(allocs_.begin() + static_cast<ptrdiff_t>(i));
        break;
      }
    munmap(p, bytes);
  }
  DeviceMemoryRegistrar* registrar() override { return this; }
  int device() const override { return 0; }
  const char* name() const override { return "memfd rings"; }
  bool deviceAllocation(const void* addr, uintptr_t* base, size_t* bytes) override {
    std::lock_guard<std::mutex> g(mu_);
    const auto a = reinterpret_cast<uintptr_t>(addr);
    for (const Alloc& al : allocs_)
      if (a >= al.base && a < al.base + al.bytes) {
        *base = al.base;
        *bytes = al.bytes;
        return true;
      }
    return false;
  }
  Status exportDmaBuf(uintptr_t base, size_t bytes, int* fd) override {
    std::lock_guard<std::mutex> g(mu_);
    for (const Alloc& al : allocs_)
      if (al.base == base && al.bytes == bytes) {
        ++exports;
        *fd = dup(al.fd);
        return Status::ok();
      }
    return makeError(ridgeInvalidArgument, "export of a range that is not an allocation");
  }
  std::atomic<int> exports{0};

 private:
  struct Alloc {
    uintptr_t base;
    size_t bytes;
    int fd;
  };
  std::mutex mu_;
  std::vector<Alloc> allocs_;
};

struct RankOutcome {
  NetTransportStats stats;
  uint64_t chunksChecked = 0;
  uint64_t mismatches = 0;
  std::string error;        // a failed step
  std::string peerFailure;  // what checkPeer said (error tests)
  bool leaveEarly = false;  // set by a body: destroy the transport before the final barrier
};

constexpr int kSlotBytes = 64 << 10;
constexpr uint32_t kSlots = 4;

uint8_t patternByte(uint32_t chunk, uint32_t i) {
  return static_cast<uint8_t>((chunk * 2654435761u + i * 40503u + (i >> 7)) >> 5);
}
uint32_t chunkBytes(uint32_t chunk) {
  // 0 bytes, 1 byte, a full slot, and sizes in between.
  if (chunk % 11 == 0) return 0;
  if (chunk % 11 == 1) return 1;
  if (chunk % 11 == 2) return kSlotBytes;
  return (chunk * 7919u) % kSlotBytes;
}

void idle(Transport* t) {
  t->waitForActivity(
      1000000, [](void*) { return true; }, nullptr);
}

// What one rank of a pair does once the net transport is up.
using RankBody = std::function<void(int rank, Transport* t, Bootstrap* bs, RankOutcome& o)>;

// Two ranks as threads, each with its own softnic NIC, connected by the net transport with
// `slots` slots of kSlotBytes; `faults` for RIDGE_SOFTNIC_FAULTS (both NICs). Each rank runs
// `body`, records its transport's stats and meets the other in a barrier before tearing down
// (the barrier gives up when `abortFlag` is set, e.g. by a rank that failed its peer).
// `perInstance`: `alloc` goes to each transport through TransportSetup::netRingAllocator
// instead of the process-wide setter.
void runPair(const char* flushSetting, NetRingAllocator* alloc, const char* faults, const RankBody& body,
             RankOutcome out[2], std::atomic<bool>* abortFlag, bool perInstance = false,
             uint32_t slots = kSlots) {
  setenv("RIDGE_SOCKET_IFNAME", "lo", 1);
  setenv("RIDGE_NET", "softnic", 1);
  setenv("RIDGE_SHM", "0", 1);
  setenv("RIDGE_GDR_MODE", "off", 1);
  setenv("RIDGE_RDMA_SLOTS", std::to_string(slots).c_str(), 1);
  setenv("RIDGE_RDMA_SLOT_BYTES", std::to_string(kSlotBytes).c_str(), 1);
  setenv("RIDGE_GDR_FLUSH", flushSetting, 1);
  setenv("RIDGE_SOFTNIC_FAULTS", faults, 1);
  setenv("RIDGE_SOFTNIC_RTO_US", "1000", 1);
  setNetRingAllocator(perInstance ? nullptr : alloc);
  ridgeUniqueId id;
  ASSERT_TRUE(createUniqueId(&id).isOk());
  const TransportTable* net = nullptr;
  for (const TransportTable* t : registeredTransports())
    if (std::strcmp(t->name, "net") == 0) net = t;
  ASSERT_NE(net, nullptr);
  auto rankMain = [&](int rank) {
    RankOutcome& o = out[rank];
    std::unique_ptr<Bootstrap> bs;
    Status s = Bootstrap::connect(id, rank, 2, 20, abortFlag, &bs);
    if (!s.isOk()) {
      o.error = "bootstrap: " + s.message();
      return;
    }
    TransportSetup setup;
    setup.rank = rank;
    setup.nranks = 2;
    setup.hostHashOfRank = {hostHash(), hostHash()};
    setup.pidOfRank = {getpid(), getpid()};
    setup.bootstrap = bs.get();
    setup.abortFlag = abortFlag;
    setup.timeoutSeconds = 20;
    if (perInstance) setup.netRingAllocator = alloc;
    std::unique_ptr<Transport> t;
    s = net->create(setup, &t);
    if (!s.isOk()) {
      o.error = "create: " + s.message();
      return;
    }
    body(rank, t.get(), bs.get(), o);
    o.stats = netTransportStats(t.get());
    if (o.leaveEarly) t.reset();  // a finished rank that leaves without waiting for its peer
    (void)bs->barrier();
    t.reset();
  };
  std::thread r0(rankMain, 0), r1(rankMain, 1);
  r0.join();
  r1.join();
  setNetRingAllocator(nullptr);
  unsetenv("RIDGE_SOFTNIC_FAULTS");
  ASSERT_TRUE(out[0].error.empty()) << out[0].error;
  ASSERT_TRUE(out[1].error.empty()) << out[1].error;
}

// Sends chunks 0..chunks-1 (chunkBytes, patternByte, every third one ends a message) from
// slots to `peer`, then waits until they completed; bounded by `end`.
void sendPatternChunks(Transport* t, int peer, uint32_t chunks, double end) {
  SendConnector* sc = t->sendTo(peer);
  for (uint32_t c = 0; c < chunks && nowSec() < end;) {
    char* slot = static_cast<char*>(sc->tryAcquire());
    if (!slot) {
      idle(t);
      continue;
    }
    const uint32_t n = chunkBytes(c);
    for (uint32_t i = 0; i < n; ++i) slot[i] = static_cast<char>(patternByte(c, i));
    sc->post(n, c % 3 == 2);
    ++c;
  }
  while (!sc->sendsComplete() && nowSec() < end) idle(t);
}

// Receives and checks up to `chunks` chunks from `peer` through slots: what
// sendPatternChunks sent, or (`fullSlots`) full slots with chunk g holding patternByte(g, i).
// Stops at `end`, when `stop` is set, or at a peer failure (recorded in o.peerFailure).
void receivePatternChunks(Transport* t, int peer, uint32_t chunks, double end, RankOutcome& o,
                          bool fullSlots = false, const std::atomic<bool>* stop = nullptr) {
  RecvConnector* rc = t->recvFrom(peer);
  for (uint32_t c = 0; c < chunks && nowSec() < end && !(stop && stop->load());) {
    SlotInfo info;
    const uint8_t* slot = static_cast<const uint8_t*>(rc->tryPeek(&info));
    if (!slot) {
      Status failure = t->checkPeer(peer);
      if (!failure.isOk()) {
        o.peerFailure = failure.message();
        break;
      }
      idle(t);
      continue;
    }
    const uint32_t n = fullSlots ? kSlotBytes : chunkBytes(c);
    bool ok = info.bytes == n && (fullSlots || info.lastOfMessage == (c % 3 == 2));
    for (uint32_t i = 0; ok && i < n; ++i) ok = slot[i] == patternByte(c, i);
    o.mismatches += ok ? 0 : 1;
    ++o.chunksChecked;
    rc->release();
    ++c;
  }
}

// Fills `buf` (kSlots full slots, chunk g holding patternByte(g, i)) and posts it as kSlots
// direct chunks; returns whether some were still queued right after (what the withdrawal
// and failure tests need to test anything).
bool postDirectPatternSlots(SendConnector* sc, std::vector<uint8_t>& buf, RankOutcome& out) {
  buf.assign(kSlots * kSlotBytes, 0);
  for (uint32_t g = 0; g < kSlots; ++g) {
    uint8_t* src = buf.data() + static_cast<size_t>(g) * kSlotBytes;
    for (uint32_t i = 0; i < kSlotBytes; ++i) src[i] = patternByte(g, i);
    if (!sc->tryPostDirect(src, kSlotBytes, false)) out.error = "tryPostDirect refused a free position";
  }
  return !sc->sendsComplete();
}

// Rank 0 sends `chunks` chunks from slots to rank 1, which checks each through slots.
// `breakFlush`: the receiver's flush reads are made to fail; it then expects no chunk and a
// peer failure, and sends only what fits its ring.
void runSlotStream(const char* flushSetting, NetRingAllocator* alloc, uint32_t chunks, bool breakFlush,
                   RankOutcome out[2]) {
  std::atomic<bool> abortFlag{false};
  runPair(
      flushSetting, alloc, "",
      [&](int rank, Transport* t, Bootstrap*, RankOutcome& o) {
        if (rank == 1 && breakFlush) netBreakFlushReadsForTesting(t);
        const double end = nowSec() + (breakFlush ? 3 : 30);
        if (rank == 0) {
          sendPatternChunks(t, 1, breakFlush ? std::min<uint32_t>(chunks, kSlots) : chunks, end);
          return;
        }
        receivePatternChunks(t, 0, chunks, end, o);
        // Done: releases the sender from its barrier (after a failed flush this rank never
        // returns credits, so the sender's last writes may stay unreleased).
        if (breakFlush) abortFlag.store(true);
      },
      out, &abortFlag);
}

// ---- direct extension ------------------------------------------------------------------

// How rank 1 declares FIFO position g: 0 a destination with a slot's room, 1 no destination
// (a slot), 2 a destination of exactly the chunk's size, 3 one too small (the chunk must go
// to the slot and leave the destination alone).
uint32_t declKind(uint32_t g) {
  return g % 4;
}
uint32_t capacityFor(uint32_t g) {
  const uint32_t n = chunkBytes(g);
  switch (declKind(g)) {
    case 0: return kSlotBytes;
    case 2: return n;
    case 3: return n / 2;
    default: return 0;
  }
}
bool landsDirect(uint32_t g) {
  return declKind(g) != 1 && chunkBytes(g) > 0 && capacityFor(g) >= chunkBytes(g);
}
// Rank 0 posts position g from caller memory unless g % 3 == 0 (a slot).
bool sentDirect(uint32_t g) {
  return g % 3 != 0;
}

// Waits (bounded) until `done` holds. The transport progresses only inside connector calls
// (as under the executor), so each round makes one.
template <class Pred>
bool waitFor(Transport* t, int peer, Pred done, double seconds = 10) {
  const double end = nowSec() + seconds;
  while (!done()) {
    if (nowSec() > end) return false;
    (void)t->sendTo(peer)->sendsComplete();
    idle(t);
  }
  return true;
}

// Rounds of kSlots positions: rank 1 declares them (kinds above) and waits until its adverts
// were acknowledged, rank 0 waits until it has them, then sends the round (slot or direct
// chunks) and rank 1 checks every chunk's bytes, flags and where it landed. Poisoned
// destinations show that nothing landed where it should not.
void runDirectRounds(const char* faults, RankOutcome out[2], uint64_t* expectDirect) {
  constexpr uint32_t kRounds = 30;
  constexpr uint32_t kTotal = kRounds * kSlots;
  *expectDirect = 0;
  for (uint32_t g = 0; g < kTotal; ++g) *expectDirect += landsDirect(g);
  std::atomic<bool> abortFlag{false};
  runPair(
      "auto", nullptr, faults,
      [&](int rank, Transport* t, Bootstrap* bs, RankOutcome& o) {
        const uint64_t regsBefore = netTransportStats(t).registrations;
        std::vector<uint8_t> buf(static_cast<size_t>(kTotal) * kSlotBytes, 0xA5);
        uint64_t advertsBefore = 0;
        for (uint32_t r = 0; r < kRounds && o.error.empty(); ++r) {
          const uint32_t first = r * kSlots;
          if (rank == 1) {
            RecvConnector* rc = t->recvFrom(0);
            for (uint32_t g = first; g < first + kSlots; ++g) {
              uint8_t* dst = declKind(g) == 1 ? nullptr : buf.data() + static_cast<size_t>(g) * kSlotBytes;
              if (!rc->tryExpect(dst, capacityFor(g))) o.error = "tryExpect refused with the FIFO empty";
            }
            if (!waitFor(t, 1 - rank, [&] {
                  NetTransportStats st = netTransportStats(t);
                  return st.advertsCompleted == st.advertsSent;
                }))
              o.error = "adverts were never acknowledged";
          }
          (void)bs->barrier();
          if (rank == 0) {
            uint64_t want = advertsBefore;
            for (uint32_t g = first; g < first + kSlots; ++g) want += declKind(g) != 1 && capacityFor(g) > 0;
            if (!waitFor(t, 1 - rank, [&] { return netTransportStats(t).advertsReceived == want; }))
              o.error = "adverts never arrived";
            advertsBefore = want;
            SendConnector* sc = t->sendTo(1);
            const double end = nowSec() + 20;
            for (uint32_t g = first; g < first + kSlots && nowSec() < end;) {
              const uint32_t n = chunkBytes(g);
              uint8_t* src = buf.data() + static_cast<size_t>(g) * kSlotBytes;
              for (uint32_t i = 0; i < n; ++i) src[i] = patternByte(g, i);
              bool posted = false;
              if (sentDirect(g)) {
                posted = sc->tryPostDirect(src, n, g % 5 == 4);
              } else if (void* slot = sc->tryAcquire()) {
                std::memcpy(slot, src, n);
                sc->post(n, g % 5 == 4);
                posted = true;
              }
              if (posted)
                ++g;
              else
                idle(t);
            }
            if (!waitFor(t, 1 - rank, [&] { return sc->sendsComplete(); })) o.error = "sends never completed";
          } else {
            RecvConnector* rc = t->recvFrom(0);
            const double end = nowSec() + 20;
            for (uint32_t g = first; g < first + kSlots;) {
              SlotInfo info;
              const uint8_t* got = static_cast<const uint8_t*>(rc->tryPeek(&info));
              if (!got) {
                if (!t->checkPeer(0).isOk() || nowSec() > end) {
                  o.error = "chunk " + std::to_string(g) + " never arrived";
                  break;
                }
                idle(t);
                continue;
              }
              const uint32_t n = chunkBytes(g);
              const uint8_t* dst = buf.data() + static_cast<size_t>(g) * kSlotBytes;
              bool ok = info.bytes == n && info.lastOfMessage == (g % 5 == 4);
              ok = ok && (got == dst) == landsDirect(g);
              for (uint32_t i = 0; ok && i < n; ++i) ok = got[i] == patternByte(g, i);
              // Nothing beyond the chunk, and nothing at all where it did not land.
              for (uint32_t i = landsDirect(g) ? n : 0; ok && i < kSlotBytes; ++i) ok = dst[i] == 0xA5;
              o.mismatches += ok ? 0 : 1;
              ++o.chunksChecked;
              rc->release();
              ++g;
            }
          }
          (void)bs->barrier();
        }
        // One registration for the caller buffer (two if it straddles a 64 MiB window),
        // however many chunks used it.
        const uint64_t regs = netTransportStats(t).registrations - regsBefore;
        if (regs < 1 || regs > 2) o.error = "caller buffer registered " + std::to_string(regs) + " times";
      },
      out, &abortFlag);
}

void expectDirectRoundsExact(const char* faults) {
  const softnic::Counters before = softnic::processCounters();
  RankOutcome o[2];
  uint64_t expectDirect = 0;
  runDirectRounds(faults, o, &expectDirect);
  EXPECT_TRUE(o[0].error.empty()) << o[0].error;
  EXPECT_TRUE(o[1].error.empty()) << o[1].error;
  EXPECT_EQ(o[1].chunksChecked, 30u * kSlots);
  EXPECT_EQ(o[1].mismatches, 0u);
  uint64_t directSends = 0;
  for (uint32_t g = 0; g < 30 * kSlots; ++g) directSends += sentDirect(g);
  EXPECT_EQ(o[0].stats.directSends, directSends);
  EXPECT_EQ(o[0].stats.chunksToAdvertised, expectDirect);
  EXPECT_EQ(o[1].stats.chunksLandedDirect, expectDirect);
  EXPECT_GT(expectDirect, 20u);
  EXPECT_EQ(o[0].stats.advertsLate, 0u);
  EXPECT_EQ(o[0].stats.withdrawals + o[1].stats.withdrawals, 0u);
  std::printf("sender: %s\nreceiver: %s\n", netStatsToString(o[0].stats).c_str(),
              netStatsToString(o[1].stats).c_str());
  if (*faults) {
    const softnic::Counters after = softnic::processCounters();
    EXPECT_GT(after.injectedDrops, before.injectedDrops);
    EXPECT_GT(after.injectedDups, before.injectedDups);
    EXPECT_GT(after.injectedReorders, before.injectedReorders);
    EXPECT_GT(after.retransmittedPackets, before.retransmittedPackets);
  }
}

TEST(NetDirect, SlotAndDirectChunksOnBothSidesLandExactly) {
  expectDirectRoundsExact("");
}

TEST(NetDirect, SlotAndDirectChunksExactUnderFaults) {
  expectDirectRoundsExact("drop=0.03,dup=0.03,reorder=0.03,delay=0.02:200us,seed=13");
}

// Direct chunks still queued when the send is withdrawn: the peer is failed and the NIC
// reads nothing more from the buffer, which the sender then overwrites; whatever rank 1
// receives is what was sent before. Heavy loss keeps the chunks queued.
TEST(NetDirect, WithdrawWhileDirectChunksAreQueued) {
  std::atomic<bool> abortFlag{false};
  RankOutcome o[2];
  bool wereQueued = false;
  runPair(
      "auto", nullptr, "drop=0.4,seed=21",
      [&](int rank, Transport* t, Bootstrap*, RankOutcome& out) {
        std::vector<uint8_t> buf;
        if (rank == 0) {
          SendConnector* sc = t->sendTo(1);
          wereQueued = postDirectPatternSlots(sc, buf, out);
          sc->withdrawDirect();
          std::memset(buf.data(), 0xEE, buf.size());  // the caller reuses its buffer at once
          Status peer = t->checkPeer(1);
          out.peerFailure = peer.isOk() ? "" : peer.message();
          // Withdrawn chunks never complete: a caller waiting for its sends learns the
          // failure from checkPeer instead of returning success.
          if (sc->sendsComplete()) out.error = "withdrawn chunks counted as sent";
          return;
        }
        receivePatternChunks(t, 0, kSlots, nowSec() + 1.5, out, true);
        abortFlag.store(true);  // the sender's connection is broken: skip the drain
      },
      o, &abortFlag);
  ASSERT_TRUE(wereQueued) << "every chunk completed before the withdrawal (nothing was tested)";
  EXPECT_TRUE(o[0].error.empty()) << o[0].error;
  EXPECT_EQ(o[0].stats.withdrawals, 1u);
  EXPECT_NE(o[0].peerFailure.find("withdrawn"), std::string::npos) << o[0].peerFailure;
  EXPECT_EQ(o[1].mismatches, 0u) << "bytes written into the buffer after withdrawDirect reached the peer";
  EXPECT_LT(o[1].chunksChecked, kSlots);
}

// Destinations declared and advertised, then withdrawn before the sender sends: the sender
// (which has the adverts and uses them) must not land anything in them afterwards.
TEST(NetDirect, WithdrawnDestinationsAreNeverWritten) {
  std::atomic<bool> abortFlag{false};
  RankOutcome o[2];
  std::vector<uint8_t> dst(kSlots * kSlotBytes, 0);
  runPair(
      "auto", nullptr, "",
      [&](int rank, Transport* t, Bootstrap* bs, RankOutcome& out) {
        if (rank == 1) {
          RecvConnector* rc = t->recvFrom(0);
          for (uint32_t g = 0; g < kSlots; ++g)
            if (!rc->tryExpect(dst.data() + static_cast<size_t>(g) * kSlotBytes, kSlotBytes))
              out.error = "tryExpect refused";
          if (!waitFor(t, 1 - rank, [&] {
                NetTransportStats st = netTransportStats(t);
                return st.advertsCompleted == kSlots;
              }))
            out.error = "adverts were never acknowledged";
          rc->withdrawDirect();
          Status peer = t->checkPeer(0);
          out.peerFailure = peer.isOk() ? "" : peer.message();
          std::memset(dst.data(), 0x5A, dst.size());
          (void)bs->barrier();  // the sender sends now
          (void)bs->barrier();  // and has waited
          for (uint8_t b : dst) out.mismatches += b != 0x5A;
        } else {
          if (!waitFor(t, 1 - rank, [&] { return netTransportStats(t).advertsReceived == kSlots; }))
            out.error = "adverts never arrived";
          (void)bs->barrier();
          SendConnector* sc = t->sendTo(1);
          for (uint32_t g = 0; g < kSlots; ++g) {
            char* slot = static_cast<char*>(sc->tryAcquire());
            if (!slot) {
              out.error = "no free slot";
              break;
            }
            std::memset(slot, 0x11, kSlotBytes);
            sc->post(kSlotBytes, false);
          }
          const double end = nowSec() + 0.5;
          while (nowSec() < end) idle(t);
          (void)bs->barrier();
        }
        abortFlag.store(true);  // writes to a stopped QP are never acknowledged
      },
      o, &abortFlag);
  EXPECT_TRUE(o[0].error.empty()) << o[0].error;
  EXPECT_TRUE(o[1].error.empty()) << o[1].error;
  EXPECT_EQ(o[0].stats.chunksToAdvertised, kSlots) << "the sender did not aim at the destinations";
  EXPECT_EQ(o[1].stats.withdrawals, 1u);
  EXPECT_NE(o[1].peerFailure.find("withdrawn"), std::string::npos) << o[1].peerFailure;
  EXPECT_EQ(o[1].mismatches, 0u) << "bytes landed in withdrawn destinations";
}

// Receives that must keep to the ring although a destination is declared, with device
// rings: a destination in device memory (it would need a flush of its own; `flush` off so
// that only this rule applies), or any destination while the ring is flushed (a chunk
// landing there would overtake older ones still being flushed). Nothing is advertised,
// and tryPeek returns the slot with the exact bytes.
void expectKeptToTheRing(const char* flush, bool deviceDestination) {
  MemfdRingAllocator alloc;
  void* deviceDst = nullptr;
  ASSERT_TRUE(alloc.allocate(kSlotBytes, &deviceDst).isOk());
  std::vector<uint8_t> hostDst(kSlotBytes);
  void* dstPtr = deviceDestination ? deviceDst : hostDst.data();
  std::atomic<bool> abortFlag{false};
  RankOutcome o[2];
  runPair(
      flush, &alloc, "",
      [&](int rank, Transport* t, Bootstrap* bs, RankOutcome& out) {
        if (rank == 1 && !t->recvFrom(0)->tryExpect(dstPtr, kSlotBytes)) out.error = "tryExpect refused";
        (void)bs->barrier();
        const double end = nowSec() + 10;
        if (rank == 0) {
          SendConnector* sc = t->sendTo(1);
          char* slot = static_cast<char*>(sc->tryAcquire());
          if (!slot) {
            out.error = "no free slot";
            return;
          }
          for (uint32_t i = 0; i < 1000; ++i) slot[i] = static_cast<char>(patternByte(7, i));
          sc->post(1000, true);
          while (!sc->sendsComplete() && nowSec() < end) idle(t);
          return;
        }
        RecvConnector* rc = t->recvFrom(0);
        SlotInfo info;
        const uint8_t* got = nullptr;
        while (!(got = static_cast<const uint8_t*>(rc->tryPeek(&info))) && nowSec() < end) idle(t);
        if (!got) {
          out.error = "the chunk never arrived";
          return;
        }
        bool ok = got != dstPtr && info.bytes == 1000 && info.lastOfMessage;
        for (uint32_t i = 0; ok && i < 1000; ++i) ok = got[i] == patternByte(7, i);
        out.mismatches += ok ? 0 : 1;
        ++out.chunksChecked;
        rc->release();
      },
      o, &abortFlag);
  alloc.release(deviceDst, kSlotBytes);
  EXPECT_TRUE(o[0].error.empty()) << o[0].error;
  EXPECT_TRUE(o[1].error.empty()) << o[1].error;
  EXPECT_EQ(o[1].chunksChecked, 1u);
  EXPECT_EQ(o[1].mismatches, 0u);
  EXPECT_EQ(o[1].stats.advertsSent, 0u);
  EXPECT_EQ(o[1].stats.flushesIssued, std::strcmp(flush, "read") == 0 ? 1u : 0u);
}

TEST(NetDirect, DeviceDestinationsAreNotAdvertised) {
  expectKeptToTheRing("off", true);
}
TEST(NetDirect, NothingIsAdvertisedWhileTheRingIsFlushed) {
  expectKeptToTheRing("read", false);
}

TEST(NetDirect, SettingTurnsTheExtensionOff) {
  for (const char* value : {"0", "1", "auto"}) {
    setenv("RIDGE_NET_DIRECT", value, 1);
    std::atomic<bool> abortFlag{false};
    RankOutcome o[2];
    uint32_t versions[2] = {9, 9};
    runPair(
        "auto", nullptr, "",
        [&](int rank, Transport* t, Bootstrap*, RankOutcome&) {
          const int peer = 1 - rank;
          versions[rank] = t->sendTo(peer)->directVersion() + t->recvFrom(peer)->directVersion();
        },
        o, &abortFlag);
    unsetenv("RIDGE_NET_DIRECT");
    const uint32_t want = std::strcmp(value, "0") == 0 ? 0 : 2 * kDirectTransferVersion;
    EXPECT_EQ(versions[0], want) << value;
    EXPECT_EQ(versions[1], want) << value;
  }
}

// ---- receive-side flush ------------------------------------------------------------------

// Every chunk arrives intact at the receiver, and the flush counters are as `flushed` says.
void expectExactWithFlushes(const char* setting, NetRingAllocator* alloc, bool onDevice, bool flushed) {
  constexpr uint32_t kChunks = 60;
  const softnic::Counters before = softnic::processCounters();
  RankOutcome o[2];
  runSlotStream(setting, alloc, kChunks, false, o);
  const softnic::Counters after = softnic::processCounters();
  EXPECT_EQ(o[1].chunksChecked, kChunks);
  EXPECT_EQ(o[1].mismatches, 0u);
  EXPECT_TRUE(o[1].peerFailure.empty()) << o[1].peerFailure;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(o[r].stats.recvRingsOnDevice, onDevice) << r;
    EXPECT_EQ(o[r].stats.flushing, flushed) << r;
    EXPECT_EQ(o[r].stats.loopbackQps, flushed ? 1u : 0u) << r;
    EXPECT_EQ(o[r].stats.flushErrors, 0u) << r;
  }
  EXPECT_EQ(o[1].stats.chunksArrived, kChunks);
  EXPECT_EQ(o[1].stats.flushesIssued, flushed ? kChunks : 0u);
  EXPECT_EQ(o[1].stats.flushesCompleted, flushed ? kChunks : 0u);
  EXPECT_EQ(o[0].stats.flushesIssued, 0u);  // rank 0 received nothing
  // The NIC executed exactly those reads: one per flushed chunk, nothing else reads.
  EXPECT_EQ(after.readsExecuted - before.readsExecuted, flushed ? kChunks : 0u);
}

TEST(NetGdrFlush, ReadFlushesEveryChunkInDeviceMemory) {
  MemfdRingAllocator alloc;
  expectExactWithFlushes("read", &alloc, true, true);
  EXPECT_EQ(alloc.exports.load(), 4) << "each rank's ring and send area registered once, as a dma-buf";
}

TEST(NetGdrFlush, AutoFlushesWhenTheDeviceDoesNotOrderWrites) {
  MemfdRingAllocator alloc;
  device::EmulatedRuntime rt(1);
  rt.setRdmaWritesOrdered(false);
  device::ScopedRuntimeForTesting scope(&rt);
  expectExactWithFlushes("auto", &alloc, true, true);
}

TEST(NetGdrFlush, AutoSkipsTheFlushWhenTheDeviceOrdersWrites) {
  MemfdRingAllocator alloc;
  device::EmulatedRuntime rt(1);
  rt.setRdmaWritesOrdered(true);
  device::ScopedRuntimeForTesting scope(&rt);
  expectExactWithFlushes("AUTO", &alloc, true, false);
}

TEST(NetGdrFlush, OffNeverFlushes) {
  MemfdRingAllocator alloc;
  expectExactWithFlushes("off", &alloc, true, false);
}

TEST(NetGdrFlush, HostRingsAreNeverFlushed) {
  expectExactWithFlushes("read", nullptr, false, false);
}

TEST(NetGdrFlush, FailedFlushWithholdsTheChunkAndFailsThePeer) {
  MemfdRingAllocator alloc;
  RankOutcome o[2];
  runSlotStream("read", &alloc, 8, true, o);
  EXPECT_EQ(o[1].chunksChecked, 0u) << "a chunk whose flush failed was handed on";
  EXPECT_NE(o[1].peerFailure.find("flush"), std::string::npos) << o[1].peerFailure;
  EXPECT_NE(o[1].peerFailure.find("rank 0"), std::string::npos) << o[1].peerFailure;
  EXPECT_GE(o[1].stats.flushErrors, 1u);
  EXPECT_EQ(o[1].stats.flushesCompleted, 0u);
  EXPECT_GE(o[1].stats.flushesIssued, 1u);
}

// The device network's slots (docs/gpu.md, "GPUDirect RDMA data path"): an allocator over the
// emulated device runtime, handed to each transport instance. Send areas and receive rings are
// emulated device memory that the host cannot touch (any CPU access would kill the test), so
// the chunks are written and read only with the runtime's copies, and the NIC moves them
// between the two device allocations: registered once each through the runtime's dma-buf
// export, every chunk flushed.
TEST(NetDeviceSlots, SendAreasAndRingsInRuntimeDeviceMemory) {
  device::EmulatedRuntime rt(1);
  device::ScopedRuntimeForTesting scope(&rt);
  RuntimeDeviceMemory mem(&rt, 0);
  constexpr uint32_t kChunks = 40;
  RankOutcome o[2];
  std::atomic<bool> abortFlag{false};
  uint64_t notDevice = 0;
  runPair(
      "read", &mem, "",
      [&](int rank, Transport* t, Bootstrap*, RankOutcome& o) {
        EXPECT_EQ(t->sendTo(1 - rank)->directVersion(), 0u) << "device slots keep to slots";
        std::vector<uint8_t> host(kSlotBytes);
        const double end = nowSec() + 30;
        if (rank == 0) {
          SendConnector* sc = t->sendTo(1);
          for (uint32_t c = 0; c < kChunks && nowSec() < end;) {
            void* slot = sc->tryAcquire();
            if (!slot) {
              idle(t);
              continue;
            }
            if (rt.classify(slot).kind != device::PointerKind::Device) ++notDevice;
            const uint32_t n = chunkBytes(c);
            for (uint32_t i = 0; i < n; ++i) host[i] = patternByte(c, i);
            if (!rt.copyToDevice(slot, host.data(), n).isOk()) o.error = "copy into a device send slot";
            sc->post(n, c % 3 == 2);
            ++c;
          }
          while (!sc->sendsComplete() && nowSec() < end) idle(t);
          return;
        }
        RecvConnector* rc = t->recvFrom(0);
        for (uint32_t c = 0; c < kChunks && nowSec() < end;) {
          SlotInfo info;
          const void* slot = rc->tryPeek(&info);
          if (!slot) {
            idle(t);
            continue;
          }
          if (rt.classify(slot).kind != device::PointerKind::Device) ++notDevice;
          const uint32_t n = chunkBytes(c);
          std::fill(host.begin(), host.end(), 0x5A);
          bool ok = info.bytes == n && info.lastOfMessage == (c % 3 == 2) &&
                    rt.copyToHost(host.data(), slot, n).isOk();
          for (uint32_t i = 0; ok && i < n; ++i) ok = host[i] == patternByte(c, i);
          o.mismatches += ok ? 0 : 1;
          ++o.chunksChecked;
          rc->release();
          ++c;
        }
      },
      o, &abortFlag, /*perInstance=*/true);
  EXPECT_EQ(notDevice, 0u) << "a slot handed out was not device memory";
  EXPECT_EQ(o[1].chunksChecked, kChunks);
  EXPECT_EQ(o[1].mismatches, 0u);
  EXPECT_TRUE(o[0].stats.recvRingsOnDevice && o[1].stats.recvRingsOnDevice);
  EXPECT_EQ(o[1].stats.flushesCompleted, kChunks);
  EXPECT_EQ(rt.dmaBufExports(), 4u) << "each rank's send area and ring exported once";
}

TEST(NetDeviceSlots, EmulatedDmaBufExportRules) {
  device::EmulatedRuntime rt(1);
  void* p = nullptr;
  ASSERT_TRUE(rt.allocDevice(3 * 4096, &p).isOk());
  int fd = -1;
  EXPECT_TRUE(rt.exportDmaBuf(p, 3 * 4096, &fd).isOk());
  if (fd >= 0) close(fd);
  EXPECT_TRUE(rt.exportDmaBuf(p, 4096, &fd).isOk()) << "a page-aligned range at the base";
  if (fd >= 0) close(fd);
  EXPECT_FALSE(rt.exportDmaBuf(static_cast<char*>(p) + 4096, 4096, &fd).isOk())
      << "an fd whose offset 0 is not the range's start";
  EXPECT_FALSE(rt.exportDmaBuf(p, 100, &fd).isOk()) << "not page aligned";
  EXPECT_FALSE(rt.exportDmaBuf(p, 4 * 4096, &fd).isOk()) << "past the allocation";
  rt.setDmaBufSupported(false);
  EXPECT_FALSE(rt.exportDmaBuf(p, 4096, &fd).isOk());
  EXPECT_FALSE(RuntimeDeviceMemory::dmaBufWorks(&rt, nullptr));
  rt.setDmaBufSupported(true);
  EXPECT_TRUE(RuntimeDeviceMemory::dmaBufWorks(&rt, nullptr));
  EXPECT_EQ(rt.dmaBufExports(), 3u);
  rt.freeDevice(p);
}

TEST(NetGdrFlush, SettingValuesAndDecision) {
  EXPECT_FALSE(([] {
    GdrFlushMode m;
    return parseGdrFlush("sometimes", &m);
  })());
  GdrFlushMode m = GdrFlushMode::Off;
  ASSERT_TRUE(parseGdrFlush("Read", &m));
  EXPECT_EQ(m, GdrFlushMode::Read);
  EXPECT_TRUE(gdrFlushNeeded(GdrFlushMode::Read, 0));
  EXPECT_FALSE(gdrFlushNeeded(GdrFlushMode::Off, 0));
}

}  // namespace
// ---- review mends (registration cache, failed peers, slot count) --------------------------

// Direct sends from more distinct caller regions than the registration cache holds (64),
// then slot chunks: the send area and the rings are registered outside the cache, so the
// evictions never touch them (review B1: before, the 63rd region evicted the send area and
// later slot posts named a deregistered key). Each region is its own 128 MiB mapping, so
// each takes its own cache entry.
TEST(NetReviewMends, MoreCallerRegionsThanTheCacheHoldsLeaveTheRingsRegistered) {
  constexpr uint32_t kRegions = 72, kSlotChunks = 12;
  constexpr size_t kRegionBytes = size_t{128} << 20;
  std::vector<uint8_t*> regions;
  for (uint32_t g = 0; g < kRegions; ++g) {
    void* m = mmap(nullptr, kRegionBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    ASSERT_NE(m, MAP_FAILED);
    regions.push_back(static_cast<uint8_t*>(m));
    for (uint32_t i = 0; i < kSlotBytes; ++i) regions.back()[i] = patternByte(g, i);
  }
  std::atomic<bool> abortFlag{false};
  RankOutcome o[2];
  runPair(
      "auto", nullptr, "",
      [&](int rank, Transport* t, Bootstrap*, RankOutcome& out) {
        const double end = nowSec() + 30;
        if (rank == 0) {
          SendConnector* sc = t->sendTo(1);
          for (uint32_t g = 0; g < kRegions + kSlotChunks && nowSec() < end;) {
            bool posted = false;
            if (g < kRegions) {
              posted = sc->tryPostDirect(regions[g], kSlotBytes, false);
            } else if (char* slot = static_cast<char*>(sc->tryAcquire())) {
              for (uint32_t i = 0; i < kSlotBytes; ++i) slot[i] = static_cast<char>(patternByte(g, i));
              sc->post(kSlotBytes, false);
              posted = true;
            }
            if (!posted) {
              idle(t);
              continue;
            }
            // One at a time: each region is complete before the next miss may evict.
            while (!sc->sendsComplete() && nowSec() < end) idle(t);
            ++g;
          }
          Status peer = t->checkPeer(1);
          if (!peer.isOk()) out.error = peer.message();
          return;
        }
        receivePatternChunks(t, 0, kRegions + kSlotChunks, end, out, true);
      },
      o, &abortFlag);
  for (uint8_t* m : regions) munmap(m, kRegionBytes);
  EXPECT_TRUE(o[0].error.empty()) << o[0].error;
  EXPECT_EQ(o[1].peerFailure, "");
  EXPECT_EQ(o[1].chunksChecked, kRegions + kSlotChunks);
  EXPECT_EQ(o[1].mismatches, 0u);
  EXPECT_GE(o[0].stats.directSends, 64u) << "too few regions went direct to fill the cache";
}

// RIDGE_RDMA_SLOTS that is not a power of two is rounded down (review M4: positions are
// 32-bit counters taken mod the slot count, which must divide 2^32): with 3, a sender may
// post 2 chunks before the receiver releases any.
TEST(NetReviewMends, SlotCountIsRoundedDownToAPowerOfTwo) {
  std::atomic<bool> abortFlag{false};
  RankOutcome o[2];
  uint32_t postedBeforeCredit = 0;
  runPair(
      "auto", nullptr, "",
      [&](int rank, Transport* t, Bootstrap* bs, RankOutcome& out) {
        if (rank == 0) {
          SendConnector* sc = t->sendTo(1);
          while (char* slot = static_cast<char*>(sc->tryAcquire())) {
            slot[0] = 1;
            sc->post(1, true);
            if (++postedBeforeCredit > 8) break;
          }
          const double end = nowSec() + 10;
          while (!sc->sendsComplete() && nowSec() < end) idle(t);
        }
        (void)bs->barrier();  // rank 0 has posted all it could
        if (rank == 1) {      // consume them, so that teardown finds nothing pending
          RecvConnector* rc = t->recvFrom(0);
          SlotInfo info;
          for (uint32_t got = 0; got < postedBeforeCredit && out.peerFailure.empty();) {
            if (rc->tryPeek(&info)) {
              rc->release();
              ++got;
            } else if (Status failure = t->checkPeer(0); !failure.isOk()) {
              out.peerFailure = failure.message();
            } else {
              idle(t);
            }
          }
        }
      },
      o, &abortFlag, false, 3);
  EXPECT_EQ(o[1].peerFailure, "");
  EXPECT_EQ(postedBeforeCredit, 2u);
}

// A peer failed by something other than a withdrawal (a transport error: a failed flush, a
// refused post) must have its QP stopped at once (review M2): direct chunks still queued to
// it are never read again, so the caller may overwrite its buffer, and they do not count as
// sent. Before, the failure was only recorded: the NIC went on retransmitting from the
// overwritten buffer and the peer received the new bytes as the message. Heavy loss keeps
// the chunks queued.
TEST(NetReviewMends, AFailedPeersQueuedDirectChunksAreNeverReadAgain) {
  std::atomic<bool> abortFlag{false};
  RankOutcome o[2];
  bool wereQueued = false, countedAsSent = true;
  runPair(
      "auto", nullptr, "drop=0.4,seed=5",
      [&](int rank, Transport* t, Bootstrap*, RankOutcome& out) {
        if (rank == 1) {
          SendConnector* sc = t->sendTo(0);
          std::vector<uint8_t> buf;
          wereQueued = postDirectPatternSlots(sc, buf, out);
          netFailPeerForTesting(t, 0);
          out.peerFailure = t->checkPeer(0).message();
          std::memset(buf.data(), 0xEE, buf.size());  // the caller reuses its buffer
          countedAsSent = sc->sendsComplete();
          // Retransmissions would go now.
          for (const double stop = nowSec() + 0.5; nowSec() < stop;) {
            (void)sc->sendsComplete();  // drives the transport
            idle(t);
          }
          abortFlag.store(true);
          return;
        }
        receivePatternChunks(t, 1, kSlots, nowSec() + 10, out, true, &abortFlag);
      },
      o, &abortFlag);
  ASSERT_TRUE(wereQueued) << "every chunk completed before the failure (nothing was tested)";
  EXPECT_TRUE(o[1].error.empty()) << o[1].error;
  EXPECT_NE(o[1].peerFailure.find("failed by a test"), std::string::npos) << o[1].peerFailure;
  EXPECT_FALSE(countedAsSent) << "chunks of a failed connection counted as sent";
  EXPECT_EQ(o[0].mismatches, 0u) << "bytes written into the buffer after the failure reached the peer";
  EXPECT_LT(o[0].chunksChecked, kSlots);
}

// A peer that leaves right after its last write was acknowledged, while this rank's flush
// READs of those chunks have not completed: the chunks are still handed on (review M1).
// Before, checkPeer saw the closed connection and failed the wait although every chunk was
// in the ring, one flush from delivery. Rank 1 drives its transport only after rank 0 has
// gone, so its flushes are posted after the close.
TEST(NetReviewMends, ChunksBeingFlushedWhenThePeerLeavesAreStillDelivered) {
  constexpr uint32_t kChunks = 4;  // chunk 0 is empty: three with bytes to flush
  MemfdRingAllocator alloc;
  std::atomic<bool> abortFlag{false}, left{false};
  RankOutcome o[2];
  runPair(
      "read", &alloc, "",
      [&](int rank, Transport* t, Bootstrap*, RankOutcome& out) {
        if (rank == 0) {
          sendPatternChunks(t, 1, kChunks, nowSec() + 10);
          out.leaveEarly = true;
          left.store(true);
          return;
        }
        for (const double end = nowSec() + 10; !left.load() && nowSec() < end;)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 0's transport is gone
        receivePatternChunks(t, 0, kChunks, nowSec() + 10, out);
      },
      o, &abortFlag);
  EXPECT_EQ(o[1].peerFailure, "");
  EXPECT_EQ(o[1].chunksChecked, kChunks);
  EXPECT_EQ(o[1].mismatches, 0u);
  EXPECT_GE(o[1].stats.flushesCompleted, kChunks - 1);
}

}  // namespace ridge
