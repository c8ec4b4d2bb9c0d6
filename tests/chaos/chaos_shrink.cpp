// Chaos: ridgeCommShrink lets the survivors go on (issue 19, item 7). Four forked ranks run
// checked allreduces; one of them is killed (kill -9) or stopped (SIGSTOP) in the middle, at
// every position including rank 0, on shared memory and on TCP (RIDGE_SHM=0 RIDGE_NET=socket),
// and twice on the software NIC (RIDGE_SHM=0 RIDGE_NET=softnic).
// The survivors notice it in one of three ways and shrink it away:
//   - kill -9: their call fails (a remote error, or RIDGE_TIMEOUT); they shrink with
//     RIDGE_SHRINK_DEFAULT, nothing being in flight any more;
//   - SIGSTOP, timeout: their call fails with ridgeTimeout after RIDGE_TIMEOUT; they shrink
//     with RIDGE_SHRINK_ABORT;
//   - SIGSTOP, watchdog: RIDGE_TIMEOUT is long, the collectives run on a worker thread and the
//     main thread, seeing no progress for a second, shrinks with RIDGE_SHRINK_ABORT while the
//     worker is still blocked in its allreduce, which must then return ridgeAborted.
// On the new communicator (ranks renumbered in order, transports built between survivors only)
// they run allreduce, broadcast from every root and allgather on random inputs into poisoned
// outputs, checked against references computed here (the allreduce in double). Then both
// communicators are destroyed and every survivor must hold the descriptors and threads it held
// before init, with no rendezvous thread left running. A stopped rank is let go on (SIGCONT)
// once the survivors are done: its pending call must fail within its timeout, and it too must
// end with nothing leaked. No /dev/shm segment of the job may remain. Each case records one row
// of docs/reliability.md's table (chaos_record.h), outcome "recovered".
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "chaos_record.h"
#include "chaos_resources.h"
#include "rank_launcher.h"
#include "ridge/ridge.h"
#include "ridge/ridge_emulated.h"

