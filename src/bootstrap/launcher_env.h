// Where ridgeCommInitFromEnv finds its rank, world size and root address: the variables that
// launchers set (torchrun, Open MPI's mpirun, PMI/PMIx launchers such as MPICH's and Slurm's
// srun --mpi=pmi2, and Slurm itself).
#pragma once

#include <string>

#include "core/status.h"

namespace ridge {

struct LauncherPlace {
  int rank = -1;
  int worldSize = 0;
  std::string rootAddr;  // host:port ([v6]:port)
  std::string source;    // which variables gave rank and size, for messages
};

// Rank and size come as a pair from the first of these that sets both: RIDGE_RANK/
// RIDGE_WORLD_SIZE, RANK/WORLD_SIZE (torchrun), OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE,
// PMI_RANK/PMI_SIZE, SLURM_PROCID/SLURM_NTASKS. The address is RIDGE_ROOT_ADDR, else
// MASTER_ADDR and MASTER_PORT. ridgeInvalidUsage when something is missing (the message
// lists what is looked for), ridgeInvalidArgument when a value is malformed.
Status launcherPlace(LauncherPlace* out);

// The secret of an env-initialized job (the unique id's secret, bootstrap.h), which every
// rank derives alike without an id travelling: from RIDGE_JOB_KEY when set, else from the
// launcher's job id (SLURM_JOB_ID with SLURM_STEP_ID, TORCHELASTIC_RUN_ID, PMIX_NAMESPACE,
// OMPI_MCA_ess_base_jobid), else from the root address alone (WARN: anyone who can reach it
// can join). Each is mixed with the root address. *source names what it came from.
// docs/reliability.md ("Rendezvous threat model") says what each protects against.
uint64_t envJobSecret(const LauncherPlace& place, std::string* source);

}  // namespace ridge
