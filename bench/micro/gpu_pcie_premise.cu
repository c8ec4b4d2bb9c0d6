// The premise of Ridge's GDR-write path, measured: a GPU pushes data across PCIe faster with
// its own stores (posted writes, no round trip per request) than it pulls with loads (each
// read waits for its completion), so the data path should be one where the GPU writes into
// NIC-side staging and rings a doorbell, never one where something reads GPU or host memory
// across the link on the critical path.
//
//   ridge-gpu-pcie-premise [max-bytes=16M] [trials=5]
//
// Part 1, bandwidth at 64 B to max-bytes (steps of 4x), median of `trials` timings, each of
// `reps` back-to-back operations timed with CUDA events (reps shrinks as the size grows, so
// every timing is a few milliseconds):
//   sm-write  a kernel stores 16-byte vectors from device memory into mapped pinned host memory
//   sm-read   a kernel loads 16-byte vectors from mapped pinned host memory into device memory
//   ce-d2h    cudaMemcpyAsync device -> pinned host (the copy engine)
//   ce-h2d    cudaMemcpyAsync pinned host -> device
// and the write/read ratio per size. Both SM kernels are checked once at the largest size
// (poisoned destination, every byte compared).
// Part 2, the GDR-write loop with a CPU thread standing in for the NIC: one block writes a
// slot's payload into a ring of mapped pinned host slots, fences, and stores the slot's
// sequence number into a doorbell word; the CPU thread polls the doorbell, checks every
// 8-byte word of the slot (a word not yet written when the doorbell was seen counts as torn)
// and acknowledges by storing the number into a credit word, which the kernel polls before it
// reuses a slot. Window 1 is a round trip per slot (write, doorbell, CPU sees it, CPU acks,
// GPU sees the ack); window 8 lets 8 slots be in flight. Time per slot from %globaltimer.
//
// Every spin is bounded: the kernel's by %globaltimer (kSpinTimeoutNs per wait) and a poll
// count, the CPU's by the steady clock, the whole run by kRunBudget (a measurement not started
// by then is reported as not run). Lines starting "figure:" are the summary that
// tests/gpu/run_checks.sh copies into its report. Exit: 0 measured (a benchmark reports, it
// does not judge), 1 a CUDA error, a check that failed or a timed-out loop, 3 no CUDA device.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kThreads = 256;
constexpr uint64_t kSpinTimeoutNs = 2'000'000'000;  // one wait of the doorbell kernel
constexpr uint64_t kMaxPolls = uint64_t(1) << 32;   // in case %globaltimer does not advance
constexpr auto kRunBudget = std::chrono::seconds(60);

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "ridge-gpu-pcie-premise: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

__device__ inline uint64_t globalNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Grid-stride 16-byte copies. The store kernel's destination and the load kernel's source are
// mapped pinned host memory; four loads are issued before the first store so that several
// reads are in flight per thread (a read across PCIe waits for its completion, a write does
// not).
__global__ void __launch_bounds__(kThreads)
    storeKernel(uint4* __restrict__ dst, const uint4* __restrict__ src, size_t nvec) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < nvec; i += stride) dst[i] = src[i];
}

__global__ void __launch_bounds__(kThreads)
    loadKernel(uint4* __restrict__ dst, const uint4* __restrict__ src, size_t nvec) {
  constexpr int kUnroll = 4;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < nvec; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[i + u * stride] = v[u];
  }
  for (; i < nvec; i += stride) dst[i] = src[i];
}

// The word a slot holds at 8-byte index `i` for sequence number `seq`: never zero, different
// for every slot and position, so a stale or unwritten word is recognised.
__host__ __device__ inline uint64_t slotWord(uint64_t seq, uint64_t i) {
  return (seq << 32) ^ (i * 0x9E3779B97F4A7C15ull) ^ 0x5A5A5A5A00000001ull;
}

enum LoopStatus : int { kLoopOk = 0, kLoopCreditTimeout = 1 };

