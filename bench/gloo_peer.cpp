// ridge-bench: the Gloo side of `--peer gloo`.
//
// Gloo runs over its TCP device, rendezvousing through a file store (a directory every
// rank can see). Each Ridge call has one Gloo counterpart on the same buffers:
//   allreduce   gloo::allreduce   in place: output only (Gloo then reduces in it)
//   broadcast   gloo::broadcast   out of place: the root's input is sendbuff
//   reduce      gloo::reduce      in place: output only
//   allgather   gloo::allgather   in place: output only (own block already in place)
//   alltoall    gloo::alltoall    in place: n/a (Gloo needs distinct buffers)
//   sendrecv    unbound buffers: send to rank+1, receive from rank-1
//   reducescatter  gloo::ReduceScatterHalvingDoubling (the one reduce-scatter Gloo has, an
//               algorithm object of its older API): in place only (it reduces in the N*n
//               input and leaves this rank's n results at its start, MPI's layout); out of
//               place n/a (it would need a copy of the input that Ridge does not make).
//               The object registers its buffers with the pairs when it is built, so one is
//               built per buffer, count, type and operation, outside the timing's steady
//               state (the warm-up's first call), and reused, as Gloo's users do.
// Gloo has no average: avg runs sum and divides locally inside the timing, as for MPI;
// half and bfloat16 are n/a.
#include <climits>
#include <string>

#include "bench.h"

#if defined(RIDGE_BENCH_HAVE_GLOO)
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <tuple>
#include <vector>
#endif

