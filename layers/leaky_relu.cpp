// leaky_relu.cpp: the leaky_relu op (checks, device dispatch, autograd node) and the LeakyReLU
// module. The kernels are in leaky_relu_cpu.cpp and leaky_relu_cuda.cu.
#include "layers/leaky_relu.h"

#include <cmath>
#include <memory>
#include <sstream>
#include <vector>

#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/error.h"
#include "layers/leaky_relu_kernels.h"

namespace kiln {

namespace {

void check_slope(double negative_slope) {
  if (!std::isfinite(negative_slope))
    throw Error(detail::str("leaky_relu: negative_slope must be a finite number, got ",
                            negative_slope),
                ErrorKind::Usage);
}

// Backward needs the input's sign, so the node saves x (a detached alias, not a copy).
struct LeakyReluBackward : Node {
  double negative_slope = 0;
  const char* name() const override { return "LeakyReluBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    const Tensor& x = saved[0];
    check_same_device(x, grad_out, "leaky_relu_backward");
    Tensor gx = Tensor::empty(x.shape(), x.dtype(), x.device());
    run_kernel("leaky_relu_backward", x.device(), x.dtype(), [&](auto backend, auto tag) {
      using T = typename decltype(tag)::type;
      leaky_relu_backward(backend, x.data<T>(), grad_out.data<T>(), gx.data<T>(), x.numel(),
                          T(negative_slope));
    });
    return {gx};
  }
};

}  // namespace

Tensor leaky_relu(const Tensor& x, double negative_slope) {
  check_slope(negative_slope);
  KILN_CHECK(x.defined(), "leaky_relu: the input is undefined");
  KILN_CHECK(is_floating(x.dtype()), "leaky_relu: expected an f32 or f64 tensor, got ", x.str());
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  run_kernel("leaky_relu", x.device(), x.dtype(), [&](auto backend, auto tag) {
    using T = typename decltype(tag)::type;
    leaky_relu_forward(backend, x.data<T>(), y.data<T>(), x.numel(), T(negative_slope));
  });
  if (any_requires_grad({&x})) {
    auto node = std::make_shared<LeakyReluBackward>();
    node->negative_slope = negative_slope;
    node->saved = {x.detach()};
    set_history(y, node, {x});
  }
  return y;
}

LeakyReLU::LeakyReLU(double negative_slope) : negative_slope_(negative_slope) {
  check_slope(negative_slope);
}

Tensor LeakyReLU::forward(const Tensor& x) { return leaky_relu(x, negative_slope_); }

std::string LeakyReLU::extra_repr() const {
  std::ostringstream os;
  os << "negative_slope=" << negative_slope_;
  return os.str();
}

}  // namespace kiln
