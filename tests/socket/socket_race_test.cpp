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
// And, with the same hook, that a two-rank allgather or alltoall sends ahead of its receives,
// that pieces queued together leave in one write call, and that a root waiting for its sends
// writes them itself when its lane does not run (issue 21).
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "coll/comm.h"
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

// ---- queued pieces leave together; a waiting root writes them itself (issue 21) --------
//
// Value of element i of a broadcast from `root` in call `call`: distinct per call and root, so
// that a chunk of another call or from the wrong offset shows.
float bcastValue(int call, int root, size_t i) {
  return static_cast<float>((i * 2654435761u) % 65521 + 70000 * call + 35000 * root);
}

// 4 KiB chunks, 4 slots, 1 stream, kernel buffers of 1 MiB (which hold every case below), and
// the algorithm `algo` (RIDGE_ALGO).
void smallChunkEnv(const char* algo) {
  tcpEnv();
  setenv("RIDGE_SOCKET_CHUNK", "4K", 1);
  setenv("RIDGE_SOCKET_SLOTS", "4", 1);
  setenv("RIDGE_SOCKET_STREAMS", "1", 1);
  setenv("RIDGE_SOCKET_BUFFER", "1M", 1);
  setenv("RIDGE_ALGO", algo, 1);
}
void clearSmallChunkEnv() {
  for (const char* name : {"RIDGE_SOCKET_CHUNK", "RIDGE_SOCKET_SLOTS", "RIDGE_SOCKET_STREAMS",
                           "RIDGE_SOCKET_BUFFER", "RIDGE_ALGO"})
    unsetenv(name);
}

// Rank 0's lane pieces and write calls to rank 1 from the call on (the call returns before
// its lane wrote them: all-pairs posts its chunks from slots).
std::atomic<int> gPieces{0}, gWrites{0};
std::atomic<bool> gCallReturned{false};
double gLaneHoldUntil = 0;

// Once the lane wrote the operation's header (which the root's data waits for: the message is
// above a slot), holds it until rank 0's call returned (all-pairs posts every chunk from a slot
// and returns once it has rank 1's header); counts pieces and write calls throughout.
void holdAfterHeaderThenCount(ridge::SendLaneStage stage, int peer) {
  if (!gArmed.load()) return;
  if (stage == ridge::SendLaneStage::BeforePass && gPieces.load() >= 1)
    while (!gCallReturned.load() && nowSec() < gLaneHoldUntil) usleep(500);
  if (stage == ridge::SendLaneStage::AfterPiece && peer == 1) gPieces.fetch_add(1);
  if (stage == ridge::SendLaneStage::AfterWrite && peer == 1) gWrites.fetch_add(1);
}

// Rank 0 broadcasts 12 KiB in 4 KiB chunks (its header and 3 chunks, all in the FIFO of 4
// slots); its send lane holds after the header until the call returned: the lane then finds
// the 3 chunks queued and writes them in one call (kernel buffers of 1 MiB hold them), where
// it made one call per piece before (4 in all). So a header posted with its data leaves with it.
TEST(SocketRace, QueuedPiecesLeaveInOneWrite) {
  smallChunkEnv("broadcast:0-:allpairs");
  ridgeUniqueId id;
  const bool idOk = makeUniqueId(&id);
  SharedPage sp;
  ASSERT_NE(sp.shared, nullptr);
  constexpr size_t count = 3 * 1024;  // 12 KiB of float
  LaunchResult res = launchRanks(2, 60, [&](int me, Reporter& rep) {
    if (!idOk) return 2;
    ridgeComm_t comm = initRank(2, id, me, rep);
    if (!comm) return 2;
    std::vector<float> buf(count);
    for (size_t i = 0; i < count; ++i) buf[i] = me == 0 ? bcastValue(0, 0, i) : std::nanf("");
    gLaneHoldUntil = nowSec() + scaledSeconds(kHoldSeconds);
    if (me == 0) ridge::setSendLaneHook(holdAfterHeaderThenCount);
    gArmed.store(true);
    const double t0 = nowSec();
    const ridgeResult_t r = ridgeBroadcast(buf.data(), buf.data(), count, ridgeFloat32, 0, comm, nullptr);
    gCallReturned.store(true);
    long wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += buf[i] != bcastValue(0, 0, i) ? 1 : 0;
    rep.line("ERR " + std::to_string(r) + " " +
             (r == ridgeSuccess ? std::string() : std::string(ridgeGetLastError(comm))));
    rep.line("WRONG " + std::to_string(wrong));
    if (me == 0) rep.line("TOOK " + std::to_string(nowSec() - t0));
    waitForEveryRank(sp.shared, 2);
    // Destruction lets the lane write every posted chunk first: then all were counted.
    ridgeCommDestroy(comm);
    gArmed.store(false);
    ridge::setSendLaneHook(nullptr);
    if (me == 0) rep.line("WRITES " + std::to_string(gWrites.load()) + " " + std::to_string(gPieces.load()));
    return 0;
  });
  clearSmallChunkEnv();
  ASSERT_TRUE(idOk);
  reportChildFailures(res, "broadcast with a delayed send lane");
  ASSERT_FALSE(res.timedOut);
  expectSuccessAndNoWrongValue(res);
  auto writes = linesWith(res.ranks[0], "WRITES ");
  ASSERT_EQ(writes.size(), 1u);
  int calls = 0, pieces = 0;
  ASSERT_EQ(std::sscanf(writes[0].c_str(), "%d %d", &calls, &pieces), 2);
  EXPECT_EQ(pieces, 4) << "the header and 3 chunks";
  // The header, then the 3 chunks queued behind the held lane in one call.
  EXPECT_GE(calls, 1);
  EXPECT_LE(calls, 2) << "pieces queued together should leave in one write call";
  auto took = linesWith(res.ranks[0], "TOOK ");
  ASSERT_EQ(took.size(), 1u);
  EXPECT_LT(std::atof(took[0].c_str()), scaledSeconds(kHoldSeconds) / 2)
      << "the lane was held longer than meant";
}

