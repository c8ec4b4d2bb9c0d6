// Multi-process test harness: forks one child process per rank, lets each child run a body
// that reports through a pipe, and turns what the children reported into GoogleTest failures
// in the parent. Used by the collective matrix, the group tests, the fault tests and the
// bad-input tests.
//
// Protocol on the pipe (one line per message, written by the child):
//   FAIL <where>: <text>   a check failed; the parent turns it into ADD_FAILURE
//   INFO <text>            printed by the parent
//   <anything else>        kept for the test's own hook (e.g. "STARTED", "RESULT ...")
//   EXIT <rc>              last line, the body's return value (0 = fine)
//
// Children never touch GoogleTest and leave with _exit(), so no destructor or atexit
// handler of the parent's state (GoogleTest, the library's rendezvous thread) runs twice.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ridge/ridge.h"
#include "time_scale.h"

namespace ridgetest {

inline double nowSec() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

/** Bootstrap over loopback only; called by every test before the library reads settings. */
inline void setLoopbackEnv() {
  setenv("RIDGE_SOCKET_IFNAME", "lo", 1);
}

inline const char* resultName(ridgeResult_t r) {
  switch (r) {
    case ridgeSuccess: return "ridgeSuccess";
    case ridgeUnhandledCudaError: return "ridgeUnhandledCudaError";
    case ridgeSystemError: return "ridgeSystemError";
    case ridgeInternalError: return "ridgeInternalError";
    case ridgeInvalidArgument: return "ridgeInvalidArgument";
    case ridgeInvalidUsage: return "ridgeInvalidUsage";
    case ridgeRemoteError: return "ridgeRemoteError";
    case ridgeInProgress: return "ridgeInProgress";
    case ridgeTimeout: return "ridgeTimeout";
    case ridgeAborted: return "ridgeAborted";
    default: return "(out-of-range result)";
  }
}

inline std::string describeResult(ridgeResult_t r, ridgeComm_t comm = nullptr) {
  std::string s = std::string(resultName(r)) + " (" + std::to_string(static_cast<int>(r)) + ")";
  const char* last = ridgeGetLastError(comm);
  if (last != nullptr && last[0] != '\0') s += " last error: \"" + std::string(last) + "\"";
  return s;
}

/** Child side of the pipe. */
class Reporter {
 public:
  static constexpr int kMaxFailLines = 60;
  explicit Reporter(int fd) : fd_(fd) {}

  void line(const std::string& text) {
    std::string t = text;
    for (char& c : t) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    t.push_back('\n');
    const char* p = t.data();
    size_t left = t.size();
    while (left > 0) {
      ssize_t w = ::write(fd_, p, left);
      if (w < 0) {
        if (errno == EINTR) continue;
        return;  // parent gone; nothing more to do
      }
      p += w;
      left -= static_cast<size_t>(w);
    }
  }
  void fail(const std::string& where, const std::string& text) {
    ++failures_;
    if (failures_ <= kMaxFailLines) line("FAIL " + where + ": " + text);
    if (failures_ == kMaxFailLines + 1) line("FAIL (more failures suppressed)");
  }
  void info(const std::string& text) { line("INFO " + text); }
  int failures() const { return failures_; }

 private:
  int fd_;
  int failures_ = 0;
};

struct RankResult {
  int rank = -1;
  pid_t pid = -1;
  std::vector<std::string> lines;
  bool exited = false;  // exited normally (not by a signal)
  int exitCode = -1;
  int termSignal = 0;
  bool sawExitLine = false;
  bool killedByUs = false;
};

struct LaunchResult {
  std::vector<RankResult> ranks;
  bool timedOut = false;
  double elapsed = 0;
};

/** Lets a line hook act on the children while they run (e.g. SIGKILL one of them). */
class LaunchControl {
 public:
  LaunchControl(std::vector<pid_t>& pids, std::vector<RankResult>& res) : pids_(pids), res_(res) {}
  void killRank(int rank, int sig) {
    if (pids_[rank] > 0) {
      ::kill(pids_[rank], sig);
      res_[rank].killedByUs = true;
    }
  }

