// Ways a 2-rank allreduce (float sum) can use cross-memory attach, measured side by side
// in two processes pinned to cores 0 and 1, variants interleaved so that load from
// other processes on the machine hits every variant alike. Per variant it prints the
// median and the minimum time of one allreduce (the minimum is the figure least
// disturbed by other processes), and checks every output.
//
//   slice      rank r reduces its half: read the peer's input half (process_vm_readv
//              into a bounce chunk), reduce with its own input into a cached chunk,
//              process_vm_writev that into the peer's output, stream it to its own
//              output (Ridge's direct algorithm)
//   slice-pull like slice, but each rank streams its half's result into its own output
//              and, after a barrier, process_vm_readv's the peer's half of the result
//              into its output
//   full       each rank reads the peer's whole input and reduces the whole buffer
//              itself, into a cached chunk that is then streamed to its output: no
//              kernel write into any output
//   full-nt    full, the reduction storing straight to the output with non-temporal
//              stores (no cached chunk)
//   full-c     full, the reduction storing straight to the output with ordinary stores
//   full-l1    full, the reduction going through an L1-sized piece that is then
//              streamed to the output
//   slice-ip   slice in place, on buffers of its own (timed only, not checked): the
//              same passes, but every line the kernel or the rank writes was read
//              just before, so no write misses
//   slice-pp   slice, pipelined: each rank's half of the result goes into a ring of
//              cached chunks, from which the peer pulls it (process_vm_readv into a
//              bounce chunk) and streams it into its own output; no kernel write into
//              an output, no read-for-ownership, but a spin-wait per chunk
//
// The CPU-time columns (per rank, the larger of the two) are the ones to compare on a
// loaded machine: they leave out the time a rank was not running.
//
//   ridge-cma-variants [MiB, default 16] [chunk KiB, default 128] [rounds, default 5]
//                      [piece KiB of full-l1, default 8] [bounce offset from a page, default 0]
#include <immintrin.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#include "bench/micro/two_process.h"
#include "reduce/reduce.h"
#include "reduce/stream_copy.h"

namespace {

struct Shared {
  ridge::bench::TwoProcessBarrier sync;
  uint64_t in[2], out[2], ip[2];
  pid_t pid[2];
  uint64_t ring[2];                   // slice-pp: each rank's ring of result chunks
  std::atomic<uint64_t> produced[2];  // slice-pp: result chunks each rank has made
  std::atomic<uint64_t> consumed[2];  // slice-pp: peer result chunks each rank has read
  double us[2][9][4096];
  double cpu[2][9][4096];  // CPU time of the rank itself (user + system)
};

Shared* gShared;

void barrier() {
  gShared->sync.wait();
}

void cma(pid_t pid, void* local, uint64_t remote, size_t bytes, bool write) {
  if (!ridge::bench::cmaCopy(pid, local, remote, bytes, write)) {
    std::perror("cma");
    std::exit(1);
  }
}

// dst = a + b with non-temporal stores; dst 32-byte aligned, n a multiple of 16.
void sumStream(float* dst, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    __m256 x = _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
    __m256 y = _mm256_add_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8));
    _mm256_stream_ps(dst + i, x);
    _mm256_stream_ps(dst + i + 8, y);
  }
  _mm_sfence();
}

double cpuUs() {
  return ridge::bench::threadCpuUs();
}

const char* kNames[] = {"slice",  "slice-pull", "full",     "full-nt",
                        "full-c", "full-l1",    "slice-ip", "slice-pp"};
constexpr int kVariants = 8;

}  // namespace

