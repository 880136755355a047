// dist_training.cpp: see dist_training.h.
#include "apps/mnist/dist_training.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <utility>

#include "apps/common/progress.h"
#include "apps/mnist/model_state.h"
#include "comm/agreement.h"
#include "engine/parallel.h"
#include "engine/philox.h"
#include "engine/trace.h"

namespace kiln::apps::mnist {

namespace {

comm::PsOptions ps_options(const Options& o, const RankLayout& ranks) {
  comm::PsOptions po;
  po.workers = ranks.workers;
  po.servers = ranks.servers;
  po.async = o.ps_async;
  po.staleness = o.ps_staleness;
  return po;
}

uint64_t rank_stream_key(uint64_t seed, int rank) {
  return seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank));
}

std::vector<Tensor> grads_or_zeros(const std::vector<Tensor>& params) {
  std::vector<Tensor> g;
  for (const Tensor& p : params) {
    g.push_back(p.grad().defined() ? p.grad() : Tensor::zeros(p.shape(), p.dtype(), p.device()));
  }
  return g;
}

}  // namespace

RankLayout rank_layout(const Options& o, const comm::Transport* t) {
  RankLayout l;
  l.dist = t != nullptr;
  l.world = l.dist ? t->size() : 1;
  l.rank = l.dist ? t->rank() : 0;
  const comm::Algorithm alg = comm::parse_algorithm(o.allreduce);
  l.servers = alg == comm::Algorithm::ParameterServer ? o.ps_servers : 0;
  l.workers = l.world - l.servers;
  return l;
}

void share_host_between_ranks(Options& o, const CLI::App& app, const comm::Transport& t) {
  if (app.count("--threads") == 0) {
    o.threads = std::max(1, hardware_threads() / std::max(1, t.local_size()));
  }
  // When this host's ranks already keep every core busy, a loader thread per rank only
  // competes with them: build batches in the training loop instead (an MNIST IDX batch is a
  // memcpy; the speeds with and without: docs/data_parallel.md, "Threads").
  if (app.count("--workers") == 0 && !t.device().is_cuda() &&
      o.threads * t.local_size() >= hardware_threads()) {
    o.workers = 0;
  }
}

void serve_parameters(const Options& o, const RankLayout& ranks, comm::Transport& t) {
  const comm::PsOptions po = ps_options(o, ranks);
  if (o.ps_async) {  // the servers apply the updates: each needs the optimizer
    comm::serve(t, po, [&o](std::vector<Tensor> p) { return make_optimizer(o, p); });
  } else {
    comm::serve(t, po);
  }
}

void use_rank_dropout_stream(uint64_t seed, int rank) {
  if (rank > 0) {
    default_generator().set_state(rank_stream_key(seed, rank), default_generator().offset());
  }
}

DistTraining::DistTraining(const Options& o, std::shared_ptr<comm::Transport> t,
                           const RankLayout& ranks, Module& model)
    : quiet_(o.quiet),
      ps_options_(ps_options(o, ranks)),
      t_(std::move(t)),
      ranks_(ranks),
      model_(model),
      params_(model.parameters()) {
  comm::AlgorithmOptions ao;
  ao.ps_servers = ranks.servers;
  communicator_ = std::make_shared<comm::Communicator>(t_, ranks.workers, ao);
  if (o.ps_async) {
    ps_params_ = comm::flatten_to_host(params_);
    ps_ = std::make_unique<comm::AsyncPsWorker>(*t_, ps_options_,
                                                static_cast<int64_t>(ps_params_.size()));
    ps_->init(ps_params_.data());  // worker 0's parameters, through the servers
    comm::unflatten_from_host(ps_params_, params_);
  } else {
    comm::DataParallelOptions dpo;
    dpo.bucket_bytes = static_cast<size_t>(o.bucket_mb * 1024 * 1024);
    dpo.algorithm = comm::parse_algorithm(o.allreduce);
    dpo.wire = o.fp16_allreduce   ? comm::WireFormat::F16
               : o.bf16_allreduce ? comm::WireFormat::BF16
                                  : comm::WireFormat::Uncompressed;
    dpo.grad_as_bucket_view = !o.no_bucket_view;
    std::vector<Tensor> buffers;
    for (auto& [name, b] : model.named_buffers()) buffers.push_back(b);
    dp_ = std::make_unique<comm::DataParallel>(communicator_, params_, buffers, dpo);
  }
}

void DistTraining::step(Tensor& loss, Optimizer& opt, const trace::Ids& ids,
                        GradScaler* scaler) {
  const Device device = params_.front().device();
  if (ps_) {  // the servers' optimizers apply the gradient: this rank only pulls the result
    model_.zero_grad();
    {
      trace::Scope backward("backward", trace::Phase::Backward, device, ids);
      loss.backward();
    }
    const std::vector<float> g = comm::flatten_to_host(grads_or_zeros(params_));
    const auto start = Clock::now();
    {
      trace::Scope exchange("push_pull", trace::Phase::Allreduce, host_side(device), ids);
      ps_->push_pull(g.data(), ps_params_.data(), opt.lr());
    }
    ps_seconds_ += seconds_since(start);
    comm::unflatten_from_host(ps_params_, params_);
    return;
  }
  opt.zero_grad();
  {
    trace::Scope backward("backward", trace::Phase::Backward, device, ids);
    // DataParallel's hooks start bucket allreduces from here.
    if (scaler) scaler->scale(loss).backward();
    else loss.backward();
  }
  {
    // The allreduce time backward did not hide (the buckets run on the communicator's thread).
    trace::Scope wait("allreduce wait", trace::Phase::Allreduce, host_side(device), ids);
    dp_->synchronize();
  }
  trace::Scope update("optimizer", trace::Phase::Optimizer, device, ids);
  if (scaler) {
    const bool found_inf = comm::any_rank(*communicator_, scaler->unscale_(params_));
    if (!scaler->update(found_inf)) return;  // every rank skips this step
  }
  opt.step();
}

