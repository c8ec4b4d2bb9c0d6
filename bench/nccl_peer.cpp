// ridge-bench: the NCCL side of `--peer nccl`.
//
// NCCL is loaded at run time with dlopen("libnccl.so.2") (or --nccl-lib PATH), so the
// benchmark has no link-time dependency on it and one binary serves machines with and
// without NCCL. The few types the calls need are declared here from NCCL's public ABI
// (nccl.h of NCCL 2.x): ncclResult_t, ncclDataType_t and ncclRedOp_t are C enums (int),
// ncclUniqueId is a struct of 128 bytes passed by value, ncclComm_t and cudaStream_t are
// opaque pointers.
//
// Each Ridge call has one NCCL counterpart on device buffers, with the same in-place
// layouts as Ridge (NCCL's API is the model of Ridge's):
//   allreduce      ncclAllReduce       in place: sendbuff == recvbuff
//   broadcast      ncclBroadcast       in place: the root's recvbuff holds the data
//   reduce         ncclReduce          in place: sendbuff == recvbuff
//   allgather      ncclAllGather       in place: sendbuff == recvbuff + rank*n
//   reducescatter  ncclReduceScatter   in place: sendbuff == recvbuff, result at rank*n
//   alltoall       ncclAlltoAll        (NCCL >= 2.28; no documented in-place form: n/a)
//   sendrecv       ncclSend/ncclRecv ring shift in one group
// Every type Ridge has and every op, avg included, exist in NCCL (bfloat16 since 2.10).
#include <dlfcn.h>

#include <cstring>
#include <string>

#include "bench.h"

