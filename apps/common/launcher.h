// launcher.h: what an app can tell from the environment about how it was launched, before MPI
// is initialised: mpirun (Open MPI) and srun/PMI set these variables in every rank.
#pragma once

#include <cstdlib>
#include <initializer_list>

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

}  // namespace kiln::apps
