// The rdma-core provider driven through a fake function table (ibv_api.h): the same calls
// the provider makes on a real NIC, answered by test doubles, so that the mlx5 direct queue
// creation, its error paths and the GDR-write ladder probe run here without a NIC or GPU
// (the GPU is the emulated runtime). Each case checks the rung and reason the probe leads
// to, and that every object it created was destroyed and every mapping undone.
#include <gtest/gtest.h>

#if defined(RIDGE_HAVE_VERBS) && defined(RIDGE_HAVE_MLX5DV)

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "core/log.h"
#include "device/emulated_runtime.h"
#include "device_ranks.h"  // tests/coll/device
#include "scoped_env.h"
#include "tests/verbs/fake_rdma.h"
#include "tests/verbs/two_ranks.h"
#include "transports/gdr/gdr_transport.h"
#include "transports/verbs/ibv_api.h"
#include "transports/verbs/verbs.h"

namespace ridge {
namespace {

using namespace verbs;
using namespace verbs_test;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

class VerbsFakeApi : public ::testing::Test {
 protected:
  void SetUp() override { gNic = &nic_; }
  void TearDown() override { gNic = nullptr; }

  // Opens the fake device through the provider, as RIDGE_NET=verbs does.
  std::unique_ptr<Device> open(const IbvApi* api) {
    scoped_ = std::make_unique<ScopedIbvApiForTesting>(api);
    std::unique_ptr<Provider> p;
    Status st = openProvider("verbs", &p);
    EXPECT_TRUE(st.isOk()) << st.message();
    std::unique_ptr<Device> d;
    if (p) {
      st = p->open(0, &d);
      EXPECT_TRUE(st.isOk()) << st.message();
    }
    return d;
  }
  GdrLadderDecision probe(bool withMlx5, device::DeviceRuntime* rt, uint64_t stagingBytes = 64 << 10) {
    const IbvApi api = fakeApi(withMlx5);
    GdrLadderDecision d;
    {
      std::unique_ptr<Device> dev = open(&api);
      if (!dev) return d;
      d = decideGdrLadder(probeGdrLadder(dev.get(), rt, stagingBytes));
    }
    scoped_.reset();
    EXPECT_TRUE(nic_.balanced()) << "pds " << nic_.pds << "/" << nic_.pdsFreed << " cqs " << nic_.cqs << "/"
                                 << nic_.cqsFreed << " qps " << nic_.qps << "/" << nic_.qpsFreed << " dms "
                                 << nic_.dms << "/" << nic_.dmsFreed << " channels " << nic_.channels << "/"
                                 << nic_.channelsFreed;
    return d;
  }

  // A device, a PD, one CQ and two RC QPs on it (not connected yet); members go in reverse order.
  struct QpPair {
    std::unique_ptr<Device> dev;
    std::unique_ptr<ProtectionDomain> pd;
    std::unique_ptr<CompletionQueue> cq;
    std::unique_ptr<QueuePair> a, b;
  };
  ::testing::AssertionResult makePair(const IbvApi* api, uint32_t cqEntries, uint32_t sendWr, QpPair* p) {
    p->dev = open(api);
    if (!p->dev) return ::testing::AssertionFailure() << "open";
    QpCaps caps;
    caps.maxSendWr = sendWr;
    for (Status st : {p->dev->allocPd(&p->pd), p->pd ? p->pd->createCq(cqEntries, &p->cq) : Status::ok()})
      if (!st.isOk()) return ::testing::AssertionFailure() << st.message();
    for (auto* qp : {&p->a, &p->b}) {
      Status st = p->pd->createQp(p->cq.get(), p->cq.get(), caps, qp);
      if (!st.isOk()) return ::testing::AssertionFailure() << st.message();
    }
    return ::testing::AssertionSuccess();
  }
  // RESET -> INIT -> RTR -> RTS for both, each the other's peer.
  static ::testing::AssertionResult connect(QueuePair* a, QueuePair* b) {
    QpAddress addrA, addrB;
    std::vector<Status> steps{a->localAddress(&addrA), b->localAddress(&addrB), a->modify(QpState::Init),
                              b->modify(QpState::Init)};
    steps.push_back(a->modify(QpState::Rtr, &addrB));
    steps.push_back(b->modify(QpState::Rtr, &addrA));
    steps.push_back(a->modify(QpState::Rts));
    steps.push_back(b->modify(QpState::Rts));
    for (const Status& st : steps)
      if (!st.isOk()) return ::testing::AssertionFailure() << st.message();
    return ::testing::AssertionSuccess();
  }

