// The software NIC through the verbs subset: layouts, the QP state machine, RDMA WRITE,
// WRITE_WITH_IMM, SEND/RECV, ordering, back-pressure with a tiny staging area, device
// memory, error completions, the raw rings a GPU would use, fault injection with exact
// results, and NICs in two processes. Two NICs of one process talk over loopback TCP
// and, for payload, process_vm_readv on their own pid, exactly as between processes.
#include "transports/softnic/softnic.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "cq_polling.h"
#include "time_scale.h"
#include "transports/net/reg_cache.h"
#include "transports/verbs/verbs.h"

namespace ridge {
namespace {

using namespace verbs;
using softnic_test::nowSec;
using softnic_test::pollN;

void loopbackEnv() {
  setenv("RIDGE_SOCKET_IFNAME", "lo", 1);
}

// Two NICs with a connected RC QP each (a <-> b).
struct Pair {
  std::unique_ptr<Device> devA, devB;
  std::unique_ptr<ProtectionDomain> pdA, pdB;
  std::unique_ptr<CompletionQueue> cqA, cqB;
  std::unique_ptr<QueuePair> qpA, qpB;

  static std::unique_ptr<Pair> make(const softnic::Options& a, const softnic::Options& b, QpCaps caps = {}) {
    loopbackEnv();
    auto p = std::make_unique<Pair>();
    EXPECT_TRUE(softnic::openDevice(a, &p->devA).isOk());
    EXPECT_TRUE(softnic::openDevice(b, &p->devB).isOk());
    if (!p->devA || !p->devB) return nullptr;
    EXPECT_TRUE(p->devA->allocPd(&p->pdA).isOk());
    EXPECT_TRUE(p->devB->allocPd(&p->pdB).isOk());
    EXPECT_TRUE(p->pdA->createCq(1024, &p->cqA).isOk());
    EXPECT_TRUE(p->pdB->createCq(1024, &p->cqB).isOk());
    EXPECT_TRUE(p->pdA->createQp(p->cqA.get(), p->cqA.get(), caps, &p->qpA).isOk());
    EXPECT_TRUE(p->pdB->createQp(p->cqB.get(), p->cqB.get(), caps, &p->qpB).isOk());
    QpAddress addrA, addrB;
    EXPECT_TRUE(p->qpA->localAddress(&addrA).isOk());
    EXPECT_TRUE(p->qpB->localAddress(&addrB).isOk());
    for (QueuePair* qp : {p->qpA.get(), p->qpB.get()}) EXPECT_TRUE(qp->modify(QpState::Init).isOk());
    EXPECT_TRUE(p->qpA->modify(QpState::Rtr, &addrB).isOk());
    EXPECT_TRUE(p->qpB->modify(QpState::Rtr, &addrA).isOk());
    Status s = p->qpA->modify(QpState::Rts);
    EXPECT_TRUE(s.isOk()) << s.message();
    s = p->qpB->modify(QpState::Rts);
    EXPECT_TRUE(s.isOk()) << s.message();
    return p;
  }
  static std::unique_ptr<Pair> make(const softnic::Options& o = {}) { return make(o, o); }
};

Wqe writeWqe(uint8_t op, const MemoryRegion& src, size_t srcOff, const MemoryRegion& dst, size_t dstOff,
             uint32_t len, uint64_t wrId, uint32_t imm = 0, bool signaled = true) {
  Wqe w{};
  w.opcode = op;
  w.flags = signaled ? kWqeSignaled : 0;
  w.length = len;
  w.immData = imm;
  w.localAddr = src.addr() + srcOff;
  w.lkey = src.lkey();
  w.remoteAddr = dst.addr() + dstOff;
  w.rkey = dst.rkey();
  w.wrId = wrId;
  return w;
}

void fillPattern(std::vector<uint8_t>& v, uint32_t seed) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 9)) & 0xff);
}

TEST(VerbsLayout, WorkRequestSizes) {
  // The subset's work requests and completions (the queues are mlx5: tests/gdr/mlx5_wire_test).
  EXPECT_EQ(sizeof(Wqe), 64u);
  EXPECT_EQ(sizeof(Cqe), 32u);
  EXPECT_EQ(sizeof(RecvWqe), 32u);
}

TEST(SoftnicQp, StateMachineRefusesIllegalTransitions) {
  loopbackEnv();
  std::unique_ptr<Device> dev;
  ASSERT_TRUE(softnic::openDevice({}, &dev).isOk());
  std::unique_ptr<ProtectionDomain> pd;
  ASSERT_TRUE(dev->allocPd(&pd).isOk());
  std::unique_ptr<CompletionQueue> cq;
  ASSERT_TRUE(pd->createCq(16, &cq).isOk());
  std::unique_ptr<QueuePair> qp;
  ASSERT_TRUE(pd->createQp(cq.get(), cq.get(), {}, &qp).isOk());
  EXPECT_EQ(qp->state(), QpState::Reset);
  EXPECT_EQ(qp->modify(QpState::Rtr).code(), ridgeInvalidUsage);
  EXPECT_EQ(qp->modify(QpState::Rts).code(), ridgeInvalidUsage);
  Wqe w{};
  w.opcode = kWqeRdmaWrite;
  EXPECT_EQ(qp->postSend(w).code(), ridgeInvalidUsage);
  EXPECT_EQ(qp->postRecv(RecvWqe{}).code(), ridgeInvalidUsage);
  ASSERT_TRUE(qp->modify(QpState::Init).isOk());
  EXPECT_TRUE(qp->postRecv(RecvWqe{}).isOk());
  EXPECT_EQ(qp->modify(QpState::Rts).code(), ridgeInvalidUsage);
  EXPECT_EQ(qp->modify(QpState::Init).code(), ridgeInvalidUsage);
  EXPECT_EQ(qp->postSend(w).code(), ridgeInvalidUsage);
  EXPECT_EQ(qp->modify(QpState::Rtr, nullptr).code(), ridgeInvalidArgument);
  QpAddress self;
  ASSERT_TRUE(qp->localAddress(&self).isOk());
  ASSERT_TRUE(qp->modify(QpState::Rtr, &self).isOk());
  EXPECT_EQ(qp->state(), QpState::Rtr);
  EXPECT_EQ(qp->modify(QpState::Init).code(), ridgeInvalidUsage);
  ASSERT_TRUE(qp->modify(QpState::Error).isOk());
  EXPECT_EQ(qp->state(), QpState::Error);
  // The receive posted in INIT is flushed with an error completion.
  std::vector<Cqe> c = pollN(cq.get(), 1, 5);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, kCqeFlushed);
  EXPECT_EQ(qp->modify(QpState::Rts).code(), ridgeInvalidUsage);
  ASSERT_TRUE(qp->modify(QpState::Reset).isOk());
  ASSERT_TRUE(qp->modify(QpState::Init).isOk());
  EXPECT_FALSE(qpTransitionAllowed(QpState::Reset, QpState::Rts));
  EXPECT_TRUE(qpTransitionAllowed(QpState::Rts, QpState::Error));
}

TEST(SoftnicEngine, RdmaWriteLandsExactly) {
  auto p = Pair::make();
  ASSERT_TRUE(p);
  const size_t n = (1 << 20) + 333;
  std::vector<uint8_t> src(n), dst(n + 64, 0xEE);
  fillPattern(src, 1);
  std::unique_ptr<MemoryRegion> ms, md;
  ASSERT_TRUE(p->pdA->registerMemory(src.data(), n, kAccessLocalWrite, &ms).isOk());
  ASSERT_TRUE(
      p->pdB->registerMemory(dst.data(), dst.size(), kAccessLocalWrite | kAccessRemoteWrite, &md).isOk());
  ASSERT_TRUE(
      p->qpA->postSend(writeWqe(kWqeRdmaWrite, *ms, 0, *md, 32, static_cast<uint32_t>(n), 77)).isOk());
  auto c = pollN(p->cqA.get(), 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, kCqeOk) << cqeStatusName(c[0].status);
  EXPECT_EQ(c[0].wrId, 77u);
  EXPECT_EQ(c[0].opcode, kCqeRdmaWrite);
  EXPECT_EQ(c[0].qpn, p->qpA->qpn());
  EXPECT_EQ(0, std::memcmp(dst.data() + 32, src.data(), n));
  for (size_t i = 0; i < 32; ++i) ASSERT_EQ(dst[i], 0xEE) << i;
  for (size_t i = 32 + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xEE) << i;
  // A plain WRITE produces nothing at the target.
  Cqe extra;
  EXPECT_EQ(p->cqB->poll(&extra, 1), 0);
}

