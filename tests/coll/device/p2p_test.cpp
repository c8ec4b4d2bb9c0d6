// The P2P engine (src/coll/device/p2p.cpp) on the emulated device runtime: ranks are threads of
// this process, the emulator's IPC handles are opened as another process would (a second
// PROT_NONE view of the same memory), so every byte moves device to device through mapped
// peer buffers; a host dereference of any of them would kill the test.
//
// Checked: every collective on 2, 3 and 4 ranks (several ranks on one emulated device, and
// four ranks on two), nine ranks (reductions in rounds of eight sources), in place; against
// a higher-precision host reference (random inputs, poisoned outputs); that the P2P path ran
// (its counters and the emulator's reduction launches) and that RIDGE_P2P=off, refused peer
// access, in-place alltoall and groups with send/receive stage instead; the mapping cache
// (handles opened once across calls, bounded, a freed and reallocated buffer never read
// through its old mapping, every mapping closed at destroy); the export cache (each
// allocation exported once across calls, an allocation at a freed one's address exported
// anew, bounded); abort during a P2P collective;
// groups: independent operations share one barrier, a dependent one waits for its
// predecessor on every rank (a slow emulated device would expose it otherwise).
#include "coll/device/p2p.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "coll/comm.h"
#include "collective_case.h"
#include "device/emulated_runtime.h"
#include "device_ranks.h"
#include "plan/plan.h"
#include "ridge/ridge.h"
#include "time_scale.h"
#include "topo/presets.h"

namespace {

using namespace ridgetest;
using namespace p2ptest;
using ridge::Status;
using ridge::device::DeviceRuntime;
using ridge::device::EmulatedRuntime;
using ridge::device::ScopedRuntimeForTesting;
using Clock = std::chrono::steady_clock;

// These tests are about the proxy path (P2P and staged): small collectives would take the LL
// path (src/coll/device/ll_path.h, tested in tests/coll/device/ll_collective_test.cpp), so it is off here
// unless RIDGE_LL is set. Before main, so before any communicator reads it.
[[maybe_unused]] const bool kLLOffForTheseTests = setenv("RIDGE_LL", "off", 0) == 0;

// RIDGE_P2P for one test.
struct P2pSetting {
  explicit P2pSetting(const char* v) { setenv("RIDGE_P2P", v, 1); }
  ~P2pSetting() { unsetenv("RIDGE_P2P"); }
};

std::vector<Call> everyCollective() {
  std::vector<Call> v;
  int i = 0;
  for (Op op : kEveryOp) {
    for (const TypedCase& t : kTypedCases) {
      // Odd sizes: slices of unequal length, one below a page, one of several pages.
      v.push_back({op, t.dt, t.red, ++i % 2 ? size_t(1531) : size_t(40001)});
    }
  }
  v.push_back({Op::AllReduce, ridgeFloat32, ridgeSum, 0});  // empty: succeeds, output untouched
  return v;
}

// Runs `calls` on n ranks over `devices` emulated devices and checks that all went P2P.
void runAllP2p(int n, int devices, const std::vector<Call>& calls) {
  EmulatedRuntime rt(devices);
  ScopedRuntimeForTesting scope(&rt);
  withRanks(rt, n, devices, [&](TestRank& t) {
    uint32_t seed = 0x9e37u + static_cast<uint32_t>(n);
    for (const Call& c : calls) {
      runCall(rt, t, c, seed++);
      if (::testing::Test::HasFatalFailure()) return;
    }
    const ridge::p2p::Stats s = ridge::p2p::stats(t.comm);
    EXPECT_TRUE(s.capable);
    // Empty calls reach the proxy too (a stream-ordered no-op, src/api/api.cpp) and go
    // through P2P without addressing any buffer.
    EXPECT_EQ(s.p2pOps, uint64_t(calls.size())) << "rank " << t.rank;
    EXPECT_EQ(s.stagedBatches, 0u) << "rank " << t.rank;
    EXPECT_GT(s.ipcOpens, 0u) << "the peers' buffers were not reached through IPC handles";
  });
  EXPECT_GT(rt.reducesLaunched(), 0u) << "no device reduction ran: the P2P path did not reduce";
  EXPECT_EQ(rt.ipcViewsOpen(), 0u) << "mappings left open after the communicators were destroyed";
  // The proxies' setup loaded the kernels of each device once, before any stream waited, so
  // no reduction was a lazily loaded kernel's first launch behind a parked stream.
  EXPECT_EQ(rt.kernelPreloads(), static_cast<size_t>(std::min(n, devices)));
  EXPECT_EQ(rt.launchesBeforePreloadWhileStreamsWait(), 0u);
}

TEST(P2pCollectives, EveryCollectiveTwoRanksOnOneDevice) {
  runAllP2p(2, 1, everyCollective());
}

TEST(P2pCollectives, EveryCollectiveThreeRanksOnOneDevice) {
  runAllP2p(3, 1, everyCollective());
}

TEST(P2pCollectives, FourRanksOnTwoDevices) {
  runAllP2p(4, 2, everyCollective());
}

TEST(P2pCollectives, NineRanksReduceInRoundsOfEightSources) {
  runAllP2p(9, 1,
            {{Op::AllReduce, ridgeFloat32, ridgeSum, 1001},
             {Op::AllReduce, ridgeFloat16, ridgeAvg, 777, true},
             {Op::ReduceScatter, ridgeInt32, ridgeProd, 300, true},
             {Op::Reduce, ridgeFloat64, ridgeMax, 513, true}});
}

// Each rank reduces a slice of an allreduce; slices are cut at whole 16-byte vectors, so with
// aligned buffers every reduction can take the GPU kernel's vector path, also for counts
// that do not divide evenly (an even share per rank put rank 1's slice of 2^20 + 7 floats
// at a 4-byte offset: the kernel's scalar path).
TEST(P2pCollectives, AllReduceSlicesStartOnWholeVectors) {
  for (int n : {2, 3}) {
    EmulatedRuntime rt(1);
    ScopedRuntimeForTesting scope(&rt);
    withRanks(rt, n, 1, [&](TestRank& t) {
      uint32_t seed = 0x51ceu;
      for (const Call& c :
           {Call{Op::AllReduce, ridgeFloat32, ridgeSum, (size_t(1) << 20) + 7},
            Call{Op::AllReduce, ridgeFloat16, ridgeAvg, 5003},
            Call{Op::AllReduce, ridgeFloat64, ridgeMax, 13}, Call{Op::AllReduce, ridgeInt8, ridgeSum, 3}}) {
        runCall(rt, t, c, seed++);
        if (::testing::Test::HasFatalFailure()) return;
      }
      EXPECT_EQ(ridge::p2p::stats(t.comm).p2pOps, 4u) << "rank " << t.rank;
    });
    EXPECT_GT(rt.reducesLaunched(), 0u);
    EXPECT_EQ(rt.misalignedReduces(), 0u) << n << " ranks";
  }
}

TEST(P2pCollectives, InPlace) {
  std::vector<Call> calls;
  for (Op op : {Op::AllReduce, Op::ReduceScatter, Op::Reduce, Op::AllGather, Op::Broadcast})
    calls.push_back({op, ridgeFloat32, ridgeSum, 5003, /*inPlace=*/true});
  runAllP2p(3, 1, calls);
}

TEST(P2pCollectives, PointersOfThisProcessWithoutHandles) {
  // As with CUDA, whose ranks in one process use each other's pointers (no handle opens).
  EmulatedRuntime rt;
  rt.setIpcWithinProcess(false);
  ScopedRuntimeForTesting scope(&rt);
  withRanks(rt, 3, 1, [&](TestRank& t) {
    runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 9001}, 7);
    runCall(rt, t, {Op::AlltoAll, ridgeInt32, ridgeSum, 301}, 8);
    const ridge::p2p::Stats s = ridge::p2p::stats(t.comm);
    EXPECT_EQ(s.p2pOps, 2u);
    EXPECT_EQ(s.ipcOpens, 0u);
  });
  EXPECT_EQ(rt.ipcOpens(), 0u);
}

