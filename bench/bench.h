// ridge-bench: shared declarations of the benchmark's pieces.
//
//   options.cpp  command line parsing and the usage text
//   data.cpp     element types, input patterns, poisoning and result checking
//   mpi_peer.cpp the MPI side of `--peer mpi` (empty stubs without MPI)
//   gloo_peer.cpp the Gloo side of `--peer gloo` (empty stubs without Gloo)
//   nccl_peer.cpp the NCCL side of `--peer nccl` (libnccl.so.2 loaded at run time)
//   device_mem.cpp device buffers through the CUDA runtime (stubs without CUDA)
//   runner.cpp   the measurement loop on one communicator and the report
//   gdr_setup.cpp --gdr-mode: the environment for the gdr transport, and modeled labels;
//                the transport class of --peer gloo (TCP on both sides)
//   plot.cpp     --plot: the picture, through gnuplot or python3-matplotlib
//   main.cpp     launch modes: MPI launcher, RIDGE_RANK environment, fork (-np), mpirun re-exec
#pragma once

#include <ridge/ridge.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace rbench {

// Exit codes shared by every rank and by the fork launcher.
constexpr int kExitOk = 0;
constexpr int kExitWrong = 1;    // the run finished but some results were wrong
constexpr int kExitUsage = 2;    // bad command line
constexpr int kExitFailure = 3;  // a call failed, a rank died or the run timed out

enum class Coll { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AlltoAll, SendRecv };

const char* collName(Coll c);
bool parseColl(const std::string& s, Coll* out);
// busbw = algbw * factor (nccl-tests convention).
double busBwFactor(Coll c, int nranks);
// The memory-bandwidth bound (bench/runner.cpp, measureMemory): the least memory traffic,
// across the node, of one call per byte of its size (the size column, nccl-tests'
// convention), so that algbw <= traffic bandwidth / factor.
//   allreduce 2n (n inputs read, n outputs written); reduce, reducescatter n + 1 (every
//   input read once, the result written once); allgather, broadcast, alltoall, sendrecv 2n
//   (every output byte copied once: read and written).
double boundTrafficFactor(Coll c, int nranks);
// Whether the collective takes a reduction operator / a root.
bool collHasOp(Coll c);
bool collHasRoot(Coll c);

// Every option of nccl-tests 2.19 is here with its meaning (common.cu's getopt list); the
// ones Ridge cannot honour are accepted at their no-op value and refused otherwise
// (options.cpp says why, in one line).
struct Options {
  Coll coll = Coll::AllReduce;
  size_t minBytes = 8;
  size_t maxBytes = size_t(32) << 20;
  double factor = 2.0;   // -f; 1 (or less) steps by `increment` as nccl-tests does
  size_t increment = 0;  // -i; > 0 and factor <= 1: step by adding instead of multiplying
  int iters = 20;        // -n
  int warmup = 5;        // -w
  int aggIters = 1;      // -m: calls per timed iteration, in one ridgeGroupStart/End
  int runCycles = 1;     // -N: sweeps over the sizes; 0 repeats until stopped
  int checkIters = 1;    // -c: checked calls per variant and size; 0 checks nothing
  std::vector<ridgeDataType_t> dtypes{ridgeFloat};  // -d TYPE or all
  std::vector<ridgeRedOp_t> ops{ridgeSum};          // -o OP or all
  int root = 0;                                     // -r; -1 (all): every rank in turn
  int blocking = 0;                                 // -z 0..3, nccl-tests' meanings (options.cpp)
  int average = 3;                                  // -a: 0 rank 0's time, 1 mean, 2 min, 3 max over ranks
  int streamNull = 0;                               // -y: device calls on the legacy default stream
  int stepTimeoutSec = 0;         // -T: a rank stuck this long in one size aborts the run; 0 off
  int graphLaunches = 0;          // -G: capture the timed calls as a CUDA graph, launch it this often
  bool reportCputime = false;     // -C
  bool reportTimestamps = false;  // -S
  int localRegister = 0;          // -R 0/1/2
  int memoryReport = 0;           // -M
  int unalign = 0;                // -u: buffers start this many elements past alignment
  int perIterTiming = 0;          // -I
  int perIterSkip = 0;            // -K
  int nthreads = 1;               // -t (only 1)
  int ngpus = 1;                  // -g (only 1)
  int parallelInit = 0;           // -p (ranks are processes: they always init in parallel)
  int ctaPolicy = -1;             // -x (only -1: unset)
  int deviceImpl = 0;             // -D (only 0)
  int deviceCtaCount = 16;        // -V (only 16)
  int np = 0;                     // 0: not given on the command line
  bool peerMpi = false;
  bool peerGloo = false;
  bool peerNccl = false;
  std::string ncclLib = "libnccl.so.2";  // --nccl-lib: what --peer nccl dlopens
  // --ridge-buffers: where Ridge's send and receive buffers live. Host until Ridge's
  // stream-ordered device path exists; "device" then compares both libraries on GPU memory.
  bool ridgeOnDevice = false;
  std::string jsonPath;  // "" none, "-" stdout
  std::string csvPath;
  std::string plotPath;            // --plot FILE.svg|png
  std::string algo;                // "" leaves RIDGE_ALGO alone
  int runTimeoutSec = 1800;        // --run-timeout: bound for the fork launcher's wait
  std::string gdrMode;             // --gdr-mode: read, write, staged or auto; "" leaves RIDGE_GDR_MODE alone
  bool quiet = false;              // -q: no progress lines
  double progressSec = 5.0;        // --progress: seconds between progress lines; 0: one per size
  std::vector<std::string> args;   // the command line as given, for the records
  std::vector<std::string> notes;  // accepted options that change nothing here, and why
};

