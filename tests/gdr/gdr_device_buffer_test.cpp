// Device buffers drive gdr-write (docs/gdr-write.md, "Device buffers"): on the emulated device
// runtime, a send from device memory over the gdr transport in write mode runs the device-side
// producer (gdr_device.h on the stream's device thread: payload from the device buffer straight
// into staging, its own WQEs and doorbells), not a copy-engine copy into a slot and a host
// post; a send from host memory keeps the host stand-in. Ranks are threads of this process
// that reach each other only through the gdr transport over the software NIC.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "coll/comm.h"
#include "coll/device/device_collectives.h"
#include "device/emulated_runtime.h"
#include "device_ranks.h"
#include "ridge/ridge.h"
#include "tests/verbs/two_ranks.h"
#include "transports/gdr/gdr_transport.h"
#include "transports/net/device_registration.h"
#include "transports/net/net_transport.h"

namespace {

using namespace p2ptest;
using ridge::device::ScopedRuntimeForTesting;

struct GdrWriteEnv {
  // `slots`: staging slots per peer; `faults`: RIDGE_SOFTNIC_FAULTS (empty: none).
  explicit GdrWriteEnv(const char* slots = "2", const char* faults = "") {
    setenv("RIDGE_NET", "softnic", 1);
    setenv("RIDGE_SHM", "0", 1);
    setenv("RIDGE_P2P", "off", 1);
    setenv("RIDGE_LL", "off", 1);
    setenv("RIDGE_GDR_MODE", "write", 1);
    setenv("RIDGE_GDR_STAGING_SLOTS", slots, 1);
    setenv("RIDGE_GDR_SLOT_BYTES", "4K", 1);
    setenv("RIDGE_SOFTNIC_FAULTS", faults, 1);
    setenv("RIDGE_SOFTNIC_RTO_US", "3000", 1);
  }
  ~GdrWriteEnv() {
    for (const char* v :
         {"RIDGE_NET", "RIDGE_SHM", "RIDGE_P2P", "RIDGE_LL", "RIDGE_GDR_MODE", "RIDGE_GDR_STAGING_SLOTS",
          "RIDGE_GDR_SLOT_BYTES", "RIDGE_SOFTNIC_FAULTS", "RIDGE_SOFTNIC_RTO_US"})
      unsetenv(v);
  }
};

std::vector<unsigned char> pattern(size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((i * 131 + seed * 17 + (i >> 8)) & 0xff);
  return v;
}

// Every rank past this point (a one-element host allreduce).
ridgeResult_t hostBarrier(ridgeComm_t comm) {
  int32_t one = 1, sum = 0;
  return ridgeAllReduce(&one, &sum, 1, ridgeInt32, ridgeSum, comm, nullptr);
}

TEST(GdrDeviceBuffers, DeviceSendRunsTheDeviceSideProducerHostSendTheStandIn) {
  GdrWriteEnv env;
  EmulatedRuntime rt(2);
  ScopedRuntimeForTesting scope(&rt);
  constexpr size_t kBytes = 100000;  // 25 slots of 4 KiB (the last one short)
  constexpr uint64_t kSlots = (kBytes + 4095) / 4096;
  const ridge::gdr::Counters before = ridge::gdr::processCounters();
  ridge::gdr::Counters afterDevice{};
  withRanks(rt, 2, 2, [&](TestRank& t) {
    DevMem buf(rt, kBytes);
    if (t.rank == 0) {
      buf.put(pattern(kBytes, 1));
      ASSERT_EQ(ridgeSend(buf.p, kBytes, ridgeUint8, 1, t.comm, t.stream), ridgeSuccess) << errorText();
    } else {
      buf.put(std::vector<unsigned char>(kBytes, kPoison));
      ASSERT_EQ(ridgeRecv(buf.p, kBytes, ridgeUint8, 0, t.comm, t.stream), ridgeSuccess) << errorText();
    }
    expectStreamDone(rt, t);
    if (t.rank == 1) EXPECT_TRUE(buf.get(0, kBytes) == pattern(kBytes, 1)) << "device-to-device message";
    ASSERT_EQ(hostBarrier(t.comm), ridgeSuccess) << errorText();
    if (t.rank == 0) afterDevice = ridge::gdr::processCounters();
    ASSERT_EQ(hostBarrier(t.comm), ridgeSuccess) << errorText();
    // The same message from host memory: the host stand-in posts it.
    std::vector<unsigned char> host =
        t.rank == 0 ? pattern(kBytes, 2) : std::vector<unsigned char>(kBytes, 0);
    if (t.rank == 0)
      ASSERT_EQ(ridgeSend(host.data(), kBytes, ridgeUint8, 1, t.comm, nullptr), ridgeSuccess) << errorText();
    else
      ASSERT_EQ(ridgeRecv(host.data(), kBytes, ridgeUint8, 0, t.comm, nullptr), ridgeSuccess) << errorText();
    if (t.rank == 1) EXPECT_TRUE(host == pattern(kBytes, 2)) << "host-to-host message";
  });
  const ridge::gdr::Counters after = ridge::gdr::processCounters();
  // Every slot of the device buffer's message posted by device code, slot by slot (the host
  // taking the credits), and the operation's header slot (coll/signature.h) with them.
  EXPECT_GE(afterDevice.devicePosts - before.devicePosts, kSlots)
      << "every slot of the device buffer's message posted by the device-side producer";
  EXPECT_LE(afterDevice.devicePosts - before.devicePosts, kSlots + 1);
  EXPECT_GE(afterDevice.slotsWritten - before.slotsWritten, kSlots);
  EXPECT_EQ(after.devicePosts, afterDevice.devicePosts) << "host buffers go through the host stand-in";
  EXPECT_GE(after.slotsWritten - afterDevice.slotsWritten, kSlots);
  EXPECT_EQ(after.remoteReads - before.remoteReads, 0u) << "the producer read NIC-side memory";
  EXPECT_EQ(after.stagedLost - before.stagedLost, 0u);
}

// Collectives on device buffers over gdr-write run the device-side producer too: the proxy
// runs the ring algorithms on the gdr connectors with the device data ops (no host staging),
// the copy or reduction kernel writes each slot's payload straight into staging and device code
// posts it (seal, mlx5 WQE, doorbell record, UAR). One staging slot per peer and a lossy wire:
// every slot waits for the previous one's CQE and the NIC repairs drops, duplicates, reordering
// and delays. Every output is checked against the higher-precision host reference (poisoned
// first); the counters prove who posted: every slot of the collectives by device code, the
// host stand-in only the proxy's one-byte votes, nothing staged, no producer read of NIC-side
// memory.
void runDeviceCollectives(int nranks) {
  GdrWriteEnv env("1", "drop=0.02,dup=0.02,reorder=0.02,delay=0.02:200us,seed=11");
  EmulatedRuntime rt(2);
  ScopedRuntimeForTesting scope(&rt);
  const std::vector<Call> calls = {
      {Op::AllReduce, ridgeFloat32, ridgeSum, 5000},       // 20000 bytes: chunks of 4 KiB slots
      {Op::AllGather, ridgeInt32, ridgeSum, 3001},         // odd count: a short last slot
      {Op::ReduceScatter, ridgeFloat64, ridgeMax, 1500},   //
      {Op::Broadcast, ridgeUint8, ridgeSum, 17000},        //
      {Op::AllReduce, ridgeInt32, ridgeProd, 1000, true},  // in place
      {Op::Reduce, ridgeFloat32, ridgeSum, 2500},          //
  };
  const ridge::gdr::Counters before = ridge::gdr::processCounters();
  withRanks(rt, nranks, 2, [&](TestRank& t) {
    for (size_t i = 0; i < calls.size(); ++i) runCall(rt, t, calls[i], 100 + static_cast<uint32_t>(i));
    ridgeComm* c = t.comm;
    EXPECT_EQ(c->device->netBatches, calls.size()) << "rank " << t.rank << ": batches on the gdr connectors";
    EXPECT_EQ(c->device->stagedBatches, 0u)
        << "rank " << t.rank << ": a batch was staged through host memory";
    EXPECT_EQ(c->device->netDeclined, 0u) << "rank " << t.rank;
  });
  const ridge::gdr::Counters after = ridge::gdr::processCounters();
  const uint64_t devicePosts = after.devicePosts - before.devicePosts;
  const uint64_t slots = after.slotsWritten - before.slotsWritten;
  const uint64_t votes = calls.size() * static_cast<uint64_t>(nranks) * (nranks - 1);
  EXPECT_GT(devicePosts, calls.size() * static_cast<uint64_t>(nranks)) << "the device-side producer posted";
  EXPECT_EQ(slots, devicePosts + votes) << "every slot but the votes' posted by device code";
  EXPECT_EQ(after.remoteReads - before.remoteReads, 0u) << "the producer read NIC-side memory";
  EXPECT_EQ(after.stagedLost - before.stagedLost, 0u);
  // (completionErrors may count a credit write to a peer that had already closed: harmless.)
  std::printf("%d ranks: %llu slots posted by device code, %llu by the host stand-in (votes)\n", nranks,
              static_cast<unsigned long long>(devicePosts),
              static_cast<unsigned long long>(slots - devicePosts));
}

TEST(GdrDeviceBuffers, CollectivesOnDeviceBuffersRunTheDeviceSideProducerTwoRanks) {
  runDeviceCollectives(2);
}

TEST(GdrDeviceBuffers, CollectivesOnDeviceBuffersRunTheDeviceSideProducerThreeRanks) {
  runDeviceCollectives(3);
}

// A GPU runs only the transport's kernel twin (the device-side post, gdrPostKernel on CUDA),
// never a whole message that waits for credits. The emulated runtime standing for such a GPU
// (kernel twins only) takes the same path as the CUDA runtime: the software NIC's queues,
// staging (host memory: the NIC's own is not page-granular), landing slots and the shared
// producer state are mapped into the "GPU" (page-granular: an overlap is refused as
// cudaHostRegister refuses it), the host takes each slot's credits, the device posts it and the
// host tells the engine about the doorbell. A sendrecv in both directions far larger than the
// landing rings (a device-side sender that waited for credits on the one stream would hold up
// the copies of its own receives), then an allreduce on the gdr connectors; every byte exact,
// every payload slot posted by device code, nothing read from NIC-side memory, every mapping
// undone at destroy.
void runKernelTwinStandIn(const char* slots, const char* faults, bool twinsOnly = true) {
  GdrWriteEnv env(slots, faults);
  EmulatedRuntime rt(2);
  rt.setKernelTwinsOnly(twinsOnly);
  ScopedRuntimeForTesting scope(&rt);
  constexpr size_t kBytes = 300000;  // 74 slots of 4 KiB each way; 8 landing slots per peer
  constexpr uint64_t kSlots = (kBytes + 4095) / 4096;
  constexpr size_t kCount = 20000;  // allreduce, float32: 80000 bytes
  const ridge::gdr::Counters before = ridge::gdr::processCounters();
  std::atomic<size_t> mappedWhileUp{0};
  withRanks(rt, 2, 1, [&](TestRank& t) {
    DevMem out(rt, kBytes), in(rt, kBytes);
    out.put(pattern(kBytes, 10 + t.rank));
    in.put(std::vector<unsigned char>(kBytes, kPoison));
    const int peer = 1 - t.rank;
    ASSERT_EQ(ridgeGroupStart(), ridgeSuccess);
    ASSERT_EQ(ridgeSend(out.p, kBytes, ridgeUint8, peer, t.comm, t.stream), ridgeSuccess) << errorText();
    ASSERT_EQ(ridgeRecv(in.p, kBytes, ridgeUint8, peer, t.comm, t.stream), ridgeSuccess) << errorText();
    ASSERT_EQ(ridgeGroupEnd(), ridgeSuccess) << errorText();
    expectStreamDone(rt, t);
    EXPECT_TRUE(in.get(0, kBytes) == pattern(kBytes, 10 + peer)) << "rank " << t.rank << ": sendrecv";
    ridgeComm* c = t.comm;
    const uint64_t staged = c->device->stagedBatches;  // (a batch of exchanges counts as one)
    runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, kCount}, 77);
    EXPECT_EQ(c->device->netBatches, 1u) << "rank " << t.rank << ": the allreduce ran on the gdr connectors";
    EXPECT_EQ(c->device->stagedBatches, staged) << "rank " << t.rank;
    mappedWhileUp.fetch_add(rt.mappedHostRanges());
  });
  const ridge::gdr::Counters after = ridge::gdr::processCounters();
  const ridge::gdr::SetupReport report = ridge::gdr::lastSetupReport();
  if (twinsOnly) EXPECT_EQ(report.stagingTier, "host") << report.stagingReason;
  const uint64_t devicePosts = after.devicePosts - before.devicePosts;
  const uint64_t written = after.slotsWritten - before.slotsWritten;
  // Two ranks, each: kSlots payload slots of the sendrecv, at least one slot of its allreduce.
  EXPECT_GE(devicePosts, 2 * kSlots + 2) << "the kernel twin posted every payload slot";
  EXPECT_LE(written - devicePosts, 2u * 2) << "the host posted more than the votes and descriptors";
  EXPECT_EQ(after.remoteReads - before.remoteReads, 0u) << "the producer read NIC-side memory";
  EXPECT_EQ(after.stagedLost - before.stagedLost, 0u);
  if (twinsOnly) EXPECT_GT(mappedWhileUp.load(), 0u) << "the queues were mapped into the device";
  EXPECT_EQ(rt.mappedHostRanges(), 0u) << "a mapping outlived its communicator";
  std::printf("%s (%s staging slots%s%s): %llu slots posted by device code, %llu by the host\n",
              twinsOnly ? "kernel-twin stand-in" : "emulated device producer", slots,
              *faults ? ", faults " : "", faults, static_cast<unsigned long long>(devicePosts),
              static_cast<unsigned long long>(written - devicePosts));
}

