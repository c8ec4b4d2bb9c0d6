/* One-rank communicator from an installed Ridge: init, allreduce, destroy. */
#include <ridge/ridge.h>
#include <stdio.h>

int main(void) {
  int version = 0;
  ridgeUniqueId id;
  ridgeComm_t comm;
  if (ridgeGetVersion(&version) || ridgeGetUniqueId(&id) || ridgeCommInitRank(&comm, 1, id, 0)) {
    fprintf(stderr, "init failed: %s\n", ridgeGetLastError(NULL));
    return 1;
  }
  int in[3] = {1, 2, 3}, out[3] = {0, 0, 0};
  ridgeResult_t r = ridgeAllReduce(in, out, 3, ridgeInt32, ridgeSum, comm, NULL);
  ridgeCommDestroy(comm);
  if (r != ridgeSuccess || out[0] != 1 || out[1] != 2 || out[2] != 3) {
    fprintf(stderr, "allreduce failed: %s\n", ridgeGetLastError(NULL));
    return 1;
  }
  printf("consumer OK with Ridge %d\n", version);
  return 0;
}
