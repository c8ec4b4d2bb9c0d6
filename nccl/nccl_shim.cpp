// libnccl.so.2 on top of Ridge: every function that NVIDIA's nccl.h (NCCL 2.28) declares,
// under its nccl* and pnccl* names, so that a program compiled against that header runs on
// Ridge by linking this library or finding it first on LD_LIBRARY_PATH.
//
// Compiled against NVIDIA's own nccl.h (the CUDA toolkit's), so the compiler checks every
// signature, enum and struct here against it. NCCL's handles are Ridge's under another name
// (an ncclComm_t is a ridgeComm_t), and the result codes, data types, reduction operators and
// the 128-byte unique id share their values and layout (static_asserts below). What Ridge
// cannot do returns ncclInvalidUsage with ncclGetLastError() naming the function, never a
// silent success. NCCL_* environment variables with a RIDGE_* equivalent are mapped once,
// when the library is loaded (applyNcclEnvironment).
#include <nccl.h>
#include <strings.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ridge/ridge.h"

// Layouts and values that the casts below rely on.
static_assert(sizeof(ncclUniqueId) == sizeof(ridgeUniqueId) && NCCL_UNIQUE_ID_BYTES == RIDGE_UNIQUE_ID_BYTES);
static_assert(ncclSuccess == 0 && static_cast<int>(ncclInProgress) == static_cast<int>(ridgeInProgress) &&
              static_cast<int>(ncclRemoteError) == static_cast<int>(ridgeRemoteError) &&
              static_cast<int>(ncclInvalidUsage) == static_cast<int>(ridgeInvalidUsage));
static_assert(static_cast<int>(ncclBfloat16) == static_cast<int>(ridgeBfloat16) &&
              static_cast<int>(ncclFloat64) == static_cast<int>(ridgeFloat64) &&
              static_cast<int>(ncclFloat16) == static_cast<int>(ridgeFloat16));
static_assert(static_cast<int>(ncclAvg) == static_cast<int>(ridgeAvg) &&
              static_cast<int>(ncclNumOps) == static_cast<int>(ridgeNumOps) &&
              sizeof(ncclRedOp_t) == sizeof(ridgeRedOp_t));
static_assert(static_cast<int>(ncclScalarDevice) == static_cast<int>(ridgeScalarDevice) &&
              static_cast<int>(ncclScalarHostImmediate) == static_cast<int>(ridgeScalarHostImmediate));
static_assert(NCCL_SPLIT_NOCOLOR == RIDGE_SPLIT_NOCOLOR && NCCL_SHRINK_ABORT == RIDGE_SHRINK_ABORT &&
              NCCL_SHRINK_DEFAULT == RIDGE_SHRINK_DEFAULT);