namespace {

using ridge::chaos::countOpenFds;
using ridge::chaos::countThreads;
using ridge::chaos::Outcome;
using ridge::chaos::shmSegmentsOf;

constexpr int kRanks = 4;
constexpr int kDetectTimeoutSec = 2;  // RIDGE_TIMEOUT when the timeout is how the fault shows

enum class Net { Shm, Tcp, Softnic };
enum class Fault { Kill, StopTimeout, StopWatchdog };

struct Case {
  Net net;
  Fault fault;
  int victim;
  int diesInShrink = -1;  // a survivor that dies as the shrink starts (the others shrink again)
};

const char* netName(Net n) {
  switch (n) {
    case Net::Shm: return "shm";
    case Net::Tcp: return "tcp";
    case Net::Softnic: return "softnic";
  }
  return "?";
}

const char* faultName(Fault f) {
  switch (f) {
    case Fault::Kill: return "kill";
    case Fault::StopTimeout: return "stop_timeout";
    case Fault::StopWatchdog: return "stop_watchdog";
  }
  return "?";
}

std::string caseName(const Case& c) {
  return std::string(netName(c.net)) + "_" + faultName(c.fault) + "_rank" + std::to_string(c.victim) +
         (c.diesInShrink >= 0 ? "_then_rank" + std::to_string(c.diesInShrink) + "_in_shrink" : "");
}

// RIDGE_TIMEOUT of the survivors in the watchdog cases: the watchdog, not the timeout, must act.
int watchdogTimeoutSec() {
  return ridgetest::scaledSeconds(60);
}

void setCaseEnv(const Case& c, bool victim) {
  setenv("RIDGE_SOCKET_IFNAME", "lo", 1);
  const int timeout = c.fault == Fault::StopWatchdog && !victim ? watchdogTimeoutSec() : kDetectTimeoutSec;
  setenv("RIDGE_TIMEOUT", std::to_string(timeout).c_str(), 1);
  setenv("RIDGE_SHM", c.net == Net::Shm ? "1" : "0", 1);
  setenv("RIDGE_NET", c.net == Net::Softnic ? "softnic" : "socket", 1);
}

// Random values in [-1, 1) that every rank can recompute for any (rank, purpose, size).
std::vector<float> randomValues(int oldRank, int purpose, size_t count) {
  std::mt19937 gen(static_cast<uint32_t>(0x5eed + oldRank * 7919 + purpose * 104729 + count));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = dist(gen);
  return v;
}

// The allreduce of the parent's loop: exact in float (small integers).
float loopValue(int rank, size_t i) {
  return static_cast<float>(rank + 1 + static_cast<int>(i % 5));
}
float loopSum(size_t i) {
  return static_cast<float>(kRanks * (kRanks + 1) / 2 + kRanks * static_cast<int>(i % 5));
}

// Allreduce, broadcast from every root and allgather on `comm` (whose ranks are the old ranks
// `members`, in order), at two sizes; elements found wrong (a failed call counts its whole
// output) are added to *wrong, and the first problem goes to *problem.
void checkCollectives(ridgeComm_t comm, int oldRank, const std::vector<int>& members, long* wrong,
                      std::string* problem) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int n = static_cast<int>(members.size());
  auto note = [&](const std::string& what, long bad) {
    *wrong += bad;
    if (bad && problem->empty()) *problem = what;
  };
  for (size_t count : {size_t{1000}, size_t{1} << 18}) {
    const std::string size = " of " + std::to_string(count) + " floats";
    // Allreduce (sum), against a double reference with a bound on float rounding.
    const std::vector<float> in = randomValues(oldRank, 1, count);
    std::vector<float> out(count, nan);
    ridgeResult_t rc = ridgeAllReduce(in.data(), out.data(), count, ridgeFloat32, ridgeSum, comm, nullptr);
    if (rc != ridgeSuccess) {
      note("allreduce" + size + ": " + ridgetest::describeResult(rc, comm), static_cast<long>(count));
    } else {
      std::vector<double> sum(count, 0.0), magnitude(count, 0.0);
      for (int m : members) {
        const std::vector<float> theirs = randomValues(m, 1, count);
        for (size_t i = 0; i < count; ++i) {
          sum[i] += theirs[i];
          magnitude[i] += std::fabs(theirs[i]);
        }
      }
      long bad = 0;
      for (size_t i = 0; i < count; ++i)
        bad += !(std::fabs(out[i] - sum[i]) <= 1e-6 * magnitude[i] * n + 1e-7);
      note("allreduce" + size + " wrong", bad);
    }
    // Broadcast from every root.
    for (int root = 0; root < n; ++root) {
      const std::vector<float> want = randomValues(members[root], 2, count);
      std::vector<float> buf = members[root] == oldRank ? want : std::vector<float>(count, nan);
      rc = ridgeBroadcast(buf.data(), buf.data(), count, ridgeFloat32, root, comm, nullptr);
      long bad = rc == ridgeSuccess ? 0 : static_cast<long>(count);
      for (size_t i = 0; rc == ridgeSuccess && i < count; ++i) bad += buf[i] != want[i];
      note("broadcast" + size + " from root " + std::to_string(root) + ": " +
               ridgetest::describeResult(rc, comm),
           bad);
    }
    // Allgather.
    const std::vector<float> mine = randomValues(oldRank, 3, count);
    std::vector<float> all(count * n, nan);
    rc = ridgeAllGather(mine.data(), all.data(), count, ridgeFloat32, comm, nullptr);
    long bad = rc == ridgeSuccess ? 0 : static_cast<long>(count * n);
    for (int b = 0; rc == ridgeSuccess && b < n; ++b) {
      const std::vector<float> want = randomValues(members[b], 3, count);
      for (size_t i = 0; i < count; ++i) bad += all[b * count + i] != want[i];
    }
    note("allgather" + size + ": " + ridgetest::describeResult(rc, comm), bad);
  }
}