// ---- when it stages instead ---------------------------------------------------------------

TEST(P2pChoice, OffStagesThroughHostMemory) {
  P2pSetting off("off");
  EmulatedRuntime rt;
  ScopedRuntimeForTesting scope(&rt);
  withRanks(rt, 2, 1, [&](TestRank& t) {
    runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 4099}, 1);
    runCall(rt, t, {Op::AllGather, ridgeFloat32, ridgeSum, 4099}, 2);
    const ridge::p2p::Stats s = ridge::p2p::stats(t.comm);
    EXPECT_FALSE(s.capable);
    EXPECT_EQ(s.p2pOps, 0u);
    EXPECT_EQ(s.stagedBatches, 2u);
  });
  EXPECT_EQ(rt.reducesLaunched(), 0u) << "the staged path reduces on the host";
  EXPECT_EQ(rt.ipcOpens(), 0u);
}

TEST(P2pChoice, RefusedPeerAccessStagesButOneDeviceDoesNot) {
  for (int devices : {2, 1}) {
    EmulatedRuntime rt(devices);
    rt.setPeerAccess(false);
    ScopedRuntimeForTesting scope(&rt);
    withRanks(rt, 2, devices, [&](TestRank& t) {
      runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 2048}, 4);
      EXPECT_EQ(ridge::p2p::stats(t.comm).capable, devices == 1) << devices << " devices";
    });
  }
}

TEST(P2pChoice, InPlaceAlltoAllAndSendRecvGroupsAreStaged) {
  EmulatedRuntime rt;
  ScopedRuntimeForTesting scope(&rt);
  withRanks(rt, 2, 1, [&](TestRank& t) {
    const size_t cnt = 1000;
    DevMem buf(rt, 2 * cnt * 4), other(rt, cnt * 4);
    std::vector<unsigned char> in(2 * cnt * 4);
    fillRawAny(4, in.data(), 2 * cnt, rankKey(11, t.rank), 0);
    buf.put(in);
    ASSERT_EQ(ridgeAlltoAll(buf.p, buf.p, cnt, ridgeInt32, t.comm, t.stream), ridgeSuccess) << errorText();
    // A group with a collective and a send/receive pair.
    ridgeGroupStart();
    ridgeAllReduce(other.p, other.p, cnt, ridgeInt32, ridgeSum, t.comm, t.stream);
    ridgeSend(buf.p, cnt, ridgeInt32, 1 - t.rank, t.comm, t.stream);
    ridgeRecv(buf.at(cnt * 4), cnt, ridgeInt32, 1 - t.rank, t.comm, t.stream);
    ASSERT_EQ(ridgeGroupEnd(), ridgeSuccess) << errorText();
    ASSERT_TRUE(rt.synchronize(t.stream).isOk());
    const ridge::p2p::Stats s = ridge::p2p::stats(t.comm);
    EXPECT_TRUE(s.capable);
    EXPECT_EQ(s.p2pOps, 0u);
    EXPECT_EQ(s.stagedBatches, 2u);
    // After the alltoall block 0 holds rank 0's block for this rank; the group then sent it
    // to the peer and received the peer's block 0 into block 1.
    const std::vector<unsigned char> got = buf.get(cnt * 4, cnt * 4);
    Mismatches mm;
    checkRawAny(4, got.data(), cnt, rankKey(11, 0), size_t(1 - t.rank) * cnt, 0, mm);
    EXPECT_EQ(mm.count, 0u) << mm.text;
  });
}

// ---- link kinds from the topology, as the planner classes GPU pairs -----------------------

std::shared_ptr<ridge::topo::Topology> preset(const char* name) {
  auto t = std::make_shared<ridge::topo::Topology>();
  Status s = ridge::topo::loadPreset(name, t.get());
  EXPECT_TRUE(s.isOk()) << s.message();
  return t;
}
std::string gpuBus(const ridge::topo::Topology& t, size_t i) {
  return t.node(t.gpus().at(i)).busId;
}