namespace {

// ---- NCCL_* settings -----------------------------------------------------------------------

// One NCCL variable and the Ridge setting it sets when the RIDGE_ one is unset. `values` maps
// NCCL's spelling to Ridge's ("from=to,from=to", case-insensitive; "*" keeps the value); a
// value not listed is left alone with a note on stderr, so nothing is guessed.
struct EnvMapping {
  const char* nccl;
  const char* ridge;
  const char* values;
};

// The table docs/frameworks.md reproduces.
constexpr EnvMapping kEnvMappings[] = {
    {"NCCL_SOCKET_IFNAME", "RIDGE_SOCKET_IFNAME", "*"},
    {"NCCL_DEBUG", "RIDGE_DEBUG", "VERSION=WARN,WARN=WARN,INFO=INFO,TRACE=TRACE,ABORT=WARN"},
    {"NCCL_SOCKET_FAMILY", "RIDGE_SOCKET_FAMILY", "AF_INET=ipv4,AF_INET6=ipv6"},
    {"NCCL_P2P_DISABLE", "RIDGE_P2P", "1=off,0=auto"},
    {"NCCL_SHM_DISABLE", "RIDGE_SHM", "1=0,0=1"},
    {"NCCL_IB_DISABLE", "RIDGE_NET", "1=socket"},
    {"NCCL_NET", "RIDGE_NET", "Socket=socket,IB=verbs"},
    {"NCCL_IB_HCA", "RIDGE_VERBS_DEVICE", "*"},
    {"NCCL_NET_GDR_LEVEL", "RIDGE_GDR_DATA_PATH", "LOC=off,0=off"},
    {"NCCL_NSOCKS_PERTHREAD", "RIDGE_SOCKET_STREAMS", "*"},
};

// "from=to" lookup in a mapping's value list; false when `value` is not listed.
bool mapValue(const EnvMapping& m, const char* value, std::string* out) {
  if (std::strcmp(m.values, "*") == 0) {
    *out = value;
    return true;
  }
  std::string list = m.values;
  size_t pos = 0;
  while (pos < list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    const std::string item = list.substr(pos, comma - pos);
    const size_t eq = item.find('=');
    if (strcasecmp(item.substr(0, eq).c_str(), value) == 0) {
      *out = item.substr(eq + 1);
      return true;
    }
    pos = comma + 1;
  }
  return false;
}

// Runs when the library is loaded, before the program's first call reads any setting (Ridge
// reads RIDGE_* settings when it needs them, never at load). A RIDGE_ variable already set wins.
__attribute__((constructor)) void applyNcclEnvironment() {
  for (const EnvMapping& m : kEnvMappings) {
    const char* value = std::getenv(m.nccl);
    if (!value || !*value) continue;
    const char* already = std::getenv(m.ridge);
    if (already && *already) continue;
    std::string mapped;
    if (mapValue(m, value, &mapped))
      setenv(m.ridge, mapped.c_str(), 0);
    else
      std::fprintf(stderr, "Ridge NCCL: %s=%s has no Ridge equivalent; ignored (%s keeps its default)\n",
                   m.nccl, value, m.ridge);
  }
}

// ---- results and the last error --------------------------------------------------------------

// The text of a refusal by this library; it is the last error until the next call reaches Ridge.
thread_local std::string tShimError;
thread_local bool tShimErrorIsLast = false;

// Ridge's codes above NCCL's range: a timeout is a peer that did not answer (remote), an aborted
// communicator is used in a state it may not be used in.
ncclResult_t toNccl(ridgeResult_t r) {
  tShimErrorIsLast = false;
  if (r == ridgeTimeout) return ncclRemoteError;
  if (r == ridgeAborted) return ncclInvalidUsage;
  return static_cast<ncclResult_t>(r);
}

ncclResult_t refuse(const char* fn, const char* why) {
  tShimError = std::string(fn) + ": not supported by Ridge's libnccl: " + why;
  tShimErrorIsLast = true;
  return ncclInvalidUsage;
}

ncclResult_t invalid(const char* fn, const char* why) {
  tShimError = std::string(fn) + ": " + why;
  tShimErrorIsLast = true;
  return ncclInvalidArgument;
}

ridgeComm_t R(ncclComm_t c) {
  return reinterpret_cast<ridgeComm_t>(c);
}
ridgeDataType_t R(ncclDataType_t t) {
  return static_cast<ridgeDataType_t>(t);
}
ridgeRedOp_t R(ncclRedOp_t o) {
  return static_cast<ridgeRedOp_t>(o);
}
ridgeStream_t R(cudaStream_t s) {
  return s;
}

// The 8-bit float types have no Ridge equivalent.
bool fp8(ncclDataType_t t) {
  return t == ncclFloat8e4m3 || t == ncclFloat8e5m2;
}
ncclResult_t refuseFp8(const char* fn) {
  return refuse(fn, "ncclFloat8e4m3 and ncclFloat8e5m2 are not Ridge data types");
}

// NCCL's config in Ridge's terms: blocking and commName; the rest are performance hints for
// NCCL's kernels and network (CTAs, CGA clusters, NVLS, collnet, traffic class, sharing) that
// have no meaning for Ridge and are accepted and ignored.
ncclResult_t toRidgeConfig(const char* fn, const ncclConfig_t* in, ridgeConfig_t* out) {
  *out = RIDGE_CONFIG_INITIALIZER;
  if (!in) return ncclSuccess;
  if (in->magic != 0xcafebeef || in->size < offsetof(ncclConfig_t, cgaClusterSize))
    return invalid(fn, "config was not initialized with NCCL_CONFIG_INITIALIZER (bad magic or size)");
  out->blocking = in->blocking;
  if (in->size >= offsetof(ncclConfig_t, commName) + sizeof(in->commName)) out->commName = in->commName;
  return ncclSuccess;
}

}  // namespace

