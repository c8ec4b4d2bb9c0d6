// The device-side verbs subset (transports/gdr/gdr_device.h), host build, in one process: slot
// checks on hand-made slots, then a loopback stream through one software NIC with a single
// staging slot, so that every slot waits for the credit of the one before.
#include "transports/gdr/gdr_device.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "time_scale.h"
#include "transports/softnic/softnic.h"
#include "transports/verbs/verbs.h"

namespace ridge::gdr {
namespace {

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A slot as the receiver would find it after the NIC landed `bytes` of payload.
std::vector<char> landedSlot(uint64_t seq, uint32_t bytes, uint32_t capacity) {
  std::vector<char> s(slotStride(capacity), 0);
  SlotHeader h{};
  h.seq = seq;
  h.bytes = bytes;
  h.magic = kSlotMagic;
  std::memcpy(s.data(), &h, sizeof h);
  SlotTrailer t{seq};
  std::memcpy(s.data() + kSlotHeaderBytes + paddedPayload(bytes), &t, sizeof t);
  return s;
}

TEST(GdrDevice, LandedSlotChecksCatchLossAndOverwrite) {
  const uint32_t cap = 256;
  std::vector<char> s = landedSlot(7, 100, cap);
  EXPECT_EQ(checkLanded(s.data(), cap, 7, 7, wireBytes(100)), kLandedOk);
  EXPECT_EQ(checkLanded(s.data(), cap, 8, 7, wireBytes(100)), kLandedWrongImmediate) << "a slot went missing";
  EXPECT_EQ(checkLanded(s.data(), cap, 7, 7, wireBytes(200)), kLandedBadSize);
  std::vector<char> torn = s;
  SlotTrailer newer{7 + 4};
  std::memcpy(torn.data() + kSlotHeaderBytes + paddedPayload(100), &newer, sizeof newer);
  EXPECT_EQ(checkLanded(torn.data(), cap, 7, 7, wireBytes(100)), kLandedTornTrailer);
  std::vector<char> header = landedSlot(11, 100, cap);
  EXPECT_EQ(checkLanded(header.data(), cap, 7, 7, wireBytes(100)), kLandedTornHeader);
}

// Credits come back as CQEs, so sealing asks for one every k-th slot and for the last slot of
// a message (a producer that stops there must still learn that it completed).
TEST(GdrDevice, SealingAsksForACompletionEveryKthSlotAndTheLast) {
  const uint32_t cap = 64;
  std::vector<char> staging(4 * slotStride(cap), 0);
  SendChannel ch{};
  ch.staging = staging.data();
  ch.slotCount = 4;
  ch.slotStrideBytes = slotStride(cap);
  ch.payloadCapacity = cap;
  ch.remoteSlotCount = 4;
  ch.signalEvery = 2;
  SendState st{};
  Counters ctr{};
  std::vector<uint32_t> signaled;
  for (int i = 0; i < 7; ++i) signaled.push_back(sealSlot(ch, &st, 8, i == 4, &ctr).signaled);
  EXPECT_EQ(signaled, (std::vector<uint32_t>{0, 1, 0, 1, 1, 1, 0}));
  EXPECT_EQ(ctr.slotsWritten, 7u);
  // Header and trailer carry the sequence number (stores only: the slot is remote memory).
  EXPECT_EQ(reinterpret_cast<const SlotHeader*>(stagingSlot(ch, 6))->seq, 7u);
}

// One NIC, two QPs connected to each other: the producer streams 96 slots through one staging
// slot in NIC memory; the consumer checks each slot and returns credits with RDMA writes.
TEST(GdrDevice, LoopbackStreamThroughOneStagingSlot) {
  softnic::Options o;
  o.stagingBytes = 256 << 10;
  o.mtu = 4096;
  std::unique_ptr<verbs::Device> dev;
  ASSERT_TRUE(softnic::openDevice(o, &dev).isOk());
  std::unique_ptr<verbs::ProtectionDomain> pd;
  ASSERT_TRUE(dev->allocPd(&pd).isOk());
  const uint32_t cap = 4096 - 128;
  const uint32_t stride = slotStride(cap);
  const uint32_t landing = 4;
  std::unique_ptr<verbs::CompletionQueue> dataCq, landCq, creditCq;
  ASSERT_TRUE(pd->createCq(16, &dataCq).isOk());
  ASSERT_TRUE(pd->createCq(16, &landCq).isOk());
  ASSERT_TRUE(pd->createCq(128, &creditCq).isOk());
  std::unique_ptr<verbs::QueuePair> dataQp, landQp;
  verbs::QpCaps caps;
  caps.maxSendWr = 1;
  caps.maxRecvWr = 1;
  ASSERT_TRUE(pd->createQp(dataCq.get(), dataCq.get(), caps, &dataQp).isOk());
  caps.maxSendWr = 64;
  caps.maxRecvWr = landing;
  ASSERT_TRUE(pd->createQp(creditCq.get(), landCq.get(), caps, &landQp).isOk());

  std::unique_ptr<verbs::DeviceMemory> dm;
  ASSERT_TRUE(pd->allocDeviceMemory(stride, verbs::kAccessLocalWrite, &dm).isOk());
  ASSERT_NE(dm->mapped(), nullptr);
  std::memset(dm->mapped(), 0, stride);
  std::vector<char> landingRing(static_cast<size_t>(landing) * stride);
  alignas(64) CreditRecord creditIn{}, creditOut{};
  std::unique_ptr<verbs::MemoryRegion> landMr, creditInMr, creditOutMr;
  const uint32_t rw = verbs::kAccessLocalWrite | verbs::kAccessRemoteWrite;
  ASSERT_TRUE(pd->registerMemory(landingRing.data(), landingRing.size(), rw, &landMr).isOk());
  ASSERT_TRUE(pd->registerMemory(&creditIn, sizeof creditIn, rw, &creditInMr).isOk());
  ASSERT_TRUE(
      pd->registerMemory(&creditOut, sizeof creditOut, verbs::kAccessLocalWrite, &creditOutMr).isOk());

  verbs::QpAddress a, b;
  ASSERT_TRUE(dataQp->modify(verbs::QpState::Init).isOk());
  ASSERT_TRUE(landQp->modify(verbs::QpState::Init).isOk());
  for (uint32_t i = 0; i < landing; ++i) ASSERT_TRUE(landQp->postRecv(verbs::RecvWqe{i, 0, 0, 0, 0}).isOk());
  ASSERT_TRUE(dataQp->localAddress(&a).isOk());
  ASSERT_TRUE(landQp->localAddress(&b).isOk());
  ASSERT_TRUE(dataQp->modify(verbs::QpState::Rtr, &b).isOk());
  ASSERT_TRUE(landQp->modify(verbs::QpState::Rtr, &a).isOk());
  ASSERT_TRUE(dataQp->modify(verbs::QpState::Rts).isOk());
  ASSERT_TRUE(landQp->modify(verbs::QpState::Rts).isOk());

  SendChannel ch{};
  ch.sq = *dataQp->mlx5Sq();
  ch.cq = *dataCq->mlx5Cq();
  ch.signalEvery = 1;
  ch.staging = static_cast<char*>(dm->mapped());
  ch.stagingWqeAddr = 0;
  ch.stagingLkey = dm->region()->lkey();
  ch.slotCount = 1;
  ch.slotStrideBytes = stride;
  ch.payloadCapacity = cap;
  ch.remoteAddr = reinterpret_cast<uint64_t>(landingRing.data());
  ch.remoteRkey = landMr->rkey();
  ch.remoteSlotCount = landing;
  ch.remoteConsumed = &creditIn;
  SendState st{};
  Counters tx{}, rx{};

  constexpr int kSlots = 96;
  std::vector<char> payload(cap);
  uint64_t received = 0;
  uint32_t landCi = 0, creditPi = 0, creditCi = 0, creditRetired = 0, bfOffset = 0;
  int sent = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (received < kSlots && secondsSince(t0) < ridgetest::scaledSeconds(20.0)) {
    if (sent < kSlots) {
      if (char* slot = tryAcquireSlot(ch, &st, &tx)) {
        const uint32_t bytes = 1 + static_cast<uint32_t>(sent * 37) % cap;
        for (uint32_t i = 0; i < bytes; ++i) payload[i] = static_cast<char>(sent * 31 + i);
        writeStaging(slot, payload.data(), bytes, 0, 1);
        postSlot(ch, &st, bytes, true, &tx);
        flushDoorbell(ch, &st, &tx);
        softnic::notifyDoorbell(dev.get());
        ++sent;
      }
    }
    mlx5::CqeFields c;
    if (mlx5::pollCq(*landCq->mlx5Cq(), &landCi, &c)) {
      ASSERT_EQ(c.opcode, mlx5::kCqeRespWrImm) << "syndrome " << int(c.syndrome);
      const char* slot = landingRing.data() + (received % landing) * stride;
      ASSERT_EQ(checkLanded(slot, cap, received + 1, c.imm, c.byteCnt), static_cast<uint32_t>(kLandedOk));
      const uint32_t bytes = reinterpret_cast<const SlotHeader*>(slot)->bytes;
      ASSERT_EQ(bytes, 1 + static_cast<uint32_t>(received * 37) % cap);
      for (uint32_t i = 0; i < bytes; ++i)
        ASSERT_EQ(slot[kSlotHeaderBytes + i], static_cast<char>(received * 31 + i)) << "slot " << received;
      ASSERT_TRUE(landQp->postRecv(verbs::RecvWqe{c.wqeCounter, 0, 0, 0, 0}).isOk());
      ++received;
      creditOut.count = received;
      creditOut.check = received ^ kCreditCheck;
      mlx5::CqeFields cc;  // every credit write asks for its CQE
      while (mlx5::pollCq(*creditCq->mlx5Cq(), &creditCi, &cc)) {
        ASSERT_EQ(cc.opcode, mlx5::kCqeReq) << "syndrome " << int(cc.syndrome);
        creditRetired = cc.wqeCounter + 1u;
      }
      ASSERT_TRUE(postInlineWrite(*landQp->mlx5Sq(), &creditPi, creditRetired, &bfOffset, &creditOut,
                                  sizeof creditOut, reinterpret_cast<uint64_t>(&creditIn), creditInMr->rkey(),
                                  &rx));
      softnic::notifyDoorbell(dev.get());
    }
  }
  EXPECT_EQ(received, static_cast<uint64_t>(kSlots)) << "stream did not finish within 20 s";
  EXPECT_EQ(tx.slotsWritten, static_cast<uint64_t>(kSlots));
  EXPECT_EQ(tx.stagedLost, 0u);
  EXPECT_GT(tx.creditStalls, 0u) << "one staging slot must make the producer wait for credits";
  EXPECT_EQ(tx.doorbells, static_cast<uint64_t>(kSlots));
  EXPECT_EQ(rx.doorbells, static_cast<uint64_t>(kSlots));
  EXPECT_EQ(tx.creditsReturned, static_cast<uint64_t>(kSlots - 1))
      << "one CQE per slot but the last's in flight";
  // The producer read only local memory (its CQ, the credit record): no PCIe read per slot.
  EXPECT_EQ(tx.remoteReads, 0u);
  // The accounting itself: a load from staging counts as a remote read.
  Counters probe{};
  producerLoad64(ch, &probe, reinterpret_cast<const uint64_t*>(ch.staging));
  EXPECT_EQ(probe.remoteReads, 1u);
}

}  // namespace
}  // namespace ridge::gdr
