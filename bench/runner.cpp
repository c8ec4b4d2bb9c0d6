// ridge-bench: the measurement loop on one communicator, and the report.
//
// For every size, up to four variants run back to back on the same buffers: Ridge
// out-of-place, Ridge in-place, then (with --peer mpi or --peer gloo) the peer library's
// out-of-place and in-place, so that drift in the machine's state hits Ridge and the peer
// alike. Each variant:
//   1. (check) fill inputs, poison outputs (NaN or 0xA5 bytes), one call, count wrong elements;
//   2. barrier, -w warm-up calls, barrier, -n timed calls: time = elapsed / n on this rank;
//   3. (check) refill and poison again, one more call after the timed loop, count again.
// The row reports, per variant, the largest per-rank time (ridgeMax over a double) and
// the sum of every rank's wrong elements.
//
// Device buffers (--peer nccl always, Ridge with --ridge-buffers device): inputs are filled
// and outputs poisoned in host memory and copied to the device before the checked call, the
// output copied back after it; the calls are enqueued on a CUDA stream and the timed loop
// ends with a stream synchronisation, as nccl-tests times them.
#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench.h"

namespace rbench {

namespace {

double nowSec() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

enum Variant { kRidgeOop = 0, kRidgeIp = 1, kMpiOop = 2, kMpiIp = 3, kNumVariants = 4 };

// -I: statistics of one variant's per-iteration times (each the max over ranks), in us.
struct IterStats {
  double minUs = 0, maxUs = 0, p99Us = 0, cvPct = 0;
};

struct Row {
  ridgeDataType_t dtype = ridgeFloat;
  ridgeRedOp_t op = ridgeSum;
  int root = -1;     // -1: the collective has none
  int cycle = 0;     // -N: which sweep
  size_t bytes = 0;  // reported size: total bytes, as nccl-tests counts them
  size_t count = 0;  // bytes / element size
  size_t n = 0;      // the count argument of the call
  bool avail[kNumVariants] = {};
  std::string why[kNumVariants];  // why a variant is not available
  double timeUs[kNumVariants] = {};
  double cpuUs[kNumVariants] = {};  // -C: host time until the last call returned
  double wrong[kNumVariants] = {};
  IterStats iter[kNumVariants];
  std::string stamp;  // -S
};

// Rank 0's progress lines on stderr, and every rank's -T watchdog, in one thread. The
// main thread says what it starts (once per variant and size, not per call); the thread
// wakes a few times a second, prints when the interval has passed, and ends the run when
// one step has lasted longer than -T.
class Monitor {
 public:
  Monitor(const Options& o, ridgeComm_t comm, bool printer) : o_(o), comm_(comm) {
    printing_ = printer && !o.quiet;
    tty_ = isatty(STDERR_FILENO) != 0;
    start_ = lastLine_ = nowSec();
    if ((printing_ && o.progressSec > 0) || o.stepTimeoutSec > 0) thread_ = std::thread([this] { loop(); });
  }
  ~Monitor() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (shown_ && tty_) std::fprintf(stderr, "\r%*s\r", int(width_), "");
  }
  // A new step: `row` of `rows` (0 rows: no end known), `what` says which.
  void step(size_t row, size_t rows, std::string what) {
    std::lock_guard<std::mutex> lk(mu_);
    const bool newRow = row != row_ || !inStep_;
    row_ = row;
    rows_ = rows;
    what_ = std::move(what);
    stepStart_ = nowSec();
    inStep_ = true;
    // --progress 0: one line as each size starts, from this thread, so none is missed.
    if (printing_ && o_.progressSec == 0 && newRow && firstVariant_) printLocked();
    firstVariant_ = false;
  }
  // Before the row is printed: a terminal's progress line is wiped so the row starts clean.
  void rowDone() {
    std::lock_guard<std::mutex> lk(mu_);
    inStep_ = false;
    firstVariant_ = true;
    if (tty_ && shown_) {
      std::fprintf(stderr, "\r%*s\r", int(width_), "");
      std::fflush(stderr);
      shown_ = false;
    }
  }

 private:
  void printLocked() {
    char line[320];
    const double t = nowSec() - start_;
    int len;
    if (rows_)
      len = std::snprintf(line, sizeof line, "ridge-bench %s: row %zu/%zu, %s, %.1f s", collName(o_.coll),
                          row_ + 1, rows_, what_.c_str(), t);
    else
      len = std::snprintf(line, sizeof line, "ridge-bench %s: row %zu (-N 0: until stopped), %s, %.1f s",
                          collName(o_.coll), row_ + 1, what_.c_str(), t);
    if (tty_) {
      width_ = std::max(width_, size_t(len > 0 ? len : 0));
      std::fprintf(stderr, "\r%-*s", int(width_), line);
    } else {
      std::fprintf(stderr, "%s\n", line);  // pipes and launchers: whole lines
    }
    std::fflush(stderr);
    shown_ = true;
    lastLine_ = nowSec();
  }
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      double wait = 0.25;
      if (printing_ && o_.progressSec > 0) wait = std::min(wait, o_.progressSec);
      if (o_.stepTimeoutSec > 0) wait = std::min(wait, o_.stepTimeoutSec / 4.0);
      cv_.wait_for(lk, std::chrono::duration<double>(wait));
      if (stop_) break;
      const double now = nowSec();
      if (inStep_ && o_.stepTimeoutSec > 0 && now - stepStart_ > o_.stepTimeoutSec) {
        char host[64] = "?";
        gethostname(host, sizeof host - 1);
        fatal(comm_, std::string(host) + ": test timeout (-T " + std::to_string(o_.stepTimeoutSec) +
                         " s): " + what_ + " did not finish; aborting the communicator");
      }
      if (printing_ && o_.progressSec > 0 && inStep_ && now - lastLine_ >= o_.progressSec) printLocked();
    }
  }

  const Options& o_;
  ridgeComm_t comm_;
  bool printing_ = false, tty_ = false, shown_ = false;
  double start_ = 0, lastLine_ = 0, stepStart_ = 0;
  size_t width_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, inStep_ = false, firstVariant_ = true;
  size_t row_ = SIZE_MAX, rows_ = 0;
  std::string what_;
  std::thread thread_;
};

// -R: ridgeCommRegister/ridgeCommDeregister, looked up at run time so that ridge-bench builds
// against a library without them. NCCL's shape (ncclCommRegister(comm, buff, size, &handle)).
using RegisterFn = ridgeResult_t (*)(ridgeComm_t, void*, size_t, void**);
using DeregisterFn = ridgeResult_t (*)(ridgeComm_t, void*);
// -R 2 on host buffers: ridgeMemAlloc/ridgeMemFree, looked up the same way.
using MemAllocFn = ridgeResult_t (*)(void**, size_t);
using MemFreeFn = ridgeResult_t (*)(void*);

class Bench {
 public:
  Bench(const Options& o, ridgeComm_t comm, const RunInfo& info)
      : o_(o), comm_(comm), info_(info), ti_(&typeInfo(o.dtypes.front())) {
    check(ridgeCommCount(comm, &nranks_), "ridgeCommCount");
    check(ridgeCommUserRank(comm, &rank_), "ridgeCommUserRank");
    select(o.dtypes.front(), o.ops.front(), 0);
  }
  ~Bench() {
    deregister();
    freeHost(sendBase_);
    freeHost(recvBase_);
    deviceFree(dsendBase_);
    deviceFree(drecvBase_);
    if (ownRidgeStream_) streamDestroy(ridgeStream_);
  }
  int run();

 private:
  // ---- Ridge helpers ----
  void check(ridgeResult_t r, const char* what) {
    if (r == ridgeSuccess) return;
    fatal(comm_, std::string(what) + " failed: " + ridgeError(r));
  }
  std::string ridgeError(ridgeResult_t r) const {
    std::string msg = ridgeGetErrorString(r);
    const char* last = ridgeGetLastError(comm_);
    if (last && *last) msg += ": " + std::string(last);
    return msg;
  }
  void barrier() {
    float one = 1.0f, out = 0.0f;
    check(ridgeAllReduce(&one, &out, 1, ridgeFloat, ridgeSum, comm_, nullptr), "ridgeAllReduce (barrier)");
  }
  void allreduceDoubles(double* v, size_t n, ridgeRedOp_t op) {
    check(ridgeAllReduce(v, v, n, ridgeFloat64, op, comm_, nullptr), "ridgeAllReduce (stats)");
  }
  // -a: one value per variant from every rank's: rank 0's, the mean, the min or the max.
  void combineTimes(double* v, size_t n);

