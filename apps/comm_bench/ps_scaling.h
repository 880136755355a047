// ps_scaling.h: comm_bench's parameter-server bottleneck mode (--ps-scaling W1,W2,...).
//
// One dedicated server rank and W worker ranks (local: W + 1 threads per entry; mpi: one entry,
// W = size - 1, under mpirun -np W+1). For each W: ring over the W workers, then the parameter
// server with the server rank, at --ps-bytes. The server receives W x K bytes per allreduce
// (every worker pushes all K bytes to it) and sends as much back, so its time grows with W;
// each ring rank sends 2(W-1)K/W < 2K whatever W.
#pragma once

#include <memory>

#include "apps/comm_bench/options.h"
#include "apps/comm_bench/report.h"
#include "comm/transport.h"

namespace kiln::apps::comm_bench {

// One entry of --ps-scaling: W workers (ranks 0..W-1) and one server (rank W). Rank 0 prints
// the header first when `print_header`. Returns 1 when an allreduce result was wrong, else 0.
int ps_scaling_rank(std::shared_ptr<comm::Transport> tp, const Options& o, Report& report,
                    bool print_header);

}  // namespace kiln::apps::comm_bench