namespace rbench {

#if defined(RIDGE_BENCH_HAVE_GLOO)

namespace {

std::shared_ptr<gloo::rendezvous::Context> gContext;
uint32_t gTag = 0;
constexpr std::chrono::seconds kTimeout{300};

template <typename T>
using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <typename T>
ReduceFn<T> reduceFn(ridgeRedOp_t op) {
  switch (op) {
    case ridgeProd: return &gloo::product<T>;
    case ridgeMax: return &gloo::max<T>;
    case ridgeMin: return &gloo::min<T>;
    default: return &gloo::sum<T>;  // sum, and avg (divided afterwards)
  }
}

template <typename T>
const gloo::ReductionFunction<T>* reductionFunction(ridgeRedOp_t op) {
  switch (op) {
    case ridgeProd: return gloo::ReductionFunction<T>::product;
    case ridgeMax: return gloo::ReductionFunction<T>::max;
    case ridgeMin: return gloo::ReductionFunction<T>::min;
    default: return gloo::ReductionFunction<T>::sum;  // sum, and avg (divided afterwards)
  }
}

// Built reduce-scatter objects: (buffer, count, type, op) -> object. Every rank builds them
// in the same order (the same calls), as their context slots require.
std::map<std::tuple<void*, size_t, int, int>, std::shared_ptr<gloo::Algorithm>> gReduceScatters;

template <typename T>
void reduceScatterInPlace(T* buf, size_t n, ridgeRedOp_t op, int nranks) {
  auto& algo = gReduceScatters[{buf, n, static_cast<int>(sizeof(T)), static_cast<int>(op)}];
  if (!algo)
    algo = std::make_shared<gloo::ReduceScatterHalvingDoubling<T>>(
        gContext, std::vector<T*>{buf}, static_cast<int>(n * size_t(nranks)),
        std::vector<int>(size_t(nranks), static_cast<int>(n)), reductionFunction<T>(op));
  algo->run();
}

template <typename T>
void run(Coll c, bool inPlace, const void* sendv, void* recvv, size_t n, ridgeRedOp_t op, int root, int rank,
         int nranks) {
  T* send = static_cast<T*>(const_cast<void*>(sendv));
  T* recv = static_cast<T*>(recvv);
  const uint32_t tag = gTag++;
  switch (c) {
    case Coll::AllReduce: {
      gloo::AllreduceOptions o(gContext);
      if (!inPlace) o.setInput(send, n);
      o.setOutput(recv, n);
      o.setReduceFunction(reduceFn<T>(op));
      o.setTag(tag);
      o.setTimeout(kTimeout);
      gloo::allreduce(o);
      break;
    }
    case Coll::Broadcast: {
      gloo::BroadcastOptions o(gContext);
      if (!inPlace && rank == root) o.setInput(send, n);
      o.setOutput(recv, n);
      o.setRoot(root);
      o.setTag(tag);
      o.setTimeout(kTimeout);
      gloo::broadcast(o);
      break;
    }
    case Coll::Reduce: {
      gloo::ReduceOptions o(gContext);
      if (!inPlace) o.setInput(send, n);
      o.setOutput(recv, n);
      o.setRoot(root);
      o.setReduceFunction(reduceFn<T>(op));
      o.setTag(tag);
      o.setTimeout(kTimeout);
      gloo::reduce(o);
      break;
    }
    case Coll::AllGather: {
      gloo::AllgatherOptions o(gContext);
      if (!inPlace) o.setInput(send, n);
      o.setOutput(recv, n * size_t(nranks));
      o.setTag(tag);
      o.setTimeout(kTimeout);
      gloo::allgather(o);
      break;
    }
    case Coll::AlltoAll: {
      gloo::AlltoallOptions o(gContext);
      o.setInput(send, n * size_t(nranks));
      o.setOutput(recv, n * size_t(nranks));
      o.setTag(tag);
      o.setTimeout(kTimeout);
      gloo::alltoall(o);
      break;
    }
    case Coll::SendRecv: {
      auto out = gContext->createUnboundBuffer(send, n * sizeof(T));
      auto in = gContext->createUnboundBuffer(recv, n * sizeof(T));
      in->recv((rank + nranks - 1) % nranks, tag);
      out->send((rank + 1) % nranks, tag);
      in->waitRecv(kTimeout);
      out->waitSend(kTimeout);
      break;
    }
    case Coll::ReduceScatter: reduceScatterInPlace(recv, n, op, nranks); break;  // in place only
  }
}

}  // namespace

bool glooBuiltIn() {
  return true;
}

std::string glooInit(int rank, int nranks, const std::string& storeDir, const std::string& iface) {
  try {
    gloo::transport::tcp::attr attr;
    if (!iface.empty())
      attr.iface = iface;
    else
      attr.hostname = "127.0.0.1";
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(storeDir);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, nranks);
    ctx->setTimeout(kTimeout);
    ctx->connectFullMesh(store, dev);
    gContext = ctx;
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

std::string glooUnsupported(Coll c, bool inPlace, ridgeDataType_t t, ridgeRedOp_t op, size_t n) {
  (void)op;
  (void)n;
  if (!gContext) return "Gloo is not connected";
  if (t == ridgeFloat16 || t == ridgeBfloat16) return "Gloo peer has no " + std::string(typeInfo(t).name);
  if (c == Coll::ReduceScatter && !inPlace)
    return "Gloo's reduce-scatter (ReduceScatterHalvingDoubling) works in place only";
  if (c == Coll::ReduceScatter && n > size_t(INT_MAX) / size_t(gContext->size))
    return "Gloo's reduce-scatter counts elements in an int";
  if (c == Coll::AlltoAll && inPlace) return "Gloo alltoall needs distinct buffers";
  if (c == Coll::SendRecv && inPlace) return "send/recv has no in-place form";
  return {};
}

int glooCollective(Coll c, bool inPlace, const void* send, void* recv, size_t n, ridgeDataType_t t,
                   ridgeRedOp_t op, int root, int rank, int nranks, std::string* err) {
  try {
    switch (t) {
      case ridgeInt8: run<int8_t>(c, inPlace, send, recv, n, op, root, rank, nranks); break;
      case ridgeUint8: run<uint8_t>(c, inPlace, send, recv, n, op, root, rank, nranks); break;
      case ridgeInt32: run<int32_t>(c, inPlace, send, recv, n, op, root, rank, nranks); break;
      case ridgeUint32: run<uint32_t>(c, inPlace, send, recv, n, op, root, rank, nranks); break;
      case ridgeInt64: run<int64_t>(c, inPlace, send, recv, n, op, root, rank, nranks); break;
      case ridgeUint64: run<uint64_t>(c, inPlace, send, recv, n, op, root, rank, nranks); break;
      case ridgeFloat32: run<float>(c, inPlace, send, recv, n, op, root, rank, nranks); break;
      case ridgeFloat64: run<double>(c, inPlace, send, recv, n, op, root, rank, nranks); break;
      default: *err = "unsupported type"; return 1;
    }
  } catch (const std::exception& e) {
    *err = e.what();
    return 1;
  }
  size_t avgElems = 0;
  if (c == Coll::AllReduce || c == Coll::ReduceScatter) avgElems = n;
  if (c == Coll::Reduce && rank == root) avgElems = n;
  if (op == ridgeAvg && collHasOp(c) && avgElems) divideBy(t, recv, avgElems, nranks);
  return 0;
}

void glooBarrier() {
  gloo::BarrierOptions o(gContext);
  o.setTag(gTag++);
  o.setTimeout(kTimeout);
  gloo::barrier(o);
}

void glooShutdown() {
  gReduceScatters.clear();
  gContext.reset();
}

#else  // built without Gloo

bool glooBuiltIn() {
  return false;
}
std::string glooInit(int, int, const std::string&, const std::string&) {
  return "this ridge-bench was built without Gloo (install libgloo-dev and reconfigure)";
}
std::string glooUnsupported(Coll, bool, ridgeDataType_t, ridgeRedOp_t, size_t) {
  return "built without Gloo";
}
int glooCollective(Coll, bool, const void*, void*, size_t, ridgeDataType_t, ridgeRedOp_t, int, int, int,
                   std::string* err) {
  *err = "built without Gloo";
  return 1;
}
void glooBarrier() {}
void glooShutdown() {}

#endif

}  // namespace rbench