// Rank 0's send lane holds at the start of its passes until rank 0's calls returned (or
// kHoldSeconds passed). Rank 0 broadcasts, as the root of a chain (direct: from its buffer),
// messages of 1 to 3 chunks of 4 KiB, each of which, with its header, fits in the FIFO and in
// the kernel buffers: as it waits for its sends to complete it writes them itself, so every call
// returns although its lane never ran. Before, the root waited for the lane (kHoldSeconds).
std::atomic<bool> gRootDone{false};
double gRootHoldUntil = 0;

void holdWhileRootCalls(ridge::SendLaneStage stage, int) {
  if (stage != ridge::SendLaneStage::BeforePass || !gArmed.load()) return;
  while (!gRootDone.load() && nowSec() < gRootHoldUntil) usleep(500);
}

TEST(SocketRace, WaitingRootWritesItsChunksWhileItsLaneIsHeld) {
  smallChunkEnv("broadcast:0-:ring");
  ridgeUniqueId id;
  const bool idOk = makeUniqueId(&id);
  SharedPage sp;
  ASSERT_NE(sp.shared, nullptr);
  constexpr int kCalls = 6;
  LaunchResult res = launchRanks(2, 60, [&](int me, Reporter& rep) {
    if (!idOk) return 2;
    ridgeComm_t comm = initRank(2, id, me, rep);
    if (!comm) return 2;
    std::vector<float> send(3 * 1024), recv(3 * 1024);
    gRootHoldUntil = nowSec() + scaledSeconds(kHoldSeconds);
    if (me == 0) ridge::setSendLaneHook(holdWhileRootCalls, /*inlineSends=*/true);
    gArmed.store(true);
    const double t0 = nowSec();
    ridgeResult_t r = ridgeSuccess;
    long wrong = 0;
    for (int call = 0; call < kCalls && r == ridgeSuccess; ++call) {
      const size_t count = 1024 * static_cast<size_t>(1 + call % 3);  // 1 to 3 chunks
      for (size_t i = 0; i < count; ++i) {
        send[i] = bcastValue(call, 0, i);
        recv[i] = std::nanf("");
      }
      r = ridgeBroadcast(send.data(), recv.data(), count, ridgeFloat32, 0, comm, nullptr);
      for (size_t i = 0; i < count; ++i) wrong += recv[i] != bcastValue(call, 0, i) ? 1 : 0;
    }
    const double took = nowSec() - t0;
    gRootDone.store(true);
    gArmed.store(false);
    rep.line("ERR " + std::to_string(r) + " " +
             (r == ridgeSuccess ? std::string() : std::string(ridgeGetLastError(comm))));
    rep.line("WRONG " + std::to_string(wrong));
    if (me == 0) rep.line("TOOK " + std::to_string(took));
    waitForEveryRank(sp.shared, 2);
    ridge::setSendLaneHook(nullptr);
    ridgeCommDestroy(comm);
    return 0;
  });
  clearSmallChunkEnv();
  ASSERT_TRUE(idOk);
  reportChildFailures(res, "broadcast root with a held send lane");
  ASSERT_FALSE(res.timedOut);
  expectSuccessAndNoWrongValue(res);
  auto took = linesWith(res.ranks[0], "TOOK ");
  ASSERT_EQ(took.size(), 1u);
  EXPECT_LT(std::atof(took[0].c_str()), scaledSeconds(kHoldSeconds) / 2)
      << "the root's calls waited for its held send lane instead of writing their chunks themselves";
}

