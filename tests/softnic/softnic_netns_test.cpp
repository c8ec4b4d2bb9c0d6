// softnic between "hosts": ranks in different network namespaces (tests/net/netns_helper.h),
// so the software NICs cannot read each other's memory and every payload crosses the TCP
// connection between the engines, as between machines. With RIDGE_NET=softnic the socket
// transport steps aside, so a run that initialises at all proves that the cross-host
// pairs went through softnic (pairs inside one namespace use shared memory). Skips without
// the privileges to create namespaces.
#include "matrix_cases.h"
#include "netns_helper.h"

namespace ridgetest {
namespace {

void runNetns(int n, int hosts, const char* faults, double budget, const netns::EnvList& extra = {}) {
  std::string why = netns::missingPrivilege();
  if (!why.empty()) GTEST_SKIP() << "skipped: needs CAP_NET_ADMIN (" << why << ")";
  netns::Fabric fabric;
  std::string err;
  ASSERT_TRUE(fabric.create(hosts, &err)) << err;
  netns::EnvList env = {{"RIDGE_TIMEOUT", "30"}, {"RIDGE_NET", "softnic"}, {"RIDGE_SOFTNIC_RTO_US", "3000"}};
  if (faults) env.push_back({"RIDGE_SOFTNIC_FAULTS", faults});
  env.insert(env.end(), extra.begin(), extra.end());
  LaunchResult res =
      fabric.launch(n, netns::blockPlacement(n, hosts), env, budget, [&](int rank, Reporter& rep) {
        ridgeComm_t comm = netns::initFromEnv(rank, rep);
        if (!comm) return 2;
        return matrix::runCases(comm, rank, n, false, rep);
      });
  std::printf("softnic netns n=%d on %d hosts%s: %.1f s\n", n, hosts, faults ? " with faults" : "",
              res.elapsed);
  reportChildFailures(res, "softnic netns n=" + std::to_string(n));
}

TEST(SoftnicNetns, Ranks2OnTwoHosts) {
  runNetns(2, 2, nullptr, 120);
}
TEST(SoftnicNetns, Ranks4OnTwoHostsWithFaults) {
  runNetns(4, 2, "drop=0.01,dup=0.01,reorder=0.01,delay=0.01:200us,seed=9", 150);
}

// Regression: with shared memory inside a host, an RDMA slot unlike shm's made the ranks of
// one host cut messages differently ("peer sent a ...-byte chunk where ... bytes were
// expected"); the net transport now takes shm's slot size beside it.
TEST(SoftnicNetns, Ranks4OnTwoHostsRdmaSlotUnlikeShm) {
  runNetns(4, 2, nullptr, 120, {{"RIDGE_RDMA_SLOT_BYTES", "8K"}});
}

}  // namespace
}  // namespace ridgetest
