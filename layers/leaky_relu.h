// leaky_relu.h: LeakyReLU, y = x for x > 0 and negative_slope * x elsewhere.
//
// ReLU's zero gradient for x < 0 can leave a unit that never fires again ("dying ReLU");
// a small slope keeps a gradient flowing there. Introduced in Maas, Hannun and Ng,
// "Rectifier Nonlinearities Improve Neural Network Acoustic Models" (ICML 2013),
// https://ai.stanford.edu/~amaas/papers/relu_hybrid_icml2013_final.pdf; the same function as
// PyTorch's torch.nn.LeakyReLU (default slope 0.01, and slope at x == 0 in backward).
// x: any shape, f32 or f64, on the CPU or a CUDA device. The element rule (leaky_relu_of) and
// the kernels that apply it are in layers/leaky_relu_kernels.h.
#pragma once

#include <string>

#include "engine/tensor.h"
#include "layers/module.h"

namespace kiln {

// y = x where x > 0, negative_slope * x elsewhere. negative_slope must be finite.
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);

class LeakyReLU : public Module {
 public:
  explicit LeakyReLU(double negative_slope = 0.01);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "LeakyReLU"; }
  double negative_slope() const { return negative_slope_; }

 protected:
  std::string extra_repr() const override;

 private:
  double negative_slope_;
};

}  // namespace kiln
