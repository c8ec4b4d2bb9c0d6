// Failures of peers: a rank that exits in the middle of a series of allreduces, a rank
// killed with SIGKILL inside a large allreduce, a rank that never arrives at init, and
// ridgeCommAbort releasing a thread blocked in a collective or a send. Every wait is
// bounded: the survivors must report an error within RIDGE_TIMEOUT + 5 s, and the harness
// kills everything after 30 s.
#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "rank_launcher.h"
#include "test_data.h"
#include "time_scale.h"

namespace ridgetest {
namespace {

constexpr int kTimeout = 3;      // RIDGE_TIMEOUT for these tests
constexpr double kMargin = 5.0;  // allowed on top of it
constexpr double kHarnessLimit = 30.0;

bool isPeerFailure(ridgeResult_t r) {
  return r == ridgeRemoteError || r == ridgeTimeout;
}

void faultEnv() {
  setLoopbackEnv();
  setenv("RIDGE_TIMEOUT", std::to_string(kTimeout).c_str(), 1);
}

/** Parses "RESULT <code> <seconds>" lines. */
struct Outcome {
  bool seen = false;
  int code = -1;
  double seconds = 0;
};
Outcome outcomeOf(const RankResult& rr, const char* tag) {
  Outcome o;
  for (const std::string& s : linesWith(rr, tag)) {
    o.seen = true;
    std::sscanf(s.c_str(), "%d %lf", &o.code, &o.seconds);
  }
  return o;
}

// Rank 2 leaves with _exit(0) right before the 3rd of a series of 16 MiB allreduces.
TEST(CollFault, RankExitsBeforeThirdAllReduce) {
  faultEnv();
  constexpr int n = 3;
  constexpr size_t count = (16u << 20) / 4;
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(n, kHarnessLimit, [&](int me, Reporter& rep) {
    ridgeComm_t comm = initRank(n, id, me, rep);
    if (!comm) return 2;
    std::vector<float> buf(count);
    for (int iter = 0; iter < 8; ++iter) {
      if (me == 2 && iter == 2) _exit(0);
      std::fill(buf.begin(), buf.end(), 1.0f);
      const double t0 = nowSec();
      ridgeResult_t r = ridgeAllReduce(buf.data(), buf.data(), count, ridgeFloat32, ridgeSum, comm, nullptr);
      const double dt = nowSec() - t0;
      if (r != ridgeSuccess) {
        if (iter < 2)
          rep.fail("allreduce " + std::to_string(iter),
                   "failed before the peer left: " + describeResult(r, comm));
        rep.line("RESULT " + std::to_string(r) + " " + fmtD(dt));
        rep.line("LASTERROR " + std::string(ridgeGetLastError(comm)));
        ridgeResult_t async = ridgeSuccess;
        ridgeResult_t ar = ridgeCommGetAsyncError(comm, &async);
        rep.line("ASYNC " + std::to_string(ar) + " " + std::to_string(async));
        const double td = nowSec();
        ridgeResult_t dr = ridgeCommDestroy(comm);
        rep.line("DESTROY " + std::to_string(dr) + " " + fmtD(nowSec() - td));
        return 0;
      }
      if (buf[0] != 3.0f || buf[count - 1] != 3.0f)
        rep.fail("allreduce " + std::to_string(iter), "wrong sum");
    }
    rep.fail("rank " + std::to_string(me), "8 allreduces succeeded although rank 2 left after 2");
    ridgeCommDestroy(comm);
    return 1;
  });
  reportChildFailures(res, "exit-before-third", false);
  EXPECT_FALSE(res.timedOut) << "survivors hung";
  EXPECT_TRUE(res.ranks[2].exited && res.ranks[2].exitCode == 0);
  for (int r = 0; r < 2; ++r) {
    const RankResult& rr = res.ranks[r];
    Outcome o = outcomeOf(rr, "RESULT ");
    ASSERT_TRUE(o.seen) << "rank " << r << " never got an error";
    EXPECT_TRUE(isPeerFailure(static_cast<ridgeResult_t>(o.code)))
        << "rank " << r << " got " << resultName(static_cast<ridgeResult_t>(o.code));
    EXPECT_LT(o.seconds, kTimeout + kMargin) << "rank " << r << " took too long to notice";
    std::printf("rank %d: %s after %.2f s\n", r, resultName(static_cast<ridgeResult_t>(o.code)), o.seconds);
    auto last = linesWith(rr, "LASTERROR ");
    ASSERT_EQ(last.size(), 1u);
    EXPECT_FALSE(last[0].empty()) << "ridgeGetLastError empty after a peer failure";
    std::printf("rank %d last error: %s\n", r, last[0].c_str());
    auto async = linesWith(rr, "ASYNC ");
    ASSERT_EQ(async.size(), 1u);
    int ar = -1, av = -1;
    std::sscanf(async[0].c_str(), "%d %d", &ar, &av);
    EXPECT_EQ(ar, ridgeSuccess);
    EXPECT_TRUE(isPeerFailure(static_cast<ridgeResult_t>(av)))
        << "ridgeCommGetAsyncError reports " << resultName(static_cast<ridgeResult_t>(av))
        << " on a communicator that lost a peer";
    Outcome d = outcomeOf(rr, "DESTROY ");
    ASSERT_TRUE(d.seen);
    EXPECT_LT(d.seconds, kTimeout + kMargin) << "ridgeCommDestroy with a dead peer took too long";
  }
}

// Rank 2 is killed by the parent while it is inside a 64 MiB allreduce.
TEST(CollFault, RankKilledDuringLargeAllReduce) {
  faultEnv();
  constexpr int n = 3;
  constexpr size_t count = (64u << 20) / 4;
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  double tKill = 0;
  double tResult[2] = {0, 0};
  LaunchResult res = launchRanks(
      n, kHarnessLimit,
      [&](int me, Reporter& rep) {
        ridgeComm_t comm = initRank(n, id, me, rep);
        if (!comm) return 2;
        std::vector<float> buf(count, 1.0f);
        for (int iter = 0; iter < 100; ++iter) {
          ridgeResult_t r =
              ridgeAllReduce(buf.data(), buf.data(), count, ridgeFloat32, ridgeMax, comm, nullptr);
          if (r != ridgeSuccess) {
            rep.line("RESULT " + std::to_string(r) + " 0");
            ridgeCommAbort(comm);
            return 0;
          }
          rep.line("ITER " + std::to_string(iter));
        }
        rep.fail("rank " + std::to_string(me), "100 allreduces succeeded although rank 2 was killed");
        return 1;
      },
      [&](int rank, const std::string& line, double t, LaunchControl& ctl) {
        if (rank == 2 && line == "ITER 0" && tKill == 0) {
          usleep(30 * 1000);  // rank 2 is inside its next allreduce by now
          ctl.killRank(2, SIGKILL);
          tKill = nowSec();
        }
        if (rank < 2 && line.rfind("RESULT ", 0) == 0) tResult[rank] = t;
      });
  reportChildFailures(res, "sigkill", false);
  EXPECT_FALSE(res.timedOut) << "survivors hung";
  ASSERT_GT(tKill, 0) << "rank 2 never completed its first allreduce";
  EXPECT_EQ(res.ranks[2].termSignal, SIGKILL);
  for (int r = 0; r < 2; ++r) {
    Outcome o = outcomeOf(res.ranks[r], "RESULT ");
    ASSERT_TRUE(o.seen) << "rank " << r << " never got an error";
    EXPECT_TRUE(isPeerFailure(static_cast<ridgeResult_t>(o.code)))
        << "rank " << r << " got " << resultName(static_cast<ridgeResult_t>(o.code));
    const double detect = tResult[r] - tKill;
    std::printf("rank %d: %s %.2f s after the kill\n", r, resultName(static_cast<ridgeResult_t>(o.code)),
                detect);
    EXPECT_LT(detect, kTimeout + kMargin);
    EXPECT_TRUE(res.ranks[r].exited && res.ranks[r].exitCode == 0);
  }
}

// Rank 2 of 3 never calls init: the others fail with ridgeTimeout within the timeout.
TEST(CollFault, RankNeverArrivesAtInit) {
  faultEnv();
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(2, kHarnessLimit, [&](int me, Reporter& rep) {
    ridgeComm_t comm = nullptr;
    const double t0 = nowSec();
    ridgeResult_t r = ridgeCommInitRank(&comm, 3, id, me);
    rep.line("RESULT " + std::to_string(r) + " " + fmtD(nowSec() - t0));
    rep.line("LASTERROR " + std::string(ridgeGetLastError(nullptr)));
    if (r == ridgeSuccess) ridgeCommAbort(comm);
    return 0;
  });
  reportChildFailures(res, "missing rank");
  for (int r = 0; r < 2; ++r) {
    Outcome o = outcomeOf(res.ranks[r], "RESULT ");
    ASSERT_TRUE(o.seen) << "rank " << r << " did not return from init";
    EXPECT_EQ(o.code, ridgeTimeout) << "rank " << r << " got "
                                    << resultName(static_cast<ridgeResult_t>(o.code));
    EXPECT_LT(o.seconds, kTimeout + kMargin);
    EXPECT_GT(o.seconds, kTimeout - 1.0) << "gave up long before RIDGE_TIMEOUT";
    auto last = linesWith(res.ranks[r], "LASTERROR ");
    ASSERT_EQ(last.size(), 1u);
    EXPECT_FALSE(last[0].empty());
    std::printf("rank %d: %s after %.2f s: %s\n", r, resultName(static_cast<ridgeResult_t>(o.code)),
                o.seconds, last[0].c_str());
  }
}

/**
 * Rank 0 blocks in `op` on a thread; its peer (rank 1) is alive but never calls it. The
 * main thread of rank 0 aborts the communicator; the blocked call must return ridgeAborted.
 * Rank 1 waits on a pipe until rank 0 is done, so the peer stays alive throughout.
 */
void abortReleasesBlockedCall(bool useSend) {
  setLoopbackEnv();
  setenv("RIDGE_TIMEOUT", "30", 1);  // far beyond the test: only the abort can release it
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  int done[2];
  ASSERT_EQ(pipe(done), 0);
  LaunchResult res = launchRanks(2, kHarnessLimit, [&](int me, Reporter& rep) {
    ridgeComm_t comm = initRank(2, id, me, rep);
    if (!comm) return 2;
    if (me == 1) {
      close(done[1]);
      pollfd p{done[0], POLLIN, 0};
      poll(&p, 1, 20000);  // rank 0 writes a byte when it is finished
      return 0;            // never touches the communicator again (the child _exits)
    }
    close(done[0]);
    const size_t count = 1u << 20;  // 4 MiB: no eager path can finish it alone
    std::vector<float> buf(count, 1.0f);
    std::atomic<bool> returned{false};
    std::promise<ridgeResult_t> prom;
    std::future<ridgeResult_t> fut = prom.get_future();
    std::thread t([&] {
      ridgeResult_t r =
          useSend ? ridgeSend(buf.data(), count, ridgeFloat32, 1, comm, nullptr)
                  : ridgeAllReduce(buf.data(), buf.data(), count, ridgeFloat32, ridgeSum, comm, nullptr);
      returned = true;
      prom.set_value(r);
    });
    usleep(700 * 1000);
    if (returned) rep.fail("abort", "the call returned before the abort although the peer never joined");
    const double t0 = nowSec();
    ridgeResult_t ar = ridgeCommAbort(comm);
    if (ar != ridgeSuccess) rep.fail("abort", "ridgeCommAbort -> " + describeResult(ar));
    if (fut.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      rep.fail("abort", "blocked call not released 10 s after ridgeCommAbort");
      rep.line("EXIT 1");
      _exit(1);  // cannot join the stuck thread
    }
    const ridgeResult_t r = fut.get();
    t.join();
    rep.line("RESULT " + std::to_string(r) + " " + fmtD(nowSec() - t0));
    if (write(done[1], "x", 1) != 1) rep.fail("abort", "cannot signal rank 1");
    return 0;
  });
  close(done[0]);
  close(done[1]);
  reportChildFailures(res, useSend ? "abort blocked send" : "abort blocked allreduce");
  Outcome o = outcomeOf(res.ranks[0], "RESULT ");
  ASSERT_TRUE(o.seen);
  EXPECT_EQ(o.code, ridgeAborted) << "blocked call returned "
                                  << resultName(static_cast<ridgeResult_t>(o.code));
  EXPECT_LT(o.seconds, ridgetest::scaledSeconds(5.0)) << "release after abort took too long";
  std::printf("released with %s %.3f s after ridgeCommAbort\n",
              resultName(static_cast<ridgeResult_t>(o.code)), o.seconds);
}

TEST(CollFault, AbortReleasesBlockedAllReduce) {
  abortReleasesBlockedCall(false);
}
TEST(CollFault, AbortReleasesBlockedSend) {
  abortReleasesBlockedCall(true);
}

}  // namespace
// Regression: a rank that finished everything it had with us and exited is no error while
// we still wait for another, live rank. Rank 0 sends to rank 1 and leaves at once; rank 2
// sends to rank 1 only 500 ms later, long enough for rank 1 to go to sleep and run its
// peer health check. Before the check was limited to the peers a blocked operation waits
// for, rank 1 failed here with "rank 0 has exited" (seen as a flaky matrix test).
TEST(CollFault, FinishedPeerThatExitedIsNoError) {
  faultEnv();
  constexpr int n = 3;
  constexpr size_t count = 16;
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(n, kHarnessLimit, [&](int me, Reporter& rep) {
    ridgeComm_t comm = initRank(n, id, me, rep);
    if (!comm) return 2;
    std::vector<float> buf(count, static_cast<float>(me + 1));
    if (me == 0 || me == 2) {
      if (me == 2) std::this_thread::sleep_for(std::chrono::milliseconds(500));
      ridgeResult_t r = ridgeSend(buf.data(), count, ridgeFloat32, 1, comm, nullptr);
      if (r != ridgeSuccess) rep.fail("send", describeResult(r, comm));
      ridgeCommDestroy(comm);
      return 0;
    }
    for (int from : {0, 2}) {
      std::vector<float> got(count, -1.0f);
      ridgeResult_t r = ridgeRecv(got.data(), count, ridgeFloat32, from, comm, nullptr);
      if (r != ridgeSuccess) {
        rep.fail("recv from " + std::to_string(from), describeResult(r, comm));
      } else if (got[0] != static_cast<float>(from + 1) || got[count - 1] != static_cast<float>(from + 1)) {
        rep.fail("recv from " + std::to_string(from), "wrong data");
      }
    }
    ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, "finished-peer-exit");
}

}  // namespace ridgetest