// Each rank's send lane holds at the start of its passes until the rank's own calls returned
// (or kHoldSeconds passed). Both ranks exchange messages (ridgeSend and ridgeRecv in a group)
// of 128 KiB to 1 MiB, below the 1 MiB chunk: from 128 KiB the TCP connector sends them from
// the caller's buffer (directSendMinBytes), and the caller, waiting for its sends, writes them
// itself, so every call returns although no lane ever runs (issue 21: that hand-off to the
// lane cost 256 KiB sendrecv up to 2x Gloo's time). Before, such messages were copied into a
// slot for the lane, and each rank waited for the other's held lane (kHoldSeconds). After the
// lanes are released, sizes just below and above 128 KiB go the copied and the direct way.
std::atomic<bool> gExchangeDone{false};
double gExchangeHoldUntil = 0;

void holdWhileExchanging(ridge::SendLaneStage stage, int) {
  if (stage != ridge::SendLaneStage::BeforePass || !gArmed.load()) return;
  while (!gExchangeDone.load() && nowSec() < gExchangeHoldUntil) usleep(500);
}

// The end of a rank's run with held send lanes: its result, wrong values and the time its
// calls took, for expectNotHeld; then the hook is dropped and the communicator destroyed.
int reportHeldRun(Reporter& rep, Shared* s, ridgeComm_t comm, ridgeResult_t r, long wrong, double took) {
  rep.line("ERR " + std::to_string(r) + " " +
           (r == ridgeSuccess ? std::string() : std::string(ridgeGetLastError(comm))));
  rep.line("WRONG " + std::to_string(wrong));
  rep.line("TOOK " + std::to_string(took));
  waitForEveryRank(s, 2);
  ridge::setSendLaneHook(nullptr);
  ridgeCommDestroy(comm);
  return 0;
}

// Both ranks' calls finished well before the held lanes would have let them go.
void expectNotHeld(const LaunchResult& res, const char* calls, const char* instead) {
  for (int rank = 0; rank < 2; ++rank) {
    auto took = linesWith(res.ranks[rank], "TOOK ");
    ASSERT_EQ(took.size(), 1u);
    EXPECT_LT(std::atof(took[0].c_str()), scaledSeconds(kHoldSeconds) / 2)
        << "rank " << rank << ": " << calls << " waited for the held send lanes instead of " << instead;
  }
}

float exchangeValue(int call, int from, size_t i) {
  return static_cast<float>(call * 1000003 + from * 7919 + i % 65521);
}

