// activation.h: activation modules (the functional forms are in engine/ops.h).
#pragma once

#include <cstdint>
#include <string>

#include "engine/ops.h"
#include "layers/module.h"

namespace kiln {

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return relu(x); }
  std::string type_name() const override { return "ReLU"; }
};

// Flattens all dims from start_dim on: (N, C, H, W) -> (N, C*H*W).
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1) : start_dim_(start_dim) {}
  Tensor forward(const Tensor& x) override { return x.flatten(start_dim_); }
  std::string type_name() const override { return "Flatten"; }

 private:
  int64_t start_dim_;
};

}  // namespace kiln
