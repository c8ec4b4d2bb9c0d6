/* MPI-based init: rank 0 creates the unique id, MPI_Bcast gives it to everyone.
 * Run: mpirun -np 2 ./allreduce_mpi   (as root add --allow-run-as-root) */
#include <mpi.h>
#include <ridge/ridge.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                       \
  do {                                                                                    \
    ridgeResult_t r_ = (call);                                                            \
    if (r_ != ridgeSuccess) {                                                             \
      fprintf(stderr, "%s failed: %s: %s\n", #call, ridgeGetErrorString(r_), ridgeGetLastError(NULL)); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                       \
    }                                                                                     \
  } while (0)

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, nranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);

  ridgeUniqueId id;
  if (rank == 0) CHECK(ridgeGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ridgeComm_t comm;
  CHECK(ridgeCommInitRank(&comm, nranks, id, rank));

  enum { N = 1 << 20 };
  double* buf = malloc(N * sizeof *buf);
  for (int i = 0; i < N; ++i) buf[i] = rank + i;
  CHECK(ridgeAllReduce(buf, buf, N, ridgeDouble, ridgeSum, comm, NULL)); /* in place */

  /* sum over r of (r + i) = nranks*i + nranks*(nranks-1)/2 */
  long bad = 0;
  for (int i = 0; i < N; ++i) bad += buf[i] != (double)nranks * i + nranks * (nranks - 1) / 2.0;
  printf("rank %d of %d: allreduce of %d doubles, %ld wrong\n", rank, nranks, N, bad);
  free(buf);
  CHECK(ridgeCommFinalize(comm));
  CHECK(ridgeCommDestroy(comm));
  MPI_Finalize();
  return bad != 0;
}
