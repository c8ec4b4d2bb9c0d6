// The C ABI. Every entry point validates its arguments, runs the C++ core, and turns a
// Status into a result code plus the ridgeGetLastError() text: this file is the one
// place where that conversion happens.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/launcher_env.h"
#include "coll/algorithms.h"
#include "coll/batch.h"
#include "coll/comm.h"
#include "coll/device/gpu_proxy.h"
#include "coll/device/ll_path.h"
#include "coll/executor.h"
#include "core/log.h"
#include "core/per_thread.h"
#include "core/settings.h"
#include "core/shared_segments.h"
#include "device/runtime.h"
#include "reduce/reduce.h"
#include "ridge/ridge.h"
#include "ridge/ridge_emulated.h"

using namespace ridge;

namespace {

thread_local std::string tLastError;

// ---- Communicator handles ----------------------------------------------------------------
// Every live communicator is registered with its generation. A handle is looked up here
// before anything dereferences it, so that a destroyed one, a foreign pointer or garbage is
// refused with ridgeInvalidArgument instead of being read. The storage of a destroyed
// communicator stays quarantined (not returned to the allocator) until kQuarantined later
// ones were destroyed, so a newer communicator cannot sit at a stale handle's address
// meanwhile; the dead table then still names what the handle was.
class HandleRegistry {
 public:
  struct Entry {
    uint64_t generation;
    int rank, nranks;
  };
  static constexpr size_t kQuarantined = 1024;

  static HandleRegistry& get() {
    static HandleRegistry* r = new HandleRegistry;  // never destroyed: handles outlive static teardown
    return *r;
  }
  void add(ridgeComm* comm) {
    std::unique_lock<std::shared_mutex> lock(mu_);
    comm->generation = ++lastGeneration_;
    live_[comm] = {comm->generation, comm->rank, comm->nranks};
  }
  // What `comm` is: live (ok), destroyed or unknown (errors naming fn).
  Status check(const char* fn, const ridgeComm* comm) {
    std::shared_lock<std::shared_mutex> lock(mu_);  // every call of every rank thread: readers share
    if (auto it = live_.find(comm); it != live_.end()) {
      if (comm->magic == ridgeComm::kMagic && comm->generation == it->second.generation) return Status::ok();
      return makeError(ridgeInvalidArgument, "%s: comm %p is corrupted (magic 0x%08x, generation %llu, expected %llu)",
                       fn, static_cast<const void*>(comm), comm->magic, (unsigned long long)comm->generation,
                       (unsigned long long)it->second.generation);
    }
    if (auto it = dead_.find(comm); it != dead_.end())
      return makeError(ridgeInvalidArgument,
                       "%s: comm %p is not a live communicator: it was destroyed (it was communicator #%llu of "
                       "this process, rank %d of %d); a stale handle",
                       fn, static_cast<const void*>(comm), (unsigned long long)it->second.generation,
                       it->second.rank, it->second.nranks);
    return makeError(ridgeInvalidArgument,
                     "%s: comm %p is not a live communicator of this process (garbage, another process's handle, "
                     "or one destroyed more than %zu communicators ago)",
                     fn, static_cast<const void*>(comm), kQuarantined);
  }
  bool isLive(const ridgeComm* comm) {
    std::shared_lock<std::shared_mutex> lock(mu_);
    return comm && live_.count(comm) != 0;
  }
  // The storage of a communicator whose destructor ran: quarantine it, free the oldest.
  void retire(void* p) {
    void* release = nullptr;
    {
      std::unique_lock<std::shared_mutex> lock(mu_);
      auto* comm = static_cast<const ridgeComm*>(p);
      if (auto it = live_.find(comm); it != live_.end()) {
        dead_[comm] = it->second;
        live_.erase(it);
      } else {
        dead_[comm] = {0, -1, 0};  // never registered (init refused before)
      }
      quarantine_.push_back(p);
      if (quarantine_.size() > kQuarantined) {
        release = quarantine_.front();
        quarantine_.pop_front();
        dead_.erase(static_cast<const ridgeComm*>(release));
      }
    }
    ::operator delete(release);
  }

