// spirals.h: the training run the example program and its test share: a three-armed spiral
// (points in 2-D, one class per arm, not linearly separable) learnt by a small MLP whose hidden
// activations are Swish.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/device.h"
#include "engine/tensor.h"
#include "layers/module.h"

namespace swish_example {

// n points per arm, 3 arms: inputs (3n, 2) f32, labels (3n) i64, on `device`. Deterministic
// in seed (the angle noise comes from a seeded std::mt19937).
struct Spirals {
  kiln::Tensor inputs, labels;
};
Spirals make_spirals(int64_t n_per_class, uint64_t seed, kiln::Device device);

// Linear(2, hidden) - Swish - Linear(hidden, hidden) - Swish - Linear(hidden, 3).
std::shared_ptr<kiln::Sequential> make_swish_mlp(int64_t hidden);

struct TrainResult {
  double first_loss = 0, final_loss = 0;  // cross-entropy of the first and last step
  double accuracy = 0;                    // on a held-out set of spirals, in [0, 1]
  double beta1 = 0, beta2 = 0;            // the learnt betas of the two Swish layers
};
// Full-batch Adam (lr 0.02) for `steps` steps on `device`; prints the loss every print_every
// steps (0: never).
TrainResult train_spirals(kiln::Device device, int steps, int print_every);

}  // namespace swish_example