// Runs checked allreduces on `comm` until one fails, `stop` is set or the bounds run out;
// *progress counts the ones that succeeded. Returns the failing call's result (ridgeSuccess
// when none failed) and adds wrong elements to *wrong.
ridgeResult_t allreduceLoop(ridgeComm_t comm, int rank, bool victim, ridgetest::Reporter& rep,
                            std::atomic<int>* progress, const std::atomic<bool>* stop, long* wrong) {
  const size_t count = 16384;
  std::vector<float> in(count), out(count);
  for (size_t i = 0; i < count; ++i) in[i] = loopValue(rank, i);
  const double start = ridgetest::nowSec();
  for (int it = 0; it < 100000 && ridgetest::nowSec() - start < ridgetest::scaledSeconds(120.0); ++it) {
    if (stop && stop->load()) return ridgeSuccess;
    if (victim && it == 3) rep.line("LOOPING");  // the parent kills or stops it now
    std::fill(out.begin(), out.end(), -1.0f);
    ridgeResult_t rc = ridgeAllReduce(in.data(), out.data(), count, ridgeFloat32, ridgeSum, comm, nullptr);
    if (rc != ridgeSuccess) return rc;
    for (size_t i = 0; i < count; ++i) *wrong += out[i] != loopSum(i);
    progress->fetch_add(1);
  }
  return ridgeSuccess;
}

// "RESULT <failed call's code> <shrink's code> <wrong> <fds before> <fds after> <threads before>
// <threads after> <root services left> <parent destroy seconds> <worker's code> | <problem>"
struct Report {
  bool parsed = false;
  int failCode = 0, shrinkCode = 0, fdsBefore = 0, fdsAfter = 0, threadsBefore = 0, threadsAfter = 0,
      servicesLeft = 0, workerCode = 0;
  long wrong = 0;
  double parentDestroySec = 0;
  std::string problem;
};

Report parseReport(const ridgetest::RankResult& rr) {
  Report out;
  const auto lines = ridgetest::linesWith(rr, "RESULT ");
  if (lines.size() != 1) return out;
  out.parsed =
      std::sscanf(lines[0].c_str(), "%d %d %ld %d %d %d %d %d %lf %d", &out.failCode, &out.shrinkCode,
                  &out.wrong, &out.fdsBefore, &out.fdsAfter, &out.threadsBefore, &out.threadsAfter,
                  &out.servicesLeft, &out.parentDestroySec, &out.workerCode) == 10;
  const size_t bar = lines[0].find('|');
  out.problem = bar == std::string::npos || bar + 2 > lines[0].size() ? "" : lines[0].substr(bar + 2);
  return out;
}

// The root services of this process once the last one has had time to see every rank (it exits
// right after sending the table, on its own thread).
int rootServicesSettled(int before) {
  for (int i = 0; i < 500 && ridge::activeRootServices() > before; ++i) usleep(10000);
  return ridge::activeRootServices() - before;
}

