// "Hosts" on one machine for multi-host tests: a set of network namespaces joined by a
// bridge, and a launcher that runs forked ranks inside them.
//
// Ridge decides that two ranks share a host from hostHash(), which includes the IPC
// namespace. Each namespace of a Fabric therefore also gets an IPC namespace of its own
// (held open by a small holder process), and every rank placed in namespace i joins both:
// ranks in one namespace are one host (shared memory between them), ranks in different
// namespaces are different hosts and must use a network transport.
//
// Layout of a fabric with M namespaces (names carry the creating pid, so parallel test
// processes never collide and stale fabrics of dead processes can be swept):
//
//   rdgt<pid>h   hub namespace: bridge br0, veth ends p0..p(M-1) attached to it
//   rdgt<pid>n<i> member i: veth end "rdg0" with 10.231.1.(i+1)/24, and lo
//
// Nothing is attached to the initial namespace, so traffic can only flow between the
// members. Everything is removed by destroy() (also run by the destructor, at exit and on
// SIGINT/SIGTERM/SIGHUP); create() first removes fabrics left behind by dead processes.
//
// Typical use (GoogleTest):
//
//   NETNS_SKIP_WITHOUT_PRIVILEGE();
//   netns::Fabric fabric;
//   ASSERT_TRUE(fabric.create(2, &err)) << err;
//   LaunchResult res = fabric.launch(4, netns::blockPlacement(4, 2), {{"RIDGE_TIMEOUT", "20"}}, 60,
//                                    [&](int rank, Reporter& rep) {
//                                      ridgeComm_t comm = netns::initFromEnv(rank, rep);
//                                      ...
//                                    });
//   reportChildFailures(res, "what");
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "rank_launcher.h"

namespace ridgetest {
namespace netns {

// Empty when this process can create network namespaces (CAP_NET_ADMIN and CAP_SYS_ADMIN,
// the `ip` tool); otherwise why not.
std::string missingPrivilege();

// In a test body: skips the test, saying why, unless missingPrivilege() is empty.
#define NETNS_SKIP_WITHOUT_PRIVILEGE()                                                  \
  do {                                                                                  \
    const std::string why_ = ::ridgetest::netns::missingPrivilege();                    \
    if (!why_.empty()) GTEST_SKIP() << "skipped: needs CAP_NET_ADMIN (" << why_ << ")"; \
  } while (0)

// Rank r goes to namespace r * namespaces / nranks: consecutive ranks share a host.
std::vector<int> blockPlacement(int nranks, int namespaces);

// Environment for a rank: name, value.
using EnvList = std::vector<std::pair<std::string, std::string>>;

class Fabric {
 public:
  // Interface name inside every member namespace (for RIDGE_SOCKET_IFNAME=<name>).
  static constexpr const char* kIfName = "rdg0";
  // Port rank 0 listens on for the rendezvous (private to the namespace: never in use).
  static constexpr int kRootPort = 29500;

  Fabric() = default;
  ~Fabric() { destroy(); }
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  // Creates `count` (1..8) member namespaces. False with *err set on failure (whatever
  // was created is removed again). Bounded: each `ip` call gets 10 s.
  bool create(int count, std::string* err);
  // Removes the namespaces and stops the IPC holders. Safe to call twice.
  void destroy();

  int count() const { return static_cast<int>(members_.size()); }
  const std::string& name(int i) const { return members_[i]; }
  // IPv4 address of member i, without prefix length.
  std::string address(int i) const;

  // In a child process: joins member i's network and IPC namespaces.
  bool enter(int i, std::string* err) const;

  // Forks nranks ranks (rank_launcher.h semantics: pipe protocol, deadline, exit
  // statuses). Rank r joins namespace nsOfRank[r], gets RIDGE_RANK, RIDGE_WORLD_SIZE,
  // RIDGE_ROOT_ADDR (rank 0's member address and kRootPort) and
  // RIDGE_SOCKET_IFNAME=<kIfName>, then `env` (which may override them), then runs body.
  LaunchResult launch(int nranks, const std::vector<int>& nsOfRank, const EnvList& env, double timeoutSec,
                      const RankBody& body, const LineHook& hook = nullptr) const;

 private:
  std::string prefix_;
  std::string hub_;
  std::vector<std::string> members_;
  std::vector<pid_t> ipcHolders_;
  int holderPipe_ = -1;  // holders exit when this closes
  int sweepSlot_ = -1;
};

// Removes fabrics (namespaces named rdgt<pid>...) whose creating process is gone.
void sweepStale();

// Child side: ridgeCommInitFromEnv, reporting a failure through `rep` (nullptr then).
ridgeComm_t initFromEnv(int rank, Reporter& rep);

}  // namespace netns
}  // namespace ridgetest