  bool checking() const { return o_.checkIters > 0; }
  // The type, operator and root of the rows that follow (-d all, -o all, -r all).
  void select(ridgeDataType_t t, ridgeRedOp_t op, int root);
  std::vector<size_t> sizes() const;
  void allocate(size_t bytes);
  void registerBuffers();
  void deregister();
  char* allocateHost(size_t bytes);
  void freeHost(char* p) {
    if (memFreeFn_)
      memFreeFn_(p);
    else
      std::free(p);
  }
  void printHeader();
  void printRanks();
  void measureMemory();
  void printMemoryReport();
  void prepare(bool inPlace, size_t n);
  uint64_t checkOutput(bool inPlace, bool mpi, size_t n);
  ridgeResult_t ridgeCall(bool inPlace, size_t n);
  void mpiCall(bool inPlace, size_t n);
  // Whether variant v runs on device buffers, and the stream its calls go to (null: host).
  bool onDevice(int v) const { return v >= kMpiOop ? info_.ncclPeer : o_.ridgeOnDevice; }
  void* streamOf(int v) const { return !onDevice(v) ? nullptr : v >= kMpiOop ? ncclStream() : ridgeStream_; }
  size_t extentBytes(size_t n) const {
    return std::min(n * size_t(nranks_) * ti_->size, allocBytes_ - size_t(o_.unalign) * ti_->size);
  }
  void upload(size_t n);
  void download(size_t n);
  void streamWait(int v);
  void runVariant(Row& row, int v, std::vector<double>* iterSec);
  void printColumns();
  void printRow(const Row& row);
  std::vector<std::pair<std::string, std::optional<std::string>>> record(const Row& row) const;
  void writeMachineReadable(const std::vector<Row>& rows, double avgBus, double avgRatio);
  void plot(const std::vector<Row>& rows);
  std::string transportLabel() const;

  double algbw(const Row& r, int v) const { return double(r.bytes) / (r.timeUs[v] * 1e3); }
  double busbw(const Row& r, int v) const { return algbw(r, v) * busBwFactor(o_.coll, nranks_); }
  bool hasBound() const { return trafficGBs_ > 0; }
  // The ceiling of algbw that the memory bandwidth allows (measureMemory).
  double boundGBs() const { return trafficGBs_ / boundTrafficFactor(o_.coll, nranks_); }
  double boundPct(const Row& r) const { return algbw(r, kRidgeOop) / boundGBs() * 100.0; }
  bool hasRatio(const Row& r) const { return r.avail[kMpiOop] && r.avail[kRidgeOop]; }
  // Whether a peer library runs alongside, and its name for headers and records.
  bool hasPeer() const { return info_.mpiPeer || info_.glooPeer || info_.ncclPeer; }
  const char* peerName() const { return info_.glooPeer ? "Gloo" : info_.ncclPeer ? "NCCL" : "MPI"; }
  const char* peerKey() const { return info_.glooPeer ? "gloo" : info_.ncclPeer ? "nccl" : "mpi"; }
  // Column titles name the buffer kind when the two sides could differ.
  std::string placement(int v, const char* what) const {
    std::string t = v >= kMpiOop ? peerName() : (hasPeer() ? "Ridge" : "");
    if (!t.empty()) t += ' ';
    t += what;
    if (info_.ncclPeer || o_.ridgeOnDevice) t += onDevice(v) ? " [dev]" : " [host]";
    return t;
  }
  double ratio(const Row& r) const { return algbw(r, kRidgeOop) / algbw(r, kMpiOop); }
  const char* opText(const Row& r) const { return collHasOp(o_.coll) ? opName(r.op) : "none"; }

  const Options& o_;
  ridgeComm_t comm_;
  RunInfo info_;
  const TypeInfo* ti_;
  Pattern pat_ = Pattern::Move;
  ridgeDataType_t dtype_ = ridgeFloat;
  ridgeRedOp_t op_ = ridgeSum;
  int root_ = 0;
  int rank_ = 0, nranks_ = 1;
  char* sendBase_ = nullptr;  // allocations; send_ and recv_ are -u elements past them
  char* recvBase_ = nullptr;
  char* dsendBase_ = nullptr;
  char* drecvBase_ = nullptr;
  char* send_ = nullptr;  // host buffers: every variant's inputs are made and checked here
  char* recv_ = nullptr;
  char* dsend_ = nullptr;  // device buffers of the variants that run on the GPU
  char* drecv_ = nullptr;
  size_t allocBytes_ = 0;
  void* ridgeStream_ = nullptr;  // --ridge-buffers device: Ridge's calls go on this stream
  bool ownRidgeStream_ = false;
  std::vector<void*> regHandles_;  // -R: what ridgeCommRegister returned
  DeregisterFn deregisterFn_ = nullptr;
  MemFreeFn memFreeFn_ = nullptr;  // set when the host buffers came from ridgeMemAlloc (-R 2)
  FILE* out_ = stdout;
  double copiedGBs_ = 0, trafficGBs_ = 0;
  std::string startDate_;  // ISO 8601 UTC, when the run started
  std::string host_;
};

void Bench::select(ridgeDataType_t t, ridgeRedOp_t op, int root) {
  dtype_ = t;
  op_ = op;
  root_ = root;
  ti_ = &typeInfo(t);
  pat_ = patternFor(o_.coll, op);
  // -u: the buffers start that many elements past the (page-aligned) allocation.
  const size_t skew = size_t(o_.unalign) * ti_->size;
  if (sendBase_) send_ = sendBase_ + skew, recv_ = recvBase_ + skew;
  if (dsendBase_) dsend_ = dsendBase_ + skew, drecv_ = drecvBase_ + skew;
}

void Bench::combineTimes(double* v, size_t n) {
  switch (o_.average) {
    case 0:  // rank 0's: the others add zeros
      if (rank_ != 0) std::fill(v, v + n, 0.0);
      allreduceDoubles(v, n, ridgeSum);
      break;
    case 1:
      allreduceDoubles(v, n, ridgeSum);
      for (size_t i = 0; i < n; ++i) v[i] /= nranks_;
      break;
    case 2: allreduceDoubles(v, n, ridgeMin); break;
    default: allreduceDoubles(v, n, ridgeMax); break;
  }
}

// Sizes from -b to -e, rounded down to whole elements (and, for the collectives whose size
// is the total over ranks, to whole per-rank blocks); duplicates after rounding are dropped.
// A sweep below one block still gets one row of the smallest possible size.
std::vector<size_t> Bench::sizes() const {
  const bool perRankBlocks =
      o_.coll == Coll::AllGather || o_.coll == Coll::ReduceScatter || o_.coll == Coll::AlltoAll;
  const size_t unit = ti_->size * (perRankBlocks ? size_t(nranks_) : 1);
  std::vector<size_t> out;
  size_t s = o_.minBytes;
  while (s <= o_.maxBytes) {
    size_t adj = std::max(unit, s / unit * unit);
    if ((adj <= o_.maxBytes || out.empty()) && (out.empty() || adj != out.back())) out.push_back(adj);
    size_t next;
    if (o_.increment) {
      next = s + o_.increment;
    } else {
      double d = std::floor(double(s) * o_.factor);
      next = d >= double(SIZE_MAX) ? SIZE_MAX : size_t(d);
    }
    if (next <= s) next = s + 1;
    if (next < s) break;  // overflow
    s = next;
  }
  if (out.empty()) out.push_back(unit);
  return out;
}

void Bench::allocate(size_t bytes) {
  // -u skews the start by up to 4096 elements of at most 8 bytes.
  size_t b = (std::max<size_t>(bytes, 64) + size_t(o_.unalign) * 8 + 4095) / 4096 * 4096;
  sendBase_ = allocateHost(b);
  recvBase_ = allocateHost(b);
  if (!sendBase_ || !recvBase_)
    fatal(comm_, "cannot allocate two buffers of " + std::to_string(b) + " bytes");
  std::memset(sendBase_, 0, b);  // fault the pages in before timing
  std::memset(recvBase_, 0, b);
  allocBytes_ = b;
  if (info_.ncclPeer || o_.ridgeOnDevice) {
    std::string err;
    dsendBase_ = static_cast<char*>(deviceAlloc(b, &err));
    drecvBase_ = dsendBase_ ? static_cast<char*>(deviceAlloc(b, &err)) : nullptr;
    if (!drecvBase_) fatal(comm_, "device buffers of " + std::to_string(b) + " bytes: " + err);
    if (o_.ridgeOnDevice && !o_.streamNull) {
      if (!(ridgeStream_ = streamCreate(&err))) fatal(comm_, err);
      ownRidgeStream_ = true;  // -y 1 leaves it null: the legacy default stream
    }
    if (info_.ncclPeer && o_.streamNull) ncclUseNullStream();
  }
  select(dtype_, op_, root_);
  registerBuffers();
}

// A host buffer of `bytes`: from ridgeMemAlloc with -R 2 (symmetric, as nccl-tests allocates
// with ncclMemAlloc there) where Ridge's calls use host buffers and the library has it and no
// device (its host memory is shareable: a peer on this host maps it and copies with plain loads
// and stores, issue 21); posix_memalign otherwise. The peer library's variant uses the same
// buffers, so both libraries get the same memory.
char* Bench::allocateHost(size_t bytes) {
  int dev = -1;
  auto memAlloc = reinterpret_cast<MemAllocFn>(dlsym(RTLD_DEFAULT, "ridgeMemAlloc"));
  auto memFree = reinterpret_cast<MemFreeFn>(dlsym(RTLD_DEFAULT, "ridgeMemFree"));
  if (o_.localRegister == 2 && !o_.ridgeOnDevice && memAlloc && memFree &&
      ridgeCommCuDevice(comm_, &dev) == ridgeSuccess && dev < 0) {
    void* p = nullptr;
    check(memAlloc(&p, bytes), "ridgeMemAlloc (-R 2)");
    memFreeFn_ = memFree;
    return static_cast<char*>(p);
  }
  void* p = nullptr;
  return posix_memalign(&p, 4096, bytes) == 0 ? static_cast<char*>(p) : nullptr;
}

