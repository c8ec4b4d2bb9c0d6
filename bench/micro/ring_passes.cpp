// The memory passes one rank of a 2-rank ring allreduce makes, without the peer: per
// 256 KiB chunk of its half of the buffer, copy input into a slot, reduce the other
// input half with that slot into a second slot, and stream both slots into the output.
// Two threads run it at once on private buffers, as the two ranks would. The result is
// the ceiling for this pass structure on this machine when nothing crosses between cores
// (docs/performance.md compares the real ring against it).
//   ridge-ring-passes [MiB per rank, default 16]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "reduce/reduce.h"
#include "reduce/stream_copy.h"

int main(int argc, char** argv) {
  const size_t bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 16) << 20;
  constexpr size_t kChunk = 256 << 10;
  constexpr int kIters = 20;
  auto rank = [&](double* usPerIter) {
    std::vector<float> in(bytes / 4, 1.0f), out(bytes / 4, 0.0f);
    std::vector<char> slot(kChunk), slot2(kChunk);
    const char* src = reinterpret_cast<const char*>(in.data());
    char* dst = reinterpret_cast<char*>(out.data());
    const size_t half = bytes / 2;
    auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < kIters; ++it) {
      for (size_t off = 0; off + kChunk <= half; off += kChunk) {
        std::memcpy(slot.data(), src + off, kChunk);
        ridge::reduce2(slot2.data(), slot.data(), src + half + off, kChunk / 4, ridgeFloat, ridgeSum, 0);
        ridge::streamCopy(dst + half + off, slot2.data(), kChunk);
        ridge::streamCopy(dst + off, slot.data(), kChunk);
      }
    }
    *usPerIter =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kIters;
  };
  double us[2];
  std::thread a(rank, &us[0]), b(rank, &us[1]);
  a.join();
  b.join();
  const double worst = us[0] > us[1] ? us[0] : us[1];
  std::printf("%zu MiB per rank: %.0f us per allreduce-equivalent -> %.2f GB/s algbw ceiling\n", bytes >> 20,
              worst, bytes / worst / 1e3);
  return 0;
}
