// sgd.h: stochastic gradient descent with momentum, dampening, Nesterov and weight decay,
// with exactly PyTorch's semantics (torch.optim.SGD):
//   d = g + wd * p                                  (weight decay as an L2 term)
//   b = d                            on the first step with momentum
//   b = momentum * b + (1 - dampening) * d          afterwards
//   d = d + momentum * b  (Nesterov)  or  d = b     (classical)
//   p = p - lr * d
// Note PyTorch's convention: the learning rate multiplies the whole buffer, and dampening is
// not applied on the first step. "The first step" is the parameter's step count being 0 when
// the step runs (read from memory by sgd_prepare, so a skipped step does not count).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/optim/optimizer.h"

namespace kiln {

// The update of one element, shared by the CPU loop and the CUDA kernel (cuda/kernels/optim.cu).
// p: parameter, g: gradient, buf: momentum buffer (unused if momentum == 0).
template <typename T>
KILN_HOST_DEVICE inline void sgd_update(T& p, T g, T& buf, T lr, T momentum, T dampening,
                                        T weight_decay, bool nesterov, bool first_step) {
  T d = g;
  if (weight_decay != T(0)) d += weight_decay * p;
  if (momentum != T(0)) {
    buf = first_step ? d : momentum * buf + (T(1) - dampening) * d;
    d = nesterov ? d + momentum * buf : buf;
  }
  p -= lr * d;
}

class SGD : public Optimizer {
 public:
  // Nesterov needs momentum > 0 and dampening == 0 (as in PyTorch).
  SGD(std::vector<Tensor> params, double lr, double momentum = 0, double dampening = 0,
      double weight_decay = 0, bool nesterov = false);
  const char* name() const override { return "SGD"; }
  std::vector<std::string> buffer_names() const override { return {"momentum_buffer"}; }

  double momentum() const { return momentum_; }

 private:
  void update(size_t i, const Tensor& g, const int32_t* skip) override;
  bool update_all(const std::vector<size_t>& indices, const std::vector<Tensor>& grads,
                  const int32_t* skip) override;

  double momentum_, dampening_, weight_decay_;
  bool nesterov_;
};

}  // namespace kiln
