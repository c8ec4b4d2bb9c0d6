// ridge-bench: entry point and launch modes.
//
// How the ranks come to be, checked in this order:
//   1. Started by an MPI launcher (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK in the
//      environment): MPI_Init, rank 0 creates the unique id, MPI_Bcast hands it to the rest.
//   2. RIDGE_RANK and RIDGE_WORLD_SIZE set: ridgeCommInitFromEnv (torchrun/Slurm style).
//   3. --peer mpi: run again under mpirun with the same arguments (so that MPI_COMM_WORLD
//      exists to compare against), which lands in case 1.
//   4. Otherwise -np N (default 1): this process creates the unique id (which starts the
//      rendezvous service here), forks N ranks and waits for them.
// --peer gloo works with 2 and 4: each rank also connects a Gloo context through a file
// store (a temporary directory made here for -np; RIDGE_BENCH_GLOO_STORE for 2).
// --peer nccl works with 1, 2 and 4: each rank takes the GPU of its local rank and joins an
// NCCL communicator; with -np the launcher first checks, in a child process, that it can run
// (CUDA build, libnccl.so.2 loadable, a device, a GPU per rank) and otherwise refuses with
// one line saying why.
#include <dirent.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"

#if defined(RIDGE_BENCH_HAVE_MPI)
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace rbench {

namespace {
int gRank = -1;
bool gUnderMpi = false;
GdrSetup gGdr;  // decided in main() before the ranks start; every launch mode reports it
TransportSetup gTransport;

std::string ridgeError(ridgeResult_t r, ridgeComm_t comm) {
  std::string s = ridgeGetErrorString(r);
  const char* last = ridgeGetLastError(comm);
  if (last && *last) s += ": " + std::string(last);
  return s;
}

bool underLauncher() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

int availableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? int(n) : 1;
}

// Where `#` lines go before the table: stdout unless stdout carries JSON or CSV.
FILE* infoStream(const Options& o) {
  return (o.jsonPath == "-" || o.csvPath == "-") ? stderr : stdout;
}

std::string shellQuote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789-_./=:,+@%") == std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Gloo's interface: RIDGE_BENCH_GLOO_IFACE, else the interface RIDGE_SOCKET_IFNAME names
// when it names exactly one that exists (so both libraries use the same network), else
// empty (Gloo then uses 127.0.0.1).
std::string glooInterface() {
  if (const char* v = std::getenv("RIDGE_BENCH_GLOO_IFACE"); v && *v) return v;
  const char* spec = std::getenv("RIDGE_SOCKET_IFNAME");
  if (!spec || !*spec || spec[0] == '^' || std::strchr(spec, ',')) return {};
  std::string name = spec[0] == '=' ? spec + 1 : spec;
  return if_nametoindex(name.c_str()) != 0 ? name : std::string();
}

// Joins the Gloo context of `--peer gloo` (collective over the ranks); fatal on failure.
void connectGloo(const Options& o, int rank, int nranks, const std::string& storeDir, RunInfo* info) {
  if (!o.peerGloo) return;
  std::string err = glooInit(rank, nranks, storeDir, glooInterface());
  if (!err.empty()) fatal(nullptr, "Gloo peer: cannot connect (store " + storeDir + "): " + err);
  info->glooPeer = true;
}

// The rank's index among the ranks of its host: the GPU it takes. Launchers say it in the
// environment; the fork launcher's ranks all share one host, so there it is the rank.
int localRank(int rank) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"})
    if (const char* v = std::getenv(name); v && *v) return std::atoi(v);
  return rank;
}

// --ridge-buffers device: makes this rank's GPU current before the communicator is created,
// which serves the device current at init (as NCCL's); connectDevice picks the same one again.
// Before, every rank's communicator served device 0, so only one-GPU machines could run.
void selectDeviceBeforeInit(const Options& o, int rank) {
  if (!o.ridgeOnDevice || o.peerNccl || rank < 0) return;
  std::string err;
  const int devices = cudaDevices(&err);
  if (devices > 0 && !deviceSelect(localRank(rank) % devices, &err)) fatal(nullptr, err);
}

