#include "netns_helper.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace ridgetest {
namespace netns {
namespace {

constexpr const char* kPrefix = "rdgt";
constexpr double kIpTimeoutSec = 10.0;

// Names of live fabrics' namespaces, for the exit and signal handlers. Fixed arrays so
// that the signal handler touches no allocator.
constexpr int kMaxLive = 4;
constexpr int kMaxNames = 9;  // hub + 8 members
struct LiveFabric {
  std::atomic<bool> used{false};
  char names[kMaxNames][64];
  int count = 0;
  pid_t holders[8];
  int holderCount = 0;
};
LiveFabric gLive[kMaxLive];
std::once_flag gHandlersOnce;

const char* ipPath() {
  static const char* path = [] {
    for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
      if (access(p, X_OK) == 0) return p;
    return static_cast<const char*>(nullptr);
  }();
  return path;
}

// Async-signal-safe removal of one namespace: fork, exec `ip netns del`, wait (bounded).
void deleteNamespaceRaw(const char* name) {
  const char* ip = ipPath();
  if (!ip) return;
  pid_t pid = fork();
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) {
      dup2(devnull, 1);
      dup2(devnull, 2);
    }
    char* const argv[] = {const_cast<char*>("ip"), const_cast<char*>("netns"), const_cast<char*>("del"),
                          const_cast<char*>(name), nullptr};
    execv(ip, argv);
    _exit(127);
  }
  if (pid < 0) return;
  for (int i = 0; i < 1000; ++i) {  // at most ~10 s
    int st;
    if (waitpid(pid, &st, WNOHANG) != 0) return;
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

void cleanupLive() {
  for (LiveFabric& f : gLive) {
    if (!f.used.load()) continue;
    for (int i = 0; i < f.holderCount; ++i) kill(f.holders[i], SIGKILL);
    for (int i = f.count - 1; i >= 0; --i) deleteNamespaceRaw(f.names[i]);
    f.used.store(false);
  }
}

void onSignal(int sig) {
  cleanupLive();
  signal(sig, SIG_DFL);
  raise(sig);
}

void installHandlers() {
  std::call_once(gHandlersOnce, [] {
    std::atexit(cleanupLive);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction sa {};
      sa.sa_handler = onSignal;
      sigemptyset(&sa.sa_mask);
      sigaction(sig, &sa, nullptr);
    }
  });
}

// Runs `ip args...`; false with the tool's output in *err when it fails or takes too long.
bool runIp(const std::vector<std::string>& args, std::string* err) {
  const char* ip = ipPath();
  if (!ip) {
    *err = "the ip tool (iproute2) is not installed";
    return false;
  }
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) {
    *err = std::string("pipe: ") + std::strerror(errno);
    return false;
  }
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>("ip"));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(p[1], 1);
    dup2(p[1], 2);
    execv(ip, argv.data());
    _exit(127);
  }
  close(p[1]);
  if (pid < 0) {
    close(p[0]);
    *err = std::string("fork: ") + std::strerror(errno);
    return false;
  }
  std::string out;
  const double deadline = nowSec() + kIpTimeoutSec;
  fcntl(p[0], F_SETFL, O_NONBLOCK);
  int status = 0;
  bool exited = false;
  while (nowSec() < deadline) {
    char buf[512];
    ssize_t n = read(p[0], buf, sizeof buf);
    if (n > 0 && out.size() < 4096) out.append(buf, static_cast<size_t>(n));
    if (waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      while ((n = read(p[0], buf, sizeof buf)) > 0 && out.size() < 4096)
        out.append(buf, static_cast<size_t>(n));
      break;
    }
    if (n <= 0) usleep(2000);
  }
  close(p[0]);
  std::string cmd = "ip";
  for (const std::string& a : args) cmd += " " + a;
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    *err = cmd + ": did not finish within 10 s";
    return false;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    *err = cmd + ": " + (out.empty() ? "failed" : out);
    return false;
  }
  return true;
}

// Effective capability bits from /proc/self/status (no libcap needed).
uint64_t effectiveCaps() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  uint64_t caps = 0;
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "CapEff:", 7) == 0) caps = std::strtoull(line + 7, nullptr, 16);
  }
  std::fclose(f);
  return caps;
}

