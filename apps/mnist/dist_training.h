// dist_training.h: one rank's part in data-parallel training (--dist local:N | mpi | nccl |
// nccl:N).
//
// The ranks of a run are laid out as comm/parameter_server.h says: ranks [0, workers) train a
// replica of the model each; with --allreduce ps --ps-servers S the last S ranks are
// dedicated parameter servers, which hold no model and only run comm::serve (serve_parameters).
//
// A worker rank's DistTraining, built once its model and optimizer exist, owns what talks to
// the other ranks, and hides the three ways a step can go:
//   synchronous (ring, hd, bb, ps, native)  comm::DataParallel averages the gradients in buckets
//                                       while backward runs; every rank applies the same update
//   asynchronous (--ps-async)           comm::AsyncPsWorker pushes the gradient to the servers,
//                                       which apply it, and pulls the current parameters
// It also sums each epoch's loss and accuracy over the workers, and at the end checks that
// every replica ended with rank 0's weights, bit for bit.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "apps/mnist/options.h"
#include "apps/mnist/train_loop.h"
#include "comm/communicator.h"
#include "comm/data_parallel.h"
#include "comm/parameter_server.h"
#include "comm/transport.h"
#include "engine/optim/grad_scaler.h"
#include "engine/optim/optimizer.h"
#include "layers/module.h"

namespace CLI {
class App;
}

namespace kiln::apps::mnist {

// Who this rank is in the run (--dist none: rank 0 of 1, a worker).
struct RankLayout {
  bool dist = false;  // false: --dist none, no transport
  int world = 1;      // ranks in the run
  int rank = 0;
  int workers = 1;    // ranks [0, workers) train a replica
  int servers = 0;    // ranks [workers, world) are dedicated parameter servers
  bool is_server() const { return rank >= workers; }
};

// t null: --dist none.
RankLayout rank_layout(const Options& o, const comm::Transport* t);

// This rank's share of the host: unless given, --threads becomes the host's threads divided by
// the ranks on it, and --workers 0 when those ranks already fill every core (CPU training).
void share_host_between_ranks(Options& o, const CLI::App& app, const comm::Transport& t);

// The whole life of a dedicated parameter-server rank: serves until every worker is done.
void serve_parameters(const Options& o, const RankLayout& ranks, comm::Transport& t);

// Rank r > 0 draws its dropout masks from its own Philox key, so the ranks' masks are
// independent; rank 0 keeps the seed's stream (the same masks as a 1-rank run). Call after
// the model's initialisation (which every rank draws from the seed's stream).
void use_rank_dropout_stream(uint64_t seed, int rank);

// Gradient communication of one rank, for the summary (zeros for --dist none).
struct CommSummary {
  double comm_seconds = 0;      // allreduces' time on the communicator's thread (async: push_pull)
  double exposed_seconds = 0;   // of which backward did not hide (async: all of it)
  double overlap_fraction = 0;  // 1 - exposed / comm (async: 0)
  uint64_t bytes_sent = 0;      // bytes this rank sent (async: pushes, pulls and the rest)
  int buckets = 0;              // DataParallel's fusion buckets (async: 0)
};

class DistTraining {
 public:
  // Joins the workers' communicator and makes the replicas equal: DataParallel broadcasts rank
  // 0's parameters and buffers; the asynchronous worker 0 sends its parameters through the
  // servers. Every worker rank constructs it at the same point (it communicates).
  DistTraining(const Options& o, std::shared_ptr<comm::Transport> t, const RankLayout& ranks,
               Module& model);
  DistTraining(const DistTraining&) = delete;
  DistTraining& operator=(const DistTraining&) = delete;

  // Backward, the gradient exchange and the update, once the loss is computed. `ids`: what the
  // step's trace spans belong to.
  // With a scaler (fp16): backward of the scaled loss, and after the averaging the unscaled
  // gradients' inf/NaN check, agreed over the ranks, decides whether the step runs.
  void step(Tensor& loss, Optimizer& opt, const trace::Ids& ids, GradScaler* scaler = nullptr);

  // The epoch's training loss, examples (train_seen) and images/s over all workers (after
  // train_epoch).
  void sum_training_over_workers(EpochResult& r);
  // A mid-epoch checkpoint's loss sum and example count over all workers (every worker calls it
  // at the same step; the sums of a resumed epoch sit on rank 0 alone, so they add up).
  void sum_progress_over_workers(EpochProgress& p);
  // The test accuracy and loss over all workers' shards of `shard_examples` each (after evaluate).
  void sum_evaluation_over_workers(EpochResult& r, int64_t shard_examples);

  // The end of training: the asynchronous workers pull the final parameters, the synchronous
  // servers are released; then every worker compares its weights with rank 0's and prints
  // whether they are equal. Returns true when every worker's are.
  bool finish_and_compare_replicas();

  CommSummary comm_summary() const;

 private:
  void release_servers();
  bool compare_with_rank0();

  bool quiet_;
  comm::PsOptions ps_options_;
  std::shared_ptr<comm::Transport> t_;
  RankLayout ranks_;
  Module& model_;
  std::vector<Tensor> params_;
  std::shared_ptr<comm::Communicator> communicator_;
  std::unique_ptr<comm::DataParallel> dp_;    // synchronous
  std::unique_ptr<comm::AsyncPsWorker> ps_;   // asynchronous
  std::vector<float> ps_params_;  // async: the flat parameter vector pulled from the servers
  double ps_seconds_ = 0;         // async: time in push_pull
};

}  // namespace kiln::apps::mnist