TEST(GdrDeviceBuffers, GpuStandInPostsEverySlotThroughTheKernelTwin) {
  runKernelTwinStandIn("4", "");
}

// The emulated runtime's own device-side producer (host-compiled code on its device threads),
// the same exchange: a send far beyond the landing ring in both directions at once goes slot by
// slot too (a whole-message send waiting for credits on the stream stalled both ranks until
// RIDGE_TIMEOUT: each one's receive copies queued behind its own send).
TEST(GdrDeviceBuffers, DeviceSendRecvBothWaysBeyondTheLandingRing) {
  runKernelTwinStandIn("4", "", /*twinsOnly=*/false);
}

// One staging slot (every post waits for the previous one's CQE) and a lossy wire.
TEST(GdrDeviceBuffers, GpuStandInPostsEverySlotThroughTheKernelTwinOneSlotLossyWire) {
  runKernelTwinStandIn("1", "drop=0.02,dup=0.02,reorder=0.02,delay=0.02:200us,seed=5");
}

// "Device memory" for gdr read's slots: one memfd per allocation, which the software NIC maps
// when it registers the exported fd (what a GPU driver's dma-buf is to a real NIC).
class MemfdDeviceSlots final : public ridge::NetRingAllocator, public ridge::DeviceMemoryRegistrar {
 public:
  ridge::Status allocate(size_t bytes, void** out) override {
    const int fd = memfd_create("gdr-read-slots", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) return ridge::systemError("memfd");
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return ridge::systemError("mmap");
    std::lock_guard<std::mutex> g(mu_);
    live_.push_back({reinterpret_cast<uintptr_t>(p), bytes, fd});
    *out = p;
    return ridge::Status::ok();
  }
  void release(void* p, size_t bytes) override {
    std::lock_guard<std::mutex> g(mu_);
    for (auto it = live_.begin(); it != live_.end(); ++it)
      if (it->base == reinterpret_cast<uintptr_t>(p)) {
        close(it->fd);
        live_.erase(it);
        ++released;
        break;
      }
    munmap(p, bytes);
  }
  ridge::DeviceMemoryRegistrar* registrar() override { return this; }
  int device() const override { return 0; }
  const char* name() const override { return "memfd read slots"; }
  bool deviceAllocation(const void* addr, uintptr_t* base, size_t* bytes) override {
    std::lock_guard<std::mutex> g(mu_);
    for (const Live& a : live_)
      if (reinterpret_cast<uintptr_t>(addr) - a.base < a.bytes) {
        *base = a.base;
        *bytes = a.bytes;
        return true;
      }
    return false;
  }
  ridge::Status exportDmaBuf(uintptr_t base, size_t bytes, int* fd) override {
    std::lock_guard<std::mutex> g(mu_);
    for (const Live& a : live_)
      if (a.base == base && a.bytes == bytes) {
        ++exports;
        *fd = dup(a.fd);
        return ridge::Status::ok();
      }
    return ridge::makeError(ridgeInvalidArgument, "not an allocation");
  }
  std::atomic<int> exports{0}, released{0};

