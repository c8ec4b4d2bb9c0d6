// The GPU reduction and copy kernels against the host kernels (src/reduce), which
// tests/reduce checks against an independent higher-precision reference. The two must
// agree bit for bit (same fold order, same rounding, same signed-zero rules), NaN payloads
// aside: the GPU's float arithmetic returns its one canonical NaN where the host keeps the
// input's payload, so a NaN matches any NaN and every other value is compared bit for bit.
// Without a CUDA device every test reports "skipped: no CUDA device".
#include <cuda.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/device_reduce.h"
#include "reduce/reduce.h"
#include "tests/gpu/gpu_test_util.h"

namespace ridge {
namespace {

const ridgeDataType_t kTypes[] = {ridgeInt8,   ridgeUint8,   ridgeInt32,    ridgeUint32,  ridgeInt64,
                                  ridgeUint64, ridgeFloat16, ridgeBfloat16, ridgeFloat32, ridgeFloat64};
const ridgeRedOp_t kOps[] = {ridgeSum, ridgeProd, ridgeMax, ridgeMin, ridgeAvg};

// Random bytes that are valid, interesting values for the type: small magnitudes for
// products (so they do not all overflow to inf), a few NaNs and signed zeros for floats.
void fillRandom(std::vector<unsigned char>* buf, ridgeDataType_t t, size_t count, std::mt19937_64* rng) {
  const size_t es = dataTypeSize(t);
  buf->resize(count * es);
  std::uniform_real_distribution<float> f(-2.0f, 2.0f);
  for (size_t i = 0; i < count; ++i) {
    unsigned char* p = buf->data() + i * es;
    const uint64_t r = (*rng)();
    float v = f(*rng);
    if (r % 97 == 0) v = -0.0f;
    if (r % 101 == 0) v = 0.0f;
    if (r % 499 == 0) v = std::numeric_limits<float>::quiet_NaN();
    switch (t) {
      case ridgeFloat32: std::memcpy(p, &v, 4); break;
      case ridgeFloat64: {
        double d = static_cast<double>(v) + static_cast<double>(r % 1000) * 1e-9;
        std::memcpy(p, &d, 8);
        break;
      }
      case ridgeFloat16: {
        uint16_t h = floatToHalf(v);
        std::memcpy(p, &h, 2);
        break;
      }
      case ridgeBfloat16: {
        uint16_t b = floatToBf16(v);
        std::memcpy(p, &b, 2);
        break;
      }
      default: std::memcpy(p, &r, es); break;  // integers: any bit pattern
    }
  }
}

// Whether the float element at p is a NaN: exponent bits all set, mantissa not zero.
bool isNaN(const unsigned char* p, ridgeDataType_t t) {
  uint64_t exponent = 0, mantissa = 0;
  switch (t) {
    case ridgeFloat16: exponent = 0x7c00u, mantissa = 0x03ffu; break;
    case ridgeBfloat16: exponent = 0x7f80u, mantissa = 0x007fu; break;
    case ridgeFloat32: exponent = 0x7f800000u, mantissa = 0x007fffffu; break;
    case ridgeFloat64: exponent = 0x7ff0000000000000ull, mantissa = 0x000fffffffffffffull; break;
    default: return false;  // integers have no NaN
  }
  uint64_t bits = 0;
  std::memcpy(&bits, p, dataTypeSize(t));  // x86-64 is little-endian: the element's low bytes
  return (bits & exponent) == exponent && (bits & mantissa) != 0;
}

// Elements of `got` that differ from `expect`: bit for bit, except that any NaN equals any
// NaN. *nans: elements where both are NaN (so a caller can tell the case was exercised).
size_t mismatches(const unsigned char* got, const unsigned char* expect, size_t count, ridgeDataType_t t,
                  size_t* nans = nullptr) {
  const size_t es = dataTypeSize(t);
  size_t bad = 0, both = 0;
  for (size_t i = 0; i < count; ++i) {
    const unsigned char* g = got + i * es;
    const unsigned char* e = expect + i * es;
    if (std::memcmp(g, e, es) == 0) {
      both += isNaN(e, t);
      continue;
    }
    if (isNaN(g, t) && isNaN(e, t)) {
      ++both;
      continue;
    }
    ++bad;
  }
  if (nans) *nans = both;
  return bad;
}

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { EXPECT_EQ(cudaMalloc(&ptr, bytes + 64), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(ptr); }
};

// One case: nsrcs random inputs at byte offset `misalign` (0 keeps 16-byte alignment),
// device result vs host result, output poisoned first.
void checkCase(ridgeDataType_t t, ridgeRedOp_t op, int nsrcs, size_t count, size_t misalign, int maxBlocks,
               std::mt19937_64* rng) {
  const size_t es = dataTypeSize(t);
  const size_t bytes = count * es;
  const int divisor = op == ridgeAvg ? nsrcs : 0;
  std::vector<std::vector<unsigned char>> host(nsrcs);
  std::vector<DeviceBuffer*> dev;
  std::vector<const void*> hostPtrs, devPtrs;
  for (int k = 0; k < nsrcs; ++k) {
    fillRandom(&host[k], t, count, rng);
    dev.push_back(new DeviceBuffer(bytes));
    void* d = static_cast<char*>(dev.back()->ptr) + misalign;
    ASSERT_EQ(cudaMemcpy(d, host[k].data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    hostPtrs.push_back(host[k].data());
    devPtrs.push_back(d);
  }
  DeviceBuffer out(bytes);
  void* dOut = static_cast<char*>(out.ptr) + misalign;
  ASSERT_EQ(cudaMemset(out.ptr, 0xAB, bytes + 64), cudaSuccess);
  std::vector<unsigned char> expect(bytes), got(bytes + 64);
  reduceMany(expect.data(), hostPtrs.data(), nsrcs, count, t, op, divisor);
  ASSERT_TRUE(
      gpu::launchReduce(dOut, devPtrs.data(), nsrcs, count, t, op, divisor, nullptr, maxBlocks).isOk());
  ASSERT_EQ(cudaMemcpy(got.data(), out.ptr, bytes + 64, cudaMemcpyDeviceToHost), cudaSuccess);
  for (DeviceBuffer* d : dev) delete d;
  ASSERT_EQ(mismatches(got.data() + misalign, expect.data(), count, t), 0u)
      << dataTypeName(t) << " " << redOpName(op) << " nsrcs=" << nsrcs << " count=" << count
      << " misalign=" << misalign;
  // Nothing written outside [dOut, dOut + bytes).
  for (size_t i = 0; i < misalign; ++i) ASSERT_EQ(got[i], 0xAB);
  for (size_t i = misalign + bytes; i < bytes + 64; ++i) ASSERT_EQ(got[i], 0xAB);
}

TEST(GpuKernels, ReduceMatchesHostForEveryTypeAndOp) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(12345);
  for (ridgeDataType_t t : kTypes) {
    for (ridgeRedOp_t op : kOps) {
      // A size with a vector tail, one smaller than a vector, and a grid-stride case
      // where each of 3 blocks loops many times.
      checkCase(t, op, 2, 100003, 0, 0, &rng);
      checkCase(t, op, 3, 5, 0, 0, &rng);
      checkCase(t, op, 1, 4099, 0, 0, &rng);
      checkCase(t, op, 8, 70001, 0, 3, &rng);
      checkCase(t, op, 2, 33333, dataTypeSize(t), 0, &rng);  // not 16-byte aligned: scalar path
    }
  }
}

TEST(GpuKernels, ReduceInPlace) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(7);
  const size_t count = 1 << 20;
  std::vector<unsigned char> a, b;
  fillRandom(&a, ridgeFloat32, count, &rng);
  fillRandom(&b, ridgeFloat32, count, &rng);
  DeviceBuffer da(count * 4), db(count * 4);
  CUDA_OK(cudaMemcpy(da.ptr, a.data(), count * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(db.ptr, b.data(), count * 4, cudaMemcpyHostToDevice));
  const void* srcs[2] = {da.ptr, db.ptr};
  ASSERT_TRUE(gpu::launchReduce(da.ptr, srcs, 2, count, ridgeFloat32, ridgeSum, 0, nullptr).isOk());
  std::vector<unsigned char> expect(count * 4), got(count * 4);
  reduce2(expect.data(), a.data(), b.data(), count, ridgeFloat32, ridgeSum, 0);
  CUDA_OK(cudaMemcpy(got.data(), da.ptr, count * 4, cudaMemcpyDeviceToHost));
  size_t nans = 0;
  EXPECT_EQ(mismatches(got.data(), expect.data(), count, ridgeFloat32, &nans), 0u);
  EXPECT_GT(nans, 0u) << "the inputs hold NaNs, so the result must too";
}

// The NaN rule of the comparison itself: any NaN matches any NaN, nothing else is relaxed
// (signed zeros, infinities and integers stay bit for bit).
TEST(GpuKernels, ComparisonTreatsOnlyNaNsAsEqual) {
  const uint32_t canonical = 0x7fffffffu, quiet = 0x7fc00000u, negZero = 0x80000000u, zero = 0,
                 inf = 0x7f800000u;
  auto f32 = [](uint32_t a, uint32_t b) {
    return mismatches(reinterpret_cast<const unsigned char*>(&a), reinterpret_cast<const unsigned char*>(&b),
                      1, ridgeFloat32);
  };
  EXPECT_EQ(f32(canonical, quiet), 0u);
  EXPECT_EQ(f32(negZero, zero), 1u);
  EXPECT_EQ(f32(inf, quiet), 1u);
  const uint16_t h[2] = {0x7fff, 0x7e00}, bf[2] = {0x7fff, 0x7fc0}, hInf[2] = {0x7c00, 0x7e00};
  auto bytes = [](const uint16_t* p) { return reinterpret_cast<const unsigned char*>(p); };
  EXPECT_EQ(mismatches(bytes(h), bytes(h + 1), 1, ridgeFloat16), 0u);
  EXPECT_EQ(mismatches(bytes(bf), bytes(bf + 1), 1, ridgeBfloat16), 0u);
  EXPECT_EQ(mismatches(bytes(hInf), bytes(hInf + 1), 1, ridgeFloat16), 1u);
  const uint64_t d[2] = {0x7fffffffffffffffull, 0x7ff8000000000000ull};
  EXPECT_EQ(mismatches(reinterpret_cast<const unsigned char*>(d),
                       reinterpret_cast<const unsigned char*>(d + 1), 1, ridgeFloat64),
            0u);
  EXPECT_EQ(mismatches(bytes(h), bytes(h + 1), 1, ridgeInt8), 1u);  // integers: bits only
}

// Every kernel instantiation loads without a launch (the preload the proxy runs in its
// setup, so that no first launch meets a parked stream), and a second call is harmless.
// kPreloadedKernels once forgot the LL collective kernels (103 for 153 loaded: the first GPU
// run); it is now derived from the same counts, and PreloadCoversEveryKernelOfRidgesModules
// checks it against the modules.
TEST(GpuKernels, PreloadLoadsEveryKernel) {
  SKIP_WITHOUT_GPU();
  for (int round = 0; round < 2; ++round) {
    int loaded = -1;
    const Status s = gpu::preloadKernels(&loaded);
    ASSERT_TRUE(s.isOk()) << s.message();
    EXPECT_EQ(loaded, gpu::kPreloadedKernels) << "round " << round;
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// A driver entry point by name (the tests link only the runtime), or null.
template <typename Fn>
Fn driverFn(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
  const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, CUDART_VERSION, cudaEnableDefault, &q);
#else
  const cudaError_t e = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &q);
#endif
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<Fn>(fn);
}

// The invariant behind the preload: every kernel in the CUDA modules of Ridge's launchers is
// one preloadKernels loads (so none is left to lazy loading, whose first launch may wait for
// a spinning LL kernel or a parked stream: a hang), and after the preload every one of them
// is loaded. Counted from the modules themselves (cuModuleEnumerateFunctions), so a kernel
// added without its preload fails here in both builds: kernels in each binary, or once in
// libridge_gpu.so (RIDGE_GPU_CODE_SHARED, the pack's mode). Meaningful under
// CUDA_MODULE_LOADING=LAZY (the runner's "kernel preload, lazy module loading" step); under
// EAGER everything is loaded anyway and only the count is checked.
TEST(GpuKernels, PreloadCoversEveryKernelOfRidgesModules) {
  SKIP_WITHOUT_GPU();
  using GetModuleFn = CUresult (*)(CUmodule*, CUfunction);
  using CountFn = CUresult (*)(unsigned int*, CUmodule);
  using EnumerateFn = CUresult (*)(CUfunction*, unsigned int, CUmodule);
  using IsLoadedFn = CUresult (*)(CUfunctionLoadingState*, CUfunction);
  using NameFn = CUresult (*)(const char**, CUfunction);
  const auto getModule = driverFn<GetModuleFn>("cuFuncGetModule");
  const auto count = driverFn<CountFn>("cuModuleGetFunctionCount");
  const auto enumerate = driverFn<EnumerateFn>("cuModuleEnumerateFunctions");
  const auto isLoaded = driverFn<IsLoadedFn>("cuFuncIsLoaded");
  const auto name = driverFn<NameFn>("cuFuncGetName");
  if (!getModule || !count || !enumerate || !isLoaded || !name)
    GTEST_SKIP() << "skipped: this driver lacks cuModuleEnumerateFunctions or cuFuncIsLoaded (CUDA < 12.4)";
  int loaded = -1;
  const Status s = gpu::preloadKernels(&loaded);
  ASSERT_TRUE(s.isOk()) << s.message();
  const void* anchors[4] = {};
  const int nAnchors = gpu::preloadedModuleAnchors(anchors, 4);
  ASSERT_GE(nAnchors, 1);
  unsigned int inModules = 0;
  std::vector<CUmodule> seen;
  for (int a = 0; a < nAnchors; ++a) {
    cudaFunction_t f = nullptr;
    CUDA_OK(cudaGetFuncBySymbol(&f, anchors[a]));
    CUmodule mod = nullptr;
    ASSERT_EQ(getModule(&mod, reinterpret_cast<CUfunction>(f)), CUDA_SUCCESS) << "anchor " << a;
    bool dup = false;
    for (CUmodule m : seen) dup = dup || m == mod;
    if (dup) continue;  // one module holding several files' kernels (relocatable device code)
    seen.push_back(mod);
    unsigned int n = 0;
    ASSERT_EQ(count(&n, mod), CUDA_SUCCESS);
    std::vector<CUfunction> fns(n);
    ASSERT_EQ(enumerate(fns.data(), n, mod), CUDA_SUCCESS);
    for (CUfunction fn : fns) {
      const char* fname = nullptr;
      if (name(&fname, fn) != CUDA_SUCCESS) fname = "?";
      CUfunctionLoadingState st = CU_FUNCTION_LOADING_STATE_UNLOADED;
      ASSERT_EQ(isLoaded(&st, fn), CUDA_SUCCESS) << fname;
      EXPECT_EQ(st, CU_FUNCTION_LOADING_STATE_LOADED) << fname << " was not loaded by preloadKernels";
    }
    inModules += n;
  }
  EXPECT_EQ(inModules, static_cast<unsigned int>(gpu::kPreloadedKernels))
      << "kernels in the launchers' modules vs those preloadKernels loads: a kernel without a preload?";
  EXPECT_EQ(loaded, gpu::kPreloadedKernels);
  std::printf("figure: kernel preload: %d kernels loaded, %u in %zu modules of Ridge's launchers\n", loaded,
              inModules, seen.size());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(GpuKernels, CopyEveryAlignmentAndTail) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(99);
  for (size_t bytes : {size_t{1}, size_t{15}, size_t{16}, size_t{4097}, size_t{3} << 20}) {
    for (size_t off : {size_t{0}, size_t{1}, size_t{8}}) {
      std::vector<unsigned char> src(bytes);
      for (auto& c : src) c = static_cast<unsigned char>(rng());
      DeviceBuffer ds(bytes), dd(bytes);
      CUDA_OK(cudaMemcpy(static_cast<char*>(ds.ptr) + off, src.data(), bytes, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemset(dd.ptr, 0xAB, bytes + 64));
      ASSERT_TRUE(gpu::launchCopy(static_cast<char*>(dd.ptr) + off, static_cast<char*>(ds.ptr) + off, bytes,
                                  nullptr, 2)
                      .isOk());
      std::vector<unsigned char> got(bytes + 64);
      CUDA_OK(cudaMemcpy(got.data(), dd.ptr, bytes + 64, cudaMemcpyDeviceToHost));
      EXPECT_EQ(std::memcmp(got.data() + off, src.data(), bytes), 0) << bytes << " at +" << off;
      for (size_t i = off + bytes; i < bytes + 64; ++i) ASSERT_EQ(got[i], 0xAB);
    }
  }
}

TEST(GpuKernels, BadArgumentsAreErrorsNotCrashes) {
  // Argument checks come before any CUDA call, so they hold with or without a device.
  const void* srcs[1] = {nullptr};
  EXPECT_EQ(gpu::launchReduce(nullptr, srcs, 1, 10, ridgeFloat32, ridgeSum, 0, nullptr).code(),
            ridgeInvalidArgument);
  int dummy = 0;
  EXPECT_EQ(gpu::launchReduce(&dummy, srcs, 1, 10, ridgeFloat32, ridgeSum, 0, nullptr).code(),
            ridgeInvalidArgument);
  EXPECT_EQ(gpu::launchReduce(&dummy, srcs, 9, 10, ridgeFloat32, ridgeSum, 0, nullptr).code(),
            ridgeInvalidArgument);
  const void* ok[1] = {&dummy};
  EXPECT_EQ(
      gpu::launchReduce(&dummy, ok, 1, 10, static_cast<ridgeDataType_t>(77), ridgeSum, 0, nullptr).code(),
      ridgeInvalidArgument);
}

}  // namespace
}  // namespace ridge