extern "C" {

// A Ridge-only symbol: tests (and users) tell this library from NVIDIA's with it.
__attribute__((visibility("default"))) const char* ridgeNcclShimVersion(void) {
  static const std::string text = "Ridge " + std::to_string(RIDGE_MAJOR) + "." + std::to_string(RIDGE_MINOR) +
                                  "." + std::to_string(RIDGE_PATCH) + " libnccl.so.2 implementing the NCCL " +
                                  std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." +
                                  std::to_string(NCCL_PATCH) + " API";
  return text.c_str();
}

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return invalid("ncclGetVersion", "version is NULL");
  // The version of the nccl.h this library implements: programs gate features on it.
  *version = NCCL_VERSION_CODE;
  tShimErrorIsLast = false;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  return toNccl(ridgeGetUniqueId(reinterpret_cast<ridgeUniqueId*>(uniqueId)));
}

ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  return toNccl(ridgeMemAlloc(ptr, size));
}
ncclResult_t ncclMemFree(void* ptr) {
  return toNccl(ridgeMemFree(ptr));
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  ridgeConfig_t rc;
  if (ncclResult_t r = toRidgeConfig("ncclCommInitRankConfig", config, &rc); r != ncclSuccess) return r;
  ridgeUniqueId id;
  std::memcpy(&id, &commId, sizeof id);
  return toNccl(ridgeCommInitRankConfig(reinterpret_cast<ridgeComm_t*>(comm), nranks, id, rank, &rc));
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  ridgeUniqueId id;
  std::memcpy(&id, &commId, sizeof id);
  return toNccl(ridgeCommInitRank(reinterpret_cast<ridgeComm_t*>(comm), nranks, id, rank));
}

ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  return toNccl(ridgeCommInitAll(reinterpret_cast<ridgeComm_t*>(comm), ndev, devlist));
}

ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId* commIds, ncclConfig_t* config) {
  const char* fn = "ncclCommInitRankScalable";
  if (!commIds) return invalid(fn, "commIds is NULL");
  // Ridge's rendezvous has one root: the ids beyond the first would start services nobody joins.
  if (nId != 1) return refuse(fn, "nId must be 1 (Ridge's rendezvous has a single root)");
  return ncclCommInitRankConfig(newcomm, nranks, commIds[0], myrank, config);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return toNccl(ridgeCommFinalize(R(comm)));
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return toNccl(ridgeCommDestroy(R(comm)));
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return toNccl(ridgeCommAbort(R(comm)));
}

ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  (void)comm;
  (void)revokeFlags;
  return refuse("ncclCommRevoke",
                "revoking a communicator is not implemented; use ncclCommAbort or "
                "ncclCommShrink with NCCL_SHRINK_ABORT");
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  ridgeConfig_t rc;
  if (ncclResult_t r = toRidgeConfig("ncclCommSplit", config, &rc); r != ncclSuccess) return r;
  return toNccl(
      ridgeCommSplit(R(comm), color, key, reinterpret_cast<ridgeComm_t*>(newcomm), config ? &rc : nullptr));
}

ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                            ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  ridgeConfig_t rc;
  if (ncclResult_t r = toRidgeConfig("ncclCommShrink", config, &rc); r != ncclSuccess) return r;
  return toNccl(ridgeCommShrink(R(comm), excludeRanksList, excludeRanksCount,
                                reinterpret_cast<ridgeComm_t*>(newcomm), config ? &rc : nullptr,
                                shrinkFlags));
}

const char* ncclGetErrorString(ncclResult_t result) {
  // NCCL's range only; Ridge's own codes never reach an NCCL program (toNccl).
  if (static_cast<int>(result) < 0 || result >= ncclNumResults) return "unknown result code";
  return ridgeGetErrorString(static_cast<ridgeResult_t>(result));
}