int survivorBody(const Case& c, const ridgeUniqueId& id, int r, ridgetest::Reporter& rep) {
  const int fdsBefore = countOpenFds(), threadsBefore = countThreads();
  const int servicesBefore = ridge::activeRootServices();  // the parent's count, copied by fork
  ridgeComm_t comm = ridgetest::initRank(kRanks, id, r, rep);
  if (!comm) return 1;
  long wrong = 0;
  std::atomic<int> progress{0};
  ridgeResult_t failCode = ridgeSuccess, workerCode = ridgeSuccess;
  ridgeResult_t shrinkCode = ridgeInternalError;
  const int flags = c.fault == Fault::Kill ? RIDGE_SHRINK_DEFAULT : RIDGE_SHRINK_ABORT;
  const int excluded[1] = {c.victim};
  std::vector<int> gone = {c.victim};
  ridgeConfig_t cfg = RIDGE_CONFIG_INITIALIZER;
  cfg.timeoutSeconds = ridgetest::scaledSeconds(30);  // the new communicator must not time out
  cfg.commName = "survivors";
  ridgeComm_t small = nullptr;
  std::string problem;
  if (c.fault != Fault::StopWatchdog) {
    failCode = allreduceLoop(comm, r, false, rep, &progress, nullptr, &wrong);
    if (failCode == ridgeSuccess)
      problem = "no call failed although rank " + std::to_string(c.victim) + " is gone";
    if (r == c.diesInShrink) {
      rep.line("DYING");
      raise(SIGKILL);
    }
    const double t0 = ridgetest::nowSec();
    shrinkCode = ridgeCommShrink(comm, excluded, 1, &small, &cfg, flags);
    if (c.diesInShrink >= 0) {
      // A survivor never came: a clean error within twice the timeout (plus the detection
      // skew), then a second shrink without it too.
      const double took = ridgetest::nowSec() - t0;
      rep.info("rank " + std::to_string(r) + ", shrink without rank " + std::to_string(c.diesInShrink) +
               ": " + ridgetest::describeResult(shrinkCode, comm) + " after " + std::to_string(took) + " s");
      if (shrinkCode == ridgeSuccess) {
        problem = "the shrink succeeded although rank " + std::to_string(c.diesInShrink) + " died in it";
        ridgeCommDestroy(small);
        small = nullptr;
      } else if (took > ridgetest::scaledSeconds(3.0 * kDetectTimeoutSec + 2.0)) {
        problem = "the failed shrink took " + std::to_string(took) + " s";
      }
      gone.push_back(c.diesInShrink);
      shrinkCode = ridgeCommShrink(comm, gone.data(), static_cast<int>(gone.size()), &small, &cfg, flags);
    }
  } else {
    // The worker runs the collectives; this thread is the framework's watchdog: no progress
    // for a second (the peers' allreduces take milliseconds) means a hung rank. Any count of
    // completed allreduces will do: over TCP the stopped rank's progress threads stop too, so a
    // survivor may hang one allreduce earlier than the stopped rank's own loop.
    std::atomic<bool> stop{false};
    std::atomic<double> workerEnded{0.0};
    long workerWrong = 0;
    std::thread worker([&] {
      workerCode = allreduceLoop(comm, r, false, rep, &progress, &stop, &workerWrong);
      workerEnded.store(ridgetest::nowSec());
    });
    int seen = -1;
    double lastChange = ridgetest::nowSec();
    const double stall = ridgetest::scaledSeconds(1.0);
    const double giveUp = ridgetest::nowSec() + ridgetest::scaledSeconds(60.0);
    while (ridgetest::nowSec() < giveUp && workerEnded.load() == 0.0) {
      const int now = progress.load();
      if (now != seen) {
        seen = now;
        lastChange = ridgetest::nowSec();
      } else if (seen >= 1 && ridgetest::nowSec() - lastChange > stall) {
        break;
      }
      usleep(5000);
    }
    const double shrinkAt = ridgetest::nowSec();
    shrinkCode = ridgeCommShrink(comm, excluded, 1, &small, &cfg, flags);
    stop.store(true);
    worker.join();
    wrong += workerWrong;
    if (workerCode != ridgeAborted)
      problem =
          "the blocked allreduce returned " + ridgetest::describeResult(workerCode) + ", not ridgeAborted";
    else if (workerEnded.load() - shrinkAt > ridgetest::scaledSeconds(2.0))
      problem = "the blocked allreduce left " + std::to_string(workerEnded.load() - shrinkAt) +
                " s after the shrink";
  }
  if (shrinkCode != ridgeSuccess || !small) {
    if (problem.empty()) problem = "shrink: " + ridgetest::describeResult(shrinkCode, comm);
  } else {
    std::vector<int> members;
    for (int m = 0; m < kRanks; ++m)
      if (std::find(gone.begin(), gone.end(), m) == gone.end()) members.push_back(m);
    const int newRank = static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());
    const int newSize = static_cast<int>(members.size());
    int n = -1, me = -1;
    ridgeCommCount(small, &n);
    ridgeCommUserRank(small, &me);
    if ((n != newSize || me != newRank) && problem.empty())
      problem = "new communicator: rank " + std::to_string(me) + " of " + std::to_string(n) + ", expected " +
                std::to_string(newRank) + " of " + std::to_string(newSize);
    std::string checkProblem;
    checkCollectives(small, r, members, &wrong, &checkProblem);
    if (problem.empty()) problem = checkProblem;
    ridgeResult_t rc = ridgeCommDestroy(small);
    if (rc != ridgeSuccess && problem.empty())
      problem = "destroy of the new communicator: " + std::to_string(rc);
  }
  const double destroyStart = ridgetest::nowSec();
  ridgeCommDestroy(comm);
  const double parentDestroySec = ridgetest::nowSec() - destroyStart;
  const int servicesLeft = rootServicesSettled(servicesBefore);
  rep.line("RESULT " + std::to_string(failCode) + " " + std::to_string(shrinkCode) + " " +
           std::to_string(wrong) + " " + std::to_string(fdsBefore) + " " + std::to_string(countOpenFds()) +
           " " + std::to_string(threadsBefore) + " " + std::to_string(countThreads()) + " " +
           std::to_string(servicesLeft) + " " + std::to_string(parentDestroySec) + " " +
           std::to_string(workerCode) + " | " + problem);
  rep.line("DONE");
  return 0;
}