namespace rbench {

namespace {

struct NcclCommOpaque;
using NcclComm = NcclCommOpaque*;
using NcclResult = int;  // ncclResult_t: 0 is ncclSuccess
using Stream = void*;    // cudaStream_t (struct CUstream_st*): a pointer in every ABI
struct NcclUniqueId {
  char internal[kNcclUniqueIdBytes];
};

struct NcclApi {
  void* handle = nullptr;
  NcclResult (*getVersion)(int*) = nullptr;
  NcclResult (*getUniqueId)(NcclUniqueId*) = nullptr;
  NcclResult (*commInitRank)(NcclComm*, int, NcclUniqueId, int) = nullptr;
  NcclResult (*commDestroy)(NcclComm) = nullptr;
  const char* (*getErrorString)(NcclResult) = nullptr;
  NcclResult (*allReduce)(const void*, void*, size_t, int, int, NcclComm, Stream) = nullptr;
  NcclResult (*broadcast)(const void*, void*, size_t, int, int, NcclComm, Stream) = nullptr;
  NcclResult (*reduce)(const void*, void*, size_t, int, int, int, NcclComm, Stream) = nullptr;
  NcclResult (*allGather)(const void*, void*, size_t, int, NcclComm, Stream) = nullptr;
  NcclResult (*reduceScatter)(const void*, void*, size_t, int, int, NcclComm, Stream) = nullptr;
  NcclResult (*groupStart)() = nullptr;
  NcclResult (*groupEnd)() = nullptr;
  // Optional: absent in older releases; the collectives that need them read n/a.
  NcclResult (*alltoAll)(const void*, void*, size_t, int, NcclComm, Stream) = nullptr;
  NcclResult (*send)(const void*, size_t, int, int, NcclComm, Stream) = nullptr;
  NcclResult (*recv)(void*, size_t, int, int, NcclComm, Stream) = nullptr;
};

NcclApi gApi;
NcclComm gComm = nullptr;
Stream gStream = nullptr;

// NCCL's enum values (nccl.h); Ridge's happen to be equal, but the mapping is spelled out so
// that a change on either side cannot silently swap types.
int ncclType(ridgeDataType_t t) {
  switch (t) {
    case ridgeInt8: return 0;
    case ridgeUint8: return 1;
    case ridgeInt32: return 2;
    case ridgeUint32: return 3;
    case ridgeInt64: return 4;
    case ridgeUint64: return 5;
    case ridgeFloat16: return 6;
    case ridgeFloat32: return 7;
    case ridgeFloat64: return 8;
    case ridgeBfloat16: return 9;
    default: return -1;
  }
}

int ncclOp(ridgeRedOp_t op) {
  switch (op) {
    case ridgeSum: return 0;
    case ridgeProd: return 1;
    case ridgeMax: return 2;
    case ridgeMin: return 3;
    case ridgeAvg: return 4;
    default: return -1;
  }
}

template <typename F>
bool resolve(void* h, const char* name, F* fn, std::string* missing) {
  *fn = reinterpret_cast<F>(dlsym(h, name));
  if (!*fn && missing) *missing += std::string(missing->empty() ? "" : ", ") + name;
  return *fn != nullptr;
}

// One entry point: its exported name and where its address goes.
template <typename F>
struct Sym {
  const char* name;
  F* slot;
};
template <typename F>
Sym(const char*, F*) -> Sym<F>;

// Resolves every entry; the names of those not found are appended to *missing (when given).
template <typename... F>
void resolveEach(void* h, std::string* missing, Sym<F>... syms) {
  (resolve(h, syms.name, syms.slot, missing), ...);
}

std::string errText(NcclResult r) {
  const char* s = gApi.getErrorString ? gApi.getErrorString(r) : nullptr;
  return std::string(s ? s : "unknown NCCL error") + " (ncclResult_t " + std::to_string(r) + ")";
}

}  // namespace

std::string ncclLoad(const std::string& lib) {
  if (gApi.handle) return {};
  void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    return "cannot load " + lib + ": " + (e ? e : "dlopen failed");
  }
  NcclApi a;
  a.handle = h;
  std::string missing;
  resolveEach(h, &missing, Sym{"ncclGetVersion", &a.getVersion}, Sym{"ncclGetUniqueId", &a.getUniqueId},
              Sym{"ncclCommInitRank", &a.commInitRank}, Sym{"ncclCommDestroy", &a.commDestroy},
              Sym{"ncclGetErrorString", &a.getErrorString}, Sym{"ncclAllReduce", &a.allReduce},
              Sym{"ncclBroadcast", &a.broadcast}, Sym{"ncclReduce", &a.reduce},
              Sym{"ncclAllGather", &a.allGather}, Sym{"ncclReduceScatter", &a.reduceScatter},
              Sym{"ncclGroupStart", &a.groupStart}, Sym{"ncclGroupEnd", &a.groupEnd});
  if (!missing.empty()) {
    dlclose(h);
    return lib + " lacks " + missing + " (not an NCCL 2.x library?)";
  }
  resolveEach(h, nullptr, Sym{"ncclAlltoAll", &a.alltoAll}, Sym{"ncclSend", &a.send},
              Sym{"ncclRecv", &a.recv});
  gApi = a;
  return {};
}

std::string ncclProbe(const std::string& lib, int ranksOnHost) {
  // The order makes each reason testable where the earlier ones pass: a CUDA build on a
  // machine without a GPU still loads the library (or fails to, with --nccl-lib).
  if (!cudaBuiltIn()) return deviceUnavailable();
  std::string err = ncclLoad(lib);
  if (!err.empty()) return err;
  err = deviceUnavailable();
  if (!err.empty()) return err;
  const int devices = cudaDevices(&err);
  if (ranksOnHost > devices)
    return "-np " + std::to_string(ranksOnHost) + " needs " + std::to_string(ranksOnHost) +
           " GPUs: NCCL runs one rank per GPU (two ranks of one communicator on one GPU are refused) "
           "and this machine has " +
           std::to_string(devices);
  return {};
}

std::string ncclVersionText() {
  int v = 0;
  if (!gApi.getVersion || gApi.getVersion(&v) != 0) return "unknown";
  // NCCL_VERSION(X,Y,Z): X*10000 + Y*100 + Z since 2.9 (X*1000 + Y*100 + Z before).
  const int major = v >= 10000 ? v / 10000 : v / 1000;
  const int minor = v >= 10000 ? v / 100 % 100 : v / 100 % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(v % 100);
}

