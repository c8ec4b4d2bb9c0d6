// The net transport's receive-side GPUDirect RDMA flush, over softnic: two ranks as threads
// of this process, each with its own software NIC, connected through the transport table
// (RIDGE_NET=softnic, RIDGE_SHM=0). Receive rings come from a memfd-backed allocator that
// stands in for GPU memory (registered through device_registration as a dma-buf), or from
// host memory. Checked: exact bytes and metadata of every chunk; one flush READ per chunk
// that lands in device memory when RIDGE_GDR_FLUSH (or, for auto, the device runtime's
// write ordering) requires it and none otherwise; one loopback QP made at connect, never
// per chunk; a failing flush withholds the chunk and fails the peer with a clear error.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "cq_polling.h"
#include "device/emulated_runtime.h"
#include "transports/net/device_registration.h"
#include "transports/net/net_transport.h"
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
  std::string peerFailure;  // receiver: what checkPeer said (flush error test)
};

constexpr int kSlotBytes = 64 << 10;

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

// Rank 0 sends `chunks` chunks to rank 1, which checks each. `breakFlush`: the receiver's
// flush reads are made to fail; it then expects no chunk and a peer failure.
void runPair(const char* flushSetting, NetRingAllocator* alloc, uint32_t chunks, bool breakFlush,
             RankOutcome out[2]) {
  setenv("RIDGE_SOCKET_IFNAME", "lo", 1);
  setenv("RIDGE_NET", "softnic", 1);
  setenv("RIDGE_SHM", "0", 1);
  setenv("RIDGE_GDR_MODE", "off", 1);
  setenv("RIDGE_RDMA_SLOTS", "4", 1);
  setenv("RIDGE_RDMA_SLOT_BYTES", std::to_string(kSlotBytes).c_str(), 1);
  setenv("RIDGE_GDR_FLUSH", flushSetting, 1);
  setNetRingAllocator(alloc);
  ridgeUniqueId id;
  ASSERT_TRUE(createUniqueId(&id).isOk());
  const TransportTable* net = nullptr;
  for (const TransportTable* t : registeredTransports())
    if (std::strcmp(t->name, "net") == 0) net = t;
  ASSERT_NE(net, nullptr);
  std::atomic<bool> abortFlag{false};
  auto rankMain = [&](int rank) {
    RankOutcome& o = out[rank];
    std::unique_ptr<Bootstrap> bs;
    Status s = Bootstrap::connect(id, rank, 2, 20, &abortFlag, &bs);
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
    setup.abortFlag = &abortFlag;
    setup.timeoutSeconds = 20;
    std::unique_ptr<Transport> t;
    s = net->create(setup, &t);
    if (!s.isOk()) {
      o.error = "create: " + s.message();
      return;
    }
    if (rank == 1 && breakFlush) netBreakFlushReadsForTesting(t.get());
    const double end = nowSec() + (breakFlush ? 3 : 30);
    if (rank == 0) {
      SendConnector* sc = t->sendTo(1);
      // Without a working flush the receiver takes nothing: send only what fits its ring.
      const uint32_t toSend = breakFlush ? std::min<uint32_t>(chunks, 4) : chunks;
      for (uint32_t c = 0; c < toSend && nowSec() < end;) {
        char* slot = static_cast<char*>(sc->tryAcquire());
        if (!slot) {
          t->waitForActivity(
              1000000, [](void*) { return true; }, nullptr);
          continue;
        }
        const uint32_t n = chunkBytes(c);
        for (uint32_t i = 0; i < n; ++i) slot[i] = static_cast<char>(patternByte(c, i));
        sc->post(n, c % 3 == 2);
        ++c;
      }
      while (!sc->sendsComplete() && nowSec() < end) {
      }
    } else {
      RecvConnector* rc = t->recvFrom(0);
      uint32_t c = 0;
      while (c < chunks && nowSec() < end) {
        SlotInfo info;
        const uint8_t* slot = static_cast<const uint8_t*>(rc->tryPeek(&info));
        if (!slot) {
          Status peer = t->checkPeer(0);
          if (!peer.isOk()) {
            o.peerFailure = peer.message();
            break;
          }
          t->waitForActivity(
              1000000, [](void*) { return true; }, nullptr);
          continue;
        }
        const uint32_t n = chunkBytes(c);
        bool ok = info.bytes == n && info.lastOfMessage == (c % 3 == 2);
        for (uint32_t i = 0; ok && i < n; ++i) ok = slot[i] == patternByte(c, i);
        o.mismatches += ok ? 0 : 1;
        ++o.chunksChecked;
        rc->release();
        ++c;
      }
    }
    o.stats = netTransportStats(t.get());
    // The receiver, done, releases the sender from its barrier: after a failed flush the
    // receiver never returns credits.
    if (breakFlush && rank == 1) abortFlag.store(true);
    (void)bs->barrier();
    t.reset();
  };
  std::thread r0(rankMain, 0), r1(rankMain, 1);
  r0.join();
  r1.join();
  setNetRingAllocator(nullptr);
  ASSERT_TRUE(out[0].error.empty()) << out[0].error;
  ASSERT_TRUE(out[1].error.empty()) << out[1].error;
}

// Every chunk arrives intact at the receiver, and the flush counters are as `flushed` says.
void expectExactWithFlushes(const char* setting, NetRingAllocator* alloc, bool onDevice, bool flushed) {
  constexpr uint32_t kChunks = 60;
  const softnic::Counters before = softnic::processCounters();
  RankOutcome o[2];
  runPair(setting, alloc, kChunks, false, o);
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
  EXPECT_EQ(alloc.exports.load(), 2) << "each rank's ring registered once, as a dma-buf";
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
  runPair("read", &alloc, 8, true, o);
  EXPECT_EQ(o[1].chunksChecked, 0u) << "a chunk whose flush failed was handed on";
  EXPECT_NE(o[1].peerFailure.find("flush"), std::string::npos) << o[1].peerFailure;
  EXPECT_NE(o[1].peerFailure.find("rank 0"), std::string::npos) << o[1].peerFailure;
  EXPECT_GE(o[1].stats.flushErrors, 1u);
  EXPECT_EQ(o[1].stats.flushesCompleted, 0u);
  EXPECT_GE(o[1].stats.flushesIssued, 1u);
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
}  // namespace ridge
