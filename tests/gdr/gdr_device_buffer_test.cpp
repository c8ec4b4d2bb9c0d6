// Device buffers drive gdr-write (docs/gdr-write.md, "Device buffers"): on the emulated device
// runtime, a send from device memory over the gdr transport in write mode runs the device-side
// producer (gdr_device.h on the stream's device thread: payload from the device buffer straight
// into staging, its own WQEs and doorbells), not a copy-engine copy into a slot and a host
// post; a send from host memory keeps the host stand-in. Ranks are threads of this process
// that reach each other only through the gdr transport over the software NIC.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "device/emulated_runtime.h"
#include "device_ranks.h"
#include "ridge/ridge.h"
#include "transports/gdr/gdr_transport.h"

namespace {

using namespace p2ptest;
using ridge::device::ScopedRuntimeForTesting;

struct GdrWriteEnv {
  GdrWriteEnv() {
    setenv("RIDGE_NET", "softnic", 1);
    setenv("RIDGE_SHM", "0", 1);
    setenv("RIDGE_P2P", "off", 1);
    setenv("RIDGE_LL", "off", 1);
    setenv("RIDGE_GDR_MODE", "write", 1);
    setenv("RIDGE_GDR_STAGING_SLOTS", "2", 1);
    setenv("RIDGE_GDR_SLOT_BYTES", "4K", 1);
  }
  ~GdrWriteEnv() {
    for (const char* v : {"RIDGE_NET", "RIDGE_SHM", "RIDGE_P2P", "RIDGE_LL", "RIDGE_GDR_MODE",
                          "RIDGE_GDR_STAGING_SLOTS", "RIDGE_GDR_SLOT_BYTES"})
      unsetenv(v);
  }
};

std::vector<unsigned char> pattern(size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((i * 131 + seed * 17 + (i >> 8)) & 0xff);
  return v;
}

// Every rank past this point (a one-element host allreduce).
ridgeResult_t hostBarrier(ridgeComm_t comm) {
  int32_t one = 1, sum = 0;
  return ridgeAllReduce(&one, &sum, 1, ridgeInt32, ridgeSum, comm, nullptr);
}

TEST(GdrDeviceBuffers, DeviceSendRunsTheDeviceSideProducerHostSendTheStandIn) {
  GdrWriteEnv env;
  EmulatedRuntime rt(2);
  ScopedRuntimeForTesting scope(&rt);
  constexpr size_t kBytes = 100000;  // 25 slots of 4 KiB (the last one short)
  constexpr uint64_t kSlots = (kBytes + 4095) / 4096;
  const ridge::gdr::Counters before = ridge::gdr::processCounters();
  ridge::gdr::Counters afterDevice{};
  withRanks(rt, 2, 2, [&](TestRank& t) {
    DevMem buf(rt, kBytes);
    if (t.rank == 0) {
      buf.put(pattern(kBytes, 1));
      ASSERT_EQ(ridgeSend(buf.p, kBytes, ridgeUint8, 1, t.comm, t.stream), ridgeSuccess) << errorText();
    } else {
      buf.put(std::vector<unsigned char>(kBytes, kPoison));
      ASSERT_EQ(ridgeRecv(buf.p, kBytes, ridgeUint8, 0, t.comm, t.stream), ridgeSuccess) << errorText();
    }
    expectStreamDone(rt, t);
    if (t.rank == 1) EXPECT_TRUE(buf.get(0, kBytes) == pattern(kBytes, 1)) << "device-to-device message";
    ASSERT_EQ(hostBarrier(t.comm), ridgeSuccess) << errorText();
    if (t.rank == 0) afterDevice = ridge::gdr::processCounters();
    ASSERT_EQ(hostBarrier(t.comm), ridgeSuccess) << errorText();
    // The same message from host memory: the host stand-in posts it.
    std::vector<unsigned char> host =
        t.rank == 0 ? pattern(kBytes, 2) : std::vector<unsigned char>(kBytes, 0);
    if (t.rank == 0)
      ASSERT_EQ(ridgeSend(host.data(), kBytes, ridgeUint8, 1, t.comm, nullptr), ridgeSuccess) << errorText();
    else
      ASSERT_EQ(ridgeRecv(host.data(), kBytes, ridgeUint8, 0, t.comm, nullptr), ridgeSuccess) << errorText();
    if (t.rank == 1) EXPECT_TRUE(host == pattern(kBytes, 2)) << "host-to-host message";
  });
  const ridge::gdr::Counters after = ridge::gdr::processCounters();
  EXPECT_EQ(afterDevice.devicePosts - before.devicePosts, kSlots)
      << "every slot of the device buffer's message filled by the device-side producer";
  EXPECT_GE(afterDevice.slotsWritten - before.slotsWritten, kSlots);
  EXPECT_EQ(after.devicePosts, afterDevice.devicePosts) << "host buffers go through the host stand-in";
  EXPECT_GE(after.slotsWritten - afterDevice.slotsWritten, kSlots);
  EXPECT_EQ(after.remoteReads - before.remoteReads, 0u) << "the producer read NIC-side memory";
  EXPECT_EQ(after.stagedLost - before.stagedLost, 0u);
}

}  // namespace
