// loss.cpp: the loss ops and their autograd nodes. Kernels: loss_cpu.cpp (CPU cross-entropy),
// loss_cuda.cu (CUDA cross-entropy and the fused CUDA mean squared error).
#include "layers/loss.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/error.h"
#include "engine/ops.h"
#include "layers/loss_kernels.h"

namespace kiln {

namespace {

// The incoming gradient of a scalar loss as the CUDA kernels read it: a device scalar of the
// loss's dtype on the loss's device (converted only when the caller seeded backward otherwise).
Tensor scalar_grad_like(const Tensor& g, const Tensor& like) {
  Tensor s = g;
  if (s.dtype() != like.dtype()) s = s.to(like.dtype());
  if (s.device() != like.device()) s = s.to(like.device());
  return s;
}

struct CrossEntropyBackward : Node {
  const char* name() const override { return "CrossEntropyBackward"; }
  std::vector<Tensor> apply(const Tensor& g) override {
    // saved = {probs (N, C), targets (N)}
    const Tensor& probs = saved[0];
    const Tensor& targets = saved[1];
    Tensor grad = Tensor::empty(probs.shape(), probs.dtype(), probs.device());
    on_device("cross_entropy_backward", probs.device(), [&] {
      dispatch_floating(probs.dtype(), "cross_entropy_backward", [&](auto tag) {
        using T = typename decltype(tag)::type;
        cpu::cross_entropy_backward<T>(probs.data<T>(), targets.data<int64_t>(), grad.data<T>(),
                                       probs.size(0), probs.size(1), static_cast<T>(g.item()));
      });
    }, [&] {
      const Tensor gl = scalar_grad_like(g, probs);
      dispatch_floating(probs.dtype(), "cross_entropy_backward", [&](auto tag) {
        using T = typename decltype(tag)::type;
        cuda::cross_entropy_backward_cuda<T>(probs.data<T>(), targets.data<int64_t>(),
                                             grad.data<T>(), probs.size(0), probs.size(1),
                                             gl.data<T>());
      });
    });
    return {grad, Tensor()};
  }
};

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets) {
  KILN_CHECK(logits.dim() == 2, "cross_entropy: logits must be (N, C), got ",
             shape_str(logits.shape()));
  KILN_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0) &&
                 targets.dtype() == DType::I64,
             "cross_entropy: targets must be i64 (N) = (", logits.size(0), "), got ",
             targets.str());
  check_same_device(logits, targets, "cross_entropy");
  int64_t n = logits.size(0), c = logits.size(1);
  Tensor probs = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  Tensor out;  // the loss, a scalar
  int64_t bad = -1;
  on_device("cross_entropy", logits.device(), [&] {
    double loss = 0;
    dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
      using T = typename decltype(tag)::type;
      loss = cpu::cross_entropy_forward<T>(logits.data<T>(), targets.data<int64_t>(),
                                           probs.data<T>(), n, c, &bad);
    });
    out = Tensor::full({}, loss, logits.dtype(), logits.device());
  }, [&] {
    // The loss is computed and kept on the device; only the first bad row (or -1) comes
    // back, so that a bad label throws here as on the CPU (see loss_cuda.cu for why).
    out = Tensor::empty({}, logits.dtype(), logits.device());
    Tensor bad_row = Tensor::empty({1}, DType::I64, logits.device());
    Tensor row_loss = Tensor::empty({n}, DType::F64, logits.device());  // workspace
    dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
      using T = typename decltype(tag)::type;
      cuda::cross_entropy_forward_cuda<T>(logits.data<T>(), targets.data<int64_t>(),
                                          probs.data<T>(), out.data<T>(), bad_row.data<int64_t>(),
                                          row_loss.data<double>(), n, c);
    });
    bad = static_cast<int64_t>(bad_row.item());  // waits for the kernels
  });
  KILN_CHECK_INPUT(bad < 0, "cross_entropy: target ", targets.to_vector<int64_t>()[bad],
                   " at row ", bad, " is outside [0, ", c, "): check the labels");
  if (any_requires_grad({&logits})) {
    auto node = std::make_shared<CrossEntropyBackward>();
    node->saved = {probs, targets.detach()};
    set_history(out, node, {logits, targets});
  }
  return out;
}

namespace {

// The fused CUDA mean squared error: one reduction in double instead of sub, square and mean
// (two (n) temporaries and three kernels), and one element-wise backward kernel.
struct MseLossBackward : Node {
  const char* name() const override { return "MseLossBackward"; }
  std::vector<Tensor> apply(const Tensor& g) override {
    const Tensor& a = saved[0];
    const Tensor& b = saved[1];
    KILN_CHECK(a.device().is_cuda(), "MseLossBackward: expected CUDA tensors, got ", a.str(),
               " (the CPU mse_loss composes sub, square and mean)");
    cuda::DeviceGuard guard(a.device().index);
    const Tensor gl = scalar_grad_like(g, a);
    Tensor ga, gb;  // only those an input needs (next[i] is null otherwise)
    if (next[0]) ga = Tensor::empty(a.shape(), a.dtype(), a.device());
    if (next[1]) gb = Tensor::empty(b.shape(), b.dtype(), b.device());
    dispatch_floating(a.dtype(), "mse_loss_backward", [&](auto tag) {
      using T = typename decltype(tag)::type;
      auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
      cuda::mse_loss_backward_cuda<T>(a.data<T>(), b.data<T>(), gl.data<T>(), ptr(ga), ptr(gb),
                                      a.numel());
    });
    return {ga, gb};
  }
};

Tensor mse_loss_cuda(const Tensor& a, const Tensor& b) {
  check_same_device(a, b, "mse_loss");
  check_same_dtype(a, b, "mse_loss");
  KILN_CHECK(is_floating(a.dtype()), "mse_loss: expected f32 or f64 tensors, got ", a.str());
  cuda::DeviceGuard guard(a.device().index);
  const int64_t n = a.numel();
  Tensor out = Tensor::empty({}, a.dtype(), a.device());
  Tensor partials =
      Tensor::empty({cuda::mse_loss_workspace_size(n)}, DType::F64, a.device());  // workspace
  dispatch_floating(a.dtype(), "mse_loss", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda::mse_loss_forward_cuda<T>(a.data<T>(), b.data<T>(), out.data<T>(),
                                   partials.data<double>(), n);
  });
  if (any_requires_grad({&a, &b})) {
    auto node = std::make_shared<MseLossBackward>();
    node->saved = {a.detach(), b.detach()};
    set_history(out, node, {a, b});
  }
  return out;
}

}  // namespace

Tensor mse_loss(const Tensor& a, const Tensor& b) {
  check_same_shape(a, b, "mse_loss");
  // A build without a CUDA backend has no fused kernel: sub() says so for CUDA tensors.
  if constexpr (kWithCuda) {
    if (a.device().is_cuda() || b.device().is_cuda()) return mse_loss_cuda(a, b);
  }
  return mean(square(sub(a, b)));
}

}  // namespace kiln
