// Chaos: a rank killed (kill -9) or stopped (SIGSTOP) at each stage of communicator init and in
// the middle of a collective, on shared memory, TCP (RIDGE_SHM=0 RIDGE_NET=socket) and the
// software NIC (RIDGE_SHM=0 RIDGE_NET=softnic). Three ranks, forked; the victim stops itself at
// its stage through the init-stage hook (bootstrap/init_stage.h), or is signalled by the parent
// once it reports that it is inside its collective loop.
//
// What must hold: every survivor's call fails with an error and a message within the timeout
// bound (RIDGE_TIMEOUT=2 here), results of the calls that succeeded are right, the survivors
// hold exactly the file descriptors they held before init once the communicator is gone, and
// no /dev/shm segment named after any of the job's processes is left behind.
#include <dirent.h>
#include <poll.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "bootstrap/init_stage.h"
#include "chaos_record.h"
#include "chaos_resources.h"
#include "rank_launcher.h"
#include "ridge/ridge.h"

namespace ridge {
extern std::atomic<bool> gShmForceNamedSegmentForTesting;  // transports/shm/shm_transport.cpp
}

namespace {

using ridge::InitStage;
using ridge::chaos::countOpenFds;
using ridge::chaos::Outcome;
using ridge::chaos::shmSegmentsOf;

constexpr int kRanks = 3;
constexpr int kTimeoutSec = 2;  // RIDGE_TIMEOUT of every process in these cases

enum class Net { Shm, Tcp, Softnic };
enum class Fault { Kill, Stop };

struct Case {
  Net net;
  Fault fault;
  InitStage stage;  // InitStage::Count: in the middle of an allreduce loop
  int victim;
  bool namedSegment = false;  // every rank forced onto the named-segment fallback
};

const char* netName(Net n) {
  switch (n) {
    case Net::Shm: return "shm";
    case Net::Tcp: return "tcp";
    case Net::Softnic: return "softnic";
  }
  return "?";
}

std::string stageName(InitStage s) {
  return s == InitStage::Count ? std::string("mid-allreduce") : ridge::initStageName(s);
}

std::string caseName(const Case& c) {
  std::string s = std::string(netName(c.net)) + (c.namedSegment ? "_named" : "") + "_" +
                  (c.fault == Fault::Kill ? "kill" : "stop") + "_" + stageName(c.stage) + "_rank" +
                  std::to_string(c.victim);
  for (char& ch : s)
    if (ch == '-') ch = '_';
  return s;
}

// A survivor's line "RESULT <code> <seconds> <wrong elements> <fds before> <fds after> | <message>".
struct SurvivorReport {
  bool parsed = false;
  int code = 0, fdsBefore = 0, fdsAfter = 0;
  double elapsed = 0;
  long wrong = 0;
  std::string message;
};

SurvivorReport survivorReport(const ridgetest::RankResult& rr) {
  SurvivorReport out;
  const auto lines = ridgetest::linesWith(rr, "RESULT ");
  if (lines.size() != 1) return out;
  char sep[4] = {0};
  out.parsed = std::sscanf(lines[0].c_str(), "%d %lf %ld %d %d %3s", &out.code, &out.elapsed, &out.wrong,
                           &out.fdsBefore, &out.fdsAfter, sep) == 6;
  const size_t bar = lines[0].find('|');
  out.message = bar == std::string::npos ? lines[0] : lines[0].substr(bar + 1);
  return out;
}

// Set in the victim child before init.
InitStage gVictimStage = InitStage::Count;
int gVictimSignal = 0;
int gVictimOccurrence = 1;  // which time the stage comes round (the fallback creates twice)

void victimHook(InitStage s, const void*) {
  if (s == gVictimStage && --gVictimOccurrence == 0) raise(gVictimSignal);
}

void setTransportEnv(Net net) {
  setenv("RIDGE_SOCKET_IFNAME", "lo", 1);
  setenv("RIDGE_TIMEOUT", std::to_string(kTimeoutSec).c_str(), 1);
  setenv("RIDGE_SHM", net == Net::Shm ? "1" : "0", 1);
  setenv("RIDGE_NET", net == Net::Softnic ? "softnic" : "socket", 1);
}

class KillAndStop : public ::testing::TestWithParam<Case> {};

TEST_P(KillAndStop, SurvivorsFailCleanlyAndNothingLeaks) {
  const Case c = GetParam();
  const bool midCollective = c.stage == InitStage::Count;
  setTransportEnv(c.net);  // the parent runs the root service: its timeout too
  ridgeUniqueId id;
  ASSERT_EQ(ridgeGetUniqueId(&id), ridgeSuccess) << ridgeGetLastError(nullptr);
  const int sig = c.fault == Fault::Kill ? SIGKILL : SIGSTOP;
  const size_t count = 16384;

  int survivorsDone = 0;
  auto res = ridgetest::launchRanks(
      kRanks, 30,
      [&](int r, ridgetest::Reporter& rep) -> int {
        setTransportEnv(c.net);
        ridge::gShmForceNamedSegmentForTesting.store(c.namedSegment);
        const int fdsBefore = countOpenFds();
        if (r == c.victim && !midCollective) {
          gVictimStage = c.stage;
          gVictimSignal = sig;
          // Forced onto the fallback, the creator passes "created" once for its memfd first.
          gVictimOccurrence = c.namedSegment && c.stage == InitStage::ShmSegmentCreated ? 2 : 1;
          ridge::setInitStageHook(victimHook);
        }
        const double t0 = ridgetest::nowSec();
        ridgeComm_t comm = nullptr;
        ridgeResult_t rc = ridgeCommInitRank(&comm, kRanks, id, r);
        long wrong = 0;
        if (midCollective && rc == ridgeSuccess) {
          std::vector<float> in(count), out(count);
          for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(r + 1 + static_cast<int>(i % 7));
          const double loopStart = ridgetest::nowSec();
          for (int it = 0; it < 20000 && ridgetest::nowSec() - loopStart < 20; ++it) {
            if (r == c.victim && it == 3) rep.line("LOOPING");
            std::fill(out.begin(), out.end(), -1.0f);
            const double callStart = ridgetest::nowSec();
            rc = ridgeAllReduce(in.data(), out.data(), count, ridgeFloat, ridgeSum, comm, nullptr);
            if (rc != ridgeSuccess) {
              rep.line("CALLTIME " + std::to_string(ridgetest::nowSec() - callStart));
              break;
            }
            for (size_t i = 0; i < count; ++i)
              if (out[i] != static_cast<float>(kRanks * (kRanks + 1) / 2 + kRanks * static_cast<int>(i % 7)))
                ++wrong;
          }
        }
        const double elapsed = ridgetest::nowSec() - t0;
        const std::string message = ridgeGetLastError(comm);
        if (comm) ridgeCommDestroy(comm);
        const int fdsAfter = countOpenFds();
        rep.line("RESULT " + std::to_string(static_cast<int>(rc)) + " " + std::to_string(elapsed) + " " +
                 std::to_string(wrong) + " " + std::to_string(fdsBefore) + " " + std::to_string(fdsAfter) +
                 " | " + message);
        rep.line("DONE");
        return 0;
      },
      [&](int r, const std::string& line, double, ridgetest::LaunchControl& ctl) {
        if (line == "LOOPING" && r == c.victim) ctl.killRank(c.victim, sig);
        if (line == "DONE" && r != c.victim && ++survivorsDone == kRanks - 1 && c.fault == Fault::Stop)
          ctl.killRank(c.victim, SIGKILL);  // the stopped rank is of no more use
      });
  ridgetest::reportChildFailures(res, caseName(c), /*expectCleanExit=*/false);
  EXPECT_FALSE(res.timedOut) << "a survivor hung";

  std::vector<pid_t> pids;
  for (const auto& rr : res.ranks) pids.push_back(rr.pid);
  const std::set<std::string> leftover = shmSegmentsOf(pids);
  EXPECT_TRUE(leftover.empty()) << "left in /dev/shm: " << *leftover.begin();

  long wrong = 0, leaks = static_cast<long>(leftover.size());
  for (int r = 0; r < kRanks; ++r) {
    if (r == c.victim) continue;
    const SurvivorReport rep = survivorReport(res.ranks[r]);
    ASSERT_TRUE(rep.parsed) << "survivor " << r << " reported no result";
    const int code = rep.code, before = rep.fdsBefore, after = rep.fdsAfter;
    const double elapsed = rep.elapsed;
    const long bad = rep.wrong;
    const std::string& message = rep.message;
    EXPECT_NE(code, ridgeSuccess) << "survivor " << r << " succeeded although rank " << c.victim << " is gone";
    EXPECT_GT(message.size(), 10u) << "survivor " << r << ": error without a message";
    // Init: a bootstrap wait and then transport waits may each take the timeout.
    const double bound = midCollective ? 20 + kTimeoutSec + 3 : 2 * kTimeoutSec + 3;
    EXPECT_LT(elapsed, ridgetest::scaledSeconds(bound)) << "survivor " << r << ": " << message;
    if (midCollective) {
      auto callTimes = ridgetest::linesWith(res.ranks[r], "CALLTIME ");
      ASSERT_EQ(callTimes.size(), 1u);
      EXPECT_LT(std::stod(callTimes[0]), ridgetest::scaledSeconds(kTimeoutSec + 2.0)) << message;
    }
    EXPECT_EQ(after, before) << "survivor " << r << " holds " << after - before << " more descriptors";
    wrong += bad;
    if (after != before) leaks += std::abs(after - before);
  }
  ridge::chaos::record(
      netName(c.net),
      std::string(c.fault == Fault::Kill ? "kill -9" : "SIGSTOP") + " rank " + std::to_string(c.victim) + " at " +
          stageName(c.stage) + (c.namedSegment ? " of the named-segment fallback" : "") +
          " (3 ranks, RIDGE_TIMEOUT=" + std::to_string(kTimeoutSec) + ")",
      Outcome::kCleanError, wrong, leaks);
}

std::vector<Case> allCases() {
  std::vector<Case> out;
  for (Fault f : {Fault::Kill, Fault::Stop}) {
    for (InitStage s : {InitStage::BootstrapListening, InitStage::BootstrapHelloSent,
                        InitStage::BootstrapTableReceived, InitStage::BootstrapRingConnected})
      out.push_back({Net::Shm, f, s, 1});
    out.push_back({Net::Shm, f, InitStage::ShmSegmentCreated, 0});  // the host's lowest rank creates
    out.push_back({Net::Shm, f, InitStage::ShmSegmentAttached, 2});
    out.push_back({Net::Shm, f, InitStage::Count, 1});
    out.push_back({Net::Shm, f, InitStage::ShmSegmentCreated, 0, /*namedSegment=*/true});
    out.push_back({Net::Shm, f, InitStage::ShmSegmentAttached, 2, /*namedSegment=*/true});
    for (Net n : {Net::Tcp, Net::Softnic}) {
      out.push_back({n, f, InitStage::BootstrapHelloSent, 1});
      out.push_back({n, f, InitStage::BootstrapRingConnected, 2});
      out.push_back({n, f, InitStage::Count, 1});
    }
  }
  return out;
}

// The root's own process (rank 0 called ridgeGetUniqueId, so the rendezvous thread lives in it)
// killed or stopped right after it handed the id out, before anyone arrived: the other ranks
// find either nobody listening or a listener that never sends its challenge, and fail with an
// error within the timeout bound instead of waiting forever.
class RootProcess : public ::testing::TestWithParam<Fault> {};

TEST_P(RootProcess, OtherRanksFailWithinTheTimeout) {
  const Fault fault = GetParam();
  const int sig = fault == Fault::Kill ? SIGKILL : SIGSTOP;
  int idPipe[2];
  ASSERT_EQ(pipe(idPipe), 0);
  int survivorsDone = 0;
  auto res = ridgetest::launchRanks(
      kRanks, 30,
      [&](int r, ridgetest::Reporter& rep) -> int {
        setTransportEnv(Net::Shm);
        ridgeUniqueId id;
        if (r == 0) {
          if (ridgeGetUniqueId(&id) != ridgeSuccess) return 1;
          for (int q = 1; q < kRanks; ++q)
            if (write(idPipe[1], &id, sizeof id) != static_cast<ssize_t>(sizeof id)) return 1;
          raise(sig);
          return 0;
        }
        pollfd p{idPipe[0], POLLIN, 0};
        if (poll(&p, 1, 10000) != 1 || read(idPipe[0], &id, sizeof id) != static_cast<ssize_t>(sizeof id)) {
          rep.fail("rank " + std::to_string(r), "no id from rank 0");
          return 1;
        }
        const int fdsBefore = countOpenFds();
        const double t0 = ridgetest::nowSec();
        ridgeComm_t comm = nullptr;
        ridgeResult_t rc = ridgeCommInitRank(&comm, kRanks, id, r);
        const double elapsed = ridgetest::nowSec() - t0;
        const std::string message = ridgeGetLastError(comm);
        if (comm) ridgeCommDestroy(comm);
        rep.line("RESULT " + std::to_string(static_cast<int>(rc)) + " " + std::to_string(elapsed) + " 0 " +
                 std::to_string(fdsBefore) + " " + std::to_string(countOpenFds()) + " | " + message);
        rep.line("DONE");
        return 0;
      },
      [&](int r, const std::string& line, double, ridgetest::LaunchControl& ctl) {
        if (line == "DONE" && r != 0 && ++survivorsDone == kRanks - 1 && fault == Fault::Stop)
          ctl.killRank(0, SIGKILL);
      });
  close(idPipe[0]);
  close(idPipe[1]);
  ridgetest::reportChildFailures(res, "root process", /*expectCleanExit=*/false);
  EXPECT_FALSE(res.timedOut);
  long leaks = 0;
  for (int r = 1; r < kRanks; ++r) {
    const SurvivorReport rep = survivorReport(res.ranks[r]);
    ASSERT_TRUE(rep.parsed) << "rank " << r << " reported no result";
    EXPECT_NE(rep.code, ridgeSuccess);
    EXPECT_LT(rep.elapsed, ridgetest::scaledSeconds(kTimeoutSec + 3.0)) << rep.message;
    EXPECT_EQ(rep.fdsAfter, rep.fdsBefore) << rep.message;
    leaks += std::abs(rep.fdsAfter - rep.fdsBefore);
  }
  ridge::chaos::record("bootstrap",
                       std::string(fault == Fault::Kill ? "kill -9" : "SIGSTOP") +
                           " the root's process right after it handed out the id (3 ranks, RIDGE_TIMEOUT=2)",
                       Outcome::kCleanError, 0, leaks);
}

INSTANTIATE_TEST_SUITE_P(Faults, RootProcess, ::testing::Values(Fault::Kill, Fault::Stop),
                         [](const ::testing::TestParamInfo<Fault>& info) {
                           return std::string(info.param == Fault::Kill ? "kill" : "stop");
                         });

// The named-segment fallback (ranks that cannot open the creator's memfd through /proc): an
// allreduce is right and, once the communicator is destroyed, nothing is left in /dev/shm.
TEST(SharedSegment, NamedFallbackWorksAndLeavesNothing) {
  setTransportEnv(Net::Shm);
  ridgeUniqueId id;
  ASSERT_EQ(ridgeGetUniqueId(&id), ridgeSuccess) << ridgeGetLastError(nullptr);
  auto res = ridgetest::launchRanks(kRanks, 30, [&](int r, ridgetest::Reporter& rep) -> int {
    setTransportEnv(Net::Shm);
    ridge::gShmForceNamedSegmentForTesting.store(true);
    ridgeComm_t comm = nullptr;
    ridgeResult_t rc = ridgeCommInitRank(&comm, kRanks, id, r);
    if (rc != ridgeSuccess) {
      rep.fail("rank " + std::to_string(r), ridgetest::describeResult(rc));
      return 1;
    }
    std::vector<float> in(4096, static_cast<float>(r + 1)), out(4096, -1.0f);
    rc = ridgeAllReduce(in.data(), out.data(), in.size(), ridgeFloat, ridgeSum, comm, nullptr);
    long wrong = rc == ridgeSuccess ? 0 : 4096;
    for (float v : out)
      if (rc == ridgeSuccess && v != kRanks * (kRanks + 1) / 2) ++wrong;
    rep.line("WRONG " + std::to_string(wrong));
    ridgeCommDestroy(comm);
    return 0;
  });
  ridgetest::reportChildFailures(res, "named fallback");
  long wrong = 0;
  std::vector<pid_t> pids;
  for (const auto& rr : res.ranks) {
    pids.push_back(rr.pid);
    for (const std::string& w : ridgetest::linesWith(rr, "WRONG ")) wrong += std::stol(w);
  }
  EXPECT_EQ(wrong, 0);
  const auto leftover = shmSegmentsOf(pids);
  EXPECT_TRUE(leftover.empty());
  ridge::chaos::record("shm", "named-segment fallback forced on every rank, then an allreduce and destroy",
                       Outcome::kRanCorrectly, wrong, static_cast<long>(leftover.size()));
}

INSTANTIATE_TEST_SUITE_P(Stages, KillAndStop, ::testing::ValuesIn(allCases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return caseName(info.param); });

}  // namespace
