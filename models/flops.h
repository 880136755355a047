// flops.h: the model FLOPs of a forward pass and of a training step, for MFU.
//
// forward_flops() runs one forward of the model on an input of the given shape, on the device
// of its parameters, in eval mode and without autograd, and returns what its convolutions and
// linear layers counted (layers/flop_counter.h: multiply-adds x 2, elementwise work excluded).
// Running the real forward keeps the count honest for any model built from Kiln layers: no
// shape rules are repeated here. The model's train/eval mode is restored afterwards, and eval
// mode leaves BatchNorm's running statistics and the dropout generator untouched.
//
// A training step is forward + backward, and the backward of a matmul or convolution is two of
// the same size (the input's gradient and the weight's), so a step is 3x the forward: the
// convention of PaLM's MFU (Chowdhery et al. 2022, Appendix B, https://arxiv.org/abs/2204.02311)
// and of llm.c (6 x parameters x tokens for a transformer, https://github.com/karpathy/llm.c).
//
// Figures: ResNet-50 at 224x224 is 8.18 GFLOP per image forward (torchvision lists 4.09
// "GFLOPS" counting multiply-adds); the MNIST CNN of models/mnist_cnn.h is 24.0 MFLOP.
#pragma once

#include <cstdint>
#include <optional>

#include "engine/tensor.h"
#include "layers/module.h"

namespace kiln {

// The FLOPs of model.forward(x) for an x of `input_shape` (batch included).
int64_t forward_flops(Module& model, const Shape& input_shape);

// forward x 3: forward, then the input's and the weights' gradients.
inline int64_t training_step_flops(int64_t forward) { return 3 * forward; }

// FLOP/s achieved: `flops` done in `seconds`.
inline double achieved_flops_per_second(int64_t flops, double seconds) {
  return seconds > 0 ? static_cast<double>(flops) / seconds : 0.0;
}

// Model FLOPs utilisation: the achieved FLOP/s over the device's peak, or nothing when the
// peak is unknown (engine/peak_flops.h).
inline std::optional<double> mfu(double achieved, std::optional<double> peak) {
  if (!peak || *peak <= 0) return std::nullopt;
  return achieved / *peak;
}

}  // namespace kiln