TEST(SoftnicEngine, WriteWithImmConsumesAReceive) {
  auto p = Pair::make();
  ASSERT_TRUE(p);
  std::vector<uint8_t> src(70000), dst(70000);
  fillPattern(src, 2);
  std::unique_ptr<MemoryRegion> ms, md;
  ASSERT_TRUE(p->pdA->registerMemory(src.data(), src.size(), 0, &ms).isOk());
  ASSERT_TRUE(p->pdB->registerMemory(dst.data(), dst.size(), kAccessRemoteWrite, &md).isOk());
  ASSERT_TRUE(p->qpB->postRecv(RecvWqe{555, 0, 0, 0, 0}).isOk());
  ASSERT_TRUE(p->qpA->postSend(writeWqe(kWqeRdmaWriteImm, *ms, 0, *md, 0, 70000, 1, 0xABCD1234)).isOk());
  // Zero-length WRITE_WITH_IMM: a pure notification.
  ASSERT_TRUE(p->qpB->postRecv(RecvWqe{556, 0, 0, 0, 0}).isOk());
  ASSERT_TRUE(p->qpA->postSend(writeWqe(kWqeRdmaWriteImm, *ms, 0, *md, 0, 0, 2, 42)).isOk());
  auto rc = pollN(p->cqB.get(), 2);
  ASSERT_EQ(rc.size(), 2u);
  EXPECT_EQ(rc[0].opcode, kCqeRecvRdmaImm);
  EXPECT_EQ(rc[0].wrId, 555u);
  EXPECT_EQ(rc[0].immData, 0xABCD1234u);
  EXPECT_EQ(rc[0].byteLen, 70000u);
  EXPECT_TRUE(rc[0].flags & kCqeHasImm);
  EXPECT_EQ(rc[1].wrId, 556u);
  EXPECT_EQ(rc[1].immData, 42u);
  EXPECT_EQ(rc[1].byteLen, 0u);
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), src.size()));
  auto sc = pollN(p->cqA.get(), 2);
  ASSERT_EQ(sc.size(), 2u);
  EXPECT_EQ(sc[0].wrId, 1u);
  EXPECT_EQ(sc[1].wrId, 2u);
}

TEST(SoftnicEngine, WriteWithImmWaitsForAReceive) {
  // No receive posted: the target refuses (RNR) until one is posted, then completes.
  softnic::Options o;
  o.rtoNs = 500000;
  auto p = Pair::make(o);
  ASSERT_TRUE(p);
  std::vector<uint8_t> src(1000, 7), dst(1000, 0);
  std::unique_ptr<MemoryRegion> ms, md;
  ASSERT_TRUE(p->pdA->registerMemory(src.data(), src.size(), 0, &ms).isOk());
  ASSERT_TRUE(p->pdB->registerMemory(dst.data(), dst.size(), kAccessRemoteWrite, &md).isOk());
  ASSERT_TRUE(p->qpA->postSend(writeWqe(kWqeRdmaWriteImm, *ms, 0, *md, 0, 1000, 9, 5)).isOk());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  Cqe none;
  EXPECT_EQ(p->cqB->poll(&none, 1), 0);
  ASSERT_TRUE(p->qpB->postRecv(RecvWqe{11, 0, 0, 0, 0}).isOk());
  auto rc = pollN(p->cqB.get(), 1);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].immData, 5u);
  EXPECT_GT(softnic::deviceCounters(p->devB.get()).rnrDiscards, 0u);
  EXPECT_GT(softnic::deviceCounters(p->devA.get()).retransmittedPackets, 0u);
}

TEST(SoftnicEngine, SendRecvAcrossPackets) {
  auto p = Pair::make();
  ASSERT_TRUE(p);
  std::vector<uint8_t> src(100000), dst(120000, 0);
  fillPattern(src, 3);
  std::unique_ptr<MemoryRegion> ms, md;
  ASSERT_TRUE(p->pdA->registerMemory(src.data(), src.size(), 0, &ms).isOk());
  ASSERT_TRUE(p->pdB->registerMemory(dst.data(), dst.size(), kAccessLocalWrite, &md).isOk());
  ASSERT_TRUE(p->qpB->postRecv(RecvWqe{1, md->addr(), md->lkey(), 120000, 0}).isOk());
  ASSERT_TRUE(p->qpB->postRecv(RecvWqe{2, md->addr() + 110000, md->lkey(), 10000, 0}).isOk());
  Wqe w = writeWqe(kWqeSend, *ms, 0, *md, 0, 100000, 31);
  ASSERT_TRUE(p->qpA->postSend(w).isOk());
  Wqe w2 = writeWqe(kWqeSendImm, *ms, 5, *md, 0, 3000, 32, 99);
  ASSERT_TRUE(p->qpA->postSend(w2).isOk());
  auto rc = pollN(p->cqB.get(), 2);
  ASSERT_EQ(rc.size(), 2u);
  EXPECT_EQ(rc[0].opcode, kCqeRecv);
  EXPECT_EQ(rc[0].byteLen, 100000u);
  EXPECT_EQ(rc[1].byteLen, 3000u);
  EXPECT_EQ(rc[1].immData, 99u);
  EXPECT_EQ(0, std::memcmp(dst.data(), src.data(), 100000));
  EXPECT_EQ(0, std::memcmp(dst.data() + 110000, src.data() + 5, 3000));
  auto sc = pollN(p->cqA.get(), 2);
  ASSERT_EQ(sc.size(), 2u);
  EXPECT_EQ(sc[0].opcode, kCqeSend);
}

TEST(SoftnicEngine, OrderingOfManyWritesToOneSlot) {
  // Every WRITE_IMM overwrites the same 4 KiB with its own pattern; RC order means each
  // receive completion sees exactly its own write, and the last one wins.
  auto p = Pair::make();
  ASSERT_TRUE(p);
  constexpr int kCount = 200;
  constexpr uint32_t kBytes = 4096;
  std::vector<uint8_t> src(kCount * kBytes), dst(kBytes);
  for (int i = 0; i < kCount; ++i) std::memset(src.data() + i * kBytes, i & 0xff, kBytes);
  std::unique_ptr<MemoryRegion> ms, md;
  ASSERT_TRUE(p->pdA->registerMemory(src.data(), src.size(), 0, &ms).isOk());
  ASSERT_TRUE(p->pdB->registerMemory(dst.data(), dst.size(), kAccessRemoteWrite, &md).isOk());
  for (int i = 0; i < 64; ++i) ASSERT_TRUE(p->qpB->postRecv(RecvWqe{uint64_t(i), 0, 0, 0, 0}).isOk());
  int posted = 0, recvPosted = 64;
  std::vector<uint32_t> imms;
  const double end = nowSec() + 20;
  while (imms.size() < kCount && nowSec() < end) {
    while (posted < kCount && p->qpA->sendSlotsFree() > 0) {
      ASSERT_TRUE(p->qpA
                      ->postSend(writeWqe(kWqeRdmaWriteImm, *ms, posted * kBytes, *md, 0, kBytes, posted,
                                          posted, (posted % 8) == 7))
                      .isOk());
      ++posted;
    }
    Cqe c[16];
    int n = p->cqB->poll(c, 16);
    for (int i = 0; i < n; ++i) {
      imms.push_back(c[i].immData);
      if (recvPosted < kCount)
        ASSERT_TRUE(p->qpB->postRecv(RecvWqe{uint64_t(recvPosted++), 0, 0, 0, 0}).isOk());
    }
    n = p->cqA->poll(c, 16);
    if (n == 0) std::this_thread::yield();
  }
  ASSERT_EQ(imms.size(), size_t(kCount));
  for (int i = 0; i < kCount; ++i) EXPECT_EQ(imms[i], uint32_t(i));
  for (uint32_t i = 0; i < kBytes; ++i) ASSERT_EQ(dst[i], (kCount - 1) & 0xff);
}

