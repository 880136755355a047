// ps_scaling.cpp: see ps_scaling.h.
#include "apps/comm_bench/ps_scaling.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>

#include "apps/comm_bench/measure.h"
#include "apps/comm_bench/message.h"
#include "comm/communicator.h"
#include "comm/parameter_server.h"

namespace kiln::apps::comm_bench {

using namespace kiln::comm;

namespace {

// Rank 0, once: what is compared, what the times measure here, and the column heads.
void print_ps_scaling_header(const Transport& t, const Options& o, size_t bytes) {
  std::printf("comm_bench PS scaling: allreduce (sum, %s) of %s: ring over W workers vs a "
              "parameter server with 1 dedicated server rank\n",
              o.dtype.c_str(), human_bytes(static_cast<double>(bytes)).c_str());
  if (std::string(t.name()) == "local") {
    std::printf("note: local: the ranks (W workers + 1 server per row) are threads of this "
                "process and a send is a memcpy into the peer's mailbox: these times measure "
                "memory copies on %u core(s), not a network\n",
                std::max(1u, std::thread::hardware_concurrency()));
  } else {
    std::printf("note: %s\n", host_note(t).c_str());
  }
  std::printf("note: the server receives every worker's K bytes (W x K) and returns as much: "
              "its time grows with W. Each ring rank sends 2(W-1)K/W < 2K whatever W; on this "
              "machine the W ranks also share the cores, so the ring's time grows as well: "
              "what stays flat is its bytes per rank\n");
  std::printf("%7s %-6s %6s %11s %11s %18s %22s %22s  %s\n", "workers", "alg", "iters",
              "time us", "median us", "bytes/worker", "server bytes received",
              "model (worker/server)", "check");
  std::fflush(stdout);
}

// Rank 0: one row (w workers, algorithm a) on stdout, in the CSV and in the JSON rows.
void report_ps_scaling_row(const Transport& t, const Options& o, int w, size_t bytes,
                           Algorithm a, const Measured& r, Report& report) {
  const bool is_ps = a == Algorithm::ParameterServer;
  const double k = static_cast<double>(bytes);
  const double per_worker = r.g.sum_bytes / w;
  // PS: a worker sends only to the server, so the server receives what the workers sent.
  const double server_rx = is_ps ? r.g.sum_bytes : 0;
  const double model_worker = is_ps ? k : (w > 1 ? 2.0 * (w - 1) * k / w : 0.0);
  const double model_server = is_ps ? w * k : 0;
  const std::string model = bytes_str(model_worker) + (is_ps ? " / " + bytes_str(model_server)
                                                             : std::string(" / -"));
  std::printf("%7d %-6s %6d %11.1f %11.1f %18s %22s %22s  %s\n", w, algorithm_name(a),
              r.iters, r.g.max_time * 1e6, r.g.median_time * 1e6, bytes_str(per_worker).c_str(),
              is_ps ? bytes_str(server_rx).c_str() : "-", model.c_str(),
              r.g.all_ok ? "ok" : "WRONG");
  std::fflush(stdout);
  report.csv.row(std::string(t.name()) + "," + std::to_string(w) + ",1," + algorithm_name(a) +
                 "," + o.dtype + "," + std::to_string(bytes) + "," + std::to_string(r.iters) +
                 "," + fmt("%.3f", r.g.max_time * 1e6) + "," + bytes_str(per_worker) + "," +
                 (is_ps ? bytes_str(server_rx) : "") + "," + bytes_str(model_worker) + "," +
                 (is_ps ? bytes_str(model_server) : "") + "," + (r.g.all_ok ? "1" : "0") +
                 "," + fmt("%.3f", r.g.median_time * 1e6));
  report.rows.push_back({{"transport", t.name()}, {"workers", w}, {"servers", 1},
                         {"algorithm", algorithm_name(a)}, {"dtype", o.dtype}, {"bytes", bytes},
                         {"iters", r.iters}, {"time_us", r.g.max_time * 1e6},
                         {"worker_bytes_sent", per_worker},
                         {"server_bytes_received",
                          is_ps ? nlohmann::json(server_rx) : nlohmann::json()},
                         {"correct", r.g.all_ok}});
}

}  // namespace

int ps_scaling_rank(std::shared_ptr<Transport> tp, const Options& o, Report& report,
                    bool print_header) {
  Transport& t = *tp;
  const ElemType type = parse_dtype(o.dtype);
  const int w = t.size() - 1;
  size_t bytes = parse_bytes("--ps-bytes", o.ps_bytes);
  bytes -= bytes % elem_size(type);
  PsOptions ps;
  ps.workers = w;
  ps.servers = 1;
  if (t.rank() == w) {
    serve(t, ps);
    return 0;
  }
  AlgorithmOptions aopt;
  aopt.ps_servers = 1;
  aopt.ring_subchunk_bytes = parse_bytes("--ring-subchunk", o.ring_subchunk);
  Communicator comm(tp, w, aopt);
  const bool r0 = t.rank() == 0;
  if (r0 && print_header) print_ps_scaling_header(t, o, bytes);
  bool ok_all = true;
  Message m = make_message(t, bytes, type);
  for (const Algorithm a : {Algorithm::Ring, Algorithm::ParameterServer}) {
    const Measured r = measure(comm, w, m, a, o);
    ok_all = ok_all && r.g.all_ok;
    if (!r.error.empty()) {
      std::fprintf(stderr, "comm_bench: rank %d: %s allreduce with %d workers is WRONG: %s\n",
                   t.rank(), algorithm_name(a), w, r.error.c_str());
    }
    if (r0) report_ps_scaling_row(t, o, w, bytes, a, r, report);
  }
  ps_shutdown(t, ps);
  if (!ok_all) {
    if (r0) report.all_correct = false;
    return 1;
  }
  return 0;
}

}  // namespace kiln::apps::comm_bench
