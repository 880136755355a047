// comm_bench: allreduce time, algbw, busbw and bytes on the wire, per algorithm and message size,
// in the manner of nccl-tests (issue 5, seeds 000, 002 and 004; docs/data_parallel.md).
//
//   comm_bench --transport local:4                                 (threads of this process)
//   mpirun -np 2 build/apps/comm_bench --transport mpi --csv out/comm/mpi2.csv
//   mpirun -np 2 build/apps/comm_bench --transport nccl            (one GPU per rank)
//   comm_bench --transport local --ps-scaling 1,2,4,8               (the server bottleneck)
//   mpirun -np 5 --oversubscribe build/apps/comm_bench --transport mpi --ps-scaling 4
//
// Sweep (the default mode). For every size from --min-bytes to --max-bytes (times --step-factor)
// and every algorithm of --algorithms (ring, hd = halving-doubling, ps = parameter server,
// native = MPI_Allreduce / ncclAllReduce where the transport has one), on every member rank:
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
//           on the wire per allreduce (mean over ranks; the table says when ranks differ), next
//           to the ring's model 2(N-1)K/N (seed 004). native: not counted (the library moves
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
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/algorithms.h"
#include "comm/communicator.h"
#include "comm/local_transport.h"
#include "comm/parameter_server.h"
#include "comm/transport.h"
#include "engine/error.h"
#include "engine/tensor.h"

using namespace kiln;
using namespace kiln::comm;

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string transport = "local:2";
  std::vector<std::string> algorithms{"ring", "hd", "ps", "native"};
  std::string min_bytes = "4K", max_bytes = "256M";
  int step_factor = 2;
  int iters = 20, warmup = 5;
  double max_seconds = 1.0;
  std::string dtype = "f32";
  int ps_servers = 0;
  std::vector<int> ps_scaling;
  std::string ps_bytes = "4M";
  std::string ring_subchunk = "1M";
  std::string csv, json;
  bool append = false;
};

// ---- small helpers -----------------------------------------------------------------------

// "4096", "4K", "4KiB", "256M", "1G" (binary: K = 1024) -> bytes.
size_t parse_bytes(const std::string& flag, const std::string& s) {
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  std::string suffix = s.substr(pos);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  unsigned long long mult = 0;
  if (pos > 0) {
    if (suffix.empty() || suffix == "B") mult = 1;
    else if (suffix == "K" || suffix == "KB" || suffix == "KIB") mult = 1ull << 10;
    else if (suffix == "M" || suffix == "MB" || suffix == "MIB") mult = 1ull << 20;
    else if (suffix == "G" || suffix == "GB" || suffix == "GIB") mult = 1ull << 30;
  }
  if (mult == 0 || v == 0) {
    throw Error(flag + " " + s + ": expected a positive size in bytes, with an optional K, M or "
                "G suffix (powers of 1024), e.g. 4K or 256M", ErrorKind::Usage);
  }
  return static_cast<size_t>(v * mult);
}