// --peer nccl and --ridge-buffers device: picks this rank's GPU and, for NCCL, joins an NCCL
// communicator over the same ranks. Rank 0's ncclUniqueId reaches the others through a Ridge
// uint8 sum allreduce (everyone else contributes zeros), the way the benchmark shares its
// rank table. Fatal on failure, with the reason.
void connectDevice(const Options& o, ridgeComm_t comm, int rank, int nranks, RunInfo* info) {
  if (!o.peerNccl && !o.ridgeOnDevice) return;
  std::string err = o.peerNccl ? ncclProbe(o.ncclLib, 1) : deviceUnavailable();
  if (!err.empty())
    fatal(comm,
          std::string(o.peerNccl ? "--peer nccl" : "--ridge-buffers device") + " cannot run here: " + err);
  const int devices = cudaDevices(&err);
  const int local = localRank(rank);
  if (o.peerNccl && local >= devices)
    fatal(comm, "--peer nccl: local rank " + std::to_string(local) + " has no GPU of its own (" +
                    std::to_string(devices) + " on this host; NCCL runs one rank per GPU)");
  info->device = local % devices;
  if (!o.peerNccl) {
    if (!deviceSelect(info->device, &err)) fatal(comm, err);
    return;
  }
  unsigned char id[kNcclUniqueIdBytes] = {};
  if (rank == 0) {
    err = ncclMakeId(id);
    if (!err.empty()) fatal(comm, err);
  }
  ridgeResult_t r = ridgeAllReduce(id, id, sizeof id, ridgeUint8, ridgeSum, comm, nullptr);
  if (r != ridgeSuccess) fatal(comm, "sharing the NCCL unique id: " + ridgeError(r, comm));
  err = ncclInit(id, rank, nranks, info->device);
  if (!err.empty()) fatal(comm, "NCCL peer: " + err);
  info->ncclPeer = true;
}

// Runs one rank on an initialised communicator, then tears it down.
int runAndDestroy(const Options& o, ridgeComm_t comm, RunInfo info) {
  info.gdr = gGdr;
  info.transport = gTransport;
  int nranks = 1, rank = 0;
  ridgeCommCount(comm, &nranks);
  ridgeCommUserRank(comm, &rank);
  connectDevice(o, comm, rank, nranks, &info);
  int rc = runBenchmark(o, comm, info);
  if (info.ncclPeer) ncclShutdown();
  if (info.glooPeer) glooShutdown();
  ridgeResult_t r = ridgeCommDestroy(comm);
  if (r != ridgeSuccess) {
    std::fprintf(stderr, "ridge-bench rank %d: ridgeCommDestroy failed: %s\n", gRank,
                 ridgeError(r, nullptr).c_str());
    if (rc == kExitOk) rc = kExitFailure;
  }
  return rc;
}

