// mpi_transport.h: Open MPI point-to-point as a Transport (one rank per process, any hosts).
//
//   mpirun -np 4 ./mnist_train --dist mpi ...            # 4 processes on this host
//   mpirun -np 8 -H a:4,b:4 ./mnist_train ...            # 4 on host a, 4 on host b
//
// Failing cleanly. A rank that hits an unrecoverable error must call abort(why) (MPI_Abort):
// the launcher then ends every rank at once. A rank that just returns from main finalises MPI
// at exit, and MPI_Finalize waits for the other ranks, which may be waiting for a message
// from it: the job would end only when their timeouts (KILN_COMM_TIMEOUT_S) fire. A rank that
// dies (a crash, SIGKILL) is noticed by mpirun, which ends the job within about a second; the
// ranks on the dead rank's host notice it sooner themselves and say which rank died (a /proc
// check while they wait, and a SIGTERM handler: comm/peer_liveness.h).
#pragma once

#include <memory>

#include "comm/transport.h"

namespace kiln::comm {

// Initialises MPI (MPI_Init_thread, MPI_THREAD_MULTIPLE if available, SERIALIZED at least) on
// first call unless the program already did; whoever initialised MPI finalises it (we do at
// exit). Outside mpirun it is a world of 1. Rank, size, local rank (ranks of this host) and
// host name come from MPI. Creating a transport is collective: every rank creates its
// transports in the same order.
std::shared_ptr<Transport> make_mpi_transport();

}  // namespace kiln::comm
