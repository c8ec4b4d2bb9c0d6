// Ridge's libnccl.so.2 seen as an NCCL program sees it: compiled against NVIDIA's nccl.h and
// linked against the shim only. Checks that the library loaded is Ridge's (the CUDA toolkit's
// own libnccl.so.2 is on the loader's cache path), that it exports every function of the
// header under both names, the version and error strings, that what Ridge cannot do is refused
// by name, that Ridge's extra result codes map into NCCL's range, and the NCCL_* settings.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

std::string realPath(const char* p) {
  char buf[PATH_MAX];
  return realpath(p, buf) ? buf : "";
}

bool lastErrorNames(const char* fn, ncclComm_t comm = nullptr) {
  const char* text = ncclGetLastError(comm);
  return text && std::strstr(text, fn);
}

ncclComm_t oneRankComm() {
  ncclUniqueId id;
  ncclComm_t comm = nullptr;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) return nullptr;
  return comm;
}

TEST(NcclShim, TheLoadedLibraryIsRidges) {
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&ncclAllReduce), &info), 0);
  EXPECT_EQ(realPath(info.dli_fname), realPath(RIDGE_NCCL_LIBRARY))
      << "ncclAllReduce came from " << info.dli_fname;
  auto version = reinterpret_cast<const char* (*)()>(dlsym(RTLD_DEFAULT, "ridgeNcclShimVersion"));
  ASSERT_NE(version, nullptr) << "no Ridge-only symbol: this is not Ridge's libnccl.so.2";
  EXPECT_NE(std::string(version()).find("Ridge"), std::string::npos);
}

// Every function nccl.h declares, read from the header itself, resolves in the shim, and the
// pnccl name is the same function as the nccl one.
TEST(NcclShim, ExportsEveryFunctionOfTheHeaderUnderBothNames) {
  std::ifstream header(RIDGE_NCCL_HEADER);
  ASSERT_TRUE(header.good()) << RIDGE_NCCL_HEADER;
  const std::regex decl(R"(^\s*(?:ncclResult_t|const char\s*\*)\s+(p?nccl\w+)\s*\()");
  std::set<std::string> names;
  for (std::string line; std::getline(header, line);) {
    std::smatch m;
    if (std::regex_search(line, m, decl)) names.insert(m[1]);
  }
  EXPECT_GE(names.size(), 80u) << "the header parse found too few functions";
  void* lib = dlopen(RIDGE_NCCL_LIBRARY, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr) << dlerror();
  for (const std::string& name : names) {
    void* sym = dlsym(lib, name.c_str());
    EXPECT_NE(sym, nullptr) << name << " is not exported";
    if (sym && name[0] == 'p')
      EXPECT_EQ(sym, dlsym(lib, name.c_str() + 1)) << name << " is not " << name.substr(1);
  }
  dlclose(lib);
}

TEST(NcclShim, VersionAndErrorStrings) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, NCCL_VERSION_CODE);
  EXPECT_EQ(ncclGetVersion(nullptr), ncclInvalidArgument);
  std::set<std::string> seen;
  for (int r = 0; r < ncclNumResults; ++r) {
    const char* s = ncclGetErrorString(static_cast<ncclResult_t>(r));
    ASSERT_NE(s, nullptr);
    EXPECT_TRUE(seen.insert(s).second) << "duplicate string for " << r;
  }
  EXPECT_STREQ(ncclGetErrorString(ncclNumResults), "unknown result code");
}