std::string human_bytes(double b) {
  char buf[32];
  if (b >= (1 << 30)) std::snprintf(buf, sizeof buf, "%g GiB", b / (1 << 30));
  else if (b >= (1 << 20)) std::snprintf(buf, sizeof buf, "%g MiB", b / (1 << 20));
  else if (b >= (1 << 10)) std::snprintf(buf, sizeof buf, "%g KiB", b / (1 << 10));
  else std::snprintf(buf, sizeof buf, "%g B", b);
  return buf;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// The bytes column: an integer when it is one, else one decimal.
std::string bytes_str(double b) {
  return b == std::floor(b) ? fmt("%.0f", b) : fmt("%.1f", b);
}

ElemType parse_dtype(const std::string& s) {
  if (s == "f32") return ElemType::F32;
  if (s == "f16") return ElemType::F16;
  throw Error("--dtype " + s + ": use f32 or f16", ErrorKind::Usage);
}

// IEEE binary16 for the small integers of the check (|v| <= 2048 is exact), and back.
uint16_t half_from_int(int v) {
  if (v == 0) return 0;
  const uint16_t sign = v < 0 ? 0x8000 : 0;
  unsigned a = static_cast<unsigned>(v < 0 ? -v : v);
  int e = 0;
  while ((a >> e) > 1) ++e;                          // a = 1.f * 2^e
  const unsigned mant = (a << (10 - e)) & 0x3ff;     // exact for e <= 10
  return static_cast<uint16_t>(sign | ((e + 15) << 10) | mant);
}

float half_to_float(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v;
  if (e == 0) v = std::ldexp(static_cast<float>(m), -24);
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = std::ldexp(static_cast<float>(m | 0x400), e - 25);
  return (h & 0x8000) ? -v : v;
}

// The check's value of element i on rank r: an integer in [-5, 5]; the sum over n ranks depends
// on i % 11 only.
int pattern(int64_t i, int r) { return static_cast<int>((i * 3 + r * 5) % 11) - 5; }

// Rank 0 writes the CSV; other ranks hold a closed one.
class CsvOut {
 public:
  void open(const std::string& path, bool append, const std::string& header) {
    if (path.empty()) return;
    std::error_code ec;
    const bool has_header = append && std::filesystem::exists(path, ec) &&
                            std::filesystem::file_size(path, ec) > 0;
    out_.open(path, append ? std::ios::app : std::ios::trunc);
    if (!out_) {
      throw Error("--csv " + path + ": cannot open for writing: check that its directory exists",
                  ErrorKind::Usage);
    }
    if (!has_header) out_ << header << "\n";
  }
  void row(const std::string& line) {
    if (!out_.is_open()) return;
    out_ << line << "\n";
    out_.flush();
  }

 private:
  std::ofstream out_;
};

// What rank 0 collects while the ranks run (the local transport's rank 0 is a thread).
struct Report {
  CsvOut csv;
  nlohmann::json rows = nlohmann::json::array();
  bool all_correct = true;
};

// ---- the collective plumbing the bench itself needs -----------------------------------------

// Every member's `values` (same length on all), concatenated in rank order, on every member.
std::vector<double> allgather(Transport& t, int n, const std::vector<double>& values) {
  const int64_t k = static_cast<int64_t>(values.size());
  Tensor in = Tensor::from_vector(values, {k}, t.device());
  Tensor out = Tensor::zeros({k * n}, DType::F64, t.device());
  ring_allgather(t, n, buffer_of(in, t), buffer_of(out, t));
  return out.to_vector<double>();
}

struct Gathered {
  double max_time = 0, sum_bytes = 0, max_bytes = 0;
  double median_time = 0;  // median over iterations of the slowest rank's iteration time
  bool all_ok = true;
};

// Every member's (time, bytes, ok, per-iteration times...) to every member; `iteration` has
// the same length on every rank.
Gathered gather_stats(Transport& t, int n, double time, double bytes, bool ok,
                      const std::vector<double>& iteration = {}) {
  std::vector<double> mine{time, bytes, ok ? 1.0 : 0.0};
  mine.insert(mine.end(), iteration.begin(), iteration.end());
  const size_t k = mine.size();
  const std::vector<double> all = allgather(t, n, mine);
  Gathered g;
  std::vector<double> slowest(iteration.size(), 0.0);
  for (int r = 0; r < n; ++r) {
    const double* a = &all[k * r];
    g.max_time = std::max(g.max_time, a[0]);
    g.sum_bytes += a[1];
    g.max_bytes = std::max(g.max_bytes, a[1]);
    g.all_ok = g.all_ok && a[2] == 1.0;
    for (size_t i = 0; i < iteration.size(); ++i) slowest[i] = std::max(slowest[i], a[3 + i]);
  }
  if (!slowest.empty()) {
    std::sort(slowest.begin(), slowest.end());
    const size_t m = slowest.size();
    g.median_time = m % 2 ? slowest[m / 2] : 0.5 * (slowest[m / 2 - 1] + slowest[m / 2]);
  }
  return g;
}

// The message buffer of one size, in the transport's device memory.
struct Message {
  Tensor data;  // U8, `bytes` long, on the transport's device
  Buffer buf;
};

Message make_message(const Transport& t, size_t bytes, ElemType type) {
  Message m;
  m.data = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, t.device());
  m.buf.data = m.data.raw_data();
  m.buf.count = static_cast<int64_t>(bytes / elem_size(type));
  m.buf.type = type;
  m.buf.device = t.device();
  return m;
}