TEST(SocketRace, SubChunkSendrecvWrittenByTheWaitingCaller) {
  tcpEnv();
  setenv("RIDGE_SOCKET_STREAMS", "1", 1);
  setenv("RIDGE_SOCKET_BUFFER", "4M", 1);  // the kernel takes each message whole
  ridgeUniqueId id;
  const bool idOk = makeUniqueId(&id);
  SharedPage sp;
  ASSERT_NE(sp.shared, nullptr);
  // Floats: 128 KiB, 256 KiB + 4, 1 MiB - 4 (held lanes); then 128 KiB - 4, 128 KiB + 4, 64 KiB.
  const std::vector<size_t> held = {32768, 65537, 262143}, afterwards = {32767, 32769, 16384};
  LaunchResult res = launchRanks(2, 60, [&](int me, Reporter& rep) {
    if (!idOk) return 2;
    ridgeComm_t comm = initRank(2, id, me, rep);
    if (!comm) return 2;
    const int peer = 1 - me;
    std::vector<float> send(262144), recv(262144);
    ridgeResult_t r = ridgeSuccess;
    long wrong = 0;
    int call = 0;
    auto exchange = [&](size_t count) {
      for (size_t i = 0; i < count; ++i) {
        send[i] = exchangeValue(call, me, i);
        recv[i] = std::nanf("");
      }
      recv[count] = -1.0f;  // must stay: nothing lands past the message
      ridgeGroupStart();
      ridgeSend(send.data(), count, ridgeFloat32, peer, comm, nullptr);
      ridgeRecv(recv.data(), count, ridgeFloat32, peer, comm, nullptr);
      r = ridgeGroupEnd();
      for (size_t i = 0; i < count; ++i) wrong += recv[i] != exchangeValue(call, peer, i) ? 1 : 0;
      wrong += recv[count] != -1.0f ? 1 : 0;
      ++call;
    };
    gExchangeHoldUntil = nowSec() + scaledSeconds(kHoldSeconds);
    ridge::setSendLaneHook(holdWhileExchanging, /*inlineSends=*/true);
    gArmed.store(true);
    const double t0 = nowSec();
    for (size_t count : held)
      if (r == ridgeSuccess) exchange(count);
    const double took = nowSec() - t0;
    gExchangeDone.store(true);
    gArmed.store(false);
    for (size_t count : afterwards)
      if (r == ridgeSuccess) exchange(count);
    return reportHeldRun(rep, sp.shared, comm, r, wrong, took);
  });
  unsetenv("RIDGE_SOCKET_STREAMS");
  unsetenv("RIDGE_SOCKET_BUFFER");
  ASSERT_TRUE(idOk);
  reportChildFailures(res, "sendrecv below a chunk with held send lanes");
  ASSERT_FALSE(res.timedOut);
  expectSuccessAndNoWrongValue(res);
  expectNotHeld(res, "the exchanges", "the callers writing their messages themselves");
}

// A slot-only collective (a one-element allreduce) leaves the TCP receive side reading ahead
// into slots: every released slot is declared again. A broadcast after it declares where its
// chunks land (ExpectAhead), which ends the read-ahead (RecvConnector::endReadAhead): the
// slots declared before drain, and from then on nothing is declared between calls, so each
// broadcast lands in the output instead of a slot that is then copied out. Before, a
// read-ahead never ended for messages of fewer chunks than the FIFO has slots (issue 21: a
// 1 MiB TCP broadcast copied every message once more on the receiver). Twice, with an
// allreduce between, so that read-ahead starts again and ends again.
TEST(SocketRace, DeclaringCallerEndsTheSlotOnlyReadAhead) {
  tcpEnv();
  setenv("RIDGE_ALGO", "broadcast:0-:ring", 1);
  ridgeUniqueId id;
  const bool idOk = makeUniqueId(&id);
  SharedPage sp;
  ASSERT_NE(sp.shared, nullptr);
  constexpr int kRounds = 2, kCalls = 4;
  constexpr size_t kCount = 64 * 1024;  // 256 KiB: one chunk of the default 1 MiB
  LaunchResult res = launchRanks(2, 60, [&](int me, Reporter& rep) {
    if (!idOk) return 2;
    ridgeComm_t comm = initRank(2, id, me, rep);
    if (!comm) return 2;
    std::vector<float> send(kCount), recv(kCount);
    ridgeResult_t r = ridgeSuccess;
    long wrong = 0;
    std::string ahead;
    for (int round = 0; round < kRounds && r == ridgeSuccess; ++round) {
      float one = 1.0f, sum = 0.0f;
      r = ridgeAllReduce(&one, &sum, 1, ridgeFloat32, ridgeSum, comm, nullptr);
      wrong += r == ridgeSuccess && sum != 2.0f ? 1 : 0;
      ahead.append(" allreduce ").append(std::to_string(comm->recvFrom[1 - me]->declaredAhead()));
      for (int call = 0; call < kCalls && r == ridgeSuccess; ++call) {
        const int tag = round * kCalls + call;
        for (size_t i = 0; i < kCount; ++i) {
          send[i] = bcastValue(tag, 0, i);
          recv[i] = std::nanf("");
        }
        r = ridgeBroadcast(send.data(), recv.data(), kCount, ridgeFloat32, 0, comm, nullptr);
        for (size_t i = 0; i < kCount; ++i) wrong += recv[i] != bcastValue(tag, 0, i) ? 1 : 0;
        ahead.append(" ").append(std::to_string(comm->recvFrom[1 - me]->declaredAhead()));
      }
    }
    rep.line("ERR " + std::to_string(r) + " " +
             (r == ridgeSuccess ? std::string() : std::string(ridgeGetLastError(comm))));
    rep.line("WRONG " + std::to_string(wrong));
    rep.line("AHEAD" + ahead);
    waitForEveryRank(sp.shared, 2);
    ridgeCommDestroy(comm);
    return 0;
  });
  unsetenv("RIDGE_ALGO");
  ASSERT_TRUE(idOk);
  reportChildFailures(res, "broadcasts after a slot-only allreduce");
  ASSERT_FALSE(res.timedOut);
  expectSuccessAndNoWrongValue(res);
  // Rank 1 receives the broadcasts: after each allreduce its connector from rank 0 reads
  // ahead (slots declared); by the last broadcast of each round nothing is declared.
  auto ahead = linesWith(res.ranks[1], "AHEAD ");
  ASSERT_EQ(ahead.size(), 1u);
  std::vector<std::string> words;
  std::istringstream in(ahead[0]);
  for (std::string w; in >> w;) words.push_back(w);
  ASSERT_EQ(words.size(), static_cast<size_t>(kRounds * (2 + kCalls))) << ahead[0];
  for (int round = 0; round < kRounds; ++round) {
    const size_t base = static_cast<size_t>(round * (2 + kCalls));
    EXPECT_NE(words[base + 1], "0") << "no read-ahead after the allreduce: the test shows nothing: "
                                    << ahead[0];
    EXPECT_EQ(words[base + 1 + kCalls], "0")
        << "round " << round << ": the receiver still reads ahead into slots after " << kCalls
        << " broadcasts that declare their chunks: " << ahead[0];
  }
}

