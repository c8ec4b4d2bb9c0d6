// The TCP transport under the collective matrix and under failures.
//
// OneHost tests run the ranks as plain forked processes with RIDGE_SHM=0 over loopback,
// so every pair talks through sockets. Netns tests place ranks in network namespaces
// (tests/net/netns_helper.h): 2 ranks on 2 "hosts", and 4 ranks on 2 hosts, where pairs
// within a host use shared memory and pairs across hosts use TCP. The netns tests skip
// without CAP_NET_ADMIN.
//
// Budget (2 cores): the small matrix (full cross product of collectives, types, operators,
// placements, counts up to 100003) per configuration, plus a 64 MiB subset (every
// collective in float32, both placements) that exercises striping over several streams
// and the chunk pipeline.
#include <dirent.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "matrix_cases.h"
#include "netns_helper.h"

namespace ridgetest {
namespace {
using namespace matrix;

constexpr int kFaultTimeout = 3;  // RIDGE_TIMEOUT of the failure tests
constexpr double kFaultMargin = 5.0;

// The 64 MiB subset: float32 for every collective (sum where there is an operator), and
// allreduce-sum in every datatype.
bool largeSubset(const Case& c) {
  if (c.coll == kAllReduce && c.op == ridgeSum) return true;
  return c.dt == ridgeFloat32 && (!isReducing(c.coll) || c.op == ridgeSum);
}

void oneHostEnv() {
  setLoopbackEnv();
  setenv("RIDGE_SHM", "0", 1);
  setenv("RIDGE_TIMEOUT", "30", 1);
}

// One-host set-up of the failure tests (short RIDGE_TIMEOUT) and the id their ranks share.
bool faultTestId(ridgeUniqueId* id) {
  oneHostEnv();
  setenv("RIDGE_TIMEOUT", std::to_string(kFaultTimeout).c_str(), 1);
  return makeUniqueId(id);
}

void runOneHost(int n, bool large, double budget) {
  oneHostEnv();
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(n, budget, [&](int rank, Reporter& rep) {
    ridgeComm_t comm = initRank(n, id, rank, rep);
    if (!comm) return 2;
    return runCases(comm, rank, n, large, rep, large ? largeSubset : std::function<bool(const Case&)>());
  });
  std::printf("socket one host n=%d %s: %.1f s\n", n, large ? "64MiB subset" : "small", res.elapsed);
  reportChildFailures(res, "socket one host n=" + std::to_string(n));
}

TEST(SocketOneHost, MatrixRanks2Small) {
  runOneHost(2, false, 120);
}
TEST(SocketOneHost, MatrixRanks3Small) {
  runOneHost(3, false, 120);
}
TEST(SocketOneHost, MatrixRanks2LargeSubset) {
  runOneHost(2, true, 120);
}

void runNetns(int n, int hosts, bool large, double budget) {
  NETNS_SKIP_WITHOUT_PRIVILEGE();
  netns::Fabric fabric;
  std::string err;
  ASSERT_TRUE(fabric.create(hosts, &err)) << err;
  LaunchResult res = fabric.launch(
      n, netns::blockPlacement(n, hosts), {{"RIDGE_TIMEOUT", "30"}}, budget, [&](int rank, Reporter& rep) {
        char ipc[128] = {0};
        ssize_t len = readlink("/proc/self/ns/ipc", ipc, sizeof ipc - 1);
        rep.line("IPC " + std::string(ipc, len > 0 ? static_cast<size_t>(len) : 0));
        ridgeComm_t comm = netns::initFromEnv(rank, rep);
        if (!comm) return 2;
        return runCases(comm, rank, n, large, rep, large ? largeSubset : std::function<bool(const Case&)>());
      });
  std::printf("socket netns n=%d on %d hosts %s: %.1f s\n", n, hosts, large ? "64MiB subset" : "small",
              res.elapsed);
  // Ranks of one namespace are one host (shared IPC namespace), the others are not.
  const std::vector<int> place = netns::blockPlacement(n, hosts);
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      auto ia = linesWith(res.ranks[a], "IPC "), ib = linesWith(res.ranks[b], "IPC ");
      ASSERT_FALSE(ia.empty() || ib.empty());
      EXPECT_EQ(ia[0] == ib[0], place[a] == place[b])
          << "ranks " << a << ", " << b << ": " << ia[0] << " " << ib[0];
    }
  }
  reportChildFailures(res, "socket netns n=" + std::to_string(n));
}

