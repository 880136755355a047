// dist_flags.cpp: see dist_flags.h.
#include "apps/mnist/dist_flags.h"

#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "engine/error.h"
#include "engine/impl.h"

namespace kiln::apps::mnist {

DistSpec parse_dist(const std::string& s) {
  DistSpec d;
  if (s == "none" || s == "mpi" || s == "nccl") {
    d.kind = s;
    return d;
  }
  for (const std::string kind : {"local", "nccl"}) {
    if (s.rfind(kind + ":", 0) != 0) continue;
    const std::string n = s.substr(kind.size() + 1);
    char* end = nullptr;
    const long v = std::strtol(n.c_str(), &end, 10);
    if (!n.empty() && *end == '\0' && v >= 1 && v <= 64) {
      d.kind = kind;
      d.ranks = static_cast<int>(v);
      d.threads = true;
      return d;
    }
  }
  throw Error("--dist " + s + ": use none, local:N (N = 1..64 ranks as threads), mpi (launch "
              "with mpirun -np N), nccl (one rank per GPU, under mpirun) or nccl:N (N ranks as "
              "threads on cuda:0..N-1)", ErrorKind::Usage);
}

void check_dist_flags(const Options& o, const CLI::App& app, const DistSpec& d) {
  const bool ps = o.allreduce == "ps";
  if (o.ps_async && !(ps && o.ps_servers >= 1)) {
    throw Error("--ps-async needs --allreduce ps and --ps-servers >= 1 (dedicated server ranks "
                "that hold the parameters), e.g. --dist local:3 --allreduce ps --ps-servers 1 "
                "--ps-async", ErrorKind::Usage);
  }
  if (o.ps_servers > 0 && !ps) {
    throw Error("--ps-servers " + std::to_string(o.ps_servers) + " needs --allreduce ps",
                ErrorKind::Usage);
  }
  if (app.count("--ps-staleness") > 0 && !o.ps_async) {
    throw Error("--ps-staleness applies to the asynchronous parameter server: add --ps-async",
                ErrorKind::Usage);
  }
  if (o.warmup_epochs >= 0 && !o.batch_per_rank) {
    throw Error("--warmup-epochs belongs to the large-minibatch recipe: add --batch-per-rank "
                "(or drop --warmup-epochs)", ErrorKind::Usage);
  }
  if (o.allreduce == "native" && (d.kind == "local" || d.kind == "none")) {
    throw Error("--allreduce native is MPI_Allreduce / ncclAllReduce: use it with --dist mpi or "
                "nccl; local ranks use ring, hd, bb or ps", ErrorKind::Usage);
  }
  if (o.precision == "fp16" && o.allreduce == "ps") {
    throw Error("--precision fp16 skips the steps whose gradients overflow, and every rank must "
                "skip the same ones; the parameter server applies each push as it comes: use "
                "--precision bf16 (no loss scaling) or another --allreduce", ErrorKind::Usage);
  }
  if (o.fp16_allreduce && o.bf16_allreduce) {
    throw Error("--fp16-allreduce and --bf16-allreduce each choose how gradients travel: give "
                "one of them (bf16 keeps f32's range, f16 keeps 3 more bits of precision)",
                ErrorKind::Usage);
  }
  const char* compression = o.fp16_allreduce   ? "--fp16-allreduce"
                            : o.bf16_allreduce ? "--bf16-allreduce"
                                               : nullptr;
  if (compression && o.ps_async) {
    throw Error(std::string(compression) + " compresses allreduced gradients; the asynchronous "
                "parameter server pushes f32: drop one of the two", ErrorKind::Usage);
  }
  if (compression && d.kind == "nccl") {
    throw Error(std::string(compression) + " is implemented for host transports (local, mpi), "
                "not nccl: drop it with --dist " + o.dist, ErrorKind::Usage);
  }
  if (o.ps_async && (!o.checkpoint.empty() || !o.resume.empty())) {
    throw Error("--checkpoint/--resume with --ps-async: the optimizer state lives on the server "
                "ranks and is not saved; train synchronously (drop --ps-async) to checkpoint",
                ErrorKind::Usage);
  }
  if (d.kind == "none" && (o.ps_servers > 0 || app.count("--allreduce") > 0 ||
                           compression || app.count("--bucket-mb") > 0)) {
    throw Error("--allreduce, --ps-*, --bucket-mb and --fp16-allreduce / --bf16-allreduce need "
                "several ranks: add --dist local:N, mpi or nccl", ErrorKind::Usage);
  }
}

void check_world(const Options& o, int world) {
  const int servers = o.allreduce == "ps" ? o.ps_servers : 0;
  if (servers >= world) {
    throw Error("--ps-servers " + std::to_string(servers) + " leaves no worker among " +
                std::to_string(world) + " ranks: use more ranks or fewer servers",
                ErrorKind::Usage);
  }
  const int workers = world - servers;
  if (!o.batch_per_rank && o.batch_size % workers != 0) {
    throw Error("--batch-size " + std::to_string(o.batch_size) + " is the global batch and must "
                "split evenly over the " + std::to_string(workers) + " worker ranks: use a "
                "multiple of " + std::to_string(workers) + ", or --batch-per-rank",
                ErrorKind::Usage);
  }
}

}  // namespace kiln::apps::mnist
