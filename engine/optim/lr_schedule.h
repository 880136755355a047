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
