// mpi_transport.h: Open MPI point-to-point as a Transport (one rank per process, any hosts).
#pragma once

#include <memory>

#include "comm/transport.h"

namespace kiln::comm {

// Initialises MPI (MPI_THREAD_SERIALIZED or better) on first call; finalised at exit.
// Outside mpirun it is a world of 1. Rank, size, local rank (ranks of this host) and host
// name come from MPI.
std::shared_ptr<Transport> make_mpi_transport();

}  // namespace kiln::comm