 private:
  std::shared_mutex mu_;
  uint64_t lastGeneration_ = 0;
  std::unordered_map<const ridgeComm*, Entry> live_;
  std::unordered_map<const ridgeComm*, Entry> dead_;
  std::deque<void*> quarantine_;
};

ridgeResult_t fail(ridgeComm* comm, const Status& s) {
  tLastError = s.message();
  if (HandleRegistry::get().isLive(comm)) {
    std::lock_guard<std::mutex> lock(comm->lastErrorMutex);
    comm->lastError = s.message();
  }
  return s.code();
}

ridgeResult_t finish(ridgeComm* comm, const Status& s) {
  return s.isOk() ? ridgeSuccess : fail(comm, s);
}

#define RIDGE_CHECK(comm, expr)                          \
  do {                                                   \
    ::ridge::Status check_s_ = (expr);                   \
    if (!check_s_.isOk()) return fail((comm), check_s_); \
  } while (0)

Status badArg(const char* fn, const char* what) {
  return makeError(ridgeInvalidArgument, "%s: %s", fn, what);
}

// A usable communicator: not null, not freed, init finished, not broken by an error.
Status checkComm(const char* fn, ridgeComm* comm, bool allowBroken = false) {
  if (!comm) return badArg(fn, "comm is NULL");
  RIDGE_TRY(HandleRegistry::get().check(fn, comm));
  if (comm->finalized) return makeError(ridgeInvalidUsage, "%s: comm was finalized", fn);
  pollLLStatus(comm);  // a timed-out LL launch breaks the communicator
  int state = comm->asyncError.load();
  if (state == ridgeInProgress)
    return makeError(ridgeInvalidUsage, "%s: comm is still initializing (poll ridgeCommGetAsyncError)", fn);
  if (state != ridgeSuccess && !allowBroken)
    return makeError(static_cast<ridgeResult_t>(state),
                     "%s: comm is unusable after an earlier error (%s); destroy or abort it", fn,
                     ridgeGetErrorString(static_cast<ridgeResult_t>(state)));
  return Status::ok();
}

Status checkTypeOp(const char* fn, ridgeDataType_t dt, const ridgeRedOp_t* op) {
  if (static_cast<unsigned>(dt) >= static_cast<unsigned>(ridgeNumTypes) || dataTypeSize(dt) == 0)
    return makeError(ridgeInvalidArgument, "%s: datatype %d is not a ridgeDataType_t", fn,
                     static_cast<int>(dt));
  if (op && static_cast<unsigned>(*op) >= static_cast<unsigned>(ridgeNumOps))
    return makeError(ridgeInvalidArgument, "%s: op %d is not a ridgeRedOp_t", fn, static_cast<int>(*op));
  return Status::ok();
}

// count*multiplier elements of dt must fit in size_t bytes (and in the slot protocol's
// arithmetic, which uses size_t throughout).
Status checkSize(const char* fn, size_t count, size_t multiplier, ridgeDataType_t dt) {
  size_t es = dataTypeSize(dt);
  if (multiplier && count > SIZE_MAX / multiplier / es)
    return makeError(ridgeInvalidArgument, "%s: count %zu x %zu elements of %zu bytes overflows size_t", fn,
                     count, multiplier, es);
  return Status::ok();
}

Status checkBuffer(const char* fn, const char* name, const void* p, size_t count) {
  if (count > 0 && !p)
    return makeError(ridgeInvalidArgument, "%s: %s is NULL with count %zu > 0", fn, name, count);
  return Status::ok();
}

// A stream being captured into a CUDA graph is refused: the capture would record the ready
// marker and the release wait into the graph instead of running them, so the collective
// would never run (DeviceRuntime::isCapturing). Checked before anything is queued.
Status refuseCapturingStream(const char* fn, device::DeviceRuntime* rt, ridgeStream_t stream) {
  bool capturing = false;
  Status s = rt->isCapturing(stream, &capturing);
  if (!s.isOk()) return Status(s.code(), std::string(fn) + ": " + s.message());
  if (capturing)
    return makeError(ridgeInvalidUsage,
                     "%s: stream %p is being captured into a CUDA graph; stream capture (CUDA graphs) is not "
                     "supported yet: call Ridge outside the capture",
                     fn, static_cast<void*>(stream));
  return Status::ok();
}

// Host-memory collectives run on the calling thread: with a stream, order them after the
// work already queued on it, as a stream-ordered call would be.
Status syncStreamForHostCall(const char* fn, ridgeStream_t stream) {
  if (!stream) return Status::ok();
  device::DeviceRuntime* rt = device::activeRuntime();
  if (!rt) return makeError(ridgeInvalidArgument, "%s: stream must be NULL in a build without CUDA", fn);
  // Synchronizing a capturing stream is illegal in CUDA (and would end the capture).
  RIDGE_TRY(refuseCapturingStream(fn, rt, stream));
  Status s = rt->synchronize(stream);
  if (!s.isOk()) return Status(s.code(), std::string(fn) + ": synchronizing the stream: " + s.message());
  return Status::ok();
}

// Where the buffers a call touches live. Host: the call runs on this thread as before.
// Device or managed: the stream-ordered path (coll/device/gpu_proxy.h). A mix is refused. The kinds
// found (Host for a buffer the call does not use) travel with the operation (DeviceOp).
Status classifyBuffers(const char* fn, ridgeComm* comm, const void* send, bool readsSend, const void* recv,
                       bool writesRecv, bool* onDevice, device::PointerKind* sendKind,
                       device::PointerKind* recvKind) {
  *onDevice = false;
  *sendKind = *recvKind = device::PointerKind::Host;
  device::DeviceRuntime* rt = device::runtimeOf(comm->emulatedDevice);
  if (!rt || rt->deviceCount() == 0) return Status::ok();  // no device: everything is host memory
  struct Use {
    const char* name;
    device::PointerInfo info;
    device::PointerKind* kind;
  };
  Use uses[2] = {};
  int n = 0;
  if (readsSend && send) uses[n++] = {"sendbuff", rt->classify(send), sendKind};
  if (writesRecv && recv) uses[n++] = {"recvbuff", rt->classify(recv), recvKind};
  for (int i = 0; i < n; ++i) {
    *uses[i].kind = uses[i].info.kind;
    const bool dev = uses[i].info.kind != device::PointerKind::Host;
    if (i > 0 && dev != *onDevice)
      return makeError(ridgeInvalidUsage,
                       "%s: %s is %s memory but %s is %s memory; a call's buffers must all be host memory or "
                       "all device (or managed) memory",
                       fn, uses[0].name, device::pointerKindName(uses[0].info.kind), uses[i].name,
                       device::pointerKindName(uses[i].info.kind));
    *onDevice = dev;
    if (dev && uses[i].info.device != comm->cudaDevice)
      return makeError(ridgeInvalidUsage,
                       "%s: %s is %s memory of CUDA device %d but the communicator serves device %d (the "
                       "device current on the thread that created it)",
                       fn, uses[i].name, device::pointerKindName(uses[i].info.kind), uses[i].info.device,
                       comm->cudaDevice);
  }
  return Status::ok();
}

Status checkRoot(const char* fn, const char* name, int root, ridgeComm* comm) {
  if (root < 0 || root >= comm->nranks)
    return makeError(ridgeInvalidArgument, "%s: %s %d is out of range [0, %d)", fn, name, root, comm->nranks);
  return Status::ok();
}

// ---- groups ----------------------------------------------------------------------------

struct QueuedOp {
  ridgeComm* comm;
  DeviceOp op;  // the arguments, the stream and where the buffers live
  bool device;  // buffers in device memory: the stream-ordered path
  // The pre-multiplied input of a PreMulSum operation (op.args.send points into it), kept
  // until the group ran.
  std::shared_ptr<std::vector<unsigned char>> scaledInput;
};

// The queued operations, and the scratch ridgeGroupEnd sorts them into. Kept per thread and
// cleared, not freed, after each group: a group of a send and a receive is one call of a
// training step's pipeline, and allocating these vectors and a map for every group cost about
// a tenth of a 64 KiB send/recv's time (issue 21, perf on ridge-bench sendrecv).
struct GroupState {
  int depth = 0;
  std::vector<QueuedOp> ops;
  std::vector<QueuedOp> running;  // the group ridgeGroupEnd runs (ops is free for a later group)
  std::vector<QueuedOp> hostOps, deviceOps, perComm;
  std::vector<std::pair<ridgeComm*, bool>> deviceOfComm;
  std::vector<ridgeComm*> hostComms, deviceComms;
  std::vector<CollArgs> args;
};
// The calling thread's group state (core/per_thread.h: no __tls_get_addr per use).
GroupState& group() {
  return perThread<GroupState>();
}

// Calls fn(comm, its operations) once per communicator of `ops`, in order of first
// appearance; `comms` receives each communicator handled, whose callsInFlight (raised here)
// the caller must drop once it no longer touches them. Stops at the first error.
template <class Fn>
Status forEachComm(const std::vector<QueuedOp>& ops, std::vector<ridgeComm*>& comms, Fn fn) {
  std::vector<QueuedOp>& mine = group().perComm;
  for (const QueuedOp& q : ops) {
    bool known = false;
    for (ridgeComm* c : comms) known = known || c == q.comm;
    if (known) continue;
    comms.push_back(q.comm);
    q.comm->callsInFlight.fetch_add(1);
    mine.clear();
    for (const QueuedOp& o : ops)
      if (o.comm == q.comm) mine.push_back(o);
    RIDGE_TRY(fn(q.comm, mine));
  }
  return Status::ok();
}

// Runs the queued host-memory operations on this thread, every communicator's together.
Status runGroup(const std::vector<QueuedOp>& ops, std::vector<ridgeComm*>& comms) {
  Executor& ex = Executor::forThisThread();
  std::vector<CollArgs>& args = group().args;
  RIDGE_TRY(forEachComm(ops, comms, [&](ridgeComm* c, const std::vector<QueuedOp>& mine) {
    // Device operations queued earlier on this communicator use the same connectors.
    RIDGE_TRY(drainDeviceOps(c));
    args.clear();
    for (const QueuedOp& o : mine) args.push_back(o.op.args);
    spawnBatch(ex, c, args.data(), args.size());
    return Status::ok();
  }));
  return ex.run();
}

// Queues each communicator's device operations of a group as one batch of its proxy, or,
// when the LL path takes every collective of the group (llTakes: the same answer on every
// rank, since ranks share the group's collectives but not its sends and receives), launches
// the collectives through LL in call order and gives the proxy the sends and receives, if any.
// So within one group the LL collectives come before the group's proxy work on each stream.
Status submitDeviceGroup(const std::vector<QueuedOp>& ops, std::vector<ridgeComm*>& comms) {
  std::vector<DeviceOp> batch;
  return forEachComm(ops, comms, [&](ridgeComm* c, const std::vector<QueuedOp>& mine) {
    device::DeviceRuntime* rt = device::runtimeOf(c->emulatedDevice);
    // One rank, every operation on one stream: the copies in call order on that stream (with
    // several streams the proxy's batch makes each wait for the whole group).
    bool oneRankOneStream = c->nranks == 1;
    for (const QueuedOp& o : mine)
      oneRankOneStream =
          oneRankOneStream && oneRankDeviceCopyTakes(c, o.op) && o.op.stream == mine.front().op.stream;
    if (oneRankOneStream) {
      for (const QueuedOp& o : mine) RIDGE_TRY(runOneRankDeviceCopy(c, rt, o.op));
      return Status::ok();
    }
    bool allLL = true;
    for (const QueuedOp& o : mine) allLL = allLL && (isExchange(o.op.args.type) || llTakes(c, o.op));
    batch.clear();
    std::vector<ridgeStream_t> streams;
    if (allLL) {
      for (const QueuedOp& o : mine)
        if (llTakes(c, o.op) && std::find(streams.begin(), streams.end(), o.op.stream) == streams.end())
          streams.push_back(o.op.stream);
      RIDGE_TRY(joinLLStreams(c, rt, streams.data(), streams.size()));
    }
    for (const QueuedOp& o : mine) {
      if (allLL && llTakes(c, o.op))
        RIDGE_TRY(launchLL(c, rt, o.op));
      else
        batch.push_back(o.op);
    }
    // Every stream of the group waits for the whole group, as for a proxy batch.
    if (streams.size() > 1) RIDGE_TRY(leaveLLGroup(c, rt, streams.data(), streams.size()));
    return batch.empty() ? Status::ok() : submitDeviceBatch(c, rt, batch.data(), batch.size());
  });
}

// ---- send and receive to self -------------------------------------------------------------

bool isSelfExchange(const QueuedOp& q) {
  return (q.op.args.type == CollType::Send || q.op.args.type == CollType::Recv) &&
         q.op.args.root == q.comm->rank;
}

// A send to self and the receive from self it is matched with: one local copy.
struct SelfCopy {
  const QueuedOp* send;
  const QueuedOp* recv;
};

// Matches, per communicator, the group's k-th send to self with its k-th receive from self
// (issue order, as sends and receives between two ranks are matched), each pair of the same
// count and datatype. A send or receive without a partner would wait forever: the group
// fails instead, before any of it runs.
Status pairSelfExchanges(const char* fn, const std::vector<QueuedOp>& ops, std::vector<SelfCopy>* pairs) {
  std::vector<ridgeComm*> comms;
  for (const QueuedOp& q : ops)
    if (isSelfExchange(q) && std::find(comms.begin(), comms.end(), q.comm) == comms.end())
      comms.push_back(q.comm);
  std::vector<const QueuedOp*> sends, recvs;
  for (ridgeComm* c : comms) {
    sends.clear();
    recvs.clear();
    for (const QueuedOp& q : ops)
      if (q.comm == c && isSelfExchange(q)) (q.op.args.type == CollType::Send ? sends : recvs).push_back(&q);
    if (sends.size() != recvs.size())
      return makeError(ridgeInvalidUsage,
                       "%s: rank %d: the group has %zu send(s) to self and %zu receive(s) from self; each "
                       "ridgeSend to this rank needs a ridgeRecv from this rank in the same group",
                       fn, c->rank, sends.size(), recvs.size());
    for (size_t k = 0; k < sends.size(); ++k) {
      const CollArgs& s = sends[k]->op.args;
      const CollArgs& r = recvs[k]->op.args;
      if (s.count != r.count || s.dtype != r.dtype)
        return makeError(ridgeInvalidUsage,
                         "%s: rank %d: send to self #%zu of the group (%zu elements of datatype %d) does "
                         "not match receive from self #%zu (%zu elements of datatype %d)",
                         fn, c->rank, k, s.count, static_cast<int>(s.dtype), k, r.count,
                         static_cast<int>(r.dtype));
      pairs->push_back({sends[k], recvs[k]});
    }
  }
  return Status::ok();
}

// One self pair's copy: memmove for host memory; for device memory a copy on the receive's
// stream, with the send's stream (if another) joined before and after it through a marker, so
// the copy follows both streams' earlier work and both streams' later work follows the copy.
Status runSelfCopy(const SelfCopy& p) {
  const CollArgs& s = p.send->op.args;
  const CollArgs& r = p.recv->op.args;
  ridgeComm* c = p.send->comm;
  const size_t bytes = s.count * dataTypeSize(s.dtype);
  if (bytes == 0 || s.send == r.recv) return Status::ok();
  if (!p.send->device) {
    std::memmove(r.recv, s.send, bytes);
    return Status::ok();
  }
  device::DeviceRuntime* rt = device::runtimeOf(c->emulatedDevice);
  const ridgeStream_t sendStream = p.send->op.stream, recvStream = p.recv->op.stream;
  const int previous = rt->currentDevice();
  Status st = previous != c->cudaDevice ? rt->bindThread(c->cudaDevice) : Status::ok();
  if (st.isOk() && sendStream == recvStream) {
    st = rt->copy(r.recv, s.send, bytes, recvStream);
  } else if (st.isOk()) {
    device::Marker* join = nullptr;
    st = rt->createMarker(&join);
    if (st.isOk()) st = rt->recordMarker(join, sendStream);
    if (st.isOk()) st = rt->waitMarker(recvStream, join);
    if (st.isOk()) st = rt->copy(r.recv, s.send, bytes, recvStream);
    if (st.isOk()) st = rt->recordMarker(join, recvStream);
    if (st.isOk()) st = rt->waitMarker(sendStream, join);
    if (join) rt->destroyMarker(join);  // a wait already queued keeps its record
  }
  if (previous >= 0 && previous != c->cudaDevice) (void)rt->bindThread(previous);
  if (!st.isOk())
    return Status(st.code(),
                  "rank " + std::to_string(c->rank) + ": the copy of a send to self: " + st.message());
  return Status::ok();
}

// Queues the operation inside a group; otherwise runs it now (host memory) or hands it to
// the communicator's proxy (device memory).
ridgeResult_t submit(ridgeComm* comm, const DeviceOp& op, bool device,
                     std::shared_ptr<std::vector<unsigned char>> scaledInput = nullptr) {
  if (group().depth > 0) {
    group().ops.push_back({comm, op, device, std::move(scaledInput)});
    return ridgeSuccess;
  }
  comm->callsInFlight.fetch_add(1);
  Status s;
  device::DeviceRuntime* rt = device ? device::runtimeOf(comm->emulatedDevice) : nullptr;
  if (device && oneRankDeviceCopyTakes(comm, op)) {
    s = runOneRankDeviceCopy(comm, rt, op);
  } else if (device && llTakes(comm, op)) {
    s = launchLL(comm, rt, op);
  } else if (device) {
    s = submitDeviceBatch(comm, rt, &op, 1);
  } else {
    s = drainDeviceOps(comm);
    if (s.isOk()) {
      Executor& ex = Executor::forThisThread();
      ex.spawn(comm, runCollective(comm, op.args));
      s = ex.run();
    }
  }
  ridgeResult_t result = finish(comm, s);
  // Last touch of comm: ridgeCommAbort on another thread may free it from here on.
  comm->callsInFlight.fetch_sub(1);
  return result;
}

// ---- PreMulSum operators ------------------------------------------------------------------

// The live operator `op` of comm, checked against the call's datatype.
Status findUserOp(const char* fn, ridgeComm* comm, ridgeRedOp_t op, ridgeDataType_t dt,
                  ridgeComm::UserOp* out) {
  const size_t index = static_cast<size_t>(op) - ridgeNumOps;
  std::lock_guard<std::mutex> lock(comm->userOpsMutex);
  if (index >= comm->userOps.size() || !comm->userOps[index].live)
    return makeError(ridgeInvalidArgument,
                     "%s: op %d is neither a built-in ridgeRedOp_t nor a live operator of "
                     "ridgeRedOpCreatePreMulSum on this comm",
                     fn, static_cast<int>(op));
  *out = comm->userOps[index];
  if (out->type != dt)
    return makeError(ridgeInvalidArgument,
                     "%s: op %d was created for datatype %d but the call passes datatype %d", fn,
                     static_cast<int>(op), static_cast<int>(out->type), static_cast<int>(dt));
  return Status::ok();
}

// The scalar's bytes now: the copy taken at creation, or (ridgeScalarDevice) read through the
// pointer, with the device runtime when it points to device memory.
Status readScalar(const char* fn, const ridgeComm::UserOp& op, unsigned char* out) {
  const size_t es = dataTypeSize(op.type);
  if (op.residence == ridgeScalarHostImmediate) {
    std::memcpy(out, op.scalar, es);
    return Status::ok();
  }
  device::DeviceRuntime* rt = device::activeRuntime();
  if (rt && rt->deviceCount() > 0 && rt->classify(op.scalarPtr).kind == device::PointerKind::Device) {
    Status s = rt->copy(out, op.scalarPtr, es, nullptr);
    if (s.isOk()) s = rt->synchronize(nullptr);
    if (!s.isOk())
      return Status(s.code(), std::string(fn) + ": reading the PreMulSum scalar: " + s.message());
    return Status::ok();
  }
  std::memcpy(out, op.scalarPtr, es);
  return Status::ok();
}

template <class T>
void scaleTyped(unsigned char* dst, const void* src, size_t n, const unsigned char* scalarBytes) {
  T scalar;
  std::memcpy(&scalar, scalarBytes, sizeof scalar);
  const T* in = static_cast<const T*>(src);
  T* out = reinterpret_cast<T*>(dst);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<T>(in[i] * scalar);
}

// dst = scalar * src, element by element in the datatype (half and bfloat16 through float).
void scaleInto(unsigned char* dst, const void* src, size_t n, ridgeDataType_t dt,
               const unsigned char* scalar) {
  switch (dt) {
    case ridgeInt8: return scaleTyped<int8_t>(dst, src, n, scalar);
    case ridgeUint8: return scaleTyped<uint8_t>(dst, src, n, scalar);
    case ridgeInt32: return scaleTyped<int32_t>(dst, src, n, scalar);
    case ridgeUint32: return scaleTyped<uint32_t>(dst, src, n, scalar);
    case ridgeInt64: return scaleTyped<int64_t>(dst, src, n, scalar);
    case ridgeUint64: return scaleTyped<uint64_t>(dst, src, n, scalar);
    case ridgeFloat32: return scaleTyped<float>(dst, src, n, scalar);
    case ridgeFloat64: return scaleTyped<double>(dst, src, n, scalar);
    case ridgeFloat16:
    case ridgeBfloat16: {
      const bool half = dt == ridgeFloat16;
      uint16_t bits;
      std::memcpy(&bits, scalar, 2);
      const float k = half ? halfToFloat(bits) : bf16ToFloat(bits);
      const uint16_t* in = static_cast<const uint16_t*>(src);
      uint16_t* out = reinterpret_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) {
        const float x = (half ? halfToFloat(in[i]) : bf16ToFloat(in[i])) * k;
        out[i] = half ? floatToHalf(x) : floatToBf16(x);
      }
      return;
    }
    default: return;
  }
}