// Fills rank r's pattern (check) and returns the host tensor used for it.
void fill_pattern(const Transport& t, Message& m, int rank) {
  const bool on_host = !t.device().is_cuda();
  Tensor host = on_host ? m.data : Tensor::empty({m.data.numel()}, DType::U8);
  const int64_t count = m.buf.count;
  if (m.buf.type == ElemType::F32) {
    float* p = static_cast<float*>(host.raw_data());
    for (int64_t i = 0; i < count; ++i) p[i] = static_cast<float>(pattern(i, rank));
  } else {
    uint16_t* p = static_cast<uint16_t*>(host.raw_data());
    for (int64_t i = 0; i < count; ++i) p[i] = half_from_int(pattern(i, rank));
  }
  if (!on_host) m.data.copy_(host);
}

// True when every element is the sum of the n ranks' patterns; else says where it is not.
bool check_sum(const Transport& t, const Message& m, int n, std::string* what) {
  int expected[11];
  for (int k = 0; k < 11; ++k) {
    expected[k] = 0;
    for (int r = 0; r < n; ++r) expected[k] += pattern(k, r);
  }
  const Tensor host = t.device().is_cuda() ? m.data.to(Device()) : m.data;
  const int64_t count = m.buf.count;
  for (int64_t i = 0; i < count; ++i) {
    const float got = m.buf.type == ElemType::F32
                          ? static_cast<const float*>(host.raw_data())[i]
                          : half_to_float(static_cast<const uint16_t*>(host.raw_data())[i]);
    if (got != static_cast<float>(expected[i % 11])) {
      *what = "element " + std::to_string(i) + " of " + std::to_string(count) + " is " +
              fmt("%g", got) + ", expected " + std::to_string(expected[i % 11]);
      return false;
    }
  }
  return true;
}

// One measured (size, algorithm): check, warm up, time. Runs on every member rank.
struct Measured {
  Gathered g;
  int iters = 0;
  std::string error;  // this rank's check failure, if any
};

Measured measure(Communicator& comm, int n, Message& m, Algorithm alg, const Options& o) {
  Transport& t = comm.transport();
  Measured out;
  // Correctness.
  fill_pattern(t, m, t.rank());
  comm.allreduce_now(m.buf, ReduceOp::Sum, alg);
  const bool ok = check_sum(t, m, n, &out.error);
  m.data.zero_();
  // One untimed allreduce decides how many fit in --max-seconds (the same on every rank: the
  // slowest rank's time, allgathered).
  barrier(t, n);
  auto t0 = Clock::now();
  comm.allreduce_now(m.buf, ReduceOp::Sum, alg);
  const double first = std::chrono::duration<double>(Clock::now() - t0).count();
  const double slowest = gather_stats(t, n, first, 0, true).max_time;
  int iters = o.iters;
  if (slowest * iters > o.max_seconds) {
    iters = std::max(1, static_cast<int>(o.max_seconds / std::max(slowest, 1e-9)));
  }
  const int warm = std::max(0, std::min(o.warmup - 1, iters));
  for (int i = 0; i < warm; ++i) comm.allreduce_now(m.buf, ReduceOp::Sum, alg);
  // Timed.
  barrier(t, n);
  const uint64_t b0 = t.bytes_sent();
  std::vector<double> each(static_cast<size_t>(iters));
  t0 = Clock::now();
  auto prev = t0;
  for (int i = 0; i < iters; ++i) {
    comm.allreduce_now(m.buf, ReduceOp::Sum, alg);
    const auto now = Clock::now();
    each[i] = std::chrono::duration<double>(now - prev).count();
    prev = now;
  }
  const double secs = std::chrono::duration<double>(prev - t0).count();
  const double bytes = static_cast<double>(t.bytes_sent() - b0) / iters;
  out.g = gather_stats(t, n, secs / iters, bytes, ok, each);
  out.iters = iters;
  return out;
}

std::string host_note(const Transport& t) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::string s;
  if (std::string(t.name()) == "local") {
    s = "local: the ranks are threads of this process and a send is a memcpy into the peer's "
        "mailbox, so these times measure memory copies and how " +
        std::to_string(t.size()) + " threads share " + std::to_string(cores) +
        " core(s), not a network";
  } else if (t.local_size() == t.size()) {
    s = std::string(t.name()) + ": all " + std::to_string(t.size()) + " ranks on one host (" +
        t.host() + ", " + std::to_string(cores) + " cores): " +
        (std::string(t.name()) == "mpi" ? "Open MPI moves the bytes through shared memory, so "
                                          "these times measure memory copies, not a network"
                                        : "GPU to GPU inside one machine");
  } else {
    s = std::string(t.name()) + ": " + std::to_string(t.size()) + " ranks, " +
        std::to_string(t.local_size()) + " on this host (" + t.host() + ")";
  }
  if (static_cast<unsigned>(t.local_size()) > cores && !t.device().is_cuda()) {
    s += "; more ranks than cores on this host: ranks wait for a core, times are pessimistic";
  }
  return s;
}

