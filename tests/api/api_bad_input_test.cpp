// Bad input for every call of the public API. Each bad call must return its specific code
// (ridgeInvalidArgument for a bad value, ridgeInvalidUsage for a wrong state), leave text in
// ridgeGetLastError that names the offending argument, not kill the process, and leave the
// communicator working: a valid allreduce runs after every bad call, on a 1-rank
// communicator in this process and on a 2-rank communicator of two forked processes.
// Also: error strings, finalized communicators, group misuse and non-blocking init.
#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdint>
#include <functional>
#include <set>
#include <thread>

#include "rank_launcher.h"
#include "time_scale.h"

namespace ridgetest {
namespace {

constexpr size_t kBufElems = 4096;

struct Ctx {
  ridgeComm_t comm;
  int n;
  int me;
  void* sb;
  void* rb;
  const ridgeUniqueId* freshId;  // a valid id nobody else uses (init argument checks)
};

struct BadCall {
  std::string name;
  ridgeResult_t expect;
  std::vector<std::string> mention;  // the last error must contain one of these (any case)
  std::function<ridgeResult_t(const Ctx&)> call;
  int minRanks = 1;
  bool usesComm = true;  // false: error raised without a communicator (check GetLastError(NULL) only)
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

const ridgeDataType_t kF32 = ridgeFloat32;
const ridgeRedOp_t kSum = ridgeSum;

std::vector<BadCall> buildTable() {
  std::vector<BadCall> t;
  auto add = [&](std::string name, ridgeResult_t e, std::vector<std::string> m,
                 std::function<ridgeResult_t(const Ctx&)> f, int minRanks = 1, bool usesComm = true) {
    t.push_back(BadCall{std::move(name), e, std::move(m), std::move(f), minRanks, usesComm});
  };
  const ridgeResult_t IA = ridgeInvalidArgument;
  const std::vector<std::string> kComm = {"comm"};

  // ---- Null communicator --------------------------------------------------------------
  add(
      "NullComm_AllReduce", IA, kComm,
      [](const Ctx& c) { return ridgeAllReduce(c.sb, c.rb, 8, kF32, kSum, nullptr, nullptr); }, 1, false);
  add(
      "NullComm_Broadcast", IA, kComm,
      [](const Ctx& c) { return ridgeBroadcast(c.sb, c.rb, 8, kF32, 0, nullptr, nullptr); }, 1, false);
  add(
      "NullComm_Reduce", IA, kComm,
      [](const Ctx& c) { return ridgeReduce(c.sb, c.rb, 8, kF32, kSum, 0, nullptr, nullptr); }, 1, false);
  add(
      "NullComm_AllGather", IA, kComm,
      [](const Ctx& c) { return ridgeAllGather(c.sb, c.rb, 8, kF32, nullptr, nullptr); }, 1, false);
  add(
      "NullComm_ReduceScatter", IA, kComm,
      [](const Ctx& c) { return ridgeReduceScatter(c.sb, c.rb, 8, kF32, kSum, nullptr, nullptr); }, 1, false);
  add(
      "NullComm_AlltoAll", IA, kComm,
      [](const Ctx& c) { return ridgeAlltoAll(c.sb, c.rb, 8, kF32, nullptr, nullptr); }, 1, false);
  add(
      "NullComm_Send", IA, kComm, [](const Ctx& c) { return ridgeSend(c.sb, 8, kF32, 0, nullptr, nullptr); },
      1, false);
  add(
      "NullComm_Recv", IA, kComm, [](const Ctx& c) { return ridgeRecv(c.rb, 8, kF32, 0, nullptr, nullptr); },
      1, false);
  add(
      "NullComm_CommCount", IA, kComm,
      [](const Ctx&) {
        int v;
        return ridgeCommCount(nullptr, &v);
      },
      1, false);
  add(
      "NullComm_CommUserRank", IA, kComm,
      [](const Ctx&) {
        int v;
        return ridgeCommUserRank(nullptr, &v);
      },
      1, false);
  add(
      "NullComm_CommCuDevice", IA, kComm,
      [](const Ctx&) {
        int v;
        return ridgeCommCuDevice(nullptr, &v);
      },
      1, false);
  add(
      "NullComm_CommGetAsyncError", IA, kComm,
      [](const Ctx&) {
        ridgeResult_t v;
        return ridgeCommGetAsyncError(nullptr, &v);
      },
      1, false);
  add(
      "NullComm_CommFinalize", IA, kComm, [](const Ctx&) { return ridgeCommFinalize(nullptr); }, 1, false);
  add(
      "NullComm_CommDestroy", IA, kComm, [](const Ctx&) { return ridgeCommDestroy(nullptr); }, 1, false);
  add(
      "NullComm_CommAbort", IA, kComm, [](const Ctx&) { return ridgeCommAbort(nullptr); }, 1, false);

  // ---- Null output pointers of init and queries ------------------------------------------
  add(
      "NullOut_GetVersion", IA, {"version"}, [](const Ctx&) { return ridgeGetVersion(nullptr); }, 1, false);
  add(
      "NullOut_GetUniqueId", IA, {"uniqueid", "id"}, [](const Ctx&) { return ridgeGetUniqueId(nullptr); }, 1,
      false);
  add(
      "NullOut_CommInitRank", IA, kComm,
      [](const Ctx& c) { return ridgeCommInitRank(nullptr, 1, *c.freshId, 0); }, 1, false);
  add(
      "NullOut_CommInitRankConfig", IA, kComm,
      [](const Ctx& c) {
        ridgeConfig_t cfg = RIDGE_CONFIG_INITIALIZER;
        return ridgeCommInitRankConfig(nullptr, 1, *c.freshId, 0, &cfg);
      },
      1, false);
  add(
      "NullOut_CommInitFromEnv", IA, kComm, [](const Ctx&) { return ridgeCommInitFromEnv(nullptr); }, 1,
      false);
  add("NullOut_CommCount", IA, {"count"}, [](const Ctx& c) { return ridgeCommCount(c.comm, nullptr); });
  add("NullOut_CommUserRank", IA, {"rank"}, [](const Ctx& c) { return ridgeCommUserRank(c.comm, nullptr); });
  add("NullOut_CommCuDevice", IA, {"device"},
      [](const Ctx& c) { return ridgeCommCuDevice(c.comm, nullptr); });
  add("NullOut_CommGetAsyncError", IA, {"asyncerror", "async"},
      [](const Ctx& c) { return ridgeCommGetAsyncError(c.comm, nullptr); });

  // ---- Null buffers with count > 0 ---------------------------------------------------------
  const std::vector<std::string> kSend = {"sendbuff"}, kRecv = {"recvbuff"};
  add("NullSend_AllReduce", IA, kSend,
      [](const Ctx& c) { return ridgeAllReduce(nullptr, c.rb, 8, kF32, kSum, c.comm, nullptr); });
  add("NullRecv_AllReduce", IA, kRecv,
      [](const Ctx& c) { return ridgeAllReduce(c.sb, nullptr, 8, kF32, kSum, c.comm, nullptr); });
  add("NullSendOnRoot_Broadcast", IA, kSend,
      [](const Ctx& c) { return ridgeBroadcast(nullptr, c.rb, 8, kF32, c.me, c.comm, nullptr); });
  add("NullRecv_Broadcast", IA, kRecv,
      [](const Ctx& c) { return ridgeBroadcast(c.sb, nullptr, 8, kF32, 0, c.comm, nullptr); });
  add("NullSend_Reduce", IA, kSend,
      [](const Ctx& c) { return ridgeReduce(nullptr, c.rb, 8, kF32, kSum, 0, c.comm, nullptr); });
  add("NullRecvOnRoot_Reduce", IA, kRecv,
      [](const Ctx& c) { return ridgeReduce(c.sb, nullptr, 8, kF32, kSum, c.me, c.comm, nullptr); });
  add("NullSend_AllGather", IA, kSend,
      [](const Ctx& c) { return ridgeAllGather(nullptr, c.rb, 8, kF32, c.comm, nullptr); });
  add("NullRecv_AllGather", IA, kRecv,
      [](const Ctx& c) { return ridgeAllGather(c.sb, nullptr, 8, kF32, c.comm, nullptr); });
  add("NullSend_ReduceScatter", IA, kSend,
      [](const Ctx& c) { return ridgeReduceScatter(nullptr, c.rb, 8, kF32, kSum, c.comm, nullptr); });
  add("NullRecv_ReduceScatter", IA, kRecv,
      [](const Ctx& c) { return ridgeReduceScatter(c.sb, nullptr, 8, kF32, kSum, c.comm, nullptr); });
  add("NullSend_AlltoAll", IA, kSend,
      [](const Ctx& c) { return ridgeAlltoAll(nullptr, c.rb, 8, kF32, c.comm, nullptr); });
  add("NullRecv_AlltoAll", IA, kRecv,
      [](const Ctx& c) { return ridgeAlltoAll(c.sb, nullptr, 8, kF32, c.comm, nullptr); });
  add(
      "NullSend_Send", IA, kSend,
      [](const Ctx& c) { return ridgeSend(nullptr, 8, kF32, (c.me + 1) % c.n, c.comm, nullptr); }, 2);
  add(
      "NullRecv_Recv", IA, kRecv,
      [](const Ctx& c) { return ridgeRecv(nullptr, 8, kF32, (c.me + 1) % c.n, c.comm, nullptr); }, 2);

  // ---- Null buffers with count 0 are fine (collective: every rank makes these calls) ----
  add("ZeroCountNull_AllReduce", ridgeSuccess, {},
      [](const Ctx& c) { return ridgeAllReduce(nullptr, nullptr, 0, kF32, kSum, c.comm, nullptr); });
  add("ZeroCountNull_Broadcast", ridgeSuccess, {},
      [](const Ctx& c) { return ridgeBroadcast(nullptr, nullptr, 0, kF32, 0, c.comm, nullptr); });
  add("ZeroCountNull_Reduce", ridgeSuccess, {},
      [](const Ctx& c) { return ridgeReduce(nullptr, nullptr, 0, kF32, kSum, 0, c.comm, nullptr); });
  add("ZeroCountNull_AllGather", ridgeSuccess, {},
      [](const Ctx& c) { return ridgeAllGather(nullptr, nullptr, 0, kF32, c.comm, nullptr); });
  add("ZeroCountNull_ReduceScatter", ridgeSuccess, {},
      [](const Ctx& c) { return ridgeReduceScatter(nullptr, nullptr, 0, kF32, kSum, c.comm, nullptr); });
  add("ZeroCountNull_AlltoAll", ridgeSuccess, {},
      [](const Ctx& c) { return ridgeAlltoAll(nullptr, nullptr, 0, kF32, c.comm, nullptr); });
  add(
      "ZeroCountNull_SendRecvGroup", ridgeSuccess, {},
      [](const Ctx& c) {
        ridgeResult_t a = ridgeGroupStart();
        ridgeResult_t s = ridgeSend(nullptr, 0, kF32, (c.me + 1) % c.n, c.comm, nullptr);
        ridgeResult_t r = ridgeRecv(nullptr, 0, kF32, (c.me + c.n - 1) % c.n, c.comm, nullptr);
        ridgeResult_t e = ridgeGroupEnd();
        for (ridgeResult_t x : {a, s, r, e})
          if (x != ridgeSuccess) return x;
        return ridgeSuccess;
      },
      2);

  // ---- Invalid datatype ------------------------------------------------------------------
  for (int bad : {42, -1, static_cast<int>(ridgeNumTypes)}) {
    const auto dt = static_cast<ridgeDataType_t>(bad);
    const std::string sfx = bad < 0 ? "Minus1" : std::to_string(bad);
    const std::vector<std::string> m = {"datatype"};
    add("BadDatatype" + sfx + "_AllReduce", IA, m,
        [dt](const Ctx& c) { return ridgeAllReduce(c.sb, c.rb, 8, dt, kSum, c.comm, nullptr); });
    add("BadDatatype" + sfx + "_Broadcast", IA, m,
        [dt](const Ctx& c) { return ridgeBroadcast(c.sb, c.rb, 8, dt, 0, c.comm, nullptr); });
    add("BadDatatype" + sfx + "_Reduce", IA, m,
        [dt](const Ctx& c) { return ridgeReduce(c.sb, c.rb, 8, dt, kSum, 0, c.comm, nullptr); });
    add("BadDatatype" + sfx + "_AllGather", IA, m,
        [dt](const Ctx& c) { return ridgeAllGather(c.sb, c.rb, 8, dt, c.comm, nullptr); });
    add("BadDatatype" + sfx + "_ReduceScatter", IA, m,
        [dt](const Ctx& c) { return ridgeReduceScatter(c.sb, c.rb, 8, dt, kSum, c.comm, nullptr); });
    add("BadDatatype" + sfx + "_AlltoAll", IA, m,
        [dt](const Ctx& c) { return ridgeAlltoAll(c.sb, c.rb, 8, dt, c.comm, nullptr); });
    add(
        "BadDatatype" + sfx + "_Send", IA, m,
        [dt](const Ctx& c) { return ridgeSend(c.sb, 8, dt, (c.me + 1) % c.n, c.comm, nullptr); }, 2);
    add(
        "BadDatatype" + sfx + "_Recv", IA, m,
        [dt](const Ctx& c) { return ridgeRecv(c.rb, 8, dt, (c.me + 1) % c.n, c.comm, nullptr); }, 2);
  }

  // ---- Invalid operator -------------------------------------------------------------------
  for (int bad : {static_cast<int>(ridgeNumOps), -1, 42}) {
    const auto op = static_cast<ridgeRedOp_t>(bad);
    const std::string sfx = bad < 0 ? "Minus1" : std::to_string(bad);
    const std::vector<std::string> m = {"op"};
    add("BadOp" + sfx + "_AllReduce", IA, m,
        [op](const Ctx& c) { return ridgeAllReduce(c.sb, c.rb, 8, kF32, op, c.comm, nullptr); });
    add("BadOp" + sfx + "_Reduce", IA, m,
        [op](const Ctx& c) { return ridgeReduce(c.sb, c.rb, 8, kF32, op, 0, c.comm, nullptr); });
    add("BadOp" + sfx + "_ReduceScatter", IA, m,
        [op](const Ctx& c) { return ridgeReduceScatter(c.sb, c.rb, 8, kF32, op, c.comm, nullptr); });
  }

  // ---- Size overflow: count * sizeof(double) does not fit in size_t ----------------------
  const size_t huge = SIZE_MAX / 8 + 2;
  const ridgeDataType_t kF64 = ridgeFloat64;
  const std::vector<std::string> kCount = {"count"};
  add("Overflow_AllReduce", IA, kCount,
      [=](const Ctx& c) { return ridgeAllReduce(c.sb, c.rb, huge, kF64, kSum, c.comm, nullptr); });
  add("Overflow_Broadcast", IA, kCount,
      [=](const Ctx& c) { return ridgeBroadcast(c.sb, c.rb, huge, kF64, 0, c.comm, nullptr); });
  add("Overflow_Reduce", IA, kCount,
      [=](const Ctx& c) { return ridgeReduce(c.sb, c.rb, huge, kF64, kSum, 0, c.comm, nullptr); });
  add("Overflow_AllGather", IA, kCount,
      [=](const Ctx& c) { return ridgeAllGather(c.sb, c.rb, huge, kF64, c.comm, nullptr); });
  add("Overflow_ReduceScatter", IA, kCount,
      [=](const Ctx& c) { return ridgeReduceScatter(c.sb, c.rb, huge, kF64, kSum, c.comm, nullptr); });
  add("Overflow_AlltoAll", IA, kCount,
      [=](const Ctx& c) { return ridgeAlltoAll(c.sb, c.rb, huge, kF64, c.comm, nullptr); });
  add(
      "Overflow_Send", IA, kCount,
      [=](const Ctx& c) { return ridgeSend(c.sb, huge, kF64, (c.me + 1) % c.n, c.comm, nullptr); }, 2);
  add(
      "Overflow_Recv", IA, kCount,
      [=](const Ctx& c) { return ridgeRecv(c.rb, huge, kF64, (c.me + 1) % c.n, c.comm, nullptr); }, 2);
  // count * elemsize fits, count * nranks * elemsize does not (int8, 2+ ranks).
  add(
      "OverflowTimesNranks_AllGather", IA, kCount,
      [](const Ctx& c) {
        return ridgeAllGather(c.sb, c.rb, SIZE_MAX / static_cast<size_t>(c.n) + 1, ridgeInt8, c.comm,
                              nullptr);
      },
      2);
  add(
      "OverflowTimesNranks_ReduceScatter", IA, kCount,
      [](const Ctx& c) {
        return ridgeReduceScatter(c.sb, c.rb, SIZE_MAX / static_cast<size_t>(c.n) + 1, ridgeInt8, kSum,
                                  c.comm, nullptr);
      },
      2);
  add(
      "OverflowTimesNranks_AlltoAll", IA, kCount,
      [](const Ctx& c) {
        return ridgeAlltoAll(c.sb, c.rb, SIZE_MAX / static_cast<size_t>(c.n) + 1, ridgeInt8, c.comm, nullptr);
      },
      2);

  // ---- Root out of range -------------------------------------------------------------------
  for (int which = 0; which < 4; ++which) {
    static const char* sfx[] = {"Minus1", "Nranks", "IntMax", "IntMin"};
    auto root = [which](const Ctx& c) {
      return which == 0 ? -1 : which == 1 ? c.n : which == 2 ? INT_MAX : INT_MIN;
    };
    add(std::string("BadRoot") + sfx[which] + "_Broadcast", IA, {"root"},
        [root](const Ctx& c) { return ridgeBroadcast(c.sb, c.rb, 8, kF32, root(c), c.comm, nullptr); });
    add(std::string("BadRoot") + sfx[which] + "_Reduce", IA, {"root"},
        [root](const Ctx& c) { return ridgeReduce(c.sb, c.rb, 8, kF32, kSum, root(c), c.comm, nullptr); });
  }

  // ---- Peer out of range, and self send/recv --------------------------------------------
  add("BadPeerMinus1_Send", IA, {"peer"},
      [](const Ctx& c) { return ridgeSend(c.sb, 8, kF32, -1, c.comm, nullptr); });
  add("BadPeerMinus1_Recv", IA, {"peer"},
      [](const Ctx& c) { return ridgeRecv(c.rb, 8, kF32, -1, c.comm, nullptr); });
  add("BadPeerNranks_Send", IA, {"peer"},
      [](const Ctx& c) { return ridgeSend(c.sb, 8, kF32, c.n, c.comm, nullptr); });
  add("BadPeerNranks_Recv", IA, {"peer"},
      [](const Ctx& c) { return ridgeRecv(c.rb, 8, kF32, c.n, c.comm, nullptr); });
  add("BadPeerIntMax_Send", IA, {"peer"},
      [](const Ctx& c) { return ridgeSend(c.sb, 8, kF32, INT_MAX, c.comm, nullptr); });
  // A send to self is a copy matched with a receive from self of the same group: alone
  // (outside a group, or unpaired or mismatched in one) it is refused on every rank, never
  // left waiting.
  add("SelfPeerOutsideGroup_Send", ridgeInvalidUsage, {"same group"},
      [](const Ctx& c) { return ridgeSend(c.sb, 8, kF32, c.me, c.comm, nullptr); });
  add("SelfPeerOutsideGroup_Recv", ridgeInvalidUsage, {"same group"},
      [](const Ctx& c) { return ridgeRecv(c.rb, 8, kF32, c.me, c.comm, nullptr); });
  add("SelfSendUnpairedInGroup", ridgeInvalidUsage, {"1 send(s) to self and 0 receive(s)"}, [](const Ctx& c) {
    ridgeGroupStart();
    ridgeResult_t s = ridgeSend(c.sb, 8, kF32, c.me, c.comm, nullptr);
    ridgeResult_t e = ridgeGroupEnd();
    return s != ridgeSuccess ? s : e;
  });
  add("SelfRecvUnpairedInGroup", ridgeInvalidUsage, {"0 send(s) to self and 1 receive(s)"}, [](const Ctx& c) {
    ridgeGroupStart();
    ridgeResult_t s = ridgeRecv(c.rb, 8, kF32, c.me, c.comm, nullptr);
    ridgeResult_t e = ridgeGroupEnd();
    return s != ridgeSuccess ? s : e;
  });
  add("SelfPairCountMismatchInGroup", ridgeInvalidUsage, {"does not match receive from self"},
      [](const Ctx& c) {
        ridgeGroupStart();
        ridgeResult_t s = ridgeSend(c.sb, 8, kF32, c.me, c.comm, nullptr);
        ridgeResult_t r = ridgeRecv(c.rb, 4, kF32, c.me, c.comm, nullptr);
        ridgeResult_t e = ridgeGroupEnd();
        return s != ridgeSuccess ? s : r != ridgeSuccess ? r : e;
      });
  add("SelfPairTypeMismatchInGroup", ridgeInvalidUsage, {"does not match receive from self"},
      [](const Ctx& c) {
        ridgeGroupStart();
        ridgeResult_t s = ridgeSend(c.sb, 8, kF32, c.me, c.comm, nullptr);
        ridgeResult_t r = ridgeRecv(c.rb, 8, ridgeInt32, c.me, c.comm, nullptr);
        ridgeResult_t e = ridgeGroupEnd();
        return s != ridgeSuccess ? s : r != ridgeSuccess ? r : e;
      });
  // Inside a group the error may come from the call or from ridgeGroupEnd; the group must
  // close cleanly either way.
  add("BadPeerInGroup_Send", IA, {"peer"}, [](const Ctx& c) {
    ridgeResult_t a = ridgeGroupStart();
    ridgeResult_t s = ridgeSend(c.sb, 8, kF32, -1, c.comm, nullptr);
    ridgeResult_t e = ridgeGroupEnd();
    if (a != ridgeSuccess) return a;
    return s != ridgeSuccess ? s : e;
  });

  // ---- Init arguments ----------------------------------------------------------------------
  add(
      "Init_NranksZero", IA, {"nranks"},
      [](const Ctx& c) {
        ridgeComm_t x = nullptr;
        return ridgeCommInitRank(&x, 0, *c.freshId, 0);
      },
      1, false);
  add(
      "Init_NranksNegative", IA, {"nranks"},
      [](const Ctx& c) {
        ridgeComm_t x = nullptr;
        return ridgeCommInitRank(&x, -1, *c.freshId, 0);
      },
      1, false);
  add(
      "Init_RankNegative", IA, {"rank"},
      [](const Ctx& c) {
        ridgeComm_t x = nullptr;
        return ridgeCommInitRank(&x, 2, *c.freshId, -1);
      },
      1, false);
  add(
      "Init_RankEqualsNranks", IA, {"rank"},
      [](const Ctx& c) {
        ridgeComm_t x = nullptr;
        return ridgeCommInitRank(&x, 2, *c.freshId, 2);
      },
      1, false);
  add(
      "Init_GarbageUniqueId", IA, {"commid", "unique", "id"},
      [](const Ctx&) {
        ridgeUniqueId g;
        for (size_t i = 0; i < sizeof(g.internal); ++i) g.internal[i] = static_cast<char>(0x9D ^ (i * 37));
        ridgeComm_t x = nullptr;
        return ridgeCommInitRank(&x, 1, g, 0);
      },
      1, false);
  add(
      "Init_ZeroUniqueId", IA, {"commid", "unique", "id"},
      [](const Ctx&) {
        ridgeUniqueId g;
        std::memset(&g, 0, sizeof g);
        ridgeComm_t x = nullptr;
        return ridgeCommInitRank(&x, 1, g, 0);
      },
      1, false);
  add(
      "InitConfig_WrongMagic", IA, {"config", "magic"},
      [](const Ctx& c) {
        ridgeConfig_t cfg = RIDGE_CONFIG_INITIALIZER;
        cfg.magic = 0xdeadbeefu;
        ridgeComm_t x = nullptr;
        return ridgeCommInitRankConfig(&x, 1, *c.freshId, 0, &cfg);
      },
      1, false);
  add(
      "InitConfig_SizeZero", IA, {"config", "size"},
      [](const Ctx& c) {
        ridgeConfig_t cfg = RIDGE_CONFIG_INITIALIZER;
        cfg.size = 0;
        ridgeComm_t x = nullptr;
        return ridgeCommInitRankConfig(&x, 1, *c.freshId, 0, &cfg);
      },
      1, false);
  add(
      "InitConfig_SizeTooSmall", IA, {"config", "size"},
      [](const Ctx& c) {
        ridgeConfig_t cfg = RIDGE_CONFIG_INITIALIZER;
        cfg.size = 4;
        ridgeComm_t x = nullptr;
        return ridgeCommInitRankConfig(&x, 1, *c.freshId, 0, &cfg);
      },
      1, false);
  add(
      "InitConfig_NranksZero", IA, {"nranks"},
      [](const Ctx& c) {
        ridgeConfig_t cfg = RIDGE_CONFIG_INITIALIZER;
        ridgeComm_t x = nullptr;
        return ridgeCommInitRankConfig(&x, 0, *c.freshId, 0, &cfg);
      },
      1, false);

  // ---- The calls NCCL 2.28 has beyond the collectives (issue 16) ---------------------------
  const ridgeResult_t IU = ridgeInvalidUsage;
  add(
      "NullComm_CommSplit", IA, kComm,
      [](const Ctx&) {
        ridgeComm_t x;
        return ridgeCommSplit(nullptr, 0, 0, &x, nullptr);
      },
      1, false);
  add("NullOut_CommSplit", IA, {"newcomm"},
      [](const Ctx& c) { return ridgeCommSplit(c.comm, 0, 0, nullptr, nullptr); });
  add("BadColor_CommSplit", IA, {"color"}, [](const Ctx& c) {
    ridgeComm_t x;
    return ridgeCommSplit(c.comm, -7, 0, &x, nullptr);
  });
  add("BadConfig_CommSplit", IA, {"config"}, [](const Ctx& c) {
    ridgeConfig_t cfg = RIDGE_CONFIG_INITIALIZER;
    cfg.magic = 1;
    ridgeComm_t x;
    return ridgeCommSplit(c.comm, 0, 0, &x, &cfg);
  });
  add("InGroup_CommSplit", IU, {"group"}, [](const Ctx& c) {
    ridgeComm_t x;
    ridgeGroupStart();
    ridgeResult_t r = ridgeCommSplit(c.comm, 0, 0, &x, nullptr);
    ridgeGroupEnd();
    return r;
  });
  add(
      "NullOut_CommInitAll", IA, {"comms"}, [](const Ctx&) { return ridgeCommInitAll(nullptr, 2, nullptr); },
      1, false);
  add(
      "ZeroDevices_CommInitAll", IA, {"ndev"},
      [](const Ctx&) {
        ridgeComm_t x[1];
        return ridgeCommInitAll(x, 0, nullptr);
      },
      1, false);
  add(
      "NegativeDevice_CommInitAll", IA, {"devlist"},
      [](const Ctx&) {
        ridgeComm_t x[2];
        const int devs[2] = {0, -3};
        return ridgeCommInitAll(x, 2, devs);
      },
      1, false);
  add(
      "NullComm_CommShrink", IA, kComm,
      [](const Ctx&) {
        ridgeComm_t x;
        return ridgeCommShrink(nullptr, nullptr, 0, &x, nullptr, RIDGE_SHRINK_DEFAULT);
      },
      1, false);
  add("NullOut_CommShrink", IA, {"newcomm"}, [](const Ctx& c) {
    return ridgeCommShrink(c.comm, nullptr, 0, nullptr, nullptr, RIDGE_SHRINK_DEFAULT);
  });
  add("NegativeCount_CommShrink", IA, {"excludecount"}, [](const Ctx& c) {
    ridgeComm_t x;
    return ridgeCommShrink(c.comm, nullptr, -1, &x, nullptr, RIDGE_SHRINK_DEFAULT);
  });
  add(
      "NullList_CommShrink", IA, {"excluderanks"},
      [](const Ctx& c) {
        ridgeComm_t x;
        return ridgeCommShrink(c.comm, nullptr, 1, &x, nullptr, RIDGE_SHRINK_DEFAULT);
      },
      2);
  add(
      "OutOfRange_CommShrink", IA, {"excluderanks"},
      [](const Ctx& c) {
        ridgeComm_t x;
        const int ex[1] = {c.n + 5};
        return ridgeCommShrink(c.comm, ex, 1, &x, nullptr, RIDGE_SHRINK_DEFAULT);
      },
      2);
  add(
      "ExcludesSelf_CommShrink", IA, {"this rank"},
      [](const Ctx& c) {
        ridgeComm_t x;
        const int ex[1] = {c.me};
        return ridgeCommShrink(c.comm, ex, 1, &x, nullptr, RIDGE_SHRINK_DEFAULT);
      },
      2);
  add("BadFlags_CommShrink", IA, {"shrinkflags"}, [](const Ctx& c) {
    ridgeComm_t x;
    return ridgeCommShrink(c.comm, nullptr, 0, &x, nullptr, 7);
  });
  add(
      "Duplicate_CommShrink", IA, {"twice"},
      [](const Ctx& c) {
        ridgeComm_t x;
        const int other = 1 - c.me;
        const int ex[2] = {other, other};
        return ridgeCommShrink(c.comm, ex, 2, &x, nullptr, RIDGE_SHRINK_DEFAULT);
      },
      2);
  add(
      "EveryRank_CommShrink", IA, {"all 2 ranks"},
      [](const Ctx& c) {
        ridgeComm_t x;
        const int ex[2] = {1, 0};
        return ridgeCommShrink(c.comm, ex, 2, &x, nullptr, RIDGE_SHRINK_ABORT);
      },
      2);
  add("BadConfig_CommShrink", IA, {"config"}, [](const Ctx& c) {
    ridgeConfig_t cfg = RIDGE_CONFIG_INITIALIZER;
    cfg.timeoutSeconds = -4;
    ridgeComm_t x;
    return ridgeCommShrink(c.comm, nullptr, 0, &x, &cfg, RIDGE_SHRINK_DEFAULT);
  });
  add("InGroup_CommShrink", IU, {"group"}, [](const Ctx& c) {
    ridgeComm_t x;
    ridgeGroupStart();
    ridgeResult_t r = ridgeCommShrink(c.comm, nullptr, 0, &x, nullptr, RIDGE_SHRINK_DEFAULT);
    ridgeGroupEnd();
    return r;
  });
  add(
      "NullComm_Bcast", IA, kComm,
      [](const Ctx& c) { return ridgeBcast(c.rb, 8, kF32, 0, nullptr, nullptr); }, 1, false);
  add("NullBuff_Bcast", IA, {"recvbuff", "sendbuff"},
      [](const Ctx& c) { return ridgeBcast(nullptr, 8, kF32, 0, c.comm, nullptr); });
  add("BadRoot_Bcast", IA, {"root"},
      [](const Ctx& c) { return ridgeBcast(c.rb, 8, kF32, c.n, c.comm, nullptr); });
  add("BadRoot_Gather", IA, {"root"},
      [](const Ctx& c) { return ridgeGather(c.sb, c.rb, 8, kF32, -1, c.comm, nullptr); });
  add("NullRecv_Gather", IA, {"recvbuff"},
      [](const Ctx& c) { return ridgeGather(c.sb, nullptr, 8, kF32, c.me, c.comm, nullptr); });
  add("BadType_Gather", IA, {"datatype"}, [](const Ctx& c) {
    return ridgeGather(c.sb, c.rb, 8, static_cast<ridgeDataType_t>(42), 0, c.comm, nullptr);
  });
  add("BadRoot_Scatter", IA, {"root"},
      [](const Ctx& c) { return ridgeScatter(c.sb, c.rb, 8, kF32, c.n, c.comm, nullptr); });
  add("NullSend_Scatter", IA, {"sendbuff"},
      [](const Ctx& c) { return ridgeScatter(nullptr, c.rb, 8, kF32, c.me, c.comm, nullptr); });
  add(
      "NullComm_Gather", IA, kComm,
      [](const Ctx& c) { return ridgeGather(c.sb, c.rb, 8, kF32, 0, nullptr, nullptr); }, 1, false);
  add("NullOut_RedOpCreatePreMulSum", IA, {"op"}, [](const Ctx& c) {
    float k = 2;
    return ridgeRedOpCreatePreMulSum(nullptr, &k, kF32, ridgeScalarHostImmediate, c.comm);
  });
  add("NullScalar_RedOpCreatePreMulSum", IA, {"scalar"}, [](const Ctx& c) {
    ridgeRedOp_t op;
    return ridgeRedOpCreatePreMulSum(&op, nullptr, kF32, ridgeScalarHostImmediate, c.comm);
  });
  add("BadType_RedOpCreatePreMulSum", IA, {"datatype"}, [](const Ctx& c) {
    ridgeRedOp_t op;
    float k = 2;
    return ridgeRedOpCreatePreMulSum(&op, &k, static_cast<ridgeDataType_t>(11), ridgeScalarHostImmediate,
                                     c.comm);
  });
  add("BadResidence_RedOpCreatePreMulSum", IA, {"residence"}, [](const Ctx& c) {
    ridgeRedOp_t op;
    float k = 2;
    return ridgeRedOpCreatePreMulSum(&op, &k, kF32, static_cast<ridgeScalarResidence_t>(5), c.comm);
  });
  add(
      "NullComm_RedOpCreatePreMulSum", IA, kComm,
      [](const Ctx&) {
        ridgeRedOp_t op;
        float k = 2;
        return ridgeRedOpCreatePreMulSum(&op, &k, kF32, ridgeScalarHostImmediate, nullptr);
      },
      1, false);
  add("BuiltIn_RedOpDestroy", IA, {"built-in"},
      [](const Ctx& c) { return ridgeRedOpDestroy(ridgeMax, c.comm); });
  add("Unknown_RedOpDestroy", IA, {"op"},
      [](const Ctx& c) { return ridgeRedOpDestroy(static_cast<ridgeRedOp_t>(ridgeNumOps + 900), c.comm); });
  add("DestroyedOp_AllReduce", IA, {"op"}, [](const Ctx& c) {
    ridgeRedOp_t op;
    float k = 2;
    if (ridgeRedOpCreatePreMulSum(&op, &k, kF32, ridgeScalarHostImmediate, c.comm) != ridgeSuccess)
      return ridgeInternalError;
    if (ridgeRedOpDestroy(op, c.comm) != ridgeSuccess) return ridgeInternalError;
    return ridgeAllReduce(c.sb, c.rb, 8, kF32, op, c.comm, nullptr);
  });
  add("OpOfOtherType_AllReduce", IA, {"datatype"}, [](const Ctx& c) {
    ridgeRedOp_t op;
    double k = 2;
    if (ridgeRedOpCreatePreMulSum(&op, &k, ridgeFloat64, ridgeScalarHostImmediate, c.comm) != ridgeSuccess)
      return ridgeInternalError;
    ridgeResult_t r = ridgeAllReduce(c.sb, c.rb, 8, kF32, op, c.comm, nullptr);
    const std::string text = ridgeGetLastError(nullptr);
    ridgeRedOpDestroy(op, c.comm);
    ridgeGetLastError(nullptr);
    return r == ridgeInvalidArgument && text.find("datatype") != std::string::npos ? r : ridgeInternalError;
  });
  add(
      "NullOut_MemAlloc", IA, {"ptr"}, [](const Ctx&) { return ridgeMemAlloc(nullptr, 64); }, 1, false);
  add(
      "ZeroSize_MemAlloc", IA, {"size"},
      [](const Ctx&) {
        void* p;
        return ridgeMemAlloc(&p, 0);
      },
      1, false);
  add(
      "Null_MemFree", IA, {"ptr"}, [](const Ctx&) { return ridgeMemFree(nullptr); }, 1, false);
  add(
      "Foreign_MemFree", IA, {"ridgeMemAlloc"}, [](const Ctx& c) { return ridgeMemFree(c.sb); }, 1, false);
  add(
      "Twice_MemFree", IA, {"ridgeMemAlloc"},
      [](const Ctx&) {
        void* p = nullptr;
        if (ridgeMemAlloc(&p, 100) != ridgeSuccess || ridgeMemFree(p) != ridgeSuccess)
          return ridgeInternalError;
        return ridgeMemFree(p);
      },
      1, false);
  add("NullBuff_CommRegister", IA, {"buff"}, [](const Ctx& c) {
    void* h;
    return ridgeCommRegister(c.comm, nullptr, 64, &h);
  });
  add("ZeroSize_CommRegister", IA, {"size"}, [](const Ctx& c) {
    void* h;
    return ridgeCommRegister(c.comm, c.sb, 0, &h);
  });
  add("NullOut_CommRegister", IA, {"handle"},
      [](const Ctx& c) { return ridgeCommRegister(c.comm, c.sb, 64, nullptr); });
  add("NullHandle_CommDeregister", IA, {"handle"},
      [](const Ctx& c) { return ridgeCommDeregister(c.comm, nullptr); });
  add("Bogus_CommDeregister", IA, {"handle"}, [](const Ctx& c) { return ridgeCommDeregister(c.comm, c.rb); });
  add("Twice_CommDeregister", IA, {"handle"}, [](const Ctx& c) {
    void* h = nullptr;
    if (ridgeCommRegister(c.comm, c.sb, 64, &h) != ridgeSuccess ||
        ridgeCommDeregister(c.comm, h) != ridgeSuccess)
      return ridgeInternalError;
    return ridgeCommDeregister(c.comm, h);
  });

  // ---- Group misuse --------------------------------------------------------------------------
  add(
      "GroupEndWithoutStart", ridgeInvalidUsage, {"group"}, [](const Ctx&) { return ridgeGroupEnd(); }, 1,
      false);
  return t;
}

const std::vector<BadCall>& table() {
  static const std::vector<BadCall> t = buildTable();
  return t;
}

/** Runs one entry and checks code and message; returns "" or a description of what failed. */
std::string runEntry(const BadCall& e, const Ctx& ctx) {
  std::string err;
  const double t0 = nowSec();
  const ridgeResult_t r = e.call(ctx);
  const double dt = nowSec() - t0;
  if (r != e.expect) {
    err += "returned " + describeResult(r, e.usesComm ? ctx.comm : nullptr) + ", expected " +
           resultName(e.expect) + ". ";
  }
  if (dt > 5.0) err += "took " + std::to_string(dt) + " s. ";
  if (e.expect != ridgeSuccess && r != ridgeSuccess) {
    const char* any = ridgeGetLastError(nullptr);
    const char* own = e.usesComm ? ridgeGetLastError(ctx.comm) : any;
    for (const char* text : {any, own}) {
      if (text == nullptr) {
        err += "ridgeGetLastError returned NULL. ";
        continue;
      }
      const std::string l = lower(text);
      if (l.empty()) err += "ridgeGetLastError is empty after the error. ";
      bool named = e.mention.empty();
      for (const std::string& m : e.mention) named = named || l.find(lower(m)) != std::string::npos;
      if (!named) {
        err += "ridgeGetLastError(" + std::string(text == any ? "NULL" : "comm") + ") = \"" + text +
               "\" does not name the argument (";
        for (const std::string& m : e.mention) err += m + " ";
        err += "). ";
      }
      if (text == own) break;
    }
  }
  return err;
}

/** A valid allreduce of 1009 int32 and its check; returns "" or what went wrong. */
std::string validAllReduce(ridgeComm_t comm, int n, int me, uint32_t salt) {
  const size_t count = 1009;
  std::vector<int32_t> in(count), out(count, -7);
  for (size_t i = 0; i < count; ++i)
    in[i] = static_cast<int32_t>((i * 31 + me * 1000003 + salt) % 65536) - 30000;
  ridgeResult_t r = ridgeAllReduce(in.data(), out.data(), count, ridgeInt32, ridgeSum, comm, nullptr);
  if (r != ridgeSuccess) return "follow-up allreduce returned " + describeResult(r, comm);
  for (size_t i = 0; i < count; ++i) {
    int64_t want = 0;
    for (int q = 0; q < n; ++q) want += static_cast<int32_t>((i * 31 + q * 1000003 + salt) % 65536) - 30000;
    if (out[i] != want) {
      return "follow-up allreduce wrong at " + std::to_string(i) + ": " + std::to_string(out[i]) +
             " != " + std::to_string(want);
    }
  }
  return "";
}

// ---- 1 rank, in this process ---------------------------------------------------------------
class OneRank : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ridgeUniqueId id;
    ASSERT_EQ(ridgeGetUniqueId(&id), ridgeSuccess);
    ASSERT_EQ(ridgeCommInitRank(&comm_, 1, id, 0), ridgeSuccess) << ridgeGetLastError(nullptr);
  }
  static void TearDownTestSuite() {
    if (comm_) {
      EXPECT_EQ(ridgeCommDestroy(comm_), ridgeSuccess);
    }
    comm_ = nullptr;
  }
  static ridgeComm_t comm_;
};
ridgeComm_t OneRank::comm_ = nullptr;

class BadInputOneRank : public OneRank, public ::testing::WithParamInterface<size_t> {};

TEST_P(BadInputOneRank, ReturnsCodeNamesArgumentAndCommStillWorks) {
  ASSERT_NE(comm_, nullptr);
  const BadCall& e = table()[GetParam()];
  if (e.minRanks > 1) GTEST_SKIP() << "needs " << e.minRanks << " ranks; covered by BadInputTwoRanks";
  ridgeUniqueId fresh;
  ASSERT_EQ(ridgeGetUniqueId(&fresh), ridgeSuccess);
  std::vector<float> sb(kBufElems, 1.0f), rb(kBufElems, 0.0f);
  Ctx ctx{comm_, 1, 0, sb.data(), rb.data(), &fresh};
  EXPECT_EQ(runEntry(e, ctx), "") << e.name;
  EXPECT_EQ(validAllReduce(comm_, 1, 0, static_cast<uint32_t>(GetParam())), "") << "after " << e.name;
}

INSTANTIATE_TEST_SUITE_P(All, BadInputOneRank, ::testing::Range<size_t>(0, table().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return table()[info.param].name;
                         });

// ---- 2 ranks, forked ---------------------------------------------------------------------------
TEST(BadInputTwoRanks, EveryBadCallThenValidAllReduce) {
  constexpr int n = 2;
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(n, 120, [&](int me, Reporter& rep) {
    ridgeComm_t comm = initRank(n, id, me, rep);
    if (!comm) return 2;
    std::vector<float> sb(kBufElems, 1.0f), rb(kBufElems, 0.0f);
    size_t i = 0;
    for (const BadCall& e : table()) {
      ridgeUniqueId fresh;  // only for argument checks that must fail before using it
      std::memset(&fresh, 0, sizeof fresh);
      if (e.name.rfind("Init", 0) == 0 || e.name.rfind("NullOut_CommInit", 0) == 0) {
        if (ridgeGetUniqueId(&fresh) != ridgeSuccess) rep.fail(e.name, "ridgeGetUniqueId failed");
      }
      Ctx ctx{comm, n, me, sb.data(), rb.data(), &fresh};
      rep.line("CALL " + e.name);
      std::string err = runEntry(e, ctx);
      if (!err.empty()) rep.fail(e.name, err);
      std::string ar = validAllReduce(comm, n, me, static_cast<uint32_t>(i++));
      if (!ar.empty()) {
        rep.fail(e.name, ar);
        return 1;  // the ranks may be out of step now
      }
    }
    // Null sendbuff on a non-root broadcast rank and null recvbuff on a non-root reduce
    // rank are allowed: those buffers are not used there.
    std::vector<int32_t> v(64);
    for (int k = 0; k < 64; ++k) v[k] = me == 0 ? k * 3 : -1;
    ridgeResult_t r =
        ridgeBroadcast(me == 0 ? v.data() : nullptr, v.data(), 64, ridgeInt32, 0, comm, nullptr);
    if (r != ridgeSuccess)
      rep.fail("Broadcast null sendbuff on non-root", describeResult(r, comm));
    else if (v[63] != 189)
      rep.fail("Broadcast null sendbuff on non-root", "wrong data");
    std::vector<int32_t> red(64, 0);
    r = ridgeReduce(v.data(), me == 0 ? red.data() : nullptr, 64, ridgeInt32, ridgeSum, 0, comm, nullptr);
    if (r != ridgeSuccess)
      rep.fail("Reduce null recvbuff on non-root", describeResult(r, comm));
    else if (me == 0 && red[10] != 60)
      rep.fail("Reduce null recvbuff on non-root", "wrong data");
    std::string ar = validAllReduce(comm, n, me, 999);
    if (!ar.empty()) rep.fail("final", ar);
    r = ridgeCommDestroy(comm);
    if (r != ridgeSuccess) rep.fail("destroy", describeResult(r));
    return 0;
  });
  reportChildFailures(res, "bad input, 2 ranks");
}

// ---- Error strings and last error ------------------------------------------------------------
TEST(ErrorStrings, EveryCodeAndOutOfRange) {
  std::set<std::string> seen;
  for (int c = 0; c < ridgeNumResults; ++c) {
    const char* s = ridgeGetErrorString(static_cast<ridgeResult_t>(c));
    ASSERT_NE(s, nullptr) << c;
    EXPECT_GT(std::strlen(s), 0u) << c;
    seen.insert(s);
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(ridgeNumResults)) << "two codes share a string";
  for (int c : {static_cast<int>(ridgeNumResults), 42, -1, INT_MAX, INT_MIN}) {
    const char* s = ridgeGetErrorString(static_cast<ridgeResult_t>(c));
    ASSERT_NE(s, nullptr) << c;
    EXPECT_GT(std::strlen(s), 0u) << c;
  }
}

TEST(ErrorStrings, LastErrorEmptyOnFreshThreadNeverNull) {
  std::string text = "unset";
  bool wasNull = false;
  std::thread([&] {
    const char* s = ridgeGetLastError(nullptr);
    wasNull = s == nullptr;
    if (s) text = s;
  }).join();
  EXPECT_FALSE(wasNull);
  EXPECT_EQ(text, "");
}

TEST_F(OneRank, QueriesReportTheCommunicator) {
  int v = -5;
  ASSERT_EQ(ridgeGetVersion(&v), ridgeSuccess);
  EXPECT_EQ(v, RIDGE_VERSION_CODE);
  ASSERT_EQ(ridgeCommCount(comm_, &v), ridgeSuccess);
  EXPECT_EQ(v, 1);
  ASSERT_EQ(ridgeCommUserRank(comm_, &v), ridgeSuccess);
  EXPECT_EQ(v, 0);
  ASSERT_EQ(ridgeCommCuDevice(comm_, &v), ridgeSuccess);
  EXPECT_EQ(v, -1);
  ridgeResult_t a = ridgeInProgress;
  ASSERT_EQ(ridgeCommGetAsyncError(comm_, &a), ridgeSuccess);
  EXPECT_EQ(a, ridgeSuccess);
}

TEST_F(OneRank, GroupEndTwiceAfterOneStart) {
  ASSERT_EQ(ridgeGroupStart(), ridgeSuccess);
  ASSERT_EQ(ridgeGroupEnd(), ridgeSuccess);
  EXPECT_EQ(ridgeGroupEnd(), ridgeInvalidUsage);
  EXPECT_EQ(validAllReduce(comm_, 1, 0, 5), "");
}

// ---- Finalized communicator ------------------------------------------------------------------
std::string finalizedChecks(ridgeComm_t c, int me, int n) {
  std::string err;
  std::vector<float> sb(64, 1.0f), rb(64);
  auto expectUsage = [&](const char* what, ridgeResult_t r) {
    if (r != ridgeInvalidUsage)
      err += std::string(what) + " on a finalized comm returned " + resultName(r) + "; ";
  };
  ridgeResult_t r = ridgeCommFinalize(c);
  if (r != ridgeSuccess) return "ridgeCommFinalize returned " + describeResult(r, c);
  const int peer = (me + 1) % n;
  expectUsage("ridgeAllReduce", ridgeAllReduce(sb.data(), rb.data(), 8, kF32, kSum, c, nullptr));
  expectUsage("ridgeBroadcast", ridgeBroadcast(sb.data(), rb.data(), 8, kF32, 0, c, nullptr));
  expectUsage("ridgeReduce", ridgeReduce(sb.data(), rb.data(), 8, kF32, kSum, 0, c, nullptr));
  expectUsage("ridgeAllGather", ridgeAllGather(sb.data(), rb.data(), 8, kF32, c, nullptr));
  expectUsage("ridgeReduceScatter", ridgeReduceScatter(sb.data(), rb.data(), 8, kF32, kSum, c, nullptr));
  expectUsage("ridgeAlltoAll", ridgeAlltoAll(sb.data(), rb.data(), 8, kF32, c, nullptr));
  if (n > 1) {
    expectUsage("ridgeSend", ridgeSend(sb.data(), 8, kF32, peer, c, nullptr));
    expectUsage("ridgeRecv", ridgeRecv(rb.data(), 8, kF32, peer, c, nullptr));
  }
  expectUsage("ridgeCommFinalize (again)", ridgeCommFinalize(c));
  const char* last = ridgeGetLastError(c);
  if (last == nullptr || last[0] == '\0') err += "no last error after a call on a finalized comm; ";
  r = ridgeCommDestroy(c);
  if (r != ridgeSuccess) err += "ridgeCommDestroy after finalize returned " + describeResult(r) + "; ";
  return err;
}

TEST(Finalized, OneRankCallsAreInvalidUsage) {
  ridgeUniqueId id;
  ASSERT_EQ(ridgeGetUniqueId(&id), ridgeSuccess);
  ridgeComm_t c = nullptr;
  ASSERT_EQ(ridgeCommInitRank(&c, 1, id, 0), ridgeSuccess);
  EXPECT_EQ(finalizedChecks(c, 0, 1), "");
}

TEST(Finalized, TwoRanksCallsAreInvalidUsageAndOtherCommStillWorks) {
  ridgeUniqueId id1, id2;
  if (!makeUniqueId(&id1) || !makeUniqueId(&id2)) return;
  LaunchResult res = launchRanks(2, 60, [&](int me, Reporter& rep) {
    ridgeComm_t a = initRank(2, id1, me, rep);
    ridgeComm_t b = initRank(2, id2, me, rep);
    if (!a || !b) return 2;
    std::string err = finalizedChecks(a, me, 2);
    if (!err.empty()) rep.fail("finalized", err);
    err = validAllReduce(b, 2, me, 77);
    if (!err.empty()) rep.fail("second comm", err);
    ridgeResult_t r = ridgeCommDestroy(b);
    if (r != ridgeSuccess) rep.fail("destroy", describeResult(r));
    return 0;
  });
  reportChildFailures(res, "finalized, 2 ranks");
}

// ---- Non-blocking init -------------------------------------------------------------------------
/** Polls ridgeCommGetAsyncError (bounded) until it leaves ridgeInProgress. */
ridgeResult_t pollInit(ridgeComm_t c, double limitSec, double* took) {
  const double t0 = nowSec();
  ridgeResult_t state = ridgeInProgress;
  for (int i = 0; i < 200000 && nowSec() - t0 < limitSec; ++i) {
    ridgeResult_t r = ridgeCommGetAsyncError(c, &state);
    if (r != ridgeSuccess) return r;
    if (state != ridgeInProgress) break;
    usleep(1000);
  }
  *took = nowSec() - t0;
  return state;
}

TEST(NonBlockingInit, OneRankReachesSuccessThenWorks) {
  ridgeUniqueId id;
  ASSERT_EQ(ridgeGetUniqueId(&id), ridgeSuccess);
  ridgeConfig_t cfg = RIDGE_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.commName = "nonblocking-1";
  ridgeComm_t c = nullptr;
  ridgeResult_t r = ridgeCommInitRankConfig(&c, 1, id, 0, &cfg);
  ASSERT_TRUE(r == ridgeSuccess || r == ridgeInProgress) << describeResult(r);
  ASSERT_NE(c, nullptr);
  double took = 0;
  EXPECT_EQ(pollInit(c, 15, &took), ridgeSuccess);
  EXPECT_EQ(validAllReduce(c, 1, 0, 3), "");
  EXPECT_EQ(ridgeCommDestroy(c), ridgeSuccess);
}

TEST(NonBlockingInit, TwoRanksReachSuccessThenWork) {
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(2, 60, [&](int me, Reporter& rep) {
    if (me == 1) usleep(300 * 1000);  // rank 0 really is in progress for a while
    ridgeConfig_t cfg = RIDGE_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ridgeComm_t c = nullptr;
    ridgeResult_t r = ridgeCommInitRankConfig(&c, 2, id, me, &cfg);
    if (r != ridgeSuccess && r != ridgeInProgress) {
      rep.fail("init", describeResult(r));
      return 2;
    }
    double took = 0;
    ridgeResult_t s = pollInit(c, 20, &took);
    if (s != ridgeSuccess) {
      rep.fail("poll", std::string("ridgeCommGetAsyncError settled on ") + describeResult(s, c));
      return 2;
    }
    std::string err = validAllReduce(c, 2, me, 9);
    if (!err.empty()) rep.fail("allreduce", err);
    r = ridgeCommDestroy(c);
    if (r != ridgeSuccess) rep.fail("destroy", describeResult(r));
    return 0;
  });
  reportChildFailures(res, "non-blocking init, 2 ranks");
}

// config.timeoutSeconds overrides RIDGE_TIMEOUT: rank 1 of 2 never comes, and the
// background init must settle on ridgeTimeout after about 2 s.
TEST(NonBlockingInit, ConfigTimeoutWhenPeerNeverArrives) {
  ridgeUniqueId id;
  ASSERT_EQ(ridgeGetUniqueId(&id), ridgeSuccess);
  ridgeConfig_t cfg = RIDGE_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.timeoutSeconds = 2;
  ridgeComm_t c = nullptr;
  const double t0 = nowSec();
  ridgeResult_t r = ridgeCommInitRankConfig(&c, 2, id, 0, &cfg);
  ASSERT_TRUE(r == ridgeSuccess || r == ridgeInProgress || r == ridgeTimeout) << describeResult(r);
  if (r != ridgeTimeout) {
    ASSERT_NE(c, nullptr);
    double took = 0;
    EXPECT_EQ(pollInit(c, 15, &took), ridgeTimeout);
    EXPECT_LT(nowSec() - t0, ridgetest::scaledSeconds(2.0 + 5.0));
    EXPECT_GT(nowSec() - t0, 1.0) << "gave up long before config.timeoutSeconds";
    EXPECT_NE(ridgeCommAbort(c), ridgeInvalidArgument);
  }
}

}  // namespace
}  // namespace ridgetest

#include "api_test_main.h"