// -R 1/2: Ridge's buffers registered once, before any timing, when the library has
// ridgeCommRegister; otherwise the header says the option changed nothing.
void Bench::registerBuffers() {
  if (!o_.localRegister) return;
  auto reg = reinterpret_cast<RegisterFn>(dlsym(RTLD_DEFAULT, "ridgeCommRegister"));
  deregisterFn_ = reinterpret_cast<DeregisterFn>(dlsym(RTLD_DEFAULT, "ridgeCommDeregister"));
  if (!reg || !deregisterFn_) return;
  char* s = o_.ridgeOnDevice ? dsendBase_ : sendBase_;
  char* r = o_.ridgeOnDevice ? drecvBase_ : recvBase_;
  for (char* buf : {s, r}) {
    void* handle = nullptr;
    check(reg(comm_, buf, allocBytes_, &handle), "ridgeCommRegister (-R)");
    regHandles_.push_back(handle);
  }
}

void Bench::deregister() {
  for (void* h : regHandles_)
    if (deregisterFn_) deregisterFn_(comm_, h);
  regHandles_.clear();
}

void Bench::upload(size_t n) {
  std::string err;
  const size_t b = extentBytes(n);
  if (!copyToDevice(dsend_, send_, b, &err) || !copyToDevice(drecv_, recv_, b, &err)) fatal(comm_, err);
}

void Bench::download(size_t n) {
  std::string err;
  if (!copyToHost(recv_, drecv_, extentBytes(n), &err)) fatal(comm_, err);
}

void Bench::streamWait(int v) {
  std::string err;
  if (onDevice(v) && !streamSync(streamOf(v), &err)) fatal(comm_, err);
}

// Comma-separated names of what -d / -o run.
std::string typeList(const Options& o) {
  std::string s;
  for (auto t : o.dtypes) s += (s.empty() ? "" : ",") + std::string(typeInfo(t).name);
  return s;
}
std::string opList(const Options& o) {
  if (!collHasOp(o.coll)) return "none";
  std::string s;
  for (auto op : o.ops) s += (s.empty() ? "" : ",") + std::string(opName(op));
  return s;
}
std::string stepText(const Options& o) {
  char b[64];
  if (o.increment)
    std::snprintf(b, sizeof b, "%zu(bytes)", o.increment);
  else
    std::snprintf(b, sizeof b, "%g(factor)", o.factor);
  return b;
}

void Bench::printHeader() {
  if (rank_ != 0) return;
  std::fprintf(out_, "# %s\n", versionLine().c_str());
  std::fprintf(out_, "# Collective test starting: ridge-bench %s on %s at %s\n", collName(o_.coll),
               host_.c_str(), startDate_.c_str());
  // nccl-tests' settings line, with its names, then ridge-bench's own.
  std::fprintf(
      out_,
      "# nThread %d nGpus %d minBytes %zu maxBytes %zu step: %s warmup iters: %d iters: %d agg iters: "
      "%d validation: %d graph: %d unalign: %d\n",
      o_.nthreads, o_.ngpus, o_.minBytes, o_.maxBytes, stepText(o_).c_str(), o_.warmup, o_.iters, o_.aggIters,
      o_.checkIters, o_.graphLaunches, o_.unalign);
  static const char* const kAverage[] = {"rank 0's", "the mean over ranks", "the min over ranks",
                                         "the max over ranks"};
  std::fprintf(out_,
               "# nranks %d, types %s, ops %s, root %s, run cycles %d, time: %s (-a %d), launch %s, peer %s, "
               "algo %s\n",
               nranks_, typeList(o_).c_str(), opList(o_).c_str(),
               !collHasRoot(o_.coll) ? "none"
               : o_.root < 0         ? "all"
                                     : std::to_string(o_.root).c_str(),
               o_.runCycles, kAverage[o_.average], o_.average, info_.launch.c_str(),
               hasPeer() ? peerKey() : "none", o_.algo.empty() ? "default" : o_.algo.c_str());
  if (o_.blocking == 1) std::fprintf(out_, "# Blocking Enabled: wait and barrier after each call (-z 1)\n");
  if (o_.blocking == 2) std::fprintf(out_, "# Blocking Enabled: wait after each call, no barrier (-z 2)\n");
  if (o_.blocking == 3)
    std::fprintf(
        out_,
        "# Blocking Enabled: wait and barrier after each iteration (-n); time excludes barrier (-z 3)\n");
  if (o_.aggIters > 1)
    std::fprintf(
        out_, "# -m %d: each timed iteration is %d calls in one ridgeGroupStart/End%s\n", o_.aggIters,
        o_.aggIters,
        hasPeer() && !info_.ncclPeer
            ? std::string("; " + std::string(peerName()) + " has no groups: its calls run one by one").c_str()
            : "");
  if (o_.perIterTiming)
    std::fprintf(
        out_, "# Per-Iteration Report: host clock around each iteration; i_* use the max over ranks%s\n",
        o_.perIterSkip ? ("; the first " + std::to_string(o_.perIterSkip) + " skipped").c_str() : "");
  if (o_.reportCputime)
    std::fprintf(out_,
                 "# -C 1: cputime = host time until the last call returned, before the final stream wait\n");
  if (o_.localRegister) {
    if (regHandles_.empty())
      std::fprintf(out_,
                   "# -R %d: no effect: this Ridge library has no ridgeCommRegister, so the buffers are not "
                   "registered\n",
                   o_.localRegister);
    else
      std::fprintf(out_, "# -R %d: send and receive buffers %sregistered with ridgeCommRegister%s\n",
                   o_.localRegister,
                   memFreeFn_ ? "from ridgeMemAlloc (host memory that peers of this host map), " : "",
                   o_.localRegister == 2 && !memFreeFn_ ? " (Ridge has no symmetric windows: local)" : "");
  }
  if (o_.streamNull && !o_.ridgeOnDevice && !info_.ncclPeer)
    std::fprintf(out_, "# -y 1: no effect: host buffers run on no stream\n");
  for (const std::string& note : o_.notes) std::fprintf(out_, "# %s\n", note.c_str());
  for (const std::string& note : info_.transport.notes) std::fprintf(out_, "# %s\n", note.c_str());
  for (const std::string& note : info_.gdr.notes) std::fprintf(out_, "# %s\n", note.c_str());
  if (info_.ncclPeer || o_.ridgeOnDevice)
    std::fprintf(out_,
                 "# buffers: Ridge on %s memory (--ridge-buffers %s)%s%s; GPU %d per rank = local rank\n",
                 o_.ridgeOnDevice ? "device" : "host", o_.ridgeOnDevice ? "device" : "host",
                 info_.ncclPeer ? ", NCCL on device memory, NCCL " : "",
                 info_.ncclPeer ? ncclVersionText().c_str() : "", info_.device);
  if (checking())
    std::fprintf(out_,
                 "# check: inputs refilled and outputs poisoned (NaN for floating types, 0xA5 "
                 "bytes for integers) before a call ahead of the timed loop and before each of %d "
                 "call%s after it (-c); #wrong counts differing elements\n",
                 o_.checkIters, o_.checkIters == 1 ? "" : "s");
}

// Each rank's host and pid, gathered with one uint8 sum allreduce: every rank writes its
// text into its own 64-byte slot and zeros elsewhere, so the sum is the concatenation.
void Bench::printRanks() {
  constexpr size_t kSlot = 96;
  std::vector<uint8_t> slots(kSlot * size_t(nranks_), 0);
  char host[64] = "?";
  gethostname(host, sizeof host - 1);
  std::snprintf(reinterpret_cast<char*>(&slots[kSlot * size_t(rank_)]), kSlot, "#   rank %3d: pid %7d on %s",
                rank_, int(getpid()), host);
  check(ridgeAllReduce(slots.data(), slots.data(), slots.size(), ridgeUint8, ridgeSum, comm_, nullptr),
        "ridgeAllReduce (rank table)");
  if (rank_ != 0) return;
  for (int r = 0; r < nranks_; ++r) {
    const char* s = reinterpret_cast<const char*>(&slots[kSlot * size_t(r)]);
    std::fprintf(out_, "%.*s\n", int(strnlen(s, kSlot)), s);
  }
}

/*
 * Memory-bandwidth bound (allreduce first; the others below).
 *
 * On one node every byte a collective moves goes through the same memory system, so the
 * copy bandwidth of all ranks copying at once bounds what any algorithm can reach. For an
 * allreduce of S bytes per rank on N ranks:
 *   - the N inputs (N*S bytes in all) must each be read from memory at least once, by
 *     whichever rank reduces them;
 *   - each of the N ranks must end with S bytes of result in its own output buffer, so at
 *     least N*S bytes are written.
 * Total traffic is therefore at least 2*N*S bytes across the node. With T the node's
 * traffic bandwidth (bytes read plus bytes written per second, measured below as twice the
 * aggregate memcpy rate), the time is at least 2*N*S / T, so
 *   algbw = S / time <= T / (2*N),
 * and bound% = algbw / (T / (2*N)) * 100 says how close the run is to that ceiling. It is a
 * lower bound on traffic for an ideal single-copy fused algorithm; a copy-in/copy-out
 * algorithm moves several times more and cannot come near 100%.
 *
 * The other collectives get their own least traffic per byte of size (boundTrafficFactor,
 * bench/options.cpp): reduce and reducescatter read every input once and write the result
 * once (N+1); the copy collectives copy every output byte once (2N), which is what a
 * single-copy algorithm (CMA straight into the output) does and what memcpy's rate measures.
 */
