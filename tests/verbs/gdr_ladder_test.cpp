// The GDR-write fallback ladder as a pure function (transports/verbs/gdr_ladder.h): every
// rung, every reason, the staging place, and predictions from unknown facts; and the
// page-granular GPU mapping of NIC rings (gpu_ring_mapping.h) on the emulated runtime.
#include "transports/verbs/gdr_ladder.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>

#include "device/emulated_runtime.h"
#include "transports/verbs/gpu_ring_mapping.h"
#include "transports/verbs/verbs.h"

namespace ridge {
namespace {

using namespace verbs;

// Every fact holds, NIC memory large enough for the staging slots.
GdrLadderFacts allHold() {
  GdrLadderFacts f;
  f.rdmaCore = FactWhy::yes();
  f.directQueues = FactWhy::yes();
  f.gpu = FactWhy::yes();
  f.ringsMappedForGpu = FactWhy::yes();
  f.uarMappedForGpu = FactWhy::yes();
  f.nicMemoryBytes = 256 << 10;
  f.stagingBytesNeeded = 64 << 10;
  f.nicMemoryMappedForGpu = FactWhy::yes();
  return f;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(GdrLadder, EveryFactHoldsGivesGpuDoorbellWithNicMemory) {
  const GdrLadderDecision d = decideGdrLadder(allHold());
  EXPECT_EQ(d.rung, GdrRung::GpuDoorbell);
  EXPECT_FALSE(d.predicted);
  EXPECT_EQ(d.staging, GdrStagingPlace::NicMemory);
  EXPECT_TRUE(contains(d.stagingReason, "65536 of 262144")) << d.stagingReason;
  EXPECT_TRUE(contains(gdrLadderLine(d), "gpu-doorbell: ")) << gdrLadderLine(d);
}

TEST(GdrLadder, NoRdmaCoreIsUnavailable) {
  GdrLadderFacts f = allHold();
  f.rdmaCore = FactWhy::no("cannot load libibverbs.so.1 (no such file)");
  const GdrLadderDecision d = decideGdrLadder(f);
  EXPECT_EQ(d.rung, GdrRung::Unavailable);
  EXPECT_EQ(d.reason, "rdma-core not found: cannot load libibverbs.so.1 (no such file)");
  EXPECT_EQ(d.staging, GdrStagingPlace::None);
}

TEST(GdrLadder, NoDirectQueuesIsHostStaged) {
  GdrLadderFacts f = allHold();
  f.directQueues = FactWhy::no("rxe0 is not an mlx5 device (mlx5dv_is_supported)");
  const GdrLadderDecision d = decideGdrLadder(f);
  EXPECT_EQ(d.rung, GdrRung::HostStaged);
  EXPECT_TRUE(contains(d.reason, "no mlx5 direct queues: rxe0 is not an mlx5 device")) << d.reason;
  EXPECT_TRUE(contains(d.reason, "plain verbs")) << d.reason;
  EXPECT_EQ(d.staging, GdrStagingPlace::HostMemory);
}

TEST(GdrLadder, NoGpuIsCpuDoorbellAndStagesByCpuMapping) {
  GdrLadderFacts f = allHold();
  f.gpu = FactWhy::no("the cuda runtime sees no device");
  // Without a GPU the mapping of NIC memory into it does not matter.
  f.nicMemoryMappedForGpu = FactWhy::no("not tried");
  const GdrLadderDecision d = decideGdrLadder(f);
  EXPECT_EQ(d.rung, GdrRung::CpuDoorbell);
  EXPECT_TRUE(contains(d.reason, "no GPU in this process: the cuda runtime sees no device")) << d.reason;
  EXPECT_EQ(d.staging, GdrStagingPlace::NicMemory);
  EXPECT_TRUE(contains(d.stagingReason, "written by the CPU")) << d.stagingReason;
}

TEST(GdrLadder, RingsNotMappableIsHostStaged) {
  GdrLadderFacts f = allHold();
  f.ringsMappedForGpu = FactWhy::no("cudaHostRegister: invalid argument");
  const GdrLadderDecision d = decideGdrLadder(f);
  EXPECT_EQ(d.rung, GdrRung::HostStaged);
  EXPECT_TRUE(
      contains(d.reason, "rings could not be mapped into the GPU: cudaHostRegister: invalid argument"))
      << d.reason;
  EXPECT_EQ(d.staging, GdrStagingPlace::HostMemory);
}

TEST(GdrLadder, UarNotMappableIsCpuDoorbell) {
  GdrLadderFacts f = allHold();
  f.uarMappedForGpu = FactWhy::no("operation not permitted (PeerMappingOverride=1)");
  const GdrLadderDecision d = decideGdrLadder(f);
  EXPECT_EQ(d.rung, GdrRung::CpuDoorbell);
  EXPECT_TRUE(contains(d.reason, "UAR page could not be mapped into the GPU: operation not permitted"))
      << d.reason;
  EXPECT_TRUE(contains(d.reason, "a CPU thread rings the UAR")) << d.reason;
  EXPECT_EQ(d.staging, GdrStagingPlace::NicMemory);
}

TEST(GdrLadder, StagingFallsToHostMemoryForEachReason) {
  GdrLadderFacts f = allHold();
  f.nicMemoryBytes = 0;
  GdrLadderDecision d = decideGdrLadder(f);
  EXPECT_EQ(d.rung, GdrRung::GpuDoorbell);
  EXPECT_EQ(d.staging, GdrStagingPlace::HostMemory);
  EXPECT_TRUE(contains(d.stagingReason, "max_dm_size 0")) << d.stagingReason;

  f = allHold();
  f.stagingBytesNeeded = f.nicMemoryBytes + 1;
  d = decideGdrLadder(f);
  EXPECT_EQ(d.staging, GdrStagingPlace::HostMemory);
  EXPECT_TRUE(contains(d.stagingReason, "need 262145 bytes, the NIC offers 262144")) << d.stagingReason;

  f = allHold();
  f.nicMemoryMappedForGpu = FactWhy::no("cudaHostRegister(IoMemory): not supported");
  d = decideGdrLadder(f);
  EXPECT_EQ(d.staging, GdrStagingPlace::HostMemory);
  EXPECT_TRUE(contains(d.stagingReason, "on-NIC memory could not be mapped into the GPU: cudaHostRegister"))
      << d.stagingReason;
}

TEST(GdrLadder, UnknownFactsPredictTheRungAndNameWhatMustHold) {
  GdrLadderFacts f;  // everything unknown
  f.rdmaCore = FactWhy::yes();
  f.nicMemoryBytes = 0;
  GdrLadderDecision d = decideGdrLadder(f);
  EXPECT_EQ(d.rung, GdrRung::GpuDoorbell);
  EXPECT_TRUE(d.predicted);
  EXPECT_TRUE(contains(d.reason,
                       "holds if at init: mlx5 direct queues, a GPU in this process, rings mapped into "
                       "the GPU, UAR mapped into the GPU"))
      << d.reason;
  EXPECT_TRUE(contains(gdrLadderLine(d), "gpu-doorbell (predicted): ")) << gdrLadderLine(d);

  // A known failure below an unknown stops there, and only the unknowns above it are named.
  f.ringsMappedForGpu = FactWhy::no("refused");
  d = decideGdrLadder(f);
  EXPECT_EQ(d.rung, GdrRung::HostStaged);
  EXPECT_TRUE(d.predicted);
  EXPECT_FALSE(contains(d.reason, "UAR mapped")) << d.reason;
}

TEST(GdrLadder, UnprobedNicMemoryLeavesStagingToInit) {
  GdrLadderFacts f = allHold();
  f.nicMemoryProbed = false;
  const GdrLadderDecision d = decideGdrLadder(f);
  EXPECT_EQ(d.rung, GdrRung::GpuDoorbell);
  EXPECT_EQ(d.staging, GdrStagingPlace::None);
  EXPECT_EQ(gdrLadderLine(d).find("staging"), std::string::npos) << gdrLadderLine(d);
}

TEST(GdrLadder, PredictionsFromATopologyNic) {
  // A described machine: rdma-core unknown, an mlx5 NIC by its OS name.
  GdrLadderDecision d = decideGdrLadder(predictGdrLadderFacts({"mlx5_0", "ens1f0"}, "", false));
  EXPECT_EQ(d.rung, GdrRung::GpuDoorbell);
  EXPECT_TRUE(d.predicted);
  EXPECT_TRUE(contains(d.reason, "rdma-core loadable (a described machine, not this host)")) << d.reason;
  // By model, too.
  d = decideGdrLadder(predictGdrLadderFacts({}, "ConnectX-7", false));
  EXPECT_EQ(d.rung, GdrRung::GpuDoorbell);
  // Another vendor's NIC: host-staged, named.
  d = decideGdrLadder(predictGdrLadderFacts({"bnxt_re0"}, "BCM57508", false));
  EXPECT_EQ(d.rung, GdrRung::HostStaged);
  EXPECT_TRUE(contains(d.reason, "the NIC is not an mlx5 one (BCM57508 bnxt_re0)")) << d.reason;
}

TEST(GdrLadder, RungAndPlaceNames) {
  EXPECT_STREQ(gdrRungName(GdrRung::GpuDoorbell), "gpu-doorbell");
  EXPECT_STREQ(gdrRungName(GdrRung::CpuDoorbell), "cpu-doorbell");
  EXPECT_STREQ(gdrRungName(GdrRung::HostStaged), "host-staged");
  EXPECT_STREQ(gdrRungName(GdrRung::Unavailable), "unavailable");
  EXPECT_STREQ(gdrStagingPlaceName(GdrStagingPlace::NicMemory), "nic-gpu");
  EXPECT_STREQ(gdrStagingPlaceName(GdrStagingPlace::HostMemory), "host");
}

// ---- GpuRingMapping ------------------------------------------------------------------------

struct PageBuffer {
  explicit PageBuffer(size_t pages) : bytes(pages * static_cast<size_t>(sysconf(_SC_PAGESIZE))) {
    p = static_cast<char*>(std::aligned_alloc(static_cast<size_t>(sysconf(_SC_PAGESIZE)), bytes));
  }
  ~PageBuffer() { std::free(p); }
  char* p;
  size_t bytes;
};

using Kind = device::DeviceRuntime::HostRangeKind;

TEST(GpuRingMapping, WidensToPagesReusesSharedPagesAndUnmapsAll) {
  device::EmulatedRuntime rt(1);
  PageBuffer buf(3);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  {
    GpuRingMapping m(&rt);
    uint64_t a = 0, b = 0, c = 0;
    // Two doorbell records in one page: one registration.
    ASSERT_TRUE(m.map(buf.p + 16, 8, Kind::Memory, &a).isOk());
    ASSERT_TRUE(m.map(buf.p + 64, 8, Kind::Memory, &b).isOk());
    EXPECT_EQ(m.rangesMapped(), 1u);
    EXPECT_EQ(rt.mappedHostRanges(), 1u);
    EXPECT_EQ(b - a, 48u);
    // The emulator's device address is the host address.
    EXPECT_EQ(a, reinterpret_cast<uint64_t>(buf.p + 16));
    // The next page: a second registration.
    ASSERT_TRUE(m.map(buf.p + page, page, Kind::Memory, &c).isOk());
    EXPECT_EQ(rt.mappedHostRanges(), 2u);
    // A range over both pages straddles two mappings: refused, not registered twice.
    uint64_t d = 0;
    Status st = m.map(buf.p + page - 8, 16, Kind::Memory, &d);
    EXPECT_FALSE(st.isOk());
    EXPECT_NE(st.message().find("straddles"), std::string::npos) << st.message();
    // The same page as another kind of memory: refused.
    st = m.map(buf.p + 32, 8, Kind::IoMemory, &d);
    EXPECT_FALSE(st.isOk());
  }
  EXPECT_EQ(rt.mappedHostRanges(), 0u);
}

// Two mappings (two ranks' links in one process) whose doorbell records share a page: the
// second reuses the first's registration instead of registering the page again (CUDA and the
// emulator refuse that), and the page stays mapped until both are gone. Before the registry
// was process-wide the second map failed and its rank fell to host-staged: issue 23's
// GdrWriteDoorbellRungsRunOnTheDirectRings failure under load, when both rank threads took
// their records from one malloc arena.
TEST(GpuRingMapping, MappingsOfTwoLinksShareAPageAndTheLastOneUnmapsIt) {
  device::EmulatedRuntime rt(1);
  PageBuffer buf(2);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  uint64_t a = 0, b = 0, c = 0;
  auto first = std::make_unique<GpuRingMapping>(&rt);
  auto second = std::make_unique<GpuRingMapping>(&rt);
  ASSERT_TRUE(first->map(buf.p + 16, 8, Kind::Memory, &a).isOk());
  const Status st = second->map(buf.p + 128, 8, Kind::Memory, &b);
  ASSERT_TRUE(st.isOk()) << st.message();
  EXPECT_EQ(b - a, 112u);
  EXPECT_EQ(rt.mappedHostRanges(), 1u);
  EXPECT_EQ(second->rangesMapped(), 1u);
  // Mapping the same page again through the same object does not take it twice.
  ASSERT_TRUE(second->map(buf.p + 256, 8, Kind::Memory, &c).isOk());
  EXPECT_EQ(second->rangesMapped(), 1u);
  // The same page as I/O memory from another mapping: refused, as within one.
  GpuRingMapping third(&rt);
  EXPECT_FALSE(third.map(buf.p + 32, 8, Kind::IoMemory, &c).isOk());
  // Another runtime (another GPU) keeps its own registrations.
  device::EmulatedRuntime other(1);
  {
    GpuRingMapping elsewhere(&other);
    ASSERT_TRUE(elsewhere.map(buf.p + page, 8, Kind::Memory, &c).isOk());
    EXPECT_EQ(other.mappedHostRanges(), 1u);
    EXPECT_EQ(rt.mappedHostRanges(), 1u);
  }
  EXPECT_EQ(other.mappedHostRanges(), 0u);
  first.reset();
  EXPECT_EQ(rt.mappedHostRanges(), 1u) << "the page went while the second link still uses it";
  second.reset();
  EXPECT_EQ(rt.mappedHostRanges(), 0u);
}

TEST(GpuRingMapping, ReportsTheRuntimeRefusal) {
  device::EmulatedRuntime rt(1);
  rt.failHostRangeMaps(Kind::IoMemory, "not permitted for this test");
  PageBuffer buf(1);
  GpuRingMapping m(&rt);
  uint64_t a = 0;
  Status st = m.map(buf.p, 8, Kind::IoMemory, &a);
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("not permitted for this test"), std::string::npos) << st.message();
  EXPECT_TRUE(m.map(buf.p, 8, Kind::Memory, &a).isOk());
  GpuRingMapping none(nullptr);
  EXPECT_FALSE(none.map(buf.p, 8, Kind::Memory, &a).isOk());
}

}  // namespace
}  // namespace ridge