TEST(SocketNetns, MatrixRanks2Hosts2Small) {
  runNetns(2, 2, false, 120);
}
TEST(SocketNetns, MatrixRanks4Hosts2Small) {
  runNetns(4, 2, false, 140);
}
TEST(SocketNetns, MatrixRanks2Hosts2LargeSubset) {
  runNetns(2, 2, true, 120);
}

struct Outcome {
  bool seen = false;
  int code = -1;
  double seconds = 0;
  std::string text;
};
Outcome outcomeOf(const RankResult& rr) {
  Outcome o;
  for (const std::string& s : linesWith(rr, "RESULT ")) {
    o.seen = true;
    std::sscanf(s.c_str(), "%d %lf", &o.code, &o.seconds);
  }
  for (const std::string& s : linesWith(rr, "LASTERROR ")) o.text = s;
  return o;
}

// The one line of `rr` that starts with `prefix` carries result `code` and mentions `text`.
void expectResultLine(const RankResult& rr, const std::string& prefix, int code, const std::string& text) {
  auto lines = linesWith(rr, prefix);
  ASSERT_EQ(lines.size(), 1u) << "rank " << rr.rank << ": " << prefix;
  EXPECT_EQ(std::atoi(lines[0].c_str()), code) << lines[0];
  EXPECT_NE(lines[0].find(text), std::string::npos) << lines[0];
}

// Runs 64 MiB allreduces until one fails; reports "RESULT code seconds" and the last error.
int allreduceUntilError(ridgeComm_t comm, int rank, Reporter& rep, int maxIters) {
  constexpr size_t count = (64u << 20) / 4;
  std::vector<float> buf(count, 1.0f);
  for (int iter = 0; iter < maxIters; ++iter) {
    const double t0 = nowSec();
    ridgeResult_t r = ridgeAllReduce(buf.data(), buf.data(), count, ridgeFloat32, ridgeMax, comm, nullptr);
    if (r != ridgeSuccess) {
      rep.line("RESULT " + std::to_string(r) + " " + fmtD(nowSec() - t0));
      rep.line("LASTERROR " + std::string(ridgeGetLastError(comm)));
      ridgeCommAbort(comm);
      return 0;
    }
    rep.line("ITER " + std::to_string(iter));
  }
  rep.fail("rank " + std::to_string(rank), "every allreduce succeeded although a peer went away");
  return 1;
}

// ---- the direct extension (sending from and receiving into user buffers) ----------------

// Socket-transport settings of a direct-path test, set in the parent (for the unique id)
// and in every rank.
struct SocketSettings {
  const char* chunk = "4K";
  const char* slots = "2";
  const char* buffer = nullptr;   // RIDGE_SOCKET_BUFFER, else the kernel's auto-tuning
  bool large = false;             // the 64 MiB cases instead of the small ones
  const char* streams = nullptr;  // RIDGE_SOCKET_STREAMS, else the automatic count
};
void setSocketEnv(const char* algo, const SocketSettings& s) {
  setenv("RIDGE_ALGO", algo, 1);
  setenv("RIDGE_SOCKET_CHUNK", s.chunk, 1);
  setenv("RIDGE_SOCKET_SLOTS", s.slots, 1);
  if (s.buffer) setenv("RIDGE_SOCKET_BUFFER", s.buffer, 1);
  if (s.streams) setenv("RIDGE_SOCKET_STREAMS", s.streams, 1);
}

// Every ring and chain algorithm at every size, with the smallest chunk and FIFO so that
// messages span many chunks, odd sizes end inside one, declarations wait for room, and
// 0- and 1-element cases (int8: 1 byte) run through the direct path; in place and out of
// place with poisoned outputs (the matrix). `directOff` ranks keep slots only: each rank
// decides for itself, the wire must not differ. `keep` narrows the cases.
void runDirectMatrix(int n, const char* algo, int directOff, const SocketSettings& settings = {},
                     const std::function<bool(const Case&)>& keep = nullptr) {
  oneHostEnv();
  setSocketEnv(algo, settings);
  ridgeUniqueId id;
  const bool idOk = makeUniqueId(&id);
  for (const char* name : {"RIDGE_ALGO", "RIDGE_SOCKET_CHUNK", "RIDGE_SOCKET_SLOTS", "RIDGE_SOCKET_BUFFER",
                           "RIDGE_SOCKET_STREAMS"})
    unsetenv(name);
  if (!idOk) return;
  LaunchResult res = launchRanks(n, 120, [&](int rank, Reporter& rep) {
    setSocketEnv(algo, settings);
    if (rank == directOff) setenv("RIDGE_SOCKET_DIRECT", "0", 1);
    ridgeComm_t comm = initRank(n, id, rank, rep);
    if (!comm) return 2;
    return runCases(comm, rank, n, settings.large, rep, keep);
  });
  std::printf("socket direct n=%d %s: %.1f s\n", n, algo, res.elapsed);
  reportChildFailures(res, std::string("socket direct ") + algo);
}

