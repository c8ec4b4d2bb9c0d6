// The C ABI. Every entry point validates its arguments, runs the C++ core, and turns a
// Status into a result code plus the ridgeGetLastError() text: this file is the one
// place where that conversion happens.
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "coll/algorithms.h"
#include "coll/comm.h"
#include "coll/executor.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/settings.h"
#include "reduce/reduce.h"
#include "ridge/ridge.h"

#ifdef RIDGE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

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
  if (p && count > 0) {
    MemoryKind kind = classifyMemory(p);
    if (kind == MemoryKind::Device)
      return makeError(ridgeInvalidUsage,
                       "%s: %s is %s memory; this release moves host memory only (the GPU data path "
                       "is not built yet)",
                       fn, name, memoryKindName(kind));
  }
  return Status::ok();
}

Status checkStream(const char* fn, ridgeStream_t stream) {
  if (!stream) return Status::ok();
#ifdef RIDGE_HAVE_CUDA
  // Host-memory collectives run on the calling thread: order them after the work already
  // queued on the caller's stream, as a stream-ordered call would be.
  cudaError_t e = cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream));
  if (e != cudaSuccess)
    return makeError(ridgeUnhandledCudaError, "%s: cudaStreamSynchronize: %s", fn, cudaGetErrorString(e));
  return Status::ok();
#else
  return makeError(ridgeInvalidArgument, "%s: stream must be NULL in a build without CUDA", fn);
#endif
}

Status checkRoot(const char* fn, const char* name, int root, ridgeComm* comm) {
  if (root < 0 || root >= comm->nranks)
    return makeError(ridgeInvalidArgument, "%s: %s %d is out of range [0, %d)", fn, name, root, comm->nranks);
  return Status::ok();
}

// ---- groups ----------------------------------------------------------------------------

struct QueuedOp {
  ridgeComm* comm;
  CollArgs args;
};

struct GroupState {
  int depth = 0;
  std::vector<QueuedOp> ops;
};
thread_local GroupState tGroup;

// Runs a communicator's collectives in call order, then its point-to-point chains.
// Chains to different peers run concurrently; operations on one (peer, direction) keep
// their order, which is how sends and receives are matched.
Task runSequence(ridgeComm* comm, std::vector<CollArgs> ops, std::vector<std::vector<CollArgs>> chains) {
  for (const CollArgs& a : ops) {
    Status s = co_await runCollective(comm, a);
    if (!s.isOk()) co_return s;
  }
  for (auto& chain : chains) {
    if (chain.empty()) continue;
    // A chain must not start before this strand finished the collectives (they share
    // the FIFOs), hence spawned here rather than up front.
    co_await SpawnTask{comm, runSequence(comm, std::move(chain), {})};
  }
  co_return Status::ok();
}

}  // namespace

namespace {

// Runs the queued operations; `comms` receives each communicator involved, whose
// callsInFlight the caller must drop once it no longer touches them.
Status runGroup(std::vector<QueuedOp>& ops, std::vector<ridgeComm*>& comms) {
  Executor& ex = Executor::forThisThread();
  for (const QueuedOp& q : ops) {
    bool known = false;
    for (ridgeComm* c : comms) known = known || c == q.comm;
    if (!known) comms.push_back(q.comm);
  }
  for (ridgeComm* c : comms) {
    std::vector<CollArgs> colls;
    // chains[2*peer] = sends to peer, chains[2*peer+1] = receives from peer
    std::vector<std::vector<CollArgs>> chains(2 * static_cast<size_t>(c->nranks));
    for (const QueuedOp& q : ops) {
      if (q.comm != c) continue;
      if (q.args.type == CollType::Send)
        chains[2 * q.args.root].push_back(q.args);
      else if (q.args.type == CollType::Recv)
        chains[2 * q.args.root + 1].push_back(q.args);
      else
        colls.push_back(q.args);
    }
    if (colls.empty()) {
      for (auto& chain : chains)
        if (!chain.empty()) ex.spawn(c, runSequence(c, std::move(chain), {}));
    } else {
      ex.spawn(c, runSequence(c, std::move(colls), std::move(chains)));
    }
    c->callsInFlight.fetch_add(1);
  }
  return ex.run();
}

// Queues the operation inside a group; otherwise runs it now.
ridgeResult_t submit(ridgeComm* comm, const CollArgs& args) {
  if (tGroup.depth > 0) {
    tGroup.ops.push_back({comm, args});
    return ridgeSuccess;
  }
  Executor& ex = Executor::forThisThread();
  comm->callsInFlight.fetch_add(1);
  ex.spawn(comm, runCollective(comm, args));
  ridgeResult_t result = finish(comm, ex.run());
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
  // Which buffers are read/written depends on the collective and on the root.
  const size_t sendCount =
      type == CollType::ReduceScatter || type == CollType::AlltoAll ? count * blocks : count;
  const size_t recvCount = type == CollType::AllGather || type == CollType::AlltoAll ? count * blocks : count;
  const bool readsSend = type != CollType::Recv && (type != CollType::Broadcast || root == comm->rank);
  const bool writesRecv = type != CollType::Send && (type != CollType::Reduce || root == comm->rank);
  if (readsSend) RIDGE_CHECK(comm, checkBuffer(fn, "sendbuff", send, sendCount));
  if (writesRecv) RIDGE_CHECK(comm, checkBuffer(fn, "recvbuff", recv, recvCount));
  RIDGE_CHECK(comm, checkStream(fn, stream));
  CollArgs args{type, send, recv, count, dt, hasOp ? op : ridgeSum, root};
  return submit(comm, args);
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
  *device = -1;
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
  if (tGroup.depth == 0)
    return fail(nullptr, makeError(ridgeInvalidUsage, "ridgeGroupEnd: no matching ridgeGroupStart"));
  if (--tGroup.depth > 0) return ridgeSuccess;
  std::vector<QueuedOp> ops;
  ops.swap(tGroup.ops);
  if (ops.empty()) return ridgeSuccess;
  std::vector<ridgeComm*> comms;
  Status s = runGroup(ops, comms);
  ridgeResult_t result = finish(comms.front(), s);
  for (ridgeComm* c : comms) c->callsInFlight.fetch_sub(1);
  return result;
}

}  // extern "C"
