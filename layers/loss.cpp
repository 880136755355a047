#include "layers/loss.h"

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/ops.h"
#include "layers/loss_kernels.h"

namespace kiln {

namespace {

struct CrossEntropyBackward : Node {
  const char* name() const override { return "CrossEntropyBackward"; }
  std::vector<Tensor> apply(const Tensor& g) override {
    // saved = {probs (N, C), targets (N)}
    const Tensor& probs = saved[0];
    const Tensor& targets = saved[1];
    Tensor grad = Tensor::empty(probs.shape(), probs.dtype(), probs.device());
    switch (probs.device().type) {
      case DeviceType::CPU:
        dispatch_floating(probs.dtype(), "cross_entropy_backward", [&](auto tag) {
          using T = typename decltype(tag)::type;
          cpu::cross_entropy_backward<T>(probs.data<T>(), targets.data<int64_t>(),
                                         grad.data<T>(), probs.size(0), probs.size(1),
                                         static_cast<T>(g.item()));
        });
        break;
      case DeviceType::CUDA:
        throw Error("cross_entropy_backward: this build of Kiln has no CUDA backend");
    }
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
  double loss = 0;
  int64_t bad = -1;
  switch (logits.device().type) {
    case DeviceType::CPU:
      dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
        using T = typename decltype(tag)::type;
        loss = cpu::cross_entropy_forward<T>(logits.data<T>(), targets.data<int64_t>(),
                                             probs.data<T>(), n, c, &bad);
      });
      break;
    case DeviceType::CUDA:
      throw Error("cross_entropy: this build of Kiln has no CUDA backend");
  }
  KILN_CHECK_INPUT(bad < 0, "cross_entropy: target ", targets.to_vector<int64_t>()[bad],
                   " at row ", bad, " is outside [0, ", c, "): check the labels");
  Tensor out = Tensor::full({}, loss, logits.dtype(), logits.device());
  if (any_requires_grad({&logits})) {
    auto node = std::make_shared<CrossEntropyBackward>();
    node->saved = {probs, targets.detach()};
    set_history(out, node, {logits, targets});
  }
  return out;
}

Tensor mse_loss(const Tensor& a, const Tensor& b) {
  check_same_shape(a, b, "mse_loss");
  return mean(square(sub(a, b)));
}

}  // namespace kiln
