// The LL protocol kernels and the channel geometry of the bulk kernels on a real GPU,
// against host references (memcpy for send/recv, the host kernels of src/reduce for the
// fused ring step and the bulk reduce). Without a CUDA device every test reports
// "skipped: no CUDA device".
//
// Sender and receiver run on one GPU, on two streams, the receiver launched first so that
// it really spins on lines that arrive while it waits (the line buffer stands in for a
// peer's memory; the protocol does not care whose memory it is). Every kernel is preloaded
// first: under lazy module loading the sender's first launch could otherwise wait for the
// spinning receiver. The buffers are set up with cudaMemcpy/cudaMemset on the legacy stream,
// which the non-blocking streams of the kernels do not wait for, so setup ends with
// cudaDeviceSynchronize.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/device_reduce.h"
#include "kernels/ll_protocol.h"
#include "reduce/reduce.h"
#include "tests/gpu/gpu_test_util.h"

namespace ridge {
namespace {

constexpr uint64_t kSecond = 1000000000ull;

template <typename T = unsigned char>
struct Dev {
  T* ptr = nullptr;
  explicit Dev(size_t count) { EXPECT_EQ(cudaMalloc(&ptr, count * sizeof(T) + 64), cudaSuccess); }
  ~Dev() { cudaFree(ptr); }
};

struct Streams {
  cudaStream_t a = nullptr, b = nullptr;
  Streams() {
    EXPECT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  }
  ~Streams() {
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
  }
};

ridgeStream_t rs(cudaStream_t s) {
  return reinterpret_cast<ridgeStream_t>(s);
}

std::vector<unsigned char> randomBytes(size_t n, std::mt19937_64* rng) {
  std::vector<unsigned char> v(n);
  for (auto& c : v) c = static_cast<unsigned char>((*rng)());
  return v;
}

// Values for reductions that stay exact-ish and include the awkward cases.
std::vector<unsigned char> randomValues(ridgeDataType_t t, size_t count, std::mt19937_64* rng) {
  const size_t es = dataTypeSize(t);
  std::vector<unsigned char> v(count * es);
  std::uniform_real_distribution<float> f(-3.0f, 3.0f);
  for (size_t i = 0; i < count; ++i) {
    unsigned char* p = v.data() + i * es;
    const uint64_t r = (*rng)();
    float x = r % 89 == 0 ? -0.0f : f(*rng);
    switch (t) {
      case ridgeFloat32: std::memcpy(p, &x, 4); break;
      case ridgeFloat64: {
        const double d = x;
        std::memcpy(p, &d, 8);
        break;
      }
      case ridgeFloat16: {
        const uint16_t h = floatToHalf(x);
        std::memcpy(p, &h, 2);
        break;
      }
      case ridgeBfloat16: {
        const uint16_t b = floatToBf16(x);
        std::memcpy(p, &b, 2);
        break;
      }
      default: std::memcpy(p, &r, es); break;
    }
  }
  return v;
}

// One message through LL: receiver first (it spins), then the sender on another stream.
void sendRecv(size_t bytes, size_t misalign, uint64_t step, int blocks, std::mt19937_64* rng) {
  const std::vector<unsigned char> src = randomBytes(bytes, rng);
  Dev<> dsrc(bytes + misalign), ddst(bytes + misalign);
  Dev<ll::Line> lines(ll::linesFor(bytes) + 1);
  Dev<int> timedOut(1);
  Streams st;
  CUDA_OK(cudaMemcpy(dsrc.ptr + misalign, src.data(), bytes, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(ddst.ptr, 0xAB, bytes + misalign + 64));
  CUDA_OK(cudaMemset(lines.ptr, 0, (ll::linesFor(bytes) + 1) * sizeof(ll::Line)));
  CUDA_OK(cudaMemset(timedOut.ptr, 0, sizeof(int)));
  CUDA_OK(cudaDeviceSynchronize());
  const uint32_t flag = ll::flagForStep(step);
  ASSERT_TRUE(gpu::launchLLRecv(ddst.ptr + misalign, lines.ptr, bytes, flag, 10 * kSecond, timedOut.ptr,
                                rs(st.a), blocks)
                  .isOk());
  ASSERT_TRUE(gpu::launchLLSend(lines.ptr, dsrc.ptr + misalign, bytes, flag, rs(st.b), blocks).isOk());
  CUDA_OK(cudaStreamSynchronize(st.b));
  CUDA_OK(cudaStreamSynchronize(st.a));
  int to = -1;
  CUDA_OK(cudaMemcpy(&to, timedOut.ptr, sizeof to, cudaMemcpyDeviceToHost));
  EXPECT_EQ(to, 0) << bytes;
  std::vector<unsigned char> got(bytes + misalign + 64);
  CUDA_OK(cudaMemcpy(got.data(), ddst.ptr, got.size(), cudaMemcpyDeviceToHost));
  ASSERT_EQ(std::memcmp(got.data() + misalign, src.data(), bytes), 0) << bytes << " at +" << misalign;
  for (size_t i = 0; i < misalign; ++i) ASSERT_EQ(got[i], 0xAB);
  for (size_t i = misalign + bytes; i < got.size(); ++i) ASSERT_EQ(got[i], 0xAB) << bytes;
  // The lines themselves carry the host encoding of the message.
  std::vector<ll::Line> seen(ll::linesFor(bytes)), expect(ll::linesFor(bytes));
  CUDA_OK(cudaMemcpy(seen.data(), lines.ptr, seen.size() * sizeof(ll::Line), cudaMemcpyDeviceToHost));
  ll::packMessage(src.data(), bytes, flag, expect.data());
  ASSERT_EQ(std::memcmp(seen.data(), expect.data(), seen.size() * sizeof(ll::Line)), 0);
}

TEST(GpuLL, SendRecvMatchesSourceAtSmallSizes) {
  SKIP_WITHOUT_GPU();
  PRELOAD_KERNELS();
  std::mt19937_64 rng(21);
  for (size_t bytes :
       {size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{100}, size_t{4096}, size_t{65536} + 5})
    for (size_t off : {size_t{0}, size_t{3}}) sendRecv(bytes, off, bytes + off, 0, &rng);
  sendRecv(100000, 0, 0xFFFFFFFEull, 2, &rng);  // few blocks: every thread loops; flag near the wrap
}

TEST(GpuLL, RecvTimesOutWithoutSenderAndIgnoresStaleLines) {
  SKIP_WITHOUT_GPU();
  const size_t bytes = 4096;
  std::vector<unsigned char> src(bytes, 0x5A);
  std::vector<ll::Line> stale(ll::linesFor(bytes));
  ll::packMessage(src.data(), bytes, ll::flagForStep(41), stale.data());  // the previous step
  Dev<ll::Line> lines(stale.size());
  Dev<> dst(bytes);
  Dev<int> timedOut(1);
  CUDA_OK(cudaMemcpy(lines.ptr, stale.data(), stale.size() * sizeof(ll::Line), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dst.ptr, 0xAB, bytes));
  CUDA_OK(cudaMemset(timedOut.ptr, 0, sizeof(int)));
  ASSERT_TRUE(
      gpu::launchLLRecv(dst.ptr, lines.ptr, bytes, ll::flagForStep(42), kSecond / 100, timedOut.ptr, nullptr)
          .isOk());
  CUDA_OK(cudaDeviceSynchronize());
  int to = 0;
  CUDA_OK(cudaMemcpy(&to, timedOut.ptr, sizeof to, cudaMemcpyDeviceToHost));
  EXPECT_EQ(to, 1);
  std::vector<unsigned char> got(bytes);
  CUDA_OK(cudaMemcpy(got.data(), dst.ptr, bytes, cudaMemcpyDeviceToHost));
  for (unsigned char c : got) ASSERT_EQ(c, 0xAB);  // nothing taken from the stale lines
}

// A ring of `nranks` simulated on one GPU: rank 0 sends its data as lines, ranks 1..n-1
// each run the fused receive-reduce-send into the next rank's line buffer, the last one
// writes the result. Reference: the host kernels folded step by step, in ring order.
void ringStep(ridgeDataType_t t, ridgeRedOp_t op, int nranks, size_t count, std::mt19937_64* rng) {
  const size_t es = dataTypeSize(t), bytes = count * es, nl = ll::linesFor(bytes);
  std::vector<std::vector<unsigned char>> in;
  std::vector<Dev<>*> dIn;
  std::vector<Dev<ll::Line>*> buf;  // buf[r]: rank r's incoming lines
  for (int r = 0; r < nranks; ++r) {
    in.push_back(randomValues(t, count, rng));
    dIn.push_back(new Dev<>(bytes));
    EXPECT_EQ(cudaMemcpy(dIn.back()->ptr, in.back().data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    buf.push_back(new Dev<ll::Line>(nl));
    EXPECT_EQ(cudaMemset(buf.back()->ptr, 0, nl * sizeof(ll::Line)), cudaSuccess);
  }
  Dev<> out(bytes);
  Dev<int> timedOut(1);
  CUDA_OK(cudaMemset(out.ptr, 0xAB, bytes + 64));
  CUDA_OK(cudaMemset(timedOut.ptr, 0, sizeof(int)));
  CUDA_OK(cudaDeviceSynchronize());  // a fused step must not start before its lines are zeroed
  const int divisor = op == ridgeAvg ? nranks : 0;
  // Last rank first, so every step waits for lines still to come.
  std::vector<cudaStream_t> streams(nranks);
  for (auto& s : streams) CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int r = nranks - 1; r >= 1; --r) {
    const bool last = r == nranks - 1;
    ASSERT_TRUE(gpu::launchLLRecvReduceSend(last ? nullptr : buf[r + 1]->ptr, last ? out.ptr : nullptr,
                                            buf[r]->ptr, dIn[r]->ptr, count, t, op, last ? divisor : 0,
                                            ll::flagForStep(r), ll::flagForStep(r + 1), 10 * kSecond,
                                            timedOut.ptr, rs(streams[r]))
                    .isOk());
  }
  ASSERT_TRUE(gpu::launchLLSend(buf[1]->ptr, dIn[0]->ptr, bytes, ll::flagForStep(1), rs(streams[0])).isOk());
  CUDA_OK(cudaDeviceSynchronize());
  for (auto s : streams) cudaStreamDestroy(s);
  int to = -1;
  CUDA_OK(cudaMemcpy(&to, timedOut.ptr, sizeof to, cudaMemcpyDeviceToHost));
  EXPECT_EQ(to, 0);
  std::vector<unsigned char> expect = in[0], got(bytes + 64);
  for (int r = 1; r < nranks; ++r)
    reduce2(expect.data(), expect.data(), in[r].data(), count, t, op, r == nranks - 1 ? divisor : 0);
  CUDA_OK(cudaMemcpy(got.data(), out.ptr, bytes + 64, cudaMemcpyDeviceToHost));
  for (auto* d : dIn) delete d;
  for (auto* b : buf) delete b;
  ASSERT_EQ(std::memcmp(got.data(), expect.data(), bytes), 0)
      << dataTypeName(t) << " " << redOpName(op) << " nranks=" << nranks << " count=" << count;
  for (size_t i = bytes; i < bytes + 64; ++i) ASSERT_EQ(got[i], 0xAB);
}

TEST(GpuLL, FusedRingStepMatchesHostForEveryTypeAndOp) {
  SKIP_WITHOUT_GPU();
  PRELOAD_KERNELS();
  std::mt19937_64 rng(5);
  const ridgeDataType_t types[] = {ridgeInt8,   ridgeUint8,   ridgeInt32,    ridgeUint32,  ridgeInt64,
                                   ridgeUint64, ridgeFloat16, ridgeBfloat16, ridgeFloat32, ridgeFloat64};
  for (ridgeDataType_t t : types)
    for (ridgeRedOp_t op : {ridgeSum, ridgeProd, ridgeMax, ridgeMin, ridgeAvg}) {
      ringStep(t, op, 2, 1, &rng);
      ringStep(t, op, 3, 1001, &rng);  // a partial last line for the narrow types
      ringStep(t, op, 4, 8192 / dataTypeSize(t), &rng);
    }
}

TEST(GpuLL, BadArgumentsAreErrorsNotCrashes) {
  // Checked before any CUDA call: hold with or without a device.
  int word = 0;
  ll::Line line{};
  EXPECT_EQ(gpu::launchLLSend(nullptr, &word, 4, 1, nullptr).code(), ridgeInvalidArgument);
  EXPECT_EQ(gpu::launchLLSend(&line, &word, 4, 0, nullptr).code(), ridgeInvalidArgument);
  EXPECT_EQ(gpu::launchLLRecv(&word, &line, 4, 1, 1, nullptr, nullptr).code(), ridgeInvalidArgument);
  EXPECT_EQ(gpu::launchLLRecvReduceSend(nullptr, nullptr, &line, &word, 1, ridgeInt32, ridgeSum, 0, 1, 2, 1,
                                        &word, nullptr)
                .code(),
            ridgeInvalidArgument);
  EXPECT_EQ(gpu::launchLLRecvReduceSend(&line, nullptr, &line, &word, 1, static_cast<ridgeDataType_t>(12),
                                        ridgeSum, 0, 1, 2, 1, &word, nullptr)
                .code(),
            ridgeInvalidArgument);
  const void* srcs[1] = {&word};
  EXPECT_EQ(gpu::launchReduceChannels(&word, srcs, 1, 1, ridgeInt32, ridgeSum, 0, nullptr, {0, 0}).code(),
            ridgeInvalidArgument);
  EXPECT_EQ(gpu::launchCopyChannels(&word, &word, 4, nullptr, {2, -1}).code(), ridgeInvalidArgument);
}

// Several blocks per channel: every shape gives the host result, bit for bit.
TEST(GpuChannels, ReduceAndCopyMatchHostForEveryShape) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(77);
  const gpu::LaunchShape shapes[] = {{1, 0}, {1, 3}, {3, 0}, {3, 2}, {8, 1}, {8, 0}, {64, 0}, {200, 1}};
  for (size_t count : {size_t{1}, size_t{5}, size_t{33}, size_t{1000}, size_t{4097}, size_t{100003}}) {
    for (const gpu::LaunchShape& sh : shapes) {
      for (ridgeDataType_t t : {ridgeFloat32, ridgeFloat16, ridgeInt8, ridgeFloat64}) {
        const size_t bytes = count * dataTypeSize(t);
        auto a = randomValues(t, count, &rng), b = randomValues(t, count, &rng);
        Dev<> da(bytes), db(bytes), dout(bytes);
        CUDA_OK(cudaMemcpy(da.ptr, a.data(), bytes, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(db.ptr, b.data(), bytes, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemset(dout.ptr, 0xAB, bytes + 64));
        const void* srcs[2] = {da.ptr, db.ptr};
        ASSERT_TRUE(gpu::launchReduceChannels(dout.ptr, srcs, 2, count, t, ridgeSum, 0, nullptr, sh).isOk());
        std::vector<unsigned char> expect(bytes), got(bytes + 64);
        reduce2(expect.data(), a.data(), b.data(), count, t, ridgeSum, 0);
        CUDA_OK(cudaMemcpy(got.data(), dout.ptr, bytes + 64, cudaMemcpyDeviceToHost));
        ASSERT_EQ(std::memcmp(got.data(), expect.data(), bytes), 0)
            << dataTypeName(t) << " count=" << count << " channels=" << sh.channels
            << " bpc=" << sh.blocksPerChannel;
        for (size_t i = bytes; i < bytes + 64; ++i) ASSERT_EQ(got[i], 0xAB);
        // Copy, aligned and not.
        for (size_t off : {size_t{0}, size_t{1}}) {
          if (off >= bytes) continue;
          CUDA_OK(cudaMemset(dout.ptr, 0xAB, bytes + 64));
          ASSERT_TRUE(gpu::launchCopyChannels(dout.ptr + off, da.ptr + off, bytes - off, nullptr, sh).isOk());
          CUDA_OK(cudaMemcpy(got.data(), dout.ptr, bytes + 64, cudaMemcpyDeviceToHost));
          ASSERT_EQ(std::memcmp(got.data() + off, a.data() + off, bytes - off), 0)
              << "copy " << bytes << " +" << off;
          for (size_t i = 0; i < off; ++i) ASSERT_EQ(got[i], 0xAB);
          for (size_t i = bytes; i < bytes + 64; ++i) ASSERT_EQ(got[i], 0xAB);
        }
      }
    }
  }
}

}  // namespace
}  // namespace ridge
