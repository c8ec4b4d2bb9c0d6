// The host constants of the planner (host copy rate, TCP hop) and the figures a cost model
// of the host algorithms would need (docs/planner.md: there is none yet), measured here:
// two processes, one per core (as two ranks of a host communicator), run each primitive at
// the same time on private buffers and the figures are per process. docs/planner.md
// records a run and what each figure feeds.
//
//   ridge-host-constants [--rounds R]      (median of R rounds, default 5)
//
//   step        one-way hand-off of a flag in shared memory between the two cores (µs):
//               the hardware's part of a slot hand-off
//   ridge step  one way of an 8-byte ridgeSend/ridgeRecv ping-pong between two ranks (µs):
//               a step as the collectives pay it (slot, progress engine, wake-up)
//   copy        memcpy, GB/s copied, at a 256 KiB working set (one slot: cache) and at
//               64 MiB (memory)
//   reduce      float sum of two inputs into an output (Ridge's reduce2), GB/s of output
//   cma call    process_vm_readv of 8 bytes from the peer (µs): the syscall's fixed cost
//   cma read    process_vm_readv of the peer's buffer in 128 KiB pieces into a local
//               128 KiB bounce buffer, GB/s (cache: 256 KiB source; memory: 64 MiB)
//   cma write   process_vm_writev of a local 128 KiB buffer into the peer's buffer, GB/s
//               (memory: pays the read-for-ownership of the destination lines)
//   cross copy  memcpy out of a shared buffer the other process has just written, GB/s
//               (cache: 256 KiB; memory: 64 MiB): the lines move between the cores
//   tcp         one-way latency of 8 bytes over loopback TCP with TCP_NODELAY between the
//               two processes (µs, wall time: includes waking the receiver)
//   tcp kernel path  the same 8 bytes written and read back by one thread over a loopback
//               connection to itself (µs of CPU time): the kernel's send and receive paths
//               alone, which other processes' load does not inflate
//
// Rates and syscall costs are CPU time of the measuring thread, so time slices lost to
// other processes do not count (memory bandwidth they take still does); the two hand-offs
// (step, tcp) are wall time and grow with the machine's load.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/micro/two_process.h"
#include "reduce/reduce.h"
#include "ridge/ridge.h"

