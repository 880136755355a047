// lr_schedule.cpp: closed forms of the schedules in lr_schedule.h.
#include "engine/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "engine/error.h"
#include "engine/optim/optimizer.h"

namespace kiln {

namespace {
void check_t(int64_t t) { KILN_CHECK(t >= 0, "LR schedule: step must be >= 0, got ", t); }
void check_lr(double lr, const char* what) {
  KILN_CHECK_INPUT(std::isfinite(lr) && lr >= 0, what, " must be a finite value >= 0, got ", lr);
}
}  // namespace

void LRSchedule::apply(Optimizer& opt, int64_t t) const { opt.set_lr(lr_at(t)); }

ConstantLR::ConstantLR(double base_lr) : base_lr_(base_lr) { check_lr(base_lr, "ConstantLR: lr"); }

double ConstantLR::lr_at(int64_t t) const {
  check_t(t);
  return base_lr_;
}

StepLR::StepLR(double base_lr, int64_t step_size, double gamma)
    : base_lr_(base_lr), step_size_(step_size), gamma_(gamma) {
  check_lr(base_lr, "StepLR: base lr");
  KILN_CHECK_INPUT(step_size > 0, "StepLR: step_size must be > 0, got ", step_size);
  KILN_CHECK_INPUT(gamma > 0, "StepLR: gamma must be > 0, got ", gamma);
}

double StepLR::lr_at(int64_t t) const {
  check_t(t);
  return base_lr_ * std::pow(gamma_, static_cast<double>(t / step_size_));
}

CosineLR::CosineLR(double base_lr, int64_t total, double min_lr)
    : base_lr_(base_lr), total_(total), min_lr_(min_lr) {
  check_lr(base_lr, "CosineLR: base lr");
  check_lr(min_lr, "CosineLR: min lr");
  KILN_CHECK_INPUT(total > 0, "CosineLR: total must be > 0, got ", total);
  KILN_CHECK_INPUT(min_lr <= base_lr, "CosineLR: min lr ", min_lr, " exceeds base lr ", base_lr);
}

double CosineLR::lr_at(int64_t t) const {
  check_t(t);
  const double pi = 3.14159265358979323846;
  const double frac = static_cast<double>(std::min(t, total_)) / static_cast<double>(total_);
  return min_lr_ + (base_lr_ - min_lr_) * 0.5 * (1.0 + std::cos(pi * frac));
}

LinearWarmup::LinearWarmup(std::shared_ptr<const LRSchedule> inner, int64_t warmup_steps,
                           double start_factor)
    : inner_(std::move(inner)), warmup_steps_(warmup_steps), start_factor_(start_factor) {
  KILN_CHECK(inner_ != nullptr, "LinearWarmup: the inner schedule is null");
  KILN_CHECK_INPUT(warmup_steps >= 0, "LinearWarmup: warmup_steps must be >= 0, got ",
                   warmup_steps);
  KILN_CHECK_INPUT(start_factor > 0 && start_factor <= 1,
                   "LinearWarmup: start_factor must be in (0, 1], got ", start_factor);
}

double LinearWarmup::lr_at(int64_t t) const {
  check_t(t);
  double factor = 1.0;
  if (t < warmup_steps_)
    factor = start_factor_ + (1.0 - start_factor_) * static_cast<double>(t) /
                                 static_cast<double>(warmup_steps_);
  return inner_->lr_at(t) * factor;
}

double linear_scaled_lr(double base_lr, int64_t batch_size, int64_t base_batch_size) {
  KILN_CHECK_INPUT(batch_size > 0 && base_batch_size > 0,
                   "linear_scaled_lr: batch sizes must be > 0, got ", batch_size, " and ",
                   base_batch_size);
  return base_lr * static_cast<double>(batch_size) / static_cast<double>(base_batch_size);
}

double world_scaled_lr(double base_lr, int world_size) {
  KILN_CHECK_INPUT(world_size > 0, "world_scaled_lr: world size must be > 0, got ", world_size);
  return base_lr * world_size;
}

}  // namespace kiln
