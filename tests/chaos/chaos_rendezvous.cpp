// Chaos: strangers at the rendezvous. Forged hellos (right format, wrong key), garbage,
// truncated and silent connections at the root; silent, garbage and forged connections at a
// rank's own listener; a root whose accept() runs out of descriptors; env-initialized ranks
// with and without the job key. The genuine job must go on (kRecovered) and every stranger
// must be dropped (logged), never fail it. Loopback only; every wait bounded.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/init_stage.h"
#include "bootstrap/socket.h"
#include "bootstrap/wire.h"
#include "chaos_record.h"
#include "rank_launcher.h"
#include "ridge/ridge.h"

namespace ridge {
namespace {

using namespace std::chrono_literals;
using namespace bootstrap_wire;
using chaos::Outcome;
using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Runs fn(rank) on one thread per rank.
std::vector<Status> runRanks(int n, const std::function<Status(int)>& fn) {
  std::vector<Status> st(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { st[r] = fn(r); });
  for (auto& t : threads) t.join();
  return st;
}

// The genuine job: rendezvous, then an all-gather whose every byte is checked. Returns the
// number of wrong bytes through *wrong.
Status genuineJob(const ridgeUniqueId& id, int n, int timeoutSec, long* wrong) {
  std::atomic<long> bad{0};
  auto st = runRanks(n, [&](int r) -> Status {
    std::unique_ptr<Bootstrap> b;
    RIDGE_TRY(Bootstrap::connect(id, r, n, timeoutSec, nullptr, &b));
    std::vector<uint32_t> data(static_cast<size_t>(n) * 4, 0xEEEEEEEEu);
    for (int i = 0; i < 4; ++i) data[static_cast<size_t>(r) * 4 + i] = static_cast<uint32_t>(r * 100 + i);
    RIDGE_TRY(b->allGather(data.data(), 4 * sizeof(uint32_t)));
    for (int q = 0; q < n; ++q)
      for (int i = 0; i < 4; ++i)
        if (data[static_cast<size_t>(q) * 4 + i] != static_cast<uint32_t>(q * 100 + i)) bad.fetch_add(1);
    return b->barrier();
  });
  *wrong = bad.load();
  for (const Status& s : st)
    if (!s.isOk()) return s;
  return Status::ok();
}

Socket connectTo(const SocketAddress& a) {
  Socket s;
  Status st = connectWithRetry(a, Deadline::after(5), "chaos stranger", &s);
  EXPECT_TRUE(st.isOk()) << st.message();
  return s;
}

// Reads the root's challenge on `s` (the root sends it first on every connection).
uint64_t readChallenge(const Socket& s) {
  MsgHeader h{};
  Challenge c{};
  Deadline d = Deadline::after(5);
  EXPECT_TRUE(recvAll(s.fd(), &h, sizeof h, d, "stranger").isOk());
  EXPECT_TRUE(recvAll(s.fd(), &c, sizeof c, d, "stranger").isOk());
  EXPECT_EQ(h.tag, kTagChallenge);
  return c.challenge;
}

// A hello in the right format whose mac is not made with the job's key.
void sendForgedHello(const Socket& s, int rank, int nranks, uint64_t mac) {
  Hello hello{kHelloMagic, kProtocolVersion, mac, rank, nranks, {}};
  SocketAddress fake = SocketAddress::loopback(AF_INET, 9);
  hello.listen.length = fake.length;
  std::memcpy(hello.listen.bytes, &fake.storage, fake.length);
  MsgHeader h{kMsgMagic, kTagHello, sizeof hello};
  Deadline d = Deadline::after(5);
  EXPECT_TRUE(sendAll(s.fd(), &h, sizeof h, d, "forger").isOk());
  EXPECT_TRUE(sendAll(s.fd(), &hello, sizeof hello, d, "forger").isOk());
}

class Rendezvous : public ::testing::Test {
 protected:
  void SetUp() override { setenv("RIDGE_SOCKET_IFNAME", "lo", 1); }
  UniqueIdInfo newJob(ridgeUniqueId* id) {
    EXPECT_TRUE(createUniqueId(id).isOk());
    UniqueIdInfo info;
    EXPECT_TRUE(decodeUniqueId(*id, &info).isOk());
    return info;
  }
};

TEST_F(Rendezvous, ForgedHellosAtTheRootAreDropped) {
  ridgeUniqueId id;
  UniqueIdInfo info = newJob(&id);
  // Forgers claim rank 0 and 1 of the real size, and a conflicting size that would fail the
  // whole job if it were believed; one guesses the secret itself as the mac.
  std::vector<Socket> forgers;
  const int claims[][2] = {{0, 2}, {1, 2}, {0, 3}, {5, 2}};
  uint64_t guess = info.nonce ^ 0x5555;
  for (const auto& c : claims) {
    forgers.push_back(connectTo(info.root));
    readChallenge(forgers.back());
    sendForgedHello(forgers.back(), c[0], c[1], guess++);
  }
  // Each forger gets a refusal (for its own connection only).
  for (Socket& f : forgers) {
    MsgHeader h{};
    ASSERT_TRUE(recvAll(f.fd(), &h, sizeof h, Deadline::after(5), "forger").isOk());
    ReplyHead head{};
    ASSERT_TRUE(recvAll(f.fd(), &head, sizeof head, Deadline::after(5), "forger").isOk());
    EXPECT_EQ(head.code, ridgeInvalidArgument);
    EXPECT_EQ(head.session, 0u) << "a forger was handed the session nonce";
  }
  long wrong = 0;
  const auto start = Clock::now();
  Status s = genuineJob(id, 2, 10, &wrong);
  EXPECT_TRUE(s.isOk()) << s.message();
  EXPECT_LT(secondsSince(start), ridgetest::scaledSeconds(3.0));
  chaos::record("bootstrap", "4 forged hellos at the root (ranks 0, 1, 5 of 2 and 0 of 3, wrong key)",
                s.isOk() ? Outcome::kRecovered : Outcome::kCleanError, wrong);
}

TEST_F(Rendezvous, GarbageAndTruncatedConnectionsAtTheRoot) {
  ridgeUniqueId id;
  UniqueIdInfo info = newJob(&id);
  Deadline d = Deadline::after(5);
  {
    Socket http = connectTo(info.root);
    const char get[] = "GET / HTTP/1.0\r\n\r\n";
    EXPECT_TRUE(sendAll(http.fd(), get, sizeof get, d, "junk").isOk());
    Socket noisy = connectTo(info.root);
    std::vector<unsigned char> noise(4096);
    std::mt19937 rng(19);
    for (auto& b : noise) b = static_cast<unsigned char>(rng());
    EXPECT_TRUE(sendAll(noisy.fd(), noise.data(), noise.size(), d, "junk").isOk());
    Socket huge = connectTo(info.root);
    MsgHeader h{kMsgMagic, kTagHello, 1ull << 40};
    EXPECT_TRUE(sendAll(huge.fd(), &h, sizeof h, d, "junk").isOk());
    Socket truncated = connectTo(info.root);
    MsgHeader t{kMsgMagic, kTagHello, sizeof(Hello)};
    EXPECT_TRUE(sendAll(truncated.fd(), &t, sizeof t, d, "junk").isOk());
    EXPECT_TRUE(sendAll(truncated.fd(), "half", 4, d, "junk").isOk());
    std::this_thread::sleep_for(50ms);  // let the bytes land before the sockets close
  }
  long wrong = 0;
  Status s = genuineJob(id, 3, 10, &wrong);
  EXPECT_TRUE(s.isOk()) << s.message();
  chaos::record("bootstrap", "HTTP request, 4 KiB of noise, a 1 TiB length and a truncated hello at the root",
                s.isOk() ? Outcome::kRecovered : Outcome::kCleanError, wrong);
}

TEST_F(Rendezvous, SilentConnectionsAtTheRootHoldNothingUp) {
  ridgeUniqueId id;
  UniqueIdInfo info = newJob(&id);
  std::vector<Socket> silent;
  for (int i = 0; i < 20; ++i) silent.push_back(connectTo(info.root));
  long wrong = 0;
  const auto start = Clock::now();
  Status s = genuineJob(id, 3, 10, &wrong);
  const double secs = secondsSince(start);
  EXPECT_TRUE(s.isOk()) << s.message();
  // A silent connection has 5 s to say hello; the job must not wait for them.
  EXPECT_LT(secs, ridgetest::scaledSeconds(3.0));
  chaos::record("bootstrap", "20 silent connections at the root before the ranks arrive",
                s.isOk() && secs < 3.0 ? Outcome::kRecovered : Outcome::kCleanError, wrong);
}

TEST_F(Rendezvous, StrangersAtARanksListener) {
  ridgeUniqueId id;
  newJob(&id);
  const int n = 3;
  std::vector<std::unique_ptr<Bootstrap>> bs(n);
  auto st = runRanks(n, [&](int r) { return Bootstrap::connect(id, r, n, 10, nullptr, &bs[r]); });
  for (int r = 0; r < n; ++r) ASSERT_TRUE(st[r].isOk()) << st[r].message();
  const SocketAddress target = bs[1]->peerAddresses()[1];
  Deadline d = Deadline::after(5);
  // Three silent connections (each would have cost 5 s when handshakes were read one at a
  // time), garbage, and forged handshakes: another session's nonce, and the right nonce
  // claiming to come from a rank that does not exist.
  std::vector<Socket> strangers;
  for (int i = 0; i < 3; ++i) strangers.push_back(connectTo(target));
  strangers.push_back(connectTo(target));
  EXPECT_TRUE(sendAll(strangers.back().fd(), "\xde\xad\xbe\xef garbage", 13, d, "junk").isOk());
  for (const auto& [nonce, from] : {std::pair<uint64_t, int>{bs[1]->sessionNonce() ^ 1, 0},
                                     std::pair<uint64_t, int>{bs[1]->sessionNonce(), 7}}) {
    strangers.push_back(connectTo(target));
    Handshake hs{kHandshakeMagic, kKindP2P, nonce, from, 1};
    MsgHeader h{kMsgMagic, kKindP2P, sizeof hs};
    EXPECT_TRUE(sendAll(strangers.back().fd(), &h, sizeof h, d, "forger").isOk());
    EXPECT_TRUE(sendAll(strangers.back().fd(), &hs, sizeof hs, d, "forger").isOk());
    MsgHeader bogus{kMsgMagic, 42, 4};
    EXPECT_TRUE(sendAll(strangers.back().fd(), &bogus, sizeof bogus, d, "forger").isOk());
    EXPECT_TRUE(sendAll(strangers.back().fd(), "evil", 4, d, "forger").isOk());
  }
  // Now the genuine rank 0 opens its direct connection to rank 1 and sends.
  const auto start = Clock::now();
  uint32_t got = 0xEEEEEEEE;
  const uint32_t sent = 0x19191919;
  auto pst = runRanks(2, [&](int r) -> Status {
    if (r == 0) return bs[0]->send(1, 42, &sent, sizeof sent);
    return bs[1]->recv(0, 42, &got, sizeof got);
  });
  const double secs = secondsSince(start);
  for (const Status& s : pst) EXPECT_TRUE(s.isOk()) << s.message();
  EXPECT_EQ(got, sent);
  EXPECT_LT(secs, ridgetest::scaledSeconds(2.0)) << "the listener waited for strangers";
  // The ring still works after the strangers.
  long wrong = got == sent ? 0 : 1;
  auto bst = runRanks(n, [&](int r) { return bs[r]->barrier(); });
  for (const Status& s : bst) EXPECT_TRUE(s.isOk()) << s.message();
  chaos::record("bootstrap",
                "3 silent, 1 garbage and 2 forged handshakes (wrong session nonce; rank 7 of 3) at rank 1's "
                "listener, then a genuine send",
                pst[0].isOk() && pst[1].isOk() && secs < 2.0 ? Outcome::kRecovered : Outcome::kCleanError, wrong);
}

// Three silent connections reach each rank's own listener during init, before the ring
// connection does (opened by the init-stage hook the moment the listener exists). Each
// listener reads all pending connections at once, so init finishes long before even one
// silent connection's 5 s are up; read one at a time, they cost 15 s per rank.
thread_local int tRank = -1;
std::mutex gSilentMutex;
std::vector<Socket>* gSilent = nullptr;

void openSilentConnections(InitStage s, const void* detail) {
  if (s != InitStage::BootstrapListening || !detail || tRank < 0) return;
  const auto* addr = static_cast<const SocketAddress*>(detail);
  for (int i = 0; i < 3; ++i) {
    Socket sock;
    if (!connectWithRetry(*addr, Deadline::after(5), "silent stranger", &sock).isOk()) continue;
    std::lock_guard<std::mutex> lock(gSilentMutex);
    gSilent->push_back(std::move(sock));
  }
}

TEST_F(Rendezvous, SilentConnectionsAtEveryRanksListenerDuringInit) {
  ridgeUniqueId id;
  newJob(&id);
  std::vector<Socket> silent;
  gSilent = &silent;
  setInitStageHook(openSilentConnections);
  const int n = 3;
  long wrong = 0;
  const auto start = Clock::now();
  std::vector<std::unique_ptr<Bootstrap>> bs(n);
  auto st = runRanks(n, [&](int r) {
    tRank = r;
    Status s = Bootstrap::connect(id, r, n, 12, nullptr, &bs[r]);
    tRank = -1;
    return s;
  });
  const double secs = secondsSince(start);
  setInitStageHook(nullptr);
  for (int r = 0; r < n; ++r) EXPECT_TRUE(st[r].isOk()) << st[r].message();
  {
    std::lock_guard<std::mutex> lock(gSilentMutex);
    EXPECT_EQ(silent.size(), 9u);
  }
  EXPECT_LT(secs, ridgetest::scaledSeconds(3.0)) << "init waited for silent connections";
  if (st[0].isOk() && st[1].isOk() && st[2].isOk()) {
    auto bst = runRanks(n, [&](int r) { return bs[r]->barrier(); });
    for (const Status& s : bst) EXPECT_TRUE(s.isOk()) << s.message();
  } else {
    wrong = 1;
  }
  silent.clear();
  gSilent = nullptr;
  chaos::record("bootstrap", "3 silent connections at each rank's own listener during init, before the ring",
                wrong == 0 && secs < 3.0 ? Outcome::kRecovered : Outcome::kCleanError, wrong);
}

TEST_F(Rendezvous, AnotherJobsRankIsRefusedAndTheJobGoesOn) {
  ridgeUniqueId id;
  UniqueIdInfo info = newJob(&id);
  ridgeUniqueId other;
  encodeUniqueId(info.root, info.nonce + 1, &other);
  const auto start = Clock::now();
  std::unique_ptr<Bootstrap> stray;
  Status refused = Bootstrap::connect(other, 0, 2, 10, nullptr, &stray);
  EXPECT_EQ(refused.code(), ridgeInvalidArgument) << refused.message();
  EXPECT_LT(secondsSince(start), ridgetest::scaledSeconds(3.0));
  long wrong = 0;
  Status s = genuineJob(id, 2, 10, &wrong);
  EXPECT_TRUE(s.isOk()) << s.message();
  chaos::record("bootstrap", "a rank with another job's id claims rank 0 first",
                s.isOk() ? Outcome::kRecovered : Outcome::kCleanError, wrong);
}

// The root in a child process with few file descriptors; the test floods it with silent
// connections until accept() fails with EMFILE. The root must back off (little CPU) and
// still serve the genuine ranks.
TEST_F(Rendezvous, RootOutOfDescriptorsBacksOff) {
  int toChild[2], fromChild[2];
  ASSERT_EQ(pipe(toChild), 0);
  ASSERT_EQ(pipe(fromChild), 0);
  const uint64_t secret = randomNonce();
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(toChild[1]);
    close(fromChild[0]);
    const int servicesBefore = activeRootServices();  // the parent's, copied by fork, not running here
    SocketAddress bound;
    if (!startRootServiceOn(SocketAddress::loopback(AF_INET), secret, &bound, 12).isOk()) _exit(3);
    // Few descriptors from here on: the ones open now plus 6.
    int open = 0;
    for (int fd = 0; fd < 1024; ++fd) open += fcntl(fd, F_GETFD) >= 0;
    rlimit lim{static_cast<rlim_t>(open + 6), static_cast<rlim_t>(open + 6)};
    setrlimit(RLIMIT_NOFILE, &lim);
    if (write(fromChild[1], &bound, sizeof bound) != sizeof bound) _exit(4);
    // Wait (bounded) until the root service finished, then report its CPU time.
    for (int i = 0; i < 1500 && activeRootServices() > servicesBefore; ++i) usleep(10000);
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    const double cpu = ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    if (write(fromChild[1], &cpu, sizeof cpu) != sizeof cpu) _exit(5);
    _exit(activeRootServices() == servicesBefore ? 0 : 6);
  }
  close(toChild[0]);
  close(fromChild[1]);
  SocketAddress root;
  ASSERT_EQ(read(fromChild[0], &root, sizeof root), static_cast<ssize_t>(sizeof root));
  const auto start = Clock::now();
  std::vector<Socket> silent;
  for (int i = 0; i < 12; ++i) silent.push_back(connectTo(root));
  std::this_thread::sleep_for(300ms);  // the root is out of descriptors by now
  ridgeUniqueId id;
  encodeUniqueId(root, secret, &id);
  long wrong = 0;
  Status s = genuineJob(id, 2, 10, &wrong);
  EXPECT_TRUE(s.isOk()) << s.message();
  silent.clear();
  double cpu = -1;
  EXPECT_EQ(read(fromChild[0], &cpu, sizeof cpu), static_cast<ssize_t>(sizeof cpu));
  int status = 0;
  waitpid(pid, &status, 0);
  const double wall = secondsSince(start);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  // Spinning on a readable listener would burn a whole core for the whole wait.
  EXPECT_LT(cpu, 0.25 * wall) << "root used " << cpu << " s CPU in " << wall << " s";
  close(toChild[1]);
  close(fromChild[0]);
  chaos::record("bootstrap", "root limited to 6 spare descriptors, 12 silent connections (accept: EMFILE)",
                s.isOk() && cpu < 0.25 * wall ? Outcome::kRecovered : Outcome::kCleanError, wrong);
}

// A rank's own listener out of descriptors: rank 1 runs in a child process limited to 4 spare
// descriptors after the rendezvous; the test floods its listener with 12 silent connections,
// then the genuine rank 0 (here) opens its direct connection and sends. Rank 1's accept()
// fails with EMFILE, drops the oldest silent connection, backs off, and must receive the
// message, using little CPU meanwhile.
TEST_F(Rendezvous, RankListenerOutOfDescriptorsBacksOff) {
  ridgeUniqueId id;
  newJob(&id);
  int ready[2], done[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(done), 0);
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::unique_ptr<Bootstrap> b;
    if (!Bootstrap::connect(id, 1, 2, 10, nullptr, &b).isOk()) _exit(3);
    int open = 0;
    for (int fd = 0; fd < 1024; ++fd) open += fcntl(fd, F_GETFD) >= 0;
    rlimit lim{static_cast<rlim_t>(open + 4), static_cast<rlim_t>(open + 4)};
    setrlimit(RLIMIT_NOFILE, &lim);
    char one = 1;
    if (write(ready[1], &one, 1) != 1) _exit(4);
    uint64_t got = 0;
    Status s = b->recv(0, 7, &got, sizeof got);
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    const double cpu = ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    if (write(done[1], &cpu, sizeof cpu) != sizeof cpu) _exit(5);
    _exit(s.isOk() && got == 0x1919191919191919ull ? 0 : 6);
  }
  std::unique_ptr<Bootstrap> b0;
  ASSERT_TRUE(Bootstrap::connect(id, 0, 2, 10, nullptr, &b0).isOk());
  char one = 0;
  ASSERT_EQ(read(ready[0], &one, 1), 1);
  const auto start = Clock::now();
  std::vector<Socket> silent;
  for (int i = 0; i < 12; ++i) silent.push_back(connectTo(b0->peerAddresses()[1]));
  std::this_thread::sleep_for(300ms);  // rank 1 is not reading its listener yet: the backlog fills
  const uint64_t value = 0x1919191919191919ull;
  Status s = b0->send(1, 7, &value, sizeof value);
  EXPECT_TRUE(s.isOk()) << s.message();
  double cpu = -1;
  EXPECT_EQ(read(done[0], &cpu, sizeof cpu), static_cast<ssize_t>(sizeof cpu));
  int status = 0;
  waitpid(pid, &status, 0);
  const double wall = secondsSince(start);
  const bool received = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  EXPECT_TRUE(received) << "rank 1 exited with status " << status;
  EXPECT_LT(cpu, 0.25 * wall + 0.1) << "rank 1 used " << cpu << " s CPU in " << wall << " s";
  for (int fd : {ready[0], ready[1], done[0], done[1]}) close(fd);
  chaos::record("bootstrap",
                "rank 1 limited to 4 spare descriptors, 12 silent connections at its listener, then a send "
                "(accept: EMFILE)",
                received ? Outcome::kRecovered : Outcome::kCleanError, received ? 0 : 1);
}

