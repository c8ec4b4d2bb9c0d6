// Latency of small device allreduces through the LL path against the proxy path (P2P
// device-direct), in one run on the same GPUs (tests/gpu/run_checks.sh runs it).
//
//   ridge-gpu-coll-lat [ranks=2] [iterations=300] [rounds=5]
//
// Ranks are threads of this process, rank r on GPU r % deviceCount (threads of one process
// on one GPU run their kernels concurrently, so LL's spinning receivers are not time-sliced).
// Every rank opens two communicators: one with RIDGE_LL=on (small collectives launched as one
// LL kernel on the caller's stream) and one with RIDGE_LL=off (the same calls through the
// proxy thread, device-direct over P2P, with a barrier per batch). For each size, `rounds`
// interleaved pairs each time `iterations` back-to-back float sum allreduces per rank on its
// own stream, from a shared start to the last rank's stream synchronize; the table shows the
// median time per call of each path and their ratio (proxy / LL: above 1, LL is faster).
// Results are checked once per size and path (inputs rank + 1, exact in float). Exits 0 (a
// benchmark reports, it does not judge), 1 on an error or a wrong result, 3 without a CUDA
// device.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "coll/device/ll_path.h"
#include "ridge/ridge.h"

namespace {

constexpr size_t kSizes[] = {8, 64, 512, 4096, 16384, 65536};
constexpr size_t kMaxBytes = 65536;

// Both communicators of one rank, its stream and buffers.
struct Rank {
  ridgeComm_t ll = nullptr, proxy = nullptr;
  cudaStream_t stream = nullptr;
  float *send = nullptr, *recv = nullptr;
};

std::atomic<bool> failed{false};

void fail(int rank, const char* what, const std::string& detail) {
  std::fprintf(stderr, "ridge-gpu-coll-lat: rank %d: %s: %s\n", rank, what, detail.c_str());
  failed = true;
}

bool cudaOk(int rank, cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  fail(rank, what, cudaGetErrorString(e));
  return false;
}

bool ridgeOk(int rank, ridgeResult_t r, const char* what) {
  if (r == ridgeSuccess) return true;
  const char* e = ridgeGetLastError(nullptr);
  fail(rank, what, e ? e : ridgeGetErrorString(r));
  return false;
}

// Runs fn(rank) on one thread per rank and joins them.
template <class Fn>
void onRanks(int n, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

// Opens every rank's communicator with RIDGE_LL set to `mode` (read at init).
void openComms(int n, int devices, std::vector<Rank>& ranks, const char* mode, bool ll) {
  setenv("RIDGE_LL", mode, 1);
  ridgeUniqueId id;
  if (!ridgeOk(-1, ridgeGetUniqueId(&id), "ridgeGetUniqueId")) return;
  onRanks(n, [&](int r) {
    if (!cudaOk(r, cudaSetDevice(r % devices), "cudaSetDevice")) return;
    ridgeOk(r, ridgeCommInitRank(ll ? &ranks[r].ll : &ranks[r].proxy, n, id, r), "ridgeCommInitRank");
  });
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skipped: no CUDA device\n");
    return 3;
  }
  const int n = argc > 1 ? std::atoi(argv[1]) : 2;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 300;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 5;
  if (n < 2 || n > 8 || iters < 1 || iters > 100000 || rounds < 1 || rounds > 99) {
    std::fprintf(stderr, "usage: ridge-gpu-coll-lat [ranks 2..8] [iterations 1..100000] [rounds 1..99]\n");
    return 2;
  }
  std::vector<Rank> ranks(n);
  openComms(n, devices, ranks, "on", true);
  if (!failed) openComms(n, devices, ranks, "off", false);
  unsetenv("RIDGE_LL");
  if (!failed && !ridge::llStats(ranks[0].ll).enabled)
    fail(0, "LL", "not enabled on the RIDGE_LL=on communicator");
  if (!failed && ridge::llStats(ranks[0].ll).maxBytes < kMaxBytes)
    fail(0, "LL", "RIDGE_LL_MAX_BYTES is below 64 KiB, the largest size measured");
  if (!failed)
    onRanks(n, [&](int r) {
      Rank& k = ranks[r];
      if (!cudaOk(r, cudaSetDevice(r % devices), "cudaSetDevice") ||
          !cudaOk(r, cudaStreamCreateWithFlags(&k.stream, cudaStreamNonBlocking), "cudaStreamCreate") ||
          !cudaOk(r, cudaMalloc(&k.send, kMaxBytes), "cudaMalloc") ||
          !cudaOk(r, cudaMalloc(&k.recv, kMaxBytes), "cudaMalloc"))
        return;
      std::vector<float> in(kMaxBytes / sizeof(float), float(r + 1));
      cudaOk(r, cudaMemcpy(k.send, in.data(), kMaxBytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    });

  std::printf("# ridge-gpu-coll-lat: %d ranks (threads) on %d GPU(s), %d calls per timing, %d rounds\n", n,
              std::min(n, devices), iters, rounds);
  std::printf("# %10s %12s %12s %10s\n", "bytes", "LL (us)", "proxy (us)", "proxy/LL");
  std::barrier sync(n);
  for (size_t bytes : kSizes) {
    if (failed) break;
    const size_t count = bytes / sizeof(float);
    std::vector<double> times[2];
    for (int round = 0; round < rounds && !failed; ++round)
      for (int path = 0; path < 2 && !failed; ++path) {
        std::chrono::steady_clock::time_point start;
        onRanks(n, [&](int r) {
          Rank& k = ranks[r];
          if (!cudaOk(r, cudaSetDevice(r % devices), "cudaSetDevice")) return;
          ridgeComm_t comm = path == 0 ? k.ll : k.proxy;
          const ridgeStream_t s = reinterpret_cast<ridgeStream_t>(k.stream);
          // One untimed call, so that both paths start warm (mappings, kernels, proxy).
          ridgeOk(r, ridgeAllReduce(k.send, k.recv, count, ridgeFloat32, ridgeSum, comm, s),
                  "ridgeAllReduce");
          cudaOk(r, cudaStreamSynchronize(k.stream), "cudaStreamSynchronize");
          sync.arrive_and_wait();
          if (r == 0) start = std::chrono::steady_clock::now();
          sync.arrive_and_wait();
          for (int i = 0; i < iters && !failed; ++i)
            if (!ridgeOk(r, ridgeAllReduce(k.send, k.recv, count, ridgeFloat32, ridgeSum, comm, s),
                         "ridgeAllReduce"))
              break;
          cudaOk(r, cudaStreamSynchronize(k.stream), "cudaStreamSynchronize");
          ridgeResult_t async = ridgeSuccess;
          ridgeCommGetAsyncError(comm, &async);
          ridgeOk(r, async, "asynchronous error");
          sync.arrive_and_wait();
          if (r == 0) {
            const double us =
                std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
            times[path].push_back(us / iters);
          }
          if (round == 0) {
            std::vector<float> out(count);
            if (cudaOk(r, cudaMemcpy(out.data(), k.recv, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy")) {
              const float want = float(n * (n + 1) / 2);
              for (size_t e = 0; e < count; ++e)
                if (out[e] != want) {
                  fail(r, path == 0 ? "LL result" : "proxy result",
                       "element " + std::to_string(e) + " is " + std::to_string(out[e]));
                  break;
                }
            }
          }
        });
      }
    if (!failed)
      std::printf("  %10zu %12.2f %12.2f %10.2f\n", bytes, median(times[0]), median(times[1]),
                  median(times[1]) / median(times[0]));
  }
  // Each rank's thread destroys its communicators, as an application's ranks would.
  onRanks(n, [&](int r) {
    Rank& k = ranks[r];
    cudaSetDevice(r % devices);
    if (k.ll) ridgeCommDestroy(k.ll);
    if (k.proxy) ridgeCommDestroy(k.proxy);
    if (k.stream) cudaStreamDestroy(k.stream);
    cudaFree(k.send);
    cudaFree(k.recv);
  });
  return failed ? 1 : 0;
}
