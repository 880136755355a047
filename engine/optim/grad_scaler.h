// grad_scaler.h: loss scaling for fp16 mixed-precision training, the rule of PyTorch's
// torch.cuda.amp.GradScaler (https://pytorch.org/docs/stable/amp.html#gradient-scaling) and of
// Micikevicius et al., "Mixed Precision Training", ICLR 2018 (https://arxiv.org/abs/1710.03740).
//
// Why: f16 has 5 exponent bits; gradients smaller than 2^-24 flush to zero in the backward pass.
// Multiplying the loss by a large S multiplies every gradient by S (the chain rule is linear),
// lifting them into f16's range; dividing the parameters' gradients by S before the step undoes
// it. S is chosen dynamically: too large and some gradient overflows to inf (the step is then
// skipped and S halved); no overflow for growth_interval steps in a row and S is doubled.
//
//   GradScaler scaler;                       // S = 2^16
//   for (...) {
//     Tensor loss = ...;
//     opt.zero_grad();
//     scaler.scale(loss).backward();          // gradients of S * loss
//     dp.synchronize();                       // data parallel: average (any linear op is fine)
//     bool inf = scaler.unscale_(params);     // gradients / S, and "any inf or NaN?"
//     inf = comm::any_rank(comm, inf);        // data parallel: every rank skips the same steps
//     if (scaler.update(inf)) opt.step();     // skipped when inf; S updated either way
//   }
//
// The rule of update(found_inf), with t the growth tracker (finite steps in a row):
//   found_inf:  S = S * backoff_factor, t = 0, the step is skipped
//   otherwise:  t = t + 1; when t == growth_interval: S = S * growth_factor, t = 0
// In static mode (dynamic = false) S never changes; steps with inf/NaN are still skipped.
// S is kept as an f32 value, as PyTorch keeps it in an f32 tensor, and a change that would make
// it inf or 0 in f32 is not made (PyTorch's guard against growing to inf). With the default
// factors S stays a power of two, so scaling and unscaling are exact.
//
// Checkpoints: state_dict() / load_state_dict() hold the scale, the growth tracker, the step
// counters and the history, as Tensors like an Optimizer's (apps/common/train_checkpoint.h saves
// such maps under a prefix).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace kiln {

struct GradScalerOptions {
  double init_scale = 65536.0;   // 2^16
  double growth_factor = 2.0;    // after growth_interval finite steps in a row
  double backoff_factor = 0.5;   // on a step with inf/NaN gradients (the step is skipped)
  int64_t growth_interval = 2000;
  bool dynamic = true;           // false: a static scale, never changed (steps with inf/NaN are still skipped)
};

class GradScaler {
 public:
  // Invalid options (a scale that is not a positive finite f32, growth_factor <= 1,
  // backoff_factor outside (0, 1), growth_interval < 1) are Input errors naming the option.
  explicit GradScaler(GradScalerOptions options = {});

  // loss * scale, differentiable (backward then yields scale times the gradients).
  Tensor scale(const Tensor& loss) const;

  // Divides every defined .grad of `params` by the scale, in place, and checks the results for
  // inf/NaN in the same pass over the memory (fused; engine/ops_cpu.h, engine/ops_cuda.h). One
  // flag per device, read by the host once per call, not once per parameter. Returns true when
  // any gradient is non-finite. Gradients must be f32 or f64.
  bool unscale_(const std::vector<Tensor>& params);

  // Applies the rule for one step given whether any gradient was non-finite (after the ranks
  // agreed: comm::any_rank): returns true when the optimizer step should run, false when it is
  // skipped. Updates the scale.
  bool update(bool found_inf);

  double scale_value() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }  // finite steps in a row
  int64_t steps() const { return steps_; }                    // update() calls
  int64_t skipped_steps() const { return skipped_; }
  const GradScalerOptions& options() const { return options_; }

  // Every scale change: (step, scale) means update() calls step, step + 1, ... (0-based) saw
  // this scale, until the next entry. Starts with (0, init_scale).
  struct Change {
    int64_t step;
    double scale;
  };
  const std::vector<Change>& history() const { return history_; }

  // "scale" (f64 [1]), "growth_tracker", "steps", "skipped_steps" (i64 [1]), "history.step"
  // (i64 [n]) and "history.scale" (f64 [n]). Round-tripping it continues identically.
  std::map<std::string, Tensor> state_dict() const;
  // Strict: a missing or unexpected key, a misshapen entry, or values that cannot come from a
  // scaler with these options (a tracker >= growth_interval, more skipped steps than steps, ...)
  // are Input errors naming the entry. The options stay the constructor's.
  void load_state_dict(const std::map<std::string, Tensor>& state);

 private:
  void set_scale(float next);

  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t steps_ = 0;
  int64_t skipped_ = 0;
  std::vector<Change> history_;
};

}  // namespace kiln
