// Operation signatures and hang diagnosis (issue 19, items 1, 2 and 7): a timeout names the
// operation, its sequence number and the rank that did not arrive; ridgeCommDumpState and
// RIDGE_DEBUG_DUMP=SIGUSR1 print every communicator's state while a job hangs; overlapping
// non-in-place buffers are refused; matching sends, receives and collectives in groups still
// run (and count their sequence numbers alike on both sides).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "rank_launcher.h"

namespace ridgetest {
namespace {

constexpr int kTimeout = 2;  // RIDGE_TIMEOUT for the cases that wait for it

// Reads what `fd` has (non-blocking after the writer finished).
std::string drain(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// Rank 2 stops (SIGSTOP, sent to itself) before the third allreduce; ranks 0 and 1 must time
// out naming allreduce #3 and rank 2, and print the state dump while they wait.
TEST(CollSignature, TimeoutNamesTheRankThatDidNotArrive) {
  setLoopbackEnv();
  setenv("RIDGE_TIMEOUT", std::to_string(kTimeout).c_str(), 1);
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  constexpr int n = 3;
  LaunchResult res = launchRanks(
      n, 40.0,
      [&](int me, Reporter& rep) {
        ridgeComm_t comm = initRank(n, id, me, rep);
        if (!comm) return 2;
        std::vector<float> buf(4096, 1.0f);
        for (int iter = 0; iter < 3; ++iter) {
          if (me == 2 && iter == 2) raise(SIGSTOP);  // the parent's harness kills it at the end
          std::fill(buf.begin(), buf.end(), 1.0f);
          const ridgeResult_t r =
              ridgeAllReduce(buf.data(), buf.data(), buf.size(), ridgeFloat32, ridgeSum, comm, nullptr);
          if (r != ridgeSuccess) {
            rep.line("ERR " + std::to_string(r) + " " + ridgeGetLastError(comm));
            int p[2];
            if (pipe(p) == 0) {
              ridgeCommDumpState(comm, p[1]);
              close(p[1]);
              rep.line("DUMP " + drain(p[0]));
              close(p[0]);
            }
            ridgeCommAbort(comm);
            return 0;
          }
          if (buf[0] != 3.0f) rep.fail("allreduce " + std::to_string(iter), "wrong sum");
        }
        ridgeCommDestroy(comm);
        return 0;
      },
      [](int rank, const std::string& line, double, LaunchControl& ctl) {
        // Both survivors reported: the stopped rank can go.
        static int reported = 0;
        if (line.rfind("ERR ", 0) == 0 && rank != 2 && ++reported == 2) ctl.killRank(2, SIGKILL);
      });
  for (int r = 0; r < 2; ++r) {
    auto errs = linesWith(res.ranks[static_cast<size_t>(r)], "ERR ");
    ASSERT_EQ(errs.size(), 1u) << "rank " << r << " did not time out";
    std::printf("rank %d: %s\n", r, errs[0].c_str());
    EXPECT_EQ(std::atoi(errs[0].c_str()), ridgeTimeout);
    EXPECT_NE(errs[0].find("allreduce #3(4096 x float, sum)"), std::string::npos) << errs[0];
    EXPECT_NE(errs[0].find("rank(s) 2 did not arrive"), std::string::npos) << errs[0];
    EXPECT_NE(errs[0].find("latest collective seen from them: #2"), std::string::npos) << errs[0];
    auto dump = linesWith(res.ranks[static_cast<size_t>(r)], "DUMP ");
    ASSERT_EQ(dump.size(), 1u);
    std::printf("rank %d dump: %s\n", r, dump[0].c_str());
    EXPECT_NE(dump[0].find("rank " + std::to_string(r) + " of 3"), std::string::npos) << dump[0];
    EXPECT_NE(dump[0].find("2:#2"), std::string::npos) << "the dump should show rank 2 behind: " << dump[0];
  }
}

// RIDGE_DEBUG_DUMP=SIGUSR1: the signal prints the state of every communicator to stderr while
// a collective waits for a peer that has not arrived.
TEST(CollSignature, SignalPrintsStateWhileWaiting) {
  setLoopbackEnv();
  setenv("RIDGE_TIMEOUT", "20", 1);
  setenv("RIDGE_DEBUG_DUMP", "SIGUSR1", 1);
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  unsetenv("RIDGE_DEBUG_DUMP");
  LaunchResult res = launchRanks(
      2, 40.0,
      [&](int me, Reporter& rep) {
        setenv("RIDGE_DEBUG_DUMP", "SIGUSR1", 1);
        // stderr into a pipe this rank reads after the dump.
        int p[2];
        if (pipe(p) != 0) return 2;
        dup2(p[1], 2);
        close(p[1]);
        ridgeComm_t comm = initRank(2, id, me, rep);
        if (!comm) return 2;
        std::vector<float> buf(256, 1.0f);
        if (me == 1) {
          // Rank 1 joins only when the parent's hook sends SIGUSR2, after rank 0 dumped.
          signal(SIGUSR2, [](int) {});
          sigset_t block, old;
          sigemptyset(&block);
          sigaddset(&block, SIGUSR2);
          sigprocmask(SIG_BLOCK, &block, &old);
          rep.line("WAITING");
          sigset_t wait = old;
          sigdelset(&wait, SIGUSR2);
          sigsuspend(&wait);
          sigprocmask(SIG_SETMASK, &old, nullptr);
        } else {
          rep.line("WAITING");
        }
        const ridgeResult_t r =
            ridgeAllReduce(buf.data(), buf.data(), buf.size(), ridgeFloat32, ridgeSum, comm, nullptr);
        rep.line("RESULT " + std::to_string(r));
        if (me == 0) {
          fcntl(p[0], F_SETFL, O_NONBLOCK);
          const std::string err = drain(p[0]);
          const size_t at = err.find("ridge state dump");
          rep.line("DUMP " + (at == std::string::npos ? std::string("none") : err.substr(at)));
        }
        ridgeCommDestroy(comm);
        return 0;
      },
      [](int, const std::string& line, double, LaunchControl& ctl) {
        static int waiting = 0;
        if (line == "WAITING" && ++waiting == 2) {
          // Rank 0 is (about to be) blocked in the allreduce: ask it for its state, then let rank 1 go.
          usleep(300000);
          ctl.killRank(0, SIGUSR1);
          usleep(300000);
          ctl.killRank(1, SIGUSR2);
        }
      });
  unsetenv("RIDGE_DEBUG_DUMP");
  auto dump = linesWith(res.ranks[0], "DUMP ");
  ASSERT_EQ(dump.size(), 1u);
  std::printf("%s\n", dump[0].c_str());
  EXPECT_NE(dump[0].find("in allreduce #1(256 x float, sum)"), std::string::npos) << dump[0];
  EXPECT_NE(dump[0].find("1:#0"), std::string::npos) << "rank 1 has not arrived: " << dump[0];
}

// Overlapping buffers that are not the in-place form are refused on every rank that has them.
TEST(CollSignature, OverlappingBuffersAreRefused) {
  setLoopbackEnv();
  setenv("RIDGE_TIMEOUT", "20", 1);
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(2, 40.0, [&](int me, Reporter& rep) {
    ridgeComm_t comm = initRank(2, id, me, rep);
    if (!comm) return 2;
    std::vector<float> buf(2048, 1.0f);
    ridgeResult_t r =
        ridgeAllReduce(buf.data(), buf.data() + 16, 1024, ridgeFloat32, ridgeSum, comm, nullptr);
    rep.line("OVERLAP " + std::to_string(r) + " " + ridgeGetLastError(comm));
    ridgeCommDestroy(comm);
    return 0;
  });
  for (int r = 0; r < 2; ++r) {
    auto lines = linesWith(res.ranks[static_cast<size_t>(r)], "OVERLAP ");
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(std::atoi(lines[0].c_str()), ridgeInvalidUsage) << lines[0];
    EXPECT_NE(lines[0].find("overlap"), std::string::npos) << lines[0];
  }
}

// Signatures count sends, receives and collectives alike on both sides: a long mixed series
// (groups of exchanges, collectives in between, in-place allgather) runs right.
TEST(CollSignature, MatchingMixedSeriesRuns) {
  setLoopbackEnv();
  setenv("RIDGE_TIMEOUT", "20", 1);
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  constexpr int n = 3;
  LaunchResult res = launchRanks(n, 60.0, [&](int me, Reporter& rep) {
    ridgeComm_t comm = initRank(n, id, me, rep);
    if (!comm) return 2;
    const size_t count = 5000;
    std::vector<float> a(count * n), b(count * n);
    for (int iter = 0; iter < 20; ++iter) {
      const int to = (me + 1) % n, from = (me + n - 1) % n;
      for (size_t i = 0; i < count; ++i) a[i] = static_cast<float>(me * 1000 + iter);
      ridgeGroupStart();
      ridgeSend(a.data(), count, ridgeFloat32, to, comm, nullptr);
      ridgeRecv(b.data(), count, ridgeFloat32, from, comm, nullptr);
      ridgeResult_t r = ridgeGroupEnd();
      if (r != ridgeSuccess) {
        rep.fail("exchange", describeResult(r, comm));
        break;
      }
      if (b[0] != static_cast<float>(from * 1000 + iter) || b[count - 1] != b[0])
        rep.fail("exchange", "wrong data");
      // In-place allgather: sendbuff == recvbuff + rank * count.
      for (size_t i = 0; i < count; ++i)
        a[static_cast<size_t>(me) * count + i] = static_cast<float>(me + iter);
      r = ridgeAllGather(a.data() + static_cast<size_t>(me) * count, a.data(), count, ridgeFloat32, comm,
                         nullptr);
      if (r != ridgeSuccess) {
        rep.fail("allgather", describeResult(r, comm));
        break;
      }
      for (int q = 0; q < n; ++q)
        if (a[static_cast<size_t>(q) * count] != static_cast<float>(q + iter))
          rep.fail("allgather", "wrong block");
      if (me == 0) r = ridgeSend(a.data(), 10, ridgeInt32, 2, comm, nullptr);
      if (me == 2) r = ridgeRecv(b.data(), 40, ridgeInt8, 0, comm, nullptr);  // same bytes
      if (r != ridgeSuccess) {
        rep.fail("send/recv", describeResult(r, comm));
        break;
      }
    }
    ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, "mixed series", true);
}

}  // namespace
}  // namespace ridgetest

namespace ridgetest {
namespace {

// Regression: a strand waiting for a peer's header while the executor's idle poll checked and
// released that header then took the next chunk (the direct algorithm's buffer descriptor) for
// the header and failed a matching call ("32 bytes of data, not its call's header"). Without
// spinning the idle poll runs often; 2 x 300 alternating direct and small allreduces hit it.
TEST(CollSignature, HeaderTakenByIdlePollWhileAwaited) {
  setLoopbackEnv();
  setenv("RIDGE_TIMEOUT", "30", 1);
  setenv("RIDGE_SPIN_US", "0", 1);
  ridgeUniqueId id;
  const bool ok = makeUniqueId(&id);
  unsetenv("RIDGE_SPIN_US");
  if (!ok) return;
  LaunchResult res = launchRanks(2, 120.0, [&](int me, Reporter& rep) {
    setenv("RIDGE_SPIN_US", "0", 1);
    ridgeComm_t comm = initRank(2, id, me, rep);
    if (!comm) return 2;
    const size_t n = 65536;  // 256 KiB: the direct (CMA) algorithm where available, else the ring
    std::vector<float> big(n), one(1);
    for (int iter = 0; iter < 300; ++iter) {
      std::fill(big.begin(), big.end(), static_cast<float>(me + iter));
      ridgeResult_t r = ridgeAllReduce(big.data(), big.data(), n, ridgeFloat32, ridgeSum, comm, nullptr);
      if (r == ridgeSuccess)
        r = ridgeAllReduce(one.data(), one.data(), 1, ridgeFloat32, ridgeSum, comm, nullptr);
      if (r != ridgeSuccess) {
        rep.fail("iteration " + std::to_string(iter), describeResult(r, comm));
        break;
      }
      if (big[0] != static_cast<float>(1 + 2 * iter) || big[n - 1] != big[0])
        rep.fail("allreduce", "wrong sum");
    }
    ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, "alternating allreduces", true);
}

}  // namespace
}  // namespace ridgetest
