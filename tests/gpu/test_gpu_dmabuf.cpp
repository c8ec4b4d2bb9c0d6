// Classic GDR registration on a real GPU: the CUDA driver registrar (libcuda.so.1 loaded at
// run time) must classify cudaMalloc memory as device memory keyed by its allocation, and
// export a page-aligned range of it as a dma-buf (or say why the driver cannot). Without a
// CUDA device: "skipped: no CUDA device".
#include <unistd.h>

#include <string>

#include "tests/gpu/gpu_test_util.h"
#include "transports/net/device_registration.h"

namespace ridge {
namespace {

TEST(GpuDmaBuf, DriverRegistrarClassifiesAndExportsDeviceMemory) {
  SKIP_WITHOUT_GPU();
  std::string why;
  DeviceMemoryRegistrar* reg = cudaDriverRegistrar(&why);
  ASSERT_NE(reg, nullptr) << why;  // a machine with a GPU has the driver library
  constexpr size_t kBytes = size_t(8) << 20;
  char* dev = nullptr;
  CUDA_OK(cudaMalloc(&dev, kBytes));
  uintptr_t base = 0;
  size_t bytes = 0;
  EXPECT_TRUE(reg->deviceAllocation(dev + 4096 + 3, &base, &bytes));
  EXPECT_EQ(base, reinterpret_cast<uintptr_t>(dev));
  EXPECT_GE(bytes, kBytes);
  int host = 0;
  EXPECT_FALSE(reg->deviceAllocation(&host, &base, &bytes));
  int fd = -1;
  Status st = reg->exportDmaBuf(reinterpret_cast<uintptr_t>(dev), kBytes, &fd);
  if (st.isOk()) {
    EXPECT_GE(fd, 0);
    EXPECT_EQ(lseek(fd, 0, SEEK_END), static_cast<off_t>(kBytes));  // a dma-buf's size
    close(fd);
  } else {
    // Proprietary kernel modules or an old driver: the reason must name the call.
    EXPECT_NE(st.message().find("cuMemGetHandleForAddressRange"), std::string::npos) << st.message();
  }
  // Not page aligned: the driver refuses; the error must say so rather than crash.
  EXPECT_FALSE(reg->exportDmaBuf(reinterpret_cast<uintptr_t>(dev) + 1, 4096, &fd).isOk());
  cudaFree(dev);
}

}  // namespace
}  // namespace ridge
