// loss.h: loss functions.
//
// cross_entropy fuses log-softmax and the negative log-likelihood: one pass computes the
// row's log-sum-exp (max-subtracted, so it never overflows), and the gradient is simply
// (softmax - one_hot(target)) / N. Composing log_softmax + gather would store an extra
// (N, C) tensor and run two backward kernels for no benefit.
#pragma once

#include "layers/module.h"

namespace kiln {

// logits is (N, C) floating; targets is (N) i64 with values in [0, C). Mean over N.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets);
// mean((a - b)^2) over all elements.
Tensor mse_loss(const Tensor& a, const Tensor& b);

class CrossEntropyLoss {
 public:
  Tensor operator()(const Tensor& logits, const Tensor& targets) const {
    return cross_entropy(logits, targets);
  }
};

class MSELoss {
 public:
  Tensor operator()(const Tensor& a, const Tensor& b) const { return mse_loss(a, b); }
};

}  // namespace kiln
