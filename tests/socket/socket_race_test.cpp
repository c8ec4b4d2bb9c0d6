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
  for (int r = 0; r < 2; ++r) {
    auto lines = linesWith(res.ranks[static_cast<size_t>(r)], "ERR ");
    ASSERT_EQ(lines.size(), 1u) << "rank " << r << " reported no result";
    EXPECT_EQ(std::atoi(lines[0].c_str()), ridgeSuccess) << "rank " << r << ": " << lines[0];
    auto wrong = linesWith(res.ranks[static_cast<size_t>(r)], "WRONG ");
    ASSERT_EQ(wrong.size(), 1u);
    EXPECT_EQ(std::atol(wrong[0].c_str()), 0) << "rank " << r;
  }
}

}  // namespace
}  // namespace ridgetest
