// rank_settings.cpp: see rank_settings.h.
#include "apps/mnist/rank_settings.h"

#include <cstdint>
#include <cstdio>
#include <string>

#include "apps/mnist/flags.h"
#include "engine/impl.h"

namespace kiln::apps::mnist {

namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string yes_no(bool b) { return b ? "yes" : "no"; }

}  // namespace

std::vector<comm::Setting> flags_every_rank_shares(const Options& o,
                                                   const apps::TrainCheckpoint& resumed) {
  const std::string resume_point =
      o.resume.empty() ? "none"
                       : "epoch " + std::to_string(resumed.epoch) + ", example " +
                             std::to_string(resumed.epoch_position) + ", step " +
                             std::to_string(resumed.global_step);
  return {
      {"--dist", o.dist},
      {"--model", o.model},
      {"--optimizer", o.optimizer},
      {"--lr", number(o.lr)},
      {"--recipe", o.recipe},
      {"--lr-schedule", o.lr_schedule},
      {"--gamma", number(o.gamma)},
      {"--pct-start", number(o.pct_start)},
      {"--div-factor", number(o.div_factor)},
      {"--final-div-factor", number(o.final_div_factor)},
      {"--anneal", o.anneal},
      {"--base-lr", number(o.base_lr)},
      {"--half-cycle-epochs", number(o.half_cycle_epochs)},
      {"--cyclic-mode", o.cyclic_mode},
      {"--epochs", std::to_string(o.epochs)},
      {"--batch-size", std::to_string(o.batch_size)},
      {"--batch-per-rank", yes_no(o.batch_per_rank)},
      {"--warmup-epochs", number(o.warmup_epochs)},
      {"--eval-batch-size", std::to_string(o.eval_batch_size)},
      {"--precision", o.precision},
      {"--memory-format", o.memory_format},
      {"--activations", activations_of(o)},
      {"--seed", std::to_string(o.seed)},
      {"--kernels", impl_name(default_impl())},
      {"--allreduce", o.allreduce},
      {"--ps-servers", std::to_string(o.ps_servers)},
      {"--ps-async", yes_no(o.ps_async)},
      {"--ps-staleness", std::to_string(o.ps_staleness)},
      {"--bucket-mb", number(o.bucket_mb)},
      {"--fp16-allreduce", yes_no(o.fp16_allreduce)},
      {"--bf16-allreduce", yes_no(o.bf16_allreduce)},
      {"--no-bucket-view", yes_no(o.no_bucket_view)},
      {"--format", o.format},
      {"--limit-train", std::to_string(o.limit_train)},
      {"--limit-test", std::to_string(o.limit_test)},
      // Mid-epoch checkpoints sum progress over the workers (a collective) at their steps.
      {"--checkpoint", o.checkpoint.empty() ? "not given" : "given"},
      {"--checkpoint-every", std::to_string(o.checkpoint_every)},
      {"--resume", resume_point},
  };
}

std::vector<comm::Setting> worker_settings(const Module& model, const Dataset& train,
                                           const Dataset& test) {
  int64_t count = 0;
  std::string shapes;
  const std::vector<Tensor> params = model.parameters();
  for (const Tensor& p : params) {
    count += p.numel();
    shapes += shapes.empty() ? "[" : " [";
    for (int64_t d = 0; d < p.dim(); ++d) shapes += (d > 0 ? "," : "") + std::to_string(p.size(d));
    shapes += "]";
  }
  return {
      {"the model's parameters", std::to_string(count) + " in " + std::to_string(params.size()) +
                                     " tensors: " + shapes},
      {"the training set (--data, --format, --limit-train)",
       std::to_string(train.size()) + " examples"},
      {"the test set (--data, --format, --limit-test)", std::to_string(test.size()) + " examples"},
  };
}

}  // namespace kiln::apps::mnist