ridgeResult_t collective(const char* fn, CollType type, const void* send, void* recv, size_t count,
                         ridgeDataType_t dt, ridgeRedOp_t op, int root, ridgeComm* comm, ridgeStream_t stream,
                         bool hasOp, bool hasRoot) {
  RIDGE_CHECK(comm, checkComm(fn, comm));
  const bool userOp = hasOp && static_cast<unsigned>(op) >= static_cast<unsigned>(ridgeNumOps);
  RIDGE_CHECK(comm, checkTypeOp(fn, dt, hasOp && !userOp ? &op : nullptr));
  ridgeComm::UserOp premul;
  if (userOp) RIDGE_CHECK(comm, findUserOp(fn, comm, op, dt, &premul));
  const size_t blocks =
      (type == CollType::AllGather || type == CollType::ReduceScatter || type == CollType::AlltoAll)
          ? static_cast<size_t>(comm->nranks)
          : 1;
  RIDGE_CHECK(comm, checkSize(fn, count, blocks, dt));
  if (hasRoot)
    RIDGE_CHECK(
        comm, checkRoot(fn, type == CollType::Send || type == CollType::Recv ? "peer" : "root", root, comm));
  // A send to self is a local copy paired, in ridgeGroupEnd, with a receive from self of the
  // same group; alone (outside a group) it has no partner and would never complete.
  if ((type == CollType::Send || type == CollType::Recv) && root == comm->rank && group().depth == 0)
    return fail(comm, makeError(ridgeInvalidUsage,
                                "%s: peer %d is this rank; a %s to self needs its matching %s in the same "
                                "group (ridgeGroupStart/ridgeGroupEnd)",
                                fn, root, type == CollType::Send ? "send" : "receive",
                                type == CollType::Send ? "ridgeRecv from self" : "ridgeSend to self"));
  CollArgs args{type, send, recv, count, dt, hasOp ? op : ridgeSum, root};
  // Which buffers are read/written depends on the collective and on the root.
  const BufferUse use = bufferUse(args, comm->rank, comm->nranks);
  if (use.readsSend) RIDGE_CHECK(comm, checkBuffer(fn, "sendbuff", send, use.sendCount));
  if (use.writesRecv) RIDGE_CHECK(comm, checkBuffer(fn, "recvbuff", recv, use.recvCount));
  bool onDevice = false;
  DeviceOp call{args, stream};
  // Classified even for zero elements: a zero-count call on device buffers is then a
  // stream-ordered no-op instead of a synchronization of the caller's stream.
  RIDGE_CHECK(comm, classifyBuffers(fn, comm, send, use.readsSend, recv, use.writesRecv, &onDevice,
                                    &call.sendKind, &call.recvKind));
  if (!onDevice && stream && !device::runtimeOf(comm->emulatedDevice))
    return fail(comm, makeError(ridgeInvalidArgument, "%s: stream must be NULL in a build without CUDA", fn));
  if (!onDevice && group().depth == 0) RIDGE_CHECK(comm, syncStreamForHostCall(fn, stream));
  if (onDevice && group().depth == 0)
    RIDGE_CHECK(comm, refuseCapturingStream(fn, device::runtimeOf(comm->emulatedDevice), stream));
  if (!userOp) return submit(comm, call, onDevice);
  // PreMulSum: the sum of scalar*x, with x scaled here into a buffer of its own.
  if (onDevice)
    return fail(comm, makeError(ridgeInvalidUsage,
                                "%s: operators of ridgeRedOpCreatePreMulSum work on host memory only; "
                                "these buffers are device memory",
                                fn));
  auto scaled = std::make_shared<std::vector<unsigned char>>();
  if (use.readsSend && use.sendCount > 0) {
    unsigned char scalar[8];
    RIDGE_CHECK(comm, readScalar(fn, premul, scalar));
    scaled->resize(use.sendCount * dataTypeSize(dt));
    scaleInto(scaled->data(), send, use.sendCount, dt, scalar);
    call.args.send = scaled->data();
  }
  call.args.op = ridgeSum;
  return submit(comm, call, false, std::move(scaled));
}

}  // namespace

void* ridgeComm::operator new(size_t bytes) {
  return ::operator new(bytes);
}