TEST(P2pTopology, NvLinkPcieAndTheSocketLinkAsThePlannerClassesThem) {
  DeviceRuntime::PeerLink link;
  auto dgx = preset("dgx-h100");
  ASSERT_TRUE(ridge::p2p::linkFromTopology(*dgx, gpuBus(*dgx, 0), gpuBus(*dgx, 5), &link));
  EXPECT_TRUE(link.allowed);
  EXPECT_EQ(link.kind, DeviceRuntime::PeerLinkKind::NvLink);
  auto pcie = preset("pcie-8gpu-2socket");
  ASSERT_TRUE(ridge::p2p::linkFromTopology(*pcie, gpuBus(*pcie, 0), gpuBus(*pcie, 1), &link));
  EXPECT_TRUE(link.allowed);
  EXPECT_EQ(link.kind, DeviceRuntime::PeerLinkKind::Pcie);
  // GPU 7 hangs off the other socket: the planner routes the pair through host memory.
  ASSERT_TRUE(ridge::p2p::linkFromTopology(*pcie, gpuBus(*pcie, 0), gpuBus(*pcie, 7), &link));
  EXPECT_FALSE(link.allowed);
  EXPECT_FALSE(ridge::p2p::linkFromTopology(*pcie, gpuBus(*pcie, 0), "0000:ee:00.0", &link));
}

TEST(P2pTopology, AgreesWithThePlannersEdgeForEveryGpuPairOfThePresets) {
  for (const char* name : {"dgx-h100", "dgx-a100", "pcie-8gpu-2socket"}) {
    auto t = preset(name);
    ridge::plan::SearchOptions options;
    options.stepBudget = 1000;  // only the routes matter here, not the channel search
    ridge::plan::NodeTemplate tp;
    const int k = static_cast<int>(t->gpus().size());
    ASSERT_EQ(k, 8) << name;
    int kinds[3] = {0, 0, 0};  // nvlink, pcie, refused pairs seen
    Status s = ridge::plan::buildNodeTemplate(t, k, false, {}, options, &tp);
    ASSERT_TRUE(s.isOk()) << name << ": " << s.message();
    for (int a = 0; a < k; ++a) {
      for (int b = 0; b < k; ++b) {
        if (a == b) continue;
        const ridge::plan::Route& route = tp.routes.at(static_cast<size_t>(tp.pairRoute[size_t(a * k + b)]));
        DeviceRuntime::PeerLink link;
        ASSERT_TRUE(ridge::p2p::linkFromTopology(*t, gpuBus(*t, size_t(a)), gpuBus(*t, size_t(b)), &link));
        const char* what = ridge::plan::transportName(route.transport);
        ++kinds[link.allowed ? (link.kind == DeviceRuntime::PeerLinkKind::NvLink ? 0 : 1) : 2];
        switch (route.transport) {
          case ridge::plan::Transport::NvLink:
            EXPECT_TRUE(link.allowed && link.kind == DeviceRuntime::PeerLinkKind::NvLink)
                << name << " " << a << "-" << b << " " << what;
            break;
          case ridge::plan::Transport::PcieP2p:
            EXPECT_TRUE(link.allowed && link.kind == DeviceRuntime::PeerLinkKind::Pcie)
                << name << " " << a << "-" << b << " " << what;
            break;
          default: EXPECT_FALSE(link.allowed) << name << " " << a << "-" << b << " " << what; break;
        }
      }
    }
    // NVLink presets: every pair over NVLink; the PCIe preset: both P2P and refused pairs.
    const bool nv = std::string(name).rfind("dgx", 0) == 0;
    EXPECT_EQ(kinds[0], nv ? 56 : 0) << name;
    EXPECT_EQ(kinds[1] > 0 && kinds[2] > 0, !nv) << name;
  }
}

TEST(P2pTopology, ACommunicatorAcrossTheSocketLinkIsStaged) {
  auto pcie = preset("pcie-8gpu-2socket");
  ridge::p2p::setTopologyForTesting(pcie);
  for (size_t other : {1u, 7u}) {
    EmulatedRuntime rt(2);  // peer access allowed, link kind unknown: the topology decides
    rt.setPciBusIds({gpuBus(*pcie, 0), gpuBus(*pcie, other)});
    ScopedRuntimeForTesting scope(&rt);
    withRanks(rt, 2, 2, [&](TestRank& t) {
      runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 3000}, 31);
      EXPECT_EQ(ridge::p2p::stats(t.comm).capable, other == 1) << "GPU0 and GPU" << other;
    });
  }
  ridge::p2p::setTopologyForTesting(nullptr);
}

TEST(P2pTopology, DevicesAreMatchedByBusIdAndARankThatCannotSeeAPeersDeviceStagesEveryone) {
  // Two ranks on devices 0 and 1. The ranks find each other's devices by bus id; when the
  // rank on device 1 cannot see device 0 (as a process with CUDA_VISIBLE_DEVICES=1 could
  // not), only that rank knows P2P is impossible: the vote makes both stage.
  for (bool hidden : {false, true}) {
    EmulatedRuntime rt(2);
    rt.setPciBusIds({"0000:17:00.0", "0000:65:00.0"});
    if (hidden) rt.setVisibleDevices(1, {1});
    ScopedRuntimeForTesting scope(&rt);
    withRanks(rt, 2, 2, [&](TestRank& t) {
      runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 3000}, 41);
      runCall(rt, t, {Op::AllGather, ridgeInt32, ridgeSum, 700}, 42);
      const ridge::p2p::Stats s = ridge::p2p::stats(t.comm);
      EXPECT_EQ(s.capable, !hidden) << "rank " << t.rank;
      EXPECT_EQ(s.p2pOps, hidden ? 0u : 2u) << "rank " << t.rank;
      EXPECT_EQ(s.stagedBatches, hidden ? 2u : 0u) << "rank " << t.rank;
    });
  }
}

// ---- the mapping cache --------------------------------------------------------------------

