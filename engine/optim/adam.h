// adam.h: Adam (Kingma & Ba, 2015) and AdamW (Loshchilov & Hutter, 2019), exactly as
// torch.optim.Adam / AdamW (no amsgrad). With t the parameter's step count (from 1):
//   Adam:  g = g + wd * p                      (L2 term folded into the gradient)
//   AdamW: p = p * (1 - lr * wd)               (decoupled decay, before the update)
//   m = b1 * m + (1 - b1) * g
//   v = b2 * v + (1 - b2) * g^2
//   p = p - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// Bias corrections are computed once per parameter and step, in double, by adam_prepare
// (optim_kernels.h) on the parameter's device from its step count there.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/optim/optimizer.h"

namespace kiln {

enum class WeightDecayMode { L2, Decoupled };

// The update of one element. step_size = lr / (1 - b1^t), bc2_sqrt = sqrt(1 - b2^t),
// decay = 1 - lr * wd for decoupled decay (1 otherwise), wd_l2 = wd for L2 (0 otherwise).
template <typename T>
KILN_HOST_DEVICE inline void adam_update(T& p, T g, T& m, T& v, T beta1, T beta2, T eps,
                                         T step_size, T bc2_sqrt, T decay, T wd_l2) {
  if (wd_l2 != T(0)) g += wd_l2 * p;
  p *= decay;
  m = beta1 * m + (T(1) - beta1) * g;
  v = beta2 * v + (T(1) - beta2) * g * g;
  T denom = std::sqrt(v) / bc2_sqrt + eps;
  p -= step_size * (m / denom);
}

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999,
       double eps = 1e-8, double weight_decay = 0, WeightDecayMode mode = WeightDecayMode::L2);
  const char* name() const override {
    return mode_ == WeightDecayMode::L2 ? "Adam" : "AdamW";
  }
  std::vector<std::string> buffer_names() const override { return {"exp_avg", "exp_avg_sq"}; }

 private:
  void update(size_t i, const Tensor& g, const int32_t* skip) override;
  bool update_all(const std::vector<size_t>& indices, const std::vector<Tensor>& grads,
                  const int32_t* skip) override;

  double beta1_, beta2_, eps_, weight_decay_;
  WeightDecayMode mode_;
};

// AdamW: Adam with decoupled weight decay; PyTorch's default decay of 0.01.
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999,
        double eps = 1e-8, double weight_decay = 1e-2)
      : Adam(std::move(params), lr, beta1, beta2, eps, weight_decay, WeightDecayMode::Decoupled) {}
};

}  // namespace kiln
