// The calls of NCCL 2.28's host API that Ridge added for frameworks (issue 16): split, init
// of several ranks in one process, shrink (with a dead rank), in-place broadcast, gather and
// scatter, PreMulSum operators, ridgeMemAlloc and buffer registration. Ranks are forked
// processes (rank_launcher.h) or, for ridgeCommInitAll, threads. Every result is checked
// against values computed here; outputs are poisoned first.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <thread>

#include "rank_launcher.h"

namespace ridgetest {
namespace {

// The value rank r contributes at index i (exact in float and int32).
int32_t valueOf(int r, size_t i) {
  return static_cast<int32_t>((i * 7 + r * 1000 + 3) % 4099) - 2000;
}

// Allreduce of valueOf over `members` (old ranks) on `comm`, checked; "" or what went wrong.
std::string checkSumOfMembers(ridgeComm_t comm, int oldRank, const std::vector<int>& members) {
  const size_t count = 777;
  std::vector<int32_t> in(count), out(count, -1);
  for (size_t i = 0; i < count; ++i) in[i] = valueOf(oldRank, i);
  ridgeResult_t r = ridgeAllReduce(in.data(), out.data(), count, ridgeInt32, ridgeSum, comm, nullptr);
  if (r != ridgeSuccess) return "allreduce: " + describeResult(r);
  for (size_t i = 0; i < count; ++i) {
    int64_t want = 0;
    for (int m : members) want += valueOf(m, i);
    if (out[i] != want)
      return "allreduce wrong at " + std::to_string(i) + ": " + std::to_string(out[i]) +
             " != " + std::to_string(want);
  }
  return "";
}

std::string queries(ridgeComm_t comm, int wantRank, int wantSize) {
  int n = -1, me = -1;
  if (ridgeCommCount(comm, &n) != ridgeSuccess || ridgeCommUserRank(comm, &me) != ridgeSuccess)
    return "queries failed: " + std::string(ridgeGetLastError(nullptr));
  if (n != wantSize || me != wantRank)
    return "rank " + std::to_string(me) + " of " + std::to_string(n) + ", expected " +
           std::to_string(wantRank) + " of " + std::to_string(wantSize);
  return "";
}

// Polls a non-blocking communicator (bounded) until it has finished connecting; its state.
ridgeResult_t waitReady(ridgeComm_t comm) {
  ridgeResult_t state = ridgeInProgress;
  const double t0 = nowSec();
  while (state == ridgeInProgress && nowSec() - t0 < scaledSeconds(20.0)) {
    if (ridgeCommGetAsyncError(comm, &state) != ridgeSuccess) break;
    if (state == ridgeInProgress) usleep(1000);
  }
  return state;
}

// A shrunk communicator of old ranks 0 and 1: its rank, its size and an allreduce checked, then
// destroyed.
void checkPairAndDestroy(ridgeComm_t small, int me, Reporter& rep) {
  std::string e = queries(small, me, 2);
  if (!e.empty()) rep.fail("queries", e);
  e = checkSumOfMembers(small, me, {0, 1});
  if (!e.empty()) rep.fail("allreduce", e);
  ridgeCommDestroy(small);
}

// Forks n ranks, each with a communicator of the n, and runs body(comm, rank, reporter) on
// each (which destroys the communicator); the ranks fail when the id or the init fails.
LaunchResult launchWithComms(int n, double timeoutSec,
                             const std::function<int(ridgeComm_t, int, Reporter&)>& body) {
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return LaunchResult{};
  return launchRanks(n, timeoutSec, [&](int me, Reporter& rep) {
    ridgeComm_t comm = initRank(n, id, me, rep);
    return comm ? body(comm, me, rep) : 2;
  });
}

// ---- split ------------------------------------------------------------------------------------

// 4 ranks: colors {0, 1, 0, NOCOLOR}, keys reverse the order, so color 0 is (old 2, old 0).
TEST(CommSplit, ColorsKeysAndNoColor) {
  constexpr int n = 4;
  LaunchResult res = launchWithComms(n, 90, [&](ridgeComm_t comm, int me, Reporter& rep) {
    const int color = me == 3 ? RIDGE_SPLIT_NOCOLOR : me % 2;
    ridgeComm_t sub = reinterpret_cast<ridgeComm_t>(0x1);  // poisoned: split must write it
    ridgeResult_t r = ridgeCommSplit(comm, color, n - me, &sub, nullptr);
    if (r != ridgeSuccess) {
      rep.fail("split", describeResult(r));
      return 1;
    }
    if (me == 3) {
      if (sub != nullptr) rep.fail("split", "NOCOLOR rank got a communicator");
    } else if (!sub) {
      rep.fail("split", "no communicator");
    } else {
      const std::vector<int> members = color == 0 ? std::vector<int>{2, 0} : std::vector<int>{1};
      const int newRank = static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
      std::string e = queries(sub, newRank, static_cast<int>(members.size()));
      if (!e.empty()) rep.fail("split queries", e);
      e = checkSumOfMembers(sub, me, members);
      if (!e.empty()) rep.fail("split allreduce", e);
      if ((r = ridgeCommDestroy(sub)) != ridgeSuccess) rep.fail("destroy sub", describeResult(r));
    }
    // The parent is untouched.
    std::string e = checkSumOfMembers(comm, me, {0, 1, 2, 3});
    if (!e.empty()) rep.fail("parent after split", e);
    if ((r = ridgeCommDestroy(comm)) != ridgeSuccess) rep.fail("destroy", describeResult(r));
    return 0;
  });
  reportChildFailures(res, "split");
}

TEST(CommSplit, NonBlockingConfigReachesSuccess) {
  constexpr int n = 2;
  LaunchResult res = launchWithComms(n, 60, [&](ridgeComm_t comm, int me, Reporter& rep) {
    ridgeConfig_t cfg = RIDGE_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.commName = "split-nonblocking";
    ridgeComm_t sub = nullptr;
    ridgeResult_t r = ridgeCommSplit(comm, 5, 0, &sub, &cfg);
    if ((r != ridgeSuccess && r != ridgeInProgress) || !sub) {
      rep.fail("split", describeResult(r));
      return 1;
    }
    const ridgeResult_t state = waitReady(sub);
    if (state != ridgeSuccess) rep.fail("async", describeResult(state));
    std::string e = checkSumOfMembers(sub, me, {0, 1});
    if (!e.empty()) rep.fail("allreduce", e);
    ridgeCommDestroy(sub);
    ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, "split non-blocking");
}

// ---- init of several ranks in one process ----------------------------------------------------

TEST(CommInitAll, ThreeRanksInThreadsRunCollectives) {
  constexpr int n = 3;
  ridgeComm_t comms[n] = {};
  ASSERT_EQ(ridgeCommInitAll(comms, n, nullptr), ridgeSuccess) << ridgeGetLastError(nullptr);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      errors[r] = queries(comms[r], r, n);
      if (errors[r].empty()) errors[r] = checkSumOfMembers(comms[r], r, {0, 1, 2});
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  for (int r = 0; r < n; ++r) EXPECT_EQ(ridgeCommDestroy(comms[r]), ridgeSuccess);
}

TEST(CommInitAll, OneRank) {
  ridgeComm_t comm = nullptr;
  ASSERT_EQ(ridgeCommInitAll(&comm, 1, nullptr), ridgeSuccess) << ridgeGetLastError(nullptr);
  EXPECT_EQ(queries(comm, 0, 1), "");
  EXPECT_EQ(checkSumOfMembers(comm, 0, {0}), "");
  EXPECT_EQ(ridgeCommDestroy(comm), ridgeSuccess);
}

// ---- shrink -----------------------------------------------------------------------------------

// Rank 2 of 3 dies (SIGKILL by itself) after init; the survivors shrink it away with
// RIDGE_SHRINK_ABORT and go on with a 2-rank communicator.
TEST(CommShrink, SurvivorsGoOnAfterARankDied) {
  constexpr int n = 3;
  LaunchResult res = launchWithComms(n, 90, [&](ridgeComm_t comm, int me, Reporter& rep) {
    std::string e = checkSumOfMembers(comm, me, {0, 1, 2});
    if (!e.empty()) rep.fail("before", e);
    if (me == 2) {
      rep.line("DYING");
      raise(SIGKILL);
    }
    // The dead rank's collective fails (a remote error or timeout); the comm is then broken.
    std::vector<float> x(64, 1.0f);
    ridgeResult_t r = ridgeAllReduce(x.data(), x.data(), x.size(), ridgeFloat32, ridgeSum, comm, nullptr);
    if (r == ridgeSuccess) rep.fail("allreduce with a dead rank", "succeeded");
    const int dead[1] = {2};
    ridgeComm_t small = nullptr;
    r = ridgeCommShrink(comm, dead, 1, &small, nullptr, RIDGE_SHRINK_ABORT);
    if (r != ridgeSuccess || !small) {
      rep.fail("shrink", describeResult(r));
      return 1;
    }
    e = queries(small, me, 2);
    if (!e.empty()) rep.fail("shrunk queries", e);
    e = checkSumOfMembers(small, me, {0, 1});
    if (!e.empty()) rep.fail("shrunk allreduce", e);
    // The parent is broken (aborted) but can still be destroyed.
    ridgeCommDestroy(small);
    ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, "shrink after a death", /*expectCleanExit=*/false);
  ASSERT_EQ(res.ranks.size(), 3u);
  for (int r : {0, 1}) EXPECT_TRUE(res.ranks[r].exited && res.ranks[r].exitCode == 0) << "rank " << r;
  EXPECT_EQ(res.ranks[2].termSignal, SIGKILL);
}

// Without a death: 4 ranks drop ranks 0 and 2 (which do not call); new ranks keep the order.
TEST(CommShrink, ExcludedLiveRanksAndOrder) {
  constexpr int n = 4;
  LaunchResult res = launchWithComms(n, 90, [&](ridgeComm_t comm, int me, Reporter& rep) {
    if (me == 1 || me == 3) {
      const int ex[2] = {2, 0};
      ridgeComm_t small = nullptr;
      ridgeConfig_t cfg = RIDGE_CONFIG_INITIALIZER;
      cfg.commName = "shrunk";
      ridgeResult_t r = ridgeCommShrink(comm, ex, 2, &small, &cfg, RIDGE_SHRINK_DEFAULT);
      if (r != ridgeSuccess || !small) {
        rep.fail("shrink", describeResult(r));
        return 1;
      }
      std::string e = queries(small, me / 2, 2);
      if (!e.empty()) rep.fail("queries", e);
      e = checkSumOfMembers(small, me, {1, 3});
      if (!e.empty()) rep.fail("allreduce", e);
      ridgeCommDestroy(small);
    }
    // Everybody meets again on the parent, which shrink left working.
    std::string e = checkSumOfMembers(comm, me, {0, 1, 2, 3});
    if (!e.empty()) rep.fail("parent", e);
    ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, "shrink of live ranks");
}

// A non-blocking config: the survivors' meeting happens in the call, the new communicator
// connects in the background (ridgeInProgress, then ridgeCommGetAsyncError until ridgeSuccess).
TEST(CommShrink, NonBlockingConfigReachesSuccess) {
  constexpr int n = 3;
  LaunchResult res = launchWithComms(n, 90, [&](ridgeComm_t comm, int me, Reporter& rep) {
    if (me != 2) {
      const int ex[1] = {2};
      ridgeConfig_t cfg = RIDGE_CONFIG_INITIALIZER;
      cfg.blocking = 0;
      cfg.commName = "shrink-nonblocking";
      ridgeComm_t small = nullptr;
      ridgeResult_t r = ridgeCommShrink(comm, ex, 1, &small, &cfg, RIDGE_SHRINK_DEFAULT);
      if ((r != ridgeSuccess && r != ridgeInProgress) || !small) {
        rep.fail("shrink", describeResult(r));
        return 1;
      }
      const ridgeResult_t state = waitReady(small);
      if (state != ridgeSuccess) rep.fail("async", describeResult(state));
      checkPairAndDestroy(small, me, rep);
    }
    ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, "non-blocking shrink");
}

// Survivors reach the shrink up to one timeout apart (one gets a remote error at once, another
// waits out its timeout): they must still meet. The parent's timeout is T; one survivor arrives
// 1.5 T after the other, first the new rank 0 (which creates the new id), then a later rank.
// Rank 2 is excluded and only destroys the parent.
void shrinkWithOneLateSurvivor(int lateRank) {
  constexpr int n = 3;
  const int parentTimeout = scaledSeconds(2);
  ridgeUniqueId id;
  ASSERT_TRUE(makeUniqueId(&id));
  LaunchResult res = launchRanks(n, 90, [&](int me, Reporter& rep) {
    ridgeConfig_t parentCfg = RIDGE_CONFIG_INITIALIZER;
    parentCfg.timeoutSeconds = parentTimeout;
    ridgeComm_t comm = nullptr;
    ridgeResult_t r = ridgeCommInitRankConfig(&comm, n, id, me, &parentCfg);
    if (r != ridgeSuccess) {
      rep.fail("init", describeResult(r));
      return 1;
    }
    if (me != 2) {
      if (me == lateRank) usleep(static_cast<useconds_t>(parentTimeout * 1500000.0));
      const int ex[1] = {2};
      ridgeConfig_t cfg = RIDGE_CONFIG_INITIALIZER;
      cfg.timeoutSeconds = scaledSeconds(30);
      ridgeComm_t small = nullptr;
      const double t0 = nowSec();
      r = ridgeCommShrink(comm, ex, 1, &small, &cfg, RIDGE_SHRINK_DEFAULT);
      if (r != ridgeSuccess || !small) {
        rep.fail("shrink after " + std::to_string(nowSec() - t0) + " s", describeResult(r));
      } else {
        checkPairAndDestroy(small, me, rep);
      }
    }
    ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, "shrink with survivor " + std::to_string(lateRank) + " late");
}

TEST(CommShrink, NewRankZeroArrivingATimeoutAndAHalfLateStillMeets) {
  shrinkWithOneLateSurvivor(0);
}

TEST(CommShrink, OtherSurvivorArrivingATimeoutAndAHalfLateStillMeets) {
  shrinkWithOneLateSurvivor(1);
}

// Survivors that pass different lists (rank 0 drops {2, 3}, rank 1 drops {3}) both fail at once
// with ridgeInvalidUsage naming both lists, instead of waiting for each other's communicators;
// the parent still works afterwards.
TEST(CommShrink, DisagreeingListsFailAlikeWithBothLists) {
  constexpr int n = 4;
  const int timeout = scaledSeconds(10);
  LaunchResult res = launchWithComms(n, 90, [&](ridgeComm_t comm, int me, Reporter& rep) {
    if (me < 2) {
      const int ex0[2] = {2, 3}, ex1[1] = {3};
      ridgeComm_t small = reinterpret_cast<ridgeComm_t>(0x1);
      const double t0 = nowSec();
      ridgeResult_t r = me == 0 ? ridgeCommShrink(comm, ex0, 2, &small, nullptr, RIDGE_SHRINK_DEFAULT)
                                : ridgeCommShrink(comm, ex1, 1, &small, nullptr, RIDGE_SHRINK_DEFAULT);
      const double took = nowSec() - t0;
      const std::string text = ridgeGetLastError(comm);
      if (r != ridgeInvalidUsage) rep.fail("shrink", "expected ridgeInvalidUsage, got " + describeResult(r));
      if (small != nullptr) rep.fail("shrink", "*newcomm is not NULL after a failure");
      if (text.find("{2, 3}") == std::string::npos || text.find("{3}") == std::string::npos)
        rep.fail("shrink", "the message does not name both lists: " + text);
      if (took > timeout / 2.0) rep.fail("shrink", "took " + std::to_string(took) + " s: it waited");
    }
    std::string e = checkSumOfMembers(comm, me, {0, 1, 2, 3});
    if (!e.empty()) rep.fail("parent afterwards", e);
    ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, "disagreeing shrink lists");
}

// RIDGE_SHRINK_DEFAULT while another thread's allreduce is blocked on the parent: refused with
// ridgeInvalidUsage (the meeting would share the parent's bootstrap with that call); the call
// then completes normally once the peer joins it, and the parent goes on.
TEST(CommShrink, DefaultModeRefusesACallInFlight) {
  constexpr int n = 2;
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  LaunchResult res = launchWithComms(n, 90, [&](ridgeComm_t comm, int me, Reporter& rep) {
    if (me == 1) {
      pollfd p{go[0], POLLIN, 0};
      char byte = 0;
      if (poll(&p, 1, static_cast<int>(scaledSeconds(20.0) * 1000)) != 1 || read(go[0], &byte, 1) != 1)
        rep.fail("rank 1", "no word from rank 0");
      std::string e = checkSumOfMembers(comm, me, {0, 1});
      if (!e.empty()) rep.fail("joined allreduce", e);
    } else {
      std::string blocked;
      std::thread worker([&] { blocked = checkSumOfMembers(comm, me, {0, 1}); });
      // Wait (on the state dump, bounded) until the worker is inside its allreduce.
      int dump[2];
      bool inside = false;
      if (pipe(dump) == 0) {
        for (int i = 0; i < 2000 && !inside; ++i) {
          ridgeCommDumpState(comm, dump[1]);
          char buf[4096];
          const ssize_t got = read(dump[0], buf, sizeof buf - 1);
          inside = got > 0 && std::string(buf, static_cast<size_t>(got)).find("; in ") != std::string::npos;
          if (!inside) usleep(5000);
        }
        close(dump[0]);
        close(dump[1]);
      }
      if (!inside) rep.fail("rank 0", "the worker's allreduce never showed as running");
      ridgeComm_t small = reinterpret_cast<ridgeComm_t>(0x1);
      ridgeResult_t r = ridgeCommShrink(comm, nullptr, 0, &small, nullptr, RIDGE_SHRINK_DEFAULT);
      const std::string text = ridgeGetLastError(comm);
      if (r != ridgeInvalidUsage) rep.fail("shrink", "expected ridgeInvalidUsage, got " + describeResult(r));
      if (small != nullptr) rep.fail("shrink", "*newcomm is not NULL after a failure");
      if (text.find("in flight") == std::string::npos) rep.fail("shrink", "message: " + text);
      if (write(go[1], "g", 1) != 1) rep.fail("rank 0", "pipe write");
      worker.join();
      if (!blocked.empty()) rep.fail("the blocked allreduce", blocked);
    }
    std::string e = checkSumOfMembers(comm, me, {0, 1});
    if (!e.empty()) rep.fail("parent afterwards", e);
    ridgeCommDestroy(comm);
    return 0;
  });
  close(go[0]);
  close(go[1]);
  reportChildFailures(res, "default shrink with a call in flight");
}

// ridgeCommAbort on the parent from another thread while a shrink waits for a survivor that
// never comes (rank 1 does not call it): the shrink returns at once with ridgeAborted (or, had
// the abort come first, is refused as a call on a destroyed handle), the abort frees the parent
// after the shrink has left it, and nothing waits out the timeout.
TEST(CommShrink, AbortOfTheParentEndsAWaitingShrink) {
  constexpr int n = 3;
  LaunchResult res = launchWithComms(n, 90, [&](ridgeComm_t comm, int me, Reporter& rep) {
    if (me != 0) {
      // Ranks 1 and 2 stay out of it; rank 0's abort closes its connections to them.
      ridgeCommAbort(comm);
      return 0;
    }
    ridgeResult_t shrunk = ridgeInternalError;
    std::string text;
    double took = 0;
    std::thread shrinker([&] {
      const int ex[1] = {2};
      ridgeComm_t small = nullptr;
      const double t0 = nowSec();
      shrunk = ridgeCommShrink(comm, ex, 1, &small, nullptr, RIDGE_SHRINK_DEFAULT);
      took = nowSec() - t0;
      text = ridgeGetLastError(nullptr);
      if (small) ridgeCommDestroy(small);
    });
    usleep(200 * 1000);  // most likely inside the wait for rank 1; either order must be safe
    const double t0 = nowSec();
    ridgeResult_t aborted = ridgeCommAbort(comm);
    const double abortTook = nowSec() - t0;
    shrinker.join();
    if (aborted != ridgeSuccess) rep.fail("abort", describeResult(aborted));
    if (shrunk != ridgeAborted && shrunk != ridgeInvalidArgument)
      rep.fail("shrink", "expected ridgeAborted, got " + describeResult(shrunk) + ": " + text);
    if (took > scaledSeconds(5.0) || abortTook > scaledSeconds(5.0))
      rep.fail("timing",
               "shrink took " + std::to_string(took) + " s, abort " + std::to_string(abortTook) + " s");
    return 0;
  });
  reportChildFailures(res, "abort during a shrink");
}

// ---- broadcast in place, gather, scatter -------------------------------------------------------

TEST(RootedCollectives, BcastGatherScatterEveryRoot) {
  constexpr int n = 3;
  LaunchResult res = launchWithComms(n, 90, [&](ridgeComm_t comm, int me, Reporter& rep) {
    const size_t count = 1000;
    for (int root = 0; root < n; ++root) {
      const std::string where = "root " + std::to_string(root);
      std::vector<int32_t> b(count);
      for (size_t i = 0; i < count; ++i) b[i] = me == root ? valueOf(root, i) : -99;
      ridgeResult_t r = ridgeBcast(b.data(), count, ridgeInt32, root, comm, nullptr);
      if (r != ridgeSuccess) rep.fail("bcast " + where, describeResult(r));
      for (size_t i = 0; i < count && r == ridgeSuccess; ++i)
        if (b[i] != valueOf(root, i)) {
          rep.fail("bcast " + where, "wrong at " + std::to_string(i));
          break;
        }
      for (bool inPlace : {false, true}) {
        const std::string how = where + (inPlace ? " in place" : "");
        // Gather: rank q's block at q*count on root.
        std::vector<int32_t> all(count * n, -7), mine(count);
        for (size_t i = 0; i < count; ++i) mine[i] = valueOf(me, i);
        const int32_t* send = mine.data();
        if (inPlace && me == root) {
          std::copy(mine.begin(), mine.end(), all.begin() + root * count);
          send = all.data() + root * count;
        }
        r = ridgeGather(send, me == root ? all.data() : nullptr, count, ridgeInt32, root, comm, nullptr);
        if (r != ridgeSuccess) rep.fail("gather " + how, describeResult(r));
        if (me == root && r == ridgeSuccess) {
          for (int q = 0; q < n; ++q)
            for (size_t i = 0; i < count; ++i)
              if (all[q * count + i] != valueOf(q, i)) {
                rep.fail("gather " + how, "block " + std::to_string(q) + " wrong at " + std::to_string(i));
                q = n;
                break;
              }
        }
        // Scatter: root's block q goes to rank q.
        std::vector<int32_t> src(count * n), got(count, -5);
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < count; ++i) src[q * count + i] = valueOf(q + 10 * root, i);
        int32_t* recv = inPlace && me == root ? src.data() + root * count : got.data();
        r = ridgeScatter(me == root ? src.data() : nullptr, recv, count, ridgeInt32, root, comm, nullptr);
        if (r != ridgeSuccess) rep.fail("scatter " + how, describeResult(r));
        for (size_t i = 0; i < count && r == ridgeSuccess; ++i)
          if (recv[i] != valueOf(me + 10 * root, i)) {
            rep.fail("scatter " + how, "wrong at " + std::to_string(i));
            break;
          }
      }
    }
    ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, "bcast/gather/scatter");
}

// ---- PreMulSum ----------------------------------------------------------------------------------

// Rank r scales by (r + 1.5) (host immediate, float and double) or by an int32 read through a
// pointer at each call (ridgeScalarDevice residence on host memory: the value changes between
// calls and each call must see the current one).
TEST(PreMulSum, AllReduceReduceReduceScatter) {
  constexpr int n = 3;
  LaunchResult res = launchWithComms(n, 90, [&](ridgeComm_t comm, int me, Reporter& rep) {
    const size_t count = 999;
    // float, host immediate: allreduce, reduce to root 1, reduce-scatter.
    float kf = me + 1.5f;
    ridgeRedOp_t opf;
    ridgeResult_t r = ridgeRedOpCreatePreMulSum(&opf, &kf, ridgeFloat32, ridgeScalarHostImmediate, comm);
    if (r != ridgeSuccess) {
      rep.fail("create float", describeResult(r));
      return 1;
    }
    kf = 1000;  // copied at creation: must not matter
    std::vector<float> in(count * n), out(count * n, -1e30f);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(valueOf(me, i)) / 8;
    auto want = [&](size_t i) {
      double s = 0;
      for (int q = 0; q < n; ++q) s += (q + 1.5) * (static_cast<double>(valueOf(q, i)) / 8);
      return s;
    };
    auto close = [](double got, double ref) { return std::fabs(got - ref) <= 1e-5 * (1 + std::fabs(ref)); };
    r = ridgeAllReduce(in.data(), out.data(), count, ridgeFloat32, opf, comm, nullptr);
    for (size_t i = 0; i < count && r == ridgeSuccess; ++i)
      if (!close(out[i], want(i))) {
        rep.fail("allreduce premulsum", "wrong at " + std::to_string(i) + ": " + std::to_string(out[i]));
        break;
      }
    if (r != ridgeSuccess) rep.fail("allreduce premulsum", describeResult(r));
    // In place: the input is scaled into a buffer of its own, the output lands in place.
    std::vector<float> inplace(in.begin(), in.begin() + count);
    r = ridgeAllReduce(inplace.data(), inplace.data(), count, ridgeFloat32, opf, comm, nullptr);
    for (size_t i = 0; i < count && r == ridgeSuccess; ++i)
      if (!close(inplace[i], want(i))) {
        rep.fail("allreduce premulsum in place", "wrong at " + std::to_string(i));
        break;
      }
    std::fill(out.begin(), out.end(), -1e30f);
    r = ridgeReduce(in.data(), me == 1 ? out.data() : nullptr, count, ridgeFloat32, opf, 1, comm, nullptr);
    if (r != ridgeSuccess) rep.fail("reduce premulsum", describeResult(r));
    for (size_t i = 0; i < count && r == ridgeSuccess && me == 1; ++i)
      if (!close(out[i], want(i))) {
        rep.fail("reduce premulsum", "wrong at " + std::to_string(i));
        break;
      }
    std::fill(out.begin(), out.end(), -1e30f);
    r = ridgeReduceScatter(in.data(), out.data(), count, ridgeFloat32, opf, comm, nullptr);
    if (r != ridgeSuccess) rep.fail("reducescatter premulsum", describeResult(r));
    for (size_t i = 0; i < count && r == ridgeSuccess; ++i)
      if (!close(out[i], want(me * count + i))) {
        rep.fail("reducescatter premulsum", "wrong at " + std::to_string(i));
        break;
      }
    if ((r = ridgeRedOpDestroy(opf, comm)) != ridgeSuccess) rep.fail("destroy float op", describeResult(r));

    // int32 through a pointer, read per call; inside a group as well.
    int32_t ki = me + 2;
    ridgeRedOp_t opi;
    r = ridgeRedOpCreatePreMulSum(&opi, &ki, ridgeInt32, ridgeScalarDevice, comm);
    if (r != ridgeSuccess) {
      rep.fail("create int", describeResult(r));
      return 1;
    }
    for (int round = 0; round < 2; ++round) {
      ki = me + 2 + 10 * round;
      std::vector<int32_t> a(count), b(count, -1);
      for (size_t i = 0; i < count; ++i) a[i] = valueOf(me, i);
      ridgeGroupStart();
      r = ridgeAllReduce(a.data(), b.data(), count, ridgeInt32, opi, comm, nullptr);
      ridgeResult_t end = ridgeGroupEnd();
      if (r != ridgeSuccess || end != ridgeSuccess)
        rep.fail("int premulsum", describeResult(r != ridgeSuccess ? r : end));
      for (size_t i = 0; i < count; ++i) {
        int64_t w = 0;
        for (int q = 0; q < n; ++q) w += static_cast<int64_t>(q + 2 + 10 * round) * valueOf(q, i);
        if (b[i] != w) {
          rep.fail("int premulsum round " + std::to_string(round), "wrong at " + std::to_string(i));
          break;
        }
      }
    }
    ridgeRedOpDestroy(opi, comm);
    ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, "premulsum");
}

// ---- launchers: ridgeCommInitFromEnv ------------------------------------------------------

// A loopback port nobody listens on now (the kernel's pick, released again).
int freeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

// Forks n ranks that set rank/size through `rankVar`/`sizeVar` (plus RIDGE_ROOT_ADDR) and
// init from the environment; returns the children's results. sizeOf(rank) lets ranks disagree.
LaunchResult initFromEnv(int n, const char* rankVar, const char* sizeVar,
                         const std::function<int(int)>& sizeOf,
                         const std::function<int(ridgeResult_t, ridgeComm_t, int, Reporter&)>& check) {
  const int port = freeLoopbackPort();
  return launchRanks(n, 60, [&](int me, Reporter& rep) {
    for (const char* v : {"RIDGE_RANK", "RIDGE_WORLD_SIZE", "RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                          "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                          "MASTER_ADDR", "MASTER_PORT"})
      unsetenv(v);
    setenv(rankVar, std::to_string(me).c_str(), 1);
    setenv(sizeVar, std::to_string(sizeOf(me)).c_str(), 1);
    setenv("RIDGE_ROOT_ADDR", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
    setenv("RIDGE_TIMEOUT", "5", 1);
    ridgeComm_t comm = nullptr;
    ridgeResult_t r = ridgeCommInitFromEnv(&comm);
    return check(r, comm, me, rep);
  });
}

class LauncherEnv : public ::testing::TestWithParam<std::pair<const char*, const char*>> {};

TEST_P(LauncherEnv, RankAndSizeFromTheLaunchersVariables) {
  constexpr int n = 3;
  LaunchResult res = initFromEnv(
      n, GetParam().first, GetParam().second, [](int) { return n; },
      [](ridgeResult_t r, ridgeComm_t comm, int me, Reporter& rep) {
        if (r != ridgeSuccess) {
          rep.fail("init", describeResult(r));
          return 1;
        }
        std::string e = queries(comm, me, n);
        if (!e.empty()) rep.fail("queries", e);
        e = checkSumOfMembers(comm, me, {0, 1, 2});
        if (!e.empty()) rep.fail("allreduce", e);
        ridgeCommDestroy(comm);
        return 0;
      });
  reportChildFailures(res, GetParam().first);
}

INSTANTIATE_TEST_SUITE_P(Launchers, LauncherEnv,
                         ::testing::Values(std::make_pair("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                                           std::make_pair("PMI_RANK", "PMI_SIZE"),
                                           std::make_pair("SLURM_PROCID", "SLURM_NTASKS"),
                                           std::make_pair("RANK", "WORLD_SIZE")),
                         [](const auto& info) { return std::string(info.param.first).substr(0, 4); });

// RIDGE_RANK/RIDGE_WORLD_SIZE win over a launcher's variables (which here say something else).
TEST(LauncherEnvPrecedence, RidgeVariablesWin) {
  setenv("SLURM_PROCID", "7", 1);
  setenv("SLURM_NTASKS", "9", 1);
  LaunchResult res = initFromEnv(
      2, "RIDGE_RANK", "RIDGE_WORLD_SIZE", [](int) { return 2; },
      [](ridgeResult_t r, ridgeComm_t comm, int me, Reporter& rep) {
        if (r != ridgeSuccess) {
          rep.fail("init", describeResult(r));
          return 1;
        }
        std::string e = queries(comm, me, 2);
        if (!e.empty()) rep.fail("queries", e);
        ridgeCommDestroy(comm);
        return 0;
      });
  unsetenv("SLURM_PROCID");
  unsetenv("SLURM_NTASKS");
  reportChildFailures(res, "precedence");
}

// Rank 1 thinks there are 3 ranks, rank 0 that there are 2: both fail, and the message says
// that the world sizes differ (it used to blame "another job's" unique id).
TEST(LauncherEnvMismatch, WorldSizeMismatchIsReportedAsSuch) {
  LaunchResult res = initFromEnv(
      2, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", [](int me) { return me == 0 ? 2 : 3; },
      [](ridgeResult_t r, ridgeComm_t comm, int, Reporter& rep) {
        if (r == ridgeSuccess) {
          rep.fail("init", "succeeded with mismatched world sizes");
          ridgeCommDestroy(comm);
          return 1;
        }
        const std::string text = ridgeGetLastError(nullptr);
        rep.line("ERROR " + text);
        return 0;
      });
  reportChildFailures(res, "mismatch");
  int named = 0;
  for (const RankResult& rr : res.ranks)
    for (const std::string& text : linesWith(rr, "ERROR ")) {
      EXPECT_EQ(text.find("another job"), std::string::npos) << text;
      named += text.find("world size mismatch") != std::string::npos;
    }
  EXPECT_GE(named, 1) << "no rank's error names the world size mismatch";
}

// ---- memory and registration --------------------------------------------------------------------

TEST(MemAlloc, HostMemoryWithoutDeviceIsUsableAndFreed) {
  void* p = nullptr;
  ASSERT_EQ(ridgeMemAlloc(&p, 1 << 20), ridgeSuccess) << ridgeGetLastError(nullptr);
  ASSERT_NE(p, nullptr);
  int dev = 0;
  ridgeComm_t comm = nullptr;
  ASSERT_EQ(ridgeCommInitAll(&comm, 1, nullptr), ridgeSuccess);
  ASSERT_EQ(ridgeCommCuDevice(comm, &dev), ridgeSuccess);
  if (dev < 0) {
    // No device: host memory, page-aligned, and a collective may use it.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
    auto* f = static_cast<float*>(p);
    for (int i = 0; i < 1000; ++i) f[i] = static_cast<float>(i);
    EXPECT_EQ(ridgeAllReduce(f, f + 1000, 1000, ridgeFloat32, ridgeSum, comm, nullptr), ridgeSuccess);
    EXPECT_EQ(f[1999], 999.0f);
  }
  EXPECT_EQ(ridgeCommDestroy(comm), ridgeSuccess);
  EXPECT_EQ(ridgeMemFree(p), ridgeSuccess);
  EXPECT_EQ(ridgeMemFree(p), ridgeInvalidArgument);
}

// Registration handles are per communicator, overlapping ones are independent, and the
// collectives on registered buffers give the same results.
TEST(CommRegister, HandlesArePerCommunicatorAndCollectivesStillRight) {
  constexpr int n = 2;
  LaunchResult res = launchWithComms(n, 60, [&](ridgeComm_t comm, int me, Reporter& rep) {
    ridgeComm_t other = nullptr;
    ridgeResult_t r = ridgeCommSplit(comm, 0, me, &other, nullptr);
    if (r != ridgeSuccess) rep.fail("split", describeResult(r));
    std::vector<int32_t> buf(1 << 18);
    void *h1 = nullptr, *h2 = nullptr;
    if ((r = ridgeCommRegister(comm, buf.data(), buf.size() * 4, &h1)) != ridgeSuccess)
      rep.fail("register", describeResult(r));
    if ((r = ridgeCommRegister(comm, buf.data() + 100, 4000, &h2)) != ridgeSuccess)
      rep.fail("register overlap", describeResult(r));
    if (h1 == h2) rep.fail("register", "two registrations share a handle");
    if (other && ridgeCommDeregister(other, h1) != ridgeInvalidArgument)
      rep.fail("deregister", "another communicator's handle was accepted");
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = valueOf(me, i);
    std::vector<int32_t> out(buf.size(), -1);
    r = ridgeAllReduce(buf.data(), out.data(), buf.size(), ridgeInt32, ridgeSum, comm, nullptr);
    if (r != ridgeSuccess) rep.fail("allreduce", describeResult(r));
    for (size_t i = 0; i < buf.size() && r == ridgeSuccess; ++i)
      if (out[i] != valueOf(0, i) + valueOf(1, i)) {
        rep.fail("allreduce registered", "wrong at " + std::to_string(i));
        break;
      }
    if (ridgeCommDeregister(comm, h2) != ridgeSuccess) rep.fail("deregister h2", ridgeGetLastError(nullptr));
    if (ridgeCommDeregister(comm, h1) != ridgeSuccess) rep.fail("deregister h1", ridgeGetLastError(nullptr));
    if (other) ridgeCommDestroy(other);
    ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, "register");
}

}  // namespace
}  // namespace ridgetest

#include "api_test_main.h"
