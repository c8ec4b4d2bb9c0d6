// The C ABI. Every entry point validates its arguments, runs the C++ core, and turns a
// Status into a result code plus the ridgeGetLastError() text: this file is the one
// place where that conversion happens.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "coll/algorithms.h"
#include "coll/batch.h"
#include "coll/comm.h"
#include "coll/executor.h"
#include "coll/gpu_proxy.h"
#include "core/log.h"
#include "core/settings.h"
#include "device/runtime.h"
#include "reduce/reduce.h"
#include "ridge/ridge.h"

using namespace ridge;

namespace {

thread_local std::string tLastError;

ridgeResult_t fail(ridgeComm* comm, const Status& s) {
  tLastError = s.message();
  if (comm && comm->magic == ridgeComm::kMagic) {
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
  if (comm->magic != ridgeComm::kMagic)
    return badArg(fn, "comm is not a live communicator (destroyed or garbage)");
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
// Device or managed: the stream-ordered path (coll/gpu_proxy.h). A mix is refused. The kinds
// found (Host for a buffer the call does not use) travel with the operation (DeviceOp).
Status classifyBuffers(const char* fn, ridgeComm* comm, const void* send, bool readsSend, const void* recv,
                       bool writesRecv, bool* onDevice, device::PointerKind* sendKind,
                       device::PointerKind* recvKind) {
  *onDevice = false;
  *sendKind = *recvKind = device::PointerKind::Host;
  device::DeviceRuntime* rt = device::activeRuntime();
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
};

struct GroupState {
  int depth = 0;
  std::vector<QueuedOp> ops;
};
thread_local GroupState tGroup;

// Calls fn(comm, its operations) once per communicator of `ops`, in order of first
// appearance; `comms` receives each communicator handled, whose callsInFlight (raised here)
// the caller must drop once it no longer touches them. Stops at the first error.
template <class Fn>
Status forEachComm(const std::vector<QueuedOp>& ops, std::vector<ridgeComm*>& comms, Fn fn) {
  std::vector<QueuedOp> mine;
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
  std::vector<CollArgs> args;
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
  device::DeviceRuntime* rt = device::activeRuntime();
  std::vector<DeviceOp> batch;
  return forEachComm(ops, comms, [&](ridgeComm* c, const std::vector<QueuedOp>& mine) {
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

// Queues the operation inside a group; otherwise runs it now (host memory) or hands it to
// the communicator's proxy (device memory).
ridgeResult_t submit(ridgeComm* comm, const DeviceOp& op, bool device) {
  if (tGroup.depth > 0) {
    tGroup.ops.push_back({comm, op, device});
    return ridgeSuccess;
  }
  comm->callsInFlight.fetch_add(1);
  Status s;
  if (device && oneRankDeviceCopyTakes(comm, op)) {
    s = runOneRankDeviceCopy(comm, device::activeRuntime(), op);
  } else if (device && llTakes(comm, op)) {
    s = launchLL(comm, device::activeRuntime(), op);
  } else if (device) {
    s = submitDeviceBatch(comm, device::activeRuntime(), &op, 1);
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

ridgeResult_t collective(const char* fn, CollType type, const void* send, void* recv, size_t count,
                         ridgeDataType_t dt, ridgeRedOp_t op, int root, ridgeComm* comm, ridgeStream_t stream,
                         bool hasOp, bool hasRoot) {
  RIDGE_CHECK(comm, checkComm(fn, comm));
  RIDGE_CHECK(comm, checkTypeOp(fn, dt, hasOp ? &op : nullptr));
  const size_t blocks =
      (type == CollType::AllGather || type == CollType::ReduceScatter || type == CollType::AlltoAll)
          ? static_cast<size_t>(comm->nranks)
          : 1;
  RIDGE_CHECK(comm, checkSize(fn, count, blocks, dt));
  if (hasRoot)
    RIDGE_CHECK(
        comm, checkRoot(fn, type == CollType::Send || type == CollType::Recv ? "peer" : "root", root, comm));
  if ((type == CollType::Send || type == CollType::Recv) && root == comm->rank)
    return fail(comm, makeError(ridgeInvalidArgument,
                                "%s: peer %d is this rank; send to self is not supported", fn, root));
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
  if (!onDevice && !device::activeRuntime() && stream)
    return fail(comm, makeError(ridgeInvalidArgument, "%s: stream must be NULL in a build without CUDA", fn));
  if (!onDevice && tGroup.depth == 0) RIDGE_CHECK(comm, syncStreamForHostCall(fn, stream));
  if (onDevice && tGroup.depth == 0)
    RIDGE_CHECK(comm, refuseCapturingStream(fn, device::activeRuntime(), stream));
  return submit(comm, call, onDevice);
}

}  // namespace

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

static ridgeResult_t initRank(const char* fn, ridgeComm_t* out, int nranks, const ridgeUniqueId& id, int rank,
                              const ridgeConfig_t* config) {
  if (!out) return fail(nullptr, badArg(fn, "comm is NULL"));
  *out = nullptr;
  if (nranks < 1) return fail(nullptr, makeError(ridgeInvalidArgument, "%s: nranks %d < 1", fn, nranks));
  if (rank < 0 || rank >= nranks)
    return fail(nullptr,
                makeError(ridgeInvalidArgument, "%s: rank %d is out of range [0, %d)", fn, rank, nranks));
  UniqueIdInfo info;
  if (Status s = decodeUniqueId(id, &info); !s.isOk())
    return fail(nullptr, Status(ridgeInvalidArgument, std::string(fn) + ": commId: " + s.message()));
  bool blocking = true;
  auto* comm = new ridgeComm();
  comm->rank = rank;
  comm->nranks = nranks;
  comm->timeoutSec = defaultTimeout();
  comm->name = "comm";
  // As NCCL: the communicator serves the device current on the calling thread. Read here,
  // on that thread: a non-blocking init runs initComm on a thread of its own, whose current
  // device is the runtime's default (CUDA: device 0), not the caller's.
  if (device::DeviceRuntime* rt = device::activeRuntime(); rt && rt->deviceCount() > 0)
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

RIDGE_API ridgeResult_t ridgeCommInitRankConfig(ridgeComm_t* comm, int nranks, ridgeUniqueId commId, int rank,
                                                ridgeConfig_t* config) {
  const char* fn = "ridgeCommInitRankConfig";
  if (config) {
    if (config->magic != RIDGE_CONFIG_MAGIC ||
        config->size < offsetof(ridgeConfig_t, blocking) + sizeof(int) ||
        config->size > sizeof(ridgeConfig_t))
      return fail(nullptr,
                  badArg(fn, "config was not initialized with RIDGE_CONFIG_INITIALIZER (bad magic or size)"));
    if (config->blocking != RIDGE_CONFIG_UNDEF_INT && config->blocking != 0 && config->blocking != 1)
      return fail(nullptr, makeError(ridgeInvalidArgument, "%s: config->blocking must be 0 or 1, not %d", fn,
                                     config->blocking));
    if (config->timeoutSeconds != RIDGE_CONFIG_UNDEF_INT && config->timeoutSeconds <= 0)
      return fail(nullptr, makeError(ridgeInvalidArgument, "%s: config->timeoutSeconds must be > 0, not %d",
                                     fn, config->timeoutSeconds));
  }
  return initRank(fn, comm, nranks, commId, rank, config);
}

RIDGE_API ridgeResult_t ridgeCommInitFromEnv(ridgeComm_t* comm) {
  const char* fn = "ridgeCommInitFromEnv";
  if (!comm) return fail(nullptr, badArg(fn, "comm is NULL"));
  auto envOr = [](const char* a, const char* b) -> std::string {
    const char* v = std::getenv(a);
    if (v && *v) return v;
    v = b ? std::getenv(b) : nullptr;
    return v ? v : "";
  };
  std::string rankText = envOr("RIDGE_RANK", "RANK"), sizeText = envOr("RIDGE_WORLD_SIZE", "WORLD_SIZE");
  std::string addr = envOr("RIDGE_ROOT_ADDR", nullptr);
  if (addr.empty()) {
    std::string host = envOr("MASTER_ADDR", nullptr), port = envOr("MASTER_PORT", nullptr);
    if (!host.empty() && !port.empty())
      addr = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + port;
  }
  if (rankText.empty() || sizeText.empty() || addr.empty())
    return fail(nullptr, makeError(ridgeInvalidUsage,
                                   "%s: set RIDGE_RANK, RIDGE_WORLD_SIZE and RIDGE_ROOT_ADDR (host:port), or "
                                   "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT",
                                   fn));
  char* end = nullptr;
  long rank = std::strtol(rankText.c_str(), &end, 10);
  bool ok = *end == 0;
  long size = std::strtol(sizeText.c_str(), &end, 10);
  ok = ok && *end == 0;
  if (!ok || size < 1 || size > INT_MAX || rank < 0 || rank >= size)
    return fail(nullptr, makeError(ridgeInvalidArgument, "%s: rank '%s' / world size '%s' are not valid", fn,
                                   rankText.c_str(), sizeText.c_str()));
  // Every rank derives the same nonce from what they all know, so no id has to travel.
  uint64_t nonce = std::hash<std::string>{}(addr + "/" + sizeText) | 1;
  if (rank == 0) {
    if (Status s = startRootService(addr, nonce); !s.isOk()) return fail(nullptr, s);
  }
  ridgeUniqueId id;
  if (Status s = uniqueIdFromAddress(addr, nonce, &id); !s.isOk()) return fail(nullptr, s);
  return initRank(fn, comm, static_cast<int>(size), id, static_cast<int>(rank), nullptr);
}

RIDGE_API ridgeResult_t ridgeCommFinalize(ridgeComm_t comm) {
  RIDGE_CHECK(comm, checkComm("ridgeCommFinalize", comm, /*allowBroken=*/true));
  return finish(comm, finalizeComm(comm));
}

RIDGE_API ridgeResult_t ridgeCommDestroy(ridgeComm_t comm) {
  if (!comm) return fail(nullptr, badArg("ridgeCommDestroy", "comm is NULL"));
  if (comm->magic != ridgeComm::kMagic)
    return fail(nullptr, badArg("ridgeCommDestroy", "comm is not a live communicator"));
  if (comm->initThread.joinable()) comm->initThread.join();
  // Queued device operations finish (bounded) before the bootstrap they may use goes.
  stopGpuProxy(comm, comm->aborted.load());
  if (!comm->finalized && comm->bootstrap) comm->bootstrap->close();
  freeComm(comm);
  return ridgeSuccess;
}

RIDGE_API ridgeResult_t ridgeCommAbort(ridgeComm_t comm) {
  if (!comm) return fail(nullptr, badArg("ridgeCommAbort", "comm is NULL"));
  if (comm->magic != ridgeComm::kMagic)
    return fail(nullptr, badArg("ridgeCommAbort", "comm is not a live communicator"));
  comm->aborted.store(true);
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
  if (!comm || comm->magic != ridgeComm::kMagic)
    return fail(nullptr,
                badArg("ridgeCommGetAsyncError", comm ? "comm is not a live communicator" : "comm is NULL"));
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
  ++tGroup.depth;
  return ridgeSuccess;
}

RIDGE_API ridgeResult_t ridgeGroupEnd(void) {
  const char* fn = "ridgeGroupEnd";
  if (tGroup.depth == 0)
    return fail(nullptr, makeError(ridgeInvalidUsage, "%s: no matching ridgeGroupStart", fn));
  if (--tGroup.depth > 0) return ridgeSuccess;
  std::vector<QueuedOp> ops;
  ops.swap(tGroup.ops);
  if (ops.empty()) return ridgeSuccess;
  // A communicator's operations in one group run together: all on the caller's thread
  // (host memory) or all as one batch of its proxy (device memory); a mix could deadlock
  // (a device send waiting for a host receive on the other side, or the reverse).
  // One pass: the first operation of each communicator says which kind it is.
  std::vector<QueuedOp> hostOps, deviceOps;
  std::unordered_map<ridgeComm*, bool> deviceOfComm;
  for (const QueuedOp& q : ops) {
    const auto [first, inserted] = deviceOfComm.emplace(q.comm, q.device);
    if (!inserted && first->second != q.device)
      return fail(q.comm, makeError(ridgeInvalidUsage,
                                    "%s: a group mixes host-memory and device-memory operations on one "
                                    "communicator; put them in separate groups",
                                    fn));
    (q.device ? deviceOps : hostOps).push_back(q);
  }
  // No device batch is queued while one of its streams is captured (checked for every
  // communicator first, so that none of the group is queued).
  for (const QueuedOp& q : deviceOps) {
    Status s = refuseCapturingStream(fn, device::activeRuntime(), q.op.stream);
    if (!s.isOk()) return fail(q.comm, s);
  }
  // Host calls with a stream are ordered after the stream's earlier work, as outside a group.
  for (const QueuedOp& q : hostOps) {
    Status s = syncStreamForHostCall(fn, q.op.stream);
    if (!s.isOk()) return fail(q.comm, s);
  }
  std::vector<ridgeComm*> deviceComms, hostComms;
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

}  // extern "C"