struct LoopShared {   // mapped pinned host memory, written by both sides
  uint64_t doorbell;  // GPU: the last slot published
  uint64_t credit;    // CPU: the last slot consumed
  int status;         // GPU: LoopStatus
  uint64_t startNs, endNs;
};

// One block: for each slot, wait for a credit (the CPU consumed slot seq - window), write the
// payload, fence, ring. At the end wait until the CPU consumed the last slot, so the time
// covers the whole loop.
__global__ void __launch_bounds__(kThreads) doorbellKernel(uint64_t* ring, uint32_t slots, uint32_t slotWords,
                                                           uint64_t count, uint32_t window, LoopShared* sh) {
  __shared__ int failed;
  volatile uint64_t* credit = &sh->credit;
  if (threadIdx.x == 0) {
    failed = 0;
    sh->startNs = globalNs();
  }
  __syncthreads();
  for (uint64_t seq = 1; seq <= count + 1; ++seq) {
    // seq == count + 1: only the wait, for the CPU to have consumed everything.
    const uint64_t need = seq == count + 1 ? count : (seq > window ? seq - window : 0);
    if (threadIdx.x == 0 && need > 0) {
      const uint64_t t0 = globalNs();
      for (uint64_t polls = 1; *credit < need; ++polls) {
        if (polls >= kMaxPolls || ((polls & 255) == 0 && globalNs() - t0 > kSpinTimeoutNs)) {
          failed = kLoopCreditTimeout;
          break;
        }
      }
    }
    __syncthreads();
    if (failed || seq == count + 1) break;
    uint64_t* slot = ring + size_t((seq - 1) % slots) * slotWords;
    for (uint32_t i = 2 * threadIdx.x; i < slotWords; i += 2 * blockDim.x) {
      const uint2 lo = {uint32_t(slotWord(seq, i)), uint32_t(slotWord(seq, i) >> 32)};
      const uint2 hi = {uint32_t(slotWord(seq, i + 1)), uint32_t(slotWord(seq, i + 1) >> 32)};
      reinterpret_cast<uint4*>(slot)[i / 2] = make_uint4(lo.x, lo.y, hi.x, hi.y);
    }
    __threadfence_system();  // this thread's payload stores before the doorbell, for every observer
    __syncthreads();
    if (threadIdx.x == 0) *reinterpret_cast<volatile uint64_t*>(&sh->doorbell) = seq;
  }
  if (threadIdx.x == 0) {
    sh->status = failed;
    sh->endNs = globalNs();
  }
}

template <typename T>
T* devicePointer(T* host) {
  void* d = nullptr;
  return cudaHostGetDevicePointer(&d, host, 0) == cudaSuccess ? static_cast<T*>(d) : nullptr;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string sizeName(size_t bytes) {
  char b[32];
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0)
    std::snprintf(b, sizeof b, "%zu MiB", bytes >> 20);
  else if (bytes >= 1024 && bytes % 1024 == 0)
    std::snprintf(b, sizeof b, "%zu KiB", bytes >> 10);
  else
    std::snprintf(b, sizeof b, "%zu B", bytes);
  return b;
}

enum Mode { kSmWrite, kSmRead, kCeD2H, kCeH2D, kModes };
const char* const kModeNames[kModes] = {"sm-write", "sm-read", "ce-d2h", "ce-h2d"};

struct Bufs {
  uint4* dev;        // device source / destination
  uint4* devOut;     // device destination of sm-read
  uint4* host;       // pinned mapped host memory (host address)
  uint4* hostDev;    // the same, as the device addresses it
  int blocksFilled;  // blocks that fill the device
};

cudaError_t issue(Mode m, const Bufs& b, size_t bytes, cudaStream_t s) {
  const size_t nvec = bytes / 16;
  const int blocks = static_cast<int>(std::min<size_t>((nvec + kThreads - 1) / kThreads, b.blocksFilled));
  switch (m) {
    case kSmWrite: storeKernel<<<blocks, kThreads, 0, s>>>(b.hostDev, b.dev, nvec); return cudaGetLastError();
    case kSmRead:
      loadKernel<<<blocks, kThreads, 0, s>>>(b.devOut, b.hostDev, nvec);
      return cudaGetLastError();
    case kCeD2H: return cudaMemcpyAsync(b.host, b.dev, bytes, cudaMemcpyDeviceToHost, s);
    default: return cudaMemcpyAsync(b.devOut, b.host, bytes, cudaMemcpyHostToDevice, s);
  }
}