  FakeNic nic_;
  std::unique_ptr<ScopedIbvApiForTesting> scoped_;
};

TEST_F(VerbsFakeApi, OpensThroughTheTable) {
  const IbvApi api = fakeApi(true);
  {
    std::unique_ptr<Device> dev = open(&api);
    ASSERT_TRUE(dev);
    EXPECT_EQ(dev->attributes().name, "mlx5_fake");
    EXPECT_EQ(dev->attributes().maxDeviceMemoryBytes, nic_.maxDm);
    EXPECT_EQ(dev->attributes().mtuBytes, 4096u);
    EXPECT_TRUE(dev->attributes().portActive);
  }
  EXPECT_EQ(nic_.opened, 1);
  EXPECT_EQ(nic_.closed, 1);
}

TEST_F(VerbsFakeApi, OpeningWithAGdrModeLogsTheRungAtInfo) {
  ridgetest::ScopedEnv debug("RIDGE_DEBUG", "INFO");
  ridgetest::ScopedEnv mode("RIDGE_GDR_MODE", "write");
  if (logLevel() < LogLevel::Info)
    GTEST_SKIP() << "skipped: RIDGE_DEBUG was read before this test set it (run it alone, as ctest does)";
  const IbvApi api = fakeApi(true);
  testing::internal::CaptureStderr();
  { std::unique_ptr<Device> dev = open(&api); }
  const std::string err = testing::internal::GetCapturedStderr();
  // Without a GPU (no runtime in a build without CUDA, or no device) the CPU rings.
  EXPECT_TRUE(contains(err, "verbs: mlx5_fake: gdr-write ladder: ")) << err;
  device::DeviceRuntime* rt = device::activeRuntime();
  if (!rt || rt->deviceCount() == 0)
    EXPECT_TRUE(contains(err, "gdr-write ladder: cpu-doorbell: no GPU in this process")) << err;
  EXPECT_EQ(nic_.directQps, 1) << "the probe creates the queues the transport would";
  scoped_.reset();
  EXPECT_TRUE(nic_.balanced());
}

// The provider's translation of Wqe -> ibv_send_wr and ibv_wc -> Cqe, its QP state machine and
// its send-slot accounting, over the loopback doubles: what VerbsProvider.LoopbackWriteWithImmAndSend
// checks on a real port, here without one.
TEST_F(VerbsFakeApi, LoopbackDataPathThroughTheTable) {
  const IbvApi api = fakeApi(true);
  {
    QpPair p;
    ASSERT_TRUE(makePair(&api, 64, 4, &p));
    ProtectionDomain* pd = p.pd.get();
    CompletionQueue* cq = p.cq.get();
    QueuePair* a = p.a.get();
    QueuePair* b = p.b.get();
    Wqe w{};
    EXPECT_EQ(a->postSend(w).code(), ridgeInvalidUsage);  // RESET: refused before the NIC sees it
    EXPECT_EQ(a->modify(QpState::Rts).code(), ridgeInvalidUsage);
    ASSERT_TRUE(connect(a, b));

    const size_t n = 64 << 10;
    std::vector<uint8_t> src(n), dst(n, 0), back(n, 0);
    for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
    std::unique_ptr<MemoryRegion> ms, md, mb;
    ASSERT_TRUE(pd->registerMemory(src.data(), n, kAccessLocalWrite, &ms).isOk());
    ASSERT_TRUE(
        pd->registerMemory(dst.data(), n, kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead, &md)
            .isOk());
    ASSERT_TRUE(pd->registerMemory(back.data(), n, kAccessLocalWrite, &mb).isOk());
    ASSERT_TRUE(b->postRecv(RecvWqe{7, 0, 0, 0, 0}).isOk());
    w.opcode = kWqeRdmaWriteImm;
    w.flags = kWqeSignaled;
    w.length = n;
    w.immData = 0x12345678;
    w.localAddr = ms->addr();
    w.lkey = ms->lkey();
    w.remoteAddr = md->addr();
    w.rkey = md->rkey();
    w.wrId = 1;
    ASSERT_TRUE(a->postSend(w).isOk());
    EXPECT_EQ(a->sendSlotsFree(), 3u);
    Cqe c[4];
    ASSERT_EQ(cq->poll(c, 4), 2);
    EXPECT_EQ(a->sendSlotsFree(), 4u);  // the signaled completion retired the slot
    for (const Cqe& e : {c[0], c[1]}) {
      EXPECT_EQ(e.status, kCqeOk) << cqeStatusName(e.status);
      if (e.opcode == kCqeRecvRdmaImm) {
        EXPECT_EQ(e.immData, 0x12345678u);  // byte order survives htonl/ntohl
        EXPECT_EQ(e.wrId, 7u);
        EXPECT_EQ(e.flags, kCqeHasImm);
        EXPECT_EQ(e.byteLen, n);
      } else {
        EXPECT_EQ(e.opcode, kCqeRdmaWrite);
        EXPECT_EQ(e.wrId, 1u);
      }
    }
    EXPECT_EQ(src, dst);
    // RDMA READ back into a third region.
    w.opcode = kWqeRdmaRead;
    w.localAddr = mb->addr();
    w.lkey = mb->lkey();
    w.wrId = 2;
    ASSERT_TRUE(a->postSend(w).isOk());
    ASSERT_EQ(cq->poll(c, 4), 1);
    EXPECT_EQ(c[0].opcode, kCqeRdmaRead);
    EXPECT_EQ(back, src);
    // A wrong rkey: the NIC's error completion, translated.
    w.opcode = kWqeRdmaWrite;
    w.rkey = md->rkey() + 1000;
    w.wrId = 3;
    ASSERT_TRUE(a->postSend(w).isOk());
    ASSERT_EQ(cq->poll(c, 4), 1);
    EXPECT_EQ(c[0].status, kCqeRemoteAccessError);
    EXPECT_EQ(c[0].wrId, 3u);
    // Unsignaled WQEs are not seen retiring: the queue fills and says so.
    w.rkey = md->rkey();
    w.flags = 0;
    // (An error completion does not retire its slot either: the QP is in error by then.)
    EXPECT_EQ(a->sendSlotsFree(), 3u);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(a->postSend(w).isOk());
    EXPECT_EQ(a->sendSlotsFree(), 0u);
    EXPECT_EQ(a->postSend(w).code(), ridgeInternalError);
  }
  scoped_.reset();
  EXPECT_TRUE(nic_.balanced());
}

// Waits (bounded) until `ready()`; the proxy thread works asynchronously.
template <typename Ready>
bool waitFor(Ready ready) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!ready()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

// The provider's mlx5 rings over a device whose own rings it cannot expose: WQEs written into
// the send queue and published by the big-endian doorbell record reach the NIC; CQEs come back
// in order through a CQ ring smaller than their number (held back until the consumer frees
// entries); unsignaled successes retire without a CQE; an inline write lands from the WQE; a
// signaled NOP completes after what is before it; a WQE whose index is not the producer's
// retires with an error CQE; postSend is refused on a QP driven through its ring.
TEST_F(VerbsFakeApi, RingsOverAnyDeviceThroughTheProxy) {
  const IbvApi api = fakeApi(true);
  {
    QpPair p;
    ASSERT_TRUE(makePair(&api, 4, 16, &p));
    ProtectionDomain* pd = p.pd.get();
    QueuePair* a = p.a.get();
    QueuePair* b = p.b.get();
    const mlx5::SqView* sq = a->mlx5Sq();
    const mlx5::CqView* cq = p.cq->mlx5Cq();
    ASSERT_NE(sq, nullptr);
    ASSERT_NE(cq, nullptr);
    // The receiver in ring mode too: its receive CQEs then carry the receive's index.
    ASSERT_NE(b->mlx5Sq(), nullptr);
    EXPECT_EQ(1u << cq->log2Size, 4u);
    EXPECT_EQ(1u << sq->log2Bbs, 16u);
    EXPECT_EQ(sq->qpn, a->qpn());
    ASSERT_TRUE(connect(a, b));
    std::vector<uint64_t> src(8), dst(10, 0);
    for (size_t i = 0; i < src.size(); ++i) src[i] = 0x1000 + i;
    std::unique_ptr<MemoryRegion> ms, md;
    ASSERT_TRUE(pd->registerMemory(src.data(), 64, kAccessLocalWrite, &ms).isOk());
    ASSERT_TRUE(pd->registerMemory(dst.data(), 80, kAccessLocalWrite | kAccessRemoteWrite, &md).isOk());
    // Two receives for two writes with immediate; their CQEs carry the receive index.
    ASSERT_TRUE(b->postRecv(RecvWqe{501, 0, 0, 0, 0}).isOk());
    ASSERT_TRUE(b->postRecv(RecvWqe{502, 0, 0, 0, 0}).isOk());
    // Eight writes of 8 bytes each: 0..5 signaled, 6 and 7 unsignaled; 4 and 5 with immediate.
    for (uint32_t i = 0; i < 8; ++i) {
      mlx5::WqeBuf w;
      const uint8_t op = (i == 4 || i == 5) ? mlx5::kOpRdmaWriteImm : mlx5::kOpRdmaWrite;
      const uint32_t ds =
          mlx5::buildWqe(&w, op, static_cast<uint16_t>(i), sq->qpn, i < 6 ? mlx5::kCtrlCqUpdate : 0, 70 + i,
                         md->addr() + 8 * i, md->rkey(), ms->addr() + 8 * i, ms->lkey(), 8);
      mlx5::copyToRing(*sq, i, w, mlx5::wqeBbs(ds));
    }
    // An inline write of 16 bytes (index 8), a signaled NOP (9), then a WQE claiming index 3 at
    // block 10 (malformed: refused, error CQE).
    const uint64_t inl[2] = {0xabcdefull, 0x123456ull};
    mlx5::WqeBuf w;
    uint32_t ds = mlx5::buildInlineWqe(&w, mlx5::kOpRdmaWrite, 8, sq->qpn, mlx5::kCtrlCqUpdate, 0,
                                       md->addr() + 64, md->rkey(), inl, sizeof inl);
    mlx5::copyToRing(*sq, 8, w, mlx5::wqeBbs(ds));
    ds = mlx5::buildNop(&w, 9, sq->qpn, mlx5::kCtrlCqUpdate);
    mlx5::copyToRing(*sq, 9, w, ds);
    ds = mlx5::buildWqe(&w, mlx5::kOpRdmaWrite, 3, sq->qpn, 0, 0, md->addr(), md->rkey(), ms->addr(),
                        ms->lkey(), 8);
    mlx5::copyToRing(*sq, 10, w, mlx5::wqeBbs(ds));
    mlx5::publishDbr(*sq, 11);
    // 6 + 1 + 1 + 1 send CQEs and 2 receive CQEs through a ring of 4: in order, none lost, none
    // twice.
    std::vector<mlx5::CqeFields> got;
    uint32_t ci = 0;
    ASSERT_TRUE(waitFor([&] {
      mlx5::CqeFields c;
      while (mlx5::pollCq(*cq, &ci, &c)) got.push_back(c);
      return got.size() >= 11;
    }));
    ASSERT_EQ(got.size(), 11u);
    EXPECT_EQ(std::vector<uint64_t>(dst.begin(), dst.begin() + 8), src);
    EXPECT_EQ(dst[8], inl[0]);
    EXPECT_EQ(dst[9], inl[1]);
    std::vector<uint32_t> sendIdx, recvIdx;
    for (const mlx5::CqeFields& c : got) {
      if (c.opcode == mlx5::kCqeRespWrImm) {
        recvIdx.push_back(c.wqeCounter);
        EXPECT_EQ(c.imm, 74u + c.wqeCounter);
        EXPECT_EQ(c.qpn, b->qpn());
      } else if (c.opcode == mlx5::kCqeReq) {
        sendIdx.push_back(c.wqeCounter);
        EXPECT_EQ(c.wqeOpcode, c.wqeCounter == 4 || c.wqeCounter == 5 ? mlx5::kOpRdmaWriteImm
                               : c.wqeCounter == 9                    ? mlx5::kOpNop
                                                                      : mlx5::kOpRdmaWrite);
        EXPECT_EQ(c.qpn, a->qpn());
      } else {
        EXPECT_EQ(c.opcode, mlx5::kCqeReqErr);
        EXPECT_EQ(c.syndrome, mlx5::kSyndLocalQpOp);
        EXPECT_EQ(c.wqeCounter, 10u);
        sendIdx.push_back(100 + c.wqeCounter);
      }
    }
    EXPECT_EQ(sendIdx, (std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 8, 9, 110}));
    EXPECT_EQ(recvIdx, (std::vector<uint32_t>{0, 1}));
    // Nothing more: the two unsignaled successes have no CQE.
    mlx5::CqeFields extra;
    EXPECT_FALSE(mlx5::pollCq(*cq, &ci, &extra));
    Wqe plain{};
    plain.opcode = kWqeRdmaWrite;
    EXPECT_EQ(a->postSend(plain).code(), ridgeInvalidUsage);
  }
  scoped_.reset();
  EXPECT_TRUE(nic_.balanced());
}

// RIDGE_NET=verbs end to end through the function table: two ranks (threads) connect the net
// transport over the fake loopback NIC and reduce, and tear everything down again.
TEST_F(VerbsFakeApi, AllreduceOverRidgeNetVerbs) {
  const IbvApi api = fakeApi(true);
  {
    ScopedIbvApiForTesting scoped(&api);
    EXPECT_EQ(allreduceOverNet("verbs", "0", 1 << 18), "");  // 1 MiB: many slots per peer
  }
  EXPECT_GT(nic_.qps, 0);
  EXPECT_GT(nic_.mrs, 0);
  EXPECT_TRUE(nic_.balanced()) << "qps " << nic_.qps << "/" << nic_.qpsFreed << " cqs " << nic_.cqs << "/"
                               << nic_.cqsFreed << " mrs " << nic_.mrs << "/" << nic_.mrsFreed << " pds "
                               << nic_.pds << "/" << nic_.pdsFreed << " devices " << nic_.opened << "/"
                               << nic_.closed;
}

// The fake NIC's engine for the direct queues: a thread that executes what their doorbell
// records publish once their UAR doorbell was written (fakeServeDirectRings), until destroyed.
class DirectRingEngine {
 public:
  DirectRingEngine()
      : thread_([this] {
          while (!stop_.load()) {
            if (fakeServeDirectRings() == 0) std::this_thread::sleep_for(std::chrono::microseconds(20));
          }
        }) {}
  ~DirectRingEngine() {
    stop_.store(true);
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// RIDGE_NET=verbs with gdr read and staged: read's producer writes mlx5 WQEs into the
// provider's host-memory send queue, which its proxy posts through plain verbs (any rdma-core
// device); staged posts its data through postSend. Both take their credits over the rings. Slots of
// 4096 bytes travel as writes of 4168 (header 64, trailer 8), a length the net transport's slots
// do not have: that they appear proves the gdr transport carried the reduction.
TEST_F(VerbsFakeApi, GdrReadAndStagedOverRidgeNetVerbs) {
  const IbvApi api = fakeApi(true);
  ScopedIbvApiForTesting scoped(&api);
  ridgetest::ScopedEnv slot("RIDGE_GDR_SLOT_BYTES", "4096");
  for (const char* mode : {"read", "staged"}) {
    SCOPED_TRACE(mode);
    ridgetest::ScopedEnv gdr("RIDGE_GDR_MODE", mode);
    nic_.writeImmLengths.clear();
    EXPECT_EQ(allreduceOverNet("verbs", "0", 1 << 16), "");
    size_t slots = 0;
    for (uint32_t len : nic_.writeImmLengths) {
      slots += len == 4168;
      EXPECT_LE(len, 4168u);
    }
    EXPECT_GT(slots, 0u) << nic_.writeImmLengths.size()
                         << " writes with immediate, none a full 4096-byte slot";
  }
}

// gdr write: the CPU stand-in writes the slots into on-NIC memory (its CPU mapping; WQEs address
// it by offset with its zero-based key) or into pinned host memory. The fake NIC is an mlx5 one
// and the runtime sees no GPU, so the ladder says cpu-doorbell: the CPU writes the WQEs into the
// data QP's own (direct) send queue and rings its UAR, which the engine executes.
TEST_F(VerbsFakeApi, GdrWriteOverRidgeNetVerbs) {
  const IbvApi api = fakeApi(true);
  ScopedIbvApiForTesting scoped(&api);
  DirectRingEngine engine;
  device::EmulatedRuntime none(0);
  device::ScopedRuntimeForTesting noGpu(&none);
  ridgetest::ScopedEnv slot("RIDGE_GDR_SLOT_BYTES", "4096");
  ridgetest::ScopedEnv gdr("RIDGE_GDR_MODE", "write");
  for (const char* tier : {"nic", "host"}) {
    SCOPED_TRACE(tier);
    ridgetest::ScopedEnv staging("RIDGE_GDR_STAGING", tier);
    nic_.writeImmLengths.clear();
    const int dmsBefore = nic_.dms;
    EXPECT_EQ(allreduceOverNet("verbs", "0", 1 << 16), "");
    EXPECT_NE(std::count(nic_.writeImmLengths.begin(), nic_.writeImmLengths.end(), 4168u), 0);
    // On-NIC staging for both ranks (the probe at open is logged only at INFO).
    if (std::string(tier) == "nic") EXPECT_GE(nic_.dms - dmsBefore, 2);
  }
}

// With RIDGE_GDR_STAGING at auto the staging goes where the ladder's decision puts it: on-NIC
// memory when the GPU could map it (every mapping works: gpu-doorbell), pinned host memory when
// the GPU cannot map I/O memory (so neither the UAR nor on-NIC memory: cpu-doorbell), even
// though the NIC offers enough on-NIC memory; RIDGE_GDR_STAGING=nic still overrides.
TEST_F(VerbsFakeApi, GdrWriteStagingGoesWhereTheLadderSays) {
  const IbvApi api = fakeApi(true);
  ScopedIbvApiForTesting scoped(&api);
  DirectRingEngine engine;
  ridgetest::ScopedEnv slot("RIDGE_GDR_SLOT_BYTES", "4096");
  ridgetest::ScopedEnv gdr("RIDGE_GDR_MODE", "write");
  device::EmulatedRuntime rt(1);
  device::ScopedRuntimeForTesting gpu(&rt);
  {
    ridgetest::ScopedEnv staging("RIDGE_GDR_STAGING", "auto");
    EXPECT_EQ(allreduceOverNet("verbs", "0", 1 << 14), "");
    const gdr::SetupReport r = gdr::lastSetupReport();
    EXPECT_EQ(r.stagingTier, "nic") << r.stagingReason;
    EXPECT_TRUE(contains(r.stagingReason, "the ladder places staging in on-NIC memory")) << r.stagingReason;
  }
  rt.failHostRangeMaps(device::DeviceRuntime::HostRangeKind::IoMemory, "I/O memory refused by the test");
  {
    ridgetest::ScopedEnv staging("RIDGE_GDR_STAGING", "auto");
    EXPECT_EQ(allreduceOverNet("verbs", "0", 1 << 14), "");
    const gdr::SetupReport r = gdr::lastSetupReport();
    EXPECT_EQ(r.stagingTier, "host") << r.stagingReason;
    EXPECT_TRUE(contains(r.stagingReason, "the ladder places staging in host memory")) << r.stagingReason;
    EXPECT_TRUE(contains(r.stagingReason, "I/O memory refused by the test")) << r.stagingReason;
  }
  {
    ridgetest::ScopedEnv staging("RIDGE_GDR_STAGING", "nic");
    EXPECT_EQ(allreduceOverNet("verbs", "0", 1 << 14), "");
    EXPECT_EQ(gdr::lastSetupReport().stagingTier, "nic")
        << "an explicit RIDGE_GDR_STAGING overrides the ladder";
  }
  EXPECT_EQ(rt.mappedHostRanges(), 0u);
}

// The doorbell rungs on the NIC's own rings: the data QP and CQ come from mlx5 direct verbs
// (createMlx5Cq, QpCaps::mlx5Direct), the producer writes mlx5 WQEs into the hardware send queue
// and its doorbell record and polls the hardware CQ, and the fake NIC executes only what a UAR
// doorbell announced. gpu-doorbell (every mapping works): the queues, credit record, staging
// and UAR mapped into the "GPU" (the emulated runtime), the producer rings itself.
// cpu-doorbell with a GPU (I/O memory refused: no UAR for the GPU): the producer only publishes
// the doorbell record and the transport's CPU thread rings the UAR. cpu-doorbell without a GPU:
// the CPU writes and rings, nothing mapped. Exact allreduce each time; every mapping undone.
TEST_F(VerbsFakeApi, GdrWriteDoorbellRungsRunOnTheDirectRings) {
  const IbvApi api = fakeApi(true);
  ScopedIbvApiForTesting scoped(&api);
  ridgetest::ScopedEnv slot("RIDGE_GDR_SLOT_BYTES", "4096");
  ridgetest::ScopedEnv gdr("RIDGE_GDR_MODE", "write");
  DirectRingEngine engine;
  device::EmulatedRuntime rt(1);
  struct Case {
    const char* rung;
    bool gpu, uarMaps;
  };
  for (const Case c : {Case{"gpu-doorbell", true, true}, Case{"cpu-doorbell", true, false},
                       Case{"cpu-doorbell", false, true}}) {
    SCOPED_TRACE(std::string(c.rung) + (c.gpu ? " with a GPU" : " without a GPU"));
    if (!c.uarMaps)
      rt.failHostRangeMaps(device::DeviceRuntime::HostRangeKind::IoMemory, "I/O memory refused by the test");
    device::EmulatedRuntime none(0);  // no device: no GPU even in a CUDA build on a GPU machine
    device::ScopedRuntimeForTesting gpu(c.gpu ? &rt : &none);
    const uint64_t wqesBefore = nic_.directWqes, cpuRingsBefore = gdr::cpuDoorbellsRung();
    nic_.writeImmLengths.clear();
    EXPECT_EQ(allreduceOverNet("verbs", "0", 1 << 16), "");
    const gdr::SetupReport r = gdr::lastSetupReport();
    EXPECT_EQ(r.rung, c.rung);
    EXPECT_TRUE(r.directQueues);
    EXPECT_EQ(r.queuesMappedForGpu, c.gpu);
    EXPECT_GT(nic_.directWqes - wqesBefore, 0u) << "no WQE executed from a direct send queue";
    EXPECT_NE(std::count(nic_.writeImmLengths.begin(), nic_.writeImmLengths.end(), 4168u), 0)
        << "no full 4096-byte slot on the wire";
    if (c.gpu && !c.uarMaps)
      EXPECT_GT(gdr::cpuDoorbellsRung() - cpuRingsBefore, 0u) << "the CPU thread rang no doorbell";
    else
      EXPECT_EQ(gdr::cpuDoorbellsRung(), cpuRingsBefore);
    EXPECT_EQ(rt.mappedHostRanges(), 0u);
  }
}

// Device buffers on the gpu-doorbell rung: the device-side producer (on the emulated runtime's
// device threads) works on the queues as mapped into the GPU, for a send and for collectives
// (the copy or reduction kernel fills the slot, device code posts it), with exact results and
// no producer read of NIC-side memory.
TEST_F(VerbsFakeApi, DeviceBuffersDriveTheMappedDirectRings) {
  const IbvApi api = fakeApi(true);
  ScopedIbvApiForTesting scoped(&api);
  ridgetest::ScopedEnv net("RIDGE_NET", "verbs"), shm("RIDGE_SHM", "0"), p2p("RIDGE_P2P", "off"),
      ll("RIDGE_LL", "off"), gdr("RIDGE_GDR_MODE", "write"), slots("RIDGE_GDR_STAGING_SLOTS", "2"),
      slot("RIDGE_GDR_SLOT_BYTES", "4K"), ifname("RIDGE_SOCKET_IFNAME", "lo");
  DirectRingEngine engine;
  p2ptest::EmulatedRuntime rt(2);
  device::ScopedRuntimeForTesting gpu(&rt);
  const gdr::Counters before = gdr::processCounters();
  p2ptest::withRanks(rt, 2, 2, [&](p2ptest::TestRank& t) {
    using p2ptest::Op;
    p2ptest::runCall(rt, t, {Op::AllReduce, ridgeFloat32, ridgeSum, 5000}, 41);
    p2ptest::runCall(rt, t, {Op::AllGather, ridgeInt32, ridgeSum, 3001}, 42);
    constexpr size_t kBytes = 30000;
    p2ptest::DevMem buf(rt, kBytes);
    std::vector<unsigned char> want(kBytes);
    for (size_t i = 0; i < kBytes; ++i) want[i] = static_cast<unsigned char>(i * 7 + 3);
    buf.put(t.rank == 0 ? want : std::vector<unsigned char>(kBytes, p2ptest::kPoison));
    const ridgeResult_t r = t.rank == 0 ? ridgeSend(buf.p, kBytes, ridgeUint8, 1, t.comm, t.stream)
                                        : ridgeRecv(buf.p, kBytes, ridgeUint8, 0, t.comm, t.stream);
    ASSERT_EQ(r, ridgeSuccess) << p2ptest::errorText();
    p2ptest::expectStreamDone(rt, t);
    if (t.rank == 1) EXPECT_TRUE(buf.get(0, kBytes) == want) << "device-to-device message";
  });
  const gdr::Counters after = gdr::processCounters();
  const gdr::SetupReport r = gdr::lastSetupReport();
  EXPECT_EQ(r.rung, "gpu-doorbell");
  EXPECT_TRUE(r.queuesMappedForGpu);
  EXPECT_GE(after.devicePosts - before.devicePosts, 8u) << "the device-side producer posted";
  EXPECT_EQ(after.remoteReads - before.remoteReads, 0u);
  EXPECT_EQ(after.stagedLost - before.stagedLost, 0u);
  EXPECT_EQ(rt.mappedHostRanges(), 0u);
}

TEST_F(VerbsFakeApi, DirectQueuesExposeWhatInitObjGives) {
  const IbvApi api = fakeApi(true);
  {
    std::unique_ptr<Device> dev = open(&api);
    ASSERT_TRUE(dev);
    std::unique_ptr<ProtectionDomain> pd;
    ASSERT_TRUE(dev->allocPd(&pd).isOk());
    std::unique_ptr<CompletionQueue> cq, plainCq;
    ASSERT_TRUE(pd->createMlx5Cq(32, &cq).isOk());
    ASSERT_TRUE(pd->createCq(32, &plainCq).isOk());
    // A plain CQ's view is the proxy's ring in host memory, not the hardware's.
    ASSERT_NE(plainCq->mlx5Cq(), nullptr);
    EXPECT_NE(static_cast<void*>(plainCq->mlx5Cq()->cqes), static_cast<void*>(nic_.cqBuf));
    const mlx5::CqView* cv = cq->mlx5Cq();
    ASSERT_NE(cv, nullptr);
    EXPECT_EQ(static_cast<void*>(cv->cqes), static_cast<void*>(nic_.cqBuf));
    EXPECT_EQ(1u << cv->log2Size, 32u);
    EXPECT_EQ(reinterpret_cast<volatile char*>(cv->dbrec), nic_.dbrecPage + 64);
    EXPECT_EQ(cv->cqn, 0x55u);
    QpCaps caps;
    caps.maxSendWr = 16;
    caps.mlx5Direct = true;
    std::unique_ptr<QueuePair> qp, plainQp;
    ASSERT_TRUE(pd->createQp(cq.get(), cq.get(), caps, &qp).isOk());
    EXPECT_EQ(nic_.directQps, 1);
    const mlx5::SqView* sv = qp->mlx5Sq();
    ASSERT_NE(sv, nullptr);
    EXPECT_EQ(static_cast<void*>(sv->ring), static_cast<void*>(nic_.sq));
    EXPECT_EQ(1u << sv->log2Bbs, 16u);
    // The send word of the doorbell record (the second), the BlueFlame register as doorbell.
    EXPECT_EQ(reinterpret_cast<volatile char*>(sv->dbrec), nic_.dbrecPage + 4 * mlx5::kSendDbrWord);
    EXPECT_EQ(reinterpret_cast<volatile char*>(sv->uarDoorbell), nic_.uarPage + 0x800);
    EXPECT_EQ(reinterpret_cast<volatile char*>(sv->blueFlame), nic_.uarPage + 0x800);
    EXPECT_EQ(sv->bfBytes, 256u);
    EXPECT_EQ(sv->qpn, 0x1234u);
    caps.mlx5Direct = false;
    ASSERT_TRUE(pd->createQp(plainCq.get(), plainCq.get(), caps, &plainQp).isOk());
    ASSERT_NE(plainQp->mlx5Sq(), nullptr);
    EXPECT_NE(static_cast<void*>(plainQp->mlx5Sq()->ring), static_cast<void*>(nic_.sq));
    EXPECT_EQ(nic_.directQps, 1);
  }
  scoped_.reset();
  EXPECT_TRUE(nic_.balanced());
}

TEST_F(VerbsFakeApi, DirectQueueErrorsNameTheCallAndLeakNothing) {
  const IbvApi api = fakeApi(true);
  {
    std::unique_ptr<Device> dev = open(&api);
    ASSERT_TRUE(dev);
    std::unique_ptr<ProtectionDomain> pd;
    ASSERT_TRUE(dev->allocPd(&pd).isOk());
    std::unique_ptr<CompletionQueue> cq;
    nic_.failCreateCqErrno = ENOMEM;
    Status st = pd->createMlx5Cq(32, &cq);
    EXPECT_FALSE(st.isOk());
    EXPECT_TRUE(contains(st.message(), "mlx5dv_create_cq failed: " + std::string(std::strerror(ENOMEM))))
        << st.message();
    nic_.failCreateCqErrno = 0;
    ASSERT_TRUE(pd->createMlx5Cq(32, &cq).isOk());
    QpCaps caps;
    caps.mlx5Direct = true;
    std::unique_ptr<QueuePair> qp;
    nic_.failCreateQpErrno = EPERM;
    st = pd->createQp(cq.get(), cq.get(), caps, &qp);
    EXPECT_TRUE(contains(st.message(), "mlx5dv_create_qp failed")) << st.message();
    nic_.failCreateQpErrno = 0;
    nic_.failInitObjQp = EINVAL;
    st = pd->createQp(cq.get(), cq.get(), caps, &qp);
    EXPECT_TRUE(contains(st.message(), "mlx5dv_init_obj(QP) failed")) << st.message();
    EXPECT_EQ(nic_.qps, nic_.qpsFreed);  // the QP init_obj refused was destroyed
    nic_.failInitObjQp = 0;
    nic_.mlx5Supported = false;
    st = pd->createQp(cq.get(), cq.get(), caps, &qp);
    EXPECT_TRUE(contains(st.message(), "mlx5_fake is not an mlx5 device")) << st.message();
  }
  scoped_.reset();
  EXPECT_TRUE(nic_.balanced());
}

TEST_F(VerbsFakeApi, EveryStepWorksGivesGpuDoorbellAndUnmapsEverything) {
  device::EmulatedRuntime rt(1);
  const GdrLadderDecision d = probe(true, &rt);
  EXPECT_EQ(d.rung, GdrRung::GpuDoorbell) << gdrLadderLine(d);
  EXPECT_FALSE(d.predicted);
  EXPECT_EQ(d.staging, GdrStagingPlace::NicMemory) << d.stagingReason;
  EXPECT_EQ(rt.mappedHostRanges(), 0u);
  EXPECT_EQ(nic_.directQps, 1);
  EXPECT_EQ(nic_.dms, 1);
}

TEST_F(VerbsFakeApi, WithoutLibmlx5IsHostStaged) {
  device::EmulatedRuntime rt(1);
  const GdrLadderDecision d = probe(false, &rt);
  EXPECT_EQ(d.rung, GdrRung::HostStaged);
  EXPECT_TRUE(contains(d.reason, "libmlx5 not available (cannot load libmlx5.so.1")) << d.reason;
  EXPECT_EQ(nic_.directQps, 0);
}

TEST_F(VerbsFakeApi, NotAnMlx5DeviceIsHostStaged) {
  device::EmulatedRuntime rt(1);
  nic_.mlx5Supported = false;
  const GdrLadderDecision d = probe(true, &rt);
  EXPECT_EQ(d.rung, GdrRung::HostStaged);
  EXPECT_TRUE(contains(d.reason, "mlx5_fake is not an mlx5 device")) << d.reason;
}

TEST_F(VerbsFakeApi, QueueCreationFailuresAreHostStagedWithTheCall) {
  device::EmulatedRuntime rt(1);
  nic_.failCreateCqErrno = ENOMEM;
  GdrLadderDecision d = probe(true, &rt);
  EXPECT_EQ(d.rung, GdrRung::HostStaged);
  EXPECT_TRUE(contains(d.reason, "mlx5dv_create_cq failed")) << d.reason;
  nic_.failCreateCqErrno = 0;
  nic_.failCreateQpErrno = EOPNOTSUPP;
  d = probe(true, &rt);
  EXPECT_EQ(d.rung, GdrRung::HostStaged);
  EXPECT_TRUE(contains(d.reason, "mlx5dv_create_qp failed")) << d.reason;
  nic_.failCreateQpErrno = 0;
  nic_.failInitObjQp = EINVAL;
  d = probe(true, &rt);
  EXPECT_EQ(d.rung, GdrRung::HostStaged);
  EXPECT_TRUE(contains(d.reason, "mlx5dv_init_obj(QP) failed")) << d.reason;
}

TEST_F(VerbsFakeApi, NoGpuIsCpuDoorbell) {
  GdrLadderDecision d = probe(true, nullptr);
  EXPECT_EQ(d.rung, GdrRung::CpuDoorbell);
  EXPECT_TRUE(contains(d.reason, "no GPU in this process: no device runtime")) << d.reason;
  device::EmulatedRuntime none(0);
  d = probe(true, &none);
  EXPECT_EQ(d.rung, GdrRung::CpuDoorbell);
  EXPECT_TRUE(contains(d.reason, "runtime sees no device")) << d.reason;
}

TEST_F(VerbsFakeApi, RingsNotMappableIsHostStaged) {
  device::EmulatedRuntime rt(1);
  rt.failHostRangeMaps(device::DeviceRuntime::HostRangeKind::Memory, "host memory refused by the test");
  const GdrLadderDecision d = probe(true, &rt);
  EXPECT_EQ(d.rung, GdrRung::HostStaged);
  EXPECT_TRUE(contains(d.reason, "rings could not be mapped into the GPU")) << d.reason;
  EXPECT_TRUE(contains(d.reason, "host memory refused by the test")) << d.reason;
  EXPECT_EQ(rt.mappedHostRanges(), 0u);
}

TEST_F(VerbsFakeApi, UarNotMappableIsCpuDoorbellWithHostStaging) {
  device::EmulatedRuntime rt(1);
  rt.failHostRangeMaps(device::DeviceRuntime::HostRangeKind::IoMemory, "I/O memory refused by the test");
  const GdrLadderDecision d = probe(true, &rt);
  EXPECT_EQ(d.rung, GdrRung::CpuDoorbell);
  EXPECT_TRUE(contains(d.reason, "UAR page could not be mapped into the GPU")) << d.reason;
  // On-NIC memory is I/O memory too: staging falls to host memory.
  EXPECT_EQ(d.staging, GdrStagingPlace::HostMemory);
  EXPECT_TRUE(contains(d.stagingReason, "I/O memory refused by the test")) << d.stagingReason;
  EXPECT_EQ(rt.mappedHostRanges(), 0u);
}

TEST_F(VerbsFakeApi, NicMemorySizedFromMaxDmSize) {
  device::EmulatedRuntime rt(1);
  nic_.maxDm = 0;
  GdrLadderDecision d = probe(true, &rt);
  EXPECT_EQ(d.rung, GdrRung::GpuDoorbell);
  EXPECT_EQ(d.staging, GdrStagingPlace::HostMemory);
  EXPECT_TRUE(contains(d.stagingReason, "max_dm_size 0")) << d.stagingReason;
  EXPECT_EQ(nic_.dms, 0);
  nic_.maxDm = 32 << 10;
  d = probe(true, &rt, 64 << 10);
  EXPECT_EQ(d.staging, GdrStagingPlace::HostMemory);
  EXPECT_TRUE(contains(d.stagingReason, "need 65536 bytes, the NIC offers 32768")) << d.stagingReason;
}

// ---- on a real GPU (CUDA builds with a device; skipped elsewhere) ----------------------------

#if defined(RIDGE_HAVE_CUDA)
device::DeviceRuntime* cudaWithDevice(std::string* why) {
  device::DeviceRuntime* rt = device::cudaRuntime();
  if (rt->deviceCount() == 0) *why = "no CUDA device here";
  return rt->deviceCount() > 0 ? rt : nullptr;
}
#else
device::DeviceRuntime* cudaWithDevice(std::string* why) {
  *why = "a build without CUDA";
  return nullptr;
}
#endif

// The seam's mapHostRange on CUDA: the device address it gives aliases the host pages (a copy
// to it lands in them), a second registration of the same pages is refused, unmapping works.
TEST(VerbsOnGpu, MapHostRangeAliasesTheHostPages) {
  std::string why;
  device::DeviceRuntime* rt = cudaWithDevice(&why);
  if (!rt) GTEST_SKIP() << "skipped: " << why;
  const size_t bytes = 2 * pageBytes();
  char* host = static_cast<char*>(std::aligned_alloc(pageBytes(), bytes));
  std::memset(host, 0, bytes);
  uint64_t dev = 0;
  Status st = rt->mapHostRange(host, bytes, device::DeviceRuntime::HostRangeKind::Memory, &dev);
  ASSERT_TRUE(st.isOk()) << st.message();
  EXPECT_NE(dev, 0u);
  uint64_t again = 0;
  st = rt->mapHostRange(host, bytes, device::DeviceRuntime::HostRangeKind::Memory, &again);
  EXPECT_FALSE(st.isOk());
  std::printf("second registration of the same pages: %s\n", st.message().c_str());
  std::vector<char> pattern(bytes);
  for (size_t i = 0; i < bytes; ++i) pattern[i] = static_cast<char>(i * 13 + 1);
  ridgeStream_t stream = nullptr;
  ASSERT_TRUE(rt->createStream(&stream).isOk());
  ASSERT_TRUE(rt->copy(reinterpret_cast<void*>(dev), pattern.data(), bytes, stream).isOk());
  ASSERT_TRUE(rt->synchronize(stream).isOk());
  rt->destroyStream(stream);
  EXPECT_EQ(std::memcmp(host, pattern.data(), bytes), 0);
  EXPECT_TRUE(rt->unmapHostRange(host).isOk());
  // Ordinary RAM as I/O memory: what the driver says (a UAR page is what this flag is for).
  st = rt->mapHostRange(host, bytes, device::DeviceRuntime::HostRangeKind::IoMemory, &dev);
  std::printf("ordinary host pages registered as I/O memory: %s\n",
              st.isOk() ? "accepted" : st.message().c_str());
  if (st.isOk()) EXPECT_TRUE(rt->unmapHostRange(host).isOk());
  std::free(host);
}

// The ladder probe with the real CUDA runtime and the fake NIC: the rings (host pages here, as
// libmlx5 allocates them) really are registered for the GPU; the "UAR" and "on-NIC memory" are
// host pages too, so what the I/O-memory registration answers decides cpu- or gpu-doorbell.
TEST_F(VerbsFakeApi, ProbeWithTheCudaRuntime) {
  std::string why;
  device::DeviceRuntime* rt = cudaWithDevice(&why);
  if (!rt) GTEST_SKIP() << "skipped: " << why;
  const GdrLadderDecision d = probe(true, rt);
  std::printf("ladder on this GPU with the fake NIC: %s\n", gdrLadderLine(d).c_str());
  EXPECT_TRUE(d.rung == GdrRung::GpuDoorbell || d.rung == GdrRung::CpuDoorbell) << gdrLadderLine(d);
  EXPECT_EQ(d.reason.find("rings could not be mapped"), std::string::npos) << d.reason;
}

}  // namespace
}  // namespace ridge

#else

TEST(VerbsFakeApi, NeedsRdmaCoreHeaders) {
  GTEST_SKIP() << "skipped: this build has no rdma-core provider or no infiniband/mlx5dv.h";
}

#endif
