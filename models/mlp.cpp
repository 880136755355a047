// mlp.cpp: the MLP of mnist_train --model mlp.
#include "models/mlp.h"

#include <cstdint>

#include "layers/activation.h"
#include "layers/linear.h"

namespace kiln {

std::shared_ptr<Sequential> make_mlp(int64_t in_features, std::vector<int64_t> hidden,
                                     int64_t num_classes) {
  auto net = std::make_shared<Sequential>();
  net->push_back(std::make_shared<Flatten>());
  int64_t width = in_features;
  for (int64_t h : hidden) {
    net->push_back(std::make_shared<Linear>(width, h));
    net->push_back(std::make_shared<ReLU>());
    width = h;
  }
  net->push_back(std::make_shared<Linear>(width, num_classes));
  return net;
}

}  // namespace kiln