// ---- 1. under an MPI launcher -------------------------------------------------------------
int runUnderMpi(int argc, char** argv, const Options& o) {
#if defined(RIDGE_BENCH_HAVE_MPI)
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  setFatalContext(rank, true);
  if (rank == 0 && o.np && o.np != size)
    std::fprintf(stderr, "ridge-bench: note: -np %d ignored, the launcher started %d ranks\n", o.np, size);
  ridgeUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (rank == 0) {
    ridgeResult_t r = ridgeGetUniqueId(&id);
    if (r != ridgeSuccess) fatal(nullptr, "ridgeGetUniqueId failed: " + ridgeError(r, nullptr));
  }
  MPI_Bcast(&id, int(sizeof id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ridgeComm_t comm = nullptr;
  selectDeviceBeforeInit(o, rank);
  ridgeResult_t r = ridgeCommInitRank(&comm, size, id, rank);
  if (r != ridgeSuccess) fatal(nullptr, "ridgeCommInitRank failed: " + ridgeError(r, nullptr));
  RunInfo info;
  info.launch = std::getenv("RIDGE_BENCH_REEXEC") ? "mpirun (re-exec)" : "mpi";
  info.mpiPeer = o.peerMpi;
  int rc = runAndDestroy(o, comm, info);
  std::fflush(stdout);
  MPI_Finalize();
  return rc;
#else
  (void)argc;
  (void)argv;
  (void)o;
  std::fprintf(stderr,
               "ridge-bench: started by an MPI launcher, but this build has no MPI support, so "
               "the ranks cannot exchange the unique id. Rebuild with MPI (install "
               "libopenmpi-dev, configure with -DRIDGE_WITH_MPI=ON) or run without the launcher: "
               "ridge-bench <collective> -np N ...\n");
  return kExitUsage;
#endif
}

// ---- 2. RIDGE_RANK / RIDGE_WORLD_SIZE ------------------------------------------------------
int runFromEnv(const Options& o) {
  if (o.np) std::fprintf(stderr, "ridge-bench: note: -np ignored, RIDGE_RANK/RIDGE_WORLD_SIZE are set\n");
  ridgeComm_t comm = nullptr;
  if (const char* envRank = std::getenv("RIDGE_RANK")) selectDeviceBeforeInit(o, std::atoi(envRank));
  ridgeResult_t r = ridgeCommInitFromEnv(&comm);
  if (r != ridgeSuccess) fatal(nullptr, "ridgeCommInitFromEnv failed: " + ridgeError(r, nullptr));
  int rank = 0;
  ridgeCommUserRank(comm, &rank);
  setFatalContext(rank, false);
  RunInfo info;
  info.launch = "env";
  if (o.peerGloo) {
    const char* store = std::getenv("RIDGE_BENCH_GLOO_STORE");
    if (!store || !*store)
      fatal(comm,
            "--peer gloo with RIDGE_RANK/RIDGE_WORLD_SIZE needs RIDGE_BENCH_GLOO_STORE: an empty "
            "directory every rank can see, for Gloo's file-store rendezvous");
    int nranks = 1;
    ridgeCommCount(comm, &nranks);
    connectGloo(o, rank, nranks, store, &info);
  }
  int rc = runAndDestroy(o, comm, info);
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(rc);  // skip static destructors: the library may still hold service threads
}

// ---- 3. --peer mpi: re-run under mpirun ------------------------------------------------------
int reexecUnderMpirun(int argc, char** argv, const Options& o) {
#if defined(RIDGE_BENCH_HAVE_MPI)
  const int n = o.np ? o.np : 1;
  const int cores = availableCores();
  const bool over = n > cores;
  std::vector<std::string> args;
  std::string launcher = RIDGE_BENCH_MPIEXEC;
  if (launcher.empty()) launcher = "mpirun";
  args.push_back(launcher);
#if defined(OPEN_MPI)
  if (geteuid() == 0) args.push_back("--allow-run-as-root");
#endif
  args.push_back("-np");
  args.push_back(std::to_string(n));
#if defined(OPEN_MPI)
  if (over) {
    args.push_back("--oversubscribe");
  } else {
    args.push_back("--bind-to");
    args.push_back("core");
  }
#else
  if (!over) {
    args.push_back("-bind-to");
    args.push_back("core");
  }
#endif
  if (const char* extra = std::getenv("RIDGE_BENCH_MPIRUN_ARGS")) {
    std::istringstream in(extra);
    for (std::string w; in >> w;) args.push_back(w);
  }
  char self[4096];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    std::fprintf(stderr, "ridge-bench: cannot find my own executable: %s\n", std::strerror(errno));
    return kExitFailure;
  }
  self[len] = '\0';
  args.push_back(self);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-np" || a == "--np") {
      ++i;  // and its value
      continue;
    }
    if (a.rfind("--np=", 0) == 0) continue;
    args.push_back(a);
  }
  FILE* info = infoStream(o);
  std::string line;
  for (const auto& a : args) {
    if (!line.empty()) line += ' ';
    line += shellQuote(a);
  }
  std::fprintf(info, "# ridge-bench: --peer mpi runs the ranks under MPI: %s\n", line.c_str());
  if (over)
    std::fprintf(info,
                 "# %d ranks on %d cores: --oversubscribe, with which Open MPI turns on "
                 "yield-when-idle (mpi_yield_when_idle): MPI ranks yield the core while polling, "
                 "so MPI latency suffers\n",
                 n, cores);
  std::fflush(info);
  setenv("RIDGE_BENCH_REEXEC", "1", 1);
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  execvp(cargs[0], cargs.data());
  std::fprintf(stderr, "ridge-bench: cannot run %s: %s\n", cargs[0], std::strerror(errno));
  return kExitFailure;
