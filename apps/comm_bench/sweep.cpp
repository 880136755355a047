// sweep.cpp: see sweep.h.
#include "apps/comm_bench/sweep.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/comm_bench/measure.h"
#include "apps/comm_bench/message.h"
#include "comm/communicator.h"
#include "comm/parameter_server.h"
#include "engine/error.h"

namespace kiln::apps::comm_bench {

using namespace kiln::comm;

namespace {

// Who takes part and which sizes, from the flags and the number of ranks.
struct SweepShape {
  ElemType type = ElemType::F32;
  int world = 0;    // ranks of the transport
  int servers = 0;  // --ps-servers: the last ranks, dedicated parameter servers
  int n = 0;        // members of the collectives: world - servers
  size_t min_b = 0, max_b = 0;
};

// One measured (size, algorithm), as the table, the CSV, the JSON and the summary need it.
struct Row {
  size_t bytes = 0;         // the message size K
  int64_t count = 0;        // elements in it
  std::string alg;          // algorithm_name()
  int iters = 0;            // timed allreduces
  double time = 0;          // seconds: the slowest rank's mean
  double median_time = 0;   // seconds: median over the iterations of the slowest rank's time
  double algbw = 0, busbw = 0, median_busbw = 0;            // GB/s
  double bytes_per_rank = 0, max_bytes = 0, sum_bytes = 0;  // sent: mean, busiest, all ranks
  double model = 0;         // the ring's 2(N-1)K/N
  bool has_bytes = false;   // false for native: the library moves its own bytes
  bool exact = false;       // sum_bytes == 2(N-1)K
  bool all_ok = true;       // the check passed on every rank
};

// Usage errors that need the number of ranks; every rank finds the same ones.
SweepShape check_sweep_flags(const Transport& t, const Options& o) {
  SweepShape s;
  s.type = parse_dtype(o.dtype);
  s.world = t.size();
  s.servers = o.ps_servers;
  s.n = s.world - s.servers;  // members of the collectives
  if (s.n < 1) {
    throw Error("--ps-servers " + std::to_string(s.servers) + " leaves no worker among " +
                std::to_string(s.world) + " ranks: use fewer servers or more ranks",
                ErrorKind::Usage);
  }
  s.min_b = parse_bytes("--min-bytes", o.min_bytes);
  s.max_b = parse_bytes("--max-bytes", o.max_bytes);
  if (s.min_b > s.max_b) {
    throw Error("--min-bytes " + o.min_bytes + " is larger than --max-bytes " + o.max_bytes,
                ErrorKind::Usage);
  }
  if (s.min_b % elem_size(s.type) != 0) {
    throw Error("--min-bytes " + o.min_bytes + " is not a whole number of " + o.dtype +
                " elements", ErrorKind::Usage);
  }
  return s;
}

// Which algorithms run: the same decision on every rank. Rank 0 says which are skipped, and why.
std::vector<Algorithm> choose_algorithms(const Transport& t, const Options& o,
                                         const SweepShape& s) {
  const bool r0 = t.rank() == 0;
  std::vector<Algorithm> algs;
  for (const std::string& name : o.algorithms) {
    const Algorithm a = parse_algorithm(name);
    std::string skip;
    if (a == Algorithm::Native && !t.has_native_allreduce()) {
      skip = std::string("the ") + t.name() + " transport has no library allreduce (use "
             "--dist mpi or nccl)";
    } else if (a == Algorithm::Native && s.servers > 0) {
      skip = "native runs over every rank; with --ps-servers the last ranks are servers";
    } else if (a == Algorithm::Native && s.type == ElemType::F16 &&
               std::string(t.name()) == "mpi") {
      skip = "MPI has no 16-bit float type for MPI_Allreduce";
    }
    if (!skip.empty()) {
      if (r0) std::printf("note: %s skipped: %s\n", name.c_str(), skip.c_str());
      continue;
    }
    if (std::find(algs.begin(), algs.end(), a) == algs.end()) algs.push_back(a);
  }
  return algs;
}

// Rank 0: what is measured, how, and the table's column heads.
void print_sweep_header(const Transport& t, const Options& o, const SweepShape& s) {
  std::printf("comm_bench: allreduce (sum, %s) over %d rank(s)%s, transport %s, %s .. %s, "
              "x%d\n",
              o.dtype.c_str(), s.n,
              s.servers > 0
                  ? (" + " + std::to_string(s.servers) + " dedicated PS server rank(s)").c_str()
                  : "",
              t.name(), human_bytes(static_cast<double>(s.min_b)).c_str(),
              human_bytes(static_cast<double>(s.max_b)).c_str(), o.step_factor);
  std::printf("note: %s\n", host_note(t).c_str());
  std::printf("time: mean of up to %d timed allreduces (after up to %d warm-up; fewer past "
              "%.1f s) of the slowest rank; algbw = size / time; busbw = algbw * 2(N-1)/N; "
              "median: of the iterations' slowest-rank times (robust to a busy machine)\n",
              o.iters, o.warmup, o.max_seconds);
  std::printf("bytes/rank: sent per rank per allreduce, measured by the transport (mean over "
              "ranks; '*' = ranks differ); busiest: the rank that sent the most; model: the "
              "ring's 2(N-1)K/N\n");
  std::printf("%10s %11s %-6s %6s %11s %11s %10s %10s %14s %14s %14s  %s\n", "size", "count",
              "alg", "iters", "time us", "median us", "algbw GB/s", "busbw GB/s", "bytes/rank",
              "busiest", "2(N-1)K/N", "check");
  std::fflush(stdout);
}

// The bandwidths and bytes of one measurement of `size` bytes (`count` elements) over n ranks.
Row make_row(size_t size, int64_t count, Algorithm a, const Measured& r, int n) {
  const double bus_factor = n > 1 ? 2.0 * (n - 1) / n : 0.0;
  Row row;
  row.bytes = size;
  row.count = count;
  row.alg = algorithm_name(a);
  row.iters = r.iters;
  row.time = r.g.max_time;
  row.median_time = r.g.median_time;
  row.algbw = static_cast<double>(size) / row.time / 1e9;
  row.busbw = row.algbw * bus_factor;
  row.median_busbw = static_cast<double>(size) / r.g.median_time / 1e9 * bus_factor;
  row.model = n > 1 ? 2.0 * (n - 1) * static_cast<double>(size) / n : 0.0;
  row.has_bytes = a != Algorithm::Native;
  row.bytes_per_rank = r.g.sum_bytes / n;
  row.max_bytes = r.g.max_bytes;
  row.sum_bytes = r.g.sum_bytes;
  // Exact: the total over ranks is 2(N-1)K to the byte (integers, compared exactly).
  row.exact = row.has_bytes && r.g.sum_bytes == 2.0 * (n - 1) * static_cast<double>(size);
  row.all_ok = r.g.all_ok;
  return row;
}

// Rank 0: the row on stdout, in the CSV and in the JSON rows.
void report_row(const Transport& t, const Options& o, const SweepShape& s, const Row& row,
                Report& report) {
  const bool differ = row.has_bytes && row.max_bytes != row.bytes_per_rank;
  const std::string per_rank_s =
      row.has_bytes ? bytes_str(row.bytes_per_rank) + (differ ? "*" : " ") : "-";
  const std::string busiest_s = row.has_bytes ? bytes_str(row.max_bytes) + " " : "-";
  std::printf("%10s %11lld %-6s %6d %11.1f %11.1f %10.3f %10.3f %14s %14s %14s  %s\n",
              human_bytes(static_cast<double>(row.bytes)).c_str(),
              static_cast<long long>(row.count), row.alg.c_str(), row.iters, row.time * 1e6,
              row.median_time * 1e6, row.algbw, row.busbw, per_rank_s.c_str(),
              busiest_s.c_str(), bytes_str(row.model).c_str(), row.all_ok ? "ok" : "WRONG");
  std::fflush(stdout);
  report.csv.row(std::string(t.name()) + "," + std::to_string(s.world) + "," +
                 std::to_string(s.n) + "," + std::to_string(s.servers) + "," + row.alg + "," +
                 o.dtype + "," + std::to_string(row.bytes) + "," + std::to_string(row.count) +
                 "," + std::to_string(row.iters) + "," + fmt("%.3f", row.time * 1e6) + "," +
                 fmt("%.4f", row.algbw) + "," + fmt("%.4f", row.busbw) + "," +
                 (row.has_bytes ? bytes_str(row.bytes_per_rank) : "") + "," +
                 (row.has_bytes ? bytes_str(row.max_bytes) : "") + "," +
                 (row.has_bytes ? fmt("%.0f", row.sum_bytes) : "") + "," + bytes_str(row.model) +
                 "," + (row.all_ok ? "1" : "0") + "," + fmt("%.3f", row.median_time * 1e6));
  report.rows.push_back({{"transport", t.name()}, {"world", s.world}, {"members", s.n},
                         {"ps_servers", s.servers}, {"algorithm", row.alg},
                         {"dtype", o.dtype}, {"bytes", row.bytes}, {"iters", row.iters},
                         {"time_us", row.time * 1e6}, {"median_us", row.median_time * 1e6},
                         {"algbw_gbs", row.algbw}, {"busbw_gbs", row.busbw},
                         {"bytes_per_rank",
                          row.has_bytes ? nlohmann::json(row.bytes_per_rank) : nlohmann::json()},
                         {"model_bytes_per_rank", row.model}, {"correct", row.all_ok}});
}

// Our target: ring vs native busbw at >= 16 MiB.
void print_ring_vs_native(const std::vector<Row>& rows) {
  double worst = -1, worst_median = -1;
  for (const Row& ring : rows) {
    if (ring.alg != "ring" || ring.bytes < (16u << 20)) continue;
    for (const Row& nat : rows) {
      if (nat.alg != "native" || nat.bytes != ring.bytes) continue;
      const double ratio = ring.busbw / nat.busbw;
      const double ratio_median = ring.median_busbw / nat.median_busbw;
      std::printf("  ring / native busbw at %s: %.3f (from medians: %.3f)\n",
                  human_bytes(static_cast<double>(ring.bytes)).c_str(), ratio, ratio_median);
      worst = worst < 0 ? ratio : std::min(worst, ratio);
      worst_median = worst_median < 0 ? ratio_median : std::min(worst_median, ratio_median);
    }
  }
  if (worst >= 0) {
    std::printf("  ring / native busbw at >= 16 MiB: min %.3f (target >= 0.9 with 2 ranks): "
                "%s; from medians: min %.3f\n", worst, worst >= 0.9 ? "met" : "NOT met",
                worst_median);
  } else {
    std::printf("  ring / native at >= 16 MiB: not measured (needs ring and native and "
                "--max-bytes >= 16M)\n");
  }
}

// Our other target: bytes per rank vs the model 2(N-1)K/N, per algorithm.
void print_bytes_vs_model(const std::vector<Algorithm>& algs, const std::vector<Row>& rows,
                          const SweepShape& s) {
  const int n = s.n;
  for (const Algorithm a : algs) {
    if (a == Algorithm::Native) continue;
    int exact = 0, total = 0;
    double lo = 1e300, hi = 0, busiest = 0;
    for (const Row& r : rows) {
      if (r.alg != algorithm_name(a)) continue;
      ++total;
      exact += r.exact ? 1 : 0;
      if (r.model > 0) {
        lo = std::min(lo, r.bytes_per_rank / r.model);
        hi = std::max(hi, r.bytes_per_rank / r.model);
        busiest = std::max(busiest, r.max_bytes / r.model);
      }
    }
    if (total == 0 || n < 2) continue;
    if (a == Algorithm::ParameterServer && s.servers > 0) {
      // Dedicated servers: a worker pushes K bytes and pulls K; the ring's model is not its.
      std::printf("  %-6s with %d dedicated server(s): a worker sends K bytes (plus the PS "
                  "message headers) per allreduce: measured/K %.4f .. %.4f\n",
                  algorithm_name(a), s.servers, lo * 2.0 * (n - 1) / n, hi * 2.0 * (n - 1) / n);
      continue;
    }
    // The busiest rank: an algorithm can send 2(N-1)K in total yet load one rank more (hd's
    // folded ranks for a non-power-of-two N, up to 3K; bb's middle blocks, 2K; ring chunks of
    // unequal size).
    const std::string uneven =
        busiest > hi * 1.01 ? fmt("; the busiest rank sent up to %.2fx the model", busiest)
                            : std::string();
    if (exact == total) {
      std::printf("  %-6s bytes/rank = 2(N-1)K/N exactly at all %d sizes (sum over ranks = "
                  "2(N-1)K)%s\n", algorithm_name(a), total, uneven.c_str());
    } else {
      std::printf("  %-6s bytes/rank = 2(N-1)K/N at %d of %d sizes; measured/model %.3f .. "
                  "%.3f%s\n", algorithm_name(a), exact, total, lo, hi, uneven.c_str());
    }
  }
}

// Rank 0, after the table: our targets next to what was measured.
void print_sweep_summary(const Transport& t, const SweepShape& s,
                         const std::vector<Algorithm>& algs, const std::vector<Row>& rows) {
  // Our targets: ring vs native busbw at >= 16 MiB; bytes per rank vs the model.
  std::printf("\nsummary (%d rank(s), %s):\n", s.n, t.name());
  print_ring_vs_native(rows);
  print_bytes_vs_model(algs, rows, s);
  std::fflush(stdout);
}

PsOptions server_layout(const SweepShape& s) {
  PsOptions ps;
  ps.workers = s.n;
  ps.servers = s.servers;
  return ps;
}

}  // namespace

int sweep_rank(std::shared_ptr<Transport> tp, const Options& o, Report& report) {
  Transport& t = *tp;
  const SweepShape s = check_sweep_flags(t, o);
  const int n = s.n;
  AlgorithmOptions aopt;
  aopt.ps_servers = s.servers;
  aopt.ring_subchunk_bytes = parse_bytes("--ring-subchunk", o.ring_subchunk);
  const bool r0 = t.rank() == 0;
  const std::vector<Algorithm> algs = choose_algorithms(t, o, s);

  // Dedicated servers serve until the workers are done.
  if (t.rank() >= n) {
    serve(t, server_layout(s));
    return 0;
  }
  Communicator comm(tp, n, aopt);
  if (r0) print_sweep_header(t, o, s);
  std::vector<Row> rows;
  bool ok_all = true;
  for (size_t bytes = s.min_b; bytes <= s.max_b;) {
    const size_t size = bytes - bytes % elem_size(s.type);
    Message m = make_message(t, size, s.type);
    for (const Algorithm a : algs) {
      const Measured r = measure(comm, n, m, a, o);
      ok_all = ok_all && r.g.all_ok;
      if (!r.error.empty()) {
        std::fprintf(stderr, "comm_bench: rank %d: %s allreduce of %s is WRONG: %s\n", t.rank(),
                     algorithm_name(a), human_bytes(static_cast<double>(size)).c_str(),
                     r.error.c_str());
      }
      rows.push_back(make_row(size, m.buf.count, a, r, n));
      if (r0) report_row(t, o, s, rows.back(), report);
    }
    if (bytes > s.max_b / static_cast<size_t>(o.step_factor)) break;
    bytes *= static_cast<size_t>(o.step_factor);
  }
  if (s.servers > 0) ps_shutdown(t, server_layout(s));
  if (r0) print_sweep_summary(t, s, algs, rows);
  if (!ok_all) {
    if (r0) report.all_correct = false;
    return 1;
  }
  return 0;
}

}  // namespace kiln::apps::comm_bench