void Bench::measureMemory() {
  constexpr size_t kBytes = size_t(64) << 20;
  constexpr int kReps = 5;
  void* a = nullptr;
  void* b = nullptr;
  if (posix_memalign(&a, 4096, kBytes) != 0 || posix_memalign(&b, 4096, kBytes) != 0)
    fatal(comm_, "cannot allocate the 64 MiB memory-bandwidth buffers");
  std::memset(a, 1, kBytes);
  std::memset(b, 2, kBytes);
  double best = 1e30;
  for (int rep = 0; rep < kReps; ++rep) {
    barrier();
    double t0 = nowSec();
    std::memcpy(b, a, kBytes);
    double t = nowSec() - t0;
    // Keep the copy from being optimised away.
    if (static_cast<volatile char*>(b)[kBytes / 2] != 1) t += 0;
    allreduceDoubles(&t, 1, ridgeMax);
    best = std::min(best, t);
  }
  std::free(a);
  std::free(b);
  copiedGBs_ = double(kBytes) * nranks_ / best / 1e9;
  trafficGBs_ = 2.0 * copiedGBs_;
  if (rank_ != 0) return;
  std::fprintf(out_,
               "# Memory bandwidth (all %d ranks copying at once): %.2f GB/s copied, %.2f GB/s "
               "traffic\n",
               nranks_, copiedGBs_, trafficGBs_);
  const bool reduces = o_.coll == Coll::Reduce || o_.coll == Coll::ReduceScatter;
  std::fprintf(out_,
               "# bound%%: %s, so traffic >= %g*size across the node; algbw <= traffic/%g = %.2f GB/s "
               "here; bound%% = Ridge out-of-place algbw / that * 100 (sizes that fit in cache can "
               "exceed 100%%)\n",
               o_.coll == Coll::AllReduce
                   ? "each of N ranks' inputs is read once and each output written once"
               : reduces ? "every input byte is read once and the result written once"
                         : "every output byte is copied once (read and written)",
               boundTrafficFactor(o_.coll, nranks_), boundTrafficFactor(o_.coll, nranks_), boundGBs());
}

// ---- buffers, calls and checks ----------------------------------------------------------
// Layouts (n = the call's count argument, N ranks, r = this rank):
//   allreduce, reduce, sendrecv: n elements in, n out; in place: recv is both.
//   broadcast: root's n elements in; in place: root's recv holds them.
//   allgather: n in, N*n out; in place: the input is block r of recv.
//   reducescatter: N*n in, n out; in place: recv holds the N*n input (Ridge leaves the result
//     at block r, MPI at the start).
//   alltoall: N*n in, N*n out.
void Bench::prepare(bool inPlace, size_t n) {
  const size_t ts = ti_->size;
  const size_t N = size_t(nranks_);
  auto fill = [&](char* base, size_t elemOff, size_t cnt, int src, uint64_t g0) {
    fillPattern(dtype_, pat_, base + elemOff * ts, cnt, src, g0);
  };
  switch (o_.coll) {
    case Coll::AllReduce:
    case Coll::Reduce:
    case Coll::SendRecv:
      if (inPlace) {
        fill(recv_, 0, n, rank_, 0);
      } else {
        fill(send_, 0, n, rank_, 0);
        poison(dtype_, recv_, n * ts);
      }
      break;
    case Coll::AlltoAll:
    case Coll::ReduceScatter:
      if (inPlace) {
        fill(recv_, 0, N * n, rank_, 0);
      } else {
        fill(send_, 0, N * n, rank_, 0);
        poison(dtype_, recv_, (o_.coll == Coll::AlltoAll ? N * n : n) * ts);
      }
      break;
    case Coll::Broadcast:
      if (rank_ == root_) fill(inPlace ? recv_ : send_, 0, n, root_, 0);
      if (!inPlace || rank_ != root_) poison(dtype_, recv_, n * ts);
      break;
    case Coll::AllGather:
      poison(dtype_, recv_, N * n * ts);
      fill(inPlace ? recv_ : send_, inPlace ? size_t(rank_) * n : 0, n, rank_, uint64_t(rank_) * n);
      break;
  }
}

uint64_t Bench::checkOutput(bool inPlace, bool mpi, size_t n) {
  const size_t N = size_t(nranks_);
  ExpectMap m;
  const char* out = recv_;
  size_t cnt = n;
  switch (o_.coll) {
    case Coll::AllReduce: m.reduction = true; break;
    case Coll::Reduce:
      if (rank_ != root_) return 0;  // recvbuff is only written on the root
      m.reduction = true;
      break;
    case Coll::Broadcast:
      if (mpi && !inPlace && rank_ == root_) return 0;  // MPI's root receives nothing
      m.src = root_;
      break;
    case Coll::AllGather:
      cnt = N * n;
      m.block = n;
      break;
    case Coll::ReduceScatter:
      m.reduction = true;
      m.gBase = uint64_t(rank_) * n;
      if (inPlace && !mpi) out = recv_ + size_t(rank_) * n * ti_->size;
      break;
    case Coll::AlltoAll:
      cnt = N * n;
      m.block = n;
      m.blockLocal = true;
      m.gBase = uint64_t(rank_) * n;
      break;
    case Coll::SendRecv: m.src = (rank_ + nranks_ - 1) % nranks_; break;
  }
  return countWrong(dtype_, pat_, op_, nranks_, out, cnt, m);
}

ridgeResult_t Bench::ridgeCall(bool inPlace, size_t n) {
  const size_t ts = ti_->size;
  char* s = o_.ridgeOnDevice ? dsend_ : send_;
  char* r = o_.ridgeOnDevice ? drecv_ : recv_;
  const ridgeDataType_t dt = dtype_;
  ridgeStream_t st = static_cast<ridgeStream_t>(ridgeStream_);
  switch (o_.coll) {
    case Coll::AllReduce: return ridgeAllReduce(inPlace ? r : s, r, n, dt, op_, comm_, st);
    case Coll::Broadcast: return ridgeBroadcast(inPlace ? r : s, r, n, dt, root_, comm_, st);
    case Coll::Reduce: return ridgeReduce(inPlace ? r : s, r, n, dt, op_, root_, comm_, st);
    case Coll::AllGather:
      return ridgeAllGather(inPlace ? r + size_t(rank_) * n * ts : s, r, n, dt, comm_, st);
    case Coll::ReduceScatter:
      if (inPlace) return ridgeReduceScatter(r, r + size_t(rank_) * n * ts, n, dt, op_, comm_, st);
      return ridgeReduceScatter(s, r, n, dt, op_, comm_, st);
    case Coll::AlltoAll: return ridgeAlltoAll(inPlace ? r : s, r, n, dt, comm_, st);
    case Coll::SendRecv: {
      // Ring shift in one group: send to rank+1, receive from rank-1.
      ridgeResult_t res[4];
      res[0] = ridgeGroupStart();
      res[1] = ridgeSend(s, n, dt, (rank_ + 1) % nranks_, comm_, st);
      res[2] = ridgeRecv(r, n, dt, (rank_ + nranks_ - 1) % nranks_, comm_, st);
      res[3] = res[0] == ridgeSuccess ? ridgeGroupEnd() : ridgeSuccess;
      for (auto x : res)
        if (x != ridgeSuccess) return x;
      return ridgeSuccess;
    }
  }
  return ridgeInvalidArgument;
}

void Bench::mpiCall(bool inPlace, size_t n) {
  std::string err;
  int rc = info_.ncclPeer
               ? ncclCollective(o_.coll, inPlace, dsend_, drecv_, n, dtype_, op_, root_, rank_, nranks_, &err)
           : info_.glooPeer
               ? glooCollective(o_.coll, inPlace, send_, recv_, n, dtype_, op_, root_, rank_, nranks_, &err)
               : mpiCollective(o_.coll, inPlace, send_, recv_, n, dtype_, op_, root_, rank_, nranks_, &err);
  if (rc != 0) fatal(comm_, std::string(peerName()) + " " + collName(o_.coll) + " failed: " + err);
}

static const char* callName(Coll c) {
  switch (c) {
    case Coll::AllReduce: return "ridgeAllReduce";
    case Coll::Broadcast: return "ridgeBroadcast";
    case Coll::Reduce: return "ridgeReduce";
    case Coll::AllGather: return "ridgeAllGather";
    case Coll::ReduceScatter: return "ridgeReduceScatter";
    case Coll::AlltoAll: return "ridgeAlltoAll";
    case Coll::SendRecv: return "ridgeSend/ridgeRecv group";
  }
  return "?";
}