#else
  (void)argc;
  (void)argv;
  (void)o;
  std::fprintf(stderr, "ridge-bench: --peer mpi needs a build with MPI (libopenmpi-dev)\n");
  return kExitUsage;
#endif
}

// ---- 4. -np N: fork the ranks -----------------------------------------------------------------
void describeStatus(int st, char* buf, size_t len);

// Whether --peer nccl / --ridge-buffers device can run `ranks` ranks here: "" or why not.
// Asked in a short-lived child, because a process that initialised CUDA cannot pass a
// working CUDA context on to the ranks it forks afterwards.
std::string probeDeviceInChild(const Options& o, int ranks) {
  if (!o.peerNccl && !o.ridgeOnDevice) return {};
  int fds[2];
  if (pipe(fds) != 0) return std::string("pipe: ") + std::strerror(errno);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return std::string("fork: ") + std::strerror(errno);
  }
  if (pid == 0) {
    close(fds[0]);
    const std::string why = o.peerNccl ? ncclProbe(o.ncclLib, ranks) : deviceUnavailable();
    ssize_t w = write(fds[1], why.data(), why.size());
    _exit(w == ssize_t(why.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string why;
  char buf[512];
  for (int reads = 0; reads < 64; ++reads) {  // the answer is one line; bounded anyway
    ssize_t got = read(fds[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    why.append(buf, size_t(got));
  }
  close(fds[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
    char what[160];
    describeStatus(st, what, sizeof what);
    return "the device probe process " + std::string(what) + (why.empty() ? "" : ": " + why);
  }
  return why;
}

void describeStatus(int st, char* buf, size_t len) {
  if (WIFSIGNALED(st)) {
    int sig = WTERMSIG(st);
    const char* abbrev = sigabbrev_np(sig);
    std::snprintf(buf, len, "was killed by signal SIG%s (%d, %s)%s", abbrev ? abbrev : "?", sig,
                  strsignal(sig), WCOREDUMP(st) ? ", core dumped" : "");
  } else {
    int code = WEXITSTATUS(st);
    const char* what = code == kExitWrong     ? "wrong results"
                       : code == kExitUsage   ? "usage error"
                       : code == kExitFailure ? "a call failed; see its message above"
                                              : "unexpected status";
    std::snprintf(buf, len, "exited with status %d (%s)", code, what);
  }
}

int runForked(const Options& o) {
  const int n = o.np ? o.np : 1;
  if (collHasRoot(o.coll) && o.root >= n) {
    std::fprintf(stderr, "ridge-bench: root %d is out of range for %d ranks (-r, -np)\n", o.root, n);
    return kExitUsage;
  }
  if (std::string why = probeDeviceInChild(o, n); !why.empty()) {
    std::fprintf(stderr, "ridge-bench: %s cannot run here: %s\n",
                 o.peerNccl ? "--peer nccl" : "--ridge-buffers device", why.c_str());
    return kExitUsage;
  }
  ridgeUniqueId id;
  ridgeResult_t r = ridgeGetUniqueId(&id);
  if (r != ridgeSuccess) fatal(nullptr, "ridgeGetUniqueId failed: " + ridgeError(r, nullptr));
  std::string glooStore;
  if (o.peerGloo) {
    char tmpl[] = "/tmp/ridge-bench-gloo-XXXXXX";
    if (!mkdtemp(tmpl)) fatal(nullptr, std::string("mkdtemp for the Gloo store: ") + std::strerror(errno));
    glooStore = tmpl;
  }

  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = getpid();
  std::vector<pid_t> pids(size_t(n), 0);
  for (int rank = 0; rank < n; ++rank) {
    pid_t pid = fork();
    if (pid < 0) {
      std::fprintf(stderr, "ridge-bench: fork failed for rank %d: %s\n", rank, std::strerror(errno));
      for (pid_t p : pids)
        if (p > 0) kill(p, SIGKILL);
      while (wait(nullptr) > 0) {
      }
      return kExitFailure;
    }
    if (pid == 0) {
      // The rank: die with the launcher, so that a killed launcher leaves no orphans.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(kExitFailure);
      setFatalContext(rank, false);
      ridgeComm_t comm = nullptr;
      selectDeviceBeforeInit(o, rank);
      ridgeResult_t ir = ridgeCommInitRank(&comm, n, id, rank);
      if (ir != ridgeSuccess) fatal(nullptr, "ridgeCommInitRank failed: " + ridgeError(ir, nullptr));
      RunInfo info;
      info.launch = "fork";
      connectGloo(o, rank, n, glooStore, &info);
      int rc = runAndDestroy(o, comm, info);
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(rc);
    }
    pids[size_t(rank)] = pid;
  }

  // Wait for every rank, within the bound. A rank that crashes or fails stops the run:
  // the others would only wait for it until RIDGE_TIMEOUT.
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::seconds(o.runTimeoutSec);
  int remaining = n;
  int result = kExitOk;
  std::string failure;
  while (remaining > 0) {
    int st = 0;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (p == 0) {
      if (clock::now() > deadline) {
        failure = "the ranks did not finish within " + std::to_string(o.runTimeoutSec) + " s (--run-timeout)";
        result = kExitFailure;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    int rank = -1;
    for (int i = 0; i < n; ++i)
      if (pids[size_t(i)] == p) rank = i;
    if (rank < 0) continue;
    pids[size_t(rank)] = 0;
    --remaining;
    if (WIFEXITED(st) && WEXITSTATUS(st) == kExitOk) continue;
    if (WIFEXITED(st) && WEXITSTATUS(st) == kExitWrong) {
      result = std::max(result, kExitWrong);  // an orderly end: the others finish too
      continue;
    }
    char what[160];
    describeStatus(st, what, sizeof what);
    failure = "rank " + std::to_string(rank) + " (pid " + std::to_string(p) + ") " + what;
    result = (WIFEXITED(st) && WEXITSTATUS(st) == kExitUsage) ? kExitUsage : kExitFailure;
    break;
  }
  if (!failure.empty()) {
    std::fprintf(stderr, "ridge-bench: %s%s\n", failure.c_str(),
                 remaining > 0 ? "; stopping the other ranks" : "");
    for (pid_t p : pids)
      if (p > 0) kill(p, SIGTERM);
    const auto grace = clock::now() + std::chrono::seconds(2);
    while (remaining > 0) {
      pid_t p = waitpid(-1, nullptr, WNOHANG);
      if (p > 0) {
        for (auto& q : pids)
          if (q == p) q = 0, --remaining;
        continue;
      }
      if (p < 0 && errno != EINTR) break;
      if (clock::now() > grace) {
        for (pid_t q : pids)
          if (q > 0) kill(q, SIGKILL);
        while (waitpid(-1, nullptr, 0) > 0) {
        }
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  if (!glooStore.empty()) {
    // The file store leaves one small file per rank and key.
    if (DIR* d = opendir(glooStore.c_str())) {
      int seen = 0;
      while (dirent* e = readdir(d)) {
        if (++seen > 100000) break;
        if (e->d_name[0] != '.') unlink((glooStore + "/" + e->d_name).c_str());
      }
      closedir(d);
    }
    rmdir(glooStore.c_str());
  }
  return result;
}

}  // namespace

void setFatalContext(int rank, bool underMpi) {
  gRank = rank;
  gUnderMpi = underMpi;
}

void fatal(ridgeComm_t comm, const std::string& msg) {
  if (gRank >= 0)
    std::fprintf(stderr, "ridge-bench rank %d: %s\n", gRank, msg.c_str());
  else
    std::fprintf(stderr, "ridge-bench: %s\n", msg.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  // Once: the -T watchdog and the main thread whose call it broke may both get here, and
  // ridgeCommAbort frees the communicator.
  static std::atomic<bool> aborted{false};
  if (comm && !aborted.exchange(true)) ridgeCommAbort(comm);  // peers see ridgeAborted instead of waiting
  if (gUnderMpi) mpiAbort(kExitFailure);
  _exit(kExitFailure);
}

}  // namespace rbench

int main(int argc, char** argv) {
  using namespace rbench;
  Options o;
  std::string err;
  switch (parseOptions(argc, argv, &o, &err)) {
    case Parse::Help: printUsage(stdout); return kExitOk;
    case Parse::Version: std::printf("%s\n", versionLine().c_str()); return kExitOk;
    case Parse::Error:
      std::fprintf(stderr, "ridge-bench: %s\n", err.c_str());
      printUsage(stderr);
      return kExitUsage;
    case Parse::Ok: break;
  }
  if (std::string why = unsupportedHere(o, cudaBuiltIn()); !why.empty()) {
    std::fprintf(stderr, "ridge-bench: %s\n", why.c_str());
    return kExitUsage;
  }
  if (!o.plotPath.empty()) {
    if (std::string why = plotterMissing(); !why.empty()) {
      std::fprintf(stderr, "ridge-bench: --plot %s: %s\n", o.plotPath.c_str(), why.c_str());
      return kExitUsage;
    }
  }
  if (!o.algo.empty()) setenv("RIDGE_ALGO", o.algo.c_str(), 1);
  if (int(o.peerGloo) + int(o.peerMpi) + int(o.peerNccl) > 1) {
    std::fprintf(stderr, "ridge-bench: choose one --peer (mpi, gloo or nccl)\n");
    return kExitUsage;
  }
  if ((o.peerNccl || o.ridgeOnDevice) && !cudaBuiltIn()) {
    // Known before any rank starts, whatever the launch mode: one line, not one per rank.
    std::fprintf(stderr, "ridge-bench: %s cannot run here: %s\n",
                 o.peerNccl ? "--peer nccl" : "--ridge-buffers device", deviceUnavailable().c_str());
    return kExitUsage;
  }
  if (o.peerGloo && !glooBuiltIn()) {
    std::fprintf(stderr,
                 "ridge-bench: --peer gloo needs a build with Gloo: install libgloo-dev "
                 "(apt-get install -y libgloo-dev) and reconfigure\n");
    return kExitUsage;
  }
  if (o.peerGloo && underLauncher()) {
    std::fprintf(stderr,
                 "ridge-bench: --peer gloo is not supported under an MPI launcher; use -np N or "
                 "RIDGE_RANK/RIDGE_WORLD_SIZE with RIDGE_BENCH_GLOO_STORE\n");
    return kExitUsage;
  }

  // Before any rank starts: the library reads these settings at communicator set-up. Ranks
  // forked here or re-run under mpirun by --peer mpi share this host.
  const bool oneHost = !underLauncher() && !(std::getenv("RIDGE_RANK") && std::getenv("RIDGE_WORLD_SIZE"));
  if (!prepareGdr(o, oneHost, &gGdr, &err)) {
    std::fprintf(stderr, "ridge-bench: %s\n", err.c_str());
    return kExitUsage;
  }
  gTransport = prepareTransport(o, gGdr);
  if (gGdr.active && oneHost && !underLauncher() && o.np < 2) {
    std::fprintf(stderr,
                 "ridge-bench: --gdr-mode needs at least 2 ranks (-np 2): one rank sends nothing "
                 "through a NIC\n");
    return kExitUsage;
  }

  int rc;
  if (underLauncher()) {
    rc = runUnderMpi(argc, argv, o);
  } else if (std::getenv("RIDGE_RANK") && std::getenv("RIDGE_WORLD_SIZE")) {
    if (o.peerMpi) {
      std::fprintf(stderr,
                   "ridge-bench: --peer mpi cannot be used with RIDGE_RANK/RIDGE_WORLD_SIZE; "
                   "use -np N or start ridge-bench with mpirun\n");
      return kExitUsage;
    }
    rc = runFromEnv(o);
  } else if (o.peerMpi) {
    rc = reexecUnderMpirun(argc, argv, o);
  } else {
    rc = runForked(o);
  }
  // Leave without static destructors: the library's service threads may still be running
  // (for example the rendezvous service in the -np launcher).
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(rc);
}