// Fills the source of mode m with a pattern, poisons its destination, runs it once at
// `bytes` and compares every byte.
bool checkMode(Mode m, const Bufs& b, size_t bytes, cudaStream_t s) {
  std::vector<uint32_t> want(bytes / 4), got(bytes / 4);
  for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<uint32_t>(i * 2654435761u + 17);
  if (m == kSmWrite) {
    if (!ok(cudaMemcpy(b.dev, want.data(), bytes, cudaMemcpyHostToDevice), "fill")) return false;
    std::memset(b.host, 0xA5, bytes);
  } else {
    std::memcpy(b.host, want.data(), bytes);
    if (!ok(cudaMemset(b.devOut, 0xA5, bytes), "poison")) return false;
  }
  if (!ok(issue(m, b, bytes, s), "check launch") || !ok(cudaStreamSynchronize(s), "check run")) return false;
  if (m == kSmWrite)
    std::memcpy(got.data(), b.host, bytes);
  else if (!ok(cudaMemcpy(got.data(), b.devOut, bytes, cudaMemcpyDeviceToHost), "read back"))
    return false;
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) bad += got[i] != want[i];
  if (bad)
    std::printf("%s: %zu of %zu words wrong at %s\n", kModeNames[m], bad, want.size(),
                sizeName(bytes).c_str());
  return bad == 0;
}

struct LoopResult {
  bool ran = false, good = false;
  double usPerSlot = 0;
  uint64_t torn = 0;
};