// Both ranks' send lanes hold at the start of their passes until the rank's own calls returned
// (holdWhileExchanging, with inline sends allowed). Rank 0 broadcasts 16 and 64 KiB: below
// the 128 KiB from which a message goes out from the caller's buffer, so the root copies it
// into a slot and nobody waits for its sends; the header of every call goes into a slot too.
// A rank about to wait writes what it queued itself (Transport::flushSends, the executor's
// first idle poll): the root its header and data, the receiver its header, which the root
// waits for. Before, both waited for the held lanes (kHoldSeconds): on 2 cores that hand-off
// to the lane was on the path of every TCP broadcast below 128 KiB (issue 21).
TEST(SocketRace, WaitingRankWritesWhatItQueuedWhileItsLaneIsHeld) {
  tcpEnv();
  setenv("RIDGE_SOCKET_STREAMS", "1", 1);
  setenv("RIDGE_ALGO", "broadcast:0-:ring", 1);
  ridgeUniqueId id;
  const bool idOk = makeUniqueId(&id);
  SharedPage sp;
  ASSERT_NE(sp.shared, nullptr);
  const std::vector<size_t> counts = {4096, 16384, 4096, 16384};  // floats: 16 and 64 KiB
  LaunchResult res = launchRanks(2, 60, [&](int me, Reporter& rep) {
    if (!idOk) return 2;
    ridgeComm_t comm = initRank(2, id, me, rep);
    if (!comm) return 2;
    std::vector<float> send(16384), recv(16384);
    ridgeResult_t r = ridgeSuccess;
    long wrong = 0;
    gExchangeHoldUntil = nowSec() + scaledSeconds(kHoldSeconds);
    ridge::setSendLaneHook(holdWhileExchanging, /*inlineSends=*/true);
    gArmed.store(true);
    const double t0 = nowSec();
    for (size_t call = 0; call < counts.size() && r == ridgeSuccess; ++call) {
      const size_t count = counts[call];
      for (size_t i = 0; i < count; ++i) {
        send[i] = bcastValue(static_cast<int>(call), 0, i);
        recv[i] = std::nanf("");
      }
      r = ridgeBroadcast(send.data(), recv.data(), count, ridgeFloat32, 0, comm, nullptr);
      for (size_t i = 0; i < count; ++i) wrong += recv[i] != bcastValue(static_cast<int>(call), 0, i) ? 1 : 0;
    }
    const double took = nowSec() - t0;
    gExchangeDone.store(true);
    gArmed.store(false);
    return reportHeldRun(rep, sp.shared, comm, r, wrong, took);
  });
  unsetenv("RIDGE_SOCKET_STREAMS");
  unsetenv("RIDGE_ALGO");
  ASSERT_TRUE(idOk);
  reportChildFailures(res, "broadcast below 128 KiB with held send lanes");
  ASSERT_FALSE(res.timedOut);
  expectSuccessAndNoWrongValue(res);
  expectNotHeld(res, "the broadcasts", "the waiting ranks writing what they queued");
}

}  // namespace
}  // namespace ridgetest
