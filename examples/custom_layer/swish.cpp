// swish.cpp: the swish op (checks, CPU kernels, device dispatch, autograd node) and the Swish
// module. The CUDA twins of the kernels are in swish_cuda.cu (both declared in swish_kernels.h).
#include "swish.h"

#include <cstdint>
#include <memory>
#include <sstream>
#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/dispatch.h"  // run_kernel
#include "engine/dtype.h"
#include "engine/error.h"
#include "engine/ops.h"
#include "swish_kernels.h"

namespace swish_example {

using kiln::Tensor;

// ---- CPU kernels --------------------------------------------------------------------------
// OpenMP threads only where there is enough work to pay for waking them.
constexpr int64_t kParallelMin = 1 << 16;

template <typename T>
void swish_forward(kiln::cpu::Backend, const T* x, const T* beta, T* y, int64_t n) {
  const T b = *beta;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = swish_value(x[i], b);
}

template <typename T>
void swish_backward(kiln::cpu::Backend, const T* x, const T* beta, const T* gy, T* gx, T* gbeta,
                    int64_t n) {
  const T b = *beta;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) swish_grads(x[i], b, gy[i], gx[i], gbeta[i]);
}

namespace {

// ---- Device dispatch ----------------------------------------------------------------------
// run_kernel calls the lambda with the tag of the tensor's backend (kiln::cpu::Backend, or
// kiln::cuda::Backend under a DeviceGuard) and of its dtype (float or double); the tag picks
// the CPU or the CUDA overload of swish_forward. In a Kiln built without CUDA a CUDA tensor
// gets a clear error instead.
Tensor forward_on_device(const Tensor& x, const Tensor& beta) {
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  kiln::run_kernel("swish", x.device(), x.dtype(), [&](auto backend, auto tag) {
    using T = typename decltype(tag)::type;
    swish_forward(backend, x.data<T>(), beta.data<T>(), y.data<T>(), x.numel());
  });
  return y;
}

// Returns {gx, per-element gbeta}.
std::pair<Tensor, Tensor> backward_on_device(const Tensor& x, const Tensor& beta,
                                             const Tensor& gy) {
  Tensor gx = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor gbeta = Tensor::empty(x.shape(), x.dtype(), x.device());
  kiln::run_kernel("swish_backward", x.device(), x.dtype(), [&](auto backend, auto tag) {
    using T = typename decltype(tag)::type;
    swish_backward(backend, x.data<T>(), beta.data<T>(), gy.data<T>(), gx.data<T>(),
                   gbeta.data<T>(), x.numel());
  });
  return {gx, gbeta};
}

// ---- Autograd -----------------------------------------------------------------------------
// Saves x and beta (Node::saved, released after it runs); returns one gradient per input,
// in the order given to set_history: {x, beta}.
struct SwishBackward : kiln::Node {
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    const Tensor& x = saved[0];
    const Tensor& beta = saved[1];
    auto [gx, gbeta] = backward_on_device(x, beta, grad_out);
    return {gx, kiln::sum(gbeta).reshape(beta.shape())};  // beta: one value, its gradient the sum
  }
  const char* name() const override { return "SwishBackward"; }
};

}  // namespace

Tensor swish(const Tensor& x, const Tensor& beta) {
  KILN_CHECK(x.defined() && beta.defined(), "swish: an input is undefined");
  KILN_CHECK(kiln::is_floating(x.dtype()), "swish: expected an f32 or f64 tensor, got ", x.str());
  KILN_CHECK(beta.numel() == 1 && beta.dtype() == x.dtype() && beta.device() == x.device(),
             "swish: beta must be one element of x's dtype on x's device, got ", beta.str(),
             " for x ", x.str());
  Tensor y = forward_on_device(x, beta);
  if (kiln::any_requires_grad({&x, &beta})) {
    auto node = std::make_shared<SwishBackward>();
    node->saved = {x, beta};
    kiln::set_history(y, node, {x, beta});
  }
  return y;
}

Swish::Swish(double beta) {
  beta_ = register_parameter("beta", Tensor::full({1}, beta));
}

std::string Swish::extra_repr() const {
  std::ostringstream os;
  os << "beta=" << beta_.detach().to(kiln::Device()).item();
  return os.str();
}

}  // namespace swish_example
