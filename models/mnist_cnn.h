// mnist_cnn.h: the CNN of the Keras and Horovod MNIST examples (horovod/examples/keras):
//
//   x (N, 1, 28, 28)
//   Conv2d(1 -> 32, 3x3)  ReLU          -> (N, 32, 26, 26)
//   Conv2d(32 -> 64, 3x3) ReLU          -> (N, 64, 24, 24)
//   MaxPool2d(2)                        -> (N, 64, 12, 12)
//   Dropout(0.25), Flatten              -> (N, 9216)
//   Linear(9216 -> 128) ReLU, Dropout(0.5)
//   Linear(128 -> 10)                   -> logits (N, 10)
//
// About 1.2 M parameters; ~72 MFLOP per image for forward + backward, most of it in conv2.
#pragma once

#include <memory>

#include "layers/module.h"

namespace kiln {

std::shared_ptr<Sequential> make_mnist_cnn();

}  // namespace kiln