std::string ncclMakeId(void* id) {
  const NcclResult r = gApi.getUniqueId(static_cast<NcclUniqueId*>(id));
  return r == 0 ? std::string() : "ncclGetUniqueId: " + errText(r);
}

std::string ncclInit(const void* id, int rank, int nranks, int device) {
  std::string err;
  if (!deviceSelect(device, &err)) return err;
  gStream = streamCreate(&err);
  if (!gStream) return err;
  NcclUniqueId uid;
  std::memcpy(&uid, id, sizeof uid);
  const NcclResult r = gApi.commInitRank(&gComm, nranks, uid, rank);
  if (r != 0) return "ncclCommInitRank: " + errText(r);
  return {};
}

void* ncclStream() {
  return gStream;
}

void ncclUseNullStream() {
  streamDestroy(gStream);
  gStream = nullptr;  // cudaStream_t 0: the legacy default stream (-y 1)
}

int ncclGroup(bool start) {
  return start ? gApi.groupStart() : gApi.groupEnd();
}

std::string ncclUnsupported(Coll c, bool inPlace, ridgeDataType_t t, ridgeRedOp_t op) {
  if (ncclType(t) < 0) return "NCCL has no " + std::string(typeInfo(t).name);
  if (collHasOp(c) && ncclOp(op) < 0) return "NCCL has no " + std::string(opName(op));
  if (c == Coll::AlltoAll && !gApi.alltoAll) return "this NCCL has no ncclAlltoAll (2.28 and later)";
  if (c == Coll::AlltoAll && inPlace) return "ncclAlltoAll documents no in-place form";
  if (c == Coll::SendRecv && (!gApi.send || !gApi.recv)) return "this NCCL has no ncclSend/ncclRecv";
  if (c == Coll::SendRecv && inPlace) return "send/recv has no in-place form";
  return {};
}

int ncclCollective(Coll c, bool inPlace, const void* send, void* recv, size_t n, ridgeDataType_t t,
                   ridgeRedOp_t op, int root, int rank, int nranks, std::string* err) {
  const int dt = ncclType(t);
  const int nop = ncclOp(op);
  const size_t ts = typeInfo(t).size;
  char* r = static_cast<char*>(recv);
  NcclResult res = 0;
  switch (c) {
    case Coll::AllReduce: res = gApi.allReduce(inPlace ? r : send, r, n, dt, nop, gComm, gStream); break;
    case Coll::Broadcast: res = gApi.broadcast(inPlace ? r : send, r, n, dt, root, gComm, gStream); break;
    case Coll::Reduce: res = gApi.reduce(inPlace ? r : send, r, n, dt, nop, root, gComm, gStream); break;
    case Coll::AllGather:
      res = gApi.allGather(inPlace ? r + size_t(rank) * n * ts : send, r, n, dt, gComm, gStream);
      break;
    case Coll::ReduceScatter:
      res = inPlace ? gApi.reduceScatter(r, r + size_t(rank) * n * ts, n, dt, nop, gComm, gStream)
                    : gApi.reduceScatter(send, r, n, dt, nop, gComm, gStream);
      break;
    case Coll::AlltoAll: res = gApi.alltoAll(send, r, n, dt, gComm, gStream); break;
    case Coll::SendRecv: {
      res = gApi.groupStart();
      if (res != 0) break;
      NcclResult q = gApi.send(send, n, dt, (rank + 1) % nranks, gComm, gStream);
      if (q == 0) q = gApi.recv(r, n, dt, (rank + nranks - 1) % nranks, gComm, gStream);
      const NcclResult e = gApi.groupEnd();  // always closes the group opened above
      res = q != 0 ? q : e;
      break;
    }
  }
  if (res != 0) *err = errText(res);
  return res;
}

void ncclShutdown() {
  if (gComm) gApi.commDestroy(gComm);
  gComm = nullptr;
  streamDestroy(gStream);
  gStream = nullptr;
}

}  // namespace rbench
