/*
 * An NCCL program: written against NVIDIA's nccl.h only, on host buffers. Linked against
 * Ridge's libnccl.so.2 (or started with LD_LIBRARY_PATH pointing at it) it runs on Ridge;
 * nothing in it names Ridge except the optional check of which library was loaded.
 *
 *   nccl_program [nranks] [--require-ridge]
 *
 * Forks `nranks` ranks (default 2) that run, each checking every result: init, queries,
 * every collective with every reduction operator, the legacy in-place ncclBcast, gather and
 * scatter, a PreMulSum operator, grouped send/receive around a ring, an
 * all-to-all of sends and receives with each rank's own block sent to itself, buffer registration and
 * ncclMemAlloc, a split, the async-error query, a call Ridge refuses, finalize and destroy.
 * Exit code 0 when every rank got every result right.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <nccl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int rank = -1;

#define CHECK(call)                                                                         \
  do {                                                                                      \
    ncclResult_t r_ = (call);                                                               \
    if (r_ != ncclSuccess) {                                                                \
      fprintf(stderr, "rank %d: %s failed: %s (%s)\n", rank, #call, ncclGetErrorString(r_), \
              ncclGetLastError(NULL));                                                      \
      return 1;                                                                             \
    }                                                                                       \
  } while (0)

#define EXPECT(cond, ...)                                               \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf(stderr, "rank %d: line %d: %s: ", rank, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                     \
      fputc('\n', stderr);                                              \
      return 1;                                                         \
    }                                                                   \
  } while (0)

/* Rank r's element i: small integers, exact in float. Products use 1 or 2 only. */
static float valueOf(int r, size_t i) {
  return (float)((i * 7 + (size_t)r * 13) % 31) - 15.0f;
}
static float factorOf(int r, size_t i) {
  return (float)(1 + (i + (size_t)r) % 2);
}

static int near(double got, double want) {
  return fabs(got - want) <= 1e-5 * (1.0 + fabs(want));
}

/* The expected allreduce result at i for op over ranks 0..n-1. */
static double reduced(ncclRedOp_t op, int n, size_t i) {
  double acc = op == ncclProd ? factorOf(0, i) : valueOf(0, i);
  for (int q = 1; q < n; ++q) {
    double v = op == ncclProd ? factorOf(q, i) : valueOf(q, i);
    if (op == ncclSum || op == ncclAvg) acc += v;
    if (op == ncclProd) acc *= v;
    if (op == ncclMax) acc = v > acc ? v : acc;
    if (op == ncclMin) acc = v < acc ? v : acc;
  }
  return op == ncclAvg ? acc / n : acc;
}

