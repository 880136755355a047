// dist_flags.h: reading and checking mnist_train's data-parallel flags before anything starts.
//
//   --dist none | local:N | mpi | nccl | nccl:N   how many ranks, and how they talk (DistSpec)
//   --allreduce, --ps-*, --bucket-mb, --fp16-allreduce, --bf16-allreduce, --no-bucket-view,
//   --batch-per-rank, --warmup-epochs
//
// Every check here is a Usage error (exit 2) whose message says which flag to add or drop.
// Most checks need the flags only (check_dist_flags); those that need the number of ranks run
// once it is known (check_world): at once for local:N and nccl:N, after MPI started for mpi and
// nccl.
#pragma once

#include <string>
#include <vector>

#include "apps/mnist/options.h"

namespace CLI {
class App;
}

namespace kiln::apps::mnist {

struct DistSpec {
  std::string kind = "none";  // none | local | mpi | nccl
  int ranks = 1;              // local:N, nccl:N
  // local:N and nccl:N: the ranks are threads of this process (nccl:N: rank r on cuda:r);
  // mpi and nccl: one rank per process, under mpirun.
  bool threads = false;
};

// "none", "mpi", "nccl", "local:N" or "nccl:N" with N = 1..64; anything else is a Usage error.
DistSpec parse_dist(const std::string& s);

// Flag combinations that make no sense whatever the number of ranks.
void check_dist_flags(const Options& o, const CLI::App& app, const DistSpec& d);

// Checks that need the world size (known at once for local:N, after MPI started for mpi).
void check_world(const Options& o, int world);

}  // namespace kiln::apps::mnist