// ---- sweep ---------------------------------------------------------------------------------

struct Row {
  size_t bytes;
  std::string alg;
  double busbw, median_busbw;
  double bytes_per_rank, max_bytes, model;
  bool has_bytes, exact;
};

int sweep_rank(std::shared_ptr<Transport> tp, const Options& o, Report& report) {
  Transport& t = *tp;
  const ElemType type = parse_dtype(o.dtype);
  const int world = t.size();
  const int servers = o.ps_servers;
  const int n = world - servers;  // members of the collectives
  if (n < 1) {
    throw Error("--ps-servers " + std::to_string(servers) + " leaves no worker among " +
                std::to_string(world) + " ranks: use fewer servers or more ranks",
                ErrorKind::Usage);
  }
  const size_t min_b = parse_bytes("--min-bytes", o.min_bytes);
  const size_t max_b = parse_bytes("--max-bytes", o.max_bytes);
  if (min_b > max_b) {
    throw Error("--min-bytes " + o.min_bytes + " is larger than --max-bytes " + o.max_bytes,
                ErrorKind::Usage);
  }
  if (min_b % elem_size(type) != 0) {
    throw Error("--min-bytes " + o.min_bytes + " is not a whole number of " + o.dtype +
                " elements", ErrorKind::Usage);
  }
  AlgorithmOptions aopt;
  aopt.ps_servers = servers;
  aopt.ring_subchunk_bytes = parse_bytes("--ring-subchunk", o.ring_subchunk);

  // Which algorithms run: the same decision on every rank.
  const bool r0 = t.rank() == 0;
  std::vector<Algorithm> algs;
  for (const std::string& name : o.algorithms) {
    const Algorithm a = parse_algorithm(name);
    std::string skip;
    if (a == Algorithm::Native && !t.has_native_allreduce()) {
      skip = std::string("the ") + t.name() + " transport has no library allreduce (use "
             "--transport mpi or nccl)";
    } else if (a == Algorithm::Native && servers > 0) {
      skip = "native runs over every rank; with --ps-servers the last ranks are servers";
    } else if (a == Algorithm::Native && type == ElemType::F16 && std::string(t.name()) == "mpi") {
      skip = "MPI has no 16-bit float type for MPI_Allreduce";
    }
    if (!skip.empty()) {
      if (r0) std::printf("note: %s skipped: %s\n", name.c_str(), skip.c_str());
      continue;
    }
    if (std::find(algs.begin(), algs.end(), a) == algs.end()) algs.push_back(a);
  }

  // Dedicated servers serve until the workers are done.
  if (t.rank() >= n) {
    PsOptions ps;
    ps.workers = n;
    ps.servers = servers;
    serve(t, ps);
    return 0;
  }
  Communicator comm(tp, n, aopt);
  const double bus_factor = n > 1 ? 2.0 * (n - 1) / n : 0.0;
  if (r0) {
    std::printf("comm_bench: allreduce (sum, %s) over %d rank(s)%s, transport %s, %s .. %s, "
                "x%d\n",
                o.dtype.c_str(), n,
                servers > 0
                    ? (" + " + std::to_string(servers) + " dedicated PS server rank(s)").c_str()
                    : "",
                t.name(), human_bytes(static_cast<double>(min_b)).c_str(),
                human_bytes(static_cast<double>(max_b)).c_str(), o.step_factor);
    std::printf("note: %s\n", host_note(t).c_str());
    std::printf("time: mean of up to %d timed allreduces (after up to %d warm-up; fewer past "
                "%.1f s) of the slowest rank; algbw = size / time; busbw = algbw * 2(N-1)/N; "
                "median: of the iterations' slowest-rank times (robust to a busy machine)\n",
                o.iters, o.warmup, o.max_seconds);
    std::printf("bytes/rank: sent per rank per allreduce, measured by the transport (mean over "
                "ranks; '*' = ranks differ); model: the ring's 2(N-1)K/N\n");
    std::printf("%10s %11s %-6s %6s %11s %11s %10s %10s %14s %14s  %s\n", "size", "count",
                "alg", "iters", "time us", "median us", "algbw GB/s", "busbw GB/s", "bytes/rank",
                "2(N-1)K/N", "check");
    std::fflush(stdout);
  }
  std::vector<Row> rows;
  bool ok_all = true;
  for (size_t bytes = min_b; bytes <= max_b;) {
    const size_t size = bytes - bytes % elem_size(type);
    Message m = make_message(t, size, type);
    for (const Algorithm a : algs) {
      const Measured r = measure(comm, n, m, a, o);
      const double time = r.g.max_time;
      const double algbw = static_cast<double>(size) / time / 1e9;
      const double busbw = algbw * bus_factor;
      const double model = n > 1 ? 2.0 * (n - 1) * static_cast<double>(size) / n : 0.0;
      const bool has_bytes = a != Algorithm::Native;
      const double per_rank = r.g.sum_bytes / n;
      // Exact: the total over ranks is 2(N-1)K to the byte (integers, compared exactly).
      const bool exact = has_bytes && r.g.sum_bytes == 2.0 * (n - 1) * static_cast<double>(size);
      ok_all = ok_all && r.g.all_ok;
      if (!r.error.empty()) {
        std::fprintf(stderr, "comm_bench: rank %d: %s allreduce of %s is WRONG: %s\n", t.rank(),
                     algorithm_name(a), human_bytes(static_cast<double>(size)).c_str(),
                     r.error.c_str());
      }
      const double median_busbw = static_cast<double>(size) / r.g.median_time / 1e9 * bus_factor;
      rows.push_back({size, algorithm_name(a), busbw, median_busbw, per_rank, r.g.max_bytes,
                      model, has_bytes, exact});
      if (!r0) continue;
      const bool differ = has_bytes && r.g.max_bytes != per_rank;
      const std::string per_rank_s = has_bytes ? bytes_str(per_rank) + (differ ? "*" : " ") : "-";
      std::printf("%10s %11lld %-6s %6d %11.1f %11.1f %10.3f %10.3f %14s %14s  %s\n",
                  human_bytes(static_cast<double>(size)).c_str(),
                  static_cast<long long>(m.buf.count), algorithm_name(a), r.iters, time * 1e6,
                  r.g.median_time * 1e6, algbw, busbw, per_rank_s.c_str(), bytes_str(model).c_str(),
                  r.g.all_ok ? "ok" : "WRONG");
      std::fflush(stdout);
      report.csv.row(std::string(t.name()) + "," + std::to_string(world) + "," +
                     std::to_string(n) + "," + std::to_string(servers) + "," + algorithm_name(a) +
                     "," + o.dtype + "," + std::to_string(size) + "," +
                     std::to_string(m.buf.count) + "," + std::to_string(r.iters) + "," +
                     fmt("%.3f", time * 1e6) + "," + fmt("%.4f", algbw) + "," +
                     fmt("%.4f", busbw) + "," + (has_bytes ? bytes_str(per_rank) : "") + "," +
                     (has_bytes ? bytes_str(r.g.max_bytes) : "") + "," +
                     (has_bytes ? fmt("%.0f", r.g.sum_bytes) : "") + "," + bytes_str(model) +
                     "," + (r.g.all_ok ? "1" : "0") + "," + fmt("%.3f", r.g.median_time * 1e6));
      report.rows.push_back({{"transport", t.name()}, {"world", world}, {"members", n},
                             {"ps_servers", servers}, {"algorithm", algorithm_name(a)},
                             {"dtype", o.dtype}, {"bytes", size}, {"iters", r.iters},
                             {"time_us", time * 1e6}, {"median_us", r.g.median_time * 1e6},
                             {"algbw_gbs", algbw}, {"busbw_gbs", busbw},
                             {"bytes_per_rank",
                              has_bytes ? nlohmann::json(per_rank) : nlohmann::json()},
                             {"model_bytes_per_rank", model}, {"correct", r.g.all_ok}});
    }
    if (bytes > max_b / static_cast<size_t>(o.step_factor)) break;
    bytes *= static_cast<size_t>(o.step_factor);
  }
  if (servers > 0) {
    PsOptions ps;
    ps.workers = n;
    ps.servers = servers;
    ps_shutdown(t, ps);
  }
  if (r0) {
    // The targets: ring vs native busbw at >= 16 MiB; bytes per rank vs the model.
    std::printf("\nsummary (%d rank(s), %s):\n", n, t.name());
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
      if (a == Algorithm::ParameterServer && servers > 0) {
        // Dedicated servers: a worker pushes K bytes and pulls K; the ring's model is not its.
        std::printf("  %-6s with %d dedicated server(s): a worker sends K bytes (plus the PS "
                    "message headers) per allreduce: measured/K %.4f .. %.4f\n",
                    algorithm_name(a), servers, lo * 2.0 * (n - 1) / n, hi * 2.0 * (n - 1) / n);
        continue;
      }
      // The busiest rank: an algorithm can send 2(N-1)K in total yet load one rank more (hd's
      // folded ranks for a non-power-of-two N; ring chunks of unequal size).
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
    std::fflush(stdout);
  }
  if (!ok_all) {
    if (r0) report.all_correct = false;
    return 1;
  }
  return 0;
}

