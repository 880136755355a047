// linear.cpp: Linear: y = x W^T + b through matmul, and its default initialisation.
#include "layers/linear.h"

#include <cstdint>
#include <string>

#include "engine/error.h"
#include "engine/init.h"
#include "engine/ops.h"
#include "layers/flop_counter.h"

namespace kiln {

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  KILN_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "linear: input ",
             shape_str(x.shape()), " does not match weight ", shape_str(w.shape()),
             " (expected input (N, ", w.dim() == 2 ? w.size(1) : -1, "))");
  FlopCounter::add(2 * x.size(0) * w.size(0) * w.size(1));  // layers/flop_counter.h
  Tensor y = matmul(x, w, /*trans_a=*/false, /*trans_b=*/true);  // (N, in) x (in, out)
  if (b.defined()) y = add(y, b);                                 // bias row broadcast
  return y;
}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : in_features_(in_features), out_features_(out_features) {
  KILN_CHECK(in_features > 0 && out_features > 0, "Linear(", in_features, ", ", out_features,
             "): sizes must be positive");
  weight_ = register_parameter("weight", Tensor::empty({out_features, in_features}));
  default_init_(weight_, in_features);
  if (bias) {
    bias_ = register_parameter("bias", Tensor::empty({out_features}));
    default_init_(bias_, in_features);
  }
}

Tensor Linear::forward(const Tensor& x) { return linear(x, weight_, bias_); }

std::string Linear::extra_repr() const {
  return detail::str("in_features=", in_features_, ", out_features=", out_features_,
                     ", bias=", bias_.defined() ? "true" : "false");
}

}  // namespace kiln