 private:
  struct Live {
    uintptr_t base;
    size_t bytes;
    int fd;
  };
  std::mutex mu_;
  std::vector<Live> live_;
};

// gdr read with the producer's slots in device memory: registered for the NIC through dma-buf
// (registerDeviceRange), the NIC reads them there; freed at destroy. Without device memory
// the slots are host memory, as before.
TEST(GdrDeviceBuffers, ReadSlotsInDeviceMemoryAreRegisteredThroughDmaBuf) {
  ridge::verbs_test::ScopedEnv mode("RIDGE_GDR_MODE", "read");
  ridge::verbs_test::ScopedEnv slot("RIDGE_GDR_SLOT_BYTES", "4K");
  MemfdDeviceSlots slots;
  ridge::setNetRingAllocator(&slots);
  const std::string err = ridge::verbs_test::allreduceOverNet("softnic", "0", 1 << 16);
  ridge::setNetRingAllocator(nullptr);
  EXPECT_EQ(err, "");
  EXPECT_EQ(ridge::gdr::lastSetupReport().readSlots, "device memory (dma-buf)");
  EXPECT_EQ(slots.exports.load(), 2) << "one export per rank's slot ring";
  EXPECT_EQ(slots.released.load(), 2) << "every slot ring freed at destroy";
  EXPECT_EQ(ridge::verbs_test::allreduceOverNet("softnic", "0", 1 << 12), "");
  EXPECT_EQ(ridge::gdr::lastSetupReport().readSlots, "host memory");
}

}  // namespace