// Repeated calls on the same buffers: each rank exports its two allocations once (the export
// cache) and opens each peer's once (the mapping cache), whatever the collective.
TEST(P2pMappingCache, ReusesExportsAndHandlesAcrossCallsAndClosesThemAtDestroy) {
  EmulatedRuntime rt;
  ScopedRuntimeForTesting scope(&rt);
  const int n = 3;
  const size_t cnt = 4096;
  withRanks(rt, n, 1, [&](TestRank& t) {
    DevMem send(rt, cnt * 4), recv(rt, cnt * 4);
    runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, cnt}, 20, &send, &recv);
    const ridge::p2p::Stats first = ridge::p2p::stats(t.comm);
    EXPECT_EQ(first.ipcOpens, 2u * (n - 1)) << "one open per peer buffer";
    EXPECT_EQ(first.ipcExports, 2u) << "one export per buffer";
    EXPECT_EQ(first.exportHits, 0u);
    for (uint32_t i = 0; i < 4; ++i)
      runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, cnt}, 21 + i, &send, &recv);
    runCall(rt, t, {Op::ReduceScatter, ridgeFloat32, ridgeSum, cnt / 4}, 25, &send, &recv);
    const ridge::p2p::Stats later = ridge::p2p::stats(t.comm);
    EXPECT_EQ(later.ipcOpens, first.ipcOpens) << "the same buffers were opened again";
    // Allreduce maps both buffers of every peer; reduce-scatter only their send buffers.
    EXPECT_EQ(later.cacheHits, 4u * 2u * (n - 1) + (n - 1));
    EXPECT_EQ(later.mappingsOpen, 2u * (n - 1));
    EXPECT_EQ(later.ipcExports, 2u) << "the same buffers were exported again";
    EXPECT_EQ(later.exportHits, 5u * 2u);
    EXPECT_EQ(later.exportsCached, 2u);
    EXPECT_EQ(later.p2pOps, 6u);
  });
  EXPECT_EQ(rt.ipcOpens(), uint64_t(n) * 2 * (n - 1));
  EXPECT_EQ(rt.ipcExports(), uint64_t(n) * 2) << "the runtime was asked to export again";
  EXPECT_EQ(rt.ipcViewsOpen(), 0u) << "destroy left mappings open";
}

TEST(P2pMappingCache, BoundedAndNeverReadsAFreedBufferThroughItsOldMapping) {
  EmulatedRuntime rt;
  ScopedRuntimeForTesting scope(&rt);
  withRanks(rt, 2, 1, [&](TestRank& t) {
    const size_t cnt = 256;
    // More distinct buffers than the cache holds, all alive: it must evict.
    std::vector<std::unique_ptr<DevMem>> bufs;
    size_t capacity = 0;
    for (uint32_t i = 0; i < 40; ++i) {
      bufs.push_back(std::make_unique<DevMem>(rt, cnt * 4));
      bufs.push_back(std::make_unique<DevMem>(rt, cnt * 4));
      runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, cnt}, 100 + i, bufs[bufs.size() - 2].get(),
              bufs.back().get());
      const ridge::p2p::Stats s = ridge::p2p::stats(t.comm);
      capacity = s.cacheCapacity;
      ASSERT_LE(s.mappingsOpen, s.cacheCapacity);
    }
    // Evicted mappings close once the proxy is idle (just after it released the last call).
    ridge::p2p::Stats s = ridge::p2p::stats(t.comm);
    for (const auto t0 = Clock::now(); s.closesDeferred > 0 && Clock::now() - t0 < std::chrono::seconds(5);
         s = ridge::p2p::stats(t.comm))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(s.closesDeferred, 0u);
    EXPECT_EQ(s.ipcOpens, 80u);
    EXPECT_EQ(s.ipcCloses, 80u - capacity);
    // Free and reallocate (the emulator's next mapping often lands at the freed address):
    // the new buffer's handle differs, so the stale mapping is replaced, not read.
    for (uint32_t i = 0; i < 6; ++i) {
      bufs.clear();
      bufs.push_back(std::make_unique<DevMem>(rt, cnt * 4));
      bufs.push_back(std::make_unique<DevMem>(rt, cnt * 4));
      runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, cnt}, 200 + i, bufs[0].get(), bufs[1].get());
      if (::testing::Test::HasFatalFailure()) return;
    }
  });
  EXPECT_EQ(rt.ipcViewsOpen(), 0u);
}

// ---- the export cache ----------------------------------------------------------------------

// Every rank's export and mapping counters after a call (for the lines below).
struct Handles {
  uint64_t exports, exportHits, opens;
};
Handles handlesOf(const TestRank& t) {
  const ridge::p2p::Stats s = ridge::p2p::stats(t.comm);
  return {s.ipcExports, s.exportHits, s.ipcOpens};
}

// A buffer freed and allocated again at the same address (the emulator's reallocateInPlace,
// as a driver may recycle an address) is another allocation: exported anew, mapped anew, and
// the collective reads the new memory. An export cache keyed by address would send the old
// handle, whose mapping holds the previous call's input: the results would be wrong.
TEST(P2pExportCache, AnAllocationAtAFreedOnesAddressIsExportedAgain) {
  for (const bool ids : {true, false}) {
    SCOPED_TRACE(ids ? "allocation ids" : "no allocation ids: handles compared");
    EmulatedRuntime rt;
    rt.setAllocationIdsSupported(ids);
    ScopedRuntimeForTesting scope(&rt);
    const int n = 3;
    const size_t cnt = 3000;
    withRanks(rt, n, 1, [&](TestRank& t) {
      DevMem send(rt, cnt * 4), recv(rt, cnt * 4);
      const Call call{Op::AllReduce, ridgeInt32, ridgeSum, cnt};
      runCall(rt, t, call, 60, &send, &recv);
      const Handles before = handlesOf(t);
      for (uint32_t round = 0; round < 3; ++round) {
        for (DevMem* m : {&send, &recv}) {
          const uint64_t exportsBefore = handlesOf(t).exports;
          void* const address = m->p;
          ASSERT_TRUE(rt.reallocateInPlace(m->p).isOk());
          void* base = nullptr;
          size_t len = 0;
          ASSERT_TRUE(rt.allocationRange(address, &base, &len).isOk());
          ASSERT_EQ(base, address) << "the new allocation is not at the freed one's address";
          runCall(rt, t, call, 61 + round * 2 + (m == &recv ? 1 : 0), &send, &recv);
          if (::testing::Test::HasFatalFailure()) return;
          const Handles now = handlesOf(t);
          // With ids, only the new allocation is exported; without, both buffers every call.
          EXPECT_EQ(now.exports - exportsBefore, ids ? 1u : 2u);
        }
      }
      const Handles after = handlesOf(t);
      // Each of the 6 new allocations is opened anew by every peer.
      EXPECT_EQ(after.opens - before.opens, 6u * (n - 1));
      if (ids) EXPECT_EQ(after.exportHits, 6u);
    });
    EXPECT_EQ(rt.ipcViewsOpen(), 0u);
  }
}

