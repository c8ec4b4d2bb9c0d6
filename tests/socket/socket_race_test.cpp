// Races between the TCP transport's lanes and a peer that fails or leaves, made certain by
// stretching the send lane's windows with its test hook (transports/socket/socket_hooks.h):
//   - a rank that finds a mismatch right after posting its operation's header, while its send
//     lane has not written that header yet, must still deliver it before the withdrawal of its
//     queued buffers fails the connection: the peer then reports the mismatch at once instead
//     of waiting for RIDGE_TIMEOUT (chaos mismatch case Kind_Tcp, which failed about 1 in 40);
//   - a rank whose last chunk reached the peer, which then finished and closed its
//     connections, before the send lane handed that chunk's slot back must finish its call:
//     the peer's orderly close is no failure while the lane's pass that completes the call is
//     still in flight (chaos mismatch case Datatype_Tcp's fresh allreduce failed so).
// And, with the same hook, that a two-rank allgather or alltoall sends ahead of its receives.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "rank_launcher.h"
#include "transports/socket/socket_hooks.h"

namespace ridgetest {
namespace {

constexpr int kTimeout = 6;  // RIDGE_TIMEOUT; the delays below are far shorter
constexpr useconds_t kLaneDelayUs = 400 * 1000;

void tcpEnv() {
  setLoopbackEnv();
  setenv("RIDGE_SHM", "0", 1);
  setenv("RIDGE_NET", "socket", 1);
  setenv("RIDGE_SOCKET_DIRECT", "1", 1);
  setenv("RIDGE_TIMEOUT", std::to_string(kTimeout).c_str(), 1);
}

// Set by a rank just before the call whose lane windows the hook stretches.
std::atomic<bool> gArmed{false};

void delayBeforePass(ridge::SendLaneStage stage, int) {
  if (stage == ridge::SendLaneStage::BeforePass && gArmed.load()) usleep(kLaneDelayUs);
}

void delayAfterPiece(ridge::SendLaneStage stage, int) {
  if (stage == ridge::SendLaneStage::AfterPiece && gArmed.load()) usleep(kLaneDelayUs);
}

// A page shared by the forked ranks (mapped before the fork): ranks that reported wait for
// the others before tearing down, as in the chaos mismatch suite.
struct Shared {
  std::atomic<int> reported{0};
  // SendsAhead: pieces rank 0's send lane wrote to rank 1, and whether rank 1's lane goes on.
  std::atomic<int> piecesToRank1{0};
  std::atomic<int> piecesAtRelease{-1};
  std::atomic<bool> released{false};
};

struct SharedPage {
  SharedPage() {
    page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (page != MAP_FAILED) shared = new (page) Shared();
  }
  ~SharedPage() {
    if (page != MAP_FAILED) munmap(page, 4096);
  }
  void* page = MAP_FAILED;
  Shared* shared = nullptr;
};

void waitForEveryRank(Shared* s, int nranks) {
  s->reported.fetch_add(1);
  const double until = nowSec() + scaledSeconds(30);
  while (s->reported.load() < nranks && nowSec() < until) usleep(1000);
}

// Both ranks reported "ERR 0" (success) and "WRONG 0".
void expectSuccessAndNoWrongValue(const LaunchResult& res) {
  for (int r = 0; r < 2; ++r) {
    auto lines = linesWith(res.ranks[static_cast<size_t>(r)], "ERR ");
    ASSERT_EQ(lines.size(), 1u) << "rank " << r << " reported no result";
    EXPECT_EQ(std::atoi(lines[0].c_str()), ridgeSuccess) << "rank " << r << ": " << lines[0];
    auto wrong = linesWith(res.ranks[static_cast<size_t>(r)], "WRONG ");
    ASSERT_EQ(wrong.size(), 1u);
    EXPECT_EQ(std::atol(wrong[0].c_str()), 0) << "rank " << r;
  }
}

TEST(SocketRace, HeaderLeavesBeforeAWithdrawalFailsTheConnection) {
  tcpEnv();
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  SharedPage sp;
  ASSERT_NE(sp.shared, nullptr);
  const size_t count = 1024;  // below a slot: the header is not awaited before the direct chunks
  LaunchResult res = launchRanks(2, 60, [&](int me, Reporter& rep) {
    ridgeComm_t comm = initRank(2, id, me, rep);
    if (!comm) return 2;
    std::vector<float> send(count * 2, 1.0f), recv(count * 2, 0.0f);
    // Rank 1's send lane waits at the start of each pass: its header is still queued when
    // rank 0's chunk shows the mismatch and rank 1 withdraws its queued buffers.
    if (me == 1) ridge::setSendLaneHook(delayBeforePass);
    gArmed.store(true);
    const double t0 = nowSec();
    const ridgeResult_t r =
        me == 0 ? ridgeAllReduce(send.data(), recv.data(), count, ridgeFloat32, ridgeSum, comm, nullptr)
                : ridgeAllGather(send.data(), recv.data(), count, ridgeFloat32, comm, nullptr);
    const double took = nowSec() - t0;
    gArmed.store(false);
    rep.line("ERR " + std::to_string(r) + " " + std::to_string(took) + " " +
             (r == ridgeSuccess ? std::string() : std::string(ridgeGetLastError(comm))));
    waitForEveryRank(sp.shared, 2);
    ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, "mismatch with a delayed send lane");
  ASSERT_FALSE(res.timedOut);
  for (int r = 0; r < 2; ++r) {
    auto lines = linesWith(res.ranks[static_cast<size_t>(r)], "ERR ");
    ASSERT_EQ(lines.size(), 1u) << "rank " << r << " reported no result";
    const int code = std::atoi(lines[0].c_str());
    const double took = std::atof(lines[0].c_str() + lines[0].find(' ') + 1);
    EXPECT_EQ(code, ridgeInvalidUsage) << "rank " << r << ": " << lines[0];
    EXPECT_NE(lines[0].find("allgather #1(1024 x float)"), std::string::npos)
        << "rank " << r << ": " << lines[0];
    // Well within RIDGE_TIMEOUT: the peer's header arrived.
    EXPECT_LT(took, kTimeout / 2.0) << "rank " << r << ": " << lines[0];
  }
}

TEST(SocketRace, LastChunkHandedBackAfterThePeerLeft) {
  tcpEnv();
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  const size_t count = 1024;  // one direct chunk each way; the call then waits for its sends
  LaunchResult res = launchRanks(2, 60, [&](int me, Reporter& rep) {
    ridgeComm_t comm = initRank(2, id, me, rep);
    if (!comm) return 2;
    std::vector<float> send(count), recv(count * 2, -1.0f);
    for (size_t i = 0; i < count; ++i) send[i] = static_cast<float>(i % 251 + 1000 * me);
    // Rank 0's send lane waits after each piece it wrote, before handing the slot back:
    // meanwhile rank 1 has all it needs, finishes and closes its connections.
    if (me == 0) ridge::setSendLaneHook(delayAfterPiece);
    gArmed.store(true);
    const ridgeResult_t r = ridgeAllGather(send.data(), recv.data(), count, ridgeFloat32, comm, nullptr);
    gArmed.store(false);
    long wrong = 0;
    for (int q = 0; q < 2; ++q)
      for (size_t i = 0; i < count; ++i)
        wrong += recv[static_cast<size_t>(q) * count + i] != static_cast<float>(i % 251 + 1000 * q) ? 1 : 0;
    rep.line("ERR " + std::to_string(r) + " " +
             (r == ridgeSuccess ? std::string() : std::string(ridgeGetLastError(comm))));
    rep.line("WRONG " + std::to_string(wrong));
    ridgeCommDestroy(comm);  // rank 1 leaves at once
    return 0;
  });
  reportChildFailures(res, "allgather with a delayed hand-back");
  ASSERT_FALSE(res.timedOut);
  expectSuccessAndNoWrongValue(res);
}

// ---- a two-rank exchange sends ahead of its receives -----------------------------------
//
// An allgather (ring) or alltoall (all-pairs) of two ranks sends only its own input, so its
// sends need not wait for its receives (exchangeAhead in src/coll/algorithms.cpp, issue 21:
// in lockstep, one round at a time, the connection idled for two wake-ups per chunk). Rank
// 1's send lane holds at the start of its passes, so rank 1 sends nothing at all, until rank
// 0's lane has written kAheadPieces pieces to rank 1 (or kHoldSeconds passed). Rank 1's
// receive lane reads them into the kSlots positions it declared, so rank 0 can write its
// header and kSlots - 2 = 6 chunks (its lead) without any kernel buffering: 7 pieces. In
// lockstep rank 0 writes its header and its first chunk, then waits for rank 1's: 2.
constexpr int kSlots = 8;
constexpr int kAheadPieces = kSlots - 1;
constexpr int kChunksAhead = 10;      // per peer, each one 64 KiB piece (one stream)
constexpr double kHoldSeconds = 5.0;  // without a lead rank 1 waits this long, then goes on

Shared* gAhead = nullptr;  // the page of the running SendsAhead case (inherited by the ranks)
double gHoldUntil = 0;

void countPiecesToRank1(ridge::SendLaneStage stage, int peer) {
  if (stage == ridge::SendLaneStage::AfterPiece && peer == 1 && gArmed.load())
    gAhead->piecesToRank1.fetch_add(1);
}

void holdUntilRank0IsAhead(ridge::SendLaneStage stage, int) {
  if (stage != ridge::SendLaneStage::BeforePass || !gArmed.load() || gAhead->released.load()) return;
  while (gAhead->piecesToRank1.load() < kAheadPieces && nowSec() < gHoldUntil) usleep(500);
  gAhead->piecesAtRelease.store(gAhead->piecesToRank1.load());
  gAhead->released.store(true);
}

TEST(SocketRace, TwoRankExchangeSendsAheadOfItsReceives) {
  tcpEnv();
  setenv("RIDGE_SOCKET_CHUNK", "64K", 1);
  setenv("RIDGE_SOCKET_SLOTS", std::to_string(kSlots).c_str(), 1);
  setenv("RIDGE_SOCKET_STREAMS", "1", 1);
  setenv("RIDGE_ALGO", "allgather:0-:ring;alltoall:0-:allpairs", 1);
  constexpr size_t count = kChunksAhead * (64u << 10) / sizeof(float);  // per peer
  for (const bool alltoall : {false, true}) {
    SCOPED_TRACE(alltoall ? "alltoall (all-pairs)" : "allgather (ring)");
    ridgeUniqueId id;
    if (!makeUniqueId(&id)) break;
    SharedPage sp;
    ASSERT_NE(sp.shared, nullptr);
    gAhead = sp.shared;
    LaunchResult res = launchRanks(2, 60, [&](int me, Reporter& rep) {
      ridgeComm_t comm = initRank(2, id, me, rep);
      if (!comm) return 2;
      std::vector<float> send(alltoall ? 2 * count : count), recv(2 * count, -1.0f);
      // Element i of the block for rank q: distinct per sender, receiver and position.
      auto value = [](int from, int to, size_t i) {
        return static_cast<float>(i % 4093 + 5000 * from + 20000 * to);
      };
      for (size_t i = 0; i < send.size(); ++i)
        send[i] = alltoall ? value(me, static_cast<int>(i / count), i % count) : value(me, 0, i);
      gHoldUntil = nowSec() + scaledSeconds(kHoldSeconds);
      ridge::setSendLaneHook(me == 0 ? countPiecesToRank1 : holdUntilRank0IsAhead);
      gArmed.store(true);
      const ridgeResult_t r =
          alltoall ? ridgeAlltoAll(send.data(), recv.data(), count, ridgeFloat32, comm, nullptr)
                   : ridgeAllGather(send.data(), recv.data(), count, ridgeFloat32, comm, nullptr);
      gArmed.store(false);
      ridge::setSendLaneHook(nullptr);
      long wrong = 0;
      for (int q = 0; q < 2; ++q)
        for (size_t i = 0; i < count; ++i)
          wrong += recv[static_cast<size_t>(q) * count + i] != (alltoall ? value(q, me, i) : value(q, 0, i))
                       ? 1
                       : 0;
      rep.line("ERR " + std::to_string(r) + " " +
               (r == ridgeSuccess ? std::string() : std::string(ridgeGetLastError(comm))));
      rep.line("WRONG " + std::to_string(wrong));
      if (me == 1) rep.line("AHEAD " + std::to_string(gAhead->piecesAtRelease.load()));
      waitForEveryRank(sp.shared, 2);
      ridgeCommDestroy(comm);
      return 0;
    });
    reportChildFailures(res, alltoall ? "alltoall sending ahead" : "allgather sending ahead");
    ASSERT_FALSE(res.timedOut);
    expectSuccessAndNoWrongValue(res);
    auto ahead = linesWith(res.ranks[1], "AHEAD ");
    ASSERT_EQ(ahead.size(), 1u);
    EXPECT_GE(std::atoi(ahead[0].c_str()), kAheadPieces)
        << "rank 0 wrote only " << ahead[0] << " pieces to rank 1 while rank 1 sent nothing: its sends wait "
        << "for its receives";
  }
  for (const char* name : {"RIDGE_SOCKET_CHUNK", "RIDGE_SOCKET_SLOTS", "RIDGE_SOCKET_STREAMS", "RIDGE_ALGO"})
    unsetenv(name);
}

}  // namespace
}  // namespace ridgetest
