// launcher.h: what an app can tell from the environment about how it was launched, before MPI
// is initialised: mpirun (Open MPI) and srun/PMI set these variables in every rank.
#pragma once

#include <cstdlib>
#include <initializer_list>
#include <string>

#include "engine/error.h"

namespace kiln::apps {

// Started by mpirun or srun (the ranks are MPI processes).
inline bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

// Started by mpirun or srun as a rank other than 0 (rank 0 alone reports flag errors).
inline bool launched_as_nonzero_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && std::atoi(v) != 0) return true;
  }
  return false;
}

// How many processes the launcher of this one started in all, and the variable that says so
// ("OMPI_COMM_WORLD_SIZE=2"): mpirun (Open MPI), PMI_SIZE (MPICH's Hydra, srun --mpi=pmi2),
// SLURM_STEP_NUM_TASKS (srun, whatever its MPI plugin). 1 and "" when none says more. Not
// SLURM_NTASKS: an sbatch script sees its allocation's task count there while being one process.
inline int launched_process_count(std::string* said_by = nullptr) {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}) {
    const char* v = std::getenv(var);
    const int n = v != nullptr ? std::atoi(v) : 0;
    if (n > 1) {
      if (said_by != nullptr) *said_by = std::string(var) + "=" + v;
      return n;
    }
  }
  return 1;
}

// A Usage error (exit 2) when mpirun or srun started several processes of an app that was not
// told how its ranks talk (`dist_flag` not given): each process would run alone, all of them
// writing the same output files. `add` says what to add ("--dist mpi").
inline void refuse_several_processes_without(const std::string& dist_flag, const std::string& add) {
  std::string said_by;
  const int n = launched_process_count(&said_by);
  if (n <= 1) return;
  throw Error("started as one of " + std::to_string(n) + " processes (" + said_by + ") without " +
                  dist_flag + ": each process would run alone, all writing the same files; add " +
                  add + " to make them the ranks of one run, or start a single process",
              ErrorKind::Usage);
}

}  // namespace kiln::apps