bool joinNamespace(const std::string& path, int type, std::string* err) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *err = "open " + path + ": " + std::strerror(errno);
    return false;
  }
  int rc = setns(fd, type);
  int e = errno;
  close(fd);
  if (rc != 0) {
    *err = "setns " + path + ": " + std::strerror(e);
    return false;
  }
  return true;
}

}  // namespace

std::string missingPrivilege() {
  if (!ipPath()) return "the ip tool (iproute2) is not installed";
  const uint64_t caps = effectiveCaps();
  if (!(caps & (1ull << CAP_NET_ADMIN))) return "CAP_NET_ADMIN is not in the effective set";
  if (!(caps & (1ull << CAP_SYS_ADMIN)))
    return "CAP_SYS_ADMIN (for setns/unshare) is not in the effective set";
  if (access("/run", W_OK) != 0) return "/run is not writable (ip netns keeps its mounts there)";
  return {};
}

std::vector<int> blockPlacement(int nranks, int namespaces) {
  std::vector<int> v(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) v[static_cast<size_t>(r)] = r * namespaces / nranks;
  return v;
}

void sweepStale() {
  DIR* d = opendir("/run/netns");
  if (!d) return;
  std::vector<std::string> stale;
  int seen = 0;
  while (dirent* e = readdir(d)) {
    if (++seen > 10000) break;
    std::string n = e->d_name;
    if (n.rfind(kPrefix, 0) != 0) continue;
    long pid = std::strtol(n.c_str() + std::strlen(kPrefix), nullptr, 10);
    if (pid <= 0) continue;
    if (pid == getpid()) continue;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM) continue;  // creator still alive
    stale.push_back(n);
  }
  closedir(d);
  for (const std::string& n : stale) deleteNamespaceRaw(n.c_str());
}

std::string Fabric::address(int i) const {
  return "10.231.1." + std::to_string(i + 1);
}

bool Fabric::create(int count, std::string* err) {
  destroy();
  if (count < 1 || count > 8) {
    *err = "a fabric has 1 to 8 namespaces";
    return false;
  }
  installHandlers();
  sweepStale();
  static std::atomic<int> serial{0};
  prefix_ = std::string(kPrefix) + std::to_string(getpid()) + "_" + std::to_string(serial++);
  for (int s = 0; s < kMaxLive; ++s) {
    bool expected = false;
    if (gLive[s].used.compare_exchange_strong(expected, true)) {
      sweepSlot_ = s;
      gLive[s].count = 0;
      gLive[s].holderCount = 0;
      break;
    }
  }
  if (sweepSlot_ < 0) {
    *err = "too many fabrics at once in this process";
    return false;
  }
  LiveFabric& live = gLive[sweepSlot_];
  auto track = [&](const std::string& n) {
    std::snprintf(live.names[live.count], sizeof live.names[0], "%s", n.c_str());
    ++live.count;
  };
  auto fail = [&](const std::string& why) {
    *err = why;
    destroy();
    return false;
  };
  std::string e;
  hub_ = prefix_ + "h";
  if (!runIp({"netns", "add", hub_}, &e)) return fail(e);
  track(hub_);
  if (!runIp({"-n", hub_, "link", "add", "br0", "type", "bridge"}, &e) ||
      !runIp({"-n", hub_, "link", "set", "br0", "up"}, &e))
    return fail(e);
  for (int i = 0; i < count; ++i) {
    std::string m = prefix_ + "n" + std::to_string(i);
    std::string port = "p" + std::to_string(i);
    if (!runIp({"netns", "add", m}, &e)) return fail(e);
    members_.push_back(m);
    track(m);
    if (!runIp({"-n", hub_, "link", "add", port, "type", "veth", "peer", "name", kIfName, "netns", m}, &e) ||
        !runIp({"-n", hub_, "link", "set", port, "master", "br0"}, &e) ||
        !runIp({"-n", hub_, "link", "set", port, "up"}, &e) ||
        !runIp({"-n", m, "addr", "add", address(i) + "/24", "dev", kIfName}, &e) ||
        !runIp({"-n", m, "link", "set", kIfName, "up"}, &e) ||
        !runIp({"-n", m, "link", "set", "lo", "up"}, &e))
      return fail(e);
  }
  // One IPC namespace per member, kept alive by a holder that waits for the pipe to close.
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return fail(std::string("pipe: ") + std::strerror(errno));
  holderPipe_ = p[1];
  for (int i = 0; i < count; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(p[1]);
      if (unshare(CLONE_NEWIPC) != 0) _exit(1);
      char c;
      while (read(p[0], &c, 1) < 0 && errno == EINTR) {
      }
      _exit(0);
    }
    if (pid < 0) {
      close(p[0]);
      return fail(std::string("fork: ") + std::strerror(errno));
    }
    ipcHolders_.push_back(pid);
    live.holders[live.holderCount++] = pid;
  }
  close(p[0]);
  // Wait (bounded) until every holder is in its own IPC namespace.
  char self[64];
  ssize_t selfLen = readlink("/proc/self/ns/ipc", self, sizeof self - 1);
  for (pid_t pid : ipcHolders_) {
    bool ready = false;
    for (int t = 0; t < 500 && !ready; ++t) {
      char path[64], ns[64];
      std::snprintf(path, sizeof path, "/proc/%d/ns/ipc", static_cast<int>(pid));
      ssize_t n = readlink(path, ns, sizeof ns - 1);
      ready = n > 0 && (n != selfLen || std::memcmp(ns, self, static_cast<size_t>(n)) != 0);
      if (!ready) usleep(2000);
    }
    if (!ready) return fail("an IPC namespace holder did not start within 1 s");
  }
  return true;
}

