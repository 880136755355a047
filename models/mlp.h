// mlp.h: a multi-layer perceptron for MNIST: Flatten, then Linear + ReLU for each hidden
// size, then Linear to the classes. The baseline the CNN is compared with.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "layers/module.h"

namespace kiln {

// Input (N, 1, 28, 28) or (N, in_features); default 784 -> 512 -> 256 -> 10.
std::shared_ptr<Sequential> make_mlp(int64_t in_features = 784,
                                     std::vector<int64_t> hidden = {512, 256},
                                     int64_t num_classes = 10);

}  // namespace kiln
