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
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bench.h"

namespace rbench {

namespace {

double nowSec() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

enum Variant { kRidgeOop = 0, kRidgeIp = 1, kMpiOop = 2, kMpiIp = 3, kNumVariants = 4 };

struct Row {
  size_t bytes = 0;  // reported size: total bytes, as nccl-tests counts them
  size_t count = 0;  // bytes / element size
  size_t n = 0;      // the count argument of the call
  bool avail[kNumVariants] = {};
  std::string why[kNumVariants];  // why a variant is not available
  double timeUs[kNumVariants] = {};
  double wrong[kNumVariants] = {};
};

class Bench {
 public:
  Bench(const Options& o, ridgeComm_t comm, const RunInfo& info)
      : o_(o), comm_(comm), info_(info), ti_(typeInfo(o.dtype)), pat_(patternFor(o.coll, o.op)) {
    check(ridgeCommCount(comm, &nranks_), "ridgeCommCount");
    check(ridgeCommUserRank(comm, &rank_), "ridgeCommUserRank");
  }
  ~Bench() {
    std::free(send_);
    std::free(recv_);
    deviceFree(dsend_);
    deviceFree(drecv_);
    streamDestroy(ridgeStream_);
  }
  int run();

 private:
  // ---- Ridge helpers ----
  void check(ridgeResult_t r, const char* what) {
    if (r == ridgeSuccess) return;
    std::string msg = std::string(what) + " failed: " + ridgeGetErrorString(r);
    const char* last = ridgeGetLastError(comm_);
    if (last && *last) msg += ": " + std::string(last);
    fatal(comm_, msg);
  }
  void barrier() {
    float one = 1.0f, out = 0.0f;
    check(ridgeAllReduce(&one, &out, 1, ridgeFloat, ridgeSum, comm_, nullptr), "ridgeAllReduce (barrier)");
  }
  void allreduceDoubles(double* v, size_t n, ridgeRedOp_t op) {
    check(ridgeAllReduce(v, v, n, ridgeFloat64, op, comm_, nullptr), "ridgeAllReduce (stats)");
  }

  std::vector<size_t> sizes() const;
  void allocate(size_t bytes);
  void printHeader();
  void printRanks();
  void measureMemory();
  void prepare(bool inPlace, size_t n);
  uint64_t checkOutput(bool inPlace, bool mpi, size_t n);
  ridgeResult_t ridgeCall(bool inPlace, size_t n);
  void mpiCall(bool inPlace, size_t n);
  // Whether variant v runs on device buffers, and the stream its calls go to (null: host).
  bool onDevice(int v) const { return v >= kMpiOop ? info_.ncclPeer : o_.ridgeOnDevice; }
  void* streamOf(int v) const { return !onDevice(v) ? nullptr : v >= kMpiOop ? ncclStream() : ridgeStream_; }
  size_t extentBytes(size_t n) const { return std::min(n * size_t(nranks_) * ti_.size, allocBytes_); }
  void upload(size_t n);
  void download(size_t n);
  void streamWait(int v);
  void runVariant(Row& row, int v, double* timeUs, double* wrong);
  void printColumns();
  void printRow(const Row& row);
  std::vector<std::pair<std::string, std::optional<std::string>>> record(const Row& row) const;
  void writeMachineReadable(const std::vector<Row>& rows, double avgBus, double avgRatio);
  void progress(size_t i, size_t total, size_t bytes, bool done);

  double algbw(const Row& r, int v) const { return double(r.bytes) / (r.timeUs[v] * 1e3); }
  double busbw(const Row& r, int v) const { return algbw(r, v) * busBwFactor(o_.coll, nranks_); }
  bool hasBound() const { return o_.coll == Coll::AllReduce && trafficGBs_ > 0; }
  double boundPct(const Row& r) const {
    return algbw(r, kRidgeOop) / (trafficGBs_ / (2.0 * nranks_)) * 100.0;
  }
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

