// lr_schedule.cpp: closed forms of the schedules in lr_schedule.h.
#include "engine/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <utility>

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

OneCycleLR::OneCycleLR(double max_lr, int64_t total, double pct_start, double div_factor,
                       double final_div_factor, Anneal anneal)
    : max_lr_(max_lr),
      initial_lr_(max_lr / div_factor),
      min_lr_(max_lr / div_factor / final_div_factor),
      total_(total),
      peak_(pct_start * static_cast<double>(total) - 1.0),
      anneal_(anneal) {
  check_lr(max_lr, "OneCycleLR: max lr");
  KILN_CHECK_INPUT(total >= 2, "OneCycleLR: total steps must be >= 2, got ", total);
  KILN_CHECK_INPUT(pct_start > 0 && pct_start < 1, "OneCycleLR: pct_start must be in (0, 1), got ",
                   pct_start);
  // Both phases must last at least one step, or a division by zero would follow.
  KILN_CHECK_INPUT(peak_ > 0 && peak_ < static_cast<double>(total - 1),
                   "OneCycleLR: pct_start ", pct_start, " leaves no rising or no falling phase "
                   "over ", total, " steps: use more steps or a pct_start nearer 0.5");
  KILN_CHECK_INPUT(div_factor >= 1, "OneCycleLR: div_factor must be >= 1, got ", div_factor);
  KILN_CHECK_INPUT(final_div_factor >= 1, "OneCycleLR: final_div_factor must be >= 1, got ",
                   final_div_factor);
}

double OneCycleLR::lr_at(int64_t t) const {
  check_t(t);
  const double pi = 3.14159265358979323846;
  const auto anneal = [&](double a, double b, double p) {
    return anneal_ == Anneal::Cos ? b + (a - b) / 2.0 * (std::cos(pi * p) + 1.0)
                                  : (b - a) * p + a;
  };
  const double s = static_cast<double>(std::min(t, total_ - 1));
  if (s <= peak_) return anneal(initial_lr_, max_lr_, s / peak_);
  const double last = static_cast<double>(total_ - 1);
  return anneal(max_lr_, min_lr_, (s - peak_) / (last - peak_));
}

CyclicLR::CyclicLR(double base_lr, double max_lr, int64_t step_size_up, int64_t step_size_down,
                   Mode mode)
    : base_lr_(base_lr), max_lr_(max_lr), mode_(mode) {
  check_lr(base_lr, "CyclicLR: base lr");
  check_lr(max_lr, "CyclicLR: max lr");
  KILN_CHECK_INPUT(base_lr <= max_lr, "CyclicLR: base lr ", base_lr, " exceeds max lr ", max_lr);
  KILN_CHECK_INPUT(step_size_up > 0, "CyclicLR: step_size_up must be > 0, got ", step_size_up);
  if (step_size_down < 0) step_size_down = step_size_up;
  KILN_CHECK_INPUT(step_size_down > 0, "CyclicLR: step_size_down must be > 0, got ",
                   step_size_down);
  size_ = static_cast<double>(step_size_up + step_size_down);
  ratio_ = static_cast<double>(step_size_up) / size_;
}

double CyclicLR::lr_at(int64_t t) const {
  check_t(t);
  const double cycle = std::floor(1.0 + static_cast<double>(t) / size_);
  const double x = 1.0 + static_cast<double>(t) / size_ - cycle;
  const double scale = x <= ratio_ ? x / ratio_ : (x - 1.0) / (ratio_ - 1.0);
  const double height = (max_lr_ - base_lr_) * scale;
  if (mode_ == Mode::Triangular2) return base_lr_ + height / std::pow(2.0, cycle - 1.0);
  return base_lr_ + height;
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
