// ridge-host-alltoall-jitter: where the time of a host all-to-all goes when it swings between
// runs (issue 21: 4 MiB on 2 ranks took 220 us in one run and 1065 us in another).
//
//   RIDGE_ALGO=alltoall:0-:allpairs ridge-host-alltoall-jitter [bytes] [iters] [fresh]
//
// Two forked ranks call ridgeAlltoAll `iters` times on `bytes` per rank (nccl-tests' size:
// the whole send buffer) and record, per call, the wall time and what happened to the
// process meanwhile (getrusage): minor page faults (first touch of a buffer page, on this
// side or in the kernel's CMA copy) and voluntary / involuntary context switches (a sleep
// on the futex, or the core taken away). `fresh` maps new buffers before every call, as a
// benchmark that allocates per size does, so every call pays the first touch.
// Rank 0 prints the median, p90 and max, and how many of the slow calls (over twice the
// median) coincided with a page fault or a context switch.
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ridge/ridge.h"

namespace {

struct Call {
  double us;
  long faults, voluntary, involuntary;
};

void* mapBytes(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

int rankMain(int rank, const ridgeUniqueId& id, size_t bytes, int iters, bool fresh) {
  ridgeComm_t comm = nullptr;
  if (ridgeCommInitRank(&comm, 2, id, rank) != ridgeSuccess) return 2;
  const size_t count = bytes / 2 / sizeof(float);  // per peer block
  auto* send = static_cast<char*>(mapBytes(bytes));
  auto* recv = static_cast<char*>(mapBytes(bytes));
  if (!send || !recv) return 3;
  std::memset(send, 1, bytes);
  std::memset(recv, 0, bytes);
  std::vector<Call> calls;
  calls.reserve(static_cast<size_t>(iters));
  for (int i = -3; i < iters; ++i) {  // 3 warm-up calls
    if (fresh) {
      munmap(send, bytes);
      munmap(recv, bytes);
      send = static_cast<char*>(mapBytes(bytes));
      recv = static_cast<char*>(mapBytes(bytes));
      if (!send || !recv) return 3;
      std::memset(send, 1, bytes);  // the input is written by the application anyway
    }
    rusage a{}, b{};
    getrusage(RUSAGE_SELF, &a);
    const auto t0 = std::chrono::steady_clock::now();
    if (ridgeAlltoAll(send, recv, count, ridgeFloat32, comm, nullptr) != ridgeSuccess) return 4;
    const auto t1 = std::chrono::steady_clock::now();
    getrusage(RUSAGE_SELF, &b);
    if (i < 0) continue;
    calls.push_back(Call{std::chrono::duration<double, std::micro>(t1 - t0).count(), b.ru_minflt - a.ru_minflt,
                         b.ru_nvcsw - a.ru_nvcsw, b.ru_nivcsw - a.ru_nivcsw});
  }
  ridgeCommDestroy(comm);
  if (rank != 0) return 0;
  std::vector<double> us;
  for (const Call& c : calls) us.push_back(c.us);
  std::sort(us.begin(), us.end());
  const double median = us[us.size() / 2];
  int slow = 0, slowFault = 0, slowSwitch = 0, anyFault = 0;
  long faults = 0;
  for (const Call& c : calls) {
    faults += c.faults;
    anyFault += c.faults > 0;
    if (c.us <= 2 * median) continue;
    ++slow;
    slowFault += c.faults > 0;
    slowSwitch += c.voluntary + c.involuntary > 0;
  }
  const char* algo = std::getenv("RIDGE_ALGO");
  std::printf(
      "%s bytes=%zu iters=%d%s: median %.1f us, p90 %.1f, max %.1f; page faults %.1f per call (%d calls "
      "with any); slow calls (> 2x median) %d: %d with a page fault, %d with a context switch\n",
      algo ? algo : "default", bytes, iters, fresh ? " fresh buffers" : "", median, us[us.size() * 9 / 10],
      us.back(), double(faults) / double(calls.size()), anyFault, slow, slowFault, slowSwitch);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : (4u << 20);
  const int iters = argc > 2 ? std::atoi(argv[2]) : 200;
  const bool fresh = argc > 3 && std::strcmp(argv[3], "fresh") == 0;
  if (bytes < 16 || iters < 1) {
    std::fprintf(stderr, "usage: ridge-host-alltoall-jitter [bytes >= 16] [iters >= 1] [fresh]\n");
    return 1;
  }
  ridgeUniqueId id;
  if (ridgeGetUniqueId(&id) != ridgeSuccess) return 1;
  pid_t pids[2];
  for (int rank = 0; rank < 2; ++rank) {
    pids[rank] = fork();
    if (pids[rank] == 0) {
      const int code = rankMain(rank, id, bytes, iters, fresh);
      std::fflush(stdout);  // _exit does not flush
      _exit(code);
    }
  }
  int rc = 0;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  return rc;
}
