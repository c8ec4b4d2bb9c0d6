/* Environment-based init, as under torchrun or Slurm: every process is told its rank,
 * the world size and where rank 0 listens.
 * Run two ranks by hand:
 *   RIDGE_RANK=0 RIDGE_WORLD_SIZE=2 RIDGE_ROOT_ADDR=127.0.0.1:29517 ./allreduce_env &
 *   RIDGE_RANK=1 RIDGE_WORLD_SIZE=2 RIDGE_ROOT_ADDR=127.0.0.1:29517 ./allreduce_env */
#include <ridge/ridge.h>
#include <stdio.h>

int main(void) {
  ridgeComm_t comm;
  ridgeResult_t r = ridgeCommInitFromEnv(&comm);
  if (r != ridgeSuccess) {
    fprintf(stderr, "init failed: %s: %s\n", ridgeGetErrorString(r), ridgeGetLastError(NULL));
    return 1;
  }
  int rank, nranks;
  ridgeCommUserRank(comm, &rank);
  ridgeCommCount(comm, &nranks);

  float x[4] = {1.0f * rank, 2.0f * rank, 3.0f, 4.0f}, y[4];
  r = ridgeAllReduce(x, y, 4, ridgeFloat, ridgeMax, comm, NULL);
  if (r != ridgeSuccess) {
    fprintf(stderr, "allreduce failed: %s\n", ridgeGetLastError(comm));
    return 1;
  }
  int ok = y[0] == nranks - 1 && y[1] == 2.0f * (nranks - 1) && y[2] == 3.0f && y[3] == 4.0f;
  printf("rank %d of %d: max = {%g, %g, %g, %g} %s\n", rank, nranks, y[0], y[1], y[2], y[3], ok ? "OK" : "WRONG");
  ridgeCommFinalize(comm);
  ridgeCommDestroy(comm);
  return ok ? 0 : 1;
}
