// The rdma-core provider driven through a fake function table (ibv_api.h): the same calls
// the provider makes on a real NIC, answered by test doubles, so that the mlx5 direct queue
// creation, its error paths and the GDR-write ladder probe run here without a NIC or GPU
// (the GPU is the emulated runtime). Each case checks the rung and reason the probe leads
// to, and that every object it created was destroyed and every mapping undone.
#include <gtest/gtest.h>

#if defined(RIDGE_HAVE_VERBS) && defined(RIDGE_HAVE_MLX5DV)

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/log.h"
#include "device/emulated_runtime.h"
#include "tests/device/scoped_env.h"
#include "transports/verbs/ibv_api.h"
#include "transports/verbs/verbs.h"

namespace ridge {
namespace {

using namespace verbs;

size_t pageBytes() {
  return static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// The fake NIC: objects the doubles hand out, knobs that make a call fail, and counts of
// creations and destructions.
struct FakeNic {
  ibv_device device{};
  ibv_device* list[2] = {&device, nullptr};
  ibv_context context{};
  ibv_pd pd{};
  ibv_comp_channel channel{};
  ibv_cq plainCq{};
  ibv_cq_ex directCq{};
  ibv_qp qp{};
  ibv_mr mr{};
  ibv_dm dm{};
  // Ring memory as libmlx5 would allocate it, and the UAR and on-NIC memory pages.
  char* sq = nullptr;
  char* dbrecPage = nullptr;
  char* cqBuf = nullptr;
  char* uarPage = nullptr;
  char* dmPage = nullptr;

  bool mlx5Supported = true;
  int failCreateCqErrno = 0;
  int failCreateQpErrno = 0;
  int failInitObjQp = 0;  // the return value of mlx5dv_init_obj(QP)
  uint64_t maxDm = 128 << 10;

  int opened = 0, closed = 0, pds = 0, pdsFreed = 0, channels = 0, channelsFreed = 0;
  int cqs = 0, cqsFreed = 0, qps = 0, qpsFreed = 0, dms = 0, dmsFreed = 0, mrs = 0, mrsFreed = 0;
  int directQps = 0;

  FakeNic() {
    auto page = [](size_t n) { return static_cast<char*>(std::aligned_alloc(pageBytes(), n * pageBytes())); };
    sq = page(1);
    dbrecPage = page(1);
    cqBuf = page(1);
    uarPage = page(1);
    dmPage = page(1);
    context.device = &device;
    qp.qp_num = 0x1234;
    dm.context = &context;
    mr.lkey = 7;
    mr.rkey = 9;
  }
  ~FakeNic() {
    for (char* p : {sq, dbrecPage, cqBuf, uarPage, dmPage}) std::free(p);
  }
  bool balanced() const {
    return opened == closed && pds == pdsFreed && channels == channelsFreed && cqs == cqsFreed &&
           qps == qpsFreed && dms == dmsFreed && mrs == mrsFreed;
  }
};

FakeNic* gNic = nullptr;

// ---- the doubles ----
ibv_device** fakeGetDeviceList(int* n) {
  *n = 1;
  return gNic->list;
}
void fakeFreeDeviceList(ibv_device**) {}
const char* fakeGetDeviceName(ibv_device*) {
  return "mlx5_fake";
}
ibv_context* fakeOpenDevice(ibv_device*) {
  ++gNic->opened;
  return &gNic->context;
}
int fakeCloseDevice(ibv_context*) {
  ++gNic->closed;
  return 0;
}
int fakeQueryDeviceEx(ibv_context*, ibv_device_attr_ex* a) {
  std::memset(a, 0, sizeof *a);
  a->orig_attr.max_mr_size = 1ull << 40;
  a->orig_attr.max_qp_wr = 32768;
  a->orig_attr.max_cqe = 1 << 22;
  a->orig_attr.phys_port_cnt = 1;
  a->max_dm_size = gNic->maxDm;
  return 0;
}
int fakeQueryPort(ibv_context*, uint8_t, ibv_port_attr* p) {
  std::memset(p, 0, sizeof *p);
  p->state = IBV_PORT_ACTIVE;
  p->active_mtu = IBV_MTU_4096;
  return 0;
}
ibv_pd* fakeAllocPd(ibv_context*) {
  ++gNic->pds;
  return &gNic->pd;
}
int fakeDeallocPd(ibv_pd*) {
  ++gNic->pdsFreed;
  return 0;
}
ibv_comp_channel* fakeCreateCompChannel(ibv_context*) {
  ++gNic->channels;
  return &gNic->channel;
}
int fakeDestroyCompChannel(ibv_comp_channel*) {
  ++gNic->channelsFreed;
  return 0;
}
ibv_cq* fakeCreateCq(ibv_context*, int, void*, ibv_comp_channel*, int) {
  ++gNic->cqs;
  return &gNic->plainCq;
}
int fakeDestroyCq(ibv_cq*) {
  ++gNic->cqsFreed;
  return 0;
}
ibv_qp* fakeCreateQp(ibv_pd*, ibv_qp_init_attr*) {
  ++gNic->qps;
  return &gNic->qp;
}
int fakeDestroyQp(ibv_qp*) {
  ++gNic->qpsFreed;
  return 0;
}
ibv_dm* fakeAllocDm(ibv_context*, ibv_alloc_dm_attr* a) {
  if (a->length > gNic->maxDm) {
    errno = ENOMEM;
    return nullptr;
  }
  ++gNic->dms;
  return &gNic->dm;
}
int fakeFreeDm(ibv_dm*) {
  ++gNic->dmsFreed;
  return 0;
}
ibv_mr* fakeRegDmMr(ibv_pd*, ibv_dm*, uint64_t, size_t, unsigned) {
  ++gNic->mrs;
  return &gNic->mr;
}
int fakeDeregMr(ibv_mr*) {
  ++gNic->mrsFreed;
  return 0;
}
bool fakeIsSupported(ibv_device*) {
  return gNic->mlx5Supported;
}
ibv_cq_ex* fakeMlx5CreateCq(ibv_context*, ibv_cq_init_attr_ex*, mlx5dv_cq_init_attr* dv) {
  if (gNic->failCreateCqErrno) {
    errno = gNic->failCreateCqErrno;
    return nullptr;
  }
  // The provider asks for 64-byte CQEs explicitly.
  if (!(dv->comp_mask & MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE) || dv->cqe_size != 64) {
    errno = EINVAL;
    return nullptr;
  }
  ++gNic->cqs;
  return &gNic->directCq;
}
ibv_qp* fakeMlx5CreateQp(ibv_context*, ibv_qp_init_attr_ex* ex, mlx5dv_qp_init_attr* dv) {
  if (gNic->failCreateQpErrno) {
    errno = gNic->failCreateQpErrno;
    return nullptr;
  }
  if (ex->pd != &gNic->pd || !(dv->create_flags & MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE)) {
    errno = EINVAL;
    return nullptr;
  }
  ++gNic->qps;
  ++gNic->directQps;
  return &gNic->qp;
}
int fakeMlx5InitObj(mlx5dv_obj* obj, uint64_t type) {
  if (type & MLX5DV_OBJ_QP) {
    if (gNic->failInitObjQp) return gNic->failInitObjQp;
    obj->qp.out->dbrec = reinterpret_cast<__be32*>(gNic->dbrecPage);
    obj->qp.out->sq.buf = gNic->sq;
    obj->qp.out->sq.wqe_cnt = 16;
    obj->qp.out->sq.stride = 64;
    obj->qp.out->bf.reg = gNic->uarPage + 0x800;
    obj->qp.out->bf.size = 256;
  }
  if (type & MLX5DV_OBJ_CQ) {
    obj->cq.out->buf = gNic->cqBuf;
    obj->cq.out->dbrec = reinterpret_cast<__be32*>(gNic->dbrecPage + 64);
    obj->cq.out->cqe_cnt = 32;
    obj->cq.out->cqe_size = 64;
    obj->cq.out->cqn = 0x55;
  }
  if (type & MLX5DV_OBJ_DM) {
    obj->dm.out->buf = gNic->dmPage;
    obj->dm.out->length = pageBytes();
  }
  return 0;
}

IbvApi fakeApi(bool withMlx5) {
  IbvApi a;
  a.getDeviceList = fakeGetDeviceList;
  a.freeDeviceList = fakeFreeDeviceList;
  a.getDeviceName = fakeGetDeviceName;
  a.openDevice = fakeOpenDevice;
  a.closeDevice = fakeCloseDevice;
  a.queryDeviceEx = fakeQueryDeviceEx;
  a.queryPort = fakeQueryPort;
  a.allocPd = fakeAllocPd;
  a.deallocPd = fakeDeallocPd;
  a.createCompChannel = fakeCreateCompChannel;
  a.destroyCompChannel = fakeDestroyCompChannel;
  a.createCq = fakeCreateCq;
  a.destroyCq = fakeDestroyCq;
  a.createQp = fakeCreateQp;
  a.destroyQp = fakeDestroyQp;
  a.allocDm = fakeAllocDm;
  a.freeDm = fakeFreeDm;
  a.regDmMr = fakeRegDmMr;
  a.deregMr = fakeDeregMr;
  if (withMlx5) {
    a.mlx5IsSupported = fakeIsSupported;
    a.mlx5CreateCq = fakeMlx5CreateCq;
    a.mlx5CreateQp = fakeMlx5CreateQp;
    a.mlx5InitObj = fakeMlx5InitObj;
  } else {
    a.mlx5Missing = "cannot load libmlx5.so.1 (test double: absent)";
  }
  return a;
}

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
    EXPECT_EQ(plainCq->mlx5Ring(), nullptr);
    const Mlx5CompletionQueueView* cv = cq->mlx5Ring();
    ASSERT_NE(cv, nullptr);
    EXPECT_EQ(cv->cqes, nic_.cqBuf);
    EXPECT_EQ(cv->cqeCount, 32u);
    EXPECT_EQ(cv->cqeBytes, 64u);
    EXPECT_EQ(cv->cqn, 0x55u);
    QpCaps caps;
    caps.maxSendWr = 16;
    caps.mlx5Direct = true;
    std::unique_ptr<QueuePair> qp, plainQp;
    ASSERT_TRUE(pd->createQp(cq.get(), cq.get(), caps, &qp).isOk());
    EXPECT_EQ(nic_.directQps, 1);
    const Mlx5SendQueueView* sv = qp->mlx5SendQueue();
    ASSERT_NE(sv, nullptr);
    EXPECT_EQ(sv->wqes, nic_.sq);
    EXPECT_EQ(sv->wqeCount, 16u);
    EXPECT_EQ(sv->strideBytes, 64u);
    EXPECT_EQ(reinterpret_cast<volatile char*>(sv->doorbellRecord), nic_.dbrecPage);
    EXPECT_EQ(sv->uar, nic_.uarPage + 0x800);
    EXPECT_EQ(sv->uarBytes, 256u);
    EXPECT_EQ(sv->qpn, 0x1234u);
    caps.mlx5Direct = false;
    ASSERT_TRUE(pd->createQp(plainCq.get(), plainCq.get(), caps, &plainQp).isOk());
    EXPECT_EQ(plainQp->mlx5SendQueue(), nullptr);
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

}  // namespace
}  // namespace ridge

#else

TEST(VerbsFakeApi, NeedsRdmaCoreHeaders) {
  GTEST_SKIP() << "skipped: this build has no rdma-core provider or no infiniband/mlx5dv.h";
}

#endif