// Pair 0 is used again after pairs 1..h were cached, so it is no longer the oldest entry;
// then enough new pairs to evict two pairs' worth. Least recently used: pairs 1 and 2 go and
// pair 0 stays (an eviction in insertion order would drop pair 0 first).
TEST(P2pExportCache, BoundedAndEvictsTheLeastRecentlyUsed) {
  EmulatedRuntime rt;
  ScopedRuntimeForTesting scope(&rt);
  withRanks(rt, 2, 1, [&](TestRank& t) {
    const size_t cnt = 256;
    const Call call{Op::AllReduce, ridgeFloat32, ridgeSum, cnt};
    std::vector<std::unique_ptr<DevMem>> bufs;
    auto pair = [&](size_t i) {
      while (bufs.size() < 2 * i + 2) bufs.push_back(std::make_unique<DevMem>(rt, cnt * 4));
      return std::make_pair(bufs[2 * i].get(), bufs[2 * i + 1].get());
    };
    uint32_t seed = 499;
    auto use = [&](size_t i) {
      const auto [send, recv] = pair(i);
      runCall(rt, t, call, seed++, send, recv);
    };
    auto exports = [&] { return ridge::p2p::stats(t.comm).ipcExports; };
    use(0);  // the first call creates the cache
    if (::testing::Test::HasFatalFailure()) return;
    const size_t capacity = ridge::p2p::stats(t.comm).exportCacheCapacity;
    ASSERT_GE(capacity, 8u);
    // About half full: pairs 0..h.
    const size_t h = capacity / 4;
    for (size_t i = 1; i <= h; ++i) {
      use(i);
      if (::testing::Test::HasFatalFailure()) return;
    }
    ASSERT_EQ(exports(), 2 * (h + 1));
    use(0);  // a hit: pair 0 becomes the most recently used
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_EQ(exports(), 2 * (h + 1)) << "pair 0 was exported again";
    // New pairs until four entries (pairs 1 and 2) had to go.
    const size_t added = (capacity - 2 * (h + 1)) / 2 + 2;
    for (size_t i = h + 1; i <= h + added; ++i) {
      use(i);
      if (::testing::Test::HasFatalFailure()) return;
      ASSERT_LE(ridge::p2p::stats(t.comm).exportsCached, capacity);
    }
    const uint64_t exported = exports();
    EXPECT_EQ(exported, 2 * (h + 1 + added));
    EXPECT_EQ(ridge::p2p::stats(t.comm).exportsCached, capacity);
    use(0);
    EXPECT_EQ(exports(), exported) << "pair 0, used after pairs 1..h, was evicted before them";
    use(h + added);
    EXPECT_EQ(exports(), exported) << "the newest pair was evicted";
    use(1);
    EXPECT_EQ(exports(), exported + 2) << "pair 1, the least recently used, was still cached";
    EXPECT_EQ(ridge::p2p::stats(t.comm).exportsCached, capacity);
  });
  EXPECT_EQ(rt.ipcViewsOpen(), 0u);
}

// ---- no implicitly synchronizing runtime call while a stream waits (review H1) ------------

// Calls queued back to back (earlier release waits still pending) on two ranks on two
// emulated devices: the first creates the P2P context (a stream), later ones evict cached
// mappings (more distinct buffers than the cache holds) and need more staging than the
// initial buffer. None of it may create a stream, enable peer access, close a mapping or
// allocate or free pinned memory while a stream of that device waits on the proxy.
TEST(P2pMappingCache, NoSynchronizingCallWhileAStreamWaits) {
  EmulatedRuntime rt(2);
  ScopedRuntimeForTesting scope(&rt);
  withRanks(rt, 2, 2, [&](TestRank& t) {
    std::vector<size_t> counts(40, 256);
    counts.insert(counts.end(), {300000, 700000, 1500000});
    std::vector<std::unique_ptr<DevMem>> sends, recvs;
    std::vector<std::vector<uint32_t>> keys;
    for (size_t i = 0; i < counts.size(); ++i) {
      const uint32_t seed = 300 + static_cast<uint32_t>(i);
      keys.push_back({rankKey(seed, 0), rankKey(seed, 1)});
      sends.push_back(std::make_unique<DevMem>(rt, counts[i] * 4));
      recvs.push_back(std::make_unique<DevMem>(rt, counts[i] * 4));
      std::vector<unsigned char> in(counts[i] * 4);
      fillRankInput(Op::AllReduce, ridgeFloat32, ridgeSum, in.data(), counts[i], 2, keys[i][t.rank]);
      sends.back()->put(in);
      recvs.back()->put(std::vector<unsigned char>(counts[i] * 4, kPoison));
    }
    for (size_t i = 0; i < counts.size(); ++i)
      ASSERT_EQ(issue(Op::AllReduce, sends[i]->p, recvs[i]->p, counts[i], ridgeFloat32, ridgeSum, 0, t.comm,
                      t.stream),
                ridgeSuccess)
          << errorText();
    Status st = rt.synchronize(t.stream);
    ASSERT_TRUE(st.isOk()) << st.message();
    for (size_t i = 0; i < counts.size(); ++i) {
      Mismatches mm;
      checkRankOutput(Op::AllReduce, ridgeFloat32, ridgeSum, recvs[i]->get(0, counts[i] * 4).data(),
                      counts[i], keys[i], t.rank, 0, kPoison, mm);
      EXPECT_EQ(mm.count, 0u) << "call " << i << " rank " << t.rank << ": " << mm.text;
    }
    ridge::p2p::Stats s = ridge::p2p::stats(t.comm);
    for (const auto t0 = Clock::now(); s.closesDeferred > 0 && Clock::now() - t0 < std::chrono::seconds(5);
         s = ridge::p2p::stats(t.comm))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(s.p2pOps, counts.size());
    EXPECT_GT(s.ipcCloses, 0u) << "no mapping was evicted: the test does not reach the eviction path";
  });
  EXPECT_EQ(rt.allocationsWhileStreamsWait(), 0u);
}

// ---- batches: operations queued back to back, barriers where one depends on another -------

