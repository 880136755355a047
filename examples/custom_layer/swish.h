// swish.h: Swish (Ramachandran et al., 2017), a layer added to Kiln from outside its tree.
//
//   y = x * sigmoid(beta * x)
//
// beta is a learnable scalar (shape [1], initialised to 1: Swish-1 is SiLU). x: any shape,
// f32 or f64, on the CPU or a CUDA device; beta has x's dtype and device.
// Gradients (s = sigmoid(beta * x)):
//   dy/dx    = s + beta * x * s * (1 - s)
//   dy/dbeta = x^2 * s * (1 - s)          (summed over every element for beta's gradient)
// The element rule below is the one both devices run: swish.cpp's CPU loops and
// swish_cuda.cu's kernels call these functions, so the two agree to rounding.
#pragma once

#include <math.h>  // exp(float), exp(double): the overloads host and device code both have

#include <string>

#include "engine/host_device.h"  // KILN_HOST_DEVICE: host and device under nvcc
#include "engine/tensor.h"
#include "layers/module.h"

namespace swish_example {

template <typename T>
KILN_HOST_DEVICE inline T swish_sigmoid(T z) {
  return T(1) / (T(1) + exp(-z));
}

// y for one element.
template <typename T>
KILN_HOST_DEVICE inline T swish_value(T x, T beta) {
  return x * swish_sigmoid(beta * x);
}

// The two gradients of one element: gx = gy * dy/dx, gbeta = gy * dy/dbeta.
template <typename T>
KILN_HOST_DEVICE inline void swish_grads(T x, T beta, T gy, T& gx, T& gbeta) {
  const T s = swish_sigmoid(beta * x);
  const T ds = s * (T(1) - s);
  gx = gy * (s + beta * x * ds);
  gbeta = gy * x * x * ds;
}

// The differentiable op: records a SwishBackward node when x or beta requires grad.
kiln::Tensor swish(const kiln::Tensor& x, const kiln::Tensor& beta);

// The module: one learnable beta, moved with the model by Module::to().
class Swish : public kiln::Module {
 public:
  explicit Swish(double beta = 1.0);
  kiln::Tensor forward(const kiln::Tensor& x) override { return swish(x, beta_); }
  std::string type_name() const override { return "Swish"; }
  kiln::Tensor beta() const { return beta_; }

 protected:
  std::string extra_repr() const override;

 private:
  kiln::Tensor beta_;
};

}  // namespace swish_example
