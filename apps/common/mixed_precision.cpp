// mixed_precision.cpp: see mixed_precision.h.
#include "apps/common/mixed_precision.h"

#include "engine/build_config.h"
#include "engine/error.h"
#if KILN_WITH_CUDA
#include "engine/cuda/blas.h"
#endif

namespace kiln::apps {

const char* const kPrecisionHelp =
    "fp32 | tf32 (f32 tensors, matrix products on a GPU's tensor cores with 10-bit mantissas; "
    "CUDA only) | bf16 (autocast: convolutions and matrix products on bfloat16 inputs with f32 "
    "sums; f32 master weights) | fp16 (the same in IEEE half, with dynamic loss scaling)";

const char* const kActivationsHelp =
    "with --precision bf16 or fp16: 16bit (convolutions return bf16/fp16 and BatchNorm, ReLU, "
    "the residual adds and pooling read and write 16-bit activations with f32 arithmetic, as "
    "PyTorch's autocast does) or f32 (convolutions return their f32 sums)";

AutocastOutputs parse_activations(const std::string& value) {
  if (value == "16bit") return AutocastOutputs::LowPrecision;
  KILN_CHECK_INPUT(value == "f32", "unknown --activations '", value, "': use 16bit or f32");
  return AutocastOutputs::F32;
}

Precision setup_precision(const std::string& value, Device device) {
  const Precision p = parse_precision(value);
  if (p == Precision::TF32) {
    KILN_CHECK_INPUT(device.is_cuda(), "--precision tf32 needs a CUDA device (TF32 is a format "
                     "of NVIDIA tensor cores; the device is ", device.str(), "): on the CPU use "
                     "--precision bf16 or fp32");
  }
#if KILN_WITH_CUDA
  if (device.is_cuda()) cuda::set_allow_tf32(p == Precision::TF32);
#endif
  return p;
}

nlohmann::json loss_scale_json(const GradScaler& scaler) {
  nlohmann::json history = nlohmann::json::array();
  for (const GradScaler::Change& c : scaler.history()) history.push_back({c.step, c.scale});
  return {{"init_scale", scaler.options().init_scale},
          {"final_scale", scaler.scale_value()},
          {"growth_interval", scaler.options().growth_interval},
          {"steps", scaler.steps()},
          {"skipped_steps", scaler.skipped_steps()},
          {"history", history}};
}

}  // namespace kiln::apps
