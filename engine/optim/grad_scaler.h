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
// The device-side path. The loop above decides on the host: unscale_() reads the inf flag, and
// update() returns whether to step, so every step waits for the device once. The way torch.amp
// runs under CUDA graphs keeps the decision on the device instead:
//
//   scaler.keep_on_device(device);           // the state lives in device memory from now on
//   for (...) {
//     scaler.scale(loss).backward();          // loss times the device's scale (a kernel)
//     scaler.unscale_on_device(params);       // gradients / S, found_inf left on the device
//     opt.step(scaler.found_inf());           // the update kernels do nothing when it is set
//     scaler.update_on_device();              // the rule above, as a one-thread kernel
//   }
//
// Nothing in it waits for the device, so the host queues step after step, and a captured CUDA
// graph replays it with no host decision (PyTorch: "CUDA Graphs",
// https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs; torch.amp's
// _amp_foreach_non_finite_check_and_unscale_ and _amp_update_scale_ are the two kernels).
// The accessors (scale_value(), steps(), skipped_steps(), history(), state_dict()) then read the
// device's state back: a wait, named (cuda::AllowSync), so call them outside the step. The host
// API still works on such a scaler (the state moves back and forth as needed); the data-parallel
// loop keeps it, because the ranks must agree on found_inf on the host (comm::any_rank).
//
// Checkpoints: state_dict() / load_state_dict() hold the scale, the growth tracker, the step
// counters and the history, as Tensors like an Optimizer's (apps/common/train_checkpoint.h saves
// such maps under a prefix).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/device.h"
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

  // ---- The device-side path (see above) ----
  // Keeps the state in memory of `device` (a CUDA device or the CPU) from now on; scale()
  // then multiplies a loss on that device by the value there.
  void keep_on_device(Device device);
  // unscale_() without the read: found_inf() is left set when any gradient is non-finite.
  // Every gradient must be on the scaler's device (keep_on_device; the first call picks the
  // gradients' device).
  void unscale_on_device(const std::vector<Tensor>& params);
  // The flag of the last unscale_on_device(): one i32 on the device, nonzero for inf or NaN.
  const Tensor& found_inf() const;
  // update(found_inf()) on the device, without returning the decision to the host.
  void update_on_device();

  // These read the device's state when it is kept there: a wait for the device.
  double scale_value() const;
  int64_t growth_tracker() const;  // finite steps in a row
  int64_t steps() const;           // update() calls
  int64_t skipped_steps() const;
  const GradScalerOptions& options() const { return options_; }

  // Every scale change: (step, scale) means update() calls step, step + 1, ... (0-based) saw
  // this scale, until the next entry. Starts with (0, init_scale).
  struct Change {
    int64_t step;
    double scale;
  };
  // Kept on the device, the last kChangeLog changes are logged there between two reads; a
  // read that finds more lost is an Error (read an accessor more often).
  const std::vector<Change>& history() const;
  static constexpr int64_t kChangeLog = 1024;

  // "scale" (f64 [1]), "growth_tracker", "steps", "skipped_steps" (i64 [1]), "history.step"
  // (i64 [n]) and "history.scale" (f64 [n]). Round-tripping it continues identically.
  std::map<std::string, Tensor> state_dict() const;
  // Strict: a missing or unexpected key, a misshapen entry, or values that cannot come from a
  // scaler with these options (a tracker >= growth_interval, more skipped steps than steps, ...)
  // are Input errors naming the entry. The options stay the constructor's.
  void load_state_dict(const std::map<std::string, Tensor>& state);

 private:
  // The state in device memory (keep_on_device), one tensor per field.
  struct DeviceState {
    Tensor scale;                         // f32 [1]
    Tensor growth_tracker, steps, skipped;  // i64 [1]
    Tensor change_steps, change_scales;   // i64 / f32 [kChangeLog]
    Tensor changes;                       // i64 [1]
    Tensor found_inf;                     // i32 [1]
  };
  void pull() const;  // the device's state into the host fields, if the device's is newer
  void push() const;  // the host fields to the device, if the host's are newer (fill kernels)
  void host_changed();

  GradScalerOptions options_;
  // The host's copy of the state; with the state kept on a device, current after pull().
  mutable double scale_;
  mutable int64_t growth_tracker_ = 0;
  mutable int64_t steps_ = 0;
  mutable int64_t skipped_ = 0;
  mutable std::vector<Change> history_;
  bool kept_on_device_ = false;
  Device device_;
  mutable DeviceState dev_;
  mutable bool device_newer_ = false;  // update_on_device() ran since the last pull()
  mutable bool host_newer_ = false;    // the host fields changed since the last push()
};

}  // namespace kiln
