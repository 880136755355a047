// mpi_rank_dies.cpp: the program of the mpi_rank_dies_* tests (mpi_rank_dies_test.sh runs it
// under `mpirun -np 2`). Rank 1 leaves the job while rank 0 waits in a receive from it:
//
//   mpi_rank_dies kill    rank 1 is killed (SIGKILL: no destructor, no MPI_Finalize, nothing
//                         printed), as a crash or the OOM killer would do;
//   mpi_rank_dies abort   rank 1 calls Transport::abort(why), as a rank that caught an error
//                         it cannot recover from must (comm/mpi_transport.h).
//
// Either way the job must end quickly with a non-zero exit code and an error message, not hang.
// Who ends it: after a SIGKILL, rank 0 itself, within about 0.1 s: rank 1 runs on the same
// host, and the transport's liveness check (comm/peer_liveness.h) sees its process gone and
// throws an error naming it; rank 0 then calls abort(). Open MPI's launcher would end the job
// a second later anyway ("mpirun noticed that process rank 1 ... exited on signal 9
// (Killed)", then SIGTERM to rank 0). After MPI_Abort, the launcher kills every rank. Our own
// timeout (20 s here; 300 s by default) is only the backstop for a peer that is alive but
// stuck, or on another host: had it fired, rank 0 would print the timeout error and abort().
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>

#include "comm/mpi_transport.h"

using namespace kiln;
using namespace kiln::comm;

int main(int argc, char** argv) {
  const bool by_kill = argc == 2 && std::strcmp(argv[1], "kill") == 0;
  const bool by_abort = argc == 2 && std::strcmp(argv[1], "abort") == 0;
  if (!by_kill && !by_abort) {
    std::fprintf(stderr, "usage: mpirun -np 2 mpi_rank_dies kill|abort\n");
    return 2;
  }
  std::shared_ptr<Transport> t;
  try {
    t = make_mpi_transport();
    t->set_timeout_seconds(20);
    if (t->size() != 2) {
      std::fprintf(stderr, "mpi_rank_dies: run me with mpirun -np 2 (got %d ranks)\n", t->size());
      return 2;
    }
    // Both ranks are up and connected before rank 1 leaves.
    int out = t->rank(), in = -1;
    const int peer = 1 - t->rank();
    t->run({P2POp::send(&out, sizeof out, peer, 0), P2POp::recv(&in, sizeof in, peer, 0)});
    if (t->rank() == 1) {
      if (by_kill) {
        std::fprintf(stderr, "mpi_rank_dies: rank 1 kills itself now\n");
        std::fflush(stderr);
        std::raise(SIGKILL);
      }
      t->abort("rank 1 gives up");  // never returns
    }
    double v = 0;
    t->run({P2POp::recv(&v, sizeof v, 1, 1)});  // never satisfied
    std::fprintf(stderr, "mpi_rank_dies: rank 0 received a message from a dead rank\n");
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_rank_dies: rank %d caught: %s\n", t ? t->rank() : -1, e.what());
    if (t) t->abort(e.what());  // MPI_Abort: never returns
    return 1;
  }
}