void Bench::runVariant(Row& row, int v, std::vector<double>* iterSec) {
  const bool inPlace = (v & 1) != 0;
  const bool peer = v >= kMpiOop;
  const size_t n = row.n;
  auto call = [&] {
    if (peer) {
      mpiCall(inPlace, n);
    } else {
      ridgeResult_t r = ridgeCall(inPlace, n);
      if (r != ridgeSuccess) {
        std::string what = std::string(callName(o_.coll)) + " (" + std::to_string(row.bytes) + " bytes, " +
                           (inPlace ? "in-place" : "out-of-place") + ")";
        check(r, what.c_str());
      }
    }
  };
  // -m: the calls of one iteration in one group, where the library has groups (MPI and Gloo
  // have none: their calls run one by one).
  auto group = [&](bool start) {
    if (o_.aggIters <= 1) return;
    if (!peer) {
      check(start ? ridgeGroupStart() : ridgeGroupEnd(),
            start ? "ridgeGroupStart (-m)" : "ridgeGroupEnd (-m)");
    } else if (info_.ncclPeer) {
      if (int rc = ncclGroup(start); rc != 0) fatal(comm_, "NCCL group (-m) failed: " + std::to_string(rc));
    }
  };
  // The library's own barrier for its variants; NCCL's ranks use Ridge's (host) barrier.
  auto libBarrier = [&] {
    if (peer && info_.glooPeer)
      glooBarrier();
    else if (peer && info_.mpiPeer)
      mpiBarrier();
    else
      barrier();
  };
  auto sync = [&] {
    streamWait(v);
    libBarrier();
  };
  // One timed iteration: -m calls, then what -z 1 and 2 add after them.
  auto iteration = [&] {
    group(true);
    for (int a = 0; a < o_.aggIters; ++a) call();
    group(false);
    if (o_.blocking == 1 || o_.blocking == 2) {
      streamWait(v);
      if (o_.blocking == 1) libBarrier();
    }
  };
  // MPI and Gloo leave some results where Ridge's layout does not; NCCL's layouts are Ridge's.
  const bool peerLayout = peer && !info_.ncclPeer;
  auto checked = [&] {
    prepare(inPlace, n);
    if (onDevice(v)) upload(n);
    call();
    if (onDevice(v)) {
      streamWait(v);
      download(n);
    }
    return checkOutput(inPlace, peerLayout, n);
  };
  uint64_t bad = 0;
  if (checking()) bad += checked();
  sync();
  for (int i = 0; i < o_.warmup; ++i) iteration();
  sync();
  const double calls = double(o_.iters) * o_.aggIters;
  double t = 0, cpu = 0;
  if (o_.graphLaunches > 0) {
    // -G: the timed iterations captured once as a CUDA graph, the graph launched -G times.
    std::string err, refused;
    void* stream = streamOf(v);
    if (!graphBegin(stream, &err)) fatal(comm_, err);
    for (int it = 0; it < o_.iters && refused.empty(); ++it) {
      if (peer) {
        iteration();
        continue;
      }
      // Ridge may refuse a capturing stream: say so in the row instead of ending the run.
      ridgeResult_t r = o_.aggIters > 1 ? ridgeGroupStart() : ridgeSuccess;
      for (int a = 0; a < o_.aggIters && r == ridgeSuccess; ++a) r = ridgeCall(inPlace, n);
      if (o_.aggIters > 1) {
        ridgeResult_t e = ridgeGroupEnd();
        if (r == ridgeSuccess) r = e;
      }
      if (r != ridgeSuccess) refused = ridgeError(r);
    }
    void* exec = graphEnd(stream, !refused.empty(), &err);
    double anyRefused = refused.empty() ? 0.0 : 1.0;  // every rank takes the same way out
    allreduceDoubles(&anyRefused, 1, ridgeMax);
    if (anyRefused > 0) {
      graphDestroy(exec);
      row.avail[v] = false;
      row.why[v] =
          "Ridge refuses CUDA graph capture (-G): " + (refused.empty() ? "on another rank" : refused);
      return;
    }
    if (!exec) fatal(comm_, "CUDA graph (-G): " + err);
    sync();
    const double t0 = nowSec();
    for (int l = 0; l < o_.graphLaunches; ++l)
      if (!graphLaunch(exec, stream, &err)) fatal(comm_, err);
    cpu = nowSec() - t0;
    streamWait(v);
    t = nowSec() - t0;
    graphDestroy(exec);
    t /= o_.graphLaunches;
    cpu /= o_.graphLaunches;
  } else {
    double collOnly = 0;  // -z 3: the iterations without their barriers
    const bool perIteration = o_.blocking == 3 || iterSec;
    const double t0 = nowSec();
    for (int it = 0; it < o_.iters; ++it) {
      const double i0 = perIteration ? nowSec() : 0.0;
      iteration();
      if (perIteration) {
        streamWait(v);  // device calls only enqueue: an iteration ends when its stream has run it
        const double d = nowSec() - i0;
        if (iterSec) (*iterSec)[size_t(it)] = d / o_.aggIters;
        if (o_.blocking == 3) {
          collOnly += d;
          libBarrier();
        }
      }
    }
    cpu = o_.blocking == 3 ? collOnly : nowSec() - t0;
    streamWait(v);  // the time ends when the stream has run the calls, as nccl-tests times them
    t = o_.blocking == 3 ? collOnly : nowSec() - t0;
  }
  // Every rank makes the same number of checked calls: no early exit on a wrong one.
  for (int c = 0; c < o_.checkIters; ++c) bad += checked();
  // Paced by a scaled PCIe model: the modeled time is the measured one divided back.
  const double scale = peer ? 1 : info_.gdr.paceScale;
  row.timeUs[v] = t / calls * 1e6 / scale;
  row.cpuUs[v] = cpu / calls * 1e6 / scale;
  row.wrong[v] = double(bad);
}

// ---- report --------------------------------------------------------------------------------
namespace fmt {
std::string num(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}
// A number in `width` characters, as many decimals as fit (2, 1, 0), else in e-notation.
std::string fit(double v, int width) {
  char b[64];
  for (int decimals = 2; decimals >= 0; --decimals)
    if (std::snprintf(b, sizeof b, "%*.*f", width, decimals, v) <= width) return b;
  std::snprintf(b, sizeof b, width >= 7 ? "%*.1e" : "%*.0e", width, v);
  return b;
}
}  // namespace fmt

// nccl-tests' column widths: size count type redop root, then per placement
// time algbw busbw #wrong, each column two spaces from the last.
constexpr const char* kPrefixFmt = "%12s  %12s  %8s  %6s  %6s";
constexpr const char* kGroupFmt = "  %7s  %6s  %6s  %6s";
constexpr const char* kIterFmt = "  %7s  %7s  %7s  %7s";  // -I: i_min i_max i_p99 i_cv%
constexpr const char* kExtraFmt = "  %7s";                // bound%, ratio

std::string formatNow(bool iso) {
  char b[64];
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  if (iso) {
    gmtime_r(&now, &tm);
    std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  } else {
    localtime_r(&now, &tm);
    std::strftime(b, sizeof b, "%Y-%m-%d %H:%M:%S", &tm);
  }
  return b;
}

void Bench::printColumns() {
  if (rank_ != 0) return;
  std::string l1, l2, l3;
  char b[256];
  std::snprintf(b, sizeof b, kPrefixFmt, "", "", "", "", "");
  l1 = b;
  std::snprintf(b, sizeof b, kPrefixFmt, "size", "count", "type", "redop", "root");
  l2 = b;
  std::snprintf(b, sizeof b, kPrefixFmt, "(B)", "(elements)", "", "", "");
  l3 = b;
  for (std::string* l : {&l1, &l2, &l3}) *l = "# " + l->substr(2);  // "#" in the first column, as nccl-tests
  const char* timeName = o_.reportCputime ? "cputime" : "time";
  auto group = [&](const std::string& title) {
    std::snprintf(b, sizeof b, kGroupFmt, "", "", "", "");
    std::string g(b);
    std::string ti, tu;
    if (o_.perIterTiming) {
      std::snprintf(b, sizeof b, kIterFmt, "", "", "", "");
      g += b;
    }
    // The title centred over its columns.
    const size_t pad = g.size() > title.size() + 2 ? (g.size() - title.size()) / 2 + 1 : 2;
    g.replace(pad, std::min(title.size(), g.size() - pad), title.substr(0, g.size() - pad));
    l1 += g;
    std::snprintf(b, sizeof b, kGroupFmt, timeName, "algbw", "busbw", "#wrong");
    l2 += b;
    std::snprintf(b, sizeof b, kGroupFmt, "(us)", "(GB/s)", "(GB/s)", "");
    l3 += b;
    if (o_.perIterTiming) {
      std::snprintf(b, sizeof b, kIterFmt, "i_min", "i_max", "i_p99", "i_cv%");
      l2 += b;
      std::snprintf(b, sizeof b, kIterFmt, "(us)", "(us)", "(us)", "(%)");
      l3 += b;
    }
  };
  auto single = [&](const char* name, const char* unit) {
    std::snprintf(b, sizeof b, kExtraFmt, "");
    l1 += b;
    std::snprintf(b, sizeof b, kExtraFmt, name);
    l2 += b;
    std::snprintf(b, sizeof b, kExtraFmt, unit);
    l3 += b;
  };
  const bool modeled = info_.gdr.modeled;
  group(placement(kRidgeOop, hasPeer() ? (modeled ? "modeled oop" : "out-of-place")
                                       : (modeled ? "modeled out-of-place" : "out-of-place")));
  group(placement(kRidgeIp, modeled ? (hasPeer() ? "modeled ip" : "modeled in-place") : "in-place"));
  if (hasBound()) single("bound%", "(%)");
  if (hasPeer()) {
    group(placement(kMpiOop, "out-of-place"));
    group(placement(kMpiIp, "in-place"));
    single("ratio", (std::string("R/") + peerName()).c_str());
  }
  if (o_.reportTimestamps) {
    std::snprintf(b, sizeof b, " %21s", "timestamp");
    l2 += b;
    std::snprintf(b, sizeof b, " %21s", "(local time)");
    l3 += b;
  }
  std::fprintf(out_, "#\n%s\n%s\n%s\n", l1.c_str(), l2.c_str(), l3.c_str());
}