TEST(NcclShim, RefusesByNameWhatRidgeCannotDo) {
  ncclComm_t comm = oneRankComm();
  ASSERT_NE(comm, nullptr) << ncclGetLastError(nullptr);
  float buf[16] = {};
  ncclWindow_t win;
  EXPECT_EQ(ncclCommWindowRegister(comm, buf, sizeof buf, &win, NCCL_WIN_DEFAULT), ncclInvalidUsage);
  EXPECT_TRUE(lastErrorNames("ncclCommWindowRegister", comm)) << ncclGetLastError(comm);
  EXPECT_EQ(ncclCommWindowDeregister(comm, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(lastErrorNames("ncclCommWindowDeregister", comm));
  EXPECT_EQ(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT), ncclInvalidUsage);
  EXPECT_TRUE(lastErrorNames("ncclCommRevoke", comm));
  EXPECT_EQ(ncclAllReduce(buf, buf, 4, ncclFloat8e4m3, ncclSum, comm, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(lastErrorNames("ncclAllReduce", comm));
  ncclUniqueId ids[2];
  ncclComm_t other = nullptr;
  EXPECT_EQ(ncclCommInitRankScalable(&other, 1, 0, 2, ids, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(lastErrorNames("ncclCommInitRankScalable"));
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupSimulateEnd(&sim), ncclInvalidUsage);
  EXPECT_TRUE(lastErrorNames("ncclGroupSimulateEnd"));
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
  // A later error raised by Ridge replaces the shim's text.
  EXPECT_EQ(ncclAllReduce(buf, buf, 4, ncclFloat, ncclSum, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_EQ(std::string(ncclGetLastError(nullptr)).find("ncclGroupSimulateEnd"), std::string::npos);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("comm"), std::string::npos)
      << ncclGetLastError(nullptr);
  // And the communicator still works.
  for (int i = 0; i < 16; ++i) buf[i] = static_cast<float>(i);
  EXPECT_EQ(ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, comm, nullptr), ncclSuccess);
  EXPECT_EQ(buf[15], 15.0f);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// ncclCommInitAll: several ranks of one process, each then driven by a thread of its own.
TEST(NcclShim, InitAllRanksInThreads) {
  constexpr int n = 3;
  ncclComm_t comms[n] = {};
  ASSERT_EQ(ncclCommInitAll(comms, n, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      int me = -1, count = 0, dev = 0;
      std::vector<double> x(100, r + 1.0), y(100, -1);
      if (ncclCommUserRank(comms[r], &me) != ncclSuccess || ncclCommCount(comms[r], &count) != ncclSuccess ||
          ncclCommCuDevice(comms[r], &dev) != ncclSuccess || me != r || count != n) {
        errors[r] = "queries";
        return;
      }
      if (ncclAllReduce(x.data(), y.data(), x.size(), ncclDouble, ncclSum, comms[r], nullptr) != ncclSuccess)
        errors[r] = ncclGetLastError(comms[r]);
      else if (y[99] != 6.0)
        errors[r] = "allreduce gave " + std::to_string(y[99]);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  for (int r = 0; r < n; ++r) EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess);
}

// ncclCommShrink under NCCL's names: three ranks in threads, rank 1 left out (it does not call);
// ranks 0 and 2 become ranks 0 and 1 of the new communicator and allreduce on it. A bad list
// is ncclInvalidArgument naming the problem.
TEST(NcclShim, ShrinkLeavesARankOut) {
  constexpr int n = 3;
  ncclComm_t comms[n] = {};
  ASSERT_EQ(ncclCommInitAll(comms, n, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  int twice[2] = {1, 1};
  ncclComm_t bad = nullptr;
  EXPECT_EQ(ncclCommShrink(comms[0], twice, 2, &bad, nullptr, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
  EXPECT_TRUE(lastErrorNames("twice", comms[0])) << ncclGetLastError(comms[0]);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r : {0, 2}) {
    threads.emplace_back([&, r] {
      int left[1] = {1};
      ncclComm_t small = nullptr;
      if (ncclCommShrink(comms[r], left, 1, &small, nullptr, NCCL_SHRINK_DEFAULT) != ncclSuccess) {
        errors[r] = std::string("shrink: ") + ncclGetLastError(comms[r]);
        return;
      }
      int me = -1, count = 0;
      std::vector<double> x(100, r + 1.0), y(100, -1);
      if (ncclCommUserRank(small, &me) != ncclSuccess || ncclCommCount(small, &count) != ncclSuccess ||
          me != r / 2 || count != 2)
        errors[r] = "queries: rank " + std::to_string(me) + " of " + std::to_string(count);
      else if (ncclAllReduce(x.data(), y.data(), x.size(), ncclDouble, ncclSum, small, nullptr) !=
               ncclSuccess)
        errors[r] = ncclGetLastError(small);
      else if (y[99] != 4.0)
        errors[r] = "allreduce gave " + std::to_string(y[99]);
      ncclCommDestroy(small);
    });
  }
  for (auto& t : threads) t.join();
  for (int r : {0, 2}) EXPECT_EQ(errors[r], "") << "rank " << r;
  for (int r = 0; r < n; ++r) EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess);
}

TEST(NcclShim, ConfigIsCheckedAndNonBlockingInitWorks) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.magic = 0x12345678;
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 1, id, 0, &config), ncclInvalidArgument);
  EXPECT_TRUE(lastErrorNames("config"));
  config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = "shim-nonblocking";
  config.minCTAs = 4;  // a hint for NCCL's kernels: accepted and ignored
  ncclResult_t r = ncclCommInitRankConfig(&comm, 1, id, 0, &config);
  ASSERT_TRUE(r == ncclSuccess || r == ncclInProgress) << ncclGetErrorString(r);
  ncclResult_t state = ncclInProgress;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (state == ncclInProgress && std::chrono::steady_clock::now() < until) {
    ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
    if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(state, ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// Ridge's ridgeTimeout (8) is outside NCCL's codes: an NCCL program must see ncclRemoteError.
TEST(NcclShim, ATimeoutIsARemoteError) {
  setenv("RIDGE_TIMEOUT", "1", 1);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, 2, id, 0, &config);  // rank 1 never comes
  setenv("RIDGE_TIMEOUT", "10", 1);
  ASSERT_TRUE(r == ncclInProgress || r == ncclRemoteError) << ncclGetErrorString(r);
  if (r == ncclInProgress) {
    ncclResult_t state = ncclInProgress;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (state == ncclInProgress && std::chrono::steady_clock::now() < until) {
      ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
      if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(state, ncclRemoteError);
    EXPECT_LT(static_cast<int>(state), static_cast<int>(ncclNumResults));
    ncclCommAbort(comm);
  }
}

// ---- NCCL_* settings: a fresh process per case, since they are mapped when the library loads.

// Runs this binary with `env` added and returns what it prints for RIDGE_ variable `name`.
std::string ridgeSettingInChild(const std::vector<std::string>& env, const char* name,
                                std::string* err = nullptr) {
  int out[2], errPipe[2];
  if (pipe(out) != 0 || pipe(errPipe) != 0) return "pipe failed";
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(errPipe[1], 2);
    close(out[0]);
    close(errPipe[0]);
    for (const char* v : {"RIDGE_SOCKET_IFNAME", "RIDGE_P2P", "RIDGE_DEBUG", "RIDGE_NET", "RIDGE_SHM"})
      unsetenv(v);
    for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
    execl("/proc/self/exe", "nccl_shim_test", "--print-setting", name, static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  close(errPipe[1]);
  auto drain = [](int fd) {
    std::string text;
    char buf[4096];
    for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
    close(fd);
    return text;
  };
  std::string text = drain(out[0]);
  std::string errText = drain(errPipe[0]);
  if (err) *err = errText;
  int status = 0;
  waitpid(pid, &status, 0);
  return text;
}

TEST(NcclShimEnvironment, NcclVariablesSetTheirRidgeSettings) {
  EXPECT_EQ(ridgeSettingInChild({"NCCL_SOCKET_IFNAME=eth7"}, "RIDGE_SOCKET_IFNAME"), "eth7");
  EXPECT_EQ(ridgeSettingInChild({"NCCL_P2P_DISABLE=1"}, "RIDGE_P2P"), "off");
  EXPECT_EQ(ridgeSettingInChild({"NCCL_SHM_DISABLE=1"}, "RIDGE_SHM"), "0");
  EXPECT_EQ(ridgeSettingInChild({"NCCL_DEBUG=info"}, "RIDGE_DEBUG"), "INFO");
  EXPECT_EQ(ridgeSettingInChild({"NCCL_NET=IB"}, "RIDGE_NET"), "verbs");
  EXPECT_EQ(ridgeSettingInChild({"NCCL_IB_DISABLE=1"}, "RIDGE_NET"), "socket");
}

TEST(NcclShimEnvironment, RidgeVariablesWinAndUnknownValuesAreLeftAlone) {
  EXPECT_EQ(ridgeSettingInChild({"NCCL_SOCKET_IFNAME=eth7", "RIDGE_SOCKET_IFNAME=lo"}, "RIDGE_SOCKET_IFNAME"),
            "lo");
  std::string err;
  EXPECT_EQ(ridgeSettingInChild({"NCCL_NET=Carrier-Pigeon"}, "RIDGE_NET", &err), "(unset)");
  EXPECT_NE(err.find("NCCL_NET=Carrier-Pigeon"), std::string::npos) << err;
}

}  // namespace

int main(int argc, char** argv) {
  // Child mode of the environment tests: print one variable as the library left it.
  if (argc == 3 && std::strcmp(argv[1], "--print-setting") == 0) {
    const char* v = std::getenv(argv[2]);
    std::fputs(v ? v : "(unset)", stdout);
    return 0;
  }
  setenv("RIDGE_SOCKET_IFNAME", "lo", 1);
  setenv("RIDGE_TIMEOUT", "10", 1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
