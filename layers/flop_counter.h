// flop_counter.h: counts the floating-point operations of the matmul-like ops a forward runs.
//
// While a FlopCounter is alive on a thread, conv2d() and linear() (layers/conv2d.h,
// layers/linear.h) add their multiply-add count x 2 to it:
//   conv2d: 2 * N * Cout * Hout * Wout * Cin * kh * kw   (Kiln convolutions have no groups)
//   linear: 2 * N * in * out
// Nothing else is counted: bias adds, BatchNorm, activations, pooling and residual adds are
// elementwise and excluded, as the MFU convention counts only the matmul/convolution FLOPs
// (PaLM's MFU, Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways",
// Appendix B, https://arxiv.org/abs/2204.02311). For ResNet-50 they are under 1% of the total.
//
// models/flops.h uses it to count a model's forward; counting is per thread, so a forward on
// another thread (a data-parallel rank) is not mixed in. Counters nest: an inner one counts
// only what runs while it lives, and the outer one counts that too.
#pragma once

#include <cstdint>

namespace kiln {

class FlopCounter {
 public:
  FlopCounter();
  ~FlopCounter();
  FlopCounter(const FlopCounter&) = delete;
  FlopCounter& operator=(const FlopCounter&) = delete;

  int64_t flops() const { return flops_; }

  // Called by the counted ops: adds `flops` to every live counter of this thread.
  static void add(int64_t flops);

 private:
  int64_t flops_ = 0;
  FlopCounter* outer_;  // the counter that was innermost before this one, or null
};

}  // namespace kiln