void Bench::printRow(const Row& r) {
  if (rank_ != 0) return;
  char b[256];
  std::snprintf(b, sizeof b, kPrefixFmt, std::to_string(r.bytes).c_str(), std::to_string(r.count).c_str(),
                typeInfo(r.dtype).name, opText(r), std::to_string(r.root).c_str());
  std::string line = b;
  auto group = [&](int v) {
    if (!r.avail[v]) {
      std::snprintf(b, sizeof b, kGroupFmt, "n/a", "n/a", "n/a", "n/a");
      line += b;
      if (o_.perIterTiming) {
        std::snprintf(b, sizeof b, kIterFmt, "n/a", "n/a", "n/a", "n/a");
        line += b;
      }
      return;
    }
    std::string w = checking() ? fmt::num("%.0f", r.wrong[v]) : "N/A";
    const double us = o_.reportCputime ? r.cpuUs[v] : r.timeUs[v];
    std::snprintf(b, sizeof b, kGroupFmt, fmt::fit(us, 7).c_str(), fmt::fit(algbw(r, v), 6).c_str(),
                  fmt::fit(busbw(r, v), 6).c_str(), w.c_str());
    line += b;
    if (o_.perIterTiming) {
      const IterStats& s = r.iter[v];
      std::snprintf(b, sizeof b, kIterFmt, fmt::fit(s.minUs, 7).c_str(), fmt::fit(s.maxUs, 7).c_str(),
                    fmt::fit(s.p99Us, 7).c_str(), fmt::fit(s.cvPct, 7).c_str());
      line += b;
    }
  };
  group(kRidgeOop);
  group(kRidgeIp);
  if (hasBound()) {
    std::snprintf(b, sizeof b, kExtraFmt, fmt::fit(boundPct(r), 7).c_str());
    line += b;
  }
  if (hasPeer()) {
    group(kMpiOop);
    group(kMpiIp);
    std::snprintf(b, sizeof b, kExtraFmt, hasRatio(r) ? fmt::fit(ratio(r), 7).c_str() : "n/a");
    line += b;
  }
  if (o_.reportTimestamps)
    line += " " + std::string(21 - std::min<size_t>(21, r.stamp.size()), ' ') + r.stamp;
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

// One machine-readable record: (column, JSON literal or nullopt for n/a).
std::vector<std::pair<std::string, std::optional<std::string>>> Bench::record(const Row& r) const {
  std::vector<std::pair<std::string, std::optional<std::string>>> rec;
  auto str = [](const std::string& s) { return std::optional<std::string>("\"" + s + "\""); };
  auto num = [](double v) { return std::optional<std::string>(fmt::num("%.6g", v)); };
  rec.emplace_back("collective", str(collName(o_.coll)));
  rec.emplace_back("nranks", num(nranks_));
  rec.emplace_back("size", std::to_string(r.bytes));
  rec.emplace_back("count", std::to_string(r.count));
  rec.emplace_back("type", str(typeInfo(r.dtype).name));
  rec.emplace_back("redop", str(opText(r)));
  rec.emplace_back("root", num(r.root));
  auto group = [&](const std::string& pre, int v) {
    bool a = r.avail[v];
    rec.emplace_back(pre + "time_us", a ? num(r.timeUs[v]) : std::nullopt);
    rec.emplace_back(pre + "algbw", a ? num(algbw(r, v)) : std::nullopt);
    rec.emplace_back(pre + "busbw", a ? num(busbw(r, v)) : std::nullopt);
    rec.emplace_back(pre + "wrong", a && checking() ? num(r.wrong[v]) : std::nullopt);
    if (o_.reportCputime) rec.emplace_back(pre + "cputime_us", a ? num(r.cpuUs[v]) : std::nullopt);
    if (o_.perIterTiming) {
      rec.emplace_back(pre + "i_min_us", a ? num(r.iter[v].minUs) : std::nullopt);
      rec.emplace_back(pre + "i_max_us", a ? num(r.iter[v].maxUs) : std::nullopt);
      rec.emplace_back(pre + "i_p99_us", a ? num(r.iter[v].p99Us) : std::nullopt);
      rec.emplace_back(pre + "i_cv_pct", a ? num(r.iter[v].cvPct) : std::nullopt);
    }
  };
  group("", kRidgeOop);
  group("ip_", kRidgeIp);
  rec.emplace_back("bound_pct", hasBound() ? num(boundPct(r)) : std::nullopt);
  if (hasPeer()) {
    group(std::string(peerKey()) + "_", kMpiOop);
    group(std::string(peerKey()) + "_ip_", kMpiIp);
    rec.emplace_back("ratio", hasRatio(r) ? num(ratio(r)) : std::nullopt);
  }
  rec.emplace_back("cycle", num(r.cycle));
  if (o_.reportTimestamps) rec.emplace_back("timestamp", str(r.stamp));
  return rec;
}

FILE* openOutput(const std::string& path) {
  if (path == "-") return stdout;
  return std::fopen(path.c_str(), "w");
}

std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + "\"";
}

// The RIDGE_* and NCCL_* variables of the environment: settings the library reads.
std::vector<std::pair<std::string, std::string>> librarySettings() {
  std::vector<std::pair<std::string, std::string>> out;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    if (kv.rfind("RIDGE_", 0) == 0 || kv.rfind("NCCL_", 0) == 0)
      out.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  std::sort(out.begin(), out.end());
  return out;
}

