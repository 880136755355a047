// lr_schedule.h: learning-rate schedules as pure functions of the step (or epoch) count.
//
// A schedule holds no state: lr_at(t) depends only on t, so resuming from a checkpoint is
// just calling it with the restored step, and two ranks never drift apart. Whether t counts
// optimizer steps or epochs is the caller's choice; call apply(opt, t) before each step
// (or at the start of each epoch). t starts at 0.
#pragma once

#include <cstdint>
#include <memory>

namespace kiln {

class Optimizer;

class LRSchedule {
 public:
  virtual ~LRSchedule() = default;
  virtual double lr_at(int64_t t) const = 0;
  void apply(Optimizer& opt, int64_t t) const;  // opt.set_lr(lr_at(t))
};

// lr = base_lr, always.
class ConstantLR : public LRSchedule {
 public:
  explicit ConstantLR(double base_lr);
  double lr_at(int64_t t) const override;

 private:
  double base_lr_;
};

// lr = base_lr * gamma^floor(t / step_size)   (torch.optim.lr_scheduler.StepLR)
class StepLR : public LRSchedule {
 public:
  StepLR(double base_lr, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t t) const override;

 private:
  double base_lr_;
  int64_t step_size_;
  double gamma_;
};

// Half a cosine from base_lr at t = 0 down to min_lr at t = total (and min_lr after):
//   lr = min_lr + (base_lr - min_lr) * (1 + cos(pi * min(t, total) / total)) / 2
// (torch's CosineAnnealingLR closed form, without restarts).
class CosineLR : public LRSchedule {
 public:
  CosineLR(double base_lr, int64_t total, double min_lr = 0.0);
  double lr_at(int64_t t) const override;

 private:
  double base_lr_;
  int64_t total_;
  double min_lr_;
};

// One-cycle (Smith and Topin, "Super-Convergence: Very Fast Training of Neural Networks Using
// Large Learning Rates", 2017, arXiv:1708.07120; torch.optim.lr_scheduler.OneCycleLR with
// three_phase=False): one rise and one long fall over the whole run of `total` steps.
//   initial_lr = max_lr / div_factor,   min_lr = initial_lr / final_div_factor
//   peak       = pct_start * total - 1             (the step at which lr = max_lr)
//   t <= peak:  lr = anneal(initial_lr, max_lr, t / peak)
//   t >  peak:  lr = anneal(max_lr, min_lr, (t - peak) / (total - 1 - peak))
//   cos:    anneal(a, b, p) = b + (a - b) * (1 + cos(pi * p)) / 2
//   linear: anneal(a, b, p) = a + (b - a) * p
// so lr_at(0) = initial_lr and lr_at(total - 1) = min_lr; after that it stays at min_lr (torch
// raises instead). The paper's point is that the large rates in the middle act as a
// regulariser and let a network reach its accuracy in far fewer epochs. Torch also cycles the
// momentum inversely; Kiln's optimizers keep a fixed momentum, so this schedule sets the rate only.
class OneCycleLR : public LRSchedule {
 public:
  enum class Anneal { Cos, Linear };
  OneCycleLR(double max_lr, int64_t total, double pct_start = 0.3, double div_factor = 25.0,
             double final_div_factor = 1e4, Anneal anneal = Anneal::Cos);
  double lr_at(int64_t t) const override;

 private:
  double max_lr_, initial_lr_, min_lr_;
  int64_t total_;
  double peak_;  // pct_start * total - 1: fractional, as in torch
  Anneal anneal_;
};

// Cyclical learning rates (Smith, "Cyclical Learning Rates for Training Neural Networks",
// WACV 2017, arXiv:1506.01186; torch.optim.lr_scheduler.CyclicLR): the rate goes linearly
// from base_lr up to max_lr in step_size_up steps and back down in step_size_down steps, again
// and again. With size = step_size_up + step_size_down and r = step_size_up / size:
//   cycle = floor(1 + t / size),   x = 1 + t / size - cycle          (x in [0, 1))
//   scale = x / r                 if x <= r   (rising)
//         = (x - 1) / (r - 1)     otherwise   (falling)
//   triangular:   lr = base_lr + (max_lr - base_lr) * scale
//   triangular2:  lr = base_lr + (max_lr - base_lr) * scale / 2^(cycle - 1)   (halved each cycle)
// The paper suggests a half-cycle of 2-10 epochs' worth of steps and finding base_lr and
// max_lr with an "LR range test" (one short run with the rate rising linearly).
class CyclicLR : public LRSchedule {
 public:
  enum class Mode { Triangular, Triangular2 };
  // step_size_down < 0: the same as step_size_up (a symmetric triangle).
  CyclicLR(double base_lr, double max_lr, int64_t step_size_up, int64_t step_size_down = -1,
           Mode mode = Mode::Triangular);
  double lr_at(int64_t t) const override;

 private:
  double base_lr_, max_lr_;
  double size_, ratio_;
  Mode mode_;
};

// Linear warm-up in front of any schedule: for t < warmup_steps the inner rate is multiplied
// by a factor rising linearly from start_factor (t = 0) towards 1 (t = warmup_steps); after
// that the inner schedule runs unchanged, at the same absolute t. This is the gradual warm-up
// of Goyal et al. (below), which ramps from the small-batch rate to the scaled one.
class LinearWarmup : public LRSchedule {
 public:
  LinearWarmup(std::shared_ptr<const LRSchedule> inner, int64_t warmup_steps,
               double start_factor = 0.1);
  double lr_at(int64_t t) const override;

 private:
  std::shared_ptr<const LRSchedule> inner_;
  int64_t warmup_steps_;
  double start_factor_;
};

// The linear scaling rule of Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet
// in 1 Hour" (2017): "when the minibatch size is multiplied by k, multiply the learning rate
// by k" (their reference: lr 0.1 for batch 256), combined with the warm-up above because the
// rule breaks down in the first epochs.
//   lr = base_lr * batch_size / base_batch_size
double linear_scaled_lr(double base_lr, int64_t batch_size, int64_t base_batch_size);
// Data parallelism with a fixed per-rank batch: the global batch is world_size times larger.
//   lr = base_lr * world_size
double world_scaled_lr(double base_lr, int world_size);

}  // namespace kiln