enum class Parse { Ok, Help, Version, Error };
Parse parseOptions(int argc, char** argv, Options* o, std::string* err);
// What this build and machine cannot do of what `o` asks (nccl-tests options beyond one
// rank per process, CUDA graphs without CUDA or device buffers): "" or one line.
std::string unsupportedHere(const Options& o, bool cudaBuild);
void printUsage(FILE* f);
// "ridge-bench 0.1.0 (library 0.1.0)"-style line for --version and the records.
std::string versionLine();
// "64M"-style sizes, 1024-based suffixes K, M, G, T (an optional trailing B is accepted).
bool parseSize(const std::string& s, size_t* out);

// ---- element types (data.cpp) -------------------------------------------------------
struct TypeInfo {
  ridgeDataType_t type;
  const char* name;
  size_t size;
  bool isFloat;
  bool isSigned;
  double eps;  // machine epsilon of the type; 0 for integers
};
const TypeInfo& typeInfo(ridgeDataType_t t);
bool parseType(const std::string& s, ridgeDataType_t* out);
const char* opName(ridgeRedOp_t op);
bool parseOp(const std::string& s, ridgeRedOp_t* out);
// What -d all and -o all run, in nccl-tests' order.
std::vector<ridgeDataType_t> allTypes();
std::vector<ridgeRedOp_t> allOps();

// Which family of values the inputs hold; see data.cpp for why each is exact.
enum class Pattern { Move, Reduce, Prod };
Pattern patternFor(Coll c, ridgeRedOp_t op);

// buf[k] = value(srcRank, g0 + k) for k in [0, n).
void fillPattern(ridgeDataType_t t, Pattern p, void* buf, size_t n, int srcRank, uint64_t g0);
// Marks an output region as not yet written: NaN for floating types, 0xA5 bytes otherwise.
void poison(ridgeDataType_t t, void* buf, size_t bytes);

// Maps output element k to what it must hold.
struct ExpectMap {
  bool reduction = false;   // op over all ranks' value(r, g), else value(src, g)
  int src = 0;              // source rank when block == 0
  size_t block = 0;         // > 0: source rank = k / block
  bool blockLocal = false;  // g = gBase + k % block (else g = gBase + k)
  uint64_t gBase = 0;
};
uint64_t countWrong(ridgeDataType_t t, Pattern p, ridgeRedOp_t op, int nranks, const void* out, size_t n,
                    const ExpectMap& m);
// out[k] /= nranks (integer types truncate), used to emulate avg on MPI's sum.
void divideBy(ridgeDataType_t t, void* buf, size_t n, int nranks);