void ridgeComm::operator delete(void* p, size_t) {
  if (p) HandleRegistry::get().retire(p);
}

extern "C" {

RIDGE_API ridgeResult_t ridgeGetVersion(int* version) {
  if (!version) return fail(nullptr, badArg("ridgeGetVersion", "version is NULL"));
  *version = RIDGE_VERSION_CODE;
  return ridgeSuccess;
}

RIDGE_API ridgeResult_t ridgeGetUniqueId(ridgeUniqueId* uniqueId) {
  if (!uniqueId) return fail(nullptr, badArg("ridgeGetUniqueId", "uniqueId is NULL"));
  return finish(nullptr, createUniqueId(uniqueId));
}

static int defaultTimeout() {
  int64_t t = settingInt(Setting::TIMEOUT);
  return t > 0 && t < INT_MAX ? static_cast<int>(t) : 120;
}

// inheritedTimeout > 0: the timeout of the communicator this one is made from (split, shrink)
// when config does not set one.
static ridgeResult_t initRank(const char* fn, ridgeComm_t* out, int nranks, const ridgeUniqueId& id, int rank,
                              const ridgeConfig_t* config, int inheritedTimeout = 0) {
  if (!out) return fail(nullptr, badArg(fn, "comm is NULL"));
  *out = nullptr;
  if (nranks < 1) return fail(nullptr, makeError(ridgeInvalidArgument, "%s: nranks %d < 1", fn, nranks));
  if (rank < 0 || rank >= nranks)
    return fail(nullptr,
                makeError(ridgeInvalidArgument, "%s: rank %d is out of range [0, %d)", fn, rank, nranks));
  UniqueIdInfo info;
  if (Status s = decodeUniqueId(id, &info); !s.isOk())
    return fail(nullptr, Status(ridgeInvalidArgument, std::string(fn) + ": commId: " + s.message()));
  // Every RIDGE_* value is checked before anything connects: a bad one fails init here, on
  // the calling thread, naming the variable and what it accepts (core/settings.h).
  if (Status s = validateSettings(); !s.isOk())
    return fail(nullptr, Status(s.code(), std::string(fn) + ": " + s.message()));
  bool blocking = true;
  auto* comm = new ridgeComm();
  comm->rank = rank;
  comm->nranks = nranks;
  HandleRegistry::get().add(comm);
  comm->timeoutSec = inheritedTimeout > 0 ? inheritedTimeout : defaultTimeout();
  comm->name = "comm";
  // As NCCL: the communicator serves the device current on the calling thread. Read here,
  // on that thread: a non-blocking init runs initComm on a thread of its own, whose current
  // device is the runtime's default (CUDA: device 0), not the caller's.
  comm->emulatedDevice = device::emulatedBySettings();
  if (device::DeviceRuntime* rt = device::runtimeOf(comm->emulatedDevice); rt && rt->deviceCount() > 0)
    comm->cudaDevice = rt->currentDevice();
  if (config) {
    if (config->blocking != RIDGE_CONFIG_UNDEF_INT) blocking = config->blocking != 0;
    if (config->timeoutSeconds != RIDGE_CONFIG_UNDEF_INT) comm->timeoutSec = config->timeoutSeconds;
    if (config->commName) comm->name = config->commName;
  }
  if (!blocking) {
    *out = comm;
    comm->initThread = std::thread([comm, id] {
      Status s = initComm(comm, id);
      if (!s.isOk()) {
        std::lock_guard<std::mutex> lock(comm->lastErrorMutex);
        comm->lastError = s.message();
        comm->asyncError.store(s.code());
      }
    });
    return ridgeInProgress;
  }
  Status s = initComm(comm, id);
  if (!s.isOk()) {
    freeComm(comm);
    return fail(nullptr, s);
  }
  *out = comm;
  return ridgeSuccess;
}

RIDGE_API ridgeResult_t ridgeCommInitRank(ridgeComm_t* comm, int nranks, ridgeUniqueId commId, int rank) {
  return initRank("ridgeCommInitRank", comm, nranks, commId, rank, nullptr);
}

static Status checkConfig(const char* fn, const ridgeConfig_t* config) {
  if (!config) return Status::ok();
  if (config->magic != RIDGE_CONFIG_MAGIC || config->size < offsetof(ridgeConfig_t, blocking) + sizeof(int) ||
      config->size > sizeof(ridgeConfig_t))
    return badArg(fn, "config was not initialized with RIDGE_CONFIG_INITIALIZER (bad magic or size)");
  if (config->blocking != RIDGE_CONFIG_UNDEF_INT && config->blocking != 0 && config->blocking != 1)
    return makeError(ridgeInvalidArgument, "%s: config->blocking must be 0 or 1, not %d", fn,
                     config->blocking);
  if (config->timeoutSeconds != RIDGE_CONFIG_UNDEF_INT && config->timeoutSeconds <= 0)
    return makeError(ridgeInvalidArgument, "%s: config->timeoutSeconds must be > 0, not %d", fn,
                     config->timeoutSeconds);
  return Status::ok();
}

RIDGE_API ridgeResult_t ridgeCommInitRankConfig(ridgeComm_t* comm, int nranks, ridgeUniqueId commId, int rank,
                                                ridgeConfig_t* config) {
  const char* fn = "ridgeCommInitRankConfig";
  RIDGE_CHECK(nullptr, checkConfig(fn, config));
  return initRank(fn, comm, nranks, commId, rank, config);
}

RIDGE_API ridgeResult_t ridgeCommInitAll(ridgeComm_t* comms, int ndev, const int* devlist) {
  const char* fn = "ridgeCommInitAll";
  if (!comms) return fail(nullptr, badArg(fn, "comms is NULL"));
  if (ndev < 1) return fail(nullptr, makeError(ridgeInvalidArgument, "%s: ndev %d < 1", fn, ndev));
  device::DeviceRuntime* rt = device::activeRuntime();
  const int devices = rt ? rt->deviceCount() : 0;
  for (int i = 0; devlist && i < ndev; ++i) {
    if (devlist[i] < 0 || (devices > 0 && devlist[i] >= devices))
      return fail(nullptr, makeError(ridgeInvalidArgument,
                                     "%s: devlist[%d] = %d is not a device (this process has %d)", fn, i,
                                     devlist[i], devices));
  }
  for (int i = 0; i < ndev; ++i) comms[i] = nullptr;
  ridgeUniqueId id;
  RIDGE_CHECK(nullptr, createUniqueId(&id));
  // One thread per rank: each blocks in the rendezvous until all have arrived.
  std::vector<ridgeResult_t> results(ndev, ridgeSuccess);
  std::vector<std::string> errors(ndev);
  std::vector<std::thread> threads;
  for (int i = 0; i < ndev; ++i) {
    threads.emplace_back([&, i] {
      if (devices > 0) {
        Status bound = rt->bindThread(devlist ? devlist[i] : i % devices);
        if (!bound.isOk()) {
          results[i] = fail(nullptr, bound);
          errors[i] = tLastError;
          return;
        }
      }
      results[i] = initRank(fn, &comms[i], ndev, id, i, nullptr);
      if (results[i] != ridgeSuccess) errors[i] = tLastError;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < ndev; ++i) {
    if (results[i] == ridgeSuccess) continue;
    for (int k = 0; k < ndev; ++k) {
      if (comms[k]) ridgeCommDestroy(comms[k]);
      comms[k] = nullptr;
    }
    tLastError = std::string(fn) + ": rank " + std::to_string(i) + ": " + errors[i];
    return results[i];
  }
  return ridgeSuccess;
}

// Marks a call in flight on comm for its lifetime (ridgeCommAbort waits for it).
struct InFlight {
  ridgeComm* comm;
  explicit InFlight(ridgeComm* c) : comm(c) { comm->callsInFlight.fetch_add(1); }
  ~InFlight() { comm->callsInFlight.fetch_sub(1); }
};

RIDGE_API ridgeResult_t ridgeCommSplit(ridgeComm_t comm, int color, int key, ridgeComm_t* newcomm,
                                       ridgeConfig_t* config) {
  const char* fn = "ridgeCommSplit";
  RIDGE_CHECK(comm, checkComm(fn, comm));
  if (!newcomm) return fail(comm, badArg(fn, "newcomm is NULL"));
  *newcomm = nullptr;
  if (color < 0 && color != RIDGE_SPLIT_NOCOLOR)
    return fail(
        comm, makeError(ridgeInvalidArgument, "%s: color %d must be >= 0 or RIDGE_SPLIT_NOCOLOR", fn, color));
  RIDGE_CHECK(comm, checkConfig(fn, config));
  if (group().depth > 0)
    return fail(comm, makeError(ridgeInvalidUsage, "%s: called inside a group (ridgeGroupStart)", fn));
  int timeout = comm->timeoutSec;
  std::vector<ridgeUniqueId> ids(comm->nranks);
  int newRank = -1, newSize = 0, leader = -1;
  {
    InFlight guard(comm);
    // Device operations queued earlier use the connections; let them finish first.
    RIDGE_CHECK(comm, drainDeviceOps(comm));
    struct Entry {
      int32_t color, key;
    };
    std::vector<Entry> all(comm->nranks);
    all[comm->rank] = {color, key};
    RIDGE_CHECK(comm, comm->bootstrap->allGather(all.data(), sizeof(Entry)));
    // Members of this rank's color in new-rank order: by key, then by old rank.
    std::vector<int> members;
    for (int r = 0; r < comm->nranks; ++r)
      if (color != RIDGE_SPLIT_NOCOLOR && all[r].color == color) members.push_back(r);
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return all[a].key < all[b].key; });
    // The first member of every color creates that color's id; a second all-gather hands it on.
    std::memset(ids.data(), 0, ids.size() * sizeof(ridgeUniqueId));
    if (!members.empty() && members.front() == comm->rank)
      RIDGE_CHECK(comm, createUniqueId(&ids[comm->rank]));
    RIDGE_CHECK(comm, comm->bootstrap->allGather(ids.data(), sizeof(ridgeUniqueId)));
    if (members.empty()) return ridgeSuccess;  // RIDGE_SPLIT_NOCOLOR
    leader = members.front();
    newSize = static_cast<int>(members.size());
    newRank = static_cast<int>(std::find(members.begin(), members.end(), comm->rank) - members.begin());
  }
  return initRank(fn, newcomm, newSize, ids[leader], newRank, config, timeout);
}

namespace {

// "{0, 3}": the ranks a survivor excludes, for messages.
std::string rankSet(const std::vector<uint8_t>& excluded) {
  std::string out = "{";
  for (size_t r = 0; r < excluded.size(); ++r)
    if (excluded[r]) out += (out.size() > 1 ? ", " : "") + std::to_string(r);
  return out + "}";
}

// The survivors' meeting of ridgeCommShrink, through the parent's bootstrap between survivors
// only. Every survivor tells the new rank 0 (the lowest survivor) which ranks it excludes; once
// all have arrived and agree, the new rank 0 creates the new communicator's id and hands it to
// each. Arrival first, then the id: survivors notice a failure up to one timeout apart (one
// gets a remote error at once, another waits out RIDGE_TIMEOUT), so the waits here are longer
// than the parent's timeout, and the new communicator's rendezvous starts on every survivor
// within moments of the others. Survivors that disagree on the list fail alike with a message
// instead of building communicators that never meet.
Status meetSurvivors(ridgeComm* comm, const std::vector<uint8_t>& excluded, const std::vector<int>& survivors,
                     ridgeUniqueId* id) {
  const char* fn = "ridgeCommShrink";
  const uint32_t number = comm->shrinkCount++ & 0xffffu;
  const uint32_t arrivalTag = 0x53410000u | number;  // "SA": a survivor arrived, with its list
  const uint32_t idTag = 0x53490000u | number;       // "SI": the id (or why there is none)
  // The new rank 0 waits for all arrivals until twice the timeout after its own; the others wait
  // for its answer three times the timeout, so that one that came up to a timeout before it
  // still hears why it gave up.
  const int timeout = std::max(1, comm->timeoutSec);
  const int arrivalWaitSec = 2 * timeout, answerWaitSec = 3 * timeout;
  const size_t n = excluded.size();
  // The answer: ridgeSuccess or the new rank 0's error, the survivor that error is about (-1:
  // none), the new rank 0's set, then the id.
  struct Answer {
    int32_t code;
    int32_t otherRank;
    ridgeUniqueId id;
  };
  std::vector<uint8_t> answer(sizeof(Answer) + n);
  Answer head{};
  if (survivors.front() != comm->rank) {
    if (Status sent = comm->bootstrap->send(survivors.front(), arrivalTag, excluded.data(), n); !sent.isOk())
      return Status(sent.code(),
                    format("%s: rank %d: could not reach rank %d, the lowest survivor (which creates "
                           "the new communicator): %s",
                           fn, comm->rank, survivors.front(), sent.message().c_str()));
    Status got = comm->bootstrap->recv(survivors.front(), idTag, answer.data(), answer.size(), answerWaitSec);
    if (!got.isOk())
      return Status(got.code(),
                    format("%s: rank %d: no answer from rank %d, the lowest survivor (which creates "
                           "the new communicator) within %d s: %s",
                           fn, comm->rank, survivors.front(), answerWaitSec, got.message().c_str()));
    std::memcpy(&head, answer.data(), sizeof head);
    const std::vector<uint8_t> theirs(answer.begin() + sizeof head, answer.end());
    if (theirs != excluded)
      return makeError(ridgeInvalidUsage,
                       "%s: rank %d excludes %s but rank %d excludes %s: every survivor must "
                       "pass the same excludeRanks",
                       fn, comm->rank, rankSet(excluded).c_str(), survivors.front(), rankSet(theirs).c_str());
    if (head.code != ridgeSuccess) {
      const ridgeResult_t code = static_cast<ridgeResult_t>(head.code);
      if (head.otherRank < 0)
        return makeError(code,
                         "%s: rank %d: rank %d, the lowest survivor, could not create the new "
                         "communicator's id (its own error says why)",
                         fn, comm->rank, survivors.front());
      return makeError(code,
                       "%s: rank %d: rank %d, the lowest survivor, gave up: rank %d %s; no new communicator",
                       fn, comm->rank, survivors.front(), head.otherRank,
                       code == ridgeInvalidUsage ? "passed another excludeRanks"
                                                 : "did not arrive in time (it died, hangs, or sees another "
                                                   "lowest survivor)");
    }
    *id = head.id;
    return Status::ok();
  }
  // The new rank 0: every other survivor's set, then the answer to all.
  Status failure;
  std::vector<uint8_t> theirs(n);
  head.otherRank = -1;
  const auto arrivalsBy = std::chrono::steady_clock::now() + std::chrono::seconds(arrivalWaitSec);
  for (size_t i = 1; i < survivors.size() && failure.isOk(); ++i) {
    const auto left = std::chrono::duration<double>(arrivalsBy - std::chrono::steady_clock::now()).count();
    Status got = comm->bootstrap->recv(survivors[i], arrivalTag, theirs.data(), n,
                                       std::max(1, static_cast<int>(std::ceil(left))));
    if (!got.isOk()) {
      failure =
          Status(got.code(), format("%s: rank %d: rank %d did not arrive at the shrink within %d s: %s", fn,
                                    comm->rank, survivors[i], arrivalWaitSec, got.message().c_str()));
    } else if (theirs != excluded) {
      failure = makeError(ridgeInvalidUsage,
                          "%s: rank %d excludes %s but rank %d excludes %s: every survivor "
                          "must pass the same excludeRanks",
                          fn, comm->rank, rankSet(excluded).c_str(), survivors[i], rankSet(theirs).c_str());
    }
    if (!failure.isOk()) head.otherRank = survivors[i];
  }
  if (failure.isOk()) failure = createUniqueId(&head.id);
  head.code = failure.isOk() ? ridgeSuccess : failure.code();
  std::memcpy(answer.data(), &head, sizeof head);
  std::memcpy(answer.data() + sizeof head, excluded.data(), n);
  // Also after a failure: the survivors that arrived learn it now, with the same code, instead
  // of timing out.
  for (size_t i = 1; i < survivors.size(); ++i) {
    if (survivors[i] == head.otherRank && head.code != ridgeInvalidUsage) continue;  // it never came
    Status sent = comm->bootstrap->send(survivors[i], idTag, answer.data(), answer.size());
    if (failure.isOk() && !sent.isOk()) failure = sent;
  }
  RIDGE_TRY(failure);
  *id = head.id;
  return Status::ok();
}

}  // namespace

RIDGE_API ridgeResult_t ridgeCommShrink(ridgeComm_t comm, const int* excludeRanks, int excludeCount,
                                        ridgeComm_t* newcomm, ridgeConfig_t* config, int shrinkFlags) {
  const char* fn = "ridgeCommShrink";
  // A communicator broken by a dead rank is what shrink is for.
  RIDGE_CHECK(comm, checkComm(fn, comm, /*allowBroken=*/true));
  if (!newcomm) return fail(comm, badArg(fn, "newcomm is NULL"));
  *newcomm = nullptr;
  if (excludeCount < 0)
    return fail(comm, makeError(ridgeInvalidArgument, "%s: excludeCount %d < 0", fn, excludeCount));
  if (excludeCount > 0 && !excludeRanks)
    return fail(comm, makeError(ridgeInvalidArgument, "%s: excludeRanks is NULL with excludeCount %d", fn,
                                excludeCount));
  if (shrinkFlags != RIDGE_SHRINK_DEFAULT && shrinkFlags != RIDGE_SHRINK_ABORT)
    return fail(comm, makeError(ridgeInvalidArgument,
                                "%s: shrinkFlags %d is neither RIDGE_SHRINK_DEFAULT nor RIDGE_SHRINK_ABORT",
                                fn, shrinkFlags));
  RIDGE_CHECK(comm, checkConfig(fn, config));
  // The list is read only up to the first bad entry, so a count larger than the array it
  // came with is caught by a range or duplicate check rather than read far past its end.
  std::vector<uint8_t> excluded(comm->nranks, 0);
  for (int i = 0; i < excludeCount; ++i) {
    const int r = excludeRanks[i];
    if (r < 0 || r >= comm->nranks)
      return fail(comm, makeError(ridgeInvalidArgument, "%s: excludeRanks[%d] = %d is out of range [0, %d)",
                                  fn, i, r, comm->nranks));
    if (excluded[r])
      return fail(comm, makeError(ridgeInvalidArgument,
                                  "%s: excludeRanks names rank %d twice (excludeRanks[%d])", fn, r, i));
    excluded[r] = 1;
  }
  if (excludeCount == comm->nranks)
    return fail(comm, makeError(ridgeInvalidArgument,
                                "%s: excludeRanks names all %d ranks (excludeCount %d); nobody would be left",
                                fn, comm->nranks, excludeCount));
  if (excluded[comm->rank])
    return fail(comm, makeError(ridgeInvalidArgument,
                                "%s: excludeRanks names this rank (%d); an excluded rank must not call it",
                                fn, comm->rank));
  if (group().depth > 0)
    return fail(comm, makeError(ridgeInvalidUsage, "%s: called inside a group (ridgeGroupStart)", fn));
  std::vector<int> survivors;
  for (int r = 0; r < comm->nranks; ++r)
    if (!excluded[r]) survivors.push_back(r);
  const int newRank =
      static_cast<int>(std::find(survivors.begin(), survivors.end(), comm->rank) - survivors.begin());
  const int parentTimeout = comm->timeoutSec;
  ridgeUniqueId id;
  {
    // Held throughout, so that ridgeCommAbort on another thread waits for this call to leave
    // instead of freeing comm under it; other calls are those beyond this one.
    InFlight guard(comm);
    if (shrinkFlags == RIDGE_SHRINK_ABORT) {
      // Calls blocked on the parent (waiting for a dead or stopped rank) leave with
      // ridgeAborted, and its proxy drops the device operations it still holds. The parent
      // stays aborted (its teardown then skips flushing to peers that may never read); only its
      // bootstrap is given back, for the survivors' meeting.
      comm->aborted.store(true);
      comm->bootstrapAborted.store(true);
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (comm->callsInFlight.load() > 1 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (comm->callsInFlight.load() > 1)
        return fail(comm, makeError(ridgeInternalError, "%s: a call on comm did not leave within 10 s", fn));
      int expected = ridgeSuccess;
      comm->asyncError.compare_exchange_strong(expected, ridgeAborted);
      comm->bootstrapAborted.store(false);
    } else if (comm->callsInFlight.load() > 1) {
      // The meeting uses the parent's bootstrap, which one thread at a time may use.
      return fail(comm, makeError(ridgeInvalidUsage,
                                  "%s: a call on comm is in flight on another thread; RIDGE_SHRINK_DEFAULT "
                                  "needs none (RIDGE_SHRINK_ABORT aborts it first)",
                                  fn));
    } else if (comm->asyncError.load() == ridgeSuccess) {
      // Device operations queued earlier use the connections; a healthy parent finishes them.
      RIDGE_CHECK(comm, drainDeviceOps(comm));
    }
    RIDGE_CHECK(comm, meetSurvivors(comm, excluded, survivors, &id));
  }
  // Not comm->timeoutSec: once the guard is gone, ridgeCommAbort on another thread may free comm.
  return initRank(fn, newcomm, static_cast<int>(survivors.size()), id, newRank, config, parentTimeout);
}

RIDGE_API ridgeResult_t ridgeCommInitFromEnv(ridgeComm_t* comm) {
  const char* fn = "ridgeCommInitFromEnv";
  if (!comm) return fail(nullptr, badArg(fn, "comm is NULL"));
  LauncherPlace place;
  RIDGE_CHECK(nullptr, launcherPlace(&place));
  // Every rank derives the same secret from what they all know (RIDGE_JOB_KEY or the
  // launcher's job id, and the root address), so no id has to travel. Not from the world
  // size: ranks that disagree on it must reach the root, which reports the mismatch, instead
  // of being turned away as another job's.
  RIDGE_CHECK(nullptr, validateSettings());
  std::string secretSource;
  uint64_t nonce = envJobSecret(place, &secretSource);
  RIDGE_INFO("%s: rank %d of %d, root %s, job secret from %s", fn, place.rank, place.worldSize,
             place.rootAddr.c_str(), secretSource.c_str());
  if (place.rank == 0) {
    if (Status s = startRootService(place.rootAddr, nonce); !s.isOk()) return fail(nullptr, s);
  }
  ridgeUniqueId id;
  if (Status s = uniqueIdFromAddress(place.rootAddr, nonce, &id); !s.isOk()) return fail(nullptr, s);
  return initRank(fn, comm, place.worldSize, id, place.rank, nullptr);
}

RIDGE_API ridgeResult_t ridgeCommFinalize(ridgeComm_t comm) {
  RIDGE_CHECK(comm, checkComm("ridgeCommFinalize", comm, /*allowBroken=*/true));
  return finish(comm, finalizeComm(comm));
}

RIDGE_API ridgeResult_t ridgeCommDestroy(ridgeComm_t comm) {
  if (!comm) return fail(nullptr, badArg("ridgeCommDestroy", "comm is NULL"));
  RIDGE_CHECK(nullptr, HandleRegistry::get().check("ridgeCommDestroy", comm));
  if (comm->initThread.joinable()) comm->initThread.join();
  // Queued device operations finish (bounded) before the bootstrap they may use goes.
  stopGpuProxy(comm, comm->aborted.load());
  if (!comm->finalized && comm->bootstrap) comm->bootstrap->close();
  freeComm(comm);
  return ridgeSuccess;
}

RIDGE_API ridgeResult_t ridgeCommAbort(ridgeComm_t comm) {
  if (!comm) return fail(nullptr, badArg("ridgeCommAbort", "comm is NULL"));
  RIDGE_CHECK(nullptr, HandleRegistry::get().check("ridgeCommAbort", comm));
  comm->aborted.store(true);
  comm->bootstrapAborted.store(true);
  // A thread blocked in a collective notices the flag within a poll slice (<= 100 ms)
  // and leaves; wait for it before freeing, bounded so that abort itself never hangs.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (comm->callsInFlight.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (comm->callsInFlight.load() > 0) {
    // Leaking is better than freeing memory another thread still uses.
    comm->asyncError.store(ridgeAborted);
    return fail(
        comm, makeError(ridgeInternalError, "ridgeCommAbort: a call did not leave within 10 s; comm leaked"));
  }
  if (comm->initThread.joinable()) comm->initThread.join();
  freeComm(comm);
  return ridgeSuccess;
}

RIDGE_API ridgeResult_t ridgeCommGetAsyncError(ridgeComm_t comm, ridgeResult_t* asyncError) {
  if (!comm) return fail(nullptr, badArg("ridgeCommGetAsyncError", "comm is NULL"));
  RIDGE_CHECK(nullptr, HandleRegistry::get().check("ridgeCommGetAsyncError", comm));
  if (!asyncError) return fail(comm, badArg("ridgeCommGetAsyncError", "asyncError is NULL"));
  if (comm->asyncError.load() != ridgeInProgress) pollLLStatus(comm);
  *asyncError = static_cast<ridgeResult_t>(comm->asyncError.load());
  if (*asyncError != ridgeSuccess && *asyncError != ridgeInProgress) {
    std::lock_guard<std::mutex> lock(comm->lastErrorMutex);
    tLastError = comm->lastError;
  }
  return ridgeSuccess;
}

RIDGE_API ridgeResult_t ridgeCommCount(const ridgeComm_t comm, int* count) {
  RIDGE_CHECK(comm, checkComm("ridgeCommCount", comm, true));
  if (!count) return fail(comm, badArg("ridgeCommCount", "count is NULL"));
  *count = comm->nranks;
  return ridgeSuccess;
}

RIDGE_API ridgeResult_t ridgeCommUserRank(const ridgeComm_t comm, int* rank) {
  RIDGE_CHECK(comm, checkComm("ridgeCommUserRank", comm, true));
  if (!rank) return fail(comm, badArg("ridgeCommUserRank", "rank is NULL"));
  *rank = comm->rank;
  return ridgeSuccess;
}

RIDGE_API ridgeResult_t ridgeCommDumpState(const ridgeComm_t comm, int fd) {
  if (fd < 0) return fail(comm, badArg("ridgeCommDumpState", "fd is negative"));
  if (!comm) {
    dumpAllComms(fd);
    return ridgeSuccess;
  }
  RIDGE_CHECK(comm, checkComm("ridgeCommDumpState", comm, true));
  const std::string text = describeState(comm);
  if (::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    return fail(comm, systemError("ridgeCommDumpState: write"));
  return ridgeSuccess;
}

RIDGE_API ridgeResult_t ridgeCommCuDevice(const ridgeComm_t comm, int* device) {
  RIDGE_CHECK(comm, checkComm("ridgeCommCuDevice", comm, true));
  if (!device) return fail(comm, badArg("ridgeCommCuDevice", "device is NULL"));
  *device = comm->cudaDevice;
  return ridgeSuccess;
}

RIDGE_API const char* ridgeGetErrorString(ridgeResult_t result) {
  switch (result) {
    case ridgeSuccess: return "no error";
    case ridgeUnhandledCudaError: return "unhandled CUDA error";
    case ridgeSystemError: return "system call failed";
    case ridgeInternalError: return "internal error (a bug in Ridge)";
    case ridgeInvalidArgument: return "invalid argument";
    case ridgeInvalidUsage: return "invalid usage";
    case ridgeRemoteError: return "remote peer failed or exited";
    case ridgeInProgress: return "operation in progress";
    case ridgeTimeout: return "timed out waiting for a peer (RIDGE_TIMEOUT)";
    case ridgeAborted: return "communicator aborted";
    default: return "unknown result code";
  }
}

RIDGE_API const char* ridgeGetLastError(ridgeComm_t comm) {
  (void)comm;
  return tLastError.c_str();
}

RIDGE_API ridgeResult_t ridgeAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                       ridgeDataType_t datatype, ridgeRedOp_t op, ridgeComm_t comm,
                                       ridgeStream_t stream) {
  return collective("ridgeAllReduce", CollType::AllReduce, sendbuff, recvbuff, count, datatype, op, 0, comm,
                    stream, true, false);
}

RIDGE_API ridgeResult_t ridgeBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                       ridgeDataType_t datatype, int root, ridgeComm_t comm,
                                       ridgeStream_t stream) {
  return collective("ridgeBroadcast", CollType::Broadcast, sendbuff, recvbuff, count, datatype, ridgeSum,
                    root, comm, stream, false, true);
}