static int runRank(int nranks, ncclUniqueId id) {
  const size_t count = 1000;
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, nranks, id, rank));

  /* Queries. With host memory and no GPU the communicator has no device: -1. */
  int n = -1, me = -1, dev = -2, version = 0;
  CHECK(ncclCommCount(comm, &n));
  CHECK(ncclCommUserRank(comm, &me));
  CHECK(ncclCommCuDevice(comm, &dev));
  CHECK(ncclGetVersion(&version));
  EXPECT(n == nranks && me == rank, "rank %d of %d", me, n);
  EXPECT(dev >= -1, "device %d", dev);
  EXPECT(version >= NCCL_VERSION(2, 28, 0), "version %d", version);

  float* send = malloc(count * nranks * sizeof(float));
  float* recv = malloc(count * nranks * sizeof(float));
  if (!send || !recv) return 1;

  /* Allreduce with every built-in operator. */
  const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  for (int k = 0; k < 5; ++k) {
    for (size_t i = 0; i < count; ++i) send[i] = ops[k] == ncclProd ? factorOf(rank, i) : valueOf(rank, i);
    for (size_t i = 0; i < count; ++i) recv[i] = NAN;
    CHECK(ncclAllReduce(send, recv, count, ncclFloat, ops[k], comm, NULL));
    for (size_t i = 0; i < count; ++i)
      EXPECT(near(recv[i], reduced(ops[k], nranks, i)), "op %d at %zu: %f", k, i, recv[i]);
  }

  /* Broadcast from the last rank; reduce (max) to rank 0. */
  const int last = nranks - 1;
  for (size_t i = 0; i < count; ++i) send[i] = valueOf(rank, i), recv[i] = NAN;
  CHECK(ncclBroadcast(send, recv, count, ncclFloat, last, comm, NULL));
  for (size_t i = 0; i < count; ++i) EXPECT(recv[i] == valueOf(last, i), "broadcast at %zu", i);
  for (size_t i = 0; i < count; ++i) recv[i] = NAN;
  CHECK(ncclReduce(send, rank == 0 ? recv : NULL, count, ncclFloat, ncclMax, 0, comm, NULL));
  for (size_t i = 0; rank == 0 && i < count; ++i)
    EXPECT(recv[i] == reduced(ncclMax, nranks, i), "reduce at %zu", i);

  /* Legacy in-place broadcast from rank 0. */
  for (size_t i = 0; i < count; ++i) recv[i] = rank == 0 ? valueOf(0, i) + 100 : NAN;
  CHECK(ncclBcast(recv, count, ncclFloat, 0, comm, NULL));
  for (size_t i = 0; i < count; ++i) EXPECT(recv[i] == valueOf(0, i) + 100, "bcast at %zu", i);

  /* Allgather, reduce-scatter (sum), alltoall. */
  for (size_t i = 0; i < count * nranks; ++i) recv[i] = NAN;
  CHECK(ncclAllGather(send, recv, count, ncclFloat, comm, NULL));
  for (int q = 0; q < nranks; ++q)
    for (size_t i = 0; i < count; ++i)
      EXPECT(recv[q * count + i] == valueOf(q, i), "allgather block %d at %zu", q, i);
  for (size_t i = 0; i < count * nranks; ++i) send[i] = valueOf(rank, i), recv[i] = NAN;
  CHECK(ncclReduceScatter(send, recv, count, ncclFloat, ncclSum, comm, NULL));
  for (size_t i = 0; i < count; ++i)
    EXPECT(near(recv[i], reduced(ncclSum, nranks, rank * count + i)), "reducescatter at %zu", i);
  /* Alltoall: block q of rank r holds valueOf(r, q*count+i); rank q receives it as block r. */
  for (size_t i = 0; i < count * nranks; ++i) recv[i] = NAN;
  CHECK(ncclAlltoAll(send, recv, count, ncclFloat, comm, NULL));
  for (int q = 0; q < nranks; ++q)
    for (size_t i = 0; i < count; ++i)
      EXPECT(recv[q * count + i] == valueOf(q, rank * count + i), "alltoall block %d at %zu", q, i);

  /* Gather and scatter around root 0 (NCCL 2.28's ncclGather and ncclScatter). */
  for (size_t i = 0; i < count * nranks; ++i) recv[i] = NAN;
  CHECK(ncclGather(send, rank == 0 ? recv : NULL, count, ncclFloat, 0, comm, NULL));
  for (int q = 0; rank == 0 && q < nranks; ++q)
    for (size_t i = 0; i < count; ++i)
      EXPECT(recv[q * count + i] == valueOf(q, i), "gather block %d at %zu", q, i);
  for (size_t i = 0; i < count; ++i) recv[i] = NAN;
  CHECK(ncclScatter(rank == 0 ? send : NULL, recv, count, ncclFloat, 0, comm, NULL));
  for (size_t i = 0; i < count; ++i) EXPECT(recv[i] == valueOf(0, rank * count + i), "scatter at %zu", i);

  /* PreMulSum: every rank's input times (rank + 1), then summed. */
  float scalar = (float)(rank + 1);
  ncclRedOp_t premul;
  CHECK(ncclRedOpCreatePreMulSum(&premul, &scalar, ncclFloat, ncclScalarHostImmediate, comm));
  for (size_t i = 0; i < count; ++i) recv[i] = NAN;
  CHECK(ncclAllReduce(send, recv, count, ncclFloat, premul, comm, NULL));
  for (size_t i = 0; i < count; ++i) {
    double want = 0;
    for (int q = 0; q < nranks; ++q) want += (q + 1) * (double)valueOf(q, i);
    EXPECT(near(recv[i], want), "premulsum at %zu: %f != %f", i, recv[i], want);
  }
  CHECK(ncclRedOpDestroy(premul, comm));

  /* Grouped send/receive around the ring: the group lets both directions go at once. */
  if (nranks > 1) {
    const int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    for (size_t i = 0; i < count; ++i) recv[i] = NAN;
    CHECK(ncclGroupStart());
    CHECK(ncclSend(send, count, ncclFloat, next, comm, NULL));
    CHECK(ncclRecv(recv, count, ncclFloat, prev, comm, NULL));
    CHECK(ncclGroupEnd());
    for (size_t i = 0; i < count; ++i) EXPECT(recv[i] == valueOf(prev, i), "sendrecv at %zu", i);
  }

  /* All-to-all by sends and receives, each rank's own block included: a send to self is
   * matched, in the group, with the receive from self and is a local copy. */
  {
    const size_t block = count;
    for (size_t i = 0; i < count * nranks; ++i) send[i] = valueOf(rank, i), recv[i] = NAN;
    CHECK(ncclGroupStart());
    for (int p = 0; p < nranks; ++p) {
      CHECK(ncclSend(send + p * block, block, ncclFloat, p, comm, NULL));
      CHECK(ncclRecv(recv + p * block, block, ncclFloat, p, comm, NULL));
    }
    CHECK(ncclGroupEnd());
    for (int p = 0; p < nranks; ++p)
      for (size_t i = 0; i < block; ++i)
        EXPECT(recv[p * block + i] == valueOf(p, rank * block + i), "alltoall from %d at %zu", p, i);
    /* A send to self with no receive from self to match would never complete: refused. */
    EXPECT(ncclSend(send, block, ncclFloat, rank, comm, NULL) == ncclInvalidUsage, "lone send to self");
  }

  /* Registration of a buffer used by a collective; ncclMemAlloc round trip. */
  void* handle = NULL;
  CHECK(ncclCommRegister(comm, send, count * sizeof(float), &handle));
  CHECK(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, NULL));
  for (size_t i = 0; i < count; ++i)
    EXPECT(near(recv[i], reduced(ncclSum, nranks, i)), "registered at %zu", i);
  CHECK(ncclCommDeregister(comm, handle));
  void* mem = NULL;
  CHECK(ncclMemAlloc(&mem, 1 << 16));
  CHECK(ncclMemFree(mem));

  /* Split by parity, ranks in reverse order by key; sum of the members' ranks. */
  ncclComm_t half;
  CHECK(ncclCommSplit(comm, rank % 2, -rank, &half, NULL));
  int hn = 0, hme = -1, members = 0, above = 0, sumOfRanks = 0, got = 0;
  for (int q = rank % 2; q < nranks; q += 2) ++members, sumOfRanks += q, above += q > rank;
  CHECK(ncclCommCount(half, &hn));
  CHECK(ncclCommUserRank(half, &hme));
  EXPECT(hn == members, "split size %d, expected %d", hn, members);
  EXPECT(hme == above, "split rank %d, expected %d (keys reverse the order)", hme, above);
  CHECK(ncclAllReduce(&rank, &got, 1, ncclInt, ncclSum, half, NULL));
  EXPECT(got == sumOfRanks, "split allreduce %d, expected %d", got, sumOfRanks);
  CHECK(ncclCommDestroy(half));

  /* Nothing went wrong asynchronously. */
  ncclResult_t async = ncclInternalError;
  CHECK(ncclCommGetAsyncError(comm, &async));
  EXPECT(async == ncclSuccess, "async error %d", (int)async);

  /* What Ridge cannot do is refused by name, never faked. */
  ncclWindow_t win;
  EXPECT(ncclCommWindowRegister(comm, send, 4096, &win, NCCL_WIN_DEFAULT) == ncclInvalidUsage,
         "window register");
  EXPECT(strstr(ncclGetLastError(comm), "ncclCommWindowRegister") != NULL, "last error: %s",
         ncclGetLastError(comm));

  CHECK(ncclCommFinalize(comm));
  CHECK(ncclCommDestroy(comm));
  free(send);
  free(recv);
  return 0;
}