// ---- gdr transport (gdr_setup.cpp) -------------------------------------------------------
// What --gdr-mode (or RIDGE_GDR_MODE in the environment) set up, for the report.
struct GdrSetup {
  bool active = false;             // the network pairs go through the gdr transport
  std::string mode;                // read, write, staged, auto
  bool modeled = false;            // RIDGE_SOFTNIC_PCIE_MODEL paces the NIC: figures are modeled
  int paceScale = 1;               // RIDGE_GDR_PACE_SCALE: measured times are divided by it
  std::vector<std::string> notes;  // header lines: what was set and why
};
bool gdrModeKnown(const std::string& mode);
// Checks the combination of --gdr-mode and the environment, sets RIDGE_GDR_MODE, RIDGE_NET
// (softnic unless a NIC provider is named) and RIDGE_SHM=0 (unless set) for the ranks to
// inherit. oneHost: every rank runs on this machine (fork launch, mpirun re-exec). False with
// *err on a combination that cannot measure the gdr transport.
bool prepareGdr(const Options& o, bool oneHost, GdrSetup* out, std::string* err);

// ---- transport class (gdr_setup.cpp) ----------------------------------------------------------
// What carries Ridge's traffic between ranks of one host, decided from the environment before
// the ranks start, and for --peer gloo made like Gloo's (TCP: RIDGE_SHM=0, RIDGE_NET=socket
// unless the environment says otherwise), so that the ratio compares libraries, not transports.
struct TransportSetup {
  std::string ridge;               // "shared memory", "tcp", "softnic", "verbs", ...
  std::string peer;                // the peer's, when known ("tcp" for Gloo); "" otherwise
  bool alike = true;               // false: the ratio compares transports as well
  std::vector<std::string> notes;  // header lines
};
// Sets RIDGE_SHM/RIDGE_NET for --peer gloo where the environment leaves them unset, after
// prepareGdr, and describes the result.
TransportSetup prepareTransport(const Options& o, const GdrSetup& gdr);

// ---- MPI peer (mpi_peer.cpp) -------------------------------------------------------------
bool mpiBuiltIn();
// Empty when MPI can run this case; otherwise why not (shown as n/a).
std::string mpiUnsupported(Coll c, bool inPlace, ridgeDataType_t t, ridgeRedOp_t op, size_t n);
// One MPI call equivalent to the Ridge call (see runner.cpp for the buffer layouts). Returns
// an MPI error code (0 = MPI_SUCCESS) and fills *err with its text.
int mpiCollective(Coll c, bool inPlace, const void* send, void* recv, size_t n, ridgeDataType_t t,
                  ridgeRedOp_t op, int root, int rank, int nranks, std::string* err);
void mpiBarrier();
void mpiAbort(int code);

// ---- Gloo peer (gloo_peer.cpp) -------------------------------------------------------------
bool glooBuiltIn();
// Connects Gloo's TCP device (on `iface`, or 127.0.0.1 when empty) through a file store in
// `storeDir`; returns "" or the error text.
std::string glooInit(int rank, int nranks, const std::string& storeDir, const std::string& iface);
std::string glooUnsupported(Coll c, bool inPlace, ridgeDataType_t t, ridgeRedOp_t op, size_t n);
int glooCollective(Coll c, bool inPlace, const void* send, void* recv, size_t n, ridgeDataType_t t,
                   ridgeRedOp_t op, int root, int rank, int nranks, std::string* err);
void glooBarrier();
void glooShutdown();

