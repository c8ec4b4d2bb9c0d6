// Shared by the GPU tests: the skip without a device (ctest reports "skipped: no CUDA
// device", never a silent pass) and a CUDA-call assertion.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "kernels/device_reduce.h"

#define SKIP_WITHOUT_GPU()                                                           \
  do {                                                                               \
    if (::ridge::gpu::deviceCount() == 0) GTEST_SKIP() << "skipped: no CUDA device"; \
  } while (0)

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr
