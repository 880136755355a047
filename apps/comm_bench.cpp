// comm_bench: allreduce time, algbw, busbw and bytes on the wire, per algorithm and message size,
// in the manner of nccl-tests (https://github.com/NVIDIA/nccl-tests; docs/data_parallel.md).
//
//   comm_bench --dist local:4                                      (threads of this process)
//   mpirun -np 2 build/apps/comm_bench --dist mpi --csv out/comm/mpi2.csv
//   mpirun -np 2 build/apps/comm_bench --dist nccl                 (one GPU per rank)
//   comm_bench --dist local --ps-scaling 1,2,4,8                    (the server bottleneck)
//   mpirun -np 5 --oversubscribe build/apps/comm_bench --dist mpi --ps-scaling 4
//
// --dist and --allreduce are mnist_train's names (apps/common/flag_names.h); the old spellings
// --transport and --algorithms, and the --dtype values f32 and f16, still work with a line saying
// what to write instead.
//
// Sweep (the default mode). For every size from --min-bytes to --max-bytes (times --step-factor)
// and every algorithm of --allreduce (ring, hd = halving-doubling, bb = binary blocks,
// ps = parameter server, native = MPI_Allreduce / ncclAllReduce where the transport has one),
// on every member rank:
//   check   each rank fills the buffer with small integers that depend on its rank and the
//           element index, one allreduce (sum), and every element is compared with the exact
//           sum (small integers add exactly in f32 and f16, in any order). A wrong element fails
//           the run (exit 1) after the table, on every rank.
//   time    one untimed allreduce, then up to --warmup - 1 more, then --iters timed ones (fewer
//           when one allreduce takes more than --max-seconds / --iters; at least 1). A rank's
//           time is its loop time / iterations after a barrier; the reported time is the
//           slowest rank's (allgathered), as nccl-tests does. Also reported: the median over
//           the iterations of the slowest rank's time of each, which a busy machine's
//           occasional stall moves less than the mean.
//   algbw   = size / time;   busbw = algbw * 2(N-1)/N: the bandwidth each rank's link carries
//           for a bandwidth-optimal allreduce, comparable across N (nccl-tests' definition).
//   bytes   Transport::bytes_sent() over the timed loop / iterations: the bytes each rank put
//           on the wire per allreduce (mean over ranks; the table says when ranks differ, and
//           what the busiest rank sent: hd's folding ranks, bb's middle blocks), next
//           to the ring's model 2(N-1)K/N (Patarasuk and Yuan 2009). native: not counted (the library moves
//           its own bytes).
// The timed allreduces run on zeros (a sum of zeros stays zero, so repeated in-place sums never
// overflow; zeros cost what any other value costs).
//
// PS scaling (--ps-scaling W1,W2,...): one dedicated server rank and W worker ranks (local:
// W + 1 threads per entry; mpi: one entry, W = size - 1, under mpirun -np W+1). For each W:
// ring over the W workers, then the parameter server with the server rank, at --ps-bytes. The
// server receives W x K bytes per allreduce (every worker pushes all K bytes to it) and sends as
// much back, so its time grows with W; each ring rank sends 2(W-1)K/W < 2K whatever W.
//
// CSV (--csv PATH; --append adds rows below an existing header). Written by rank 0.
//   sweep:      transport,world,members,ps_servers,algorithm,dtype,bytes,count,iters,time_us,
//               algbw_gbs,busbw_gbs,bytes_per_rank,bytes_per_rank_max,bytes_total,
//               model_bytes_per_rank,correct,median_us   (bytes_total: the sum over ranks)
//   ps scaling: transport,workers,servers,algorithm,dtype,bytes,iters,time_us,
//               worker_bytes_sent,server_bytes_received,model_worker_bytes,
//               model_server_bytes_received,correct,median_us
// tools/plot.py draws both; tools/comm_experiment.sh runs the whole experiment.
//
// Exit codes: 0 done and every result correct; 1 a wrong result or a runtime failure; 2 a bad
// flag (with what to pass instead).
//
// Where the pieces are (apps/comm_bench/, namespace kiln::apps::comm_bench; this file keeps the
// flow: flags, run() on local threads or MPI ranks, the JSON and the exit code):
//   options.h     the flags' values and --help, and the parsers of sizes, dtype and local:N
//   message.h     the buffer of one size; the check's pattern and its exact sum
//   measure.h     one (size, algorithm): check, warm up, time, gathered to every rank
//   sweep.h       the default mode: the table, its CSV and JSON rows, the summary
//   ps_scaling.h  the --ps-scaling mode
//   report.h      number formats, the CSV file, the JSON file, the note on what times measure
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "apps/common/flag_checks.h"
#include "apps/common/launcher.h"
#include "apps/common/rank_agreement.h"
#include "apps/comm_bench/options.h"
#include "apps/comm_bench/ps_scaling.h"
#include "apps/comm_bench/report.h"
#include "apps/comm_bench/sweep.h"
#include "comm/communicator.h"
#include "comm/local_transport.h"
#include "comm/transport.h"
#include "engine/error.h"

using namespace kiln;
using namespace kiln::apps::comm_bench;
using comm::Transport;

namespace {

// local:N: the ranks are threads of this process, one group per --ps-scaling entry (W + 1
// threads) or one group of N for the sweep. Returns the largest exit code of any rank.
int run_local_ranks(const Options& o, int n_local, Report& report) {
  int rc = 0;
  if (!o.ps_scaling.empty()) {
    bool first = true;
    for (const int w : o.ps_scaling) {
      std::vector<int> rcs(w + 1, 0);
      comm::run_local(w + 1, [&](std::shared_ptr<Transport> t) {
        rcs[t->rank()] = ps_scaling_rank(t, o, report, first);
      });
      first = false;
      for (int r : rcs) rc = std::max(rc, r);
    }
  } else {
    std::vector<int> rcs(n_local, 0);
    comm::run_local(n_local, [&](std::shared_ptr<Transport> t) {
      rcs[t->rank()] = sweep_rank(t, o, report);
    });
    for (int r : rcs) rc = std::max(rc, r);
  }
  return rc;
}

// mpi or nccl: this process is one rank. Returns its exit code.
int run_this_rank(std::shared_ptr<Transport> t, const Options& o, Report& report,
                  const char* csv_header) {
  if (t->rank() == 0) report.csv.open(o.csv, o.append, csv_header);
  if (o.ps_scaling.empty()) return sweep_rank(t, o, report);
  if (o.ps_scaling.size() != 1 || o.ps_scaling[0] != t->size() - 1) {
    throw Error("--ps-scaling under " + o.transport + ": give one worker count W = ranks "
                "- 1 = " + std::to_string(t->size() - 1) + " (run mpirun -np W+1 "
                "once per W, with --csv FILE --append)", ErrorKind::Usage);
  }
  return ps_scaling_rank(t, o, report, !o.append);
}

// What the MPI ranks must share: a rank started with other sizes, algorithms or iterations
// would wait for messages no other rank sends.
std::vector<comm::Setting> flags_every_rank_shares(const Options& o) {
  std::string algorithms, scaling;
  for (const std::string& a : o.algorithms) algorithms += (algorithms.empty() ? "" : ",") + a;
  for (const int w : o.ps_scaling) scaling += (scaling.empty() ? "" : ",") + std::to_string(w);
  return {{"--dist", o.transport},          {"--allreduce", algorithms},
          {"--min-bytes", o.min_bytes},     {"--max-bytes", o.max_bytes},
          {"--step-factor", std::to_string(o.step_factor)},
          {"--iters", std::to_string(o.iters)}, {"--warmup", std::to_string(o.warmup)},
          {"--max-seconds", std::to_string(o.max_seconds)}, {"--dtype", o.dtype},
          {"--ps-servers", std::to_string(o.ps_servers)}, {"--ps-scaling", scaling},
          {"--ps-bytes", o.ps_bytes},       {"--ring-subchunk", o.ring_subchunk}};
}

int run(const Options& o) {
  // Flags every rank checks the same way before any communication.
  check_flags(o);
  const bool scaling = !o.ps_scaling.empty();
  const char* csv_header = scaling ? kPsScalingCsvHeader : kSweepCsvHeader;
  Report report;
  int rc = 0;
  const int n_local = local_ranks(o.transport);
  std::shared_ptr<Transport> mpi_like;
  if (n_local > 0) {
    report.csv.open(o.csv, o.append, csv_header);
    rc = run_local_ranks(o, n_local, report);
  } else {
    mpi_like = comm::make_transport(o.transport);
    // Before any other message: ranks started with other flags would hang.
    if (const int agreed = apps::refuse_unless_ranks_agree("comm_bench", *mpi_like,
                                                          flags_every_rank_shares(o))) {
      return agreed;
    }
    try {
      rc = run_this_rank(mpi_like, o, report, csv_header);
    } catch (const Error& e) {
      // A usage error is found by every rank alike before any communication: rank 0 says it.
      // Anything else may have struck this rank alone while the others wait for it: stop them
      // all now (MPI_Abort) instead of letting them run into their timeout.
      if (e.kind() != ErrorKind::Runtime) {
        if (mpi_like->rank() != 0) return e.exit_code();
        throw;
      }
      std::fprintf(stderr, "comm_bench: rank %d: %s\n", mpi_like->rank(), e.what());
      mpi_like->abort(std::string("comm_bench: rank ") + std::to_string(mpi_like->rank()) +
                      " failed: " + e.what());
      return 1;
    }
  }
  const bool r0 = !mpi_like || mpi_like->rank() == 0;
  if (r0 && !o.json.empty()) write_json_report(o, report);
  if (rc != 0) {
    if (r0) std::fprintf(stderr, "comm_bench: an allreduce produced a WRONG result (see above)\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Allreduce benchmark, like nccl-tests: time, algbw, busbw and bytes sent per "
               "rank for ring, halving-doubling, binary blocks, parameter server and the "
               "library's own allreduce, over threads (local:N), MPI or NCCL"};
  Options o;
  add_flags(app, o);
  const std::vector<apps::OldSpelling> old_spellings = {
      apps::renamed_flag("--transport", "--dist"), apps::renamed_flag("--algorithms", "--allreduce"),
      apps::renamed_value("--dtype", "f32", "fp32"), apps::renamed_value("--dtype", "f16", "fp16")};
  if (const std::optional<int> rc =
          apps::parse_flags(app, argc, argv, "comm_bench", old_spellings)) {
    return *rc;
  }
  // Started by mpirun / srun without --dist: the ranks are MPI processes, not threads.
  if (app.count("--dist") == 0 && apps::launched_by_mpi()) {
    o.transport = "mpi";
  }
  try {
    return run(o);
  } catch (const OutOfMemory& e) {
    // The messages are the only large buffers, and the flags choose their sizes.
    const Error sized = apps::size_error(e, o.ps_scaling.empty() ? "--max-bytes " + o.max_bytes
                                                                 : "--ps-bytes " + o.ps_bytes);
    std::fprintf(stderr, "comm_bench: error: %s\n", sized.what());
    return sized.exit_code();
  } catch (const Error& e) {
    std::fprintf(stderr, "comm_bench: error: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_bench: error: %s\n", e.what());
    return 1;
  }
}