constexpr const char* kAllRing =
    "allreduce:0-:ring;reducescatter:0-:ring;allgather:0-:ring;broadcast:0-:ring;reduce:0-:ring";
constexpr const char* kAllTree = "allreduce:0-:tree;broadcast:0-:ring;allgather:0-:ring";

TEST(SocketOneHost, DirectRingMatrixRanks2) {
  runDirectMatrix(2, kAllRing, -1);
}
TEST(SocketOneHost, DirectRingMatrixRanks3OneRankSlotsOnly) {
  runDirectMatrix(3, kAllRing, 1);
}
TEST(SocketOneHost, DirectTreeMatrixRanks3) {
  runDirectMatrix(3, kAllTree, -1);
}

// The all-pairs exchange of two ranks (allgather, alltoall) sends from the input and lands
// in the output (issue 21), but for an all-to-all in place; both ranks direct, and one of
// them slots only.
bool exchangeCase(const Case& c) {
  return c.coll == kAllGather || c.coll == kAlltoAll;
}
constexpr const char* kAllPairsExchange = "allgather:0-:allpairs;alltoall:0-:allpairs";
TEST(SocketOneHost, DirectAllPairsExchangeRanks2) {
  runDirectMatrix(2, kAllPairsExchange, -1, {}, exchangeCase);
}
TEST(SocketOneHost, DirectAllPairsExchangeRanks2OneRankSlotsOnly) {
  runDirectMatrix(2, kAllPairsExchange, 0, {}, exchangeCase);
}

// Three streams per pair: the send lane writes up to 4 queued pieces of a stream in one call
// (issue 21). With 4 KiB chunks every chunk is one piece, so each stream carries every third
// chunk and steps over the others inside a batch; with 256 KiB chunks a chunk is cut into 3
// pieces, one per stream. Broadcast (chain and all-pairs), allgather, alltoall and the
// reductions, direct and slots only.
constexpr const char* kMixed =
    "allreduce:0-:ring;reducescatter:0-:ring;allgather:0-:allpairs;"
    "alltoall:0-:allpairs;broadcast:0-16K:allpairs;broadcast:16K-:ring;reduce:0-:ring";
TEST(SocketOneHost, BatchedPiecesThreeStreamsRanks2) {
  runDirectMatrix(2, kMixed, -1, {"4K", "4", nullptr, false, "3"});
  runDirectMatrix(2, kMixed, 1, {"256K", "4", nullptr, false, "3"});
}

// A ring of two ranks sends the reduce-scatter's first chunks of later rounds ahead
// (ringAhead in src/coll/algorithms.cpp), as far as the two FIFOs hold without any kernel
// buffering. Here the kernel buffers of a direction (2 streams x 64 KiB sent + 64 KiB
// received, RIDGE_SOCKET_BUFFER=32K) hold a quarter of one 1 MiB chunk, so a lead beyond
// what the FIFOs hold deadlocks (RIDGE_TIMEOUT, 30 s) instead of hiding in the socket
// buffers: 2 slots (lead 1) and 4 (lead 2), both ranks direct and one slots only, 64 MiB
// allreduce and reduce-scatter in float32, in place and out of place (32 and 16 rounds).
bool ringReduceCase(const Case& c) {
  return (c.coll == kAllReduce || c.coll == kReduceScatter) && c.dt == ridgeFloat32 && c.op == ridgeSum;
}
constexpr const char* kRingReduce = "allreduce:0-:ring;reducescatter:0-:ring";
TEST(SocketOneHost, RingLeadWithinFifosTwoSlots) {
  runDirectMatrix(2, kRingReduce, -1, {"1M", "2", "32K", true}, ringReduceCase);
  runDirectMatrix(2, kRingReduce, 1, {"1M", "2", "32K", true}, ringReduceCase);
}
TEST(SocketOneHost, RingLeadWithinFifosFourSlots) {
  runDirectMatrix(2, kRingReduce, -1, {"1M", "4", "32K", true}, ringReduceCase);
  runDirectMatrix(2, kRingReduce, 0, {"1M", "4", "32K", true}, ringReduceCase);
}

