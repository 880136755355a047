// loss.h: loss functions.
//
// cross_entropy fuses log-softmax and the negative log-likelihood: one pass computes the
// row's log-sum-exp (max-subtracted, so it never overflows), and the gradient is simply
// (softmax - one_hot(target)) / N. Composing log_softmax + gather would store an extra
// (N, C) tensor and run two backward kernels for no benefit.
#pragma once

#include "engine/cuda/sync_debug.h"
#include "layers/module.h"

namespace kiln {

// logits is (N, C) floating; targets is (N) i64 with values in [0, C). Mean over N.
// A target outside [0, C) is an Input error naming the first bad row. On the CPU it is thrown
// by the call. On a GPU the kernels find it without making the host wait for them (a wait per
// call would be a wait per training step): the loss comes back NaN, and the error is thrown by
// a later cross_entropy call on the same thread, the first to find that check finished (in a
// training loop, the next step's or soon after), or by check_cross_entropy_targets().
Tensor cross_entropy(const Tensor& logits, const Tensor& targets);
// Waits for the target checks of this thread's earlier cross_entropy calls on a GPU and throws
// the error of the first bad one (nothing to do on the CPU). A wait for the device, which the
// sync debug mode reports at the caller's line (engine/cuda/sync_debug.h); where the losses are
// read anyway, call it just after: it then waits for nothing.
void check_cross_entropy_targets(cuda::SyncSite site = cuda::SyncSite());
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