const char* ncclGetLastError(ncclComm_t comm) {
  return tShimErrorIsLast ? tShimError.c_str() : ridgeGetLastError(R(comm));
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (!asyncError) return toNccl(ridgeCommGetAsyncError(R(comm), nullptr));
  ridgeResult_t state = ridgeSuccess;
  ridgeResult_t r = ridgeCommGetAsyncError(R(comm), &state);
  if (r == ridgeSuccess) *asyncError = toNccl(state);
  return toNccl(r);
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return toNccl(ridgeCommCount(R(comm), count));
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return toNccl(ridgeCommCuDevice(R(comm), device));
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return toNccl(ridgeCommUserRank(R(comm), rank));
}

ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  return toNccl(ridgeCommRegister(R(comm), buff, size, handle));
}
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  return toNccl(ridgeCommDeregister(R(comm), handle));
}

ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int winFlags) {
  (void)comm, (void)buff, (void)size, (void)winFlags;
  if (win) *win = nullptr;
  return refuse("ncclCommWindowRegister", "symmetric memory windows need NCCL's device-side API");
}
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  (void)comm, (void)win;
  return refuse("ncclCommWindowDeregister", "symmetric memory windows need NCCL's device-side API");
}

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  if (fp8(datatype)) return refuseFp8("ncclRedOpCreatePreMulSum");
  return toNccl(ridgeRedOpCreatePreMulSum(reinterpret_cast<ridgeRedOp_t*>(op), scalar, R(datatype),
                                          static_cast<ridgeScalarResidence_t>(residence), R(comm)));
}
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  return toNccl(ridgeRedOpDestroy(R(op), R(comm)));
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  if (fp8(datatype)) return refuseFp8("ncclReduce");
  return toNccl(ridgeReduce(sendbuff, recvbuff, count, R(datatype), R(op), root, R(comm), R(stream)));
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  if (fp8(datatype)) return refuseFp8("ncclBcast");
  return toNccl(ridgeBcast(buff, count, R(datatype), root, R(comm), R(stream)));
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  if (fp8(datatype)) return refuseFp8("ncclBroadcast");
  return toNccl(ridgeBroadcast(sendbuff, recvbuff, count, R(datatype), root, R(comm), R(stream)));
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (fp8(datatype)) return refuseFp8("ncclAllReduce");
  return toNccl(ridgeAllReduce(sendbuff, recvbuff, count, R(datatype), R(op), R(comm), R(stream)));
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  if (fp8(datatype)) return refuseFp8("ncclReduceScatter");
  return toNccl(ridgeReduceScatter(sendbuff, recvbuff, recvcount, R(datatype), R(op), R(comm), R(stream)));
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  if (fp8(datatype)) return refuseFp8("ncclAllGather");
  return toNccl(ridgeAllGather(sendbuff, recvbuff, sendcount, R(datatype), R(comm), R(stream)));
}

ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                          ncclComm_t comm, cudaStream_t stream) {
  if (fp8(datatype)) return refuseFp8("ncclAlltoAll");
  return toNccl(ridgeAlltoAll(sendbuff, recvbuff, count, R(datatype), R(comm), R(stream)));
}

ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream) {
  if (fp8(datatype)) return refuseFp8("ncclGather");
  return toNccl(ridgeGather(sendbuff, recvbuff, count, R(datatype), root, R(comm), R(stream)));
}

ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                         int root, ncclComm_t comm, cudaStream_t stream) {
  if (fp8(datatype)) return refuseFp8("ncclScatter");
  return toNccl(ridgeScatter(sendbuff, recvbuff, count, R(datatype), root, R(comm), R(stream)));
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  if (fp8(datatype)) return refuseFp8("ncclSend");
  return toNccl(ridgeSend(sendbuff, count, R(datatype), peer, R(comm), R(stream)));
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  if (fp8(datatype)) return refuseFp8("ncclRecv");
  return toNccl(ridgeRecv(recvbuff, count, R(datatype), peer, R(comm), R(stream)));
}

ncclResult_t ncclGroupStart() {
  return toNccl(ridgeGroupStart());
}
ncclResult_t ncclGroupEnd() {
  return toNccl(ridgeGroupEnd());
}

ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  (void)simInfo;
  return refuse("ncclGroupSimulateEnd",
                "Ridge has no NCCL performance model; the group stays open, end it with "
                "ncclGroupEnd");
}