 private:
  std::vector<pid_t>& pids_;
  std::vector<RankResult>& res_;
};

using RankBody = std::function<int(int rank, Reporter& rep)>;
using LineHook = std::function<void(int rank, const std::string& line, double t, LaunchControl& ctl)>;

/**
 * Forks `nranks` children, child r runs body(r, reporter). Waits at most timeoutSec (times
 * RIDGE_TEST_TIME_SCALE) for all of them, then SIGKILLs the rest. Lines are handed to `hook` as they arrive
 * (with the arrival time from nowSec()).
 */
inline LaunchResult launchRanks(int nranks, double timeoutSec, const RankBody& body,
                                const LineHook& hook = nullptr) {
  LaunchResult out;
  out.ranks.resize(nranks);
  std::vector<pid_t> pids(nranks, -1);
  std::vector<int> fds(nranks, -1);
  std::vector<std::string> partial(nranks);
  const pid_t parent = getpid();
  const double t0 = nowSec();
  std::fflush(stdout);
  std::fflush(stderr);
  for (int r = 0; r < nranks; ++r) {
    int p[2];
    if (pipe(p) != 0) {
      ADD_FAILURE() << "pipe() failed: " << strerror(errno);
      break;
    }
    pid_t pid = fork();
    if (pid < 0) {
      ADD_FAILURE() << "fork() failed: " << strerror(errno);
      close(p[0]);
      close(p[1]);
      break;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(98);
      for (int q = 0; q < r; ++q) close(fds[q]);
      close(p[0]);
      int rc = 97;
      {
        Reporter rep(p[1]);
        try {
          rc = body(r, rep);
        } catch (const std::exception& e) {
          rep.fail("rank " + std::to_string(r), std::string("exception: ") + e.what());
          rc = 96;
        } catch (...) {
          rep.fail("rank " + std::to_string(r), "unknown exception");
          rc = 96;
        }
        if (rc == 0 && rep.failures() > 0) rc = 1;
        rep.line("EXIT " + std::to_string(rc));
      }
      _exit(rc);
    }
    close(p[1]);
    pids[r] = pid;
    fds[r] = p[0];
    out.ranks[r].rank = r;
    out.ranks[r].pid = pid;
  }

  LaunchControl ctl(pids, out.ranks);
  const double deadline = t0 + scaledSeconds(timeoutSec);
  char buf[65536];
  for (;;) {
    std::vector<pollfd> pfd;
    std::vector<int> who;
    for (int r = 0; r < nranks; ++r) {
      if (fds[r] >= 0) {
        pfd.push_back({fds[r], POLLIN, 0});
        who.push_back(r);
      }
    }
    if (pfd.empty()) break;
    double left = deadline - nowSec();
    if (left <= 0) {
      out.timedOut = true;
      break;
    }
    int ms = static_cast<int>(left * 1000.0);
    if (ms > 200) ms = 200;
    int n = poll(pfd.data(), pfd.size(), ms);
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    for (size_t i = 0; i < pfd.size(); ++i) {
      if (pfd[i].revents == 0) continue;
      int r = who[i];
      ssize_t got = read(fds[r], buf, sizeof(buf));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        close(fds[r]);
        fds[r] = -1;
        if (!partial[r].empty()) out.ranks[r].lines.push_back(partial[r]);
        continue;
      }
      partial[r].append(buf, static_cast<size_t>(got));
      size_t pos;
      while ((pos = partial[r].find('\n')) != std::string::npos) {
        std::string ln = partial[r].substr(0, pos);
        partial[r].erase(0, pos + 1);
        if (ln.rfind("INFO ", 0) == 0) {
          std::printf("[rank %d] %s\n", r, ln.c_str() + 5);
          std::fflush(stdout);
        }
        if (ln.rfind("EXIT ", 0) == 0) out.ranks[r].sawExitLine = true;
        out.ranks[r].lines.push_back(ln);
        if (hook) hook(r, ln, nowSec(), ctl);
      }
    }
  }
  for (int r = 0; r < nranks; ++r) {
    if (fds[r] >= 0) close(fds[r]);
  }
  // Reap: children that closed their pipe are exiting; the rest are killed.
  for (int r = 0; r < nranks; ++r) {
    if (pids[r] <= 0) continue;
    int status = 0;
    pid_t w = 0;
    const double reapDeadline = nowSec() + (out.timedOut ? 0.0 : 5.0);
    while ((w = waitpid(pids[r], &status, WNOHANG)) == 0 && nowSec() < reapDeadline) usleep(2000);
    if (w == 0) {
      ::kill(pids[r], SIGKILL);
      out.ranks[r].killedByUs = true;
      w = waitpid(pids[r], &status, 0);
    }
    if (w == pids[r]) {
      if (WIFEXITED(status)) {
        out.ranks[r].exited = true;
        out.ranks[r].exitCode = WEXITSTATUS(status);
      } else if (WIFSIGNALED(status)) {
        out.ranks[r].termSignal = WTERMSIG(status);
      }
    }
  }
  out.elapsed = nowSec() - t0;
  return out;
}