RIDGE_API ridgeResult_t ridgeReduce(const void* sendbuff, void* recvbuff, size_t count,
                                    ridgeDataType_t datatype, ridgeRedOp_t op, int root, ridgeComm_t comm,
                                    ridgeStream_t stream) {
  return collective("ridgeReduce", CollType::Reduce, sendbuff, recvbuff, count, datatype, op, root, comm,
                    stream, true, true);
}

RIDGE_API ridgeResult_t ridgeAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                       ridgeDataType_t datatype, ridgeComm_t comm, ridgeStream_t stream) {
  return collective("ridgeAllGather", CollType::AllGather, sendbuff, recvbuff, sendcount, datatype, ridgeSum,
                    0, comm, stream, false, false);
}

RIDGE_API ridgeResult_t ridgeReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                           ridgeDataType_t datatype, ridgeRedOp_t op, ridgeComm_t comm,
                                           ridgeStream_t stream) {
  return collective("ridgeReduceScatter", CollType::ReduceScatter, sendbuff, recvbuff, recvcount, datatype,
                    op, 0, comm, stream, true, false);
}

RIDGE_API ridgeResult_t ridgeAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                      ridgeDataType_t datatype, ridgeComm_t comm, ridgeStream_t stream) {
  return collective("ridgeAlltoAll", CollType::AlltoAll, sendbuff, recvbuff, count, datatype, ridgeSum, 0,
                    comm, stream, false, false);
}

