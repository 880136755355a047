// step_flops.h: what a benchmark or training app prints about its FLOP rate: the model FLOPs
// of one step (models/flops.h), the FLOP/s it achieved, and the MFU where the device's peak is
// known (engine/peak_flops.h), as llm.c prints per step.
//
//   const apps::StepFlops f = apps::step_flops(*net, {batch, 3, 224, 224}, true, device, math);
//   std::printf("...%s\n", f.suffix(seconds_per_step).c_str());  // " tflops=41.2 mfu=4.2%"
//
// The model is counted once, with a batch of one (its FLOPs grow linearly with the batch), so
// the count costs one small forward, not one at the run's batch size.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/autocast.h"
#include "engine/device.h"
#include "engine/tensor.h"
#include "layers/module.h"

namespace kiln::apps {

struct StepFlops {
  int64_t per_step = 0;         // model FLOPs of one step: 3x the forward's when training
  std::optional<double> peak;   // the device's dense FLOP/s at the run's precision
  bool simulated = false;       // the CUDA simulator: no MFU, whatever the rate

  double achieved(double seconds_per_step) const;  // FLOP/s
  std::optional<double> mfu(double seconds_per_step) const;
  // " tflops=0.412 mfu=41.2%", or without mfu where the peak is unknown or simulated.
  std::string suffix(double seconds_per_step) const;
  // model_flops_per_step, achieved_tflops, mfu (null where unknown), peak_tflops (null).
  nlohmann::json json(double seconds_per_step) const;
};

// `input` is one step's input shape, batch first; `training`: forward + backward, else forward.
StepFlops step_flops(Module& model, const Shape& input, bool training, Device device,
                     Precision precision);

}  // namespace kiln::apps