void Bench::writeMachineReadable(const std::vector<Row>& rows, double avgBus, double avgRatio) {
  if (rank_ != 0) return;
  int lib = 0;
  ridgeGetVersion(&lib);
  const std::string libVersion =
      std::to_string(lib / 10000) + "." + std::to_string(lib / 100 % 100) + "." + std::to_string(lib % 100);
  if (!o_.jsonPath.empty()) {
    FILE* f = openOutput(o_.jsonPath);
    if (!f) {
      std::fprintf(stderr, "ridge-bench: cannot write %s: %s\n", o_.jsonPath.c_str(), std::strerror(errno));
    } else {
      auto quoted = [](const std::vector<std::string>& v) {
        std::string s = "[";
        for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + jsonString(v[i]);
        return s + "]";
      };
      std::vector<std::string> types, ops;
      for (auto t : o_.dtypes) types.push_back(typeInfo(t).name);
      for (auto op : o_.ops) ops.push_back(opName(op));
      std::string env = "{";
      for (const auto& [k, val] : librarySettings())
        env += (env.size() > 1 ? ", " : "") + jsonString(k) + ": " + jsonString(val);
      env += "}";
      std::fprintf(f,
                   "{\n  \"benchmark\": \"ridge-bench\",\n  \"version\": %s,\n  \"ridge_version\": \"%s\",\n",
                   jsonString(versionLine()).c_str(), libVersion.c_str());
      std::fprintf(f, "  \"host\": %s,\n  \"date\": \"%s\",\n  \"command\": %s,\n", jsonString(host_).c_str(),
                   startDate_.c_str(), quoted(o_.args).c_str());
      std::fprintf(f,
                   "  \"collective\": \"%s\",\n  \"nranks\": %d,\n  \"dtype\": \"%s\",\n  \"op\": \"%s\",\n"
                   "  \"root\": %d,\n  \"algo\": %s,\n  \"gdr_mode\": %s,\n  \"modeled\": %s,\n"
                   "  \"launch\": \"%s\",\n  \"peer\": %s,\n  \"ridge_buffers\": \"%s\",\n"
                   "  \"transport\": {\"ridge\": %s, \"peer\": %s, \"alike\": %s},\n",
                   collName(o_.coll), nranks_, typeInfo(o_.dtypes.front()).name,
                   collHasOp(o_.coll) ? opName(o_.ops.front()) : "none", collHasRoot(o_.coll) ? o_.root : -1,
                   o_.algo.empty() ? "null" : jsonString(o_.algo).c_str(),
                   info_.gdr.active ? jsonString(info_.gdr.mode).c_str() : "null",
                   info_.gdr.modeled ? "true" : "false", info_.launch.c_str(),
                   hasPeer() ? ("\"" + std::string(peerKey()) + "\"").c_str() : "null",
                   o_.ridgeOnDevice ? "device" : "host", jsonString(info_.transport.ridge).c_str(),
                   info_.transport.peer.empty() ? "null" : jsonString(info_.transport.peer).c_str(),
                   info_.transport.alike ? "true" : "false");
      // Every setting in effect, nccl-tests' names where it has them.
      std::fprintf(
          f,
          "  \"settings\": {\"minbytes\": %zu, \"maxbytes\": %zu, \"stepfactor\": %g, \"stepbytes\": %zu, "
          "\"iters\": %d, \"warmup_iters\": %d, \"agg_iters\": %d, \"run_cycles\": %d, \"check\": %d, "
          "\"datatypes\": %s, \"ops\": %s, \"root\": %s, \"blocking\": %d, \"average\": %d, "
          "\"stream_null\": %d, \"timeout\": %d, \"cudagraph\": %d, \"report_cputime\": %d, "
          "\"report_timestamps\": %d, \"local_register\": %d, \"local_register_effective\": %s, "
          "\"memory\": %d, \"unalign\": %d, \"per_iter_timing\": %d, \"per_iter_skip\": %d, "
          "\"nthreads\": %d, \"ngpus\": %d, \"parallel_init\": %d, \"np\": %d, \"progress_s\": %g, "
          "\"quiet\": %s, \"run_timeout_s\": %d},\n",
          o_.minBytes, o_.maxBytes, o_.increment ? 0.0 : o_.factor, o_.increment, o_.iters, o_.warmup,
          o_.aggIters, o_.runCycles, o_.checkIters, quoted(types).c_str(),
          collHasOp(o_.coll) ? quoted(ops).c_str() : "[]",
          !collHasRoot(o_.coll) ? "null"
          : o_.root < 0         ? "\"all\""
                                : std::to_string(o_.root).c_str(),
          o_.blocking, o_.average, o_.streamNull, o_.stepTimeoutSec, o_.graphLaunches, int(o_.reportCputime),
          int(o_.reportTimestamps), o_.localRegister, regHandles_.empty() ? "false" : "true", o_.memoryReport,
          o_.unalign, o_.perIterTiming, o_.perIterSkip, o_.nthreads, o_.ngpus, o_.parallelInit, nranks_,
          o_.progressSec, o_.quiet ? "true" : "false", o_.runTimeoutSec);
      std::fprintf(f,
                   "  \"environment\": %s,\n  \"iters\": %d,\n  \"warmup\": %d,\n  \"check\": %s,\n"
                   "  \"memory_copied_GBps\": %.6g,\n  \"memory_traffic_GBps\": %.6g,\n"
                   "  \"avg_busbw\": %.6g,\n  \"avg_ratio\": %s,\n  \"rows\": [",
                   env.c_str(), o_.iters, o_.warmup, checking() ? "true" : "false", copiedGBs_, trafficGBs_,
                   avgBus, avgRatio > 0 ? fmt::num("%.6g", avgRatio).c_str() : "null");
      for (size_t i = 0; i < rows.size(); ++i) {
        std::fprintf(f, "%s\n    {", i ? "," : "");
        auto rec = record(rows[i]);
        for (size_t k = 0; k < rec.size(); ++k)
          std::fprintf(f, "%s\"%s\": %s", k ? ", " : "", rec[k].first.c_str(),
                       rec[k].second ? rec[k].second->c_str() : "null");
        std::fprintf(f, "}");
      }
      std::fprintf(f, "\n  ]\n}\n");
      if (f == stdout)
        std::fflush(f);
      else
        std::fclose(f);
    }
  }
  if (!o_.csvPath.empty()) {
    FILE* f = openOutput(o_.csvPath);
    if (!f) {
      std::fprintf(stderr, "ridge-bench: cannot write %s: %s\n", o_.csvPath.c_str(), std::strerror(errno));
      return;
    }
    // Each line carries the run's facts too, so that rows of many runs can share one table.
    const std::vector<std::pair<std::string, std::string>> facts = {
        {"host", host_},
        {"ridge_version", libVersion},
        {"date", startDate_},
        {"iters", std::to_string(o_.iters)},
        {"warmup", std::to_string(o_.warmup)},
        {"agg_iters", std::to_string(o_.aggIters)},
        {"check", std::to_string(o_.checkIters)},
        {"blocking", std::to_string(o_.blocking)},
        {"average", std::to_string(o_.average)},
        {"launch", info_.launch},
        {"peer", hasPeer() ? peerKey() : ""},
        {"transport", info_.transport.ridge},
        {"ridge_buffers", o_.ridgeOnDevice ? "device" : "host"},
        {"algo", o_.algo},
        {"gdr_mode", info_.gdr.active ? info_.gdr.mode : ""},
        {"unalign", std::to_string(o_.unalign)},
        {"cudagraph", std::to_string(o_.graphLaunches)},
        {"stream_null", std::to_string(o_.streamNull)},
        {"local_register", std::to_string(regHandles_.empty() ? 0 : o_.localRegister)},  // what took effect
        {"per_iter_skip", std::to_string(o_.perIterSkip)},
    };
    auto csvField = [](std::string v) {
      if (v.find_first_of(",\"\n") == std::string::npos) return v;
      std::string q = "\"";
      for (char c : v) q += c == '"' ? std::string("\"\"") : std::string(1, c);
      return q + "\"";
    };
    for (size_t i = 0; i < rows.size(); ++i) {
      auto rec = record(rows[i]);
      if (i == 0) {
        for (size_t k = 0; k < rec.size(); ++k) std::fprintf(f, "%s%s", k ? "," : "", rec[k].first.c_str());
        for (const auto& fact : facts) std::fprintf(f, ",%s", fact.first.c_str());
        std::fprintf(f, "\n");
      }
      for (size_t k = 0; k < rec.size(); ++k) {
        std::string v = rec[k].second.value_or("");
        if (!v.empty() && v.front() == '"') v = v.substr(1, v.size() - 2);
        std::fprintf(f, "%s%s", k ? "," : "", csvField(v).c_str());
      }
      for (const auto& fact : facts) std::fprintf(f, ",%s", csvField(fact.second).c_str());
      std::fprintf(f, "\n");
    }
    if (f == stdout)
      std::fflush(f);
    else
      std::fclose(f);
  }
}

// --plot: Ridge and the peer, out-of-place and in-place, of the last sweep; with several
// types, operators or roots, the out-of-place lines of each (up to 12).
void Bench::plot(const std::vector<Row>& rows) {
  if (rank_ != 0 || o_.plotPath.empty() || rows.empty()) return;
  const int lastCycle = rows.back().cycle;
  std::vector<std::string> combos;
  auto comboOf = [&](const Row& r) {
    std::string c = typeInfo(r.dtype).name;
    if (collHasOp(o_.coll)) c += std::string(" ") + opName(r.op);
    if (collHasRoot(o_.coll)) c += " root " + std::to_string(r.root);
    return c;
  };
  for (const Row& r : rows)
    if (r.cycle == lastCycle && std::find(combos.begin(), combos.end(), comboOf(r)) == combos.end())
      combos.push_back(comboOf(r));
  constexpr size_t kMaxCombos = 12;
  const bool several = combos.size() > 1;
  std::vector<PlotSeries> series;
  std::vector<int> variants = {kRidgeOop};
  if (!several) variants.push_back(kRidgeIp);
  if (hasPeer()) variants.push_back(kMpiOop);
  if (hasPeer() && !several) variants.push_back(kMpiIp);
  for (size_t c = 0; c < combos.size() && c < kMaxCombos; ++c) {
    for (int v : variants) {
      PlotSeries s;
      s.label = std::string(v >= kMpiOop ? peerName() : "Ridge") + ((v & 1) ? " in-place" : " out-of-place");
      if (several) s.label += " (" + combos[c] + ")";
      for (const Row& r : rows) {
        if (r.cycle != lastCycle || comboOf(r) != combos[c] || !r.avail[v]) continue;
        s.bytes.push_back(double(r.bytes));
        s.busbw.push_back(busbw(r, v));
        s.timeUs.push_back(r.timeUs[v]);
      }
      if (!s.bytes.empty()) series.push_back(std::move(s));
    }
  }
  std::string title = "ridge-bench " + std::string(collName(o_.coll)) + ", " + std::to_string(nranks_) +
                      " ranks" + (several ? "" : ", " + combos.front());
  if (hasPeer()) title += ", peer " + std::string(peerName());
  title += ", Ridge over " + info_.transport.ridge;
  if (combos.size() > kMaxCombos)
    title +=
        " (first " + std::to_string(kMaxCombos) + " of " + std::to_string(combos.size()) + " combinations)";
  title += " - " + host_ + ", " + startDate_;
  const std::string err = drawPlot(o_.plotPath, title, series);
  if (err.empty())
    std::fprintf(out_, "# Plot written to %s\n", o_.plotPath.c_str());
  else
    std::fprintf(stderr, "ridge-bench: --plot %s: %s\n", o_.plotPath.c_str(), err.c_str());
}

// -M: what the run used, the largest over ranks.
void Bench::printMemoryReport() {
  if (!o_.memoryReport) return;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const long long device = (info_.ncclPeer || o_.ridgeOnDevice) ? deviceMemoryUsed() : -1;
  double v[3] = {double(allocBytes_) * 2, double(ru.ru_maxrss) * 1024.0, double(device)};
  allreduceDoubles(v, 3, ridgeMax);
  if (rank_ != 0) return;
  auto mib = [](double b) { return fmt::num("%.2f MiB", b / (1024.0 * 1024.0)); };
  std::fprintf(out_, "# %-20s : benchmark buffers %s | peak RSS %s%s (max over ranks)\n", "Host memory usage",
               mib(v[0]).c_str(), mib(v[1]).c_str(),
               v[2] >= 0 ? (" | device in use " + mib(v[2])).c_str() : "");
}

