// Golden tests of kernels/gdr/mlx5_wire.h against rdma-core's infiniband/mlx5dv.h: every
// segment and CQE Ridge writes or parses is compared byte for byte with what the mlx5dv
// structures and helpers (mlx5dv_set_ctrl_seg, mlx5dv_set_data_seg, ...) produce, and every
// constant with its MLX5_* value. Without the header the tests skip.
#include "kernels/gdr/mlx5_wire.h"

#include <endian.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#if __has_include(<infiniband/mlx5dv.h>)
#include <infiniband/mlx5dv.h>
#define RIDGE_TEST_HAVE_MLX5DV 1
#endif

namespace ridge {
namespace mlx5 {
namespace {

#ifdef RIDGE_TEST_HAVE_MLX5DV

TEST(Mlx5Wire, ConstantsEqualMlx5dv) {
  EXPECT_EQ(kOpNop, MLX5_OPCODE_NOP);
  EXPECT_EQ(kOpRdmaWrite, MLX5_OPCODE_RDMA_WRITE);
  EXPECT_EQ(kOpRdmaWriteImm, MLX5_OPCODE_RDMA_WRITE_IMM);
  EXPECT_EQ(kOpSend, MLX5_OPCODE_SEND);
  EXPECT_EQ(kOpSendImm, MLX5_OPCODE_SEND_IMM);
  EXPECT_EQ(kOpRdmaRead, MLX5_OPCODE_RDMA_READ);
  EXPECT_EQ(kCtrlCqUpdate, MLX5_WQE_CTRL_CQ_UPDATE);
  EXPECT_EQ(kCtrlSolicited, MLX5_WQE_CTRL_SOLICITED);
  EXPECT_EQ(kCtrlFence, MLX5_WQE_CTRL_FENCE);
  EXPECT_EQ(kWqeBbBytes, static_cast<uint32_t>(MLX5_SEND_WQE_BB));
  EXPECT_EQ(kWqeBbShift, static_cast<uint32_t>(MLX5_SEND_WQE_SHIFT));
  EXPECT_EQ(kInlineSeg, static_cast<uint32_t>(MLX5_INLINE_SEG));
  EXPECT_EQ(kCqeReq, MLX5_CQE_REQ);
  EXPECT_EQ(kCqeRespWrImm, MLX5_CQE_RESP_WR_IMM);
  EXPECT_EQ(kCqeRespSend, MLX5_CQE_RESP_SEND);
  EXPECT_EQ(kCqeRespSendImm, MLX5_CQE_RESP_SEND_IMM);
  EXPECT_EQ(kCqeReqErr, MLX5_CQE_REQ_ERR);
  EXPECT_EQ(kCqeRespErr, MLX5_CQE_RESP_ERR);
  EXPECT_EQ(kCqeInvalid, MLX5_CQE_INVALID);
  EXPECT_EQ(kSendDbrWord, static_cast<uint32_t>(MLX5_SND_DBR));
  EXPECT_EQ(kRecvDbrWord, static_cast<uint32_t>(MLX5_RCV_DBR));
  EXPECT_EQ(kSyndLocalLength, MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR);
  EXPECT_EQ(kSyndLocalQpOp, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
  EXPECT_EQ(kSyndLocalProt, MLX5_CQE_SYNDROME_LOCAL_PROT_ERR);
  EXPECT_EQ(kSyndWrFlush, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
  EXPECT_EQ(kSyndBadResp, MLX5_CQE_SYNDROME_BAD_RESP_ERR);
  EXPECT_EQ(kSyndRemoteInvalReq, MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR);
  EXPECT_EQ(kSyndRemoteAccess, MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
  EXPECT_EQ(kSyndRemoteOp, MLX5_CQE_SYNDROME_REMOTE_OP_ERR);
  EXPECT_EQ(kSyndTransportRetryExc, MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR);
  EXPECT_EQ(kSyndRnrRetryExc, MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR);
}

TEST(Mlx5Wire, LayoutsEqualMlx5dv) {
  EXPECT_EQ(sizeof(CtrlSeg), sizeof(mlx5_wqe_ctrl_seg));
  EXPECT_EQ(offsetof(CtrlSeg, opmodIdxOpcode), offsetof(mlx5_wqe_ctrl_seg, opmod_idx_opcode));
  EXPECT_EQ(offsetof(CtrlSeg, qpnDs), offsetof(mlx5_wqe_ctrl_seg, qpn_ds));
  EXPECT_EQ(offsetof(CtrlSeg, signature), offsetof(mlx5_wqe_ctrl_seg, signature));
  EXPECT_EQ(offsetof(CtrlSeg, fmCeSe), offsetof(mlx5_wqe_ctrl_seg, fm_ce_se));
  EXPECT_EQ(offsetof(CtrlSeg, imm), offsetof(mlx5_wqe_ctrl_seg, imm));
  EXPECT_EQ(sizeof(RaddrSeg), sizeof(mlx5_wqe_raddr_seg));
  EXPECT_EQ(offsetof(RaddrSeg, rkey), offsetof(mlx5_wqe_raddr_seg, rkey));
  EXPECT_EQ(sizeof(DataSeg), sizeof(mlx5_wqe_data_seg));
  EXPECT_EQ(offsetof(DataSeg, lkey), offsetof(mlx5_wqe_data_seg, lkey));
  EXPECT_EQ(offsetof(DataSeg, addr), offsetof(mlx5_wqe_data_seg, addr));
  EXPECT_EQ(sizeof(InlineSeg), sizeof(mlx5_wqe_inl_data_seg));
  EXPECT_EQ(sizeof(Cqe64), sizeof(mlx5_cqe64));
  EXPECT_EQ(offsetof(Cqe64, srqnUidx), offsetof(mlx5_cqe64, srqn_uidx));
  EXPECT_EQ(offsetof(Cqe64, immInvalPkey), offsetof(mlx5_cqe64, imm_inval_pkey));
  EXPECT_EQ(offsetof(Cqe64, byteCnt), offsetof(mlx5_cqe64, byte_cnt));
  EXPECT_EQ(offsetof(Cqe64, sopDropQpn), offsetof(mlx5_cqe64, sop_drop_qpn));
  EXPECT_EQ(offsetof(Cqe64, wqeCounter), offsetof(mlx5_cqe64, wqe_counter));
  EXPECT_EQ(offsetof(Cqe64, opOwn), offsetof(mlx5_cqe64, op_own));
  EXPECT_EQ(offsetof(Cqe64, syndrome), offsetof(mlx5_err_cqe, syndrome));
  EXPECT_EQ(offsetof(Cqe64, vendorErrSynd), offsetof(mlx5_err_cqe, vendor_err_synd));
  EXPECT_EQ(offsetof(Cqe64, sopDropQpn), offsetof(mlx5_err_cqe, s_wqe_opcode_qpn));
  EXPECT_EQ(offsetof(Cqe64, wqeCounter), offsetof(mlx5_err_cqe, wqe_counter));
}

// The reference of a whole WQE built with mlx5dv's helpers, block-padded with zeros.
std::vector<uint8_t> referenceWqe(uint8_t opcode, uint16_t idx, uint32_t qpn, uint8_t fm, uint32_t imm,
                                  uint64_t raddr, uint32_t rkey, uint64_t laddr, uint32_t lkey,
                                  uint32_t bytes, const void* inlineData) {
  std::vector<uint8_t> w(kMaxWqeBbs * kWqeBbBytes, 0);
  size_t at = sizeof(mlx5_wqe_ctrl_seg);
  const bool rdma = opcode == MLX5_OPCODE_RDMA_WRITE || opcode == MLX5_OPCODE_RDMA_WRITE_IMM ||
                    opcode == MLX5_OPCODE_RDMA_READ;
  if (rdma) {
    auto* r = reinterpret_cast<mlx5_wqe_raddr_seg*>(w.data() + at);
    r->raddr = htobe64(raddr);
    r->rkey = htobe32(rkey);
    r->reserved = 0;
    at += sizeof(*r);
  }
  if (opcode != MLX5_OPCODE_NOP) {
    if (inlineData) {
      auto* s = reinterpret_cast<mlx5_wqe_inl_data_seg*>(w.data() + at);
      s->byte_count = htobe32(bytes | MLX5_INLINE_SEG);
      std::memcpy(w.data() + at + sizeof(*s), inlineData, bytes);
      at += (sizeof(*s) + bytes + 15) / 16 * 16;
    } else {
      mlx5dv_set_data_seg(reinterpret_cast<mlx5_wqe_data_seg*>(w.data() + at), bytes, lkey, laddr);
      at += sizeof(mlx5_wqe_data_seg);
    }
  }
  // ibv_send_wr.imm_data is big-endian already; mlx5dv_set_ctrl_seg stores it as is.
  mlx5dv_set_ctrl_seg(reinterpret_cast<mlx5_wqe_ctrl_seg*>(w.data()), idx, opcode, 0, qpn, fm,
                      static_cast<uint8_t>(at / 16), 0, htobe32(imm));
  w.resize((at + 63) / 64 * 64);
  return w;
}

TEST(Mlx5Wire, EveryOpcodeMatchesMlx5dvByteForByte) {
  struct Case {
    uint8_t opcode;
    uint8_t fm;
  };
  const Case cases[] = {{MLX5_OPCODE_RDMA_WRITE, 0},
                        {MLX5_OPCODE_RDMA_WRITE, MLX5_WQE_CTRL_CQ_UPDATE},
                        {MLX5_OPCODE_RDMA_WRITE_IMM, MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_SOLICITED},
                        {MLX5_OPCODE_SEND, MLX5_WQE_CTRL_CQ_UPDATE},
                        {MLX5_OPCODE_SEND_IMM, 0},
                        {MLX5_OPCODE_RDMA_READ, MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_FENCE}};
  const uint16_t indices[] = {0, 1, 0x00ff, 0x1234, 0xffff};
  const uint32_t qpns[] = {1, 0x2a5, 0xfffffe};
  for (const Case& c : cases)
    for (uint16_t idx : indices)
      for (uint32_t qpn : qpns) {
        SCOPED_TRACE(testing::Message() << "opcode " << int(c.opcode) << " idx " << idx << " qpn " << qpn);
        const uint32_t imm = 0x01020304u ^ idx;
        const uint64_t raddr = 0x7f00123456789abcull + idx, laddr = 0x0000555500001040ull;
        const uint32_t rkey = 0xabcdef01u, lkey = 0x10203u, bytes = 131136;
        WqeBuf w;
        const uint32_t ds = buildWqe(&w, c.opcode, idx, qpn, c.fm, imm, raddr, rkey, laddr, lkey, bytes);
        const std::vector<uint8_t> ref =
            referenceWqe(c.opcode, idx, qpn, c.fm, imm, raddr, rkey, laddr, lkey, bytes, nullptr);
        ASSERT_EQ(wqeBbs(ds) * kWqeBbBytes, ref.size());
        EXPECT_EQ(0, std::memcmp(w.bytes, ref.data(), ref.size()));
        WqeFields f{};
        ASSERT_TRUE(decodeWqe(w.bytes, &f));
        EXPECT_EQ(f.opcode, c.opcode);
        EXPECT_EQ(f.wqeIndex, idx);
        EXPECT_EQ(f.qpn, qpn);
        EXPECT_EQ(f.fmCeSe, c.fm);
        EXPECT_EQ(f.imm, imm);
        EXPECT_EQ(f.bytes, bytes);
        EXPECT_EQ(f.lkey, lkey);
        EXPECT_EQ(f.laddr, laddr);
        if (opcodeHasRaddr(c.opcode)) {
          EXPECT_EQ(f.raddr, raddr);
          EXPECT_EQ(f.rkey, rkey);
        }
      }
}

TEST(Mlx5Wire, InlineWritesMatchMlx5dvForEveryLength) {
  uint8_t data[kMaxInlineBytes];
  for (uint32_t i = 0; i < sizeof data; ++i) data[i] = static_cast<uint8_t>(i * 7 + 3);
  for (uint8_t op : {uint8_t{MLX5_OPCODE_RDMA_WRITE}, uint8_t{MLX5_OPCODE_SEND}})
    for (uint32_t bytes = 0; bytes <= kMaxInlineBytes; ++bytes) {
      SCOPED_TRACE(testing::Message() << "opcode " << int(op) << " inline bytes " << bytes);
      WqeBuf w;
      std::memset(w.bytes, 0xee, sizeof w.bytes);  // poison: padding must be written as zeros
      const uint32_t ds =
          buildInlineWqe(&w, op, 77, 0x99, MLX5_WQE_CTRL_CQ_UPDATE, 0, 0x1000, 5, data, bytes);
      const std::vector<uint8_t> ref =
          referenceWqe(op, 77, 0x99, MLX5_WQE_CTRL_CQ_UPDATE, 0, 0x1000, 5, 0, 0, bytes, data);
      ASSERT_EQ(wqeBbs(ds) * kWqeBbBytes, ref.size());
      ASSERT_EQ(0, std::memcmp(w.bytes, ref.data(), ref.size()));
      WqeFields f{};
      ASSERT_TRUE(decodeWqe(w.bytes, &f));
      EXPECT_TRUE(f.isInline);
      EXPECT_EQ(f.bytes, bytes);
      EXPECT_EQ(0, std::memcmp(w.bytes + f.inlineOffset, data, bytes));
    }
}

TEST(Mlx5Wire, NopMatchesMlx5dv) {
  WqeBuf w;
  ASSERT_EQ(buildNop(&w, 0x4321, 0x77, MLX5_WQE_CTRL_CQ_UPDATE), 1u);
  const std::vector<uint8_t> ref =
      referenceWqe(MLX5_OPCODE_NOP, 0x4321, 0x77, MLX5_WQE_CTRL_CQ_UPDATE, 0, 0, 0, 0, 0, 0, nullptr);
  EXPECT_EQ(0, std::memcmp(w.bytes, ref.data(), 64));
  WqeFields f{};
  EXPECT_TRUE(decodeWqe(w.bytes, &f));
}

TEST(Mlx5Wire, MalformedWqesAreRejected) {
  WqeBuf w;
  buildWqe(&w, kOpRdmaWrite, 1, 2, 0, 0, 0, 0, 0, 0, 8);
  WqeFields f{};
  ASSERT_TRUE(decodeWqe(w.bytes, &f));
  WqeBuf bad = w;
  bad.bytes[3] = 0x0c;  // opcode outside the subset
  EXPECT_FALSE(decodeWqe(bad.bytes, &f));
  bad = w;
  bad.bytes[7] = 4;  // ds says two gather entries
  EXPECT_FALSE(decodeWqe(bad.bytes, &f));
  bad = w;
  bad.bytes[7] = 2;  // ds too short for the remote address segment and a data segment
  EXPECT_FALSE(decodeWqe(bad.bytes, &f));
  bad = w;
  bad.bytes[0] = 1;  // opmod
  EXPECT_FALSE(decodeWqe(bad.bytes, &f));
}

TEST(Mlx5Wire, DoorbellRecordAndUarDoorbellBytes) {
  uint32_t dbrec[2] = {0xdeadbeef, 0xdeadbeef};
  uint64_t uar = 0;
  alignas(64) uint8_t ring[4 * 64];
  SqView sq{ring, &dbrec[kSendDbrWord], &uar, nullptr, 0, 2, 0x1234, 0};
  WqeBuf w;
  buildWqe(&w, kOpRdmaWriteImm, static_cast<uint16_t>(0x12345), sq.qpn, kCtrlCqUpdate, 9, 1, 2, 3, 4, 5);
  copyToRing(sq, 0x12345, w, 1);
  EXPECT_EQ(0, std::memcmp(ring + (0x12345 & 3) * 64, w.bytes, 64));
  publishDbr(sq, 0x12346);
  // The record is BE32(pi & 0xffff), exactly what libmlx5 stores at dbrec[MLX5_SND_DBR].
  EXPECT_EQ(dbrec[MLX5_SND_DBR], htobe32(0x12346 & 0xffff));
  EXPECT_EQ(dbrec[MLX5_RCV_DBR], 0xdeadbeefu);
  ringDoorbell(sq, w);
  // The doorbell is the control segment's first 8 bytes: opmod_idx_opcode, then qpn_ds.
  mlx5_wqe_ctrl_seg ref;
  mlx5dv_set_ctrl_seg(&ref, 0x2345, MLX5_OPCODE_RDMA_WRITE_IMM, 0, 0x1234, MLX5_WQE_CTRL_CQ_UPDATE, 3, 0,
                      htobe32(9));
  EXPECT_EQ(0, std::memcmp(&uar, &ref, 8));
}

TEST(Mlx5Wire, BlueFlameWritesTheWholeWqeIntoAlternatingHalves) {
  alignas(64) uint8_t bf[2 * 256] = {};
  alignas(64) uint8_t ring[8 * 64];
  uint32_t dbrec[2] = {};
  uint64_t uar = 0;
  SqView sq{ring, &dbrec[1], &uar, bf, 256, 3, 7, 0};
  uint32_t offset = 0;
  uint8_t data[16] = {1, 2, 3};
  WqeBuf w;
  const uint32_t ds = buildInlineWqe(&w, kOpRdmaWrite, 0, 7, kCtrlCqUpdate, 0, 0x100, 1, data, sizeof data);
  ASSERT_TRUE(ringBlueFlame(sq, w, wqeBbs(ds), &offset));
  EXPECT_EQ(offset, 256u);
  EXPECT_EQ(0, std::memcmp(bf, w.bytes, 64));
  ASSERT_TRUE(ringBlueFlame(sq, w, wqeBbs(ds), &offset));
  EXPECT_EQ(offset, 0u);
  EXPECT_EQ(0, std::memcmp(bf + 256, w.bytes, 64));
  SqView noBf = sq;
  noBf.blueFlame = nullptr;
  EXPECT_FALSE(ringBlueFlame(noBf, w, 1, &offset));
  SqView smallBf = sq;
  smallBf.bfBytes = 32;
  EXPECT_FALSE(ringBlueFlame(smallBf, w, 1, &offset));
}

// Requester, responder and error CQEs written by encodeCqe equal the same CQE assembled from
// mlx5dv.h's structures, and decode to their fields.
TEST(Mlx5Wire, CqeEncodingMatchesMlx5dvAndDecodes) {
  {
    Cqe64 c;
    encodeCqe(&c, kCqeReq, kOpRdmaWriteImm, 0xfedc, 0x123456, 0, 0, 0);
    c.opOwn = makeOpOwn(kCqeReq, 8, 3);  // second pass of an 8-entry CQ: owner 1
    mlx5_cqe64 ref;
    std::memset(&ref, 0, sizeof ref);
    ref.sop_drop_qpn = htobe32((uint32_t{MLX5_OPCODE_RDMA_WRITE_IMM} << 24) | 0x123456);
    ref.wqe_counter = htobe16(0xfedc);
    ref.op_own = (MLX5_CQE_REQ << 4) | 1;
    EXPECT_EQ(0, std::memcmp(&c, &ref, 64));
    EXPECT_EQ(mlx5dv_get_cqe_opcode(&ref), kCqeReq);
    EXPECT_EQ(mlx5dv_get_cqe_owner(&ref), 1);
    CqeFields f{};
    decodeCqe(&c, &f);
    EXPECT_EQ(f.opcode, kCqeReq);
    EXPECT_EQ(f.wqeOpcode, kOpRdmaWriteImm);
    EXPECT_EQ(f.wqeCounter, 0xfedc);
    EXPECT_EQ(f.qpn, 0x123456u);
  }
  {
    Cqe64 c;
    encodeCqe(&c, kCqeRespWrImm, 0, 17, 0x42, 131144, 0xa1b2c3d4, 0);
    c.opOwn = makeOpOwn(kCqeRespWrImm, 3, 3);
    mlx5_cqe64 ref;
    std::memset(&ref, 0, sizeof ref);
    ref.imm_inval_pkey = htobe32(0xa1b2c3d4);  // what libmlx5 hands out as wc.imm_data
    ref.byte_cnt = htobe32(131144);
    ref.sop_drop_qpn = htobe32(0x42);
    ref.wqe_counter = htobe16(17);
    ref.op_own = MLX5_CQE_RESP_WR_IMM << 4;
    EXPECT_EQ(0, std::memcmp(&c, &ref, 64));
    CqeFields f{};
    decodeCqe(&c, &f);
    EXPECT_EQ(f.opcode, kCqeRespWrImm);
    EXPECT_EQ(f.imm, 0xa1b2c3d4u);
    EXPECT_EQ(f.byteCnt, 131144u);
    EXPECT_EQ(f.wqeCounter, 17);
  }
  {
    Cqe64 c;
    encodeCqe(&c, kCqeReqErr, kOpRdmaWrite, 5, 0x77, 0, 0, kSyndRemoteAccess);
    c.opOwn = makeOpOwn(kCqeReqErr, 0, 3);
    mlx5_err_cqe ref;
    std::memset(&ref, 0, sizeof ref);
    ref.syndrome = MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR;
    ref.s_wqe_opcode_qpn = htobe32((uint32_t{MLX5_OPCODE_RDMA_WRITE} << 24) | 0x77);
    ref.wqe_counter = htobe16(5);
    ref.op_own = MLX5_CQE_REQ_ERR << 4;
    EXPECT_EQ(0, std::memcmp(&c, &ref, 64));
    CqeFields f{};
    decodeCqe(&c, &f);
    EXPECT_EQ(f.opcode, kCqeReqErr);
    EXPECT_EQ(f.syndrome, kSyndRemoteAccess);
    EXPECT_EQ(f.wqeOpcode, kOpRdmaWrite);
    EXPECT_EQ(f.wqeCounter, 5);
  }
}

#endif  // RIDGE_TEST_HAVE_MLX5DV

// A 4-entry CQ written by a hand-rolled "NIC" across three passes: the consumer sees each CQE
// exactly once, never a stale one from the pass before (owner bit), never an initial entry
// (opcode INVALID), and publishes BE32(ci) in the record.
TEST(Mlx5Wire, CqOwnerBitWrapsAcrossPasses) {
  constexpr uint32_t kLog2 = 2, kSize = 1u << kLog2;
  alignas(64) Cqe64 cqes[kSize];
  for (Cqe64& c : cqes) {
    std::memset(&c, 0, sizeof c);
    c.opOwn = kCqeInitOpOwn;
  }
  uint32_t dbrec = 0xffffffff;
  CqView cq{cqes, &dbrec, kLog2, 1};
  uint32_t ci = 0, pi = 0;
  CqeFields f{};
  EXPECT_FALSE(pollCq(cq, &ci, &f)) << "an initial entry is not a completion";
  for (int round = 0; round < 3 * static_cast<int>(kSize); ++round) {
    // The NIC writes CQE number pi.
    Cqe64* slot = &cqes[pi & (kSize - 1)];
    encodeCqe(slot, kCqeReq, kOpRdmaWrite, static_cast<uint16_t>(pi * 3), 9, 0, 0, 0);
    slot->opOwn = makeOpOwn(kCqeReq, pi, kLog2);
    ++pi;
    ASSERT_TRUE(pollCq(cq, &ci, &f)) << "round " << round;
    EXPECT_EQ(f.wqeCounter, static_cast<uint16_t>((pi - 1) * 3));
    EXPECT_EQ(dbrec, be32(ci));
    EXPECT_FALSE(pollCq(cq, &ci, &f)) << "round " << round << ": the entry after is stale";
  }
  EXPECT_EQ(ci, 3 * kSize);
  // An entry left from the previous pass (owner bit of that pass) is not new.
  EXPECT_FALSE(cqeIsNew(makeOpOwn(kCqeReq, ci - kSize, kLog2), ci, kLog2));
  EXPECT_TRUE(cqeIsNew(makeOpOwn(kCqeReq, ci, kLog2), ci, kLog2));
  EXPECT_FALSE(cqeIsNew(kCqeInitOpOwn | 1, kSize, kLog2)) << "INVALID is never new, whatever its owner bit";
}

TEST(Mlx5Wire, CompletionRequestedEveryKthWqe) {
  int signaled = 0;
  for (uint64_t n = 0; n < 12; ++n) signaled += signalEvery(n, 4) ? 1 : 0;
  EXPECT_EQ(signaled, 3);
  EXPECT_TRUE(signalEvery(3, 4));
  EXPECT_FALSE(signalEvery(0, 4));
  for (uint64_t n = 0; n < 5; ++n) EXPECT_TRUE(signalEvery(n, 1));
}

}  // namespace
}  // namespace mlx5
}  // namespace ridge