// A stopped rank, once let go on: its pending call fails, it destroys its communicator and ends
// with the descriptors and threads it had before init.
int victimBody(const Case& c, const ridgeUniqueId& id, int r, ridgetest::Reporter& rep) {
  const int fdsBefore = countOpenFds(), threadsBefore = countThreads();
  ridgeComm_t comm = ridgetest::initRank(kRanks, id, r, rep);
  if (!comm) return 1;
  std::atomic<int> progress{0};
  long wrong = 0;
  const double t0 = ridgetest::nowSec();
  ridgeResult_t rc = allreduceLoop(comm, r, true, rep, &progress, nullptr, &wrong);
  const double resumedFor = ridgetest::nowSec() - t0;  // includes the time it was stopped
  ridgeCommDestroy(comm);
  if (c.fault != Fault::Kill) {
    if (rc == ridgeSuccess) rep.fail("stopped rank", "its allreduce loop ended without an error");
    rep.line("VICTIM " + std::to_string(rc) + " " + std::to_string(fdsBefore) + " " +
             std::to_string(countOpenFds()) + " " + std::to_string(threadsBefore) + " " +
             std::to_string(countThreads()) + " " + std::to_string(resumedFor));
  }
  return 0;
}

class Shrink : public ::testing::TestWithParam<Case> {};