// An allgather or alltoall of two ranks sends its own chunks of later rounds ahead of its
// receives (exchangeAhead in src/coll/algorithms.cpp, issue 21), as far as the two FIFOs
// hold without kernel buffering. As above, the kernel buffers of a direction hold a quarter
// of one 1 MiB chunk, so a lead beyond what the FIFOs hold deadlocks (RIDGE_TIMEOUT)
// instead of hiding in the socket buffers: 4 slots (lead 2) and 8 (lead 6), the ring
// allgather and the all-pairs forms, both ranks direct and one slots only, 64 MiB in
// float32, in place and out of place. (SocketRace.TwoRankExchangeSendsAheadOfItsReceives
// shows that the sends do go ahead.)
bool exchangeLargeCase(const Case& c) {
  return exchangeCase(c) && c.dt == ridgeFloat32;
}
constexpr const char* kRingGatherPairsAlltoall = "allgather:0-:ring;alltoall:0-:allpairs";
TEST(SocketOneHost, ExchangeLeadWithinFifosFourSlots) {
  runDirectMatrix(2, kRingGatherPairsAlltoall, -1, {"1M", "4", "32K", true}, exchangeLargeCase);
  runDirectMatrix(2, kAllPairsExchange, 1, {"1M", "4", "32K", true}, exchangeLargeCase);
}
TEST(SocketOneHost, ExchangeLeadWithinFifosEightSlots) {
  runDirectMatrix(2, kAllPairsExchange, -1, {"1M", "8", "32K", true}, exchangeLargeCase);
  runDirectMatrix(2, kRingGatherPairsAlltoall, 0, {"1M", "8", "32K", true}, exchangeLargeCase);
}

// A receive whose sender sends one byte more or one byte less fails with
// ridgeInvalidUsage naming the sizes, and nothing is written past the receive buffer
// (the oversized last chunk must not land in it).
TEST(SocketOneHost, DirectRecvSizeMismatch) {
  oneHostEnv();
  constexpr size_t kBytes = 300000;  // a 256 KiB chunk and a short one
  constexpr size_t kGuard = 4096;
  for (int delta : {1, -1}) {
    ridgeUniqueId id;
    if (!makeUniqueId(&id)) return;
    LaunchResult res = launchRanks(2, 60, [&](int rank, Reporter& rep) {
      ridgeComm_t comm = initRank(2, id, rank, rep);
      if (!comm) return 2;
      if (rank == 1) {
        std::vector<uint8_t> msg(kBytes + delta, 0x11);
        ridgeResult_t r = ridgeSend(msg.data(), msg.size(), ridgeInt8, 0, comm, nullptr);
        if (r != ridgeSuccess) rep.fail("rank 1", "send failed: " + describeResult(r));
        ridgeCommDestroy(comm);
        return 0;
      }
      std::vector<uint8_t> buf(kBytes + kGuard, 0x5a);
      ridgeResult_t r = ridgeRecv(buf.data(), kBytes, ridgeInt8, 1, comm, nullptr);
      rep.line("RECV " + std::to_string(r) + " " + ridgeGetLastError(comm));
      for (size_t i = kBytes; i < buf.size(); ++i)
        if (buf[i] != 0x5a) {
          rep.fail("rank 0", "byte " + std::to_string(i) + " past the receive buffer was written");
          break;
        }
      ridgeCommAbort(comm);
      return 0;
    });
    reportChildFailures(res, "direct recv size mismatch");
    SCOPED_TRACE("sender sends " + std::to_string(delta) + " byte(s) more");
    expectResultLine(res.ranks[0], "RECV ", ridgeInvalidUsage, "does not match the size");
  }
}

