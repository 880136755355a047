// mixed_precision.h: the training apps' --precision flag (fp32 | tf32 | bf16 | fp16): checked
// against the device, turned into an autocast dtype (engine/autocast.h) and the TF32 switch
// (engine/cuda/blas.h).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "engine/autocast.h"
#include "engine/device.h"
#include "engine/optim/grad_scaler.h"

namespace kiln::apps {

// The --precision help text shared by the apps.
extern const char* const kPrecisionHelp;

// Parses --precision and refuses what cannot work on `device` with a usage error (exit 2):
// tf32 is a tensor-core format of NVIDIA GPUs, so it needs a CUDA device. Turns TF32 on for
// tf32 and off otherwise (a run's precision is what it says).
Precision setup_precision(const std::string& value, Device device);

// The --activations help text: what flows between layers under --precision bf16 / fp16.
extern const char* const kActivationsHelp;

// --activations ("16bit" or "f32") as the autocast policy (engine/autocast.h): 16-bit
// activations (AutocastOutputs::LowPrecision) or f32 ones. Any other value is a usage error.
AutocastOutputs parse_activations(const std::string& value);

// The loss scaler's story for the apps' JSON: {"init_scale", "final_scale", "steps",
// "skipped_steps", "history": [[step, scale], ...]} (every change, from step 0).
nlohmann::json loss_scale_json(const GradScaler& scaler);

}  // namespace kiln::apps