RIDGE_API ridgeResult_t ridgeSend(const void* sendbuff, size_t count, ridgeDataType_t datatype, int peer,
                                  ridgeComm_t comm, ridgeStream_t stream) {
  return collective("ridgeSend", CollType::Send, sendbuff, nullptr, count, datatype, ridgeSum, peer, comm,
                    stream, false, true);
}

RIDGE_API ridgeResult_t ridgeRecv(void* recvbuff, size_t count, ridgeDataType_t datatype, int peer,
                                  ridgeComm_t comm, ridgeStream_t stream) {
  return collective("ridgeRecv", CollType::Recv, nullptr, recvbuff, count, datatype, ridgeSum, peer, comm,
                    stream, false, true);
}

RIDGE_API ridgeResult_t ridgeGroupStart(void) {
  ++group().depth;
  return ridgeSuccess;
}

RIDGE_API ridgeResult_t ridgeGroupEnd(void) {
  const char* fn = "ridgeGroupEnd";
  if (group().depth == 0)
    return fail(nullptr, makeError(ridgeInvalidUsage, "%s: no matching ridgeGroupStart", fn));
  if (--group().depth > 0) return ridgeSuccess;
  if (group().ops.empty()) return ridgeSuccess;
  // The group moves to `running` (ops keeps its capacity for the next group); every exit
  // clears the scratch, which releases the operations' pre-multiplied inputs.
  std::vector<QueuedOp>& ops = group().running;
  ops.swap(group().ops);
  struct ClearScratch {
    ~ClearScratch() {
      for (auto* v : {&group().running, &group().hostOps, &group().deviceOps, &group().perComm}) v->clear();
      group().deviceOfComm.clear();
      group().hostComms.clear();
      group().deviceComms.clear();
      group().args.clear();
    }
  } clearScratch;
  // A communicator's operations in one group run together: all on the caller's thread
  // (host memory) or all as one batch of its proxy (device memory); a mix could deadlock
  // (a device send waiting for a host receive on the other side, or the reverse).
  // One pass: the first operation of each communicator says which kind it is.
  std::vector<SelfCopy> selfCopies;
  if (Status p = pairSelfExchanges(fn, ops, &selfCopies); !p.isOk()) return fail(ops.front().comm, p);
  std::vector<QueuedOp>& hostOps = group().hostOps;
  std::vector<QueuedOp>& deviceOps = group().deviceOps;
  // A group spans few communicators: a linear search, no map.
  std::vector<std::pair<ridgeComm*, bool>>& deviceOfComm = group().deviceOfComm;
  for (const QueuedOp& q : ops) {
    auto first = std::find_if(deviceOfComm.begin(), deviceOfComm.end(),
                              [&](const std::pair<ridgeComm*, bool>& e) { return e.first == q.comm; });
    if (first == deviceOfComm.end())
      deviceOfComm.emplace_back(q.comm, q.device);
    else if (first->second != q.device)
      return fail(q.comm, makeError(ridgeInvalidUsage,
                                    "%s: a group mixes host-memory and device-memory operations on one "
                                    "communicator; put them in separate groups",
                                    fn));
    if (!isSelfExchange(q)) (q.device ? deviceOps : hostOps).push_back(q);
  }
  // No device batch is queued while one of its streams is captured (checked for every
  // communicator first, so that none of the group is queued); host calls with a stream are
  // ordered after the stream's earlier work, as outside a group. Self pairs included.
  for (const QueuedOp& q : ops) {
    Status s = q.device ? refuseCapturingStream(fn, device::runtimeOf(q.comm->emulatedDevice), q.op.stream)
                        : syncStreamForHostCall(fn, q.op.stream);
    if (!s.isOk()) return fail(q.comm, s);
  }
  // The self copies first: on device streams they then precede the group's other work there
  // (the group's operations are unordered among themselves).
  for (const SelfCopy& p : selfCopies) {
    ridgeComm* c = p.send->comm;
    c->callsInFlight.fetch_add(1);
    Status cs = runSelfCopy(p);
    if (!cs.isOk()) {
      ridgeResult_t r = fail(c, cs);
      c->callsInFlight.fetch_sub(1);
      return r;
    }
    c->callsInFlight.fetch_sub(1);
  }
  std::vector<ridgeComm*>& deviceComms = group().deviceComms;
  std::vector<ridgeComm*>& hostComms = group().hostComms;
  Status s = submitDeviceGroup(deviceOps, deviceComms);
  if (!hostOps.empty()) {
    Status h = runGroup(hostOps, hostComms);
    if (s.isOk()) s = h;
  }
  ridgeResult_t result = finish(ops.front().comm, s);
  for (ridgeComm* c : deviceComms) c->callsInFlight.fetch_sub(1);
  for (ridgeComm* c : hostComms) c->callsInFlight.fetch_sub(1);
  return result;
}