// Random int32 inputs per (rank, buffer); exact sums, so results compare bit for bit.
std::vector<int32_t> intInput(uint32_t seed, int rank, size_t count) {
  std::vector<int32_t> v(count);
  uint32_t x = rankKey(seed, rank) | 1u;
  for (auto& e : v) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    e = static_cast<int32_t>(x % 2001u) - 1000;
  }
  return v;
}

std::vector<int32_t> readInts(const DevMem& m, size_t count) {
  const std::vector<unsigned char> raw = m.get(0, count * 4);
  std::vector<int32_t> v(count);
  std::memcpy(v.data(), raw.data(), raw.size());
  return v;
}

void putInts(const DevMem& m, const std::vector<int32_t>& v) {
  std::vector<unsigned char> raw(v.size() * 4);
  std::memcpy(raw.data(), v.data(), raw.size());
  m.put(raw);
}

// A group of independent allreduces (distinct buffers) is queued as one segment: one stream
// synchronization and one end exchange for the whole batch. 40 of them are cut every 16
// operations; with 4 KiB connector slots their descriptors travel 18 to a message.
TEST(P2pBatches, IndependentOperationsShareABarrierPerSixteen) {
  for (size_t ops : {size_t(6), size_t(40)}) {
    EmulatedRuntime rt;
    ScopedRuntimeForTesting scope(&rt);
    setenv("RIDGE_SHM_SLOT_BYTES", "4096", 1);
    const int n = 3;
    const size_t cnt = 777;
    withRanks(rt, n, 1, [&](TestRank& t) {
      std::vector<std::unique_ptr<DevMem>> in, out;
      for (size_t i = 0; i < ops; ++i) {
        in.push_back(std::make_unique<DevMem>(rt, cnt * 4));
        out.push_back(std::make_unique<DevMem>(rt, cnt * 4));
        putInts(*in.back(), intInput(uint32_t(i), t.rank, cnt));
        out.back()->put(std::vector<unsigned char>(cnt * 4, kPoison));
      }
      ASSERT_EQ(ridgeGroupStart(), ridgeSuccess);
      for (size_t i = 0; i < ops; ++i)
        ASSERT_EQ(ridgeAllReduce(in[i]->p, out[i]->p, cnt, ridgeInt32, ridgeSum, t.comm, t.stream),
                  ridgeSuccess)
            << errorText();
      ASSERT_EQ(ridgeGroupEnd(), ridgeSuccess) << errorText();
      ASSERT_TRUE(rt.synchronize(t.stream).isOk());
      ridgeResult_t async = ridgeSuccess;
      ASSERT_EQ(ridgeCommGetAsyncError(t.comm, &async), ridgeSuccess);
      ASSERT_EQ(async, ridgeSuccess) << errorText();
      for (size_t i = 0; i < ops; ++i) {
        std::vector<int64_t> want(cnt, 0);
        for (int j = 0; j < n; ++j) {
          const std::vector<int32_t> v = intInput(uint32_t(i), j, cnt);
          for (size_t e = 0; e < cnt; ++e) want[e] += v[e];
        }
        const std::vector<int32_t> got = readInts(*out[i], cnt);
        size_t bad = 0;
        for (size_t e = 0; e < cnt; ++e) bad += got[e] != want[e];
        EXPECT_EQ(bad, 0u) << "allreduce " << i << " of " << ops << ", rank " << t.rank;
      }
      const ridge::p2p::Stats s = ridge::p2p::stats(t.comm);
      EXPECT_EQ(s.p2pOps, ops);
      EXPECT_EQ(s.barriers, (ops + 15) / 16) << ops << " independent operations";
      // The first descriptor travels with the vote; the other ops - 1, 18 to a 4 KiB message.
      EXPECT_EQ(s.descriptorMessages, (ops - 1 + 17) / 18) << ops << " operations";
    });
    unsetenv("RIDGE_SHM_SLOT_BYTES");
  }
}

// Operations of one group that depend on each other across ranks: the second reads (or
// overwrites) what the first writes on other ranks, so a barrier must separate them. Rank 1
// serves a slow emulated device (every copy and reduction waits 15 ms), so without that
// barrier ranks 0 and 2 would read rank 1's buffer before rank 1 has written its part.
TEST(P2pBatches, AnOperationThatDependsOnAnotherWaitsForItOnEveryRank) {
  const int n = 3;
  const size_t cnt = 3001;
  auto sums = [&](uint32_t seed) {
    std::vector<int64_t> want(cnt, 0);
    for (int j = 0; j < n; ++j) {
      const std::vector<int32_t> v = intInput(seed, j, cnt);
      for (size_t e = 0; e < cnt; ++e) want[e] += v[e];
    }
    return want;
  };
  EmulatedRuntime rt(2);
  ScopedRuntimeForTesting scope(&rt);
  rt.setWorkDelay(1, std::chrono::milliseconds(15));
  withRanks(rt, n, 2, [&](TestRank& t) {
    // Read after write: allreduce into B, then broadcast rank 1's B into C.
    DevMem a(rt, cnt * 4), b(rt, cnt * 4), c(rt, cnt * 4);
    putInts(a, intInput(7, t.rank, cnt));
    b.put(std::vector<unsigned char>(cnt * 4, kPoison));
    c.put(std::vector<unsigned char>(cnt * 4, kPoison));
    ASSERT_EQ(ridgeGroupStart(), ridgeSuccess);
    ASSERT_EQ(ridgeAllReduce(a.p, b.p, cnt, ridgeInt32, ridgeSum, t.comm, t.stream), ridgeSuccess);
    ASSERT_EQ(ridgeBroadcast(b.p, c.p, cnt, ridgeInt32, 1, t.comm, t.stream), ridgeSuccess);
    ASSERT_EQ(ridgeGroupEnd(), ridgeSuccess) << errorText();
    // Write after write and after read: two in-place allreduces of one buffer (a new input
    // once the first group has read the old one).
    ASSERT_TRUE(rt.synchronize(t.stream).isOk());
    putInts(a, intInput(8, t.rank, cnt));
    ASSERT_EQ(ridgeGroupStart(), ridgeSuccess);
    ASSERT_EQ(ridgeAllReduce(a.p, a.p, cnt, ridgeInt32, ridgeSum, t.comm, t.stream), ridgeSuccess);
    ASSERT_EQ(ridgeAllReduce(a.p, a.p, cnt, ridgeInt32, ridgeSum, t.comm, t.stream), ridgeSuccess);
    ASSERT_EQ(ridgeGroupEnd(), ridgeSuccess) << errorText();
    ASSERT_TRUE(rt.synchronize(t.stream).isOk());
    ridgeResult_t async = ridgeSuccess;
    ASSERT_EQ(ridgeCommGetAsyncError(t.comm, &async), ridgeSuccess);
    ASSERT_EQ(async, ridgeSuccess) << errorText();
    const std::vector<int64_t> first = sums(7), second = sums(8);
    const std::vector<int32_t> gotC = readInts(c, cnt), gotA = readInts(a, cnt);
    size_t badC = 0, badA = 0;
    for (size_t e = 0; e < cnt; ++e) {
      badC += gotC[e] != first[e];
      badA += gotA[e] != second[e] * n;
    }
    EXPECT_EQ(badC, 0u) << "rank " << t.rank
                        << ": the broadcast read rank 1's output before the allreduce wrote it";
    EXPECT_EQ(badA, 0u) << "rank " << t.rank << ": the second in-place allreduce overlapped the first";
    const ridge::p2p::Stats s = ridge::p2p::stats(t.comm);
    EXPECT_EQ(s.p2pOps, 4u);
    EXPECT_EQ(s.barriers, 4u) << "each dependent operation needs its own segment";
  });
}

