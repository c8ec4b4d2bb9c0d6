// Pieces the two-process micro-benchmarks (ridge-cma-variants, ridge-host-constants) share:
// a barrier in memory both processes map, and the calling thread's CPU time.
#pragma once

#include <sched.h>
#include <time.h>

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

}  // namespace ridge::bench