RIDGE_API ridgeResult_t ridgeBcast(void* buff, size_t count, ridgeDataType_t datatype, int root,
                                   ridgeComm_t comm, ridgeStream_t stream) {
  return collective("ridgeBcast", CollType::Broadcast, buff, buff, count, datatype, ridgeSum, root, comm,
                    stream, false, true);
}

// Gather and scatter: a group of sends and receives between the root and every other rank,
// plus the root's own block copied locally (stream-ordered for device memory).
static ridgeResult_t rootedExchange(const char* fn, bool gather, const void* sendbuff, void* recvbuff,
                                    size_t count, ridgeDataType_t dt, int root, ridgeComm* comm,
                                    ridgeStream_t stream) {
  RIDGE_CHECK(comm, checkComm(fn, comm));
  RIDGE_CHECK(comm, checkTypeOp(fn, dt, nullptr));
  RIDGE_CHECK(comm, checkSize(fn, count, comm->nranks, dt));
  RIDGE_CHECK(comm, checkRoot(fn, "root", root, comm));
  const bool isRoot = comm->rank == root;
  const size_t all = count * comm->nranks;
  // Gather: every rank reads count of sendbuff, root writes all of recvbuff. Scatter: the reverse.
  RIDGE_CHECK(comm, checkBuffer(fn, "sendbuff", sendbuff, gather ? count : (isRoot ? all : 0)));
  RIDGE_CHECK(comm, checkBuffer(fn, "recvbuff", recvbuff, gather ? (isRoot ? all : 0) : count));
  bool onDevice = false;
  device::PointerKind sendKind, recvKind;
  RIDGE_CHECK(comm, classifyBuffers(fn, comm, sendbuff, gather || isRoot, recvbuff, !gather || isRoot,
                                    &onDevice, &sendKind, &recvKind));
  const size_t bytes = count * dataTypeSize(dt);
  const char* sendBytes = static_cast<const char*>(sendbuff);
  char* recvBytes = static_cast<char*>(recvbuff);
  ridgeGroupStart();
  ridgeResult_t r = ridgeSuccess;
  for (int p = 0; p < comm->nranks && r == ridgeSuccess && count > 0; ++p) {
    if (p == root) continue;
    if (gather && isRoot) r = ridgeRecv(recvBytes + p * bytes, count, dt, p, comm, stream);
    if (gather && p == comm->rank) r = ridgeSend(sendbuff, count, dt, root, comm, stream);
    if (!gather && isRoot) r = ridgeSend(sendBytes + p * bytes, count, dt, p, comm, stream);
    if (!gather && p == comm->rank) r = ridgeRecv(recvbuff, count, dt, root, comm, stream);
  }
  const ridgeResult_t end = ridgeGroupEnd();
  if (r != ridgeSuccess) return r;
  if (end != ridgeSuccess) return end;
  if (!isRoot || count == 0) return ridgeSuccess;
  const char* ownSrc = gather ? sendBytes : sendBytes + root * bytes;
  char* ownDst = gather ? recvBytes + root * bytes : recvBytes;
  if (ownSrc == ownDst) return ridgeSuccess;  // in place
  if (onDevice) {
    Status s = device::runtimeOf(comm->emulatedDevice)->copy(ownDst, ownSrc, bytes, stream);
    if (!s.isOk())
      return fail(comm, Status(s.code(), std::string(fn) + ": copying root's own block: " + s.message()));
  } else {
    std::memmove(ownDst, ownSrc, bytes);
  }
  return ridgeSuccess;
}

RIDGE_API ridgeResult_t ridgeGather(const void* sendbuff, void* recvbuff, size_t count,
                                    ridgeDataType_t datatype, int root, ridgeComm_t comm,
                                    ridgeStream_t stream) {
  return rootedExchange("ridgeGather", true, sendbuff, recvbuff, count, datatype, root, comm, stream);
}

RIDGE_API ridgeResult_t ridgeScatter(const void* sendbuff, void* recvbuff, size_t count,
                                     ridgeDataType_t datatype, int root, ridgeComm_t comm,
                                     ridgeStream_t stream) {
  return rootedExchange("ridgeScatter", false, sendbuff, recvbuff, count, datatype, root, comm, stream);
}

RIDGE_API ridgeResult_t ridgeRedOpCreatePreMulSum(ridgeRedOp_t* op, void* scalar, ridgeDataType_t datatype,
                                                  ridgeScalarResidence_t residence, ridgeComm_t comm) {
  const char* fn = "ridgeRedOpCreatePreMulSum";
  RIDGE_CHECK(comm, checkComm(fn, comm));
  if (!op) return fail(comm, badArg(fn, "op is NULL"));
  if (!scalar) return fail(comm, badArg(fn, "scalar is NULL"));
  RIDGE_CHECK(comm, checkTypeOp(fn, datatype, nullptr));
  if (residence != ridgeScalarDevice && residence != ridgeScalarHostImmediate)
    return fail(comm, makeError(ridgeInvalidArgument,
                                "%s: residence %d is neither ridgeScalarDevice nor ridgeScalarHostImmediate",
                                fn, static_cast<int>(residence)));
  ridgeComm::UserOp u;
  u.live = true;
  u.type = datatype;
  u.residence = residence;
  if (residence == ridgeScalarHostImmediate)
    std::memcpy(u.scalar, scalar, dataTypeSize(datatype));
  else
    u.scalarPtr = scalar;
  std::lock_guard<std::mutex> lock(comm->userOpsMutex);
  size_t index = 0;
  while (index < comm->userOps.size() && comm->userOps[index].live) ++index;
  if (index >= static_cast<size_t>(ridgeMaxRedOp - ridgeNumOps))
    return fail(comm, makeError(ridgeInvalidUsage, "%s: too many live operators on this comm", fn));
  if (index == comm->userOps.size())
    comm->userOps.push_back(u);
  else
    comm->userOps[index] = u;
  *op = static_cast<ridgeRedOp_t>(ridgeNumOps + index);
  return ridgeSuccess;
}