TEST(SoftnicEngine, BackPressureWithTinyStaging) {
  softnic::Options o;
  o.stagingBytes = 4096;
  o.mtu = 1024;
  auto p = Pair::make(o);
  ASSERT_TRUE(p);
  constexpr int kCount = 48;
  constexpr uint32_t kBytes = 9000;
  std::vector<uint8_t> src(kCount * kBytes), dst(kCount * kBytes, 0);
  fillPattern(src, 4);
  std::unique_ptr<MemoryRegion> ms, md;
  ASSERT_TRUE(p->pdA->registerMemory(src.data(), src.size(), 0, &ms).isOk());
  ASSERT_TRUE(p->pdB->registerMemory(dst.data(), dst.size(), kAccessRemoteWrite, &md).isOk());
  for (int i = 0; i < kCount; ++i)
    ASSERT_TRUE(
        p->qpA->postSend(writeWqe(kWqeRdmaWrite, *ms, i * kBytes, *md, i * kBytes, kBytes, i)).isOk());
  auto c = pollN(p->cqA.get(), kCount, 20);
  ASSERT_EQ(c.size(), size_t(kCount));
  for (int i = 0; i < kCount; ++i) {
    EXPECT_EQ(c[i].wrId, uint64_t(i));
    EXPECT_EQ(c[i].status, kCqeOk);
  }
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), src.size()));
  softnic::Counters k = softnic::deviceCounters(p->devA.get());
  EXPECT_GT(k.stagingStalls, 0u) << softnic::countersToString(k);
  EXPECT_EQ(k.injectedDrops, 0u);
}

TEST(SoftnicEngine, SendQueueFullIsReported) {
  softnic::Options o;
  o.stagingBytes = 4096;
  o.mtu = 1024;
  QpCaps caps;
  caps.maxSendWr = 4;
  auto p = Pair::make(o, o, caps);
  ASSERT_TRUE(p);
  std::vector<uint8_t> src(64 << 10), dst(64 << 10);
  std::unique_ptr<MemoryRegion> ms, md;
  ASSERT_TRUE(p->pdA->registerMemory(src.data(), src.size(), 0, &ms).isOk());
  ASSERT_TRUE(p->pdB->registerMemory(dst.data(), dst.size(), kAccessRemoteWrite, &md).isOk());
  int accepted = 0;
  Status last;
  // The engine retires WQEs while the loop posts, so how many are accepted before the
  // queue is full depends on timing (at least the 4 entries of the queue); what must hold
  // is that a full queue is refused with a clear error rather than overwritten.
  for (int i = 0; i < 64; ++i) {
    last = p->qpA->postSend(writeWqe(kWqeRdmaWrite, *ms, 0, *md, 0, 60000, i));
    if (!last.isOk()) break;
    ++accepted;
  }
  EXPECT_GE(accepted, 4);
  EXPECT_LT(accepted, 64);
  EXPECT_EQ(last.code(), ridgeInternalError);
  auto c = pollN(p->cqA.get(), accepted, 20);
  EXPECT_EQ(c.size(), size_t(accepted));
}

TEST(SoftnicEngine, DeviceMemoryIsASource) {
  auto p = Pair::make();
  ASSERT_TRUE(p);
  std::unique_ptr<DeviceMemory> dm;
  ASSERT_TRUE(p->pdA->allocDeviceMemory(32 << 10, kAccessLocalWrite, &dm).isOk());
  ASSERT_NE(dm->region(), nullptr);
  EXPECT_EQ(dm->region()->addr(), 0u);  // zero-based
  std::vector<uint8_t> data(32 << 10), back(32 << 10), dst(32 << 10, 0);
  fillPattern(data, 5);
  ASSERT_TRUE(dm->copyTo(0, data.data(), data.size()).isOk());
  ASSERT_TRUE(dm->copyFrom(back.data(), 0, back.size()).isOk());
  EXPECT_EQ(data, back);
  EXPECT_EQ(dm->copyTo(1, data.data(), data.size()).code(), ridgeInvalidArgument);
  std::unique_ptr<MemoryRegion> md;
  ASSERT_TRUE(p->pdB->registerMemory(dst.data(), dst.size(), kAccessRemoteWrite, &md).isOk());
  ASSERT_TRUE(p->qpA->postSend(writeWqe(kWqeRdmaWrite, *dm->region(), 100, *md, 0, 20000, 1)).isOk());
  auto c = pollN(p->cqA.get(), 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, kCqeOk);
  EXPECT_EQ(0, std::memcmp(dst.data(), data.data() + 100, 20000));
  // Device memory comes out of staging: asking for more than the device has fails.
  std::unique_ptr<DeviceMemory> big;
  EXPECT_FALSE(p->pdA->allocDeviceMemory(1 << 30, 0, &big).isOk());
}

// Device memory is part of the NIC's staging, so its bytes are sent (and resent after a loss)
// in place, without the copy into a packet chunk. Each write waits for its completion before
// the device memory is rewritten, as the gdr transport's credits make its producer wait; every
// write must land exactly although packets are dropped, duplicated, reordered and delayed.
void runDeviceMemoryInPlace(bool tcpPayload) {
  softnic::Options o;
  ASSERT_TRUE(
      softnic::parseFaults("drop=0.05,dup=0.05,reorder=0.05,delay=0.05:300us,seed=4", &o.faults).isOk());
  o.rtoNs = 1000000;
  o.mtu = 2048;
  o.forceTcpPayload = tcpPayload;
  auto p = Pair::make(o);
  ASSERT_TRUE(p);
  constexpr size_t kBytes = 12000;
  constexpr int kWrites = 40;
  std::unique_ptr<DeviceMemory> dm;
  ASSERT_TRUE(p->pdA->allocDeviceMemory(kBytes, kAccessLocalWrite, &dm).isOk());
  std::vector<uint8_t> data(kBytes), dst(kBytes * kWrites, 0);
  std::unique_ptr<MemoryRegion> md;
  ASSERT_TRUE(p->pdB->registerMemory(dst.data(), dst.size(), kAccessRemoteWrite, &md).isOk());
  for (int i = 0; i < kWrites; ++i) {
    fillPattern(data, static_cast<uint32_t>(20 + i));
    ASSERT_TRUE(dm->copyTo(0, data.data(), data.size()).isOk());
    ASSERT_TRUE(
        p->qpA->postSend(writeWqe(kWqeRdmaWrite, *dm->region(), 0, *md, kBytes * i, kBytes, i)).isOk());
    auto c = pollN(p->cqA.get(), 1);
    ASSERT_EQ(c.size(), 1u) << "write " << i;
    ASSERT_EQ(c[0].status, kCqeOk) << "write " << i;
    ASSERT_EQ(0, std::memcmp(dst.data() + kBytes * i, data.data(), kBytes)) << "write " << i;
  }
  const softnic::Counters k = softnic::deviceCounters(p->devA.get());
  EXPECT_GE(k.zeroCopyPackets, static_cast<uint64_t>(kWrites) * (kBytes / 2048))
      << softnic::countersToString(k);
  EXPECT_GT(k.injectedDrops + k.injectedDups + k.injectedReorders + k.injectedDelays, 0u);
  EXPECT_GT(k.retransmittedPackets, 0u) << softnic::countersToString(k);
}

