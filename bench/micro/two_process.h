// Pieces the two-process micro-benchmarks (ridge-cma-variants, ridge-host-constants) share:
// a barrier in memory both processes map, the calling thread's CPU time, the CMA copy, the
// ptrace permission CMA needs, and CPU pinning.
#pragma once

#include <sched.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace ridge::bench {

// A reusable barrier of exactly two processes, living in a MAP_SHARED mapping. Spins, then
// yields: on two cores the other side may be waiting for this core.
struct TwoProcessBarrier {
  std::atomic<uint64_t> arrived{0};
  std::atomic<uint64_t> generation{0};

  void wait() {
    const uint64_t gen = generation.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) == 1) {
      arrived.store(0, std::memory_order_relaxed);
      generation.store(gen + 1, std::memory_order_release);
      return;
    }
    for (int spins = 0; generation.load(std::memory_order_acquire) == gen; ++spins)
      if (spins > 1000) sched_yield();
  }
};

// CPU time of the calling thread (user + system), µs: time slices lost to other processes
// sharing the cores do not count.
inline double threadCpuUs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

// Moves `bytes` between this process's `local` and `remote` in process `pid` with one
// process_vm_readv/writev call (a CMA call, as the shm transport's direct algorithms make).
inline bool cmaCopy(pid_t pid, void* local, uint64_t remote, size_t bytes, bool write) {
  iovec l{local, bytes}, r{reinterpret_cast<void*>(remote), bytes};
  const ssize_t n = write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
  return n == static_cast<ssize_t>(bytes);
}

// Lets any process read and write this one with process_vm_readv/writev: under Yama's
// ptrace scope 1 a process must allow it (as Ridge's shared-memory transport does for its
// peers), or the other side's CMA calls fail with EPERM. Each side calls it after the fork.
inline void allowCmaFromPeers() {
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
}

// Pins the calling thread to CPU `cpu` (modulo the CPUs online).
inline void pinToCpu(int cpu) {
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu % static_cast<int>(online > 0 ? online : 1), &set);
  sched_setaffinity(0, sizeof set, &set);
}

}  // namespace ridge::bench
