// Chaos: input "files" that are not regular files. ridge-topo --input with a FIFO, a
// character device, a socket, and the topology loader with each of them plus a directory,
// are refused at once with one line, never blocked on (opening a FIFO for reading blocks
// until a writer comes; here none ever does).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "chaos_record.h"
#include "topo/load.h"

namespace {

using ridge::chaos::Outcome;

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/ridge-chaos-files-XXXXXX";
    const char* p = mkdtemp(tmpl);
    path = p ? p : "";
  }
  ~TempDir() {
    if (path.empty()) return;
    for (const char* name : {"fifo", "sock"}) unlink((path + "/" + name).c_str());
    rmdir(path.c_str());
  }
};

// Runs `argv` with stdout+stderr captured, killing it after `limitSec`. Returns the exit
// status (-1 when it had to be killed) and the output.
int runBounded(const std::vector<std::string>& args, double limitSec, std::string* output) {
  int p[2];
  if (pipe(p) != 0) return -2;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(p[1], 1);
    dup2(p[1], 2);
    close(p[0]);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(p[1]);
  const auto giveUp = std::chrono::steady_clock::now() + std::chrono::duration<double>(limitSec);
  int status = 0;
  bool killed = false;
  char buf[4096];
  for (;;) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (std::chrono::steady_clock::now() >= giveUp && !killed) {
      kill(pid, SIGKILL);
      killed = true;
    }
    usleep(10000);
  }
  ssize_t n;
  while ((n = read(p[0], buf, sizeof buf)) > 0) output->append(buf, static_cast<size_t>(n));
  close(p[0]);
  if (killed) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Files, LoaderRefusesWhatIsNotARegularFile) {
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  const std::string fifo = dir.path + "/fifo", sock = dir.path + "/sock";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", sock.c_str());
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  long wrong = 0;
  for (const std::string& path : {fifo, sock, std::string("/dev/null"), dir.path}) {
    const auto start = std::chrono::steady_clock::now();
    ridge::topo::Topology t;
    ridge::Status st = ridge::topo::loadTopologyFile(path, &t);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(st.code(), ridgeInvalidArgument) << path << ": " << st.message();
    EXPECT_NE(st.message().find("not a topology file"), std::string::npos) << st.message();
    EXPECT_LT(secs, 1.0) << path;
    if (st.isOk() || secs >= 1.0) ++wrong;
  }
  close(s);
  ridge::chaos::record("files", "topology loader given a FIFO, a socket, /dev/null and a directory",
                       Outcome::kCleanError, wrong);
}

TEST(Files, RidgeTopoRefusesAFifoInOneLine) {
#ifndef RIDGE_TOPO_TOOL
  GTEST_SKIP() << "ridge-topo is not built";
#else
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  const std::string fifo = dir.path + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  long wrong = 0;
  for (const std::string& input : {fifo, std::string("/dev/zero")}) {
    for (const char* cmd : {"tree", "summary"}) {
      std::string out;
      const int rc = runBounded({RIDGE_TOPO_TOOL, cmd, "--input", input}, 10.0, &out);
      EXPECT_EQ(rc, 2) << cmd << " --input " << input << ": " << out;
      size_t lines = 0;
      for (char c : out) lines += c == '\n';
      EXPECT_EQ(lines, 1u) << out;
      EXPECT_NE(out.find("not a topology file"), std::string::npos) << out;
      if (rc != 2 || lines != 1) ++wrong;
    }
  }
  ridge::chaos::record("files", "ridge-topo tree/summary --input a FIFO and /dev/zero", Outcome::kCleanError,
                       wrong);
#endif
}

}  // namespace