// ---- pnccl*: the profiling names, the same functions ----------------------------------------
#define RIDGE_PNCCL(ret, name, params) ret p##name params __attribute__((alias(#name)));
RIDGE_PNCCL(ncclResult_t, ncclMemAlloc, (void** ptr, size_t size))
RIDGE_PNCCL(ncclResult_t, ncclMemFree, (void* ptr))
RIDGE_PNCCL(ncclResult_t, ncclGetVersion, (int* version))
RIDGE_PNCCL(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * uniqueId))
RIDGE_PNCCL(ncclResult_t, ncclCommInitRankConfig,
            (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config))
RIDGE_PNCCL(ncclResult_t, ncclCommInitRank, (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank))
RIDGE_PNCCL(ncclResult_t, ncclCommInitAll, (ncclComm_t * comm, int ndev, const int* devlist))
RIDGE_PNCCL(ncclResult_t, ncclCommFinalize, (ncclComm_t comm))
RIDGE_PNCCL(ncclResult_t, ncclCommDestroy, (ncclComm_t comm))
RIDGE_PNCCL(ncclResult_t, ncclCommAbort, (ncclComm_t comm))
RIDGE_PNCCL(ncclResult_t, ncclCommRevoke, (ncclComm_t comm, int revokeFlags))
RIDGE_PNCCL(ncclResult_t, ncclCommSplit,
            (ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config))
RIDGE_PNCCL(ncclResult_t, ncclCommShrink,
            (ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
             ncclConfig_t* config, int shrinkFlags))
RIDGE_PNCCL(ncclResult_t, ncclCommInitRankScalable,
            (ncclComm_t * newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
             ncclConfig_t* config))
RIDGE_PNCCL(const char*, ncclGetErrorString, (ncclResult_t result))
RIDGE_PNCCL(const char*, ncclGetLastError, (ncclComm_t comm))
RIDGE_PNCCL(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t* asyncError))
RIDGE_PNCCL(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int* count))
RIDGE_PNCCL(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int* device))
RIDGE_PNCCL(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int* rank))
RIDGE_PNCCL(ncclResult_t, ncclCommRegister, (const ncclComm_t comm, void* buff, size_t size, void** handle))
RIDGE_PNCCL(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void* handle))
RIDGE_PNCCL(ncclResult_t, ncclCommWindowRegister,
            (ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags))
RIDGE_PNCCL(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win))
RIDGE_PNCCL(ncclResult_t, ncclRedOpCreatePreMulSum,
            (ncclRedOp_t * op, void* scalar, ncclDataType_t datatype, ncclScalarResidence_t residence,
             ncclComm_t comm))
RIDGE_PNCCL(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t op, ncclComm_t comm))
RIDGE_PNCCL(ncclResult_t, ncclReduce,
            (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
             int root, ncclComm_t comm, cudaStream_t stream))
RIDGE_PNCCL(ncclResult_t, ncclBcast,
            (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
             cudaStream_t stream))
RIDGE_PNCCL(ncclResult_t, ncclBroadcast,
            (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
             ncclComm_t comm, cudaStream_t stream))
RIDGE_PNCCL(ncclResult_t, ncclAllReduce,
            (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
             ncclComm_t comm, cudaStream_t stream))
RIDGE_PNCCL(ncclResult_t, ncclReduceScatter,
            (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op,
             ncclComm_t comm, cudaStream_t stream))
RIDGE_PNCCL(ncclResult_t, ncclAllGather,
            (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm,
             cudaStream_t stream))
RIDGE_PNCCL(ncclResult_t, ncclAlltoAll,
            (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm,
             cudaStream_t stream))
RIDGE_PNCCL(ncclResult_t, ncclGather,
            (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
             ncclComm_t comm, cudaStream_t stream))
RIDGE_PNCCL(ncclResult_t, ncclScatter,
            (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
             ncclComm_t comm, cudaStream_t stream))
RIDGE_PNCCL(ncclResult_t, ncclSend,
            (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
             cudaStream_t stream))
RIDGE_PNCCL(ncclResult_t, ncclRecv,
            (void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
             cudaStream_t stream))
RIDGE_PNCCL(ncclResult_t, ncclGroupStart, ())
RIDGE_PNCCL(ncclResult_t, ncclGroupEnd, ())
RIDGE_PNCCL(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t * simInfo))
#undef RIDGE_PNCCL

}  // extern "C"
