// rdma-core loaded at run time (transports/verbs/ibv_api.h): libridge.so names neither
// libibverbs nor libmlx5 (no DT_NEEDED, no undefined ibv_*/mlx5dv_* symbol), so it loads on
// hosts without rdma-core; and when the library cannot be loaded (forced here by pointing
// dlopen at a path that does not exist), RIDGE_NET=verbs fails at communicator init with a
// clean "rdma-core not found" error while softnic, TCP and shared memory work in the same
// process.
#include <gtest/gtest.h>
#include <stdio.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "ridge/ridge.h"
#include "tests/device/scoped_env.h"
#include "transports/verbs/verbs.h"

#if defined(RIDGE_HAVE_VERBS)
#include "transports/verbs/ibv_api.h"
#endif

namespace ridge {
namespace {

// stdout of `command`, or nullopt-like false when it could not run.
bool runCommand(const std::string& command, std::string* out) {
  FILE* f = popen(command.c_str(), "r");
  if (!f) return false;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, n);
  return pclose(f) == 0;
}

TEST(VerbsDlopen, LibridgeNeedsNoRdmaCore) {
  const std::string lib = RIDGE_TEST_LIBRIDGE_PATH;
  std::string dynamic, symbols;
  if (!runCommand("readelf -d -W '" + lib + "' 2>/dev/null", &dynamic) ||
      !runCommand("readelf --dyn-syms -W '" + lib + "' 2>/dev/null", &symbols))
    GTEST_SKIP() << "skipped: readelf (binutils) could not read " << lib;
  ASSERT_NE(dynamic.find("(NEEDED)"), std::string::npos) << "readelf printed no NEEDED entry:\n" << dynamic;
  EXPECT_EQ(dynamic.find("libibverbs"), std::string::npos) << dynamic;
  EXPECT_EQ(dynamic.find("libmlx5"), std::string::npos) << dynamic;
  // Undefined dynamic symbols (section UND) of rdma-core would make the loader (or the
  // first call) fail on a host without it.
  size_t start = 0;
  while (start < symbols.size()) {
    size_t end = symbols.find('\n', start);
    if (end == std::string::npos) end = symbols.size();
    const std::string line = symbols.substr(start, end - start);
    if (line.find(" UND ") != std::string::npos)
      EXPECT_TRUE(line.find("ibv_") == std::string::npos && line.find("mlx5dv_") == std::string::npos)
          << line;
    start = end + 1;
  }
}

#if defined(RIDGE_HAVE_VERBS)

// Points the loader at a path that does not exist for the scope, then back at the defaults.
struct ForcedLoadFailure {
  ForcedLoadFailure() {
    verbs::setIbvLibraryNamesForTesting("/nonexistent/libibverbs.so.1", "/nonexistent/libmlx5.so.1");
  }
  ~ForcedLoadFailure() { verbs::setIbvLibraryNamesForTesting("libibverbs.so.1", "libmlx5.so.1"); }
};

using ridgetest::ScopedEnv;

TEST(VerbsDlopen, ForcedLoadFailureIsACleanError) {
  ForcedLoadFailure forced;
  std::unique_ptr<verbs::Provider> p;
  Status st = verbs::openProvider("verbs", &p);
  ASSERT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), ridgeSystemError);
  EXPECT_NE(st.message().find("rdma-core not found"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("/nonexistent/libibverbs.so.1"), std::string::npos) << st.message();
  // Asked again: the same answer, not a crash on a half-loaded table.
  st = verbs::openProvider("verbs", &p);
  EXPECT_NE(st.message().find("rdma-core not found"), std::string::npos) << st.message();
  const verbs::GdrLadderDecision d = verbs::decideGdrLadder(verbs::gdrLadderFactsWithoutDevice());
  EXPECT_EQ(d.rung, verbs::GdrRung::Unavailable);
  EXPECT_NE(d.reason.find("rdma-core not found: cannot load /nonexistent/libibverbs.so.1"), std::string::npos)
      << d.reason;
  // softnic is unaffected.
  EXPECT_TRUE(verbs::openProvider("softnic", &p).isOk());
}

TEST(VerbsDlopen, RealLibraryLoadsWhereInstalled) {
  std::string listing;
  runCommand("ldconfig -p 2>/dev/null", &listing);
  if (listing.find("libibverbs.so.1 ") == std::string::npos)
    GTEST_SKIP() << "skipped: libibverbs.so.1 is not installed here (ldconfig -p)";
  std::unique_ptr<verbs::Provider> p;
  Status st = verbs::openProvider("verbs", &p);
  ASSERT_TRUE(st.isOk()) << st.message();
  // (Listing devices needs the kernel's RDMA support as well: VerbsProvider.BuiltAndListsDevices.)
  const verbs::IbvApi* api = nullptr;
  ASSERT_TRUE(verbs::ibvApi(&api).isOk());
  // Every entry the provider calls is filled (the optional dma-buf one may be null).
  EXPECT_TRUE(api->getDeviceList && api->openDevice && api->queryDeviceEx && api->queryPort && api->regMr &&
              api->createQp && api->modifyQp && api->postSend && api->pollCq && api->allocDm && api->regDmMr);
}

// Two ranks as threads, one allreduce of 1024 floats with RIDGE_NET=`net` and RIDGE_SHM=`shm`;
// returns "" on success, or the first error text.
std::string allreduceOverNet(const char* net, const char* shmSetting = "0") {
  ScopedEnv n("RIDGE_NET", net);
  ScopedEnv shm("RIDGE_SHM", shmSetting);
  ScopedEnv ifname("RIDGE_SOCKET_IFNAME", "lo");
  ScopedEnv timeout("RIDGE_TIMEOUT", "30");
  ridgeUniqueId id;
  if (ridgeGetUniqueId(&id) != ridgeSuccess)
    return std::string("ridgeGetUniqueId: ") + ridgeGetLastError(nullptr);
  std::string errors[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      ridgeComm_t comm = nullptr;
      if (ridgeCommInitRank(&comm, 2, id, r) != ridgeSuccess) {
        errors[r] = ridgeGetLastError(nullptr);
        if (errors[r].empty()) errors[r] = "ridgeCommInitRank failed";
        return;
      }
      std::vector<float> in(1024), out(1024, -1.0f);
      for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i * (r + 1));
      if (ridgeAllReduce(in.data(), out.data(), in.size(), ridgeFloat, ridgeSum, comm, nullptr) !=
          ridgeSuccess)
        errors[r] = ridgeGetLastError(comm);
      for (size_t i = 0; errors[r].empty() && i < out.size(); ++i)
        if (out[i] != static_cast<float>(3 * i)) errors[r] = "wrong sum at " + std::to_string(i);
      ridgeCommDestroy(comm);
    });
  }
  for (auto& t : ranks) t.join();
  return errors[0].empty() ? errors[1] : errors[0];
}

TEST(VerbsDlopen, CommunicatorWithoutRdmaCore) {
  ForcedLoadFailure forced;
  const std::string verbsError = allreduceOverNet("verbs");
  EXPECT_NE(verbsError.find("rdma-core not found"), std::string::npos) << "RIDGE_NET=verbs: " << verbsError;
  EXPECT_EQ(allreduceOverNet("softnic"), "");
  EXPECT_EQ(allreduceOverNet("socket"), "");
  EXPECT_EQ(allreduceOverNet("auto", "1"), "");  // shared memory between the two ranks
}

#endif

}  // namespace
}  // namespace ridge
