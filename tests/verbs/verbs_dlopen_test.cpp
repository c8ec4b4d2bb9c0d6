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
#include "scoped_env.h"
#include "tests/verbs/two_ranks.h"
#include "transports/verbs/verbs.h"

#if defined(RIDGE_HAVE_VERBS)
#include "transports/verbs/ibv_api.h"
#endif

namespace ridge {
namespace {

using verbs_test::allreduceOverNet;

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
