// The namespace helper itself: ranks land in the namespaces asked for, ranks of one
// namespace share a host identity (IPC namespace) and others do not, TCP works between
// the members and nothing is left behind.
#include "netns_helper.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <set>

namespace ridgetest {
namespace {

std::string nsLink(const char* which) {
  char buf[128];
  ssize_t n = readlink((std::string("/proc/self/ns/") + which).c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "?";
}

int namespacesWithPrefix(const std::string& prefix) {
  DIR* d = opendir("/run/netns");
  if (!d) return 0;
  int n = 0;
  while (dirent* e = readdir(d)) n += std::string(e->d_name).rfind(prefix, 0) == 0 ? 1 : 0;
  closedir(d);
  return n;
}

TEST(NetnsHelper, PlacesRanksAndCleansUp) {
  NETNS_SKIP_WITHOUT_PRIVILEGE();
  const std::string mine = "rdgt" + std::to_string(getpid()) + "_";
  {
    netns::Fabric fabric;
    std::string err;
    ASSERT_TRUE(fabric.create(2, &err)) << err;
    EXPECT_EQ(namespacesWithPrefix(mine), 3);  // hub + 2 members
    const std::string rootNet = nsLink("net");
    LaunchResult res = fabric.launch(
        4, netns::blockPlacement(4, 2), {{"RIDGE_TEST_MARK", "x"}}, 30, [&](int rank, Reporter& rep) {
          rep.line("NS " + nsLink("net") + " " + nsLink("ipc"));
          if (std::string(getenv("RIDGE_TEST_MARK")) != "x") rep.fail("env", "RIDGE_TEST_MARK not set");
          if (nsLink("net") == rootNet)
            rep.fail("rank " + std::to_string(rank), "still in the initial netns");
          // Rank 0 and 2 listen; 1 and 3 connect to the other namespace's listener.
          const int port = 31000;
          if (rank % 2 == 0) {
            int s = socket(AF_INET, SOCK_STREAM, 0);
            int one = 1;
            setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            sockaddr_in a{};
            a.sin_family = AF_INET;
            a.sin_port = htons(port);
            inet_pton(AF_INET, fabric.address(rank / 2).c_str(), &a.sin_addr);
            if (bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(s, 4) != 0) {
              rep.fail("listen", strerror(errno));
              return 1;
            }
            timeval tv{10, 0};
            setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            int c = accept(s, nullptr, nullptr);
            char b = 0;
            if (c < 0 || recv(c, &b, 1, MSG_WAITALL) != 1 || b != 'R')
              rep.fail("accept", "no byte from peer");
            close(c);
            close(s);
          } else {
            const int other = 1 - (rank / 2);
            sockaddr_in a{};
            a.sin_family = AF_INET;
            a.sin_port = htons(port);
            inet_pton(AF_INET, fabric.address(other).c_str(), &a.sin_addr);
            bool ok = false;
            for (int t = 0; t < 200 && !ok; ++t) {  // up to ~10 s for the listener
              int s = socket(AF_INET, SOCK_STREAM, 0);
              if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) ok = send(s, "R", 1, 0) == 1;
              close(s);
              if (!ok) usleep(50000);
            }
            if (!ok) rep.fail("connect", "cannot reach " + fabric.address(other));
          }
          return 0;
        });
    reportChildFailures(res, "netns placement");
    std::map<int, std::string> ns;
    for (const RankResult& rr : res.ranks)
      for (const std::string& l : linesWith(rr, "NS ")) ns[rr.rank] = l;
    ASSERT_EQ(ns.size(), 4u);
    EXPECT_EQ(ns[0], ns[1]) << "ranks 0 and 1 share namespace 0 (net and ipc)";
    EXPECT_EQ(ns[2], ns[3]);
    EXPECT_NE(ns[0], ns[2]);
    EXPECT_EQ(ns[0].find(nsLink("ipc")), std::string::npos)
        << "ranks must not share the parent's IPC namespace";
  }
  EXPECT_EQ(namespacesWithPrefix(mine), 0) << "namespaces left behind";
}

TEST(NetnsHelper, SkipsWithoutPrivilegeMessage) {
  // The reason text is what a skipped test prints; it must be empty exactly when tests run.
  std::string why = netns::missingPrivilege();
  if (why.empty()) {
    netns::Fabric f;
    std::string err;
    EXPECT_TRUE(f.create(1, &err)) << err;
  } else {
    EXPECT_NE(why.find("CAP_"), std::string::npos) << why;
  }
}

}  // namespace
}  // namespace ridgetest