void DistTraining::sum_training_over_workers(EpochResult& r) {
  Tensor sums = Tensor::from_vector<double>(
      {r.train_loss * static_cast<double>(r.train_seen), static_cast<double>(r.train_seen),
       static_cast<double>(r.trained_now)},
      {3}, t_->device());
  communicator_->allreduce(sums, comm::ReduceOp::Sum, comm::Algorithm::Ring);
  const std::vector<double> v = sums.to_vector<double>();
  r.train_loss = v[1] > 0 ? v[0] / v[1] : 0.0;
  r.train_seen = static_cast<int64_t>(v[1]);
  r.images_per_sec = r.train_seconds > 0 ? v[2] / r.train_seconds : 0.0;
}

void DistTraining::sum_progress_over_workers(EpochProgress& p) {
  // Doubles hold the counts exactly (they stay far below 2^53).
  Tensor sums = Tensor::from_vector<double>({p.loss_sum, static_cast<double>(p.seen)}, {2},
                                            t_->device());
  communicator_->allreduce(sums, comm::ReduceOp::Sum, comm::Algorithm::Ring);
  const std::vector<double> v = sums.to_vector<double>();
  p.loss_sum = v[0];
  p.seen = static_cast<int64_t>(v[1]);
}

void DistTraining::sum_evaluation_over_workers(EpochResult& r, int64_t shard_examples) {
  const double n = static_cast<double>(shard_examples);
  Tensor sums = Tensor::from_vector<double>(
      {r.test_accuracy * n, r.test_loss * n, n}, {3}, t_->device());
  communicator_->allreduce(sums, comm::ReduceOp::Sum, comm::Algorithm::Ring);
  const std::vector<double> v = sums.to_vector<double>();
  r.test_accuracy = v[2] > 0 ? v[0] / v[2] : 0.0;
  r.test_loss = v[2] > 0 ? v[1] / v[2] : 0.0;
}

bool DistTraining::finish_and_compare_replicas() {
  release_servers();
  return compare_with_rank0();
}

// The asynchronous workers pull the final parameters once every worker's last gradient is in
// (a pull = a zero gradient at learning rate 0, which leaves every optimizer's parameters
// unchanged); the synchronous servers are released.
void DistTraining::release_servers() {
  if (ps_) {
    communicator_->barrier();
    std::vector<float> zeros(ps_params_.size(), 0.0f);
    ps_->push_pull(zeros.data(), ps_params_.data(), 0.0);
    comm::unflatten_from_host(ps_params_, params_);
    ps_->finish();
  } else if (ranks_.servers > 0) {
    comm::ps_shutdown(*t_, ps_options_);
  }
}

// Rank 0's parameters and buffers, broadcast, against this rank's, bit for bit; one line per
// rank; then an allreduce so that every worker knows whether any replica differs.
bool DistTraining::compare_with_rank0() {
  std::vector<Tensor> state = params_;
  for (auto& [name, b] : model_.named_buffers()) state.push_back(b);
  const std::vector<float> mine = comm::flatten_to_host(state);
  Tensor root =
      Tensor::from_vector<float>(mine, {static_cast<int64_t>(mine.size())}, t_->device());
  communicator_->broadcast(root, 0);
  const std::vector<float> theirs = root.to_vector<float>();
  int64_t differ = 0;
  double max_diff = 0;
  for (size_t i = 0; i < mine.size(); ++i) {
    if (std::memcmp(&mine[i], &theirs[i], sizeof(float)) != 0) {
      ++differ;
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(mine[i]) - theirs[i]));
    }
  }
  Tensor bad = Tensor::from_vector<double>({differ > 0 ? 1.0 : 0.0}, {1}, t_->device());
  communicator_->allreduce(bad, comm::ReduceOp::Sum, comm::Algorithm::Ring);
  const bool replicas_equal = bad.to_vector<double>()[0] == 0;
  if (differ == 0) {
    if (!quiet_) std::printf("rank %d: weights equal rank 0's\n", ranks_.rank);
  } else {
    std::printf("rank %d: weights DIFFER from rank 0's in %lld of %zu values (max |diff| %g)\n",
                ranks_.rank, static_cast<long long>(differ), mine.size(), max_diff);
  }
  std::fflush(stdout);
  return replicas_equal;
}

CommSummary DistTraining::comm_summary() const {
  CommSummary s;
  if (dp_) {
    const comm::DataParallelStats& st = dp_->stats();
    s.comm_seconds = st.comm_seconds;
    s.exposed_seconds = st.exposed_seconds;
    s.overlap_fraction = st.overlap_fraction();
    s.bytes_sent = st.bytes_sent;
    s.buckets = dp_->num_buckets();
  } else {
    s.comm_seconds = s.exposed_seconds = ps_seconds_;
    s.bytes_sent = t_->bytes_sent();
  }
  return s;
}

}  // namespace kiln::apps::mnist