// A send of whole chunks goes straight from the user's buffer, so ridgeSend may return
// only once the transport has handed all of it to the kernel: the sender overwrites its
// buffer right after the call (the last chunk first), and the receiver must still get what
// was sent. The socket buffers (RIDGE_SOCKET_BUFFER=32K) hold a few percent of one 1 MiB
// chunk, so a send that returned with chunks still queued would lose the last of them.
TEST(SocketOneHost, DirectSendBufferReusableAfterReturn) {
  oneHostEnv();
  setenv("RIDGE_SOCKET_BUFFER", "32K", 1);
  constexpr size_t kBytes = 16u << 20;
  constexpr size_t kTail = 1u << 20;
  ridgeUniqueId id;
  const bool idOk = makeUniqueId(&id);
  unsetenv("RIDGE_SOCKET_BUFFER");
  if (!idOk) return;
  LaunchResult res = launchRanks(2, 60, [&](int rank, Reporter& rep) {
    setenv("RIDGE_SOCKET_BUFFER", "32K", 1);
    ridgeComm_t comm = initRank(2, id, rank, rep);
    if (!comm) return 2;
    std::vector<uint8_t> buf(kBytes);
    auto expected = [](size_t i) { return static_cast<uint8_t>((i * 2654435761u) >> 24); };
    if (rank == 0) {
      for (size_t i = 0; i < kBytes; ++i) buf[i] = expected(i);
      ridgeResult_t r = ridgeSend(buf.data(), kBytes, ridgeInt8, 1, comm, nullptr);
      std::memset(buf.data() + kBytes - kTail, 0xee, kTail);
      std::memset(buf.data(), 0xee, kBytes - kTail);
      if (r != ridgeSuccess) rep.fail("rank 0", "send failed: " + describeResult(r));
    } else {
      ridgeResult_t r = ridgeRecv(buf.data(), kBytes, ridgeInt8, 0, comm, nullptr);
      if (r != ridgeSuccess) rep.fail("rank 1", "recv failed: " + describeResult(r));
      for (size_t i = 0; i < kBytes; ++i)
        if (buf[i] != expected(i)) {
          rep.fail("rank 1", "byte " + std::to_string(i) + " differs from what was sent");
          break;
        }
    }
    ridgeResult_t d = ridgeCommDestroy(comm);
    if (d != ridgeSuccess) rep.fail("rank " + std::to_string(rank), "destroy: " + describeResult(d));
    return 0;
  });
  reportChildFailures(res, "direct send buffer reuse");
}

// A receive that times out (the sender is stopped before it sends) must leave the user's
// buffer alone afterwards: its destinations were declared to the transport, and when the
// sender resumes and sends, nothing may land there once ridgeRecv has returned.
TEST(SocketOneHost, DirectRecvWithdrawnAfterTimeout) {
  ridgeUniqueId id;
  if (!faultTestId(&id)) return;
  constexpr size_t kBytes = 1 << 20;
  double tPoisoned = 0;
  LaunchResult res = launchRanks(
      2, 40,
      [&](int rank, Reporter& rep) {
        ridgeComm_t comm = initRank(2, id, rank, rep);
        if (!comm) return 2;
        if (rank == 1) {
          rep.line("STOPPING");
          raise(SIGSTOP);  // resumed by the test once rank 0 gave up and poisoned its buffer
          std::vector<uint8_t> msg(kBytes, 0x11);
          ridgeSend(msg.data(), msg.size(), ridgeInt8, 0, comm, nullptr);
          ridgeCommDestroy(comm);
          return 0;
        }
        std::vector<uint8_t> buf(kBytes, 0);
        const double t0 = nowSec();
        ridgeResult_t r = ridgeRecv(buf.data(), kBytes, ridgeInt8, 1, comm, nullptr);
        rep.line("RESULT " + std::to_string(r) + " " + fmtD(nowSec() - t0));
        poisonAndReportChanges(buf, rep);
        ridgeCommAbort(comm);
        return 0;
      },
      [&](int rank, const std::string& line, double t, LaunchControl& ctl) {
        if (rank == 0 && line == "POISONED") {
          ctl.killRank(1, SIGCONT);
          tPoisoned = t;
        }
      });
  reportChildFailures(res, "direct recv withdrawn", false);
  ASSERT_GT(tPoisoned, 0) << "rank 0 never returned from the receive";
  Outcome o = outcomeOf(res.ranks[0]);
  EXPECT_EQ(o.code, ridgeTimeout) << resultName(static_cast<ridgeResult_t>(o.code));
  EXPECT_LT(o.seconds, kFaultTimeout + kFaultMargin);
  auto changed = linesWith(res.ranks[0], "CHANGED ");
  ASSERT_EQ(changed.size(), 1u);
  EXPECT_EQ(changed[0], "0") << "bytes landed in the user buffer after ridgeRecv returned";
}