  const Options& o_;
  ridgeComm_t comm_;
  RunInfo info_;
  const TypeInfo& ti_;
  Pattern pat_;
  int rank_ = 0, nranks_ = 1;
  char* send_ = nullptr;  // host buffers: every variant's inputs are made and checked here
  char* recv_ = nullptr;
  char* dsend_ = nullptr;  // device buffers of the variants that run on the GPU
  char* drecv_ = nullptr;
  size_t allocBytes_ = 0;
  void* ridgeStream_ = nullptr;  // --ridge-buffers device: Ridge's calls go on this stream
  FILE* out_ = stdout;
  double copiedGBs_ = 0, trafficGBs_ = 0;
  double startSec_ = 0;
  bool progressShown_ = false;
  bool progressTty_ = false;
};

// Sizes from -b to -e, rounded down to whole elements (and, for the collectives whose size
// is the total over ranks, to whole per-rank blocks); duplicates after rounding are dropped.
// A sweep below one block still gets one row of the smallest possible size.
std::vector<size_t> Bench::sizes() const {
  const bool perRankBlocks =
      o_.coll == Coll::AllGather || o_.coll == Coll::ReduceScatter || o_.coll == Coll::AlltoAll;
  const size_t unit = ti_.size * (perRankBlocks ? size_t(nranks_) : 1);
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
  size_t b = (std::max<size_t>(bytes, 64) + 4095) / 4096 * 4096;
  void* p = nullptr;
  void* q = nullptr;
  if (posix_memalign(&p, 4096, b) != 0 || posix_memalign(&q, 4096, b) != 0)
    fatal(comm_, "cannot allocate two buffers of " + std::to_string(b) + " bytes");
  send_ = static_cast<char*>(p);
  recv_ = static_cast<char*>(q);
  std::memset(send_, 0, b);  // fault the pages in before timing
  std::memset(recv_, 0, b);
  allocBytes_ = b;
  if (!info_.ncclPeer && !o_.ridgeOnDevice) return;
  std::string err;
  dsend_ = static_cast<char*>(deviceAlloc(b, &err));
  drecv_ = dsend_ ? static_cast<char*>(deviceAlloc(b, &err)) : nullptr;
  if (!drecv_) fatal(comm_, "device buffers of " + std::to_string(b) + " bytes: " + err);
  if (o_.ridgeOnDevice && !(ridgeStream_ = streamCreate(&err))) fatal(comm_, err);
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

void Bench::printHeader() {
  if (rank_ != 0) return;
  int ver = 0;
  ridgeGetVersion(&ver);
  std::string step = o_.increment ? std::to_string(o_.increment) + " (increment)" : ([&] {
    char b[32];
    std::snprintf(b, sizeof b, "%g (factor)", o_.factor);
    return std::string(b);
  })();
  std::fprintf(out_,
               "# ridge-bench %s: nranks %d, minBytes %zu, maxBytes %zu, step %s, warmup %d, "
               "iters %d, check %d, dtype %s, op %s, root %s, launch %s, peer %s, algo %s\n",
               collName(o_.coll), nranks_, o_.minBytes, o_.maxBytes, step.c_str(), o_.warmup, o_.iters,
               o_.check ? 1 : 0, ti_.name, collHasOp(o_.coll) ? opName(o_.op) : "none",
               collHasRoot(o_.coll) ? std::to_string(o_.root).c_str() : "none", info_.launch.c_str(),
               hasPeer() ? peerKey() : "none", o_.algo.empty() ? "default" : o_.algo.c_str());
  std::fprintf(out_, "# Ridge library version %d.%d.%d\n", ver / 10000, ver / 100 % 100, ver % 100);
  for (const std::string& note : info_.gdr.notes) std::fprintf(out_, "# %s\n", note.c_str());
  if (info_.ncclPeer || o_.ridgeOnDevice)
    std::fprintf(out_,
                 "# buffers: Ridge on %s memory (--ridge-buffers %s)%s%s; GPU %d per rank = local rank\n",
                 o_.ridgeOnDevice ? "device" : "host", o_.ridgeOnDevice ? "device" : "host",
                 info_.ncclPeer ? ", NCCL on device memory, NCCL " : "",
                 info_.ncclPeer ? ncclVersionText().c_str() : "", info_.device);
  if (o_.check)
    std::fprintf(out_,
                 "# check: inputs refilled and outputs poisoned (NaN for floating types, 0xA5 "
                 "bytes for integers) before the first call and before a call after the timed "
                 "loop; #wrong counts differing elements\n");
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
 * Memory-bandwidth bound for allreduce.
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
  if (o_.coll == Coll::AllReduce)
    std::fprintf(out_,
                 "# bound%%: each of N ranks must read N*count input bytes collectively and write "
                 "its output, so traffic >= 2*N*bytes across the node; algbw <= traffic/(2*N) = "
                 "%.2f GB/s here; bound%% = Ridge out-of-place algbw / that * 100 (sizes that "
                 "fit in cache can exceed 100%%)\n",
                 trafficGBs_ / (2.0 * nranks_));
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
  const size_t ts = ti_.size;
  const size_t N = size_t(nranks_);
  auto fill = [&](char* base, size_t elemOff, size_t cnt, int src, uint64_t g0) {
    fillPattern(o_.dtype, pat_, base + elemOff * ts, cnt, src, g0);
  };
  switch (o_.coll) {
    case Coll::AllReduce:
    case Coll::Reduce:
    case Coll::SendRecv:
      if (inPlace) {
        fill(recv_, 0, n, rank_, 0);
      } else {
        fill(send_, 0, n, rank_, 0);
        poison(o_.dtype, recv_, n * ts);
      }
      break;
    case Coll::AlltoAll:
    case Coll::ReduceScatter:
      if (inPlace) {
        fill(recv_, 0, N * n, rank_, 0);
      } else {
        fill(send_, 0, N * n, rank_, 0);
        poison(o_.dtype, recv_, (o_.coll == Coll::AlltoAll ? N * n : n) * ts);
      }
      break;
    case Coll::Broadcast:
      if (rank_ == o_.root) fill(inPlace ? recv_ : send_, 0, n, o_.root, 0);
      if (!inPlace || rank_ != o_.root) poison(o_.dtype, recv_, n * ts);
      break;
    case Coll::AllGather:
      poison(o_.dtype, recv_, N * n * ts);
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
      if (rank_ != o_.root) return 0;  // recvbuff is only written on the root
      m.reduction = true;
      break;
    case Coll::Broadcast:
      if (mpi && !inPlace && rank_ == o_.root) return 0;  // MPI's root receives nothing
      m.src = o_.root;
      break;
    case Coll::AllGather:
      cnt = N * n;
      m.block = n;
      break;
    case Coll::ReduceScatter:
      m.reduction = true;
      m.gBase = uint64_t(rank_) * n;
      if (inPlace && !mpi) out = recv_ + size_t(rank_) * n * ti_.size;
      break;
    case Coll::AlltoAll:
      cnt = N * n;
      m.block = n;
      m.blockLocal = true;
      m.gBase = uint64_t(rank_) * n;
      break;
    case Coll::SendRecv: m.src = (rank_ + nranks_ - 1) % nranks_; break;
  }
  return countWrong(o_.dtype, pat_, o_.op, nranks_, out, cnt, m);
}

ridgeResult_t Bench::ridgeCall(bool inPlace, size_t n) {
  const size_t ts = ti_.size;
  char* s = o_.ridgeOnDevice ? dsend_ : send_;
  char* r = o_.ridgeOnDevice ? drecv_ : recv_;
  const ridgeDataType_t dt = o_.dtype;
  ridgeStream_t st = static_cast<ridgeStream_t>(ridgeStream_);
  switch (o_.coll) {
    case Coll::AllReduce: return ridgeAllReduce(inPlace ? r : s, r, n, dt, o_.op, comm_, st);
    case Coll::Broadcast: return ridgeBroadcast(inPlace ? r : s, r, n, dt, o_.root, comm_, st);
    case Coll::Reduce: return ridgeReduce(inPlace ? r : s, r, n, dt, o_.op, o_.root, comm_, st);
    case Coll::AllGather:
      return ridgeAllGather(inPlace ? r + size_t(rank_) * n * ts : s, r, n, dt, comm_, st);
    case Coll::ReduceScatter:
      if (inPlace) return ridgeReduceScatter(r, r + size_t(rank_) * n * ts, n, dt, o_.op, comm_, st);
      return ridgeReduceScatter(s, r, n, dt, o_.op, comm_, st);
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
  int rc =
      info_.ncclPeer ? ncclCollective(o_.coll, inPlace, dsend_, drecv_, n, o_.dtype, o_.op, o_.root, rank_,
                                      nranks_, &err)
      : info_.glooPeer
          ? glooCollective(o_.coll, inPlace, send_, recv_, n, o_.dtype, o_.op, o_.root, rank_, nranks_, &err)
          : mpiCollective(o_.coll, inPlace, send_, recv_, n, o_.dtype, o_.op, o_.root, rank_, nranks_, &err);
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

void Bench::runVariant(Row& row, int v, double* timeUs, double* wrong) {
  const bool inPlace = (v & 1) != 0;
  const bool mpi = v >= kMpiOop;
  const size_t n = row.n;
  auto call = [&] {
    if (mpi) {
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
  auto sync = [&] {
    streamWait(v);
    if (mpi && info_.glooPeer)
      glooBarrier();
    else if (mpi)
      mpiBarrier();
    else
      barrier();
  };
  // MPI and Gloo leave some results where Ridge's layout does not; NCCL's layouts are Ridge's.
  const bool peerLayout = mpi && !info_.ncclPeer;
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
  if (o_.check) bad += checked();
  sync();
  for (int i = 0; i < o_.warmup; ++i) call();
  sync();
  double t0 = nowSec();
  for (int i = 0; i < o_.iters; ++i) call();
  streamWait(v);  // device calls only enqueue: the time ends when the stream has run them
  double t = nowSec() - t0;
  if (o_.check) bad += checked();
  // Paced by a scaled PCIe model: the modeled time is the measured one divided back.
  *timeUs = t / o_.iters * 1e6 / (mpi ? 1 : info_.gdr.paceScale);
  *wrong = double(bad);
}

// ---- report --------------------------------------------------------------------------------
namespace fmt {
std::string num(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}
std::string time(double us) {
  return num(us < 1e6 ? "%.2f" : "%.0f", us);
}
std::string bw(double gbs) {
  return num("%.3f", gbs);
}
}  // namespace fmt

constexpr const char* kPrefixFmt = "%12s %12s %9s %6s %5s";
constexpr const char* kGroupFmt = "  %10s %8s %8s %6s";

void Bench::printColumns() {
  if (rank_ != 0) return;
  std::string l1, l2, l3;
  char b[256];
  std::snprintf(b, sizeof b, kPrefixFmt, "", "", "", "", "");
  l1 = b;
  l1[0] = '#';
  std::snprintf(b, sizeof b, kPrefixFmt, "size", "count", "type", "redop", "root");
  l2 = b;
  l2[0] = '#';
  std::snprintf(b, sizeof b, kPrefixFmt, "(B)", "(elements)", "", "", "");
  l3 = b;
  l3[0] = '#';
  auto group = [&](const char* title) {
    std::snprintf(b, sizeof b, kGroupFmt, "", "", "", "");
    std::string g(b);
    std::string t(title);
    size_t pad = g.size() > t.size() + 2 ? (g.size() - t.size()) / 2 + 1 : 2;
    g.replace(pad, t.size(), t);
    l1 += g;
    std::snprintf(b, sizeof b, kGroupFmt, "time", "algbw", "busbw", "#wrong");
    l2 += b;
    std::snprintf(b, sizeof b, kGroupFmt, "(us)", "(GB/s)", "(GB/s)", "");
    l3 += b;
  };
  auto single = [&](const char* name, const char* unit) {
    std::snprintf(b, sizeof b, "  %7s", "");
    l1 += b;
    std::snprintf(b, sizeof b, "  %7s", name);
    l2 += b;
    std::snprintf(b, sizeof b, "  %7s", unit);
    l3 += b;
  };
  const bool modeled = info_.gdr.modeled;
  group(placement(kRidgeOop, hasPeer() ? (modeled ? "modeled oop" : "out-of-place")
                                       : (modeled ? "modeled out-of-place" : "out-of-place"))
            .c_str());
  group(placement(kRidgeIp, modeled ? (hasPeer() ? "modeled ip" : "modeled in-place") : "in-place").c_str());
  if (hasBound()) single("bound%", "(%)");
  if (hasPeer()) {
    group(placement(kMpiOop, "out-of-place").c_str());
    group(placement(kMpiIp, "in-place").c_str());
    single("ratio", (std::string("R/") + peerName()).c_str());
  }
  std::fprintf(out_, "%s\n%s\n%s\n", l1.c_str(), l2.c_str(), l3.c_str());
}

void Bench::printRow(const Row& r) {
  if (rank_ != 0) return;
  char b[256];
  std::snprintf(b, sizeof b, kPrefixFmt, std::to_string(r.bytes).c_str(), std::to_string(r.count).c_str(),
                ti_.name, collHasOp(o_.coll) ? opName(o_.op) : "none",
                std::to_string(collHasRoot(o_.coll) ? o_.root : -1).c_str());
  std::string line = b;
  auto group = [&](int v) {
    if (!r.avail[v]) {
      std::snprintf(b, sizeof b, kGroupFmt, "n/a", "n/a", "n/a", "n/a");
    } else {
      std::string w = o_.check ? fmt::num("%.0f", r.wrong[v]) : "N/A";
      std::snprintf(b, sizeof b, kGroupFmt, fmt::time(r.timeUs[v]).c_str(), fmt::bw(algbw(r, v)).c_str(),
                    fmt::bw(busbw(r, v)).c_str(), w.c_str());
    }
    line += b;
  };
  group(kRidgeOop);
  group(kRidgeIp);
  if (hasBound()) {
    std::snprintf(b, sizeof b, "  %7s", fmt::num("%.1f", boundPct(r)).c_str());
    line += b;
  }
  if (hasPeer()) {
    group(kMpiOop);
    group(kMpiIp);
    std::snprintf(b, sizeof b, "  %7s", hasRatio(r) ? fmt::num("%.2f", ratio(r)).c_str() : "n/a");
    line += b;
  }
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
  rec.emplace_back("type", str(ti_.name));
  rec.emplace_back("redop", str(collHasOp(o_.coll) ? opName(o_.op) : "none"));
  rec.emplace_back("root", num(collHasRoot(o_.coll) ? o_.root : -1));
  auto group = [&](const std::string& pre, int v) {
    bool a = r.avail[v];
    rec.emplace_back(pre + "time_us", a ? num(r.timeUs[v]) : std::nullopt);
    rec.emplace_back(pre + "algbw", a ? num(algbw(r, v)) : std::nullopt);
    rec.emplace_back(pre + "busbw", a ? num(busbw(r, v)) : std::nullopt);
    rec.emplace_back(pre + "wrong", a && o_.check ? num(r.wrong[v]) : std::nullopt);
  };
  group("", kRidgeOop);
  group("ip_", kRidgeIp);
  rec.emplace_back("bound_pct", hasBound() ? num(boundPct(r)) : std::nullopt);
  if (hasPeer()) {
    group(std::string(peerKey()) + "_", kMpiOop);
    group(std::string(peerKey()) + "_ip_", kMpiIp);
    rec.emplace_back("ratio", hasRatio(r) ? num(ratio(r)) : std::nullopt);
  }
  return rec;
}

FILE* openOutput(const std::string& path) {
  if (path == "-") return stdout;
  return std::fopen(path.c_str(), "w");
}

void Bench::writeMachineReadable(const std::vector<Row>& rows, double avgBus, double avgRatio) {
  if (rank_ != 0) return;
  if (!o_.jsonPath.empty()) {
    FILE* f = openOutput(o_.jsonPath);
    std::string algoJson = "null";
    if (!o_.algo.empty()) {
      algoJson = "\"";
      for (char c : o_.algo) {
        if (c == '"' || c == '\\') algoJson += '\\';
        if (static_cast<unsigned char>(c) >= 0x20) algoJson += c;
      }
      algoJson += "\"";
    }
    if (!f) {
      std::fprintf(stderr, "ridge-bench: cannot write %s: %s\n", o_.jsonPath.c_str(), std::strerror(errno));
    } else {
      std::fprintf(f,
                   "{\n  \"benchmark\": \"ridge-bench\",\n  \"collective\": \"%s\",\n"
                   "  \"nranks\": %d,\n  \"dtype\": \"%s\",\n  \"op\": \"%s\",\n"
                   "  \"root\": %d,\n  \"algo\": %s,\n  \"gdr_mode\": %s,\n  \"modeled\": %s,\n"
                   "  \"launch\": \"%s\",\n  \"peer\": %s,\n  \"ridge_buffers\": \"%s\",\n"
                   "  \"iters\": %d,\n  \"warmup\": %d,\n  \"check\": %s,\n"
                   "  \"memory_copied_GBps\": %.6g,\n  \"memory_traffic_GBps\": %.6g,\n"
                   "  \"avg_busbw\": %.6g,\n  \"avg_ratio\": %s,\n  \"rows\": [",
                   collName(o_.coll), nranks_, ti_.name, collHasOp(o_.coll) ? opName(o_.op) : "none",
                   collHasRoot(o_.coll) ? o_.root : -1, algoJson.c_str(),
                   info_.gdr.active ? ("\"" + info_.gdr.mode + "\"").c_str() : "null",
                   info_.gdr.modeled ? "true" : "false", info_.launch.c_str(),
                   hasPeer() ? ("\"" + std::string(peerKey()) + "\"").c_str() : "null",
                   o_.ridgeOnDevice ? "device" : "host", o_.iters, o_.warmup, o_.check ? "true" : "false",
                   copiedGBs_, trafficGBs_, avgBus,
                   avgRatio > 0 ? fmt::num("%.6g", avgRatio).c_str() : "null");
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
    for (size_t i = 0; i < rows.size(); ++i) {
      auto rec = record(rows[i]);
      if (i == 0) {
        for (size_t k = 0; k < rec.size(); ++k) std::fprintf(f, "%s%s", k ? "," : "", rec[k].first.c_str());
        std::fprintf(f, "\n");
      }
      for (size_t k = 0; k < rec.size(); ++k) {
        std::string v = rec[k].second.value_or("");
        if (!v.empty() && v.front() == '"') v = v.substr(1, v.size() - 2);
        std::fprintf(f, "%s%s", k ? "," : "", v.c_str());
      }
      std::fprintf(f, "\n");
    }
    if (f == stdout)
      std::fflush(f);
    else
      std::fclose(f);
  }
}

// A \r-updated line on stderr, only when it is a terminal and the run has taken over 2 s.
void Bench::progress(size_t i, size_t total, size_t bytes, bool done) {
  if (rank_ != 0 || !progressTty_) return;
  if (done) {
    if (progressShown_) std::fprintf(stderr, "\r%60s\r", "");
    progressShown_ = false;
    return;
  }
  if (nowSec() - startSec_ < 2.0) return;
  std::fprintf(stderr, "\rridge-bench %s: size %zu/%zu (%zu bytes)   ", collName(o_.coll), i + 1, total,
               bytes);
  std::fflush(stderr);
  progressShown_ = true;
}

int Bench::run() {
  startSec_ = nowSec();
  progressTty_ = isatty(STDERR_FILENO) != 0;
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
  printHeader();
  printRanks();
  measureMemory();
  if (rank_ == 0 && hasPeer()) {
    if (o_.op == ridgeAvg && collHasOp(o_.coll))
      std::fprintf(out_, "# %s has no avg: its columns time its sum plus a local divide\n", peerName());
    std::fprintf(out_,
                 "# ratio = Ridge out-of-place algbw / %s out-of-place algbw; per size the "
                 "runs go Ridge, then %s, on the same buffers\n",
                 peerName(), peerName());
  }

  const std::vector<size_t> list = sizes();
  allocate(list.back());
  printColumns();

  const bool blocks =
      o_.coll == Coll::AllGather || o_.coll == Coll::ReduceScatter || o_.coll == Coll::AlltoAll;
  std::vector<Row> rows;
  for (size_t i = 0; i < list.size(); ++i) {
    Row row;
    row.bytes = list[i];
    row.count = row.bytes / ti_.size;
    row.n = blocks ? row.count / size_t(nranks_) : row.count;
    progress(i, list.size(), row.bytes, false);
    for (int v = 0; v < kNumVariants; ++v) {
      const bool inPlace = (v & 1) != 0;
      if (v >= kMpiOop) {
        if (!hasPeer()) {
          row.why[v] = "no peer library";
          continue;
        }
        row.why[v] = info_.ncclPeer   ? ncclUnsupported(o_.coll, inPlace, o_.dtype, o_.op)
                     : info_.glooPeer ? glooUnsupported(o_.coll, inPlace, o_.dtype, o_.op, row.n)
                                      : mpiUnsupported(o_.coll, inPlace, o_.dtype, o_.op, row.n);
      } else if (o_.coll == Coll::SendRecv && inPlace) {
        row.why[v] = "send/recv has no in-place form";
      }
      row.avail[v] = row.why[v].empty();
      if (row.avail[v]) runVariant(row, v, &row.timeUs[v], &row.wrong[v]);
    }
    allreduceDoubles(row.timeUs, kNumVariants, ridgeMax);
    allreduceDoubles(row.wrong, kNumVariants, ridgeSum);
    progress(i, list.size(), row.bytes, true);
    printRow(row);
    rows.push_back(row);
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
  if (rank_ == 0) {
    if (o_.check)
      std::fprintf(out_, "# Out of bounds values : %.0f %s\n", wrongRidge, wrongRidge == 0 ? "OK" : "FAILED");
    else
      std::fprintf(out_, "# Out of bounds values : not checked (-c 0)\n");
    std::fprintf(out_, "# Avg bus bandwidth%s : %.4f\n", info_.gdr.modeled ? " (modeled)" : "", avgBus);
    if (hasPeer()) {
      if (o_.check)
        std::fprintf(out_, "# %s out of bounds values : %.0f %s\n", peerName(), wrongMpi,
                     wrongMpi == 0 ? "OK" : "FAILED");
      if (ratioN)
        std::fprintf(out_,
                     "# Avg ratio (Ridge/%s out-of-place algbw) : %.3f (geometric mean %.3f "
                     "over %d sizes)\n",
                     peerName(), avgRatio, std::exp(ratioLog / ratioN), ratioN);
      else
        std::fprintf(out_, "# Avg ratio (Ridge/%s out-of-place algbw) : n/a (%s)\n", peerName(),
                     rows.empty() ? "no rows" : rows[0].why[kMpiOop].c_str());
    }
    std::fprintf(out_, "#\n");
    std::fflush(out_);
  }
  writeMachineReadable(rows, avgBus, avgRatio);
  return (wrongRidge > 0 || wrongMpi > 0) ? kExitWrong : kExitOk;
}

}  // namespace

int runBenchmark(const Options& o, ridgeComm_t comm, const RunInfo& info) {
  Bench b(o, comm, info);
  return b.run();
}

}  // namespace rbench