void Fabric::destroy() {
  if (holderPipe_ >= 0) close(holderPipe_);
  holderPipe_ = -1;
  for (pid_t pid : ipcHolders_) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  ipcHolders_.clear();
  std::string e;
  for (auto it = members_.rbegin(); it != members_.rend(); ++it) runIp({"netns", "del", *it}, &e);
  members_.clear();
  if (!hub_.empty()) runIp({"netns", "del", hub_}, &e);
  hub_.clear();
  if (sweepSlot_ >= 0) gLive[sweepSlot_].used.store(false);
  sweepSlot_ = -1;
}

bool Fabric::enter(int i, std::string* err) const {
  if (i < 0 || i >= count()) {
    *err = "no namespace " + std::to_string(i);
    return false;
  }
  if (!joinNamespace("/run/netns/" + members_[i], CLONE_NEWNET, err)) return false;
  return joinNamespace("/proc/" + std::to_string(ipcHolders_[i]) + "/ns/ipc", CLONE_NEWIPC, err);
}

LaunchResult Fabric::launch(int nranks, const std::vector<int>& nsOfRank, const EnvList& env,
                            double timeoutSec, const RankBody& body, const LineHook& hook) const {
  const std::string root = address(nsOfRank.empty() ? 0 : nsOfRank[0]) + ":" + std::to_string(kRootPort);
  return launchRanks(
      nranks, timeoutSec,
      [&](int rank, Reporter& rep) {
        // A rank is no owner of the fabric: a signal to it must not tear the fabric down.
        for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, SIG_DFL);
        std::string err;
        const int ns = rank < static_cast<int>(nsOfRank.size()) ? nsOfRank[rank] : 0;
        if (!enter(ns, &err)) {
          rep.fail("rank " + std::to_string(rank),
                   "cannot enter namespace " + std::to_string(ns) + ": " + err);
          return 90;
        }
        setenv("RIDGE_RANK", std::to_string(rank).c_str(), 1);
        setenv("RIDGE_WORLD_SIZE", std::to_string(nranks).c_str(), 1);
        setenv("RIDGE_ROOT_ADDR", root.c_str(), 1);
        setenv("RIDGE_SOCKET_IFNAME", (std::string("=") + kIfName).c_str(), 1);
        for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
        return body(rank, rep);
      },
      hook);
}

ridgeComm_t initFromEnv(int rank, Reporter& rep) {
  ridgeComm_t comm = nullptr;
  ridgeResult_t r = ridgeCommInitFromEnv(&comm);
  if (r != ridgeSuccess) {
    rep.fail("init rank " + std::to_string(rank), "ridgeCommInitFromEnv: " + describeResult(r));
    return nullptr;
  }
  return comm;
}

}  // namespace netns
}  // namespace ridgetest
