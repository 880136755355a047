// mnist_cnn.cpp: the MNIST CNN as a Sequential of layers.
#include "models/mnist_cnn.h"

#include "layers/activation.h"
#include "layers/conv2d.h"
#include "layers/dropout.h"
#include "layers/linear.h"
#include "layers/pool2d.h"

namespace kiln {

std::shared_ptr<Sequential> make_mnist_cnn() {
  auto net = std::make_shared<Sequential>();
  net->push_back(std::make_shared<Conv2d>(1, 32, 3));
  net->push_back(std::make_shared<ReLU>());
  net->push_back(std::make_shared<Conv2d>(32, 64, 3));
  net->push_back(std::make_shared<ReLU>());
  net->push_back(std::make_shared<MaxPool2d>(2));
  net->push_back(std::make_shared<Dropout>(0.25));
  net->push_back(std::make_shared<Flatten>());
  net->push_back(std::make_shared<Linear>(9216, 128));
  net->push_back(std::make_shared<ReLU>());
  net->push_back(std::make_shared<Dropout>(0.5));
  net->push_back(std::make_shared<Linear>(128, 10));
  return net;
}

}  // namespace kiln