// ---- same process: pid and nonce (review L2) ----------------------------------------------

// A peer in another pid namespace of this host can have this process's pid: only the nonce
// tells them apart. A peer that sent no nonce (0) is judged by pid alone.
TEST(P2pProcess, ThisProcessNeedsThePidAndTheNonce) {
  const uint64_t nonce = ridge::p2p::processNonce();
  EXPECT_NE(nonce, 0u);
  EXPECT_EQ(ridge::p2p::processNonce(), nonce) << "the nonce must be fixed for the process";
  ridge::PeerInfo peer{};
  peer.pid = static_cast<int32_t>(getpid());
  peer.processNonce = nonce;
  EXPECT_TRUE(ridge::p2p::isThisProcess(peer));
  peer.processNonce = nonce ^ 0x5a5a5a5a5a5a5a5aull;  // same pid, another process
  EXPECT_FALSE(ridge::p2p::isThisProcess(peer));
  peer.processNonce = 0;
  EXPECT_TRUE(ridge::p2p::isThisProcess(peer));
  peer.pid = static_cast<int32_t>(getpid()) + 1;
  peer.processNonce = nonce;
  EXPECT_FALSE(ridge::p2p::isThisProcess(peer));
}

// ---- failures -----------------------------------------------------------------------------

// Runs one allreduce per rank (count per rank from `countOf`) that is expected to fail
// asynchronously, and returns each rank's asynchronous error; the streams must be released.
std::vector<ridgeResult_t> failingAllReduce(EmulatedRuntime& rt, int n, size_t (*countOf)(int rank)) {
  std::vector<ridgeResult_t> errors(n, ridgeSuccess);
  withRanks(rt, n, 1, [&](TestRank& t) {
    const size_t cnt = countOf(t.rank);
    DevMem send(rt, cnt * 4), recv(rt, cnt * 4);
    const auto t0 = Clock::now();
    ASSERT_EQ(ridgeAllReduce(send.p, recv.p, cnt, ridgeFloat32, ridgeSum, t.comm, t.stream), ridgeSuccess);
    Status s = rt.synchronize(t.stream);
    EXPECT_TRUE(s.isOk()) << s.message();
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), ridgetest::scaledSeconds(10.0))
        << "a rank waited for a timeout";
    ridgeCommGetAsyncError(t.comm, &errors[t.rank]);
  });
  return errors;
}

TEST(P2pFailures, RanksDisagreeingOnTheCountAllFailWithInvalidUsage) {
  EmulatedRuntime rt;
  ScopedRuntimeForTesting scope(&rt);
  const auto errors = failingAllReduce(rt, 3, [](int rank) { return size_t(rank == 2 ? 1001 : 1000); });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[r], ridgeInvalidUsage) << "rank " << r;
}

TEST(P2pFailures, AFailureOnOneRankReachesThePeersWithoutATimeout) {
  EmulatedRuntime rt;
  rt.failNextIpcOpens(1);  // the first rank to open a peer's handle fails, the others do not
  ScopedRuntimeForTesting scope(&rt);
  const auto errors = failingAllReduce(rt, 3, [](int) { return size_t(4096); });
  int remote = 0, local = 0;
  for (ridgeResult_t e : errors) {
    remote += e == ridgeRemoteError;
    local += e == ridgeSystemError;
  }
  EXPECT_EQ(local, 1) << "the rank whose ipcOpen failed";
  EXPECT_EQ(remote, 2) << "its peers learn it from its end message";
  EXPECT_EQ(rt.ipcViewsOpen(), 0u);
}

// Calls that disagree in one field (issue 19, signatures on the P2P path): the operation
// descriptors every rank sends before a P2P operation are its signature. Each rank makes its
// call on device memory; every rank must fail asynchronously with ridgeInvalidUsage naming
// both calls, within seconds; a correct call on a fresh communicator is then right.
void expectMismatchFailsEveryRank(const Disagreement& k) {
  EmulatedRuntime rt;
  ScopedRuntimeForTesting scope(&rt);
  std::vector<ridgeResult_t> errors(2, ridgeSuccess);
  std::vector<std::string> texts(2);
  withRanks(rt, 2, 1, [&](TestRank& t) {
    const int r = t.rank;
    const size_t bytes = k.count[r] * dtSize(k.dt[r]);
    DevMem send(rt, bytes), recv(rt, bytes);
    const auto t0 = Clock::now();
    ASSERT_EQ(issueDisagreeing(k, r, send.p, recv.p, t.comm, t.stream), ridgeSuccess) << errorText();
    Status s = rt.synchronize(t.stream);
    EXPECT_TRUE(s.isOk()) << s.message();
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), ridgetest::scaledSeconds(10.0))
        << "a rank waited for a timeout";
    ridgeCommGetAsyncError(t.comm, &errors[r]);
    const char* e = ridgeGetLastError(t.comm);
    texts[r] = e ? e : "";
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], ridgeInvalidUsage) << k.name << ": rank " << r << ": " << texts[r];
    for (const char* want : k.says)
      EXPECT_NE(texts[r].find(want), std::string::npos)
          << k.name << ": rank " << r << "'s message lacks \"" << want << "\": " << texts[r];
  }
  // A correct call afterwards, on a fresh communicator (the broken one refuses calls), is right
  // and goes P2P.
  withRanks(rt, 2, 1, [&](TestRank& t) {
    runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 1531}, 77);
    expectStreamDone(rt, t);
    EXPECT_EQ(ridge::p2p::stats(t.comm).p2pOps, 1u);
  });
}