// ridgeCommInitFromEnv with RIDGE_JOB_KEY: a rank with the wrong key (claiming a genuine
// rank's place) is refused; the genuine ranks' job completes with a correct allreduce.
TEST_F(Rendezvous, EnvInitWithAJobKeyRefusesAWrongKey) {
  SocketAddress probe;
  Socket ls;
  ASSERT_TRUE(listenOn(SocketAddress::loopback(AF_INET), &ls, &probe).isOk());
  const std::string rootAddr = probe.toString();
  ls.reset();  // a free port for the root (loopback; another process taking it now is unlikely)
  const int n = 3;  // ranks 0 and 1 genuine, "rank 2" the stranger claiming rank 1
  auto res = ridgetest::launchRanks(n, 30, [&](int r, ridgetest::Reporter& rep) -> int {
    setenv("RIDGE_ROOT_ADDR", rootAddr.c_str(), 1);
    setenv("RIDGE_WORLD_SIZE", "2", 1);
    setenv("RIDGE_RANK", r == 2 ? "1" : std::to_string(r).c_str(), 1);
    setenv("RIDGE_JOB_KEY", r == 2 ? "not-the-key" : "chaos-rendezvous-key-7f3a9c", 1);
    setenv("RIDGE_TIMEOUT", "10", 1);
    if (r == 1) usleep(500000);  // the stranger comes first
    ridgeComm_t comm = nullptr;
    ridgeResult_t rc = ridgeCommInitFromEnv(&comm);
    if (r == 2) {
      if (rc != ridgeInvalidArgument) rep.fail("stranger", "init returned " + ridgetest::describeResult(rc));
      rep.line("REFUSED " + std::string(ridgeGetLastError(nullptr)));
      return 0;
    }
    if (rc != ridgeSuccess) {
      rep.fail("rank " + std::to_string(r), ridgetest::describeResult(rc));
      return 1;
    }
    double in[8], out[8];
    for (int i = 0; i < 8; ++i) in[i] = r * 8 + i, out[i] = -1;
    rc = ridgeAllReduce(in, out, 8, ridgeFloat64, ridgeSum, comm, nullptr);
    long bad = rc == ridgeSuccess ? 0 : 8;
    for (int i = 0; i < 8 && rc == ridgeSuccess; ++i)
      if (out[i] != (0 * 8 + i) + (1 * 8 + i)) ++bad;
    rep.line("WRONG " + std::to_string(bad));
    ridgeCommDestroy(comm);
    return bad == 0 ? 0 : 1;
  });
  ridgetest::reportChildFailures(res, "env init with a job key");
  long wrong = 0;
  for (int r = 0; r < 2; ++r)
    for (const std::string& w : ridgetest::linesWith(res.ranks[r], "WRONG ")) wrong += std::stol(w);
  auto refusal = ridgetest::linesWith(res.ranks[2], "REFUSED ");
  ASSERT_EQ(refusal.size(), 1u);
  EXPECT_NE(refusal[0].find("does not authenticate"), std::string::npos) << refusal[0];
  chaos::record("bootstrap", "env init: a rank with the wrong RIDGE_JOB_KEY claims rank 1 before the real one",
                !res.timedOut && wrong == 0 ? Outcome::kRecovered : Outcome::kCleanError, wrong);
}

}  // namespace
}  // namespace ridge
