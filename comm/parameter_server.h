// parameter_server.h: parameters (or gradients) held by server ranks, pushed and pulled by
// workers: the architecture of DistBelief (Dean et al., 2012), where the server is the bottleneck.
//
// Layout: ranks [0, W) are workers, ranks [W, W + S) are servers (dedicated). The flat
// parameter vector of `count` elements is cut into S contiguous shards; server s owns shard s.
//
// Synchronous (ps_allreduce in comm/algorithms.h, or with S = 0 one shard per worker):
//   every worker pushes each shard's gradient to its server; the server waits for all W,
//   sums, and returns the sum to every worker. Same result as an allreduce.
// Asynchronous (AsyncPsWorker + serve() with options.async): the server holds the parameters
//   and applies each worker's gradient as soon as it arrives with its own optimizer; a worker
//   then pulls the current parameters and goes on, without a global barrier. Bounded
//   staleness (stale synchronous parallel): a worker that is more than `staleness` steps ahead
//   of the slowest worker waits for its pull. staleness 0 is lock-step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/transport.h"
#include "engine/optim/optimizer.h"

namespace kiln::comm {

struct PsOptions {
  int workers = 1;    // W: ranks [0, W)
  int servers = 1;    // S: ranks [W, W + S)
  bool async = false;
  int staleness = 2;  // async only
};

// Builds the optimizer a server applies to its shard (async mode), e.g.
//   [](std::vector<Tensor> p) { return std::make_unique<SGD>(p, 0.01); }
using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor> params)>;

// The server's main loop. Runs on ranks [W, W + S) until every worker called finish()
// (AsyncPsWorker) or ps_shutdown(). Synchronous mode needs no factory.
void serve(Transport& t, const PsOptions& options, const OptimizerFactory& make_optimizer = {});

// Tells the servers that this worker is done (synchronous mode; every worker calls it once).
void ps_shutdown(Transport& t, const PsOptions& options);

// The worker side of the asynchronous parameter server.
class AsyncPsWorker {
 public:
  // count: elements of the flat f32 parameter vector.
  AsyncPsWorker(Transport& t, PsOptions options, int64_t count);
  ~AsyncPsWorker();  // calls finish() if it was not called
  // Worker 0 sends the initial parameters; the others receive them (a broadcast through the
  // servers). Every worker calls it once before the first push_pull.
  void init(float* params);
  // Sends this step's gradient with the learning rate the server's optimizer should use,
  // then receives the parameters after the server applied it (waiting while this worker is
  // more than `staleness` steps ahead of the slowest).
  void push_pull(const float* grad, float* params, double lr);
  void finish();
  // Largest clock difference this worker saw between itself and the slowest worker.
  int max_staleness_seen() const { return max_staleness_seen_; }

 private:
  Transport& t_;
  PsOptions options_;
  int64_t count_;
  int64_t step_ = 0;
  bool finished_ = false;
  int max_staleness_seen_ = 0;
};

}  // namespace kiln::comm