// 2 ranks on one host over sockets (every chunk of the ring direct): the survivor of a
// peer killed in the middle of a 64 MiB allreduce fails within RIDGE_TIMEOUT.
TEST(SocketOneHost, KilledPeerMidDirectAllReduce) {
  ridgeUniqueId id;
  if (!faultTestId(&id)) return;
  double tKill = 0, tResult = 0;
  LaunchResult res = launchRanks(
      2, 40,
      [&](int rank, Reporter& rep) {
        ridgeComm_t comm = initRank(2, id, rank, rep);
        if (!comm) return 2;
        return allreduceUntilError(comm, rank, rep, 200);
      },
      [&](int rank, const std::string& line, double t, LaunchControl& ctl) {
        if (rank == 1 && line == "ITER 0" && tKill == 0) {
          usleep(20 * 1000);
          ctl.killRank(1, SIGKILL);
          tKill = nowSec();
        }
        if (rank == 0 && line.rfind("RESULT ", 0) == 0) tResult = t;
      });
  reportChildFailures(res, "killed peer", false);
  ASSERT_GT(tKill, 0);
  Outcome o = outcomeOf(res.ranks[0]);
  ASSERT_TRUE(o.seen) << "rank 0 never got an error";
  EXPECT_TRUE(o.code == ridgeRemoteError || o.code == ridgeTimeout)
      << resultName(static_cast<ridgeResult_t>(o.code));
  EXPECT_LT(tResult - tKill, kFaultTimeout + kFaultMargin);
  std::printf("rank 0: %s %.2f s after the kill: %s\n", resultName(static_cast<ridgeResult_t>(o.code)),
              tResult - tKill, o.text.c_str());
}

// The ranks of one namespace are SIGKILLed in the middle of a 64 MiB allreduce; the ranks
// of the other namespace must fail with ridgeRemoteError or ridgeTimeout within
// RIDGE_TIMEOUT (+ margin), naming the lost peer.
TEST(SocketNetns, KilledHostMidCollective) {
  NETNS_SKIP_WITHOUT_PRIVILEGE();
  netns::Fabric fabric;
  std::string err;
  ASSERT_TRUE(fabric.create(2, &err)) << err;
  constexpr int n = 4;
  double tKill = 0, tResult[2] = {0, 0};
  LaunchResult res = fabric.launch(
      n, netns::blockPlacement(n, 2), {{"RIDGE_TIMEOUT", std::to_string(kFaultTimeout)}}, 40,
      [&](int rank, Reporter& rep) {
        ridgeComm_t comm = netns::initFromEnv(rank, rep);
        if (!comm) return 2;
        return allreduceUntilError(comm, rank, rep, 200);
      },
      [&](int rank, const std::string& line, double t, LaunchControl& ctl) {
        if (rank == 2 && line == "ITER 0" && tKill == 0) {
          usleep(20 * 1000);  // ranks 2 and 3 are inside the next allreduce by now
          ctl.killRank(2, SIGKILL);
          ctl.killRank(3, SIGKILL);
          tKill = nowSec();
        }
        if (rank < 2 && line.rfind("RESULT ", 0) == 0) tResult[rank] = t;
      });
  reportChildFailures(res, "killed host", false);
  EXPECT_FALSE(res.timedOut) << "survivors hung";
  ASSERT_GT(tKill, 0) << "no allreduce completed before the kill";
  for (int r = 0; r < 2; ++r) {
    Outcome o = outcomeOf(res.ranks[r]);
    ASSERT_TRUE(o.seen) << "rank " << r << " never got an error";
    EXPECT_TRUE(o.code == ridgeRemoteError || o.code == ridgeTimeout)
        << "rank " << r << " got " << resultName(static_cast<ridgeResult_t>(o.code));
    EXPECT_LT(tResult[r] - tKill, kFaultTimeout + kFaultMargin) << "rank " << r << " took too long to notice";
    EXPECT_FALSE(o.text.empty());
    std::printf("rank %d: %s %.2f s after the kill: %s\n", r, resultName(static_cast<ridgeResult_t>(o.code)),
                tResult[r] - tKill, o.text.c_str());
  }
}