/** Turns FAIL lines into test failures; `expectCleanExit` also wants EXIT 0 from every rank. */
inline void reportChildFailures(const LaunchResult& res, const std::string& what,
                                bool expectCleanExit = true) {
  if (res.timedOut) {
    ADD_FAILURE() << what << ": ranks did not finish within the harness deadline (elapsed " << res.elapsed
                  << " s); killed them";
  }
  for (const RankResult& rr : res.ranks) {
    for (const std::string& ln : rr.lines) {
      if (ln.rfind("FAIL ", 0) == 0) ADD_FAILURE() << what << " rank " << rr.rank << ": " << ln.substr(5);
    }
    if (!expectCleanExit) continue;
    if (!rr.exited) {
      ADD_FAILURE() << what << " rank " << rr.rank << " died by signal " << rr.termSignal
                    << (rr.killedByUs ? " (killed by the harness)" : "") << "; its last line: \""
                    << (rr.lines.empty() ? std::string() : rr.lines.back()) << "\"";
    } else if (rr.exitCode != 0 || !rr.sawExitLine) {
      ADD_FAILURE() << what << " rank " << rr.rank << " exit code " << rr.exitCode
                    << (rr.sawExitLine ? "" : " without reaching the end of its body");
    }
  }
}

/** Lines of one rank that start with `prefix` (prefix stripped). */
inline std::vector<std::string> linesWith(const RankResult& rr, const std::string& prefix) {
  std::vector<std::string> v;
  for (const std::string& ln : rr.lines) {
    if (ln.rfind(prefix, 0) == 0) v.push_back(ln.substr(prefix.size()));
  }
  return v;
}

/** The "name=value name=value ..." items of one line (values as unsigned integers). */
inline std::map<std::string, uint64_t> parseNameValues(const std::string& line) {
  std::map<std::string, uint64_t> m;
  size_t pos = 0;
  while (pos < line.size()) {
    size_t sp = line.find(' ', pos);
    if (sp == std::string::npos) sp = line.size();
    const std::string item = line.substr(pos, sp - pos);
    const size_t eq = item.find('=');
    if (eq != std::string::npos) m[item.substr(0, eq)] = std::strtoull(item.c_str() + eq + 1, nullptr, 10);
    pos = sp + 1;
  }
  return m;
}

/**
 * A receiver whose receive gave up: poisons `buf` (0x5A), reports POISONED (the parent then
 * lets the stopped sender go on), waits 1.5 s while the sender sends, and reports CHANGED
 * with the number of bytes that changed since (must be 0: nothing lands after a withdrawal).
 */
inline void poisonAndReportChanges(std::vector<uint8_t>& buf, Reporter& rep) {
  std::memset(buf.data(), 0x5A, buf.size());
  rep.line("POISONED");
  usleep(1500 * 1000);  // the sender resumes and sends meanwhile
  size_t changed = 0;
  for (uint8_t b : buf) changed += b != 0x5A;
  rep.line("CHANGED " + std::to_string(changed));
}

/** ridgeGetUniqueId for the parent; fails the test if it does not work. */
inline bool makeUniqueId(ridgeUniqueId* id) {
  ridgeResult_t r = ridgeGetUniqueId(id);
  EXPECT_EQ(r, ridgeSuccess) << "ridgeGetUniqueId: " << describeResult(r);
  return r == ridgeSuccess;
}

/** Child side: blocking init, reporting failure. */
inline ridgeComm_t initRank(int nranks, const ridgeUniqueId& id, int rank, Reporter& rep) {
  ridgeComm_t comm = nullptr;
  ridgeResult_t r = ridgeCommInitRank(&comm, nranks, id, rank);
  if (r != ridgeSuccess) {
    rep.fail("init rank " + std::to_string(rank), "ridgeCommInitRank: " + describeResult(r));
    return nullptr;
  }
  return comm;
}

}  // namespace ridgetest