TEST_P(Shrink, SurvivorsGoOnAndNothingLeaks) {
  const Case c = GetParam();
  setCaseEnv(c, false);  // the parent runs the root service: its timeout too
  ridgeUniqueId id;
  ASSERT_EQ(ridgeGetUniqueId(&id), ridgeSuccess) << ridgeGetLastError(nullptr);
  const int sig = c.fault == Fault::Kill ? SIGKILL : SIGSTOP;
  int survivorsDone = 0;
  double resumedAt = 0;
  auto res = ridgetest::launchRanks(
      kRanks, 120,
      [&](int r, ridgetest::Reporter& rep) -> int {
        setCaseEnv(c, r == c.victim);
        return r == c.victim ? victimBody(c, id, r, rep) : survivorBody(c, id, r, rep);
      },
      [&](int r, const std::string& line, double t, ridgetest::LaunchControl& ctl) {
        if (line == "LOOPING" && r == c.victim) ctl.killRank(c.victim, sig);
        if (line == "DONE" && r != c.victim && ++survivorsDone == kRanks - 1 && c.fault != Fault::Kill) {
          ctl.killRank(c.victim, SIGCONT);  // let the stopped rank go on
          resumedAt = t;
        }
      });
  ridgetest::reportChildFailures(res, caseName(c), /*expectCleanExit=*/false);
  EXPECT_FALSE(res.timedOut) << "a rank hung";
  ASSERT_EQ(res.ranks.size(), static_cast<size_t>(kRanks));

  long wrong = 0, leaks = 0;
  for (int r = 0; r < kRanks; ++r) {
    if (r == c.victim) continue;
    if (r == c.diesInShrink) {
      EXPECT_EQ(res.ranks[r].termSignal, SIGKILL) << "rank " << r << " was to die in the shrink";
      continue;
    }
    const Report rep = parseReport(res.ranks[r]);
    ASSERT_TRUE(rep.parsed) << "survivor " << r << " reported no result";
    EXPECT_TRUE(res.ranks[r].exited && res.ranks[r].exitCode == 0) << "survivor " << r;
    EXPECT_EQ(rep.problem, "") << "survivor " << r;
    EXPECT_EQ(rep.shrinkCode, ridgeSuccess) << "survivor " << r;
    if (c.fault == Fault::StopTimeout) EXPECT_EQ(rep.failCode, ridgeTimeout) << "survivor " << r;
    if (c.fault == Fault::StopWatchdog) EXPECT_EQ(rep.workerCode, ridgeAborted) << "survivor " << r;
    EXPECT_EQ(rep.wrong, 0) << "survivor " << r;
    EXPECT_EQ(rep.fdsAfter, rep.fdsBefore) << "survivor " << r << " descriptors";
    EXPECT_EQ(rep.threadsAfter, rep.threadsBefore) << "survivor " << r << " threads";
    EXPECT_EQ(rep.servicesLeft, 0) << "survivor " << r << " rendezvous threads";
    // An aborted parent does not wait to flush to the stopped rank.
    if (c.fault != Fault::Kill)
      EXPECT_LT(rep.parentDestroySec, ridgetest::scaledSeconds(1.0)) << "survivor " << r;
    wrong += rep.wrong;
    leaks += std::abs(rep.fdsAfter - rep.fdsBefore) + std::abs(rep.threadsAfter - rep.threadsBefore) +
             std::abs(rep.servicesLeft);
  }
  const ridgetest::RankResult& victim = res.ranks[c.victim];
  if (c.fault == Fault::Kill) {
    EXPECT_EQ(victim.termSignal, SIGKILL);
  } else {
    EXPECT_TRUE(victim.exited && victim.exitCode == 0) << "the stopped rank, let go on, did not end cleanly";
    const auto lines = ridgetest::linesWith(victim, "VICTIM ");
    ASSERT_EQ(lines.size(), 1u) << "the stopped rank reported nothing";
    int code = 0, fdsBefore = 0, fdsAfter = 0, threadsBefore = 0, threadsAfter = 0;
    double ran = 0;
    ASSERT_EQ(std::sscanf(lines[0].c_str(), "%d %d %d %d %d %lf", &code, &fdsBefore, &fdsAfter,
                          &threadsBefore, &threadsAfter, &ran),
              6);
    EXPECT_NE(code, ridgeSuccess);
    EXPECT_EQ(fdsAfter, fdsBefore) << "the stopped rank's descriptors";
    EXPECT_EQ(threadsAfter, threadsBefore) << "the stopped rank's threads";
    leaks += std::abs(fdsAfter - fdsBefore) + std::abs(threadsAfter - threadsBefore);
  }
  std::vector<pid_t> pids;
  for (const auto& rr : res.ranks) pids.push_back(rr.pid);
  const std::set<std::string> leftover = shmSegmentsOf(pids);
  EXPECT_TRUE(leftover.empty()) << "left in /dev/shm: " << *leftover.begin();
  leaks += static_cast<long>(leftover.size());

  std::string tried = std::string(c.fault == Fault::Kill ? "kill -9" : "SIGSTOP") + " rank " +
                      std::to_string(c.victim) + " of 4 mid-allreduce; survivors ";
  switch (c.fault) {
    case Fault::Kill: tried += "shrink (default mode)"; break;
    case Fault::StopTimeout: tried += "time out (RIDGE_TIMEOUT=2), shrink with RIDGE_SHRINK_ABORT"; break;
    case Fault::StopWatchdog:
      tried += "shrink with RIDGE_SHRINK_ABORT from a watchdog thread while an allreduce is blocked";
      break;
  }
  tried += ", then allreduce, broadcast and allgather checked";
  if (c.fault != Fault::Kill) tried += "; the stopped rank resumed";
  if (c.diesInShrink >= 0)
    tried = "kill -9 rank " + std::to_string(c.victim) + " of 4 mid-allreduce, then rank " +
            std::to_string(c.diesInShrink) + (c.diesInShrink == 0 ? " (the new rank 0)" : "") +
            " as the shrink starts; the others' shrink fails (timeout), they shrink again without both, "
            "then allreduce, broadcast and allgather checked";
  ridge::chaos::record(std::string("shrink/") + netName(c.net), tried, Outcome::kRecovered, wrong, leaks);
}

