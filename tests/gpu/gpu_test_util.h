// Shared by the GPU tests: the skip without a device (ctest reports "skipped: no CUDA
// device", never a silent pass), which becomes a failure where a GPU is known to be present,
// and a CUDA-call assertion.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "kernels/device_reduce.h"

namespace ridge::gputest {

// RIDGE_TEST_REQUIRE_GPU=1: the caller knows a GPU is present (tests/gpu/run_checks.sh sets
// it once nvidia-smi has listed one), so a test that finds no usable CUDA device (a runtime
// and driver that do not match, say) must fail rather than skip: gtest exits 0 for skips, and
// the script would otherwise report a pass for tests that never ran.
inline bool gpuRequired() {
  const char* v = std::getenv("RIDGE_TEST_REQUIRE_GPU");
  return v && *v && std::strcmp(v, "0") != 0;
}

}  // namespace ridge::gputest

// Skips the test ("skipped: " + what), or fails it when RIDGE_TEST_REQUIRE_GPU is set.
#define SKIP_OR_FAIL_WITHOUT_GPU(what)                                                             \
  do {                                                                                             \
    if (::ridge::gputest::gpuRequired())                                                           \
      FAIL() << (what) << ", although RIDGE_TEST_REQUIRE_GPU is set (a GPU is present): the CUDA " \
             << "runtime cannot use it";                                                           \
    GTEST_SKIP() << "skipped: " << (what);                                                         \
  } while (0)

#define SKIP_WITHOUT_GPU()                                                            \
  do {                                                                                \
    if (::ridge::gpu::deviceCount() == 0) SKIP_OR_FAIL_WITHOUT_GPU("no CUDA device"); \
  } while (0)

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// Loads every Ridge kernel before a test launches a receiver that spins for a sender
// (kernels/device_reduce.h, preloadKernels: under lazy loading the sender's first launch
// could wait for the spinning receiver).
#define PRELOAD_KERNELS()                                           \
  do {                                                              \
    const ::ridge::Status preload = ::ridge::gpu::preloadKernels(); \
    ASSERT_TRUE(preload.isOk()) << preload.message();               \
  } while (0)
