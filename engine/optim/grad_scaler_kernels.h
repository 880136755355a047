// grad_scaler_kernels.h: the loss-scale rule of engine/optim/grad_scaler.h as one function both
// devices run, and the kernel pair that applies it to state kept in memory (engine/dispatch.h:
// cpu:: in grad_scaler.cpp, cuda:: in engine/cuda/kernels/optim.cu).
//
// update_scale is the device-side twin of GradScaler::update(): it reads found_inf where
// unscale_and_check left it and updates the scale, the growth tracker and the step counters in
// place, as PyTorch's _amp_update_scale_ does on the GPU
// (aten/src/ATen/native/cuda/AmpKernels.cu), so a training step needs no host decision and can
// be captured into a CUDA graph. Each scale change is also appended to a small log of
// (step, scale) pairs that the host drains when it next reads the state; `changes` counts the
// entries, also past `capacity` (the host then reports the loss).
#pragma once

#include <cfloat>
#include <cstdint>

#include "engine/backend.h"
#include "engine/host_device.h"

namespace kiln {

struct ScaleRule {
  float growth_factor;    // f32, as the host rule multiplies
  float backoff_factor;
  int64_t growth_interval;
  bool dynamic;
};

// Pointers into memory of one device (or the host for the CPU twin).
struct ScaleState {
  float* scale;
  int64_t* growth_tracker;
  int64_t* steps;
  int64_t* skipped;
  int64_t* change_steps;   // the log: capacity entries
  float* change_scales;
  int64_t* changes;        // entries written since the host last drained the log
  int64_t capacity;
};

// The scale after one step of the rule, in f32 (grad_scaler.h), and the growth tracker updated.
// A change that would make the scale inf or 0 in f32 is not made (PyTorch's guard).
KILN_HOST_DEVICE inline float next_scale(const ScaleRule& rule, bool found_inf, float scale,
                                         int64_t& growth_tracker) {
  if (!rule.dynamic) return scale;
  float next = scale;
  if (found_inf) {
    growth_tracker = 0;
    next = scale * rule.backoff_factor;
  } else if (++growth_tracker == rule.growth_interval) {
    growth_tracker = 0;
    next = scale * rule.growth_factor;
  }
  return next > 0.0f && next <= FLT_MAX ? next : scale;
}

// One update() on state in memory: steps, skipped steps, the scale and the log.
KILN_HOST_DEVICE inline void update_scale_state(bool found_inf, const ScaleState& s,
                                                const ScaleRule& rule) {
  ++*s.steps;
  if (found_inf) ++*s.skipped;
  const float next = next_scale(rule, found_inf, *s.scale, *s.growth_tracker);
  if (next == *s.scale) return;
  *s.scale = next;
  if (*s.changes < s.capacity) {
    s.change_steps[*s.changes] = *s.steps;  // counts this update: the next step's scale
    s.change_scales[*s.changes] = next;
  }
  ++*s.changes;
}

namespace cpu {
// update_scale_state(*found_inf != 0, state, rule).
void update_scale(Backend, const int32_t* found_inf, ScaleState state, ScaleRule rule);
}  // namespace cpu

namespace cuda {
// The same, one GPU thread.
void update_scale(Backend, const int32_t* found_inf, ScaleState state, ScaleRule rule);
}  // namespace cuda

}  // namespace kiln
