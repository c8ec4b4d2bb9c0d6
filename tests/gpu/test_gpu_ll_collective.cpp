// The LL collectives (src/coll/device/ll_path.h) on a real GPU: ranks as threads of this process on
// one GPU (their kernels run concurrently, so a spinning receiver sees its peers' lines), every
// collective on cudaMalloc memory through the C API on each rank's own stream, against the
// higher-precision host reference (random inputs, poisoned outputs), the LL path counted, and
// LL against the bulk P2P path bit for bit. Without a CUDA device every test reports
// "skipped: no CUDA device". tests/coll/device/ll_collective_test.cpp proves the same on the
// emulated runtime in every build.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "coll/comm.h"
#include "coll/device/ll_path.h"
#include "collective_case.h"
#include "ridge/ridge.h"
#include "tests/gpu/gpu_test_util.h"

namespace {

using namespace ridgetest;
using namespace p2ptest;

constexpr unsigned char kPoison = 0x5A;

std::string lastError() {
  const char* e = ridgeGetLastError(nullptr);
  return e ? e : "";
}

struct Call {
  Op op;
  ridgeDataType_t dt;
  ridgeRedOp_t red;
  size_t count;
};

// Waits (bounded: 60 s) until all `n` rank threads arrived: the ranks never make a
// device-synchronizing call while a peer's LL launch may spin waiting for them.
void arriveAndWait(std::atomic<int>& arrived, int n) {
  arrived.fetch_add(1);
  for (int i = 0; i < 60000 && arrived.load() < n; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// Runs `calls` on n rank threads on GPU 0; outputs[rank][call] gets each output's bytes.
// Every rank allocates its stream and buffers (the largest call's) before the first call and
// frees them after the last, all ranks between barriers: cudaMalloc and cudaFree may wait for
// the whole device, where a peer's LL launch spins until this rank launches too (a hang).
// Copies go on the rank's own non-blocking stream for the same reason, and to and from pinned
// host memory (cudaMallocHost, allocated and freed between the same barriers): a copy from or
// to pageable memory goes through the driver's staging buffers, which all threads of the
// process share, and a device-to-host one returns only once its stream has run it. On the
// first GPU run (docs/gpu.md, "First GPU run") that hung ranks 0 and 2 of three: a rank's
// pageable copy of its output waits for its LL launch, which spins for a peer's lines, while
// that peer's pageable copy of its input, queued behind it in the staging path, cannot start,
// so the peer never launches (until RIDGE_TIMEOUT ends the spin).
// With `pendingUserError`, each rank leaves a CUDA error pending on its thread before every
// call (a failed runtime call nobody checked, as after a bad launch of the caller's): the call
// must succeed and leave the error pending, the caller's to see.
void runRanks(int n, const std::vector<Call>& calls, bool expectLL,
              std::vector<std::vector<std::vector<unsigned char>>>* outputs, bool pendingUserError = false) {
  ridgeUniqueId id;
  ASSERT_EQ(ridgeGetUniqueId(&id), ridgeSuccess) << lastError();
  outputs->assign(n, {});
  size_t maxIn = 0, maxOut = 0;
  for (const Call& c : calls) {
    maxIn = std::max(maxIn, inputElems(c.op, c.count, n) * dtSize(c.dt));
    maxOut = std::max(maxOut, outputElems(c.op, c.count, n) * dtSize(c.dt));
  }
  std::atomic<int> ready{0}, done{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
      cudaStream_t stream;
      ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      void *send = nullptr, *recv = nullptr;
      ASSERT_EQ(cudaMalloc(&send, maxIn), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&recv, maxOut), cudaSuccess);
      unsigned char *pinnedIn = nullptr, *pinnedOut = nullptr;
      ASSERT_EQ(cudaMallocHost(&pinnedIn, maxIn), cudaSuccess);
      ASSERT_EQ(cudaMallocHost(&pinnedOut, maxOut), cudaSuccess);
      ridgeComm_t comm = nullptr;
      ASSERT_EQ(ridgeCommInitRank(&comm, n, id, r), ridgeSuccess) << lastError();
      arriveAndWait(ready, n);
      uint32_t seed = 0x3131u;
      for (const Call& c : calls) {
        const size_t es = dtSize(c.dt), inBytes = inputElems(c.op, c.count, n) * es,
                     outBytes = outputElems(c.op, c.count, n) * es;
        std::vector<uint32_t> keys(n);
        for (int j = 0; j < n; ++j) keys[j] = rankKey(seed, j);
        ++seed;
        std::vector<unsigned char> in(inBytes), out(outBytes, kPoison);
        fillRankInput(c.op, c.dt, c.red, in.data(), c.count, n, keys[r]);
        std::memcpy(pinnedIn, in.data(), inBytes);
        std::memcpy(pinnedOut, out.data(), outBytes);
        ASSERT_EQ(cudaMemcpyAsync(send, pinnedIn, inBytes, cudaMemcpyHostToDevice, stream), cudaSuccess);
        ASSERT_EQ(cudaMemcpyAsync(recv, pinnedOut, outBytes, cudaMemcpyHostToDevice, stream), cudaSuccess);
        const int root = n / 2;
        cudaDeviceProp prop;
        if (pendingUserError) ASSERT_EQ(cudaGetDeviceProperties(&prop, -1), cudaErrorInvalidDevice);
        ASSERT_EQ(issue(c.op, send, recv, c.count, c.dt, c.red, root, comm,
                        reinterpret_cast<ridgeStream_t>(stream)),
                  ridgeSuccess)
            << lastError();
        if (pendingUserError) {
          EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice) << "the caller's pending error was consumed";
        }
        ASSERT_EQ(cudaMemcpyAsync(pinnedOut, recv, outBytes, cudaMemcpyDeviceToHost, stream), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        std::memcpy(out.data(), pinnedOut, outBytes);
        ridgeResult_t async = ridgeSuccess;
        ASSERT_EQ(ridgeCommGetAsyncError(comm, &async), ridgeSuccess);
        ASSERT_EQ(async, ridgeSuccess) << lastError();
        Mismatches mm;
        checkRankOutput(c.op, c.dt, c.red, out.data(), c.count, keys, r, root, kPoison, mm);
        EXPECT_EQ(mm.count, 0u) << opText(c.op) << " " << dtName(c.dt) << " " << opName(c.red) << " count "
                                << c.count << " rank " << r << ": " << mm.text;
        (*outputs)[r].push_back(out);
      }
      EXPECT_EQ(ridge::llStats(comm).launches, expectLL ? calls.size() : 0u) << "rank " << r;
      arriveAndWait(done, n);
      EXPECT_EQ(ridgeCommDestroy(comm), ridgeSuccess) << lastError();
      cudaFree(send);
      cudaFree(recv);
      cudaFreeHost(pinnedIn);
      cudaFreeHost(pinnedOut);
      cudaStreamDestroy(stream);
    });
  for (auto& t : threads) t.join();
}

std::vector<Call> everyCollective() {
  std::vector<Call> v;
  int i = 0;
  for (Op op : kEveryOp)
    for (const TypedCase& t : kTypedCases) {
      const size_t counts[] = {1, 13, 1531};
      v.push_back({op, t.dt, t.red, counts[i++ % 3]});
    }
  return v;
}

TEST(GpuLLCollective, EveryCollectiveTwoAndThreeRanksOnOneGpu) {
  SKIP_WITHOUT_GPU();
  setenv("RIDGE_LL", "on", 1);
  std::vector<std::vector<std::vector<unsigned char>>> out;
  for (int n : {2, 3}) runRanks(n, everyCollective(), true, &out);
  unsetenv("RIDGE_LL");
}

// An LL launch on the caller's thread takes its own launch's error, not an error the caller
// left pending there (which would break the communicator and be lost to the caller).
TEST(GpuLLCollective, PendingCallerErrorIsNotTheLaunchsError) {
  SKIP_WITHOUT_GPU();
  setenv("RIDGE_LL", "on", 1);
  std::vector<std::vector<std::vector<unsigned char>>> out;
  runRanks(2, {{Op::AllReduce, ridgeFloat32, ridgeSum, 100}, {Op::AllGather, ridgeInt32, ridgeSum, 7}}, true,
           &out, /*pendingUserError=*/true);
  unsetenv("RIDGE_LL");
}

TEST(GpuLLCollective, SameBitsAsBulkP2p) {
  SKIP_WITHOUT_GPU();
  const std::vector<Call> calls = {{Op::AllReduce, ridgeFloat32, ridgeSum, 2000},
                                   {Op::AllReduce, ridgeFloat16, ridgeSum, 1500},
                                   {Op::AllReduce, ridgeBfloat16, ridgeAvg, 999},
                                   {Op::ReduceScatter, ridgeFloat32, ridgeSum, 500}};
  std::vector<std::vector<std::vector<unsigned char>>> ll, bulk;
  setenv("RIDGE_LL", "on", 1);
  runRanks(3, calls, true, &ll);
  setenv("RIDGE_LL", "off", 1);
  runRanks(3, calls, false, &bulk);
  unsetenv("RIDGE_LL");
  for (size_t r = 0; r < ll.size() && r < bulk.size(); ++r)
    for (size_t i = 0; i < calls.size() && i < ll[r].size() && i < bulk[r].size(); ++i)
      EXPECT_TRUE(ll[r][i] == bulk[r][i]) << "call " << i << " rank " << r << ": LL and bulk P2P differ";
}

}  // namespace