// ---- device memory (device_mem.cpp) ------------------------------------------------------
// Never called in the fork launcher itself (CUDA does not survive fork): only in the ranks
// and in the probe child. Without CUDA in the build every call fails with that reason.
bool cudaBuiltIn();
// "" when this process can use a CUDA device; else why not (no CUDA in the build, no device).
std::string deviceUnavailable();
int cudaDevices(std::string* err);  // 0 with *err when there is no device or driver
bool deviceSelect(int device, std::string* err);
void* deviceAlloc(size_t bytes, std::string* err);
void deviceFree(void* p);
bool copyToDevice(void* dst, const void* src, size_t bytes, std::string* err);
bool copyToHost(void* dst, const void* src, size_t bytes, std::string* err);
void* streamCreate(std::string* err);  // a cudaStream_t, as void*
bool streamSync(void* stream, std::string* err);
void streamDestroy(void* stream);
// -G: capture what is enqueued on `stream` between graphBegin and graphEnd as one CUDA graph.
// graphEnd returns the instantiated graph (cudaGraphExec_t), or null with *err; with
// discard it only ends the capture (a call was refused while capturing).
bool graphBegin(void* stream, std::string* err);
void* graphEnd(void* stream, bool discard, std::string* err);
bool graphLaunch(void* exec, void* stream, std::string* err);
void graphDestroy(void* exec);
// Device memory in use on this rank's device (total - free), for -M; -1 without CUDA.
long long deviceMemoryUsed();

// ---- NCCL peer (nccl_peer.cpp) -------------------------------------------------------------
constexpr size_t kNcclUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
// dlopens `lib` and resolves the entry points; "" or the reason (dlerror text).
std::string ncclLoad(const std::string& lib);
// "" when --peer nccl can run `ranksOnHost` ranks here, else one line saying why not: no
// CUDA in this build, the library does not load, no CUDA device, fewer GPUs than ranks.
std::string ncclProbe(const std::string& lib, int ranksOnHost);
std::string ncclVersionText();
std::string ncclMakeId(void* id);  // id: kNcclUniqueIdBytes bytes
// Selects `device`, creates the stream NCCL runs on and joins the communicator.
std::string ncclInit(const void* id, int rank, int nranks, int device);
void* ncclStream();
void ncclUseNullStream();   // -y 1: NCCL's calls go to the legacy default stream
int ncclGroup(bool start);  // ncclGroupStart / ncclGroupEnd (-m)
std::string ncclUnsupported(Coll c, bool inPlace, ridgeDataType_t t, ridgeRedOp_t op);
// Enqueues one NCCL call on ncclStream() (device buffers, Ridge's layouts); 0 or an
// ncclResult_t with *err.
int ncclCollective(Coll c, bool inPlace, const void* send, void* recv, size_t n, ridgeDataType_t t,
                   ridgeRedOp_t op, int root, int rank, int nranks, std::string* err);
void ncclShutdown();

// ---- pictures (plot.cpp) --------------------------------------------------------------------
// "" when --plot can draw here (gnuplot on PATH, else /usr/bin/python3 with matplotlib),
// otherwise one line saying what to install.
std::string plotterMissing();
struct PlotSeries {
  std::string label;
  std::vector<double> bytes, busbw, timeUs;
};
// Writes `path` (.svg or .png): busbw and time against size, log axes, one line per series.
// "" or why it failed.
std::string drawPlot(const std::string& path, const std::string& title,
                     const std::vector<PlotSeries>& series);

// ---- the benchmark on one communicator (runner.cpp) ---------------------------------------
struct RunInfo {
  std::string launch;        // "fork", "mpirun", "env"
  bool mpiPeer = false;      // MPI_COMM_WORLD matches the Ridge ranks and --peer mpi was asked
  bool glooPeer = false;     // a Gloo context over the same ranks is connected (--peer gloo)
  bool ncclPeer = false;     // an NCCL communicator over the same ranks is up (--peer nccl)
  int device = -1;           // the GPU this rank uses (--peer nccl, --ridge-buffers device)
  GdrSetup gdr;              // --gdr-mode (the same on every rank: set before the ranks start)
  TransportSetup transport;  // which transport class Ridge's ranks of one host use
};
// Runs the whole sweep on this rank; returns the process exit code. Failing calls end the
// process (after ridgeCommAbort) through fatal().
int runBenchmark(const Options& o, ridgeComm_t comm, const RunInfo& info);

// Prints "ridge-bench[ rank R]: msg" and ends the process with kExitFailure: aborts `comm`
// when given, and the MPI job when running under MPI.
[[noreturn]] void fatal(ridgeComm_t comm, const std::string& msg);
void setFatalContext(int rank, bool underMpi);

}  // namespace rbench
