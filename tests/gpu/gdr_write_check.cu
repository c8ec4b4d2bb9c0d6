// GPU check of the GDR-write data path: a real CUDA kernel runs the device-side verbs subset
// (transports/gdr/gdr_device.h) against the software NIC. It writes the payload into mapped pinned
// host memory standing in for NIC staging, builds the WQEs and rings the softnic's doorbell
// page (mapped into the GPU like a UAR); the softnic sends the slots to a second rank (a
// forked process with its own softnic), which checks every byte. Reports posted-write
// bandwidth from the GPU to host memory and the doorbell-to-completion time.
// Every wait is bounded in time: the kernel's (launchGdrSend bounds them by a poll count) by a
// count derived from %globaltimer, the host's by kCheckBudget; a kernel still running at the
// deadline fails the check ("TIMED OUT"), and the process exit ends it.
// Exit status: 0 passed, 1 failed, 3 no CUDA device ("skipped: no CUDA device").
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "transports/gdr/gdr_kernels.h"
#include "transports/softnic/softnic.h"
#include "transports/verbs/verbs.h"

using namespace ridge;
using namespace ridge::gdr;

namespace {

constexpr uint32_t kCapacity = 64 << 10;
constexpr uint32_t kSlots = 64;  // landing slots = slots sent: the ring never wraps, no credits back
constexpr size_t kBytes = static_cast<size_t>(kSlots) * kCapacity;
// The sender's waits for its kernel and for the receiving rank (whose own loop ends after 60 s,
// or when it is killed at this deadline); and each of the kernel's waits for a credit or a
// completion (the softnic retires a 64 KiB slot in well under a millisecond). The doorbell
// snoop ends with the kernel wait.
constexpr auto kCheckBudget = std::chrono::seconds(20);
constexpr unsigned long long kKernelWaitNs = 2'000'000'000ull;

struct Wire {  // rank 1 -> rank 0 over a pipe
  verbs::QpAddress qp;
  uint64_t landingAddr;
  uint32_t landingRkey;
};

bool check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

bool ok(const Status& s, const char* what) {
  if (!s.isOk()) std::fprintf(stderr, "%s: %s\n", what, s.message().c_str());
  return s.isOk();
}

char pattern(size_t i) {
  return static_cast<char>((i * 131) ^ (i >> 9));
}

// Rank 1: lands the slots and checks them.
int receiver(int toParent, int fromParent) {
  std::unique_ptr<verbs::Device> dev;
  std::unique_ptr<verbs::ProtectionDomain> pd;
  std::unique_ptr<verbs::CompletionQueue> cq;
  std::unique_ptr<verbs::QueuePair> qp;
  std::unique_ptr<verbs::MemoryRegion> mr;
  const uint32_t stride = slotStride(kCapacity);
  std::vector<char> ring(static_cast<size_t>(kSlots) * stride);
  if (!ok(softnic::openDevice(softnic::Options{}, &dev), "softnic") || !ok(dev->allocPd(&pd), "pd") ||
      !ok(pd->createCq(2 * kSlots, &cq), "cq"))
    return 1;
  verbs::QpCaps caps;
  caps.maxRecvWr = kSlots;
  if (!ok(pd->createQp(cq.get(), cq.get(), caps, &qp), "qp") || !ok(qp->modify(verbs::QpState::Init), "init"))
    return 1;
  if (!ok(pd->registerMemory(ring.data(), ring.size(), verbs::kAccessLocalWrite | verbs::kAccessRemoteWrite,
                             &mr),
          "mr"))
    return 1;
  for (uint32_t i = 0; i < kSlots; ++i)
    if (!ok(qp->postRecv(verbs::RecvWqe{i, 0, 0, 0, 0}), "postRecv")) return 1;
  Wire w{};
  if (!ok(qp->localAddress(&w.qp), "address")) return 1;
  w.landingAddr = reinterpret_cast<uint64_t>(ring.data());
  w.landingRkey = mr->rkey();
  verbs::QpAddress peer;
  if (write(toParent, &w, sizeof w) != sizeof w || read(fromParent, &peer, sizeof peer) != sizeof peer)
    return 1;
  if (!ok(qp->modify(verbs::QpState::Rtr, &peer), "rtr")) return 1;
  uint32_t got = 0, ci = 0;
  size_t offset = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (got < kSlots && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
    mlx5::CqeFields c;
    if (!mlx5::pollCq(*cq->mlx5Cq(), &ci, &c)) continue;
    const char* slot = ring.data() + static_cast<size_t>(got) * stride;
    if (c.opcode != mlx5::kCqeRespWrImm ||
        checkLanded(slot, kCapacity, got + 1, c.imm, c.byteCnt) != kLandedOk) {
      std::fprintf(stderr, "rank 1: slot %u bad (CQE opcode %u)\n", got, c.opcode);
      return 1;
    }
    const uint32_t bytes = reinterpret_cast<const SlotHeader*>(slot)->bytes;
    for (uint32_t i = 0; i < bytes; ++i)
      if (slot[kSlotHeaderBytes + i] != pattern(offset + i)) {
        std::fprintf(stderr, "rank 1: byte %zu differs\n", offset + i);
        return 1;
      }
    offset += bytes;
    ++got;
  }
  std::printf("rank 1: %u slots, %zu bytes landed intact\n", got, offset);
  return got == kSlots && offset == kBytes ? 0 : 1;
}

// Maps host memory the softnic allocated (mlx5 send queue, doorbell record, UAR, CQ)
// into the GPU, as the UAR and queue memory are mapped for GPU-initiated verbs.
template <typename T>
T* deviceView(T* host, size_t bytes, const char* what) {
  // The software NIC's rings, doorbell records and UAR live in ordinary heap memory, so two
  // of them can share a page: register only the pages no earlier view registered (runs of
  // them), then check that the whole object is one contiguous device range (with unified
  // addressing the device address of registered host memory is the host address).
  const uintptr_t page = 4096;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(host) & ~(page - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(host) + bytes + page - 1) & ~(page - 1);
  auto mapped = [](uintptr_t p, void** d) {
    const bool yes = cudaHostGetDevicePointer(d, reinterpret_cast<void*>(p), 0) == cudaSuccess;
    cudaGetLastError();
    return yes;
  };
  uintptr_t runStart = 0;
  for (uintptr_t p = lo; p <= hi; p += page) {
    void* d = nullptr;
    const bool free = p < hi && !mapped(p, &d);
    if (free && !runStart) runStart = p;
    if (!free && runStart) {
      const cudaError_t e = cudaHostRegister(reinterpret_cast<void*>(runStart), p - runStart, cudaHostRegisterMapped);
      if (e != cudaSuccess && e != cudaErrorHostMemoryAlreadyRegistered) {
        std::fprintf(stderr, "%s: cudaHostRegister(%p, %zu bytes): %s\n", what, reinterpret_cast<void*>(runStart),
                     static_cast<size_t>(p - runStart), cudaGetErrorString(e));
        return nullptr;
      }
      cudaGetLastError();
      runStart = 0;
    }
  }
  void* base = nullptr;
  if (!mapped(reinterpret_cast<uintptr_t>(host), &base)) {
    std::fprintf(stderr, "%s: no device address for %p\n", what, static_cast<void*>(host));
    return nullptr;
  }
  for (uintptr_t p = lo + page; p < hi; p += page) {
    void* d = nullptr;
    if (!mapped(p, &d) || static_cast<char*>(d) - static_cast<char*>(base) !=
                              static_cast<ptrdiff_t>(p - reinterpret_cast<uintptr_t>(host))) {
      std::fprintf(stderr, "%s: %zu bytes at %p are not one contiguous device range\n", what, bytes,
                   static_cast<void*>(host));
      return nullptr;
    }
  }
  return static_cast<T*>(base);
}

// Nanoseconds one poll of a word of mapped host memory takes from the GPU, by %globaltimer:
// launchGdrSend bounds each wait by a number of polls (each at least one such read), so
// kKernelWaitNs / this is a poll count that bounds every wait to about kKernelWaitNs (a few
// times that at most: an iteration reads a few such words).
__global__ void pollCostKernel(const volatile uint32_t* word, uint32_t polls, unsigned long long* out) {
  unsigned long long t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  uint32_t sum = 0;
  for (uint32_t i = 0; i < polls; ++i) sum += *word;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  out[0] = (t1 - t0) / polls;
  out[1] = sum;  // keeps the loads
}

unsigned long long spinLimitFor(unsigned long long waitNs) {
  uint32_t* word = nullptr;
  unsigned long long* out = nullptr;
  unsigned long long limit = 1ull << 20;  // if the calibration fails: ~1 s at 1 us per poll
  if (cudaHostAlloc(&word, sizeof *word, cudaHostAllocMapped) == cudaSuccess &&
      cudaHostAlloc(&out, 2 * sizeof *out, cudaHostAllocMapped) == cudaSuccess) {
    *word = 1;
    out[0] = 0;
    uint32_t* dword = nullptr;
    unsigned long long* dout = nullptr;
    cudaHostGetDevicePointer(reinterpret_cast<void**>(&dword), word, 0);
    cudaHostGetDevicePointer(reinterpret_cast<void**>(&dout), out, 0);
    pollCostKernel<<<1, 1>>>(dword, 1000, dout);
    if (cudaDeviceSynchronize() == cudaSuccess && out[0] > 0) limit = waitNs / out[0];
    std::printf("mapped host memory: %llu ns per GPU poll; kernel waits bounded at %llu polls\n", out[0],
                limit);
  }
  if (word) cudaFreeHost(word);
  if (out) cudaFreeHost(out);
  return limit > 0 ? limit : 1;
}

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("skipped: no CUDA device\n");
    return 3;
  }
  int up[2], down[2];
  if (pipe(up) != 0 || pipe(down) != 0) return 1;
  std::fflush(stdout);
  pid_t child = fork();
  if (child == 0) _exit(receiver(up[1], down[0]));

  std::unique_ptr<verbs::Device> dev;
  std::unique_ptr<verbs::ProtectionDomain> pd;
  std::unique_ptr<verbs::CompletionQueue> cq;
  std::unique_ptr<verbs::QueuePair> qp;
  std::unique_ptr<verbs::MemoryRegion> stagingMr;
  if (!ok(softnic::openDevice(softnic::Options{}, &dev), "softnic") || !ok(dev->allocPd(&pd), "pd") ||
      !ok(pd->createCq(64, &cq), "cq"))
    return 1;
  verbs::QpCaps caps;
  caps.maxSendWr = 4;
  if (!ok(pd->createQp(cq.get(), cq.get(), caps, &qp), "qp") || !ok(qp->modify(verbs::QpState::Init), "init"))
    return 1;
  Wire w{};
  verbs::QpAddress mine;
  if (!ok(qp->localAddress(&mine), "address")) return 1;
  if (read(up[0], &w, sizeof w) != sizeof w || write(down[1], &mine, sizeof mine) != sizeof mine) return 1;
  if (!ok(qp->modify(verbs::QpState::Rtr, &w.qp), "rtr") || !ok(qp->modify(verbs::QpState::Rts), "rts"))
    return 1;

  // Staging: mapped pinned host memory standing in for NIC memory (4 slots = 4 credits).
  const uint32_t stride = slotStride(kCapacity);
  char* staging = nullptr;
  if (!check(cudaHostAlloc(&staging, 4 * stride, cudaHostAllocMapped), "cudaHostAlloc staging")) return 1;
  std::memset(staging, 0, 4 * stride);
  if (!ok(pd->registerMemory(staging, 4 * stride, verbs::kAccessLocalWrite, &stagingMr), "staging mr"))
    return 1;
  const mlx5::SqView& ring = *qp->mlx5Sq();
  const mlx5::CqView& hostCq = *cq->mlx5Cq();
  SendChannel ch{};
  ch.sq = ring;
  ch.sq.ring = deviceView(ring.ring, size_t{mlx5::kWqeBbBytes} << ring.log2Bbs, "send queue");
  ch.sq.dbrec = deviceView(ring.dbrec, sizeof(uint32_t), "send doorbell record");
  ch.sq.uarDoorbell = deviceView(ring.uarDoorbell, sizeof(uint64_t), "UAR doorbell");
  ch.sq.blueFlame = nullptr;
  ch.sq.bfBytes = 0;
  ch.cq = hostCq;
  ch.cq.cqes = deviceView(hostCq.cqes, sizeof(mlx5::Cqe64) << hostCq.log2Size, "completion queue");
  ch.cq.dbrec = deviceView(hostCq.dbrec, sizeof(uint32_t), "CQ doorbell record");
  ch.signalEvery = 2;
  if (!ch.sq.ring || !ch.sq.dbrec || !ch.sq.uarDoorbell || !ch.cq.cqes || !ch.cq.dbrec) {
    std::fprintf(stderr, "could not map the send ring into the GPU\n");
    return 1;
  }
  cudaHostGetDevicePointer(reinterpret_cast<void**>(&ch.staging), staging, 0);
  ch.stagingWqeAddr = reinterpret_cast<uint64_t>(staging);
  ch.stagingLkey = stagingMr->lkey();
  ch.slotCount = 4;
  ch.slotStrideBytes = stride;
  ch.payloadCapacity = kCapacity;
  ch.remoteAddr = w.landingAddr;
  ch.remoteRkey = w.landingRkey;
  ch.remoteSlotCount = kSlots;
  CreditRecord* credit = nullptr;
  SendState* st = nullptr;
  Counters* ctr = nullptr;
  int* status = nullptr;
  unsigned long long* cycles = nullptr;
  cudaHostAlloc(&credit, sizeof *credit, cudaHostAllocMapped);
  cudaHostAlloc(&st, sizeof *st, cudaHostAllocMapped);
  cudaHostAlloc(&ctr, sizeof *ctr, cudaHostAllocMapped);
  cudaHostAlloc(&status, sizeof *status, cudaHostAllocMapped);
  cudaHostAlloc(&cycles, sizeof *cycles, cudaHostAllocMapped);
  std::memset(credit, 0, sizeof *credit);
  std::memset(st, 0, sizeof *st);
  std::memset(ctr, 0, sizeof *ctr);
  void* creditDevice = nullptr;
  cudaHostGetDevicePointer(&creditDevice, credit, 0);
  ch.remoteConsumed = static_cast<const CreditRecord*>(creditDevice);

  std::vector<char> host(kBytes);
  for (size_t i = 0; i < kBytes; ++i) host[i] = pattern(i);
  char* src = nullptr;
  if (!check(cudaMalloc(&src, kBytes), "cudaMalloc") ||
      !check(cudaMemcpy(src, host.data(), kBytes, cudaMemcpyHostToDevice), "cudaMemcpy"))
    return 1;

  const unsigned long long spinLimit = spinLimitFor(kKernelWaitNs);
  const auto deadline = std::chrono::steady_clock::now() + kCheckBudget;
  // The NIC's doorbell snoop: hardware sees a UAR write at once; the softnic engine is told.
  std::atomic<bool> stop{false};
  std::thread snoop([&] {
    uint64_t last = 0;
    while (!stop.load()) {
      const uint64_t v = *reinterpret_cast<volatile uint64_t*>(ring.uarDoorbell);
      if (v != last) {
        last = v;
        softnic::notifyDoorbell(dev.get());
      }
    }
  });
  SendState* dst = nullptr;
  Counters* dctr = nullptr;
  int* dstatus = nullptr;
  unsigned long long* dcycles = nullptr;
  cudaHostGetDevicePointer(reinterpret_cast<void**>(&dst), st, 0);
  cudaHostGetDevicePointer(reinterpret_cast<void**>(&dctr), ctr, 0);
  cudaHostGetDevicePointer(reinterpret_cast<void**>(&dstatus), status, 0);
  cudaHostGetDevicePointer(reinterpret_cast<void**>(&dcycles), cycles, 0);
  const auto t0 = std::chrono::steady_clock::now();
  bool good = check(launchGdrSend(ch, dst, dctr, src, kBytes, spinLimit, dstatus, dcycles, 0), "launch");
  // Waits for the kernel up to the deadline (cudaDeviceSynchronize would wait for ever).
  cudaError_t run = cudaErrorNotReady;
  while (good && (run = cudaStreamQuery(0)) == cudaErrorNotReady &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  if (good && run == cudaErrorNotReady) {
    std::printf(
        "gdr-write GPU check: TIMED OUT (the send kernel still ran after %lld s; %llu slots written)\n",
        static_cast<long long>(kCheckBudget.count()), (unsigned long long)ctr->slotsWritten);
    std::fflush(stdout);
    kill(child, SIGKILL);
    _exit(1);  // ends the kernel with the process
  }
  good = good && check(run, "kernel");
  const double sendSec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop.store(true);
  snoop.join();
  good = good && *status == kKernelOk && ctr->stagedLost == 0;
  int clockKhz = 0;
  cudaDeviceGetAttribute(&clockKhz, cudaDevAttrClockRate, 0);
  std::printf("rank 0: kernel status %d, %llu slots, %llu doorbells, %llu credit stalls, staged lost %llu\n",
              *status, (unsigned long long)ctr->slotsWritten, (unsigned long long)ctr->doorbells,
              (unsigned long long)ctr->creditStalls, (unsigned long long)ctr->stagedLost);
  std::printf(
      "doorbell-to-completion: %.1f us per slot (first doorbell to last retire, %zu bytes in %.3f ms; "
      "kernel clock %.3f ms)\n",
      sendSec * 1e6 / kSlots, kBytes, sendSec * 1e3,
      clockKhz ? static_cast<double>(*cycles) / clockKhz : 0.0);

  // Posted writes from the GPU into pinned host memory (the staging tier's own ceiling).
  char* sink = nullptr;
  cudaHostAlloc(&sink, kBytes, cudaHostAllocMapped);
  char* dsink = nullptr;
  cudaHostGetDevicePointer(reinterpret_cast<void**>(&dsink), sink, 0);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  launchPostedWrites(dsink, src, kBytes, 1, 132, 256, 0);
  cudaEventRecord(e0);
  const int reps = 10;
  launchPostedWrites(dsink, src, kBytes, reps, 132, 256, 0);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  std::printf("posted-write bandwidth GPU -> pinned host memory: %.1f GB/s\n",
              static_cast<double>(kBytes) * reps / (ms * 1e6));

  int cstatus = 1;
  pid_t waited = 0;
  while ((waited = waitpid(child, &cstatus, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (waited != child) {
    std::printf("rank 1 had not finished at the %lld s deadline\n",
                static_cast<long long>(kCheckBudget.count()));
    kill(child, SIGKILL);
    waitpid(child, &cstatus, 0);
    cstatus = 1;
  }
  good = good && WIFEXITED(cstatus) && WEXITSTATUS(cstatus) == 0;
  std::printf("%s\n", good ? "gdr-write GPU check: passed" : "gdr-write GPU check: FAILED");
  return good ? 0 : 1;
}