// Part 2 for one slot size and window.
LoopResult doorbellLoop(size_t slotBytes, uint32_t window, uint64_t count, Clock::time_point runEnd) {
  LoopResult r;
  constexpr uint32_t kSlots = 8;
  const uint32_t slotWords = static_cast<uint32_t>(slotBytes / 8);
  uint64_t* ring = nullptr;
  LoopShared* sh = nullptr;
  if (!ok(cudaHostAlloc(&ring, kSlots * slotBytes, cudaHostAllocMapped), "cudaHostAlloc ring") ||
      !ok(cudaHostAlloc(&sh, sizeof *sh, cudaHostAllocMapped), "cudaHostAlloc words"))
    return r;
  std::memset(ring, 0, kSlots * slotBytes);
  std::memset(sh, 0, sizeof *sh);
  uint64_t* ringDev = devicePointer(ring);
  LoopShared* shDev = devicePointer(sh);
  if (!ringDev || !shDev) {
    std::fprintf(stderr, "ridge-gpu-pcie-premise: cannot map the ring\n");
    return r;
  }
  r.ran = true;
  std::atomic<bool> cpuGood{true};
  std::atomic<uint64_t> torn{0};
  // The NIC's stand-in: wait for each doorbell, read the whole slot, acknowledge it.
  std::thread nic([&] {
    const auto deadline = std::min(runEnd, Clock::now() + std::chrono::seconds(10));
    volatile uint64_t* doorbell = &sh->doorbell;
    for (uint64_t seq = 1; seq <= count; ++seq) {
      for (uint64_t polls = 1; *doorbell < seq; ++polls) {
        if ((polls & 1023) == 0 && Clock::now() > deadline) {
          cpuGood = false;
          return;
        }
      }
      std::atomic_thread_fence(std::memory_order_acquire);
      const volatile uint64_t* slot = ring + size_t((seq - 1) % kSlots) * slotWords;
      uint64_t bad = 0;
      for (uint32_t i = 0; i < slotWords; ++i) bad += slot[i] != slotWord(seq, i);
      torn += bad ? 1 : 0;
      std::atomic_thread_fence(std::memory_order_release);
      *reinterpret_cast<volatile uint64_t*>(&sh->credit) = seq;
    }
  });
  cudaStream_t s = nullptr;
  bool good = ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  if (good) {
    doorbellKernel<<<1, kThreads, 0, s>>>(ringDev, kSlots, slotWords, count, window, shDev);
    good = ok(cudaGetLastError(), "doorbell launch") && ok(cudaStreamSynchronize(s), "doorbell kernel");
  }
  if (!good) *reinterpret_cast<volatile uint64_t*>(&sh->doorbell) = ~0ull;  // release the CPU thread
  nic.join();
  r.torn = torn;
  r.good = good && cpuGood && sh->status == kLoopOk && r.torn == 0;
  if (sh->status != kLoopOk)
    std::printf("doorbell loop: the kernel waited over %llu ms for a credit\n",
                static_cast<unsigned long long>(kSpinTimeoutNs / 1000000));
  if (!cpuGood) std::printf("doorbell loop: the CPU waited over 10 s for a doorbell\n");
  r.usPerSlot = static_cast<double>(sh->endNs - sh->startNs) / 1e3 / static_cast<double>(count);
  if (s) cudaStreamDestroy(s);
  cudaFreeHost(ring);
  cudaFreeHost(sh);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skipped: no CUDA device\n");
    return 3;
  }
  const size_t maxBytes = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : size_t(16) << 20;
  const int trials = argc > 2 ? std::atoi(argv[2]) : 5;
  if (maxBytes < 64 || maxBytes > (size_t(1) << 30) || maxBytes % 64 || trials < 1 || trials > 99) {
    std::fprintf(stderr,
                 "usage: ridge-gpu-pcie-premise [max-bytes 64..1G, a multiple of 64] [trials 1..99]\n");
    return 2;
  }
  const auto runEnd = Clock::now() + kRunBudget;
  cudaDeviceProp prop{};
  if (!ok(cudaGetDeviceProperties(&prop, 0), "properties")) return 1;
  Bufs b{};
  b.blocksFilled = prop.multiProcessorCount * 4;
  if (!ok(cudaMalloc(&b.dev, maxBytes), "cudaMalloc") || !ok(cudaMalloc(&b.devOut, maxBytes), "cudaMalloc") ||
      !ok(cudaHostAlloc(&b.host, maxBytes, cudaHostAllocMapped), "cudaHostAlloc"))
    return 1;
  b.hostDev = devicePointer(b.host);
  cudaStream_t s = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  if (!b.hostDev || !ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream") ||
      !ok(cudaEventCreate(&e0), "event") || !ok(cudaEventCreate(&e1), "event"))
    return 1;
  std::printf("# %s (%d SMs, PCI %04x:%02x:%02x); GB/s = bytes moved across PCIe / time\n", prop.name,
              prop.multiProcessorCount, prop.pciDomainID, prop.pciBusID, prop.pciDeviceID);
  bool good = true;
  for (Mode m : {kSmWrite, kSmRead}) good = checkMode(m, b, maxBytes, s) && good;
  std::printf("check: sm-write and sm-read moved every byte at %s: %s\n", sizeName(maxBytes).c_str(),
              good ? "yes" : "NO");

  std::printf("# %10s %10s %12s %12s %12s %12s %11s %11s\n", "bytes", "reps", "sm-write", "sm-read", "ce-d2h",
              "ce-h2d", "write/read", "d2h/h2d");
  double gbs[kModes] = {}, us[kModes] = {}, smallUs[kModes] = {};
  size_t lastSize = 0;
  for (size_t bytes = 64; bytes <= maxBytes && good; bytes *= 4) {
    if (Clock::now() > runEnd) {
      std::printf("budget reached: sizes from %s on not run\n", sizeName(bytes).c_str());
      break;
    }
    // A few milliseconds per timing: many launches when small, at least 4 when large.
    const int reps = static_cast<int>(std::clamp<size_t>((size_t(64) << 20) / bytes, 4, 1000));
    for (int m = 0; m < kModes && good; ++m) {
      std::vector<double> ms;
      good = ok(issue(Mode(m), b, bytes, s), "warm-up");  // untimed
      for (int t = 0; t < trials && good; ++t) {
        good = ok(cudaEventRecord(e0, s), "event");
        for (int r = 0; r < reps && good; ++r) good = ok(issue(Mode(m), b, bytes, s), "timed op");
        good = good && ok(cudaEventRecord(e1, s), "event") && ok(cudaEventSynchronize(e1), "timed run");
        float t1 = 0;
        if (good) good = ok(cudaEventElapsedTime(&t1, e0, e1), "elapsed");
        ms.push_back(t1);
      }
      const double med = median(ms);
      gbs[m] = med > 0 ? static_cast<double>(bytes) * reps / (med * 1e6) : 0;
      us[m] = med * 1e3 / reps;
    }
    if (!good) break;
    if (bytes == 64)
      for (int m = 0; m < kModes; ++m) smallUs[m] = us[m];
    lastSize = bytes;
    std::printf("  %10zu %10d %12.2f %12.2f %12.2f %12.2f %11.2f %11.2f\n", bytes, reps, gbs[kSmWrite],
                gbs[kSmRead], gbs[kCeD2H], gbs[kCeH2D], gbs[kSmRead] > 0 ? gbs[kSmWrite] / gbs[kSmRead] : 0,
                gbs[kCeH2D] > 0 ? gbs[kCeD2H] / gbs[kCeH2D] : 0);
  }
  if (lastSize) {
    std::printf(
        "figure: PCIe write/read (SM stores vs SM loads of mapped pinned host memory), %s: %.2f vs %.2f "
        "GB/s, "
        "ratio %.2f; copy engine d2h %.2f, h2d %.2f GB/s\n",
        sizeName(lastSize).c_str(), gbs[kSmWrite], gbs[kSmRead],
        gbs[kSmRead] > 0 ? gbs[kSmWrite] / gbs[kSmRead] : 0, gbs[kCeD2H], gbs[kCeH2D]);
    std::printf(
        "figure: PCIe 64 B, time per operation (launch included): sm-write %.2f us, sm-read %.2f us, "
        "ce-d2h %.2f us, ce-h2d %.2f us\n",
        smallUs[kSmWrite], smallUs[kSmRead], smallUs[kCeD2H], smallUs[kCeH2D]);
  }

  // Part 2.
  std::printf(
      "# doorbell loop: GPU writes a slot + doorbell into pinned host memory, a CPU thread polls,\n"
      "# checks every word and acks; 8 slots; us per slot from %%globaltimer (first wait to last ack)\n");
  std::printf("# %10s %8s %8s %12s %8s\n", "slot", "window", "slots", "us/slot", "torn");
  struct Case {
    size_t bytes;
    uint32_t window;
    uint64_t count;
  };
  const Case cases[] = {{64, 1, 2000},   {64, 8, 2000},   {4096, 1, 2000},
                        {4096, 8, 2000}, {65536, 1, 500}, {65536, 8, 500}};
  std::string fig;
  for (const Case& c : cases) {
    if (!good) break;
    if (Clock::now() > runEnd) {
      std::printf("budget reached: doorbell cases from %s, window %u on not run\n", sizeName(c.bytes).c_str(),
                  c.window);
      good = false;
      break;
    }
    const LoopResult r = doorbellLoop(c.bytes, c.window, c.count, runEnd);
    good = good && r.good;
    std::printf("  %10s %8u %8llu %12.2f %8llu%s\n", sizeName(c.bytes).c_str(), c.window,
                static_cast<unsigned long long>(c.count), r.usPerSlot,
                static_cast<unsigned long long>(r.torn), r.good ? "" : "  FAILED");
    char part[96];
    std::snprintf(part, sizeof part, "%s%s w%u %.2f us", fig.empty() ? "" : ", ", sizeName(c.bytes).c_str(),
                  c.window, r.usPerSlot);
    fig += part;
  }
  std::printf("figure: doorbell loop (GPU slot + doorbell -> CPU poll, check, ack), per slot: %s\n",
              fig.c_str());
  good = ok(cudaDeviceSynchronize(), "final synchronize") && good;
  return good ? 0 : 1;
}