namespace {

using Clock = std::chrono::steady_clock;

double nowUs() {
  return std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count();
}

// Rates and syscall costs are timed on the thread's CPU time so that other processes sharing
// the cores do not count; hand-offs between the two processes cannot be, they are wall time.
double cpuUs() {
  return ridge::bench::threadCpuUs();
}

void pin(int cpu) {
  ridge::bench::pinToCpu(cpu);
}

// Shared between the two processes: a barrier, the ping-pong flag, each side's buffer
// address (for CMA) and each side's result.
struct Shared {
  ridge::bench::TwoProcessBarrier sync;
  std::atomic<int64_t> flag{0};
  uint64_t bufferAddress[2] = {0, 0};
  pid_t pid[2] = {0, 0};
  double result[2] = {0, 0};
  int selfPair[2] = {-1, -1};                 // side 0's loopback connection to itself (both ends)
  char* crossBuffer[2] = {nullptr, nullptr};  // shared mappings, one written by each side
};

void barrier(Shared* s) {
  s->sync.wait();
}

constexpr size_t kCacheBytes = 256 << 10;  // one shm slot (RIDGE_SHM_SLOT_BYTES)
constexpr size_t kMemoryBytes = 64 << 20;  // far beyond any last-level cache here
constexpr size_t kCmaChunk = 128 << 10;    // the direct algorithms' bounce chunk

// Repeats `body(bytes)` over a buffer of `bytes` for about 0.2 s; GB/s of `bytes` per pass.
template <typename Body>
double rate(size_t bytes, Body body) {
  body();  // warm: pages touched, caches filled
  int passes = 0;
  const double t0 = cpuUs();
  double t = t0;
  while (t - t0 < 200000 || passes < 3) {
    body();
    ++passes;
    t = cpuUs();
  }
  return static_cast<double>(bytes) * passes / ((t - t0) * 1e3);
}

// One measurement run on both sides; returns side `me`'s figure.
double measure(const std::string& what, int me, Shared* s, int tcpFd) {
  const int peer = 1 - me;
  if (what == "step") {
    constexpr int kTrips = 20000;
    barrier(s);
    const double t0 = nowUs();
    for (int i = 0; i < kTrips; ++i) {
      // Side 0 writes odd values and waits for the next even one; side 1 answers.
      const int64_t mine = 2 * i + (me == 0 ? 1 : 2);
      if (me == 0) s->flag.store(mine, std::memory_order_release);
      while (s->flag.load(std::memory_order_acquire) != (me == 0 ? mine + 1 : mine - 1)) {
      }
      if (me == 1) s->flag.store(mine, std::memory_order_release);
    }
    const double us = (nowUs() - t0) / (2.0 * kTrips);
    barrier(s);
    if (me == 0) s->flag.store(0);
    barrier(s);
    return us;
  }
  if (what == "tcp kernel path") {
    // Side 0 alone: 8 bytes written into its end and read back out of a second loopback
    // connection to itself: the send and receive paths of the kernel without a wake-up.
    double us = 0;
    if (me == 0) {
      char b[8] = {};
      constexpr int kTrips = 20000;
      const double t0 = cpuUs();
      for (int i = 0; i < kTrips; ++i) {
        if (write(s->selfPair[0], b, sizeof b) != sizeof b) return -1;
        for (size_t got = 0; got < sizeof b;) {
          const ssize_t r = read(s->selfPair[1], b + got, sizeof b - got);
          if (r <= 0) return -1;
          got += static_cast<size_t>(r);
        }
      }
      us = (cpuUs() - t0) / kTrips;
    }
    barrier(s);
    return us;
  }
  if (what == "tcp") {
    constexpr int kTrips = 5000;
    char b[8] = {};
    barrier(s);
    const double t0 = nowUs();
    for (int i = 0; i < kTrips; ++i) {
      if (me == 0 && write(tcpFd, b, sizeof b) != sizeof b) return -1;
      for (size_t got = 0; got < sizeof b;) {
        const ssize_t r = read(tcpFd, b + got, sizeof b - got);
        if (r <= 0) return -1;
        got += static_cast<size_t>(r);
      }
      if (me == 1 && write(tcpFd, b, sizeof b) != sizeof b) return -1;
    }
    const double us = (nowUs() - t0) / (2.0 * kTrips);
    barrier(s);
    return us;
  }
  const bool memory = what.find("memory") != std::string::npos;
  if (what.rfind("cross copy", 0) == 0) {
    // Each side fills its shared buffer, then both read the other's: the read moves lines
    // the other core wrote, as every slot and CMA read of the collectives does. Only the
    // read is timed.
    const size_t n = memory ? kMemoryBytes : kCacheBytes;
    std::vector<char> src(n, 1), dst(n, 0);
    double readUs = 0, bytesRead = 0;
    for (int pass = 0; pass < (memory ? 4 : 200); ++pass) {
      std::memcpy(s->crossBuffer[me], src.data(), n);
      barrier(s);
      const double t0 = cpuUs();
      std::memcpy(dst.data(), s->crossBuffer[peer], n);
      readUs += cpuUs() - t0;
      bytesRead += static_cast<double>(n);
      barrier(s);
    }
    return bytesRead / (readUs * 1e3);
  }
  const size_t bytes = memory ? kMemoryBytes : kCacheBytes;
  std::vector<float> a(bytes / 4, 1.0f), b(bytes / 4, 2.0f), out(bytes / 4, 0.0f);
  std::vector<char> bounce(kCmaChunk);
  s->bufferAddress[me] = reinterpret_cast<uint64_t>(a.data());
  barrier(s);
  const pid_t other = s->pid[peer];
  const uint64_t remote = s->bufferAddress[peer];
  double r = 0;
  if (what.rfind("copy", 0) == 0) {
    r = rate(bytes, [&] { std::memcpy(out.data(), a.data(), bytes); });
  } else if (what.rfind("reduce", 0) == 0) {
    r = rate(bytes,
             [&] { ridge::reduce2(out.data(), a.data(), b.data(), bytes / 4, ridgeFloat, ridgeSum, 0); });
  } else if (what == "cma call") {
    constexpr int kCalls = 20000;
    const double t0 = cpuUs();
    for (int i = 0; i < kCalls; ++i)
      if (!ridge::bench::cmaCopy(other, bounce.data(), remote, 8, /*write=*/false)) return -1;
    r = (cpuUs() - t0) / kCalls;
  } else if (what.rfind("cma read", 0) == 0 || what.rfind("cma write", 0) == 0) {
    const bool write = what.rfind("cma write", 0) == 0;
    r = rate(bytes, [&] {
      for (size_t off = 0; off < bytes; off += kCmaChunk)
        if (!ridge::bench::cmaCopy(other, bounce.data(), remote + off, kCmaChunk, write)) std::abort();
    });
  }
  // The peer's buffer must stay alive until both sides are done with each other's.
  barrier(s);
  return r;
}

int tcpPair(int me, Shared* s, int listenFd, uint16_t port) {
  barrier(s);
  if (me == 0) {
    const int fd = accept(listenFd, nullptr, nullptr);
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
  }
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return -1;
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else {
      // Anything else (--help included) prints the usage instead of starting a measurement.
      std::fprintf(a == "--help" || a == "-h" ? stdout : stderr,
                   "usage: ridge-host-constants [--rounds R]   (median of R rounds, default 5; the\n"
                   "figures and what each feeds: the comment at the top of bench/micro/host_constants.cpp,\n"
                   "docs/planner.md)\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  auto* s = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (s) Shared();
  const int listenFd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (bind(listenFd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(listenFd, 1) != 0 ||
      getsockname(listenFd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("loopback socket");
    return 1;
  }
  const uint16_t port = ntohs(addr.sin_port);
  for (char*& b : s->crossBuffer)
    b = static_cast<char*>(
        mmap(nullptr, kMemoryBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ridgeUniqueId id;
  if (ridgeGetUniqueId(&id) != ridgeSuccess) {
    std::fprintf(stderr, "ridge-host-constants: ridgeGetUniqueId failed\n");
    return 1;
  }
  s->pid[0] = getpid();
  const pid_t child = fork();
  const int me = child == 0 ? 1 : 0;
  if (me == 1) s->pid[1] = getpid();
  pin(me);
  ridge::bench::allowCmaFromPeers();  // either side reads the other with process_vm_readv
  const int tcpFd = tcpPair(me, s, listenFd, port);
  if (me == 0) {
    // A second connection, both ends kept by side 0 (for the kernel path alone).
    const int a = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(a, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return 1;
    const int b = accept(listenFd, nullptr, nullptr);
    const int one = 1;
    setsockopt(a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(b, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    s->selfPair[0] = a;
    s->selfPair[1] = b;
  }
  const char* const kWhat[] = {
      "step",     "copy cache",      "copy memory",      "reduce cache",     "reduce memory",
      "cma call", "cma read cache",  "cma read memory",  "cma write cache",  "cma write memory",
      "tcp",      "tcp kernel path", "cross copy cache", "cross copy memory"};
  const char* const kUnit[] = {"us",   "GB/s", "GB/s", "GB/s", "GB/s", "us",   "GB/s",
                               "GB/s", "GB/s", "GB/s", "us",   "us",   "GB/s", "GB/s"};
  if (me == 0)
    std::printf("# ridge-host-constants: 2 processes on cores 0 and 1, median of %d rounds, per process\n",
                rounds);
  for (size_t w = 0; w < sizeof kWhat / sizeof kWhat[0]; ++w) {
    std::vector<double> v;
    for (int r = 0; r < rounds; ++r) {
      const double x = measure(kWhat[w], me, s, tcpFd);
      s->result[me] = x;
      barrier(s);
      // Both sides' figures count: the slower side is what a collective waits for.
      // (The kernel path runs on side 0 alone.)
      const bool aloneOnSide0 = std::string(kWhat[w]) == "tcp kernel path";
      v.push_back(aloneOnSide0                    ? s->result[0]
                  : std::string(kUnit[w]) == "us" ? std::max(s->result[0], s->result[1])
                                                  : std::min(s->result[0], s->result[1]));
      barrier(s);
    }
    std::sort(v.begin(), v.end());
    if (me == 0) std::printf("%-18s %10.3f %s\n", kWhat[w], v[v.size() / 2], kUnit[w]);
    std::fflush(stdout);
  }
  // The step as the collectives pay it: an 8-byte ridgeSend/ridgeRecv ping-pong between
  // the two ranks of a communicator (shared-memory transport, progress engine and all).
  ridgeComm_t comm = nullptr;
  if (ridgeCommInitRank(&comm, 2, id, me) != ridgeSuccess) {
    std::fprintf(stderr, "ridge-host-constants: ridgeCommInitRank failed\n");
    _exit(1);
  }
  std::vector<double> steps;
  for (int r = 0; r < rounds; ++r) {
    constexpr int kTrips = 2000;
    char b[8] = {};
    const double t0 = nowUs();
    for (int i = 0; i < kTrips; ++i) {
      if (me == 0) {
        ridgeSend(b, 8, ridgeChar, 1, comm, nullptr);
        ridgeRecv(b, 8, ridgeChar, 1, comm, nullptr);
      } else {
        ridgeRecv(b, 8, ridgeChar, 0, comm, nullptr);
        ridgeSend(b, 8, ridgeChar, 0, comm, nullptr);
      }
    }
    steps.push_back((nowUs() - t0) / (2.0 * kTrips));
  }
  std::sort(steps.begin(), steps.end());
  if (me == 0) std::printf("%-18s %10.3f %s\n", "ridge step", steps[steps.size() / 2], "us");
  ridgeCommDestroy(comm);
  if (me == 1) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  return 0;
}
