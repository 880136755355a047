// options.cpp: see options.h.
#include "apps/comm_bench/options.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <exception>
#include <limits>

#include "apps/common/flag_checks.h"
#include "apps/common/output_paths.h"
#include "comm/communicator.h"
#include "engine/error.h"

namespace kiln::apps::comm_bench {

using comm::ElemType;

void add_flags(CLI::App& app, Options& o) {
  app.add_option("--dist", o.transport, "local:N (N ranks as threads of this process) | "
                 "mpi (under mpirun; the default there) | nccl (under mpirun, one GPU per rank)")
      ->capture_default_str();
  app.add_option("--allreduce", o.algorithms, "the algorithms to time, comma-separated: ring, hd (halving-doubling), "
                 "bb (binary blocks), ps (parameter server), native (MPI_Allreduce / ncclAllReduce; skipped where "
                 "the transport has none)")
      ->delimiter(',')->capture_default_str();
  app.add_option("--min-bytes", o.min_bytes, "smallest message, bytes (K, M, G suffixes: "
                 "powers of 1024)")->capture_default_str();
  app.add_option("--max-bytes", o.max_bytes, "largest message")->capture_default_str();
  app.add_option("--step-factor", o.step_factor, "each size is the previous one times this")
      ->check(apps::in_range(2, 1024))->capture_default_str();
  app.add_option("--iters", o.iters, "timed allreduces per size and algorithm (at most)")
      ->check(apps::at_least(1))->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed allreduces first (at least 1 always runs)")
      ->check(apps::at_least(0))->capture_default_str();
  app.add_option("--max-seconds", o.max_seconds, "time budget of one size and algorithm: "
                 "fewer --iters when one allreduce is slow")
      ->check(apps::above(0.0))->capture_default_str();
  app.add_option("--dtype", o.dtype, "element type on the wire: fp32 | fp16 | bf16")
      ->check(apps::one_of({"fp32", "fp16", "bf16"}))->capture_default_str();
  app.add_option("--ps-servers", o.ps_servers, "ps: 0 = one shard per rank (co-located); S > 0 "
                 "= the last S ranks are dedicated servers (the others run every algorithm)")
      ->check(apps::at_least(0))->capture_default_str();
  app.add_option("--ps-scaling", o.ps_scaling, "PS bottleneck mode: worker counts W, "
                 "comma-separated; ring over W ranks vs PS with W workers + 1 server (local: "
                 "W+1 threads each; mpi: one W = ranks - 1)")
      ->delimiter(',')->check(apps::in_range(1, 63));
  app.add_option("--ps-bytes", o.ps_bytes, "--ps-scaling: message size")->capture_default_str();
  app.add_option("--ring-subchunk", o.ring_subchunk, "ring: pipelined sub-chunk size")
      ->capture_default_str();
  app.add_option("--csv", o.csv, "write the rows as CSV here (rank 0)");
  app.add_flag("--append", o.append, "append rows to --csv instead of overwriting it");
  app.add_option("--json", o.json, "also write the rows as JSON here (rank 0)");
}

size_t parse_bytes(const std::string& flag, const std::string& s) {
  size_t pos = 0;
  unsigned long long v = 0;
  // Digits first: stoull would also take a sign ("-4K" wrapping to 2^64 - 4) or spaces.
  if (!s.empty() && std::isdigit(static_cast<unsigned char>(s[0]))) {
    try {
      v = std::stoull(s, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
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
  if (v > std::numeric_limits<int64_t>::max() / mult) {
    throw Error(flag + " " + s + ": more bytes than any buffer can hold: use a size like 4K or "
                "256M", ErrorKind::Input);
  }
  return static_cast<size_t>(v * mult);
}

ElemType parse_dtype(const std::string& s) {
  if (s == "fp32") return ElemType::F32;
  if (s == "fp16") return ElemType::F16;
  if (s == "bf16") return ElemType::BF16;
  throw Error("--dtype " + s + ": use fp32, fp16 or bf16", ErrorKind::Usage);
}

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
    throw Error("--dist " + transport + ": expected local:N with N in 1..64 threads",
                ErrorKind::Usage);
  }
  return n;
}

void check_flags(const Options& o) {
  parse_dtype(o.dtype);
  parse_bytes("--min-bytes", o.min_bytes);
  parse_bytes("--max-bytes", o.max_bytes);
  parse_bytes("--ps-bytes", o.ps_bytes);
  parse_bytes("--ring-subchunk", o.ring_subchunk);
  for (const std::string& a : o.algorithms) comm::parse_algorithm(a);
  if (o.append && o.csv.empty()) {
    throw Error("--append adds rows to the --csv file: give --csv FILE, or drop --append",
                ErrorKind::Usage);
  }
  if (!o.ps_scaling.empty() && o.ps_servers > 0) {
    throw Error("--ps-servers " + std::to_string(o.ps_servers) + " sets the servers of the "
                "sweep; --ps-scaling always runs one dedicated server: drop --ps-servers",
                ErrorKind::Usage);
  }
  check_messages_fit(o);
  // Rank 0 writes them; every rank checks them alike, so every rank gives the same verdict.
  check_output_paths({{"--csv", o.csv}, {"--json", o.json}});
}

void check_messages_fit(const Options& o) {
  // Local ranks are threads of this process: each holds its own message.
  if (o.ps_scaling.empty()) {
    const int ranks_here = std::max(local_ranks(o.transport), 1);
    apps::check_fits_in_memory("--max-bytes", o.max_bytes,
                               static_cast<double>(parse_bytes("--max-bytes", o.max_bytes)) *
                                   ranks_here,
                               "a message on each of the " + std::to_string(ranks_here) +
                                   " ranks of this process");
    return;
  }
  const int most = *std::max_element(o.ps_scaling.begin(), o.ps_scaling.end());
  const int ranks_here = local_ranks(o.transport) > 0 ? most + 1 : 1;
  apps::check_fits_in_memory("--ps-bytes", o.ps_bytes,
                             static_cast<double>(parse_bytes("--ps-bytes", o.ps_bytes)) *
                                 ranks_here,
                             "a message on each of the " + std::to_string(ranks_here) +
                                 " ranks of this process");
}

}  // namespace kiln::apps::comm_bench
