// ridge-bench: the MPI side of `--peer mpi`.
//
// Each Ridge call has one MPI counterpart on the same buffers:
//   allreduce      MPI_Allreduce               in place: MPI_IN_PLACE
//   broadcast      MPI_Bcast                   out of place: root sends from sendbuff,
//                                              the others receive into recvbuff
//   reduce         MPI_Reduce                  in place: MPI_IN_PLACE on the root
//   allgather      MPI_Allgather               in place: MPI_IN_PLACE, own block in recvbuff
//   reducescatter  MPI_Reduce_scatter_block    in place: MPI_IN_PLACE; MPI leaves the result
//                                              at the start of recvbuff (Ridge at rank*count)
//   alltoall       MPI_Alltoall                in place: MPI_IN_PLACE
//   sendrecv       MPI_Sendrecv ring shift     no in-place form (as for Ridge)
// MPI has no average: avg runs MPI_SUM and divides the result locally, inside the timing.
// MPI has no half or bfloat16 type: those columns read n/a.
#include <climits>
#include <string>

#include "bench.h"

#if defined(RIDGE_BENCH_HAVE_MPI)
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace rbench {

#if defined(RIDGE_BENCH_HAVE_MPI)

namespace {

MPI_Datatype mpiType(ridgeDataType_t t) {
  switch (t) {
    case ridgeInt8: return MPI_INT8_T;
    case ridgeUint8: return MPI_UINT8_T;
    case ridgeInt32: return MPI_INT32_T;
    case ridgeUint32: return MPI_UINT32_T;
    case ridgeInt64: return MPI_INT64_T;
    case ridgeUint64: return MPI_UINT64_T;
    case ridgeFloat32: return MPI_FLOAT;
    case ridgeFloat64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;
  }
}

MPI_Op mpiOp(ridgeRedOp_t op) {
  switch (op) {
    case ridgeProd: return MPI_PROD;
    case ridgeMax: return MPI_MAX;
    case ridgeMin: return MPI_MIN;
    default: return MPI_SUM;  // sum, and avg (divided afterwards)
  }
}

}  // namespace

bool mpiBuiltIn() {
  return true;
}

std::string mpiUnsupported(Coll c, bool inPlace, ridgeDataType_t t, ridgeRedOp_t op, size_t n) {
  if (mpiType(t) == MPI_DATATYPE_NULL) return "MPI has no " + std::string(typeInfo(t).name);
  if (c == Coll::SendRecv && inPlace) return "send/recv has no in-place form";
  if (n > size_t(INT_MAX)) return "count exceeds MPI's int";
  (void)op;
  return {};
}

int mpiCollective(Coll c, bool inPlace, const void* send, void* recv, size_t n, ridgeDataType_t t,
                  ridgeRedOp_t op, int root, int rank, int nranks, std::string* err) {
  const MPI_Datatype dt = mpiType(t);
  const MPI_Op mop = mpiOp(op);
  const int cnt = int(n);
  const MPI_Comm w = MPI_COMM_WORLD;
  void* sb = const_cast<void*>(send);
  int rc = MPI_SUCCESS;
  size_t avgElems = 0;  // elements of recv to divide for avg
  switch (c) {
    case Coll::AllReduce:
      rc = MPI_Allreduce(inPlace ? MPI_IN_PLACE : sb, recv, cnt, dt, mop, w);
      avgElems = n;
      break;
    case Coll::Broadcast: rc = MPI_Bcast((!inPlace && rank == root) ? sb : recv, cnt, dt, root, w); break;
    case Coll::Reduce:
      if (inPlace)
        rc = MPI_Reduce(rank == root ? MPI_IN_PLACE : recv, rank == root ? recv : nullptr, cnt, dt, mop, root,
                        w);
      else
        rc = MPI_Reduce(sb, recv, cnt, dt, mop, root, w);
      avgElems = rank == root ? n : 0;
      break;
    case Coll::AllGather:
      if (inPlace)
        rc = MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, cnt, dt, w);
      else
        rc = MPI_Allgather(sb, cnt, dt, recv, cnt, dt, w);
      break;
    case Coll::ReduceScatter:
      rc = MPI_Reduce_scatter_block(inPlace ? MPI_IN_PLACE : sb, recv, cnt, dt, mop, w);
      avgElems = n;
      break;
    case Coll::AlltoAll:
      if (inPlace)
        rc = MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, cnt, dt, w);
      else
        rc = MPI_Alltoall(sb, cnt, dt, recv, cnt, dt, w);
      break;
    case Coll::SendRecv:
      rc = MPI_Sendrecv(sb, cnt, dt, (rank + 1) % nranks, 0, recv, cnt, dt, (rank + nranks - 1) % nranks, 0,
                        w, MPI_STATUS_IGNORE);
      break;
  }
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    *err = std::string(text, size_t(len));
    return rc;
  }
  if (op == ridgeAvg && collHasOp(c) && avgElems) divideBy(t, recv, avgElems, nranks);
  return rc;
}

void mpiBarrier() {
  MPI_Barrier(MPI_COMM_WORLD);
}

void mpiAbort(int code) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Abort(MPI_COMM_WORLD, code);
}

#else  // no MPI in this build

bool mpiBuiltIn() {
  return false;
}
std::string mpiUnsupported(Coll, bool, ridgeDataType_t, ridgeRedOp_t, size_t) {
  return "built without MPI";
}
int mpiCollective(Coll, bool, const void*, void*, size_t, ridgeDataType_t, ridgeRedOp_t, int, int, int,
                  std::string* err) {
  *err = "built without MPI";
  return 1;
}
void mpiBarrier() {}
void mpiAbort(int) {}

#endif

}  // namespace rbench