TEST(SoftnicEngine, DeviceMemorySentInPlaceUnderFaults) {
  runDeviceMemoryInPlace(false);
}

TEST(SoftnicEngine, DeviceMemorySentInPlaceUnderFaultsTcpPayload) {
  runDeviceMemoryInPlace(true);
}

// An idle gdr rank sleeps in waitForNicActivity until the engine does something: a write
// landing at B must end B's wait long before its 5 s bound.
TEST(SoftnicEngine, WaitForNicActivityWakesWhenAWriteLands) {
  auto p = Pair::make();
  ASSERT_TRUE(p);
  std::vector<uint8_t> src(4096, 7), dst(4096, 0);
  std::unique_ptr<MemoryRegion> ms, md;
  ASSERT_TRUE(p->pdA->registerMemory(src.data(), src.size(), 0, &ms).isOk());
  ASSERT_TRUE(p->pdB->registerMemory(dst.data(), dst.size(), kAccessRemoteWrite, &md).isOk());
  std::thread poster([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(p->qpA->postSend(writeWqe(kWqeRdmaWrite, *ms, 0, *md, 0, 4096, 1)).isOk());
  });
  auto idle = [](void* d) { return __atomic_load_n(static_cast<uint8_t*>(d) + 4095, __ATOMIC_ACQUIRE) == 0; };
  const double t0 = nowSec();
  int waits = 0;
  for (; waits < 10 && idle(dst.data()) && nowSec() - t0 < 5; ++waits)
    ASSERT_TRUE(softnic::waitForNicActivity(p->devB.get(), 5000000000, idle, dst.data()));
  const double took = nowSec() - t0;
  // Observed before the poster is joined: a wait that returned without sleeping would use up
  // its ten rounds within microseconds, long before the write is posted at 50 ms.
  const bool landedWhileWaiting = !idle(dst.data());
  poster.join();
  EXPECT_TRUE(landedWhileWaiting) << waits << " waits ended after " << took << " s with nothing landed";
  EXPECT_GE(took, 0.040) << "the wait returned before the write was posted";
  EXPECT_LT(waits, 10) << "every wait returned early";
  EXPECT_EQ(dst[4095], 7) << "the write did not land";
  EXPECT_LT(took, ridgetest::scaledSeconds(2.0)) << "the wait was not ended by the engine";
}

TEST(SoftnicEngine, RemoteAccessErrorMovesQpToError) {
  auto p = Pair::make();
  ASSERT_TRUE(p);
  std::vector<uint8_t> src(8192, 1), dst(4096);
  std::unique_ptr<MemoryRegion> ms, md;
  ASSERT_TRUE(p->pdA->registerMemory(src.data(), src.size(), 0, &ms).isOk());
  ASSERT_TRUE(p->pdB->registerMemory(dst.data(), dst.size(), 0 /* no remote write */, &md).isOk());
  ASSERT_TRUE(p->qpA->postSend(writeWqe(kWqeRdmaWrite, *ms, 0, *md, 0, 100, 1)).isOk());
  ASSERT_TRUE(p->qpA->postSend(writeWqe(kWqeRdmaWrite, *ms, 0, *md, 0, 100, 2)).isOk());
  auto c = pollN(p->cqA.get(), 2);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].status, kCqeRemoteAccessError) << cqeStatusName(c[0].status);
  EXPECT_EQ(c[1].status, kCqeFlushed) << cqeStatusName(c[1].status);
  EXPECT_EQ(p->qpA->state(), QpState::Error);
  // Local protection: an lkey range beyond the region.
  std::unique_ptr<MemoryRegion> md2;
  ASSERT_TRUE(p->pdB->registerMemory(dst.data(), dst.size(), kAccessRemoteWrite, &md2).isOk());
  ASSERT_TRUE(p->qpB->postSend(writeWqe(kWqeRdmaWrite, *md2, 0, *ms, 0, 5000, 3)).isOk());
  auto c2 = pollN(p->cqB.get(), 1);
  ASSERT_EQ(c2.size(), 1u);
  EXPECT_EQ(c2[0].status, kCqeLocalProtectionError);
}

TEST(SoftnicEngine, RawMlx5QueuesWithoutProviderCalls) {
  // What a GPU thread does: write mlx5 WQEs into the send queue, publish the doorbell record,
  // ring the UAR, and poll mlx5 CQEs by owner bit, without calling postSend or poll. Every
  // 4th WQE asks for a CQE; the 16 writes complete as 4 CQEs naming WQEs 3, 7, 11 and 15.
  auto p = Pair::make();
  ASSERT_TRUE(p);
  const mlx5::SqView* sq = p->qpA->mlx5Sq();
  const mlx5::CqView* cq = p->cqA->mlx5Cq();
  ASSERT_NE(sq, nullptr);
  ASSERT_NE(cq, nullptr);
  std::vector<uint8_t> src(16 * 1000), dst(16 * 1000 + 64, 0);
  fillPattern(src, 6);
  std::unique_ptr<MemoryRegion> ms, md;
  ASSERT_TRUE(p->pdA->registerMemory(src.data(), src.size(), 0, &ms).isOk());
  ASSERT_TRUE(p->pdB->registerMemory(dst.data(), dst.size(), kAccessRemoteWrite, &md).isOk());
  mlx5::WqeBuf w;
  for (uint32_t i = 0; i < 16; ++i) {
    const uint8_t fm = mlx5::signalEvery(i, 4) ? uint8_t{mlx5::kCtrlCqUpdate} : uint8_t{0};
    const uint32_t ds =
        mlx5::buildWqe(&w, mlx5::kOpRdmaWrite, static_cast<uint16_t>(i), sq->qpn, fm, 0,
                       md->addr() + i * 1000, md->rkey(), ms->addr() + i * 1000, ms->lkey(), 1000);
    mlx5::copyToRing(*sq, i, w, mlx5::wqeBbs(ds));
  }
  mlx5::publishDbr(*sq, 16);
  mlx5::ringDoorbell(*sq, w);  // one doorbell for all sixteen; the engine notices within its idle timeout
  // Then 16 inline bytes, rung through BlueFlame.
  const uint8_t tail[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  const uint32_t ds = mlx5::buildInlineWqe(&w, mlx5::kOpRdmaWrite, 16, sq->qpn, mlx5::kCtrlCqUpdate, 0,
                                           md->addr() + 16000, md->rkey(), tail, sizeof tail);
  mlx5::copyToRing(*sq, 16, w, mlx5::wqeBbs(ds));
  mlx5::publishDbr(*sq, 17);
  uint32_t bfOffset = 0;
  ASSERT_TRUE(mlx5::ringBlueFlame(*sq, w, mlx5::wqeBbs(ds), &bfOffset));
  uint32_t ci = 0;
  std::vector<mlx5::CqeFields> got;
  const double end = nowSec() + 10;
  while (got.size() < 5 && nowSec() < end) {
    mlx5::CqeFields c;
    if (mlx5::pollCq(*cq, &ci, &c))
      got.push_back(c);
    else
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ASSERT_EQ(got.size(), 5u);
  for (uint32_t i = 0; i < 5; ++i) {
    EXPECT_EQ(got[i].opcode, mlx5::kCqeReq);
    EXPECT_EQ(got[i].wqeOpcode, mlx5::kOpRdmaWrite);
    EXPECT_EQ(got[i].qpn, sq->qpn);
    EXPECT_EQ(got[i].wqeCounter, i < 4 ? 4 * i + 3 : 16u);
  }
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), src.size()));
  EXPECT_EQ(0, std::memcmp(tail, dst.data() + 16000, sizeof tail));
  mlx5::CqeFields extra;
  EXPECT_FALSE(mlx5::pollCq(*cq, &ci, &extra)) << "unsignaled WQEs complete without CQEs";
}

