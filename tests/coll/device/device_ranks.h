// Ranks as threads of this process on the emulated device runtime, and one collective call
// on emulated device memory checked against the host reference: shared by the P2P tests
// (p2p_test.cpp) and the GPUDirect RDMA data path tests (gdr_data_path_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collective_case.h"
#include "device/emulated_runtime.h"
#include "ridge/ridge.h"
#include "time_scale.h"

namespace p2ptest {

using ridge::Status;
using ridge::device::EmulatedRuntime;

inline constexpr unsigned char kPoison = 0x5A;

inline std::string errorText() {
  const char* e = ridgeGetLastError(nullptr);
  return e ? e : "";
}

// Emulated device memory owned by a test rank.
struct DevMem {
  EmulatedRuntime* rt;
  void* p = nullptr;
  size_t bytes;
  // `managed`: managed memory instead (the host may touch it; collectives stage it).
  DevMem(EmulatedRuntime& r, size_t n, bool managed = false) : rt(&r), bytes(n) {
    EXPECT_TRUE(r.allocDeviceOn(n, &p, -1, managed).isOk());
  }
  ~DevMem() { rt->freeDevice(p); }
  char* at(size_t off) const { return static_cast<char*>(p) + off; }
  void put(const std::vector<unsigned char>& h, size_t off = 0) const {
    ASSERT_TRUE(rt->copyToDevice(at(off), h.data(), h.size()).isOk());
  }
  std::vector<unsigned char> get(size_t off, size_t n) const {
    std::vector<unsigned char> h(n);
    EXPECT_TRUE(rt->copyToHost(h.data(), at(off), n).isOk());
    return h;
  }
};

// What one test rank has: its communicator and stream, on device rank % devices.
struct TestRank {
  int rank, nranks;
  ridgeComm_t comm;
  ridgeStream_t stream;
};
using Body = std::function<void(TestRank&)>;

// Runs `body` on `n` rank threads (thread r binds device r % devices first, so its
// communicator serves that device), then destroys the communicators (unless `destroy` is
// false: the body aborted them). `timeoutSeconds`: each communicator's timeout (by default
// 30 s times RIDGE_TEST_TIME_SCALE: a timeout that should never fire).
inline void withRanks(EmulatedRuntime& rt, int n, int devices, const Body& body, bool destroy = true,
                      int timeoutSeconds = ridgetest::scaledSeconds(30)) {
  ridgeUniqueId id;
  ASSERT_EQ(ridgeGetUniqueId(&id), ridgeSuccess) << errorText();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_TRUE(rt.bindThread(r % devices).isOk());
      ridgeConfig_t cfg = RIDGE_CONFIG_INITIALIZER;
      cfg.timeoutSeconds = timeoutSeconds;
      TestRank tr{r, n, nullptr, nullptr};
      ASSERT_EQ(ridgeCommInitRankConfig(&tr.comm, n, id, r, &cfg), ridgeSuccess) << errorText();
      ASSERT_TRUE(rt.createStream(&tr.stream).isOk());
      body(tr);
      if (destroy) {
        EXPECT_EQ(ridgeCommDestroy(tr.comm), ridgeSuccess) << errorText();
      }
      EXPECT_TRUE(rt.synchronize(tr.stream).isOk());
      rt.destroyStream(tr.stream);
    });
  }
  for (auto& t : threads) t.join();
}

// Waits for rank `t`'s stream and checks that its communicator has no asynchronous error.
inline void expectStreamDone(EmulatedRuntime& rt, const TestRank& t) {
  ASSERT_TRUE(rt.synchronize(t.stream).isOk());
  ridgeResult_t async = ridgeSuccess;
  ASSERT_EQ(ridgeCommGetAsyncError(t.comm, &async), ridgeSuccess);
  ASSERT_EQ(async, ridgeSuccess) << errorText();
}

// Aborts rank `t`'s communicator and checks that its stream, parked on the proxy, is
// released within 5 s.
inline void expectAbortReleasesTheStream(EmulatedRuntime& rt, const TestRank& t) {
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(ridgeCommAbort(t.comm), ridgeSuccess) << errorText();
  ridge::Status s = rt.synchronize(t.stream);
  EXPECT_TRUE(s.isOk()) << s.message();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
            ridgetest::scaledSeconds(5.0))
      << "abort did not release the stream";
}