// -I: min, max, 99th percentile (nearest rank) and coefficient of variation of the kept
// iterations.
IterStats iterStats(std::vector<double> sec, int skip) {
  IterStats s;
  sec.erase(sec.begin(), sec.begin() + std::min<size_t>(size_t(skip), sec.size()));
  if (sec.empty()) return s;
  std::sort(sec.begin(), sec.end());
  const size_t n = sec.size();
  s.minUs = sec.front() * 1e6;
  s.maxUs = sec.back() * 1e6;
  const size_t rank99 = std::min(n - 1, (n * 99 + 99) / 100 - 1);
  s.p99Us = sec[rank99] * 1e6;
  double mean = 0, var = 0;
  for (double x : sec) mean += x;
  mean /= double(n);
  for (double x : sec) var += (x - mean) * (x - mean);
  s.cvPct = mean > 0 ? std::sqrt(var / double(n)) / mean * 100.0 : 0.0;
  return s;
}

int Bench::run() {
  {
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    host_ = host;
  }
  startDate_ = formatNow(true);
  if (o_.jsonPath == "-" || o_.csvPath == "-") out_ = stderr;
  if (collHasRoot(o_.coll) && o_.root >= nranks_) {
    if (rank_ == 0)
      std::fprintf(stderr, "ridge-bench: root %d is out of range for %d ranks\n", o_.root, nranks_);
    return kExitUsage;
  }
  if (info_.gdr.active && nranks_ < 2) {
    if (rank_ == 0)
      std::fprintf(stderr,
                   "ridge-bench: --gdr-mode needs at least 2 ranks: one rank sends nothing through a NIC\n");
    return kExitUsage;
  }
  // What the sweep runs: every type, then every operator, then every root, then the sizes.
  struct Combo {
    ridgeDataType_t dtype;
    ridgeRedOp_t op;
    int root;
  };
  std::vector<Combo> combos;
  for (auto t : o_.dtypes)
    for (size_t k = 0; k < (collHasOp(o_.coll) ? o_.ops.size() : 1); ++k) {
      const int r0 = !collHasRoot(o_.coll) ? -1 : o_.root < 0 ? 0 : o_.root;
      const int r1 = !collHasRoot(o_.coll) ? -1 : o_.root < 0 ? nranks_ - 1 : o_.root;
      for (int r = r0; r <= r1; ++r) combos.push_back({t, o_.ops[k], r});
    }
  size_t largest = 0, perCycle = 0;
  for (const Combo& c : combos) {
    select(c.dtype, c.op, c.root);
    const auto list = sizes();
    largest = std::max(largest, list.back());
    perCycle += list.size();
  }
  allocate(largest);
  printHeader();
  printRanks();
  measureMemory();
  if (rank_ == 0 && hasPeer()) {
    if (collHasOp(o_.coll) && std::find(o_.ops.begin(), o_.ops.end(), ridgeAvg) != o_.ops.end() &&
        !info_.ncclPeer)
      std::fprintf(out_, "# %s has no avg: its avg columns time its sum plus a local divide\n", peerName());
    std::fprintf(out_,
                 "# ratio = Ridge out-of-place algbw / %s out-of-place algbw; per size the "
                 "runs go Ridge, then %s, on the same buffers\n",
                 peerName(), peerName());
  }
  printColumns();

  Monitor monitor(o_, comm_, rank_ == 0);
  const size_t totalRows = o_.runCycles > 0 ? perCycle * size_t(o_.runCycles) : 0;
  const bool blocks =
      o_.coll == Coll::AllGather || o_.coll == Coll::ReduceScatter || o_.coll == Coll::AlltoAll;
  std::vector<Row> rows;
  std::vector<double> iterSec(o_.perIterTiming ? size_t(o_.iters) : 0);
  size_t rowIndex = 0;
  for (int cycle = 0; o_.runCycles == 0 || cycle < o_.runCycles; ++cycle) {
    for (const Combo& c : combos) {
      select(c.dtype, c.op, c.root);
      for (size_t bytes : sizes()) {
        Row row;
        row.dtype = c.dtype;
        row.op = c.op;
        row.root = c.root;
        row.cycle = cycle;
        row.bytes = bytes;
        row.count = row.bytes / ti_->size;
        row.n = blocks ? row.count / size_t(nranks_) : row.count;
        for (int v = 0; v < kNumVariants; ++v) {
          const bool inPlace = (v & 1) != 0;
          if (v >= kMpiOop) {
            if (!hasPeer()) {
              row.why[v] = "no peer library";
              continue;
            }
            row.why[v] = info_.ncclPeer   ? ncclUnsupported(o_.coll, inPlace, dtype_, op_)
                         : info_.glooPeer ? glooUnsupported(o_.coll, inPlace, dtype_, op_, row.n)
                                          : mpiUnsupported(o_.coll, inPlace, dtype_, op_, row.n);
          } else if (o_.coll == Coll::SendRecv && inPlace) {
            row.why[v] = "send/recv has no in-place form";
          }
          if (o_.graphLaunches > 0 && row.why[v].empty() && !onDevice(v))
            row.why[v] = "host buffers: no stream work for -G to capture";
          row.avail[v] = row.why[v].empty();
          if (!row.avail[v]) continue;
          monitor.step(rowIndex, totalRows,
                       std::to_string(row.bytes) + " B " + ti_->name + (collHasOp(o_.coll) ? " " : "") +
                           (collHasOp(o_.coll) ? opName(op_) : "") + ", " +
                           (v >= kMpiOop ? peerName() : "Ridge") + (inPlace ? " in-place" : " out-of-place"));
          runVariant(row, v, o_.perIterTiming ? &iterSec : nullptr);
          if (o_.perIterTiming && row.avail[v]) {
            allreduceDoubles(iterSec.data(), iterSec.size(), ridgeMax);  // each iteration's slowest rank
            row.iter[v] = iterStats(iterSec, o_.perIterSkip);
          }
        }
        monitor.rowDone();
        combineTimes(row.timeUs, kNumVariants);
        combineTimes(row.cpuUs, kNumVariants);
        allreduceDoubles(row.wrong, kNumVariants, ridgeSum);
        if (o_.reportTimestamps) row.stamp = formatNow(false);
        printRow(row);
        rows.push_back(std::move(row));
        ++rowIndex;
      }
    }
  }

  // Summary.
  double wrongRidge = 0, wrongMpi = 0, busSum = 0, ratioSum = 0, ratioLog = 0;
  int busN = 0, ratioN = 0;
  for (const Row& r : rows) {
    for (int v : {kRidgeOop, kRidgeIp}) {
      if (!r.avail[v]) continue;
      wrongRidge += r.wrong[v];
      busSum += busbw(r, v);
      ++busN;
    }
    for (int v : {kMpiOop, kMpiIp})
      if (r.avail[v]) wrongMpi += r.wrong[v];
    if (hasRatio(r)) {
      ratioSum += ratio(r);
      ratioLog += std::log(ratio(r));
      ++ratioN;
    }
  }
  const double avgBus = busN ? busSum / busN : 0.0;
  const double avgRatio = ratioN ? ratioSum / ratioN : 0.0;
  printMemoryReport();
  if (rank_ == 0) {
    // Why columns read n/a, once per reason.
    std::vector<std::string> reasons;
    for (const Row& r : rows)
      for (int v = 0; v < kNumVariants; ++v) {
        if (r.avail[v] || (v >= kMpiOop && !hasPeer())) continue;
        const std::string line = std::string(v >= kMpiOop ? peerName() : "Ridge") +
                                 ((v & 1) ? " in-place" : " out-of-place") + ": " + r.why[v];
        if (std::find(reasons.begin(), reasons.end(), line) == reasons.end()) reasons.push_back(line);
      }
    for (const std::string& line : reasons) std::fprintf(out_, "# n/a: %s\n", line.c_str());
    if (checking())
      std::fprintf(out_, "# %-20s : %.0f %s\n", "Out of bounds values", wrongRidge,
                   wrongRidge == 0 ? "OK" : "FAILED");
    else
      std::fprintf(out_, "# %-20s : not checked (-c 0)\n", "Out of bounds values");
    std::fprintf(out_, "# %-20s : %.4f\n",
                 info_.gdr.modeled ? "Avg bus bandwidth (modeled)" : "Avg bus bandwidth", avgBus);
    if (hasPeer()) {
      if (checking())
        std::fprintf(out_, "# %s out of bounds values : %.0f %s\n", peerName(), wrongMpi,
                     wrongMpi == 0 ? "OK" : "FAILED");
      const std::string like =
          info_.glooPeer ? (info_.transport.alike ? ", like with like: both over TCP" : ", transports differ")
                         : "";
      if (ratioN)
        std::fprintf(out_,
                     "# Avg ratio (Ridge/%s out-of-place algbw) : %.3f (geometric mean %.3f "
                     "over %d sizes%s)\n",
                     peerName(), avgRatio, std::exp(ratioLog / ratioN), ratioN, like.c_str());
      else
        std::fprintf(out_, "# Avg ratio (Ridge/%s out-of-place algbw) : n/a (%s)\n", peerName(),
                     rows.empty() ? "no rows" : rows[0].why[kMpiOop].c_str());
    }
    std::fprintf(out_, "#\n# Collective test concluded: ridge-bench %s\n", collName(o_.coll));
    std::fflush(out_);
  }
  writeMachineReadable(rows, avgBus, avgRatio);
  plot(rows);
  return (wrongRidge > 0 || wrongMpi > 0) ? kExitWrong : kExitOk;
}

}  // namespace

int runBenchmark(const Options& o, ridgeComm_t comm, const RunInfo& info) {
  Bench b(o, comm, info);
  return b.run();
}

}  // namespace rbench