// Chunks of one piece (below two minimum pieces) and chunks striped over both streams in
// turn. A stream with no piece in a one-piece chunk still had to look at that slot to
// learn so; when the other stream finished the chunk first, the slot was handed back and
// refilled before the idle stream got there, and it then sent a piece of the refilled
// slot's chunk under the old sequence number ("malformed piece header"; about one
// ridge-bench sendrecv run in five at 64 MiB). A slot is now handed back only once every
// stream has passed it. Two slots make the refill as quick as it can be.
TEST(SocketOneHost, OnePieceChunksBetweenStripedOnes) {
  oneHostEnv();
  setenv("RIDGE_SOCKET_SLOTS", "2", 1);
  setenv("RIDGE_SOCKET_CHUNK", "256K", 1);
  ridgeUniqueId id;
  const bool haveId = makeUniqueId(&id);
  unsetenv("RIDGE_SOCKET_SLOTS");
  unsetenv("RIDGE_SOCKET_CHUNK");
  if (!haveId) return;
  constexpr int kRounds = 400;
  constexpr size_t kSmall = 1000;     // one chunk of one piece
  constexpr size_t kLarge = 4 << 18;  // four chunks of two pieces (256 KiB each)
  LaunchResult res = launchRanks(2, 120, [&](int rank, Reporter& rep) {
    setenv("RIDGE_SOCKET_SLOTS", "2", 1);
    setenv("RIDGE_SOCKET_CHUNK", "256K", 1);
    ridgeComm_t comm = initRank(2, id, rank, rep);
    if (!comm) return 2;
    const int peer = 1 - rank;
    std::vector<uint32_t> tx(kLarge / 4), rx(kLarge / 4);
    for (int round = 0; round < kRounds; ++round) {
      for (size_t bytes : {kSmall, kLarge}) {
        const size_t n = bytes / 4;
        for (size_t i = 0; i < n; ++i) tx[i] = static_cast<uint32_t>(round * 1000003u + i * 7u + rank);
        std::fill(rx.begin(), rx.begin() + n, 0xA5A5A5A5u);
        ridgeGroupStart();
        ridgeSend(tx.data(), n, ridgeUint32, peer, comm, nullptr);
        ridgeRecv(rx.data(), n, ridgeUint32, peer, comm, nullptr);
        const ridgeResult_t r = ridgeGroupEnd();
        if (r != ridgeSuccess) {
          rep.fail("round " + std::to_string(round), std::string("send/recv: ") + ridgeGetLastError(comm));
          ridgeCommDestroy(comm);
          return 1;
        }
        for (size_t i = 0; i < n; ++i) {
          if (rx[i] != static_cast<uint32_t>(round * 1000003u + i * 7u + peer)) {
            rep.fail("round " + std::to_string(round), "wrong element " + std::to_string(i));
            ridgeCommDestroy(comm);
            return 1;
          }
        }
      }
    }
    ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, "one-piece chunks between striped ones");
}

// Two ranks whose RIDGE_SOCKET_STREAMS are `rank0` and `rank1` fail init on every rank with
// a message naming the setting, instead of misreading each other's streams later.
void expectStreamSettingsRefused(const char* rank0, const char* rank1, const char* what) {
  ridgeUniqueId id;
  if (!faultTestId(&id)) return;
  LaunchResult res = launchRanks(2, 30, [&](int rank, Reporter& rep) {
    setenv("RIDGE_SOCKET_STREAMS", rank == 0 ? rank0 : rank1, 1);
    ridgeComm_t comm = nullptr;
    ridgeResult_t r = ridgeCommInitRank(&comm, 2, id, rank);
    rep.line("INIT " + std::to_string(r) + " " + ridgeGetLastError(nullptr));
    if (r == ridgeSuccess) ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, what);
  for (const RankResult& rr : res.ranks)
    expectResultLine(rr, "INIT ", ridgeInvalidUsage, "RIDGE_SOCKET_STREAMS");
}

TEST(SocketOneHost, MismatchedSettingsFailInit) {
  expectStreamSettingsRefused("2", "3", "mismatched settings");
}

// One rank leaving the count to Ridge (0) and one naming the count it would pick: still
// refused, since an auto rank could have agreed on another count with further ranks.
TEST(SocketOneHost, AutoAndExplicitStreamCountsFailInit) {
  expectStreamSettingsRefused("0", "1", "auto and explicit stream counts");
}

// A peer that stops (SIGSTOP: alive, connections open, nothing moves) is caught by
// RIDGE_TIMEOUT: ridgeTimeout, not a hang.
TEST(SocketOneHost, StoppedPeerTimesOut) {
  ridgeUniqueId id;
  if (!faultTestId(&id)) return;
  double tStop = 0;
  LaunchResult res = launchRanks(
      2, 30,
      [&](int rank, Reporter& rep) {
        ridgeComm_t comm = initRank(2, id, rank, rep);
        if (!comm) return 2;
        return allreduceUntilError(comm, rank, rep, 200);
      },
      [&](int rank, const std::string& line, double, LaunchControl& ctl) {
        if (rank == 1 && line == "ITER 0" && tStop == 0) {
          ctl.killRank(1, SIGSTOP);
          tStop = nowSec();
        }
        if (rank == 0 && line.rfind("RESULT ", 0) == 0) ctl.killRank(1, SIGKILL);
      });
  reportChildFailures(res, "stopped peer", false);
  ASSERT_GT(tStop, 0) << "rank 1 never finished an allreduce";
  Outcome o = outcomeOf(res.ranks[0]);
  ASSERT_TRUE(o.seen) << "rank 0 never got an error";
  EXPECT_EQ(o.code, ridgeTimeout) << resultName(static_cast<ridgeResult_t>(o.code)) << ": " << o.text;
  EXPECT_LT(o.seconds, kFaultTimeout + kFaultMargin);
  std::printf("rank 0 after %.2f s: %s\n", o.seconds, o.text.c_str());
}

// Closes every TCP socket of this process with SO_LINGER 0, so the kernel answers with RST.
void resetAllTcpSockets() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return;
  std::vector<int> fds;
  int seen = 0;
  while (dirent* e = readdir(d)) {
    if (++seen > 4096) break;
    int fd = std::atoi(e->d_name);
    int type = 0;
    socklen_t len = sizeof type;
    if (fd > 2 && getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM)
      fds.push_back(fd);
  }
  closedir(d);
  for (int fd : fds) {
    linger l{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  }
}

// A peer whose connections are reset (RST, not an orderly close) while the other rank
// waits for it: the waiting rank fails at once with ridgeRemoteError and a message that
// names the socket transport, the peer and the reset.
TEST(SocketOneHost, ResetConnectionGivesClearError) {
  ridgeUniqueId id;
  if (!faultTestId(&id)) return;
  LaunchResult res = launchRanks(2, 30, [&](int rank, Reporter& rep) {
    ridgeComm_t comm = initRank(2, id, rank, rep);
    if (!comm) return 2;
    std::vector<float> buf(1 << 20, 1.0f);
    if (ridgeAllReduce(buf.data(), buf.data(), buf.size(), ridgeFloat32, ridgeSum, comm, nullptr) !=
        ridgeSuccess)
      rep.fail("rank " + std::to_string(rank), "first allreduce failed");
    if (rank == 1) {
      // Rank 0 is waiting in its next allreduce (or about to be) when the RST arrives.
      usleep(200 * 1000);
      resetAllTcpSockets();
      _exit(0);
    }
    return allreduceUntilError(comm, rank, rep, 1);
  });
  reportChildFailures(res, "reset", false);
  Outcome o = outcomeOf(res.ranks[0]);
  ASSERT_TRUE(o.seen) << "rank 0 never got an error";
  EXPECT_EQ(o.code, ridgeRemoteError) << resultName(static_cast<ridgeResult_t>(o.code)) << ": " << o.text;
  EXPECT_LT(o.seconds, kFaultTimeout) << "a reset must be reported at once, not by the timeout";
  EXPECT_NE(o.text.find("socket"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("rank 1"), std::string::npos) << o.text;
  EXPECT_TRUE(o.text.find("reset") != std::string::npos || o.text.find("closed") != std::string::npos)
      << o.text;
  std::printf("rank 0 after %.2f s: %s\n", o.seconds, o.text.c_str());
}

}  // namespace
}  // namespace ridgetest