TEST(P2pFailures, MismatchedRootCountTypeOrOpFailsEveryRankNamingBothCalls) {
  const Disagreement cases[] = {
      {"root",
       {Op::Broadcast, Op::Broadcast},
       {ridgeFloat32, ridgeFloat32},
       {ridgeSum, ridgeSum},
       {1000, 1000},
       {0, 1},
       {"broadcast(root 0, 1000 x float", "broadcast(root 1, 1000 x float"}},
      {"count",
       {Op::AllReduce, Op::AllReduce},
       {ridgeFloat32, ridgeFloat32},
       {ridgeSum, ridgeSum},
       {1000, 1002},
       {0, 0},
       {"allreduce(1000 x float", "allreduce(1002 x float"}},
      {"datatype (same bytes)",
       {Op::AllReduce, Op::AllReduce},
       {ridgeFloat32, ridgeInt32},
       {ridgeSum, ridgeSum},
       {1000, 1000},
       {0, 0},
       {"1000 x float", "1000 x int32"}},
      {"op",
       {Op::AllReduce, Op::AllReduce},
       {ridgeFloat32, ridgeFloat32},
       {ridgeSum, ridgeMax},
       {1000, 1000},
       {0, 0},
       {"float, sum)", "float, max)"}},
  };
  for (const Disagreement& k : cases) {
    SCOPED_TRACE(k.name);
    expectMismatchFailsEveryRank(k);
  }
}

// ---- abort --------------------------------------------------------------------------------

TEST(P2pAbort, AbortDuringAP2pCollectiveReleasesTheStream) {
  EmulatedRuntime rt;
  ScopedRuntimeForTesting scope(&rt);
  std::atomic<bool> rank0Done{false};
  withRanks(
      rt, 2, 1,
      [&](TestRank& t) {
        DevMem send(rt, 4096), recv(rt, 4096);
        if (t.rank == 1) {
          // Calls, but its stream never reaches the collective: rank 0's proxy waits in the
          // P2P exchange for rank 1's descriptor.
          std::atomic<bool> open{false};
          ASSERT_TRUE(rt.enqueue(t.stream, [&] {
                          const auto t0 = Clock::now();
                          while (!open.load() && Clock::now() - t0 < std::chrono::seconds(20))
                            std::this_thread::sleep_for(std::chrono::milliseconds(1));
                          return Status::ok();
                        }).isOk());
          EXPECT_EQ(ridgeAllReduce(send.p, recv.p, 1024, ridgeFloat32, ridgeSum, t.comm, t.stream),
                    ridgeSuccess);
          const auto t0 = Clock::now();
          while (!rank0Done.load() && Clock::now() - t0 < std::chrono::seconds(20))
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          EXPECT_EQ(ridgeCommAbort(t.comm), ridgeSuccess);
          open.store(true);
          EXPECT_TRUE(rt.synchronize(t.stream).isOk());
          return;
        }
        EXPECT_EQ(ridgeAllReduce(send.p, recv.p, 1024, ridgeFloat32, ridgeSum, t.comm, t.stream),
                  ridgeSuccess);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        EXPECT_TRUE(ridge::p2p::stats(t.comm).capable) << "the proxy is not in the P2P path";
        expectAbortReleasesTheStream(rt, t);
        rank0Done.store(true);
      },
      /*destroy=*/false);
}

}  // namespace

// ---- the API's classification reaches P2P (review item) ---------------------------------------

// Each buffer of a call is classified once, by the API; the P2P path takes the kinds from
// the operation instead of asking the runtime again (before: 2 more per rank and call).
TEST(P2pClassification, EachBufferIsClassifiedOncePerCall) {
  EmulatedRuntime rt;
  ScopedRuntimeForTesting scope(&rt);
  const int n = 2, calls = 3;
  const uint64_t before = rt.classifyCalls();
  withRanks(rt, n, 1, [&](TestRank& t) {
    for (uint32_t i = 0; i < calls; ++i)
      runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 4099}, 40 + i);
    EXPECT_EQ(ridge::p2p::stats(t.comm).p2pOps, uint64_t(calls)) << "rank " << t.rank << ": not P2P";
  });
  EXPECT_EQ(rt.classifyCalls() - before, uint64_t(n) * calls * 2) << "send and receive buffer, once each";
}

// A managed buffer still keeps a batch off P2P when its kind comes from the API.
TEST(P2pClassification, ManagedBufferKindStillStages) {
  EmulatedRuntime rt;
  ScopedRuntimeForTesting scope(&rt);
  const size_t cnt = 1024;
  withRanks(rt, 2, 1, [&](TestRank& t) {
    void* managed = nullptr;
    ASSERT_TRUE(rt.allocDeviceOn(cnt * 4, &managed, -1, /*managed=*/true).isOk());
    DevMem recv(rt, cnt * 4);
    std::vector<float> ones(cnt, 1.0f);
    std::memcpy(managed, ones.data(), cnt * 4);  // managed memory: the host may write it
    EXPECT_EQ(ridgeAllReduce(managed, recv.p, cnt, ridgeFloat32, ridgeSum, t.comm, t.stream), ridgeSuccess)
        << errorText();
    EXPECT_TRUE(rt.synchronize(t.stream).isOk());
    std::vector<unsigned char> got = recv.get(0, cnt * 4);
    float v = 0;
    std::memcpy(&v, got.data() + 4 * (cnt - 1), 4);
    EXPECT_EQ(v, 2.0f);
    const ridge::p2p::Stats s = ridge::p2p::stats(t.comm);
    EXPECT_EQ(s.p2pOps, 0u);
    EXPECT_EQ(s.stagedBatches, 1u);
    rt.freeDevice(managed);
  });
}