RIDGE_API ridgeResult_t ridgeRedOpDestroy(ridgeRedOp_t op, ridgeComm_t comm) {
  const char* fn = "ridgeRedOpDestroy";
  RIDGE_CHECK(comm, checkComm(fn, comm, /*allowBroken=*/true));
  if (static_cast<unsigned>(op) < static_cast<unsigned>(ridgeNumOps))
    return fail(comm, makeError(ridgeInvalidArgument,
                                "%s: op %d is a built-in operator, not one of "
                                "ridgeRedOpCreatePreMulSum",
                                fn, static_cast<int>(op)));
  const size_t index = static_cast<size_t>(op) - ridgeNumOps;
  std::lock_guard<std::mutex> lock(comm->userOpsMutex);
  if (index >= comm->userOps.size() || !comm->userOps[index].live)
    return fail(comm, makeError(ridgeInvalidArgument, "%s: op %d is not a live operator of this comm", fn,
                                static_cast<int>(op)));
  comm->userOps[index].live = false;
  return ridgeSuccess;
}

namespace {
// Allocations of ridgeMemAlloc and what each is.
enum class MemKind { Host, SharedHost, Device };
std::mutex gMemMutex;
std::unordered_map<void*, MemKind> gMemAllocations;
}  // namespace

RIDGE_API ridgeResult_t ridgeMemAlloc(void** ptr, size_t size) {
  const char* fn = "ridgeMemAlloc";
  if (!ptr) return fail(nullptr, badArg(fn, "ptr is NULL"));
  *ptr = nullptr;
  if (size == 0) return fail(nullptr, badArg(fn, "size is 0"));
  if (size > SIZE_MAX - 4096) return fail(nullptr, badArg(fn, "size is too large"));
  void* p = nullptr;
  device::DeviceRuntime* rt = device::activeRuntime();
  MemKind kind = rt && rt->deviceCount() > 0 ? MemKind::Device : MemKind::SharedHost;
  if (kind == MemKind::Device) {
    RIDGE_CHECK(nullptr, rt->allocDevice(size, &p));
  } else {
    // Shareable: peers of this host map it and copy with plain loads and stores instead of a
    // cross-memory-attach call per access (core/shared_segments.h). Private memory when memfd
    // is unavailable.
    p = allocateSharedSegment(size);
    if (!p) {
      kind = MemKind::Host;
      p = std::aligned_alloc(4096, (size + 4095) / 4096 * 4096);
    }
    if (!p) return fail(nullptr, makeError(ridgeSystemError, "%s: no memory for %zu bytes", fn, size));
  }
  std::lock_guard<std::mutex> lock(gMemMutex);
  gMemAllocations[p] = kind;
  *ptr = p;
  return ridgeSuccess;
}

RIDGE_API ridgeResult_t ridgeMemFree(void* ptr) {
  const char* fn = "ridgeMemFree";
  if (!ptr) return fail(nullptr, badArg(fn, "ptr is NULL"));
  MemKind kind = MemKind::Host;
  {
    std::lock_guard<std::mutex> lock(gMemMutex);
    auto it = gMemAllocations.find(ptr);
    if (it == gMemAllocations.end())
      return fail(nullptr, makeError(ridgeInvalidArgument,
                                     "%s: ptr %p was not returned by ridgeMemAlloc (or was "
                                     "freed already)",
                                     fn, ptr));
    kind = it->second;
    gMemAllocations.erase(it);
  }
  if (kind == MemKind::Device)
    device::activeRuntime()->freeDevice(ptr);
  else if (kind == MemKind::SharedHost)
    (void)freeSharedSegment(ptr);
  else
    std::free(ptr);
  return ridgeSuccess;
}

RIDGE_API ridgeResult_t ridgeCommRegister(const ridgeComm_t comm, void* buff, size_t size, void** handle) {
  const char* fn = "ridgeCommRegister";
  RIDGE_CHECK(comm, checkComm(fn, comm, /*allowBroken=*/true));
  if (!handle) return fail(comm, badArg(fn, "handle is NULL"));
  *handle = nullptr;
  if (!buff) return fail(comm, badArg(fn, "buff is NULL"));
  if (size == 0) return fail(comm, badArg(fn, "size is 0"));
  if (reinterpret_cast<uintptr_t>(buff) > UINTPTR_MAX - size)
    return fail(comm, badArg(fn, "buff + size wraps around the address space"));
  auto reg = std::make_unique<ridgeComm::Registration>();
  reg->base = static_cast<const char*>(buff);
  reg->bytes = size;
  device::DeviceRuntime* rt = device::activeRuntime();
  const bool host = !rt || rt->deviceCount() == 0 || rt->classify(buff).kind == device::PointerKind::Host;
  // Best effort: over RLIMIT_MEMLOCK the registration still counts, unlocked.
  reg->locked = host && mlock(buff, size) == 0;
  std::lock_guard<std::mutex> lock(comm->registrationsMutex);
  *handle = reg.get();
  comm->registrations.push_back(std::move(reg));
  return ridgeSuccess;
}

RIDGE_API ridgeResult_t ridgeCommDeregister(const ridgeComm_t comm, void* handle) {
  const char* fn = "ridgeCommDeregister";
  RIDGE_CHECK(comm, checkComm(fn, comm, /*allowBroken=*/true));
  if (!handle) return fail(comm, badArg(fn, "handle is NULL"));
  std::lock_guard<std::mutex> lock(comm->registrationsMutex);
  auto& regs = comm->registrations;
  auto it = std::find_if(regs.begin(), regs.end(), [&](const auto& r) { return r.get() == handle; });
  if (it == regs.end())
    return fail(comm, makeError(ridgeInvalidArgument,
                                "%s: handle %p is not a live registration of this comm (another comm's, or "
                                "deregistered already)",
                                fn, handle));
  std::unique_ptr<ridgeComm::Registration> gone = std::move(*it);
  regs.erase(it);
  if (gone->locked) {
    // Locks do not nest: unlock, then lock again what other registrations still cover.
    munlock(gone->base, gone->bytes);
    for (const auto& r : regs)
      if (r->locked && r->base < gone->base + gone->bytes && gone->base < r->base + r->bytes)
        mlock(r->base, r->bytes);
  }
  return ridgeSuccess;
}

// ---- RIDGE_DEVICE=emulated (ridge/ridge_emulated.h): a testing aid ----------------------

namespace {
Status emulatedOnly(const char* fn, device::DeviceRuntime** rt) {
  *rt = device::emulatedBySettings() ? device::activeRuntime() : nullptr;
  if (!*rt || std::strcmp((*rt)->name(), "emulated") != 0)
    return makeError(ridgeInvalidUsage,
                     "%s: RIDGE_DEVICE is not emulated (the emulated runtime is a testing aid)", fn);
  return Status::ok();
}
}  // namespace

RIDGE_API int ridgeEmulatedDeviceCount(void) {
  device::DeviceRuntime* rt = nullptr;
  return emulatedOnly("ridgeEmulatedDeviceCount", &rt).isOk() ? rt->deviceCount() : 0;
}

RIDGE_API ridgeResult_t ridgeEmulatedSetDevice(int device) {
  device::DeviceRuntime* rt = nullptr;
  RIDGE_CHECK(nullptr, emulatedOnly("ridgeEmulatedSetDevice", &rt));
  RIDGE_CHECK(nullptr, rt->bindThread(device));
  return ridgeSuccess;
}

RIDGE_API ridgeResult_t ridgeEmulatedMemcpy(void* dst, const void* src, size_t bytes) {
  const char* fn = "ridgeEmulatedMemcpy";
  device::DeviceRuntime* rt = nullptr;
  RIDGE_CHECK(nullptr, emulatedOnly(fn, &rt));
  if (!dst || !src) return fail(nullptr, badArg(fn, "dst or src is NULL"));
  if (bytes == 0) return ridgeSuccess;
  ridgeStream_t stream = nullptr;
  RIDGE_CHECK(nullptr, rt->createStream(&stream));
  Status s = rt->copy(dst, src, bytes, stream);
  Status done = rt->synchronize(stream);
  rt->destroyStream(stream);
  RIDGE_CHECK(nullptr, s);
  RIDGE_CHECK(nullptr, done);
  return ridgeSuccess;
}

RIDGE_API ridgeResult_t ridgeEmulatedStreamCreate(ridgeStream_t* stream) {
  const char* fn = "ridgeEmulatedStreamCreate";
  device::DeviceRuntime* rt = nullptr;
  RIDGE_CHECK(nullptr, emulatedOnly(fn, &rt));
  if (!stream) return fail(nullptr, badArg(fn, "stream is NULL"));
  RIDGE_CHECK(nullptr, rt->createStream(stream));
  return ridgeSuccess;
}

RIDGE_API ridgeResult_t ridgeEmulatedStreamSynchronize(ridgeStream_t stream) {
  device::DeviceRuntime* rt = nullptr;
  RIDGE_CHECK(nullptr, emulatedOnly("ridgeEmulatedStreamSynchronize", &rt));
  RIDGE_CHECK(nullptr, rt->synchronize(stream));
  return ridgeSuccess;
}

RIDGE_API ridgeResult_t ridgeEmulatedStreamDestroy(ridgeStream_t stream) {
  const char* fn = "ridgeEmulatedStreamDestroy";
  device::DeviceRuntime* rt = nullptr;
  RIDGE_CHECK(nullptr, emulatedOnly(fn, &rt));
  if (!stream) return fail(nullptr, badArg(fn, "stream is NULL (the default stream is not destroyed)"));
  rt->destroyStream(stream);
  return ridgeSuccess;
}

}  // extern "C"
