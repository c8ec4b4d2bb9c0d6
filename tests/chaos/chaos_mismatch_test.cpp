// Chaos: every kind of mismatched call between ranks (issue 19, item 1), on shared memory,
// TCP and the software NIC. Each case forks the ranks, lets them make calls that do not match
// (a different root, count, datatype, op or collective, a send nobody receives, sends and
// receives with the wrong peers) and checks that:
//   - every rank involved gets an error (ridgeInvalidUsage, or ridgeTimeout for a receive
//     whose sender sent elsewhere) within the timeout, never success or a hang;
//   - the message names both sides' calls;
//   - the communicator is then broken (ridgeCommGetAsyncError), so no later call eats stray
//     data;
//   - a correct allreduce on a fresh communicator afterwards is right (the "lost data" column
//     counts its wrong elements).
// Each case records one row of docs/reliability.md's table (chaos_record.h).
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "chaos_record.h"
#include "rank_launcher.h"

namespace ridgetest {
namespace {

constexpr int kTimeout = 10;  // RIDGE_TIMEOUT: no case should need it
constexpr double kHarness = 60.0;

enum class Wire { Shm, Tcp, Softnic };
const char* wireName(Wire w) {
  switch (w) {
    case Wire::Shm: return "shm";
    case Wire::Tcp: return "tcp";
    case Wire::Softnic: return "softnic";
  }
  return "?";
}

void wireEnv(Wire w) {
  setLoopbackEnv();
  setenv("RIDGE_TIMEOUT", std::to_string(kTimeout).c_str(), 1);
  unsetenv("RIDGE_NET");
  unsetenv("RIDGE_SHM");
  if (w == Wire::Tcp) {
    setenv("RIDGE_SHM", "0", 1);
    setenv("RIDGE_NET", "socket", 1);
  } else if (w == Wire::Softnic) {
    setenv("RIDGE_SHM", "0", 1);
    setenv("RIDGE_NET", "softnic", 1);
    setenv("RIDGE_SOFTNIC_RTO_US", "3000", 1);
  }
}

// What one rank calls in a case: the mismatched call, then (for the kinds where the mismatch
// only shows there) a correct-looking allreduce on the same communicator.
struct Call {
  enum Kind { AllReduce, Broadcast, AllGather, Send, Recv, None } kind = AllReduce;
  size_t count = 1024;
  ridgeDataType_t dtype = ridgeFloat32;
  ridgeRedOp_t op = ridgeSum;
  int root = 0;  // root, or peer for Send/Recv
};

struct Case {
  std::string name;   // test name suffix and table row
  std::string tried;  // the table's "tried" text
  int nranks = 2;
  std::vector<Call> first;     // per rank
  bool thenAllReduce = false;  // the mismatch shows in the following allreduce
  // Substrings the error of each rank must contain (both sides' calls).
  std::vector<std::vector<std::string>> expect;
  std::vector<ridgeResult_t> codes;  // expected error per rank
};

ridgeResult_t run(const Call& c, void* send, void* recv, ridgeComm_t comm) {
  switch (c.kind) {
    case Call::AllReduce: return ridgeAllReduce(send, recv, c.count, c.dtype, c.op, comm, nullptr);
    case Call::Broadcast: return ridgeBroadcast(send, recv, c.count, c.dtype, c.root, comm, nullptr);
    case Call::AllGather: return ridgeAllGather(send, recv, c.count, c.dtype, comm, nullptr);
    case Call::Send: return ridgeSend(send, c.count, c.dtype, c.root, comm, nullptr);
    case Call::Recv: return ridgeRecv(recv, c.count, c.dtype, c.root, comm, nullptr);
    case Call::None: return ridgeSuccess;
  }
  return ridgeInternalError;
}

// The rank body: mismatched call(s) on one communicator, then a correct allreduce on a fresh
// one. Lines: ERR <code> <message>, ASYNC <code>, WRONG <n>.
// Ranks that reported their error wait here for the others before tearing down (shared page
// mapped before the fork), as a job's ranks would report before exiting: a rank that found the
// mismatch first then never closes connections under a peer still reading its headers (that
// peer would report the closed connection instead of the mismatch).
std::atomic<int>* gReported = nullptr;

void waitForEveryRank(int nranks) {
  gReported->fetch_add(1);
  const double until = nowSec() + scaledSeconds(30);
  while (gReported->load() < nranks && nowSec() < until) usleep(1000);
}

int rankBody(const Case& k, const ridgeUniqueId& first, const ridgeUniqueId& second, int me, Reporter& rep) {
  ridgeComm_t comm = initRank(k.nranks, first, me, rep);
  if (!comm) return 2;
  const Call& c = k.first[static_cast<size_t>(me)];
  const size_t maxCount = 1u << 22;
  std::vector<float> send(maxCount * static_cast<size_t>(k.nranks), 1.0f), recv(send.size(), 0.0f);
  ridgeResult_t r = run(c, send.data(), recv.data(), comm);
  if (r == ridgeSuccess && k.thenAllReduce)
    r = ridgeAllReduce(send.data(), recv.data(), 1024, ridgeFloat32, ridgeSum, comm, nullptr);
  std::string msg = r == ridgeSuccess ? "" : ridgeGetLastError(comm);
  rep.line("ERR " + std::to_string(r) + " " + msg);
  ridgeResult_t async = ridgeSuccess;
  ridgeCommGetAsyncError(comm, &async);
  rep.line("ASYNC " + std::to_string(async));
  // A broken communicator refuses further calls instead of running them on stray data.
  if (r != ridgeSuccess) {
    const ridgeResult_t again =
        ridgeAllReduce(send.data(), recv.data(), 16, ridgeFloat32, ridgeSum, comm, nullptr);
    rep.line("AGAIN " + std::to_string(again));
  }
  waitForEveryRank(k.nranks);
  ridgeCommDestroy(comm);
  // A fresh communicator works and is right.
  ridgeComm_t fresh = initRank(k.nranks, second, me, rep);
  if (!fresh) return 3;
  const size_t n = 1u << 16;
  std::vector<float> in(n), out(n, -1.0f);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<float>((i % 97) + me);
  r = ridgeAllReduce(in.data(), out.data(), n, ridgeFloat32, ridgeSum, fresh, nullptr);
  long wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    double want = 0;
    for (int q = 0; q < k.nranks; ++q) want += static_cast<double>((i % 97) + q);
    wrong += static_cast<float>(want) != out[i] ? 1 : 0;
  }
  if (r != ridgeSuccess) {
    rep.fail("fresh allreduce", describeResult(r, fresh));
    wrong = static_cast<long>(n);
  }
  rep.line("WRONG " + std::to_string(wrong));
  ridgeCommDestroy(fresh);
  return 0;
}

std::vector<Case> buildCases() {
  std::vector<Case> cs;
  auto twoRanks = [&](const std::string& name, const std::string& tried, Call a, Call b,
                      std::vector<std::string> both) {
    Case k;
    k.name = name;
    k.tried = tried;
    k.first = {a, b};
    k.expect = {both, both};
    k.codes = {ridgeInvalidUsage, ridgeInvalidUsage};
    cs.push_back(k);
    return &cs.back();
  };
  Call bc0{Call::Broadcast};
  Call bc1 = bc0;
  bc1.root = 1;
  twoRanks("Root", "broadcast with root 0 on rank 0, root 1 on rank 1 (4 KiB)", bc0, bc1,
           {"broadcast #1(root 0, 1024 x float", "broadcast #1(root 1, 1024 x float"});
  Call bcBig0 = bc0, bcBig1 = bc1;
  bcBig0.count = bcBig1.count = 1u << 22;
  twoRanks("RootLarge",
           "broadcast with root 0 on rank 0, root 1 on rank 1 (16 MiB: both ranks fill their FIFOs)", bcBig0,
           bcBig1, {"root 0, 4194304 x float", "root 1, 4194304 x float"});
  Call ar{Call::AllReduce};
  Call arCount = ar;
  arCount.count = 2048;
  twoRanks("Count", "allreduce of 1024 floats on rank 0, 2048 on rank 1", ar, arCount,
           {"allreduce #1(1024 x float", "allreduce #1(2048 x float"});
  Call arBig = ar, arBig2 = ar;
  arBig.count = 1u << 20;
  arBig2.count = (1u << 20) + 4;
  twoRanks("CountLarge", "allreduce of 4 MiB on rank 0, 4 MiB + 16 bytes on rank 1", arBig, arBig2,
           {"allreduce #1(1048576 x float", "allreduce #1(1048580 x float"});
  Call arInt = ar;
  arInt.dtype = ridgeInt32;
  twoRanks("Datatype", "allreduce float32 on rank 0, int32 on rank 1 (same bytes)", ar, arInt,
           {"1024 x float, sum", "1024 x int32, sum"});
  Call arMax = ar;
  arMax.op = ridgeMax;
  twoRanks("Op", "allreduce sum on rank 0, max on rank 1", ar, arMax, {"float, sum)", "float, max)"});
  Call ag{Call::AllGather};
  twoRanks("Kind", "allreduce on rank 0, allgather (same count) on rank 1", ar, ag,
           {"allreduce #1(1024 x float, sum)", "allgather #1(1024 x float)"});
  {
    Call send{Call::Send};
    send.root = 1;
    Call none{Call::None};
    Case* k =
        twoRanks("SendWithoutRecv", "rank 0 sends 4 KiB to rank 1, which never receives; then both allreduce",
                 send, none, {"allreduce #1(1024 x float, sum)", "send"});
    k->thenAllReduce = true;
  }
  {
    // Rank 0 sends to rank 1, rank 1 waits for rank 2, rank 2 sends to rank 0 and goes on to
    // the allreduce: its header reaches rank 1's receive (rank 2 called allreduce, not send),
    // and ranks 0 and 2 disagree in the allreduce (rank 2 sent a message rank 0 never
    // received). Nobody waits for the timeout.
    Case k;
    k.name = "PeerMismatch";
    k.tried = "3 ranks: 0 sends to 1, 1 receives from 2, 2 sends to 0; then all allreduce";
    k.nranks = 3;
    Call s01{Call::Send};
    s01.root = 1;
    Call r12{Call::Recv};
    r12.root = 2;
    Call s20{Call::Send};
    s20.root = 0;
    k.first = {s01, r12, s20};
    k.thenAllReduce = true;
    k.expect = {{"allreduce #1(1024 x float, sum)"},
                {"recv #1(1024 x float from rank 2)", "rank 2 called allreduce #1"},
                {"allreduce #1(1024 x float, sum)"}};
    k.codes = {ridgeInvalidUsage, ridgeInvalidUsage, ridgeInvalidUsage};
    cs.push_back(k);
  }
  return cs;
}

void runCase(const Case& k, Wire w) {
  wireEnv(w);
  ridgeUniqueId first, second;
  if (!makeUniqueId(&first) || !makeUniqueId(&second)) return;
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  gReported = new (page) std::atomic<int>(0);
  LaunchResult res = launchRanks(k.nranks, kHarness,
                                 [&](int me, Reporter& rep) { return rankBody(k, first, second, me, rep); });
  reportChildFailures(res, k.name, true);
  EXPECT_FALSE(res.timedOut) << "hung";
  long lost = 0;
  bool clean = !res.timedOut;
  for (int r = 0; r < k.nranks; ++r) {
    const RankResult& rr = res.ranks[static_cast<size_t>(r)];
    auto errs = linesWith(rr, "ERR ");
    ASSERT_EQ(errs.size(), 1u) << "rank " << r << " reported no result";
    const int code = std::atoi(errs[0].c_str());
    const std::string msg = errs[0].substr(errs[0].find(' ') + 1);
    std::printf("rank %d: %s: %s\n", r, resultName(static_cast<ridgeResult_t>(code)), msg.c_str());
    EXPECT_EQ(code, k.codes[static_cast<size_t>(r)]) << "rank " << r << ": " << msg;
    clean = clean && code == k.codes[static_cast<size_t>(r)];
    for (const std::string& want : k.expect[static_cast<size_t>(r)]) {
      EXPECT_NE(msg.find(want), std::string::npos)
          << "rank " << r << " message lacks \"" << want << "\": " << msg;
      clean = clean && msg.find(want) != std::string::npos;
    }
    auto async = linesWith(rr, "ASYNC ");
    ASSERT_EQ(async.size(), 1u);
    EXPECT_NE(std::atoi(async[0].c_str()), ridgeSuccess)
        << "rank " << r << ": communicator not marked broken";
    auto again = linesWith(rr, "AGAIN ");
    ASSERT_EQ(again.size(), 1u);
    EXPECT_NE(std::atoi(again[0].c_str()), ridgeSuccess)
        << "rank " << r << ": a broken communicator ran a call";
    auto wrong = linesWith(rr, "WRONG ");
    ASSERT_EQ(wrong.size(), 1u);
    lost += std::atol(wrong[0].c_str());
  }
  EXPECT_EQ(lost, 0);
  munmap(page, 4096);
  ridge::chaos::record(std::string("mismatch/") + wireName(w), k.tried,
                       clean ? ridge::chaos::Outcome::kCleanError : ridge::chaos::Outcome::kRanCorrectly,
                       lost, 0);
}

class ChaosMismatch : public ::testing::TestWithParam<std::tuple<int, Wire>> {};

TEST_P(ChaosMismatch, FailsOnEveryRank) {
  static const std::vector<Case> cases = buildCases();
  const auto [index, wire] = GetParam();
  runCase(cases[static_cast<size_t>(index)], wire);
}

std::string caseName(const ::testing::TestParamInfo<std::tuple<int, Wire>>& info) {
  static const std::vector<Case> cases = buildCases();
  const Wire w = std::get<1>(info.param);
  std::string wire = w == Wire::Shm ? "Shm" : w == Wire::Tcp ? "Tcp" : "Softnic";
  return cases[static_cast<size_t>(std::get<0>(info.param))].name + "_" + wire;
}

INSTANTIATE_TEST_SUITE_P(Kinds, ChaosMismatch,
                         ::testing::Combine(::testing::Range(0, 9),
                                            ::testing::Values(Wire::Shm, Wire::Tcp, Wire::Softnic)),
                         caseName);

TEST(ChaosMismatchCases, ListMatchesTheInstantiation) {
  EXPECT_EQ(buildCases().size(), 9u);
}

}  // namespace
}  // namespace ridgetest