int main(int argc, char** argv) {
  int nranks = 2, requireRidge = 0;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--require-ridge") == 0)
      requireRidge = 1;
    else
      nranks = atoi(argv[i]);
  }
  if (nranks < 1 || nranks > 16) {
    fprintf(stderr, "usage: %s [nranks 1..16] [--require-ridge]\n", argv[0]);
    return 2;
  }
  /* Which libnccl answered: Ridge's has a symbol of its own. */
  const char* (*ridgeInfo)(void) = (const char* (*)(void))dlsym(RTLD_DEFAULT, "ridgeNcclShimVersion");
  Dl_info where;
  const char* path = dladdr((void*)&ncclGetVersion, &where) && where.dli_fname ? where.dli_fname : "?";
  printf("libnccl: %s (%s)\n", path, ridgeInfo ? ridgeInfo() : "not Ridge's");
  if (requireRidge && !ridgeInfo) {
    fprintf(stderr, "the libnccl.so.2 loaded is not Ridge's\n");
    return 1;
  }
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) {
    fprintf(stderr, "ncclGetUniqueId: %s\n", ncclGetLastError(NULL));
    return 1;
  }
  fflush(stdout);
  pid_t pids[16];
  for (int r = 0; r < nranks; ++r) {
    pids[r] = fork();
    if (pids[r] < 0) return 1;
    if (pids[r] == 0) {
      rank = r;
      alarm(120); /* a hang becomes a failure */
      _exit(runRank(nranks, id));
    }
  }
  int failed = 0;
  for (int r = 0; r < nranks; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "rank %d failed (status 0x%x)\n", r, status);
      failed = 1;
    }
  }
  printf("%s: %d ranks, %s\n", argv[0], nranks, failed ? "FAILED" : "every result right");
  return failed;
}
