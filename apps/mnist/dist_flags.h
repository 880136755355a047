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

#include "apps/common/train_checkpoint.h"
#include "apps/mnist/options.h"
#include "comm/agreement.h"
#include "data/dataset.h"
#include "layers/module.h"

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

// What every rank of a run must share (comm/agreement.h), as the flags' final values: after
// --recipe, the optimizer's default --lr and the seed a --resume checkpoint gives. Flags that
// may differ per host (--device, --threads, --workers, --data, output paths) are left out; the
// data a rank reads is compared by its size instead (worker_settings).
std::vector<comm::Setting> flags_every_rank_shares(const Options& o,
                                                   const apps::TrainCheckpoint& resumed);

// What the worker ranks must also share once their model and data exist: the model's
// parameters (count and shapes: another build of Kiln could define another model) and the
// sizes of the training and test sets (ranks that shard sets of other sizes take other
// numbers of steps, and the ranks with more steps would wait forever).
std::vector<comm::Setting> worker_settings(const Module& model, const Dataset& train,
                                           const Dataset& test);


}  // namespace kiln::apps::mnist