// ---- PS scaling ------------------------------------------------------------------------------

// One entry of --ps-scaling: W workers (ranks 0..W-1) and one server (rank W).
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
  if (r0 && print_header) {
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
  bool ok_all = true;
  Message m = make_message(t, bytes, type);
  for (const Algorithm a : {Algorithm::Ring, Algorithm::ParameterServer}) {
    const Measured r = measure(comm, w, m, a, o);
    ok_all = ok_all && r.g.all_ok;
    if (!r.error.empty()) {
      std::fprintf(stderr, "comm_bench: rank %d: %s allreduce with %d workers is WRONG: %s\n",
                   t.rank(), algorithm_name(a), w, r.error.c_str());
    }
    if (!r0) continue;
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
  ps_shutdown(t, ps);
  if (!ok_all) {
    if (r0) report.all_correct = false;
    return 1;
  }
  return 0;
}

// ---- main --------------------------------------------------------------------------------

// "local:N" -> N; "local" -> 2; anything else -> 0.
int local_ranks(const std::string& transport) {
  if (transport == "local") return 2;
  if (transport.rfind("local:", 0) != 0) return 0;
  int n = 0;
  try {
    size_t pos = 0;
    n = std::stoi(transport.substr(6), &pos);
    if (pos != transport.size() - 6) n = 0;
  } catch (const std::exception&) {
    n = 0;
  }
  if (n < 1 || n > 64) {
    throw Error("--transport " + transport + ": expected local:N with N in 1..64 threads",
                ErrorKind::Usage);
  }
  return n;
}

int run(const Options& o) {
  // Flags every rank checks the same way before any communication.
  parse_dtype(o.dtype);
  parse_bytes("--min-bytes", o.min_bytes);
  parse_bytes("--max-bytes", o.max_bytes);
  parse_bytes("--ps-bytes", o.ps_bytes);
  parse_bytes("--ring-subchunk", o.ring_subchunk);
  for (const std::string& a : o.algorithms) parse_algorithm(a);
  const bool scaling = !o.ps_scaling.empty();
  const char* csv_header =
      scaling ? "transport,workers,servers,algorithm,dtype,bytes,iters,time_us,worker_bytes_sent,"
                "server_bytes_received,model_worker_bytes,model_server_bytes_received,correct,"
                "median_us"
              : "transport,world,members,ps_servers,algorithm,dtype,bytes,count,iters,time_us,"
                "algbw_gbs,busbw_gbs,bytes_per_rank,bytes_per_rank_max,bytes_total,"
                "model_bytes_per_rank,correct,median_us";
  Report report;
  int rc = 0;
  const int n_local = local_ranks(o.transport);
  std::shared_ptr<Transport> mpi_like;
  if (n_local > 0) {
    report.csv.open(o.csv, o.append, csv_header);
    if (scaling) {
      bool first = true;
      for (const int w : o.ps_scaling) {
        std::vector<int> rcs(w + 1, 0);
        run_local(w + 1, [&](std::shared_ptr<Transport> t) {
          rcs[t->rank()] = ps_scaling_rank(t, o, report, first);
        });
        first = false;
        for (int r : rcs) rc = std::max(rc, r);
      }
    } else {
      std::vector<int> rcs(n_local, 0);
      run_local(n_local, [&](std::shared_ptr<Transport> t) {
        rcs[t->rank()] = sweep_rank(t, o, report);
      });
      for (int r : rcs) rc = std::max(rc, r);
    }
  } else {
    mpi_like = make_transport(o.transport);
    try {
      if (mpi_like->rank() == 0) report.csv.open(o.csv, o.append, csv_header);
      if (scaling) {
        if (o.ps_scaling.size() != 1 || o.ps_scaling[0] != mpi_like->size() - 1) {
          throw Error("--ps-scaling under " + o.transport + ": give one worker count W = ranks "
                      "- 1 = " + std::to_string(mpi_like->size() - 1) + " (run mpirun -np W+1 "
                      "once per W, with --csv FILE --append)", ErrorKind::Usage);
        }
        rc = ps_scaling_rank(mpi_like, o, report, !o.append);
      } else {
        rc = sweep_rank(mpi_like, o, report);
      }
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
  if (r0 && !o.json.empty()) {
    std::ofstream out(o.json);
    KILN_CHECK_INPUT(out.good(), "comm_bench: cannot write --json ", o.json);
    out << nlohmann::json{{"transport", o.transport}, {"dtype", o.dtype},
                          {"results", report.rows}}.dump(2)
        << "\n";
  }
  if (rc != 0) {
    if (r0) std::fprintf(stderr, "comm_bench: an allreduce produced a WRONG result (see above)\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Allreduce benchmark, like nccl-tests: time, algbw, busbw and bytes sent per "
               "rank for ring, halving-doubling, parameter server and the library's own "
               "allreduce, over threads (local:N), MPI or NCCL"};
  Options o;
  app.add_option("--transport", o.transport, "local:N (N ranks as threads of this process) | "
                 "mpi (under mpirun; the default there) | nccl (under mpirun, one GPU per rank)")
      ->capture_default_str();
  app.add_option("--algorithms", o.algorithms, "comma-separated: ring, hd (halving-doubling), "
                 "ps (parameter server), native (MPI_Allreduce / ncclAllReduce; skipped where "
                 "the transport has none)")
      ->delimiter(',')->capture_default_str();
  app.add_option("--min-bytes", o.min_bytes, "smallest message, bytes (K, M, G suffixes: "
                 "powers of 1024)")->capture_default_str();
  app.add_option("--max-bytes", o.max_bytes, "largest message")->capture_default_str();
  app.add_option("--step-factor", o.step_factor, "each size is the previous one times this")
      ->check(CLI::Range(2, 1024))->capture_default_str();
  app.add_option("--iters", o.iters, "timed allreduces per size and algorithm (at most)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed allreduces first (at least 1 always runs)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--max-seconds", o.max_seconds, "time budget of one size and algorithm: "
                 "fewer --iters when one allreduce is slow")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--dtype", o.dtype, "element type on the wire: f32 | f16")
      ->check(CLI::IsMember({"f32", "f16"}))->capture_default_str();
  app.add_option("--ps-servers", o.ps_servers, "ps: 0 = one shard per rank (co-located); S > 0 "
                 "= the last S ranks are dedicated servers (the others run every algorithm)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--ps-scaling", o.ps_scaling, "PS bottleneck mode: worker counts W, "
                 "comma-separated; ring over W ranks vs PS with W workers + 1 server (local: "
                 "W+1 threads each; mpi: one W = ranks - 1)")
      ->delimiter(',')->check(CLI::Range(1, 63));
  app.add_option("--ps-bytes", o.ps_bytes, "--ps-scaling: message size")->capture_default_str();
  app.add_option("--ring-subchunk", o.ring_subchunk, "ring: pipelined sub-chunk size")
      ->capture_default_str();
  app.add_option("--csv", o.csv, "write the rows as CSV here (rank 0)");
  app.add_flag("--append", o.append, "append rows to --csv instead of overwriting it");
  app.add_option("--json", o.json, "also write the rows as JSON here (rank 0)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints --help, or the error and a hint
    return rc == 0 ? 0 : 2;
  }
  // Started by mpirun / srun without --transport: the ranks are MPI processes, not threads.
  if (app.count("--transport") == 0 &&
      (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") ||
       std::getenv("PMIX_RANK"))) {
    o.transport = "mpi";
  }
  try {
    return run(o);
  } catch (const Error& e) {
    std::fprintf(stderr, "comm_bench: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_bench: %s\n", e.what());
    return 1;
  }
}