// Two ranks' calls that disagree in one field (the signature tests of the device paths, issue
// 19): rank r calls op[r] (a broadcast or an allreduce) with dt[r], red[r], count[r], root[r];
// says[r] (may be null) is how its call reads in the mismatch message.
struct Disagreement {
  const char* name;
  Op op[2];
  ridgeDataType_t dt[2];
  ridgeRedOp_t red[2];
  size_t count[2];
  int root[2];
  const char* says[2] = {nullptr, nullptr};
};

// Issues rank `r`'s call of `k` on `in`/`out` (device memory of count[r] elements).
inline ridgeResult_t issueDisagreeing(const Disagreement& k, int r, void* in, void* out, ridgeComm_t comm,
                                      ridgeStream_t stream) {
  return k.op[r] == Op::Broadcast ? ridgeBroadcast(in, out, k.count[r], k.dt[r], k.root[r], comm, stream)
                                  : ridgeAllReduce(in, out, k.count[r], k.dt[r], k.red[r], comm, stream);
}

struct Call {
  Op op;
  ridgeDataType_t dt;
  ridgeRedOp_t red;
  size_t count;
  bool inPlace = false;
};

// Runs one call on rank `t` with fresh inputs (seeded per call) and checks the output
// against the host reference. `send`/`recv` (may be null: allocated here) let a test reuse
// buffers across calls (in-place reduce-scatter works in `send`, other in-place calls in
// `recv`).
inline void runCall(EmulatedRuntime& rt, TestRank& t, const Call& c, uint32_t seed,
                    const DevMem* sendMem = nullptr, const DevMem* recvMem = nullptr) {
  const int n = t.nranks, r = t.rank, root = n / 2;
  const size_t es = dtSize(c.dt), cnt = c.count;
  const size_t inElems = inputElems(c.op, cnt, n), outElems = outputElems(c.op, cnt, n);
  std::vector<uint32_t> keys(n);
  for (int j = 0; j < n; ++j) keys[j] = rankKey(seed, j);
  std::unique_ptr<DevMem> ownRecv, ownSend;
  if (!recvMem) recvMem = (ownRecv = std::make_unique<DevMem>(rt, outElems * es)).get();
  // In place: the input is this rank's block of the output (allgather), the whole output, or
  // (reduce-scatter) the output is this rank's block of the input.
  const bool rsInPlace = c.inPlace && c.op == Op::ReduceScatter;
  if (rsInPlace) recvMem = nullptr;
  if (!sendMem && !c.inPlace) sendMem = (ownSend = std::make_unique<DevMem>(rt, inElems * es)).get();
  if (c.inPlace && !rsInPlace) sendMem = recvMem;
  if (rsInPlace && !sendMem) sendMem = (ownSend = std::make_unique<DevMem>(rt, inElems * es)).get();
  const size_t sendOff = c.inPlace && c.op == Op::AllGather ? size_t(r) * cnt * es : 0;
  const size_t recvOff = rsInPlace ? size_t(r) * cnt * es : 0;
  const DevMem* out = rsInPlace ? sendMem : recvMem;
  // Poison the output, then write the input (in place it overlays the output).
  out->put(std::vector<unsigned char>(out->bytes, kPoison));
  std::vector<unsigned char> in(inElems * es);
  fillRankInput(c.op, c.dt, c.red, in.data(), cnt, n, keys[r]);
  sendMem->put(in, sendOff);
  const void* s = sendMem->at(sendOff);
  void* d = out->at(recvOff);
  const ridgeResult_t res = issue(c.op, s, d, cnt, c.dt, c.red, root, t.comm, t.stream);
  const std::string what = std::string(opText(c.op)) + (c.inPlace ? " in place " : " ") + dtName(c.dt) + " " +
                           opName(c.red) + " count " + std::to_string(cnt) + " rank " + std::to_string(r) +
                           "/" + std::to_string(n);
  ASSERT_EQ(res, ridgeSuccess) << what << ": " << errorText();
  Status st = rt.synchronize(t.stream);
  ASSERT_TRUE(st.isOk()) << what << ": " << st.message();
  ridgeResult_t async = ridgeSuccess;
  ASSERT_EQ(ridgeCommGetAsyncError(t.comm, &async), ridgeSuccess);
  ASSERT_EQ(async, ridgeSuccess) << what << ": " << errorText();
  const std::vector<unsigned char> got = out->get(recvOff, outElems * es);
  Mismatches mm;
  checkRankOutput(c.op, c.dt, c.red, got.data(), cnt, keys, r, root, c.inPlace ? -1 : kPoison, mm);
  EXPECT_EQ(mm.count, 0u) << what << ": " << mm.text;
}

}  // namespace p2ptest