// The engine parses what it takes: a WQE whose control segment carries another index than the
// consumer index (a producer that published the record before writing the WQE, or wrote it at
// the wrong place) is malformed, and the QP fails with an mlx5 error CQE instead of sending.
TEST(SoftnicEngine, MalformedMlx5WqeFailsTheQp) {
  auto p = Pair::make();
  ASSERT_TRUE(p);
  const mlx5::SqView* sq = p->qpA->mlx5Sq();
  const mlx5::CqView* cq = p->cqA->mlx5Cq();
  std::vector<uint8_t> src(64, 7), dst(64, 0);
  std::unique_ptr<MemoryRegion> ms, md;
  ASSERT_TRUE(p->pdA->registerMemory(src.data(), src.size(), 0, &ms).isOk());
  ASSERT_TRUE(p->pdB->registerMemory(dst.data(), dst.size(), kAccessRemoteWrite, &md).isOk());
  mlx5::WqeBuf w;
  mlx5::buildWqe(&w, mlx5::kOpRdmaWrite, /*wqeIndex=*/5, sq->qpn, mlx5::kCtrlCqUpdate, 0, md->addr(),
                 md->rkey(), ms->addr(), ms->lkey(), 64);
  mlx5::copyToRing(*sq, 0, w, 1);
  mlx5::publishDbr(*sq, 1);
  mlx5::ringDoorbell(*sq, w);
  mlx5::CqeFields c{};
  uint32_t ci = 0;
  const double end = nowSec() + 10;
  bool got = false;
  while (!got && nowSec() < end) {
    got = mlx5::pollCq(*cq, &ci, &c);
    if (!got) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ASSERT_TRUE(got) << "no completion for the malformed WQE";
  EXPECT_EQ(c.opcode, mlx5::kCqeReqErr);
  EXPECT_EQ(c.syndrome, mlx5::kSyndLocalQpOp);
  EXPECT_EQ(c.wqeCounter, 0u);
  EXPECT_EQ(p->qpA->state(), QpState::Error);
  EXPECT_EQ(dst, std::vector<uint8_t>(64, 0)) << "nothing of a malformed WQE is sent";
}

TEST(SoftnicEngine, InlineTcpPayload) {
  softnic::Options o;
  o.forceTcpPayload = true;
  auto p = Pair::make(o);
  ASSERT_TRUE(p);
  std::vector<uint8_t> src(300000), dst(300000);
  fillPattern(src, 7);
  std::unique_ptr<MemoryRegion> ms, md;
  ASSERT_TRUE(p->pdA->registerMemory(src.data(), src.size(), 0, &ms).isOk());
  ASSERT_TRUE(p->pdB->registerMemory(dst.data(), dst.size(), kAccessRemoteWrite, &md).isOk());
  ASSERT_TRUE(p->qpA->postSend(writeWqe(kWqeRdmaWrite, *ms, 0, *md, 0, 300000, 1)).isOk());
  ASSERT_EQ(pollN(p->cqA.get(), 1).size(), 1u);
  EXPECT_EQ(src, dst);
  softnic::Counters k = softnic::deviceCounters(p->devB.get());
  EXPECT_GT(k.inlinePayloads, 0u);
  EXPECT_EQ(k.cmaPayloadReads, 0u);
}

TEST(SoftnicFaults, ParseFaults) {
  softnic::FaultSpec f;
  ASSERT_TRUE(
      softnic::parseFaults("drop=0.01,delay=0.02:200us,reorder=0.03,dup=0.04,staging_exhaust=0.05,seed=9", &f)
          .isOk());
  EXPECT_DOUBLE_EQ(f.drop, 0.01);
  EXPECT_DOUBLE_EQ(f.delay, 0.02);
  EXPECT_EQ(f.delayNs, 200000);
  EXPECT_DOUBLE_EQ(f.reorder, 0.03);
  EXPECT_DOUBLE_EQ(f.dup, 0.04);
  EXPECT_DOUBLE_EQ(f.stagingExhaust, 0.05);
  EXPECT_EQ(f.seed, 9u);
  ASSERT_TRUE(softnic::parseFaults("delay=0.5:2ms", &f).isOk());
  EXPECT_EQ(f.delayNs, 2000000);
  ASSERT_TRUE(softnic::parseFaults("", &f).isOk());
  EXPECT_FALSE(f.any());
  EXPECT_FALSE(softnic::parseFaults("drop", &f).isOk());
  EXPECT_FALSE(softnic::parseFaults("jitter=0.1", &f).isOk());
  EXPECT_FALSE(softnic::parseFaults("drop=abc", &f).isOk());
  EXPECT_FALSE(softnic::parseFaults("drop=0.9", &f).isOk());
}

// Heavy faults in both directions: every message must arrive exactly once, in order, with
// exact bytes, and the counters must show that each kind of fault happened and was repaired.
void runFaultyStream(bool tcpPayload) {
  softnic::Options o;
  ASSERT_TRUE(softnic::parseFaults(
                  "drop=0.05,dup=0.05,reorder=0.05,delay=0.05:300us,staging_exhaust=0.05,seed=11", &o.faults)
                  .isOk());
  o.rtoNs = 1000000;
  o.mtu = 2048;
  o.stagingBytes = 32 << 10;
  o.forceTcpPayload = tcpPayload;
  auto p = Pair::make(o);
  ASSERT_TRUE(p);
  constexpr int kCount = 300;
  constexpr uint32_t kMax = 10000;
  std::vector<uint8_t> src(kCount * kMax), dst(kCount * kMax, 0);
  fillPattern(src, 8);
  std::unique_ptr<MemoryRegion> ms, md;
  ASSERT_TRUE(p->pdA->registerMemory(src.data(), src.size(), 0, &ms).isOk());
  ASSERT_TRUE(
      p->pdB->registerMemory(dst.data(), dst.size(), kAccessRemoteWrite | kAccessLocalWrite, &md).isOk());
  auto lenOf = [](int i) { return static_cast<uint32_t>((i * 7919) % kMax + 1); };
  int posted = 0, recvPosted = 0;
  for (; recvPosted < 32; ++recvPosted)
    ASSERT_TRUE(p->qpB->postRecv(RecvWqe{uint64_t(recvPosted), 0, 0, 0, 0}).isOk());
  std::vector<Cqe> recvd, sent;
  const double end = nowSec() + 60;
  while ((recvd.size() < kCount || sent.size() < kCount) && nowSec() < end) {
    while (posted < kCount && p->qpA->sendSlotsFree() > 0) {
      const uint8_t op = (posted % 3 == 2) ? kWqeRdmaWrite : kWqeRdmaWriteImm;
      ASSERT_TRUE(p->qpA
                      ->postSend(writeWqe(op, *ms, size_t(posted) * kMax, *md, size_t(posted) * kMax,
                                          lenOf(posted), posted, 1000 + posted))
                      .isOk());
      ++posted;
    }
    Cqe c[16];
    int n = p->cqB->poll(c, 16);
    for (int i = 0; i < n; ++i) {
      recvd.push_back(c[i]);
      if (recvPosted < kCount)
        ASSERT_TRUE(p->qpB->postRecv(RecvWqe{uint64_t(recvPosted++), 0, 0, 0, 0}).isOk());
    }
    int m = p->cqA->poll(c, 16);
    for (int i = 0; i < m; ++i) sent.push_back(c[i]);
    if (n == 0 && m == 0) p->cqA->wait(1000000, nullptr, nullptr);
    if (recvd.size() == size_t(kCount - kCount / 3) && sent.size() == size_t(kCount)) break;
  }
  ASSERT_EQ(sent.size(), size_t(kCount));
  for (int i = 0; i < kCount; ++i) {
    EXPECT_EQ(sent[i].wrId, uint64_t(i));
    EXPECT_EQ(sent[i].status, kCqeOk) << cqeStatusName(sent[i].status);
  }
  // Receive completions: one per WRITE_IMM, in posting order, never a duplicate.
  std::vector<uint32_t> expectImm;
  for (int i = 0; i < kCount; ++i)
    if (i % 3 != 2) expectImm.push_back(1000 + i);
  ASSERT_EQ(recvd.size(), expectImm.size());
  for (size_t i = 0; i < recvd.size(); ++i) {
    EXPECT_EQ(recvd[i].immData, expectImm[i]);
    EXPECT_EQ(recvd[i].byteLen, lenOf(recvd[i].immData - 1000));
    EXPECT_EQ(recvd[i].wrId, uint64_t(i));
  }
  for (int i = 0; i < kCount; ++i) {
    ASSERT_EQ(0, std::memcmp(src.data() + size_t(i) * kMax, dst.data() + size_t(i) * kMax, lenOf(i))) << i;
    for (uint32_t b = lenOf(i); b < kMax; ++b) ASSERT_EQ(dst[size_t(i) * kMax + b], 0) << i << " " << b;
  }
  softnic::Counters a = softnic::deviceCounters(p->devA.get());
  softnic::Counters b = softnic::deviceCounters(p->devB.get());
  std::printf("sender:   %s\nreceiver: %s\n", softnic::countersToString(a).c_str(),
              softnic::countersToString(b).c_str());
  EXPECT_GT(a.injectedDrops, 0u);
  EXPECT_GT(a.injectedDups, 0u);
  EXPECT_GT(a.injectedReorders, 0u);
  EXPECT_GT(a.injectedDelays, 0u);
  EXPECT_GT(a.injectedStagingExhaust, 0u);
  EXPECT_GT(a.retransmittedPackets, 0u);
  EXPECT_GT(b.duplicatesDiscarded, 0u);
  EXPECT_GT(b.outOfOrderDiscarded, 0u);
  EXPECT_GT(b.naksSent, 0u);
  if (tcpPayload)
    EXPECT_GT(b.inlinePayloads, 0u);
  else
    EXPECT_GT(b.cmaPayloadReads, 0u);
}

TEST(SoftnicFaults, ExactDeliveryUnderFaultsCma) {
  runFaultyStream(false);
}
TEST(SoftnicFaults, ExactDeliveryUnderFaultsTcp) {
  runFaultyStream(true);
}

// Reads/writes exactly `n` bytes on a pipe.
bool pipeIo(int fd, void* p, size_t n, bool write) {
  char* c = static_cast<char*>(p);
  while (n) {
    ssize_t k = write ? ::write(fd, c, n) : ::read(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

struct Exchanged {
  QpAddress qp;
  uint64_t addr;
  uint32_t rkey;
};

TEST(SoftnicProcesses, WriteIntoAnotherProcessAndPeerDeath) {
  loopbackEnv();
  int toChild[2], toParent[2];
  ASSERT_EQ(pipe(toChild), 0);
  ASSERT_EQ(pipe(toParent), 0);
  constexpr size_t kBytes = 2 << 20;
  std::fflush(stdout);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: target of one 2 MiB WRITE_IMM; checks the bytes, reports, then exits while the
    // parent still has a WQE outstanding.
    int rc = 1;
    std::unique_ptr<Device> dev;
    std::unique_ptr<ProtectionDomain> pd;
    std::unique_ptr<CompletionQueue> cq;
    std::unique_ptr<QueuePair> qp;
    std::vector<uint8_t> dst(kBytes, 0), expect(kBytes);
    fillPattern(expect, 9);
    std::unique_ptr<MemoryRegion> md;
    Exchanged mine{}, theirs{};
    if (softnic::openDevice({}, &dev).isOk() && dev->allocPd(&pd).isOk() && pd->createCq(64, &cq).isOk() &&
        pd->createQp(cq.get(), cq.get(), {}, &qp).isOk() &&
        pd->registerMemory(dst.data(), kBytes, kAccessRemoteWrite, &md).isOk() &&
        qp->localAddress(&mine.qp).isOk()) {
      mine.addr = md->addr();
      mine.rkey = md->rkey();
      if (pipeIo(toParent[1], &mine, sizeof mine, true) &&
          pipeIo(toChild[0], &theirs, sizeof theirs, false) && qp->modify(QpState::Init).isOk() &&
          qp->postRecv(RecvWqe{1, 0, 0, 0, 0}).isOk() && qp->modify(QpState::Rtr, &theirs.qp).isOk()) {
        char go = 0;
        pipeIo(toChild[0], &go, 1, false);
        auto c = pollN(cq.get(), 1, 20);
        if (c.size() == 1 && c[0].immData == 4242 && dst == expect) rc = 0;
        softnic::Counters k = softnic::deviceCounters(dev.get());
        if (k.cmaPayloadReads == 0) rc = 3;
      }
    }
    char r = static_cast<char>(rc);
    pipeIo(toParent[1], &r, 1, true);
    // Stay until the parent has its own completion: leaving earlier could close the
    // connection before our NIC acknowledged the write, which RC reports as a failure.
    char bye = 0;
    pipeIo(toChild[0], &bye, 1, false);
    _exit(rc);
  }
  auto p = std::make_unique<Pair>();
  ASSERT_TRUE(softnic::openDevice({}, &p->devA).isOk());
  ASSERT_TRUE(p->devA->allocPd(&p->pdA).isOk());
  ASSERT_TRUE(p->pdA->createCq(64, &p->cqA).isOk());
  ASSERT_TRUE(p->pdA->createQp(p->cqA.get(), p->cqA.get(), {}, &p->qpA).isOk());
  std::vector<uint8_t> src(kBytes);
  fillPattern(src, 9);
  std::unique_ptr<MemoryRegion> ms;
  ASSERT_TRUE(p->pdA->registerMemory(src.data(), kBytes, 0, &ms).isOk());
  Exchanged mine{}, theirs{};
  ASSERT_TRUE(p->qpA->localAddress(&mine.qp).isOk());
  ASSERT_TRUE(pipeIo(toParent[0], &theirs, sizeof theirs, false));
  ASSERT_TRUE(pipeIo(toChild[1], &mine, sizeof mine, true));
  ASSERT_TRUE(p->qpA->modify(QpState::Init).isOk());
  ASSERT_TRUE(p->qpA->modify(QpState::Rtr, &theirs.qp).isOk());
  Status s = p->qpA->modify(QpState::Rts);
  ASSERT_TRUE(s.isOk()) << s.message();
  char go = 1;
  ASSERT_TRUE(pipeIo(toChild[1], &go, 1, true));
  Wqe w{};
  w.opcode = kWqeRdmaWriteImm;
  w.flags = kWqeSignaled;
  w.length = kBytes;
  w.immData = 4242;
  w.localAddr = ms->addr();
  w.lkey = ms->lkey();
  w.remoteAddr = theirs.addr;
  w.rkey = theirs.rkey;
  w.wrId = 1;
  ASSERT_TRUE(p->qpA->postSend(w).isOk());
  auto c = pollN(p->cqA.get(), 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, kCqeOk);
  char childRc = 99;
  ASSERT_TRUE(pipeIo(toParent[0], &childRc, 1, false));
  EXPECT_EQ(childRc, 0)
      << "child: 1 = wrong data or no completion, 3 = payload not read with process_vm_readv";
  char bye = 1;
  ASSERT_TRUE(pipeIo(toChild[1], &bye, 1, true));
  int status = 0;
  waitpid(pid, &status, 0);
  // The target is gone: the next WRITE must fail with an error completion, not hang.
  w.wrId = 2;
  w.length = 1000;
  const double t0 = nowSec();
  ASSERT_TRUE(p->qpA->postSend(w).isOk());
  auto c2 = pollN(p->cqA.get(), 1, 20);
  ASSERT_EQ(c2.size(), 1u);
  EXPECT_NE(c2[0].status, kCqeOk);
  EXPECT_LT(nowSec() - t0, ridgetest::scaledSeconds(5.0));
  EXPECT_EQ(p->qpA->state(), QpState::Error);
}

TEST(VerbsProvider, LookupByName) {
  std::unique_ptr<Provider> prov;
  ASSERT_TRUE(openProvider("softnic", &prov).isOk());
  EXPECT_STREQ(prov->name(), "softnic");
  std::vector<DeviceAttributes> devs;
  ASSERT_TRUE(prov->listDevices(&devs).isOk());
  ASSERT_EQ(devs.size(), 1u);
  EXPECT_TRUE(devs[0].portActive);
  EXPECT_EQ(openProvider("nonsense", &prov).code(), ridgeInvalidArgument);
}

}  // namespace
}  // namespace ridge

namespace ridge {
namespace {

TEST(RegistrationCache, HitsCoversEvictsAndInvalidates) {
  loopbackEnv();
  std::unique_ptr<verbs::Device> dev;
  ASSERT_TRUE(softnic::openDevice({}, &dev).isOk());
  std::unique_ptr<verbs::ProtectionDomain> pd;
  ASSERT_TRUE(dev->allocPd(&pd).isOk());
  RegistrationCache cache(pd.get(), 2);
  // Three ranges pages apart, so that page rounding cannot make one cover another.
  char* area =
      static_cast<char*>(mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(area, MAP_FAILED);
  struct Range {
    char* p;
    char* data() const { return p; }
    size_t size() const { return 64 << 10; }
  } a{area}, b{area + (256 << 10)}, c{area + (512 << 10)};
  verbs::MemoryRegion *m1 = nullptr, *m2 = nullptr, *m3 = nullptr;
  ASSERT_TRUE(cache.get(a.data(), a.size(), verbs::kAccessRemoteWrite, &m1).isOk());
  // A sub-range with fewer rights is the same registration.
  ASSERT_TRUE(cache.get(a.data() + 100, 1000, 0, &m2).isOk());
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(cache.hits(), 1u);
  EXPECT_LE(m1->addr(), reinterpret_cast<uint64_t>(a.data()));
  EXPECT_GE(m1->addr() + m1->length(), reinterpret_cast<uint64_t>(a.data()) + a.size());
  // More rights than cached: a new registration.
  ASSERT_TRUE(cache.get(b.data(), b.size(), 0, &m2).isOk());
  ASSERT_TRUE(cache.get(a.data(), a.size(), verbs::kAccessRemoteWrite, &m1).isOk());  // a is now newest
  ASSERT_TRUE(cache.get(c.data(), c.size(), 0, &m3).isOk());                          // evicts b
  EXPECT_EQ(cache.size(), 2u);
  const uint64_t misses = cache.misses();
  ASSERT_TRUE(cache.get(a.data(), 10, 0, &m1).isOk());
  EXPECT_EQ(cache.misses(), misses);
  ASSERT_TRUE(cache.get(b.data(), 10, 0, &m2).isOk());
  EXPECT_EQ(cache.misses(), misses + 1);
  cache.invalidate(a.data(), 1);
  ASSERT_TRUE(cache.get(a.data(), 10, 0, &m1).isOk());
  EXPECT_EQ(cache.misses(), misses + 2);
  cache.invalidate(area, 1 << 20);
  EXPECT_EQ(cache.size(), 0u);
  munmap(area, 1 << 20);
}

}  // namespace
}  // namespace ridge

// ---- GPU memory registration, emulated ------------------------------------------------------
// A memfd stands in for a dma-buf exporter (the GPU driver): softnic registers a dma-buf by
// mapping its fd, and a memfd is a file descriptor for pages that can be mapped the same
// way. Nothing here touches a GPU; tests/gpu/test_gpu_dmabuf.cpp exports real GPU memory.
namespace ridge {
namespace {

int makeMemfd(size_t bytes) {
  const int fd = static_cast<int>(syscall(SYS_memfd_create, "ridge-fake-dmabuf", 0));
  if (fd >= 0 && ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

size_t pageBytes() {
  return static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// One softnic device and protection domain, without QPs.
struct LonePd {
  std::unique_ptr<Device> dev;
  std::unique_ptr<ProtectionDomain> pd;
  LonePd() {
    loopbackEnv();
    EXPECT_TRUE(softnic::openDevice({}, &dev).isOk());
    if (dev) EXPECT_TRUE(dev->allocPd(&pd).isOk());
  }
};

// An RDMA write of `len` bytes from src+srcOff to dst+dstOff on `qp`, waited for: the
// completion status, or 0xFF when the post failed or no completion came.
uint8_t writeAndWait(QueuePair* qp, CompletionQueue* cq, const MemoryRegion& src, size_t srcOff,
                     const MemoryRegion& dst, size_t dstOff, size_t len) {
  if (!qp->postSend(writeWqe(kWqeRdmaWrite, src, srcOff, dst, dstOff, static_cast<uint32_t>(len), 1)).isOk())
    return 0xFF;
  auto c = pollN(cq, 1);
  return c.size() == 1 ? c[0].status : 0xFF;
}

TEST(SoftnicDmaBuf, WritesLandInTheBufferBehindTheFd) {
  auto p = Pair::make();
  ASSERT_TRUE(p);
  const size_t page = pageBytes();
  const size_t offset = page + 100, regBytes = 2 * page;
  const int fd = makeMemfd(4 * page);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  // An address nothing in this process maps: softnic must reach the memory through its
  // mapping of the fd, never through the iova.
  const uint64_t iova = 0x7e0000001000ull;
  std::unique_ptr<MemoryRegion> mdst;
  Status st =
      p->pdB->registerDmaBuf(fd, offset, regBytes, iova, kAccessLocalWrite | kAccessRemoteWrite, &mdst);
  ASSERT_TRUE(st.isOk()) << st.message();
  EXPECT_EQ(mdst->addr(), iova);
  EXPECT_EQ(mdst->length(), regBytes);
  std::vector<uint8_t> src(regBytes - 64);
  fillPattern(src, 9);
  std::unique_ptr<MemoryRegion> msrc;
  ASSERT_TRUE(p->pdA->registerMemory(src.data(), src.size(), kAccessLocalWrite, &msrc).isOk());
  ASSERT_EQ(writeAndWait(p->qpA.get(), p->cqA.get(), *msrc, 0, *mdst, 32, src.size()), kCqeOk);
  // The bytes are in the fd's pages, at offset + 32.
  std::vector<uint8_t> inFile(src.size(), 0xEE);
  ASSERT_EQ(pread(fd, inFile.data(), inFile.size(), static_cast<off_t>(offset + 32)),
            static_cast<ssize_t>(inFile.size()));
  EXPECT_EQ(std::memcmp(inFile.data(), src.data(), src.size()), 0);
  close(fd);  // the registration keeps its own mapping
  // Writing past the registered length is a remote access error, not a write into the fd.
  const uint8_t past = writeAndWait(p->qpA.get(), p->cqA.get(), *msrc, 0, *mdst, regBytes - 16, 64);
  EXPECT_NE(past, kCqeOk);
  EXPECT_NE(past, 0xFF);
}

TEST(SoftnicDmaBuf, AFdRegionIsASourceToo) {
  auto p = Pair::make();
  ASSERT_TRUE(p);
  const size_t page = pageBytes();
  const int fd = makeMemfd(2 * page);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> pattern(page);
  fillPattern(pattern, 3);
  ASSERT_EQ(pwrite(fd, pattern.data(), page, static_cast<off_t>(page)), static_cast<ssize_t>(page));
  std::unique_ptr<MemoryRegion> src, dst;
  ASSERT_TRUE(p->pdA->registerDmaBuf(fd, page, page, 0x2000, kAccessLocalWrite, &src).isOk());
  close(fd);
  std::vector<uint8_t> out(page, 0);
  ASSERT_TRUE(p->pdB->registerMemory(out.data(), page, kAccessLocalWrite | kAccessRemoteWrite, &dst).isOk());
  ASSERT_EQ(writeAndWait(p->qpA.get(), p->cqA.get(), *src, 0, *dst, 0, page), kCqeOk);
  EXPECT_EQ(std::memcmp(out.data(), pattern.data(), page), 0);
}

TEST(SoftnicDmaBuf, UnmappableFdIsRefusedWithTheReason) {
  LonePd lone;
  ASSERT_NE(lone.pd, nullptr);
  int pipeFds[2];
  ASSERT_EQ(pipe(pipeFds), 0);
  std::unique_ptr<MemoryRegion> mr;
  Status st = lone.pd->registerDmaBuf(pipeFds[0], 0, 4096, 0x1000, kAccessLocalWrite, &mr);
  EXPECT_EQ(st.code(), ridgeSystemError);
  EXPECT_NE(st.message().find("cannot map dma-buf"), std::string::npos) << st.message();
  EXPECT_EQ(lone.pd->registerDmaBuf(-1, 0, 4096, 0x1000, kAccessLocalWrite, &mr).code(),
            ridgeInvalidArgument);
  close(pipeFds[0]);
  close(pipeFds[1]);
  // A range past the end of the buffer is refused up front (a mapping of it would fault).
  const size_t page = pageBytes();
  const int fd = makeMemfd(2 * page);
  ASSERT_GE(fd, 0);
  st = lone.pd->registerDmaBuf(fd, page + 1, page, 0x1000, kAccessLocalWrite, &mr);
  EXPECT_EQ(st.code(), ridgeInvalidArgument);
  EXPECT_NE(st.message().find("do not fit"), std::string::npos) << st.message();
  EXPECT_TRUE(lone.pd->registerDmaBuf(fd, page, page, 0x1000, kAccessLocalWrite, &mr).isOk());
  close(fd);
}

// "Device memory" for the registration cache: one memfd mapped at a fixed place, which the
// registrar reports as a device allocation and exports as itself.
class FakeGpuRegistrar final : public DeviceMemoryRegistrar {
 public:
  FakeGpuRegistrar(size_t bytes, bool exports) : bytes_(bytes), exports_(exports) {
    fd_ = makeMemfd(bytes);
    void* p = fd_ >= 0 ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0) : MAP_FAILED;
    base_ = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  }
  ~FakeGpuRegistrar() override {
    if (base_) munmap(base_, bytes_);
    if (fd_ >= 0) close(fd_);
  }
  const char* name() const override { return "fake GPU (memfd)"; }
  bool deviceAllocation(const void* addr, uintptr_t* base, size_t* bytes) override {
    const auto a = reinterpret_cast<uintptr_t>(addr), b = reinterpret_cast<uintptr_t>(base_);
    if (!base_ || a < b || a >= b + bytes_) return false;
    *base = b;
    *bytes = bytes_;
    return true;
  }
  Status exportDmaBuf(uintptr_t base, size_t bytes, int* fd) override {
    ++exports;
    if (!exports_) return makeError(ridgeSystemError, "this fake GPU has no dma-buf");
    if (base != reinterpret_cast<uintptr_t>(base_) || bytes != bytes_)
      return makeError(ridgeInvalidArgument, "fake export of a range that is not the allocation");
    *fd = dup(fd_);
    return Status::ok();
  }
  char* base_ = nullptr;
  size_t bytes_;
  bool exports_;
  int fd_ = -1;
  int exports = 0;
};

TEST(RegistrationCache, DeviceMemoryIsRegisteredPerAllocationThroughDmaBuf) {
  auto p = Pair::make();
  ASSERT_TRUE(p);
  const size_t page = pageBytes();
  FakeGpuRegistrar gpu(16 * page, true);
  ASSERT_NE(gpu.base_, nullptr);
  RegistrationCache cache(p->pdB.get(), 8);
  cache.setDeviceRegistrar(&gpu);
  verbs::MemoryRegion *m1 = nullptr, *m2 = nullptr;
  ASSERT_TRUE(cache.get(gpu.base_ + 3 * page + 5, 100, kAccessLocalWrite | kAccessRemoteWrite, &m1).isOk());
  EXPECT_EQ(cache.dmaBufRegistrations(), 1u);
  EXPECT_EQ(cache.peerMemoryRegistrations(), 0u);
  EXPECT_EQ(m1->addr(), reinterpret_cast<uint64_t>(gpu.base_));  // the whole allocation
  EXPECT_EQ(m1->length(), 16 * page);
  // Any other buffer in the same allocation is the same registration.
  ASSERT_TRUE(cache.get(gpu.base_ + 15 * page, page, kAccessRemoteWrite, &m2).isOk());
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(cache.misses(), 1u);
  EXPECT_EQ(gpu.exports, 1);
  // Data written through the region lands in the "device" memory.
  std::vector<uint8_t> src(page);
  fillPattern(src, 4);
  std::unique_ptr<MemoryRegion> msrc;
  ASSERT_TRUE(p->pdA->registerMemory(src.data(), src.size(), kAccessLocalWrite, &msrc).isOk());
  ASSERT_EQ(writeAndWait(p->qpA.get(), p->cqA.get(), *msrc, 0, *m1, 7 * page, page), kCqeOk);
  EXPECT_EQ(std::memcmp(gpu.base_ + 7 * page, src.data(), page), 0);
  // A range that runs past the allocation is refused, not registered.
  EXPECT_EQ(cache.get(gpu.base_ + 15 * page, 2 * page, 0, &m2).code(), ridgeInvalidArgument);
  cache.invalidate(gpu.base_, 16 * page);
  EXPECT_EQ(cache.size(), 0u);
}

TEST(RegistrationCache, DeviceMemoryFallsBackToPeerMemoryWithoutDmaBuf) {
  LonePd lone;
  ASSERT_NE(lone.pd, nullptr);
  FakeGpuRegistrar gpu(4 * pageBytes(), false);
  ASSERT_NE(gpu.base_, nullptr);
  RegistrationCache cache(lone.pd.get(), 8);
  cache.setDeviceRegistrar(&gpu);
  verbs::MemoryRegion* m = nullptr;
  ASSERT_TRUE(cache.get(gpu.base_ + 10, 10, kAccessLocalWrite, &m).isOk());
  EXPECT_EQ(gpu.exports, 1);
  EXPECT_EQ(cache.dmaBufRegistrations(), 0u);
  EXPECT_EQ(cache.peerMemoryRegistrations(), 1u);
  EXPECT_EQ(m->addr(), reinterpret_cast<uint64_t>(gpu.base_));
  // Host memory next to it is still plain host registration, and counts as neither.
  std::vector<uint8_t> host(100);
  ASSERT_TRUE(cache.get(host.data(), host.size(), 0, &m).isOk());
  EXPECT_EQ(cache.peerMemoryRegistrations(), 1u);
}

TEST(DeviceRegistration, PageAlignedRanges) {
  uintptr_t start = 0;
  size_t len = 0;
  pageAlignRange(0x10000, 4096, 4096, &start, &len);
  EXPECT_EQ(start, 0x10000u);
  EXPECT_EQ(len, 4096u);
  pageAlignRange(0x10001, 4096, 4096, &start, &len);
  EXPECT_EQ(start, 0x10000u);
  EXPECT_EQ(len, 8192u);
  pageAlignRange(0x12345, 0, 65536, &start, &len);
  EXPECT_EQ(start, 0x10000u);
  EXPECT_EQ(len, 65536u);
}

// Without a CUDA driver the registrar says why; with one, host memory is not device memory.
TEST(DeviceRegistration, CudaDriverRegistrarWithoutAGpu) {
  std::string why;
  DeviceMemoryRegistrar* r = cudaDriverRegistrar(&why);
  if (!r) {
    EXPECT_NE(why.find("libcuda.so.1"), std::string::npos) << why;
    return;
  }
  int onStack = 0;
  std::vector<char> onHeap(1 << 16);
  uintptr_t base = 0;
  size_t bytes = 0;
  EXPECT_FALSE(r->deviceAllocation(&onStack, &base, &bytes));
  EXPECT_FALSE(r->deviceAllocation(onHeap.data(), &base, &bytes));
}

}  // namespace
}  // namespace ridge
