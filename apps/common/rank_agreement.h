// rank_agreement.h: how an app whose ranks must share their flags refuses a run whose ranks
// were started with different ones (comm::check_ranks_agree, comm/agreement.h).
//
//   if (const int rc = apps::refuse_unless_ranks_agree("mnist_train", *t, settings)) return rc;
//
//   mpirun -np 1 mnist_train --dist mpi --model cnn : -np 1 mnist_train --dist mpi --model mlp
//   -> mnist_train: error: ranks disagree on --model: rank 0 cnn, rank 1 mlp; every rank must
//      be started with the same flags                                        (every rank exits 2)
//
// Rank 0 alone prints the message, and prints it before any other rank may exit (mpirun ends
// the job at the first process that exits with an error; output not yet written is lost).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "comm/agreement.h"
#include "comm/transport.h"
#include "engine/error.h"

namespace kiln::apps {

// 0 when every member rank of `t` (ranks [0, members), -1: all) passed the same settings;
// otherwise 2 on every member, rank 0 having printed "<app>: error: <what differs>". Errors of
// the transport itself (a dead peer, a timeout) are thrown as they are.
inline int refuse_unless_ranks_agree(const char* app, comm::Transport& t,
                                     const std::vector<comm::Setting>& settings,
                                     int members = -1) {
  try {
    comm::check_ranks_agree(t, settings, members, [app](const std::string& message) {
      std::fflush(stdout);
      std::fprintf(stderr, "%s: error: %s\n", app, message.c_str());
      std::fflush(stderr);
    });
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::Usage) throw;
    return e.exit_code();
  }
  return 0;
}

}  // namespace kiln::apps
