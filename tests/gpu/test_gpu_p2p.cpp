// The P2P engine on a real GPU: two forked processes (CUDA IPC opens handles of other
// processes only), each a rank with its own communicator and stream, on device 0 ("several
// ranks on one GPU") or on devices 0 and 1 when there are two. Every collective on cudaMalloc
// buffers against the higher-precision host reference of tests/coll/test_data.h, with
// poisoned outputs; the P2P counters prove the path ran and the IPC mapping cache reused its
// handles. tests/coll/device proves the same on the emulated runtime everywhere.
//
// The parent never touches CUDA (a forked child cannot use a CUDA context of its parent):
// children report "no device" with exit code kNoDevice and the test then reports
// "skipped: no CUDA device" (a failure under RIDGE_TEST_REQUIRE_GPU, tests/gpu/gpu_test_util.h).
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "coll/comm.h"
#include "coll/device/p2p.h"
#include "collective_case.h"
#include "ridge/ridge.h"
#include "tests/gpu/gpu_test_util.h"

namespace {

using namespace p2ptest;

constexpr int kNoDevice = 77;
constexpr unsigned char kPoison = 0xC3;

// A failed check in a child: message on stderr, non-zero exit.
#define CHILD_CHECK(cond, ...)                                          \
  do {                                                                  \
    if (!(cond)) {                                                      \
      std::fprintf(stderr, "rank %d: check failed: %s: ", rank, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                \
      std::fprintf(stderr, "\n");                                       \
      return 1;                                                         \
    }                                                                   \
  } while (0)

int childRank(const ridgeUniqueId& id, int rank, int n, bool twoDevices) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return kNoDevice;
  if (twoDevices && devices < 2) return kNoDevice;
  const int dev = twoDevices ? rank : 0;
  // One GPU: always P2P. Two: P2P when the driver allows it between them, else staged.
  int canAccess = 1;
  if (twoDevices && cudaDeviceCanAccessPeer(&canAccess, 0, 1) != cudaSuccess) canAccess = 0;
  const bool expectP2p = canAccess != 0;
  CHILD_CHECK(cudaSetDevice(dev) == cudaSuccess, "cudaSetDevice(%d)", dev);
  ridgeComm_t comm = nullptr;
  CHILD_CHECK(ridgeCommInitRank(&comm, n, id, rank) == ridgeSuccess, "%s", ridgeGetLastError(nullptr));
  cudaStream_t stream = nullptr;
  CHILD_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess, "stream");
  const size_t cnt = (1 << 18) + 3, es = 4;
  void *send = nullptr, *recv = nullptr;
  CHILD_CHECK(cudaMalloc(&send, cnt * n * es) == cudaSuccess, "cudaMalloc");
  CHILD_CHECK(cudaMalloc(&recv, cnt * n * es) == cudaSuccess, "cudaMalloc");
  std::vector<uint32_t> keys(n);
  const Op ops[] = {Op::AllReduce, Op::ReduceScatter, Op::Reduce,    Op::AllGather,
                    Op::Broadcast, Op::AlltoAll,      Op::AllReduce, Op::AllReduce};
  uint32_t seed = 0xC0FFEEu;
  for (Op op : ops) {
    for (int j = 0; j < n; ++j) keys[j] = rankKey(seed, j);
    ++seed;
    std::vector<unsigned char> in(cnt * n * es), out(cnt * n * es);
    fillRankInput(op, ridgeFloat32, ridgeSum, in.data(), cnt, n, keys[rank]);
    // On `stream`: a non-blocking stream does not wait for the legacy stream, and a cudaMemcpy
    // from pageable memory or a cudaMemset may return before the device memory is written; on
    // the stream, the collective's ready marker orders them.
    CHILD_CHECK(cudaMemcpyAsync(send, in.data(), in.size(), cudaMemcpyHostToDevice, stream) == cudaSuccess,
                "upload");
    CHILD_CHECK(cudaMemsetAsync(recv, kPoison, cnt * n * es, stream) == cudaSuccess, "poison");
    const int root = 1;
    const ridgeResult_t res = issue(op, send, recv, cnt, ridgeFloat32, ridgeSum, root, comm,
                                    reinterpret_cast<ridgeStream_t>(stream));
    CHILD_CHECK(res == ridgeSuccess, "%s: %s", opText(op), ridgeGetLastError(nullptr));
    CHILD_CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "sync");
    ridgeResult_t async = ridgeSuccess;
    ridgeCommGetAsyncError(comm, &async);
    CHILD_CHECK(async == ridgeSuccess, "%s: %s", opText(op), ridgeGetLastError(nullptr));
    CHILD_CHECK(cudaMemcpy(out.data(), recv, out.size(), cudaMemcpyDeviceToHost) == cudaSuccess, "download");
    Mismatches mm;
    checkRankOutput(op, ridgeFloat32, ridgeSum, out.data(), cnt, keys, rank, root, kPoison, mm);
    CHILD_CHECK(mm.count == 0, "%s: %s", opText(op), mm.text.c_str());
  }
  const ridge::p2p::Stats s = ridge::p2p::stats(comm);
  CHILD_CHECK(s.capable == expectP2p, "P2P allowed: %d, expected %d (the INFO log says why)", s.capable,
              expectP2p);
  CHILD_CHECK(s.p2pOps == (expectP2p ? sizeof ops / sizeof ops[0] : 0), "%llu P2P operations",
              static_cast<unsigned long long>(s.p2pOps));
  // One handle per peer buffer (send, recv), opened once across all the calls.
  CHILD_CHECK(s.ipcOpens == (expectP2p ? 2u : 0u), "%llu IPC opens",
              static_cast<unsigned long long>(s.ipcOpens));
  // Each of this rank's two allocations exported once across the calls: the driver gave
  // allocation ids (CU_POINTER_ATTRIBUTE_BUFFER_ID), so the export cache held the handles.
  CHILD_CHECK(s.ipcExports == (expectP2p ? 2u : 0u), "%llu IPC exports",
              static_cast<unsigned long long>(s.ipcExports));
  std::fprintf(stderr, "rank %d: %llu P2P collectives, %llu IPC opens, %llu cache hits\n", rank,
               static_cast<unsigned long long>(s.p2pOps), static_cast<unsigned long long>(s.ipcOpens),
               static_cast<unsigned long long>(s.cacheHits));
  CHILD_CHECK(ridgeCommDestroy(comm) == ridgeSuccess, "%s", ridgeGetLastError(nullptr));
  cudaFree(send);
  cudaFree(recv);
  cudaStreamDestroy(stream);
  return 0;
}

// Forks two ranks and returns how they ended: all 0, or kNoDevice, or the first failure.
int runForked(bool twoDevices) {
  ridgeUniqueId id;
  if (ridgeGetUniqueId(&id) != ridgeSuccess) return 2;
  const int n = 2;
  std::vector<pid_t> kids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) _exit(childRank(id, r, n, twoDevices));
    kids.push_back(pid);
  }
  int result = 0;
  for (pid_t k : kids) {
    int st = 0;
    waitpid(k, &st, 0);
    const int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (code != 0 && (result == 0 || result == kNoDevice)) result = code;
  }
  return result;
}

TEST(GpuP2p, EveryCollectiveTwoProcessesOneGpu) {
  const int r = runForked(false);
  if (r == kNoDevice) SKIP_OR_FAIL_WITHOUT_GPU("no CUDA device");
  EXPECT_EQ(r, 0) << "a rank failed (its stderr says why)";
}

TEST(GpuP2p, EveryCollectiveTwoProcessesTwoGpus) {
  const int r = runForked(true);
  if (r == kNoDevice) GTEST_SKIP() << "skipped: no CUDA device (or fewer than two)";
  EXPECT_EQ(r, 0) << "a rank failed (its stderr says why)";
}

}  // namespace