int main(int argc, char** argv) {
  if (!__builtin_cpu_supports("avx2")) {
    std::fprintf(stderr, "ridge-cma-variants: full-nt needs AVX2, which this CPU lacks\n");
    return 2;
  }
  const size_t bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 16) << 20;
  const size_t chunk = (argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 128) << 10;
  const int rounds = std::max(1, std::min(argc > 3 ? std::atoi(argv[3]) : 5, 2048));
  const int iters = std::max(2, std::min(int((256u << 20) / bytes), 4096 / rounds));  // fits Shared::us
  gShared =
      new (mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0)) Shared;
  pid_t child = fork();
  const int r = child == 0 ? 1 : 0, p = 1 - r;
  ridge::bench::allowCmaFromPeers();  // every variant reads or writes the peer with CMA
  ridge::bench::pinToCpu(r);
  const size_t count = bytes / 4;
  float* in = static_cast<float*>(std::aligned_alloc(4096, bytes));
  float* out = static_cast<float*>(std::aligned_alloc(4096, bytes));
  // Offset of the bounce chunks from a page boundary (malloc gives 16).
  const size_t misalign = argc > 5 ? std::strtoull(argv[5], nullptr, 10) : 0;
  char* bounce = static_cast<char*>(std::aligned_alloc(4096, chunk + 4096)) + misalign;
  char* mine = static_cast<char*>(std::aligned_alloc(4096, chunk + 4096)) + misalign;
  for (size_t i = 0; i < count; ++i) in[i] = float((i + r) % 1000);
  std::memset(out, 0, bytes);
  float* ip = static_cast<float*>(std::aligned_alloc(4096, bytes));  // slice-ip's buffer
  std::memcpy(ip, in, bytes);
  gShared->ip[r] = reinterpret_cast<uint64_t>(ip);
  gShared->in[r] = reinterpret_cast<uint64_t>(in);
  gShared->out[r] = reinterpret_cast<uint64_t>(out);
  gShared->pid[r] = getpid();
  constexpr size_t kRing = 4;
  char* ringBuf = static_cast<char*>(std::aligned_alloc(4096, kRing * chunk));
  std::memset(ringBuf, 0, kRing * chunk);
  gShared->ring[r] = reinterpret_cast<uint64_t>(ringBuf);
  barrier();
  const pid_t peer = gShared->pid[p];
  const size_t half = count / 2, lo = r == 0 ? 0 : half, hi = r == 0 ? half : count;
  const size_t ce = chunk / 4;
  int bad = 0;
  // Reads elements [off, off+n) of the peer's buffer at peerBase into the bounce chunk and
  // reduces them with the same elements of own into dst, sources in rank order.
  auto reduceFrom = [&](const float* own, uint64_t peerBase, size_t off, size_t n, float* dst) {
    cma(peer, bounce, peerBase + off * 4, n * 4, false);
    const void* srcs[2];
    srcs[r] = own + off;
    srcs[p] = bounce;
    ridge::reduceMany(dst, srcs, 2, n, ridgeFloat, ridgeSum, 0);
  };
  auto reduceChunk = [&](size_t off, size_t n, float* dst) { reduceFrom(in, gShared->in[p], off, n, dst); };
  const size_t kPiece = (argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 8) << 8;  // KiB in floats
  auto run = [&](int v) {
    switch (v) {
      case 0:
        for (size_t off = lo; off < hi; off += ce) {
          size_t n = std::min(ce, hi - off);
          reduceChunk(off, n, reinterpret_cast<float*>(mine));
          cma(peer, mine, gShared->out[p] + off * 4, n * 4, true);
          ridge::streamCopy(out + off, mine, n * 4);
        }
        break;
      case 1:
        for (size_t off = lo; off < hi; off += ce) {
          size_t n = std::min(ce, hi - off);
          reduceChunk(off, n, reinterpret_cast<float*>(mine));
          ridge::streamCopy(out + off, mine, n * 4);
        }
        barrier();
        for (size_t off = r == 0 ? half : 0; off < (r == 0 ? count : half); off += ce) {
          size_t n = std::min(ce, (r == 0 ? count : half) - off);
          cma(peer, out + off, gShared->out[p] + off * 4, n * 4, false);
        }
        break;
      case 2:
        for (size_t off = 0; off < count; off += ce) {
          size_t n = std::min(ce, count - off);
          reduceChunk(off, n, reinterpret_cast<float*>(mine));
          ridge::streamCopy(out + off, mine, n * 4);
        }
        break;
      case 3:
        for (size_t off = 0; off < count; off += ce) {
          size_t n = std::min(ce, count - off);
          cma(peer, bounce, gShared->in[p] + off * 4, n * 4, false);
          sumStream(out + off, reinterpret_cast<float*>(bounce), in + off, n);
        }
        break;
      case 4:
        for (size_t off = 0; off < count; off += ce) reduceChunk(off, std::min(ce, count - off), out + off);
        break;
      case 6:  // in place on buffers of its own (values grow; not checked)
        for (size_t off = lo; off < hi; off += ce) {
          size_t n = std::min(ce, hi - off);
          reduceFrom(ip, gShared->ip[p], off, n, reinterpret_cast<float*>(mine));
          cma(peer, mine, gShared->ip[p] + off * 4, n * 4, true);
          std::memcpy(ip + off, mine, n * 4);
        }
        break;
      case 7: {  // pipelined: results stay in a ring of cached chunks the peer pulls from
        const size_t K = (half + ce - 1) / ce;
        const uint64_t base = gShared->produced[r].load();  // counters run across calls
        const uint64_t pbase = gShared->consumed[r].load();
        for (size_t k = 0; k < K; ++k) {
          const size_t off = lo + k * ce, n = std::min(ce, hi - off);
          while (gShared->consumed[p].load(std::memory_order_acquire) + kRing < base + k + 1) _mm_pause();
          float* slot = reinterpret_cast<float*>(ringBuf + (k % kRing) * chunk);
          reduceChunk(off, n, slot);
          gShared->produced[r].store(base + k + 1, std::memory_order_release);
          ridge::streamCopy(out + off, slot, n * 4);
          const size_t poff = (r == 0 ? half : 0) + k * ce, pn = std::min(ce, (r == 0 ? count : half) - poff);
          while (gShared->produced[p].load(std::memory_order_acquire) < pbase + k + 1) _mm_pause();
          cma(peer, mine, gShared->ring[p] + (k % kRing) * chunk, pn * 4, false);
          gShared->consumed[r].store(pbase + k + 1, std::memory_order_release);
          ridge::streamCopy(out + poff, mine, pn * 4);
        }
        break;
      }
      case 5:
        for (size_t off = 0; off < count; off += ce) {
          size_t n = std::min(ce, count - off);
          cma(peer, bounce, gShared->in[p] + off * 4, n * 4, false);
          for (size_t k = 0; k < n; k += kPiece) {
            size_t m = std::min(kPiece, n - k);
            const void* srcs[2];
            srcs[r] = in + off + k;
            srcs[p] = bounce + k * 4;
            ridge::reduceMany(mine, srcs, 2, m, ridgeFloat, ridgeSum, 0);
            ridge::streamCopy(out + off + k, mine, m * 4);
          }
        }
        break;
    }
  };
  int sample = 0;
  for (int round = 0; round < rounds; ++round) {
    for (int v = 0; v < kVariants; ++v) {
      for (int it = 0; it < iters + 1; ++it) {
        barrier();
        auto t0 = std::chrono::steady_clock::now();
        const double c0 = cpuUs();
        run(v);
        const double c1 = cpuUs();
        barrier();
        double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        if (it > 0) {  // the first one warms up
          gShared->us[r][v][round * iters + it - 1] = us;
          gShared->cpu[r][v][round * iters + it - 1] = c1 - c0;
        }
        for (size_t i = 0; v != 6 && i < count; i += 4099)
          if (out[i] != float(i % 1000) + float((i + 1) % 1000)) ++bad;
        std::memset(out + (sample++ % 7) * (count / 8), 0, 64);  // a few lines poisoned
      }
    }
  }
  barrier();
  if (r == 1) return bad ? 1 : 0;
  int status = 0;
  waitpid(child, &status, 0);
  double load = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = 0;
    std::fclose(f);
  }
  std::printf("# %zu MiB, chunk %zu KiB, %d x %d samples per variant, load %.2f\n", bytes >> 20, chunk >> 10,
              rounds, iters, load);
  std::printf("%-11s %10s %10s %8s %11s %10s\n", "variant", "median_us", "min_us", "GB/s@min", "cpu_med_us",
              "cpu_min_us");
  for (int v = 0; v < kVariants; ++v) {
    std::vector<double> t, c;
    for (int i = 0; i < rounds * iters; ++i) {
      t.push_back(std::max(gShared->us[0][v][i], gShared->us[1][v][i]));
      c.push_back(std::max(gShared->cpu[0][v][i], gShared->cpu[1][v][i]));
    }
    std::sort(t.begin(), t.end());
    std::sort(c.begin(), c.end());
    std::printf("%-11s %10.1f %10.1f %8.2f %11.1f %10.1f\n", kNames[v], t[t.size() / 2], t[0],
                bytes / t[0] / 1e3, c[c.size() / 2], c[0]);
  }
  bool ok = bad == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  std::printf("outputs %s\n", ok ? "correct" : "WRONG");
  return ok ? 0 : 1;
}