std::vector<Case> allCases() {
  std::vector<Case> out;
  for (Net net : {Net::Shm, Net::Tcp}) {
    for (int victim = 0; victim < kRanks; ++victim) out.push_back({net, Fault::Kill, victim});
    for (int victim : {0, 2}) {
      out.push_back({net, Fault::StopTimeout, victim});
      out.push_back({net, Fault::StopWatchdog, victim});
    }
    // A second rank dies as the shrink starts: a survivor that is not the new rank 0 (shm), and
    // the new rank 0 itself (TCP).
    if (net == Net::Shm) out.push_back({net, Fault::Kill, 3, 2});
    if (net == Net::Tcp) out.push_back({net, Fault::Kill, 1, 0});
  }
  // The software NIC (RIDGE_SHM=0 RIDGE_NET=softnic): the new communicator brings up NICs of its own.
  out.push_back({Net::Softnic, Fault::Kill, 0});
  out.push_back({Net::Softnic, Fault::StopWatchdog, 2});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Faults, Shrink, ::testing::ValuesIn(allCases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return caseName(info.param); });

// Device buffers (RIDGE_DEVICE=emulated: emulated GPUs, one per rank, collectives through the
// device proxy as on a GPU): the survivors queue four allreduces per stream synchronization,
// rank 1 is killed mid-loop, the survivors see the failure (a call, the stream or the
// communicator's async error), shrink with RIDGE_SHRINK_ABORT (the proxy drops what it still
// holds and releases the stream) and run checked device allreduces on the new communicator.
TEST(ShrinkDeviceBuffers, KillOneAbortTheQueuedAndGoOn) {
  constexpr int victim = 1;
  const Case env{Net::Shm, Fault::Kill, victim};
  setCaseEnv(env, false);
  setenv("RIDGE_DEVICE", "emulated", 1);
  ridgeUniqueId id;
  ASSERT_EQ(ridgeGetUniqueId(&id), ridgeSuccess) << ridgeGetLastError(nullptr);
  const size_t count = 4096;
  auto res = ridgetest::launchRanks(
      kRanks, 120,
      [&](int r, ridgetest::Reporter& rep) -> int {
        if (ridgeEmulatedSetDevice(r) != ridgeSuccess) {
          rep.fail("device", ridgeGetLastError(nullptr));
          return 1;
        }
        ridgeComm_t comm = ridgetest::initRank(kRanks, id, r, rep);
        if (!comm) return 1;
        void *in = nullptr, *out = nullptr;
        ridgeStream_t stream = nullptr;
        if (ridgeMemAlloc(&in, count * 4) != ridgeSuccess || ridgeMemAlloc(&out, count * 4) != ridgeSuccess ||
            ridgeEmulatedStreamCreate(&stream) != ridgeSuccess) {
          rep.fail("alloc", ridgeGetLastError(nullptr));
          return 1;
        }
        std::vector<float> host(count);
        // Rank m contributes m + 1 + (i % 5) at element i: exact sums in float.
        auto fill = [&](int oldRank) {
          for (size_t i = 0; i < count; ++i) host[i] = loopValue(oldRank, i);
          return ridgeEmulatedMemcpy(in, host.data(), count * 4) == ridgeSuccess;
        };
        auto allreduceChecked = [&](ridgeComm_t c, const std::vector<int>& members, int batch) {
          std::vector<float> poison(count, std::numeric_limits<float>::quiet_NaN());
          if (ridgeEmulatedMemcpy(out, poison.data(), count * 4) != ridgeSuccess) return -1L;
          for (int k = 0; k < batch; ++k)
            if (ridgeAllReduce(in, out, count, ridgeFloat32, ridgeSum, c, stream) != ridgeSuccess) return -1L;
          ridgeResult_t state = ridgeSuccess;
          if (ridgeEmulatedStreamSynchronize(stream) != ridgeSuccess ||
              ridgeCommGetAsyncError(c, &state) != ridgeSuccess || state != ridgeSuccess)
            return -1L;
          if (ridgeEmulatedMemcpy(host.data(), out, count * 4) != ridgeSuccess) return -1L;
          long bad = 0;
          for (size_t i = 0; i < count; ++i) {
            float want = 0;
            for (int m : members) want += loopValue(m, i);
            bad += host[i] != want;
          }
          return bad;
        };
        long wrong = 0;
        if (!fill(r)) rep.fail("fill", ridgeGetLastError(nullptr));
        const double start = ridgetest::nowSec();
        int it = 0;
        for (; it < 10000 && ridgetest::nowSec() - start < ridgetest::scaledSeconds(60.0); ++it) {
          if (r == victim && it == 3) rep.line("LOOPING");
          const long bad = allreduceChecked(comm, {0, 1, 2, 3}, 4);
          if (bad < 0) break;
          wrong += bad;
        }
        rep.info("rank " + std::to_string(r) + ": the parent failed after " + std::to_string(it) +
                 " rounds: " + ridgeGetLastError(comm));
        const int gone[1] = {victim};
        ridgeConfig_t cfg = RIDGE_CONFIG_INITIALIZER;
        cfg.timeoutSeconds = ridgetest::scaledSeconds(30);
        ridgeComm_t small = nullptr;
        ridgeResult_t rc = ridgeCommShrink(comm, gone, 1, &small, &cfg, RIDGE_SHRINK_ABORT);
        // The stream is released whatever the parent's proxy still held.
        const double syncStart = ridgetest::nowSec();
        (void)ridgeEmulatedStreamSynchronize(stream);
        if (ridgetest::nowSec() - syncStart > ridgetest::scaledSeconds(2.0))
          rep.fail("stream", "not released");
        if (rc != ridgeSuccess || !small) {
          rep.fail("shrink", ridgetest::describeResult(rc, comm));
        } else {
          for (int round = 0; round < 3; ++round) {
            const long bad = allreduceChecked(small, {0, 2, 3}, round + 1);
            if (bad < 0) {
              rep.fail("allreduce on the new communicator",
                       ridgetest::describeResult(ridgeInternalError, small));
              break;
            }
            wrong += bad;
          }
          ridgeCommDestroy(small);
        }
        if (wrong) rep.fail("results", std::to_string(wrong) + " wrong elements");
        ridgeCommDestroy(comm);
        (void)ridgeEmulatedStreamDestroy(stream);
        (void)ridgeMemFree(in);
        (void)ridgeMemFree(out);
        rep.line("WRONG " + std::to_string(wrong));
        return 0;
      },
      [&](int r, const std::string& line, double, ridgetest::LaunchControl& ctl) {
        if (line == "LOOPING" && r == victim) ctl.killRank(victim, SIGKILL);
      });
  unsetenv("RIDGE_DEVICE");
  ridgetest::reportChildFailures(res, "device buffers", /*expectCleanExit=*/false);
  EXPECT_FALSE(res.timedOut);
  long wrong = 0;
  for (int r = 0; r < kRanks; ++r) {
    if (r == victim) continue;
    EXPECT_TRUE(res.ranks[r].exited && res.ranks[r].exitCode == 0) << "survivor " << r;
    const auto lines = ridgetest::linesWith(res.ranks[r], "WRONG ");
    ASSERT_EQ(lines.size(), 1u) << "survivor " << r << " reported nothing";
    wrong += std::stol(lines[0]);
  }
  std::vector<pid_t> pids;
  for (const auto& rr : res.ranks) pids.push_back(rr.pid);
  const long leftover = static_cast<long>(shmSegmentsOf(pids).size());
  EXPECT_EQ(leftover, 0);
  ridge::chaos::record(
      "shrink/device",
      "kill -9 rank 1 of 4 while the others queue device allreduces (emulated GPUs); survivors "
      "shrink with RIDGE_SHRINK_ABORT, then device allreduces checked",
      Outcome::kRecovered, wrong, leftover);
}

}  // namespace
