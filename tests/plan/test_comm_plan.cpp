// A communicator's plan: device communicators (RIDGE_DEVICE=emulated, one emulated GPU per
// rank placed by RIDGE_TOPO_FILE) plan with the planner and dump exactly what ridge-topo
// plan --json prints for the same file; plan files are validated and a bad one fails init.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "coll/algo_select.h"
#include "coll/comm.h"
#include "core/json.h"
#include "device/emulated_runtime.h"
#include "plan/plan_io.h"
#include "rank_launcher.h"
#include "ridge/ridge_emulated.h"
#include "tools/topo_commands.h"
#include "topo/load.h"

namespace ridge {
namespace {

using ridgetest::LaunchResult;
using ridgetest::Reporter;

const std::string kDataDir = RIDGE_PLAN_TEST_DATA;  // tests/topo/data, tests/plan/data

std::string readAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// What `ridge-topo --input FILE plan -n N --json` prints (the tool's own code, in process).
std::string ridgeTopoPlanJson(const std::string& file, int n) {
  topo::Topology t;
  Status s = topo::loadTopologyFile(file, &t);
  EXPECT_TRUE(s.isOk()) << s.message();
  const std::string out = ::testing::TempDir() + "ridge-topo-plan.json";
  std::remove(out.c_str());
  tools::CommonOptions common;
  common.outputPath = out;
  EXPECT_EQ(tools::runPlanCommand(t, common, {"-n", std::to_string(n), "--json"}), 0);
  return readAll(out);
}

// Every variable the tests here set, cleared so that one test's settings do not leak.
void clearPlanEnv() {
  for (const char* v : {"RIDGE_DEVICE", "RIDGE_TOPO_FILE", "RIDGE_PLAN_DUMP", "RIDGE_PLAN_FILE", "RIDGE_P2P",
                        "RIDGE_LL", "RIDGE_ALGO"})
    unsetenv(v);
}

// Emulated devices placed by `file`, the plan dumped to `dump`; P2P and LL off, so that the
// device collectives take the staged path, which runs the ring algorithms over the plan's
// ring (P2P and LL are all-pairs).
void setDeviceEnv(const std::string& file, const std::string& dump) {
  clearPlanEnv();
  std::remove(dump.c_str());
  setenv("RIDGE_DEVICE", "emulated", 1);
  if (!file.empty()) setenv("RIDGE_TOPO_FILE", file.c_str(), 1);
  setenv("RIDGE_PLAN_DUMP", dump.c_str(), 1);
  setenv("RIDGE_P2P", "off", 1);
  setenv("RIDGE_LL", "off", 1);
}

// The ranks of a dump's first channel (a ring).
std::vector<int> firstRing(const json::Value& doc) {
  std::vector<int> ring;
  const json::Value& c = doc.get("channels")->items().front();
  EXPECT_EQ(c.get("kind")->asString(), "ring");
  for (const json::Value& r : c.get("ranks")->items()) ring.push_back(static_cast<int>(r.asNumber()));
  return ring;
}

// One device allreduce of `count` floats on emulated device memory, checked against the sum
// computed in double (rank r contributes (r + 1) * (i % 5 + 1) at element i); the output is
// poisoned first.
bool deviceAllReduceIsRight(ridgeComm_t comm, int me, int n, size_t count, Reporter& rep) {
  void *in = nullptr, *out = nullptr;
  ridgeStream_t stream = nullptr;
  if (ridgeMemAlloc(&in, count * 4) != ridgeSuccess || ridgeMemAlloc(&out, count * 4) != ridgeSuccess ||
      ridgeEmulatedStreamCreate(&stream) != ridgeSuccess) {
    rep.fail("alloc", ridgeGetLastError(nullptr));
    return false;
  }
  std::vector<float> host(count), poison(count, -12345.0f);
  for (size_t i = 0; i < count; ++i) host[i] = static_cast<float>((me + 1) * static_cast<int>(i % 5 + 1));
  bool ok = ridgeEmulatedMemcpy(in, host.data(), count * 4) == ridgeSuccess &&
            ridgeEmulatedMemcpy(out, poison.data(), count * 4) == ridgeSuccess;
  const ridgeResult_t r = ridgeAllReduce(in, out, count, ridgeFloat, ridgeSum, comm, stream);
  if (r != ridgeSuccess) rep.fail("allreduce", ridgetest::describeResult(r, comm));
  ok = ok && r == ridgeSuccess && ridgeEmulatedStreamSynchronize(stream) == ridgeSuccess &&
       ridgeEmulatedMemcpy(host.data(), out, count * 4) == ridgeSuccess;
  const double ranksSum = n * (n + 1) / 2.0;
  for (size_t i = 0; ok && i < count; ++i) {
    const double want = ranksSum * static_cast<double>(i % 5 + 1);
    if (static_cast<double>(host[i]) != want) {
      rep.fail("allreduce", "element " + std::to_string(i) + " is " + std::to_string(host[i]) +
                                ", expected " + std::to_string(want));
      ok = false;
    }
  }
  (void)ridgeEmulatedStreamDestroy(stream);
  (void)ridgeMemFree(in);
  (void)ridgeMemFree(out);
  return ok;
}

std::string ringText(const std::vector<int>& ring) {
  std::string s;
  for (int r : ring) s += (s.empty() ? "" : " ") + std::to_string(r);
  return s;
}

// Forks n ranks; rank r makes emulated device gpuOfRank[r] current, initializes, runs device
// allreduces, and reports its ring order ("RING ...") and ring runs. Returns each rank's ring.
std::vector<std::string> runDeviceRanks(int n, const std::vector<int>& gpuOfRank, size_t count) {
  ridgetest::setLoopbackEnv();
  ridgeUniqueId id;
  if (!ridgetest::makeUniqueId(&id)) return {};
  std::vector<std::string> rings(static_cast<size_t>(n));
  LaunchResult res = ridgetest::launchRanks(
      n, 120,
      [&](int me, Reporter& rep) {
        if (ridgeEmulatedSetDevice(gpuOfRank[static_cast<size_t>(me)]) != ridgeSuccess) {
          rep.fail("device", ridgeGetLastError(nullptr));
          return 2;
        }
        ridgeComm_t comm = ridgetest::initRank(n, id, me, rep);
        if (!comm) return 2;
        bool ok = deviceAllReduceIsRight(comm, me, n, count, rep);
        ok = ok && deviceAllReduceIsRight(comm, me, n, 7, rep);
        rep.line("RING " + ringText(comm->ringOrder) + " runs " +
                 std::to_string(comm->algoRuns[static_cast<int>(Algo::Ring)]));
        if (ridgeCommDestroy(comm) != ridgeSuccess) rep.fail("destroy", ridgeGetLastError(nullptr));
        return ok ? 0 : 1;
      },
      [&](int rank, const std::string& line, double, ridgetest::LaunchControl&) {
        if (line.rfind("RING ", 0) == 0) rings[static_cast<size_t>(rank)] = line.substr(5);
      });
  ridgetest::reportChildFailures(res, "device ranks");
  return rings;
}

// The dump of emulated-device ranks on a project topology file is, byte for byte, what
// ridge-topo plan --json prints for that file and rank count; the ranks run the dump's first
// ring and their allreduces are right.
TEST(DevicePlan, DumpEqualsRidgeTopoPlanJsonAndItsRingRuns) {
  for (const char* name : {"topo/data/hwloc-v2-nvlink-nvswitch.xml", "topo/data/hwloc-v2-nvlink-pairs.xml",
                           "plan/data/dgx-h100-nccl.xml"}) {
    SCOPED_TRACE(name);
    const std::string file = kDataDir + name;
    const int n = 4;
    const std::string dump = ::testing::TempDir() + "ridge-device-plan.json";
    setDeviceEnv(file, dump);
    setenv("RIDGE_ALGO", "allreduce:0-:ring", 1);
    const std::vector<std::string> rings = runDeviceRanks(n, {0, 1, 2, 3}, 300001);
    clearPlanEnv();
    const std::string dumped = readAll(dump), expected = ridgeTopoPlanJson(file, n);
    ASSERT_FALSE(dumped.empty()) << "no RIDGE_PLAN_DUMP written";
    EXPECT_EQ(dumped, expected);
    json::Value doc;
    ASSERT_TRUE(json::parse(dumped, dump, &doc).isOk());
    const std::vector<int> planned = firstRing(doc);
    for (const std::string& ran : rings) {
      EXPECT_EQ(ran.substr(0, ran.find(" runs")), ringText(planned)) << "a rank does not run the plan's ring";
      EXPECT_NE(ran.substr(ran.find(" runs ") + 6), "0") << "no ring ran: " << ran;
    }
  }
}

// Ranks on GPUs out of index order: the plan is over the GPUs the ranks serve (found by bus
// id), so its devices list them in rank order and the ring joins NVLink neighbours, which
// rank order would not.
TEST(DevicePlan, RanksOnPermutedGpusArePlacedByBusId) {
  const std::string file = kDataDir + "topo/data/hwloc-v2-nvlink-pairs.xml";
  const std::string dump = ::testing::TempDir() + "ridge-device-plan-permuted.json";
  setDeviceEnv(file, dump);
  const std::vector<int> gpuOfRank = {2, 0, 3, 1};
  const std::vector<std::string> rings = runDeviceRanks(4, gpuOfRank, 1000);
  clearPlanEnv();
  json::Value doc;
  Status s = json::parseFile(dump, &doc);
  ASSERT_TRUE(s.isOk()) << s.message();
  std::vector<std::string> devices;
  for (const json::Value& d : doc.get("node")->get("devices")->items()) devices.push_back(d.asString());
  EXPECT_EQ(devices, (std::vector<std::string>{"GPU2", "GPU0", "GPU3", "GPU1"}));
  // Every hop of channel 0 is NVLink: the planner joined the ranks' GPUs by their links.
  for (const json::Value& hop : doc.get("node")->get("channels")->items().front().get("hops")->items())
    EXPECT_EQ(hop.get("transport")->asString(), "nvlink") << json::write(hop);
  const std::vector<int> planned = firstRing(doc);
  EXPECT_NE(planned, (std::vector<int>{0, 1, 2, 3})) << "rank order would cross PCIe here";
  for (const std::string& ran : rings) EXPECT_EQ(ran.substr(0, ran.find(" runs")), ringText(planned));
}

// Without bus ids (no topology file) a device communicator keeps the host plan: its dump is
// the host form (placements), and its collectives are right.
TEST(DevicePlan, NoTopologyFileKeepsTheHostPlan) {
  const std::string dump = ::testing::TempDir() + "ridge-device-plan-host.json";
  setDeviceEnv("", dump);
  runDeviceRanks(2, {0, 1}, 1000);
  clearPlanEnv();
  json::Value doc;
  Status s = json::parseFile(dump, &doc);
  ASSERT_TRUE(s.isOk()) << s.message();
  EXPECT_NE(doc.get("placements"), nullptr);
  EXPECT_EQ(doc.get("node"), nullptr);
}

// Init on every rank fails with `code`, and ridgeGetLastError names `needle` (and what
// `alsoNamed` gives for the rank); `before` (if any) runs in each rank's process first.
void expectInitFails(int n, ridgeResult_t code, const std::string& needle,
                     const std::function<void(int rank)>& before = nullptr,
                     const std::function<std::string(int rank)>& alsoNamed = nullptr) {
  ridgetest::setLoopbackEnv();
  ridgeUniqueId id;
  ASSERT_TRUE(ridgetest::makeUniqueId(&id));
  LaunchResult res = ridgetest::launchRanks(n, 60, [&](int me, Reporter& rep) {
    if (before) before(me);
    ridgeComm_t comm = nullptr;
    const ridgeResult_t r = ridgeCommInitRank(&comm, n, id, me);
    const std::string why = ridgeGetLastError(nullptr);
    if (r != code)
      rep.fail("init",
               "returned " + ridgetest::describeResult(r) + ", expected " + ridgetest::resultName(code));
    for (const std::string& n : {needle, alsoNamed ? alsoNamed(me) : needle})
      if (why.find(n) == std::string::npos) rep.fail("init", "the error does not name '" + n + "': " + why);
    if (r == ridgeSuccess) ridgeCommDestroy(comm);
    return rep.failures() ? 1 : 0;
  });
  ridgetest::reportChildFailures(res, "init with " + needle);
}

TEST(DevicePlan, BadDeviceSettingOrTopologyFileFailsInit) {
  clearPlanEnv();
  setenv("RIDGE_DEVICE", "bogus", 1);
  expectInitFails(2, ridgeInvalidArgument, "RIDGE_DEVICE=bogus");
  setenv("RIDGE_DEVICE", "emulated", 1);
  setenv("RIDGE_TOPO_FILE", (::testing::TempDir() + "no-such-topology.xml").c_str(), 1);
  expectInitFails(2, ridgeInvalidArgument, "RIDGE_TOPO_FILE");
  // Only rank 2's host lacks the file: every rank fails, the others naming rank 2.
  const std::string good = kDataDir + "topo/data/hwloc-v2-nvlink-nvswitch.xml";
  const std::string missing = ::testing::TempDir() + "no-such-topology.xml";
  auto fileOfRank = [&](int me) {
    setenv("RIDGE_TOPO_FILE", (me == 2 ? missing : good).c_str(), 1);
    (void)ridgeEmulatedSetDevice(me);
  };
  expectInitFails(3, ridgeInvalidArgument, "RIDGE_TOPO_FILE", fileOfRank, [&](int me) {
    return me == 2 ? "cannot open topology file " + missing : std::string("rank 2 could not load");
  });
  clearPlanEnv();
}

// ---- ridge/ridge_emulated.h ------------------------------------------------------------

// Every call is refused without RIDGE_DEVICE=emulated, and with it refuses bad arguments by
// name; a round trip through emulated device memory returns what went in.
TEST(EmulatedApi, RefusedWithoutTheSettingAndBadArgumentsNamed) {
  clearPlanEnv();
  LaunchResult res = ridgetest::launchRanks(1, 60, [&](int, Reporter& rep) {
    auto expect = [&](const char* what, ridgeResult_t got, ridgeResult_t want, const std::string& needle) {
      const std::string why = ridgeGetLastError(nullptr);
      if (got != want) rep.fail(what, "returned " + ridgetest::describeResult(got));
      if (why.find(needle) == std::string::npos)
        rep.fail(what, "error does not name '" + needle + "': " + why);
    };
    int word = 7;
    ridgeStream_t s = nullptr;
    if (ridgeEmulatedDeviceCount() != 0) rep.fail("count", "emulated devices without RIDGE_DEVICE=emulated");
    const std::string off = "RIDGE_DEVICE is not emulated";
    expect("set device", ridgeEmulatedSetDevice(0), ridgeInvalidUsage, off);
    expect("memcpy", ridgeEmulatedMemcpy(&word, &word, 4), ridgeInvalidUsage, off);
    expect("stream create", ridgeEmulatedStreamCreate(&s), ridgeInvalidUsage, off);
    expect("stream sync", ridgeEmulatedStreamSynchronize(nullptr), ridgeInvalidUsage, off);
    setenv("RIDGE_DEVICE", "emulated", 1);
    if (ridgeEmulatedDeviceCount() != 8) rep.fail("count", "not 8 emulated devices without a topology file");
    expect("set device 8", ridgeEmulatedSetDevice(8), ridgeInvalidArgument, "device 8 out of range");
    expect("memcpy NULL", ridgeEmulatedMemcpy(nullptr, &word, 4), ridgeInvalidArgument, "dst or src is NULL");
    expect("stream create NULL", ridgeEmulatedStreamCreate(nullptr), ridgeInvalidArgument, "stream is NULL");
    expect("stream destroy NULL", ridgeEmulatedStreamDestroy(nullptr), ridgeInvalidArgument,
           "stream is NULL");
    void* dev = nullptr;
    int back = 0;
    if (ridgeEmulatedSetDevice(3) != ridgeSuccess || ridgeMemAlloc(&dev, 4) != ridgeSuccess ||
        ridgeEmulatedMemcpy(dev, &word, 4) != ridgeSuccess ||
        ridgeEmulatedMemcpy(&back, dev, 4) != ridgeSuccess)
      rep.fail("round trip", ridgeGetLastError(nullptr));
    if (back != 7) rep.fail("round trip", "read back " + std::to_string(back));
    if (dev) (void)ridgeMemFree(dev);
    return rep.failures() ? 1 : 0;
  });
  ridgetest::reportChildFailures(res, "emulated API");
  clearPlanEnv();
}

// The emulated runtime of RIDGE_DEVICE=emulated opens another process's device memory (ranks
// that are processes, as ridge-bench -np forks them): the opener sees and writes the exporter's
// bytes; a handle of a freed allocation is refused; a runtime without the flag refuses as
// before (the tests of one runtime per process rely on it).
TEST(EmulatedApi, IpcAcrossProcessesOpensTheExportersMemory) {
  device::EmulatedRuntime rt(1);
  rt.setIpcAcrossProcesses(true);
  void* dev = nullptr;
  ASSERT_TRUE(rt.allocDeviceOn(4096, &dev, 0, false).isOk());
  const uint32_t mark = 0x5eed1234u;
  ASSERT_TRUE(rt.copyToDevice(dev, &mark, sizeof mark).isOk());
  device::DeviceRuntime::IpcHandle handle;
  ASSERT_TRUE(rt.ipcExport(dev, &handle).isOk());
  // Child: 0 = saw the mark and wrote its own; 1 = the open failed; 2 = wrong bytes.
  auto inChild = [&](bool acrossProcesses, bool write) {
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
      device::EmulatedRuntime other(1);
      other.setIpcAcrossProcesses(acrossProcesses);
      void* view = nullptr;
      if (!other.ipcOpen(handle, &view).isOk()) _exit(1);
      uint32_t seen = 0;
      if (!other.copyToHost(&seen, view, sizeof seen).isOk() || seen != mark) _exit(2);
      const uint32_t reply = ~mark;
      if (write && !other.copyToDevice(view, &reply, sizeof reply).isOk()) _exit(2);
      _exit(other.ipcClose(view).isOk() ? 0 : 2);
    }
    int status = -1;
    EXPECT_EQ(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  EXPECT_EQ(inChild(true, true), 0);
  uint32_t now = 0;
  ASSERT_TRUE(rt.copyToHost(&now, dev, sizeof now).isOk());
  EXPECT_EQ(now, ~mark) << "the other process's write did not land in the exporter's memory";
  ASSERT_TRUE(rt.copyToDevice(dev, &mark, sizeof mark).isOk());
  EXPECT_EQ(inChild(false, false), 1) << "opened across processes without setIpcAcrossProcesses";
  rt.freeDevice(dev);
  // The fd number may be reused by the next allocation: the inode tells them apart.
  void* again = nullptr;
  ASSERT_TRUE(rt.allocDeviceOn(4096, &again, 0, false).isOk());
  EXPECT_EQ(inChild(true, false), 1) << "a freed allocation's handle opened";
  rt.freeDevice(again);
}

// ---- plan files -------------------------------------------------------------------------

Status parseText(const std::string& text, int nranks, plan::ForcedPlan* fp = nullptr) {
  json::Value doc;
  Status s = json::parse(text, "plan.json", &doc);
  if (!s.isOk()) return s;
  plan::ForcedPlan scratch;
  return plan::parsePlanJson(doc, "plan.json", nranks, fp ? fp : &scratch);
}

TEST(PlanFileValidation, EachProblemIsRefusedByName) {
  const std::string head = R"("format": "ridge-plan", "version": 1, )";
  plan::ForcedPlan fp;
  Status good = parseText("{" + head + R"("channels": [{"kind": "ring", "ranks": [2, 0, 1]}]})", 3, &fp);
  ASSERT_TRUE(good.isOk()) << good.message();
  EXPECT_EQ(fp.rings.front(), (std::vector<int>{2, 0, 1}));
  const std::string ring = R"("channels": [{"kind": "ring", "ranks": [0, 1, 2]}])";
  struct Case {
    std::string text, needle;
  };
  const Case cases[] = {
      {R"({"version": 1, )" + ring + "}", "\"format\" must be \"ridge-plan\" (missing)"},
      {R"({"format": "nccl-graph", "version": 1, )" + ring + "}", "not \"nccl-graph\""},
      {R"({"format": "ridge-plan", )" + ring + "}", "version (missing) is not supported"},
      {R"({"format": "ridge-plan", "version": 2, )" + ring + "}", "version 2 is not supported"},
      {"{" + head + R"("channels": []})", "no ring channel"},
      {"{" + head + R"("channels": [{"kind": "tree", "root": 0}]})", "no ring channel"},
      {"{" + head + R"("algoRules": "allreduce:0-:ring"})", "'channels' must be an array"},
      {"{" + head + R"("channels": [{"ranks": [0, 1, 2]}]})", "needs a 'kind'"},
      {"{" + head + R"("channels": [{"kind": "ring"}]})", "needs 'ranks'"},
      {"{" + head + R"("channels": [{"kind": "ring", "ranks": [0, 1, 1]}]})", "rank 1 appears twice"},
      {"{" + head + R"("channels": [{"kind": "ring", "ranks": [0, 2]}]})", "rank 1 is missing"},
      {"{" + head + R"("channels": [{"kind": "ring", "ranks": [0, 1, 3]}]})",
       "ranks of this communicator, 0 to 2"},
      {"{" + head + R"("channels": [{"kind": "ring", "ranks": [0, 1, "2"]}]})", "0 to 2"},
      {"{" + head + R"("nranks": 4, )" + ring + "}", "the plan is for 4 ranks"},
      {"{" + head + R"("algoRules": "allreduce:zero-:ring", )" + ring + "}", "malformed 'algoRules'"},
      {R"([0, 1, 2])", "a plan file is a JSON object"},
  };
  for (const Case& c : cases) {
    Status s = parseText(c.text, 3);
    EXPECT_FALSE(s.isOk()) << c.text;
    EXPECT_EQ(s.code(), ridgeInvalidArgument) << c.text;
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << c.text << "\n  message: " << s.message();
    EXPECT_NE(s.message().find("plan.json"), std::string::npos)
        << "the message names the file: " << s.message();
  }
}

TEST(PlanFileValidation, ABadPlanFileFailsInitNamingTheProblem) {
  const std::string file = ::testing::TempDir() + "ridge-bad-plan.json";
  clearPlanEnv();
  setenv("RIDGE_PLAN_FILE", file.c_str(), 1);
  std::ofstream(file)
      << R"({"format": "ridge-plan", "version": 7, "channels": [{"kind": "ring", "ranks": [1, 0]}]})";
  expectInitFails(2, ridgeInvalidArgument, "RIDGE_PLAN_FILE: " + file);
  expectInitFails(2, ridgeInvalidArgument, "version 7 is not supported");
  std::ofstream(file)
      << R"({"format": "ridge-plan", "version": 1, "channels": [{"kind": "ring", "ranks": [1, 1]}]})";
  expectInitFails(2, ridgeInvalidArgument, "rank 1 appears twice");
  std::ofstream(file)
      << R"({"format": "ridge-plan", "version": 1, "algoRules": "allreduce:0-:ring", "channels": []})";
  expectInitFails(2, ridgeInvalidArgument, "no ring channel");
  clearPlanEnv();
}

// A dump read back as a plan file is accepted: what RIDGE_PLAN_DUMP writes, RIDGE_PLAN_FILE
// takes (the device form from ridge-topo, with trees and node details).
TEST(PlanFileValidation, RidgeTopoPlanJsonIsAValidPlanFile) {
  const std::string text = ridgeTopoPlanJson(kDataDir + "plan/data/dgx-h100-nccl.xml", 8);
  plan::ForcedPlan fp;
  Status s = parseText(text, 8, &fp);
  ASSERT_TRUE(s.isOk()) << s.message();
  EXPECT_FALSE(fp.rings.empty());
}

}  // namespace
}  // namespace ridge
