// linear.h: fully connected layer, y = x W^T + b.
//
//   x is (N, in_features), W is (out_features, in_features), b is (out_features), y is (N, out).
// W is stored (out, in) like PyTorch, so checkpoints map one to one; the product uses BLAS's
// transpose flag instead of a copy.
#pragma once

#include <cstdint>
#include <string>

#include "layers/module.h"

namespace kiln {

// Functional form; b may be undefined (no bias).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b);

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Linear"; }
  Tensor weight() const { return weight_; }
  Tensor bias() const { return bias_; }

 protected:
  std::string extra_repr() const override;

 private:
  int64_t in_features_, out_features_;
  Tensor weight_, bias_;
};

}  // namespace kiln
