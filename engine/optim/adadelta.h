// adadelta.h: Adadelta (Zeiler, 2012), exactly as torch.optim.Adadelta:
//   g = g + wd * p
//   s = rho * s + (1 - rho) * g^2                 (square_avg)
//   d = sqrt(a + eps) / sqrt(s + eps) * g         (a = acc_delta, before its update)
//   a = rho * a + (1 - rho) * d^2
//   p = p - lr * d
// The default lr = 1.0 is the paper's (PyTorch's too); the MNIST recipe of Keras' and Horovod's examples uses it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/optim/optimizer.h"

namespace kiln {

// The update of one element. s: square_avg, a: acc_delta.
template <typename T>
KILN_HOST_DEVICE inline void adadelta_update(T& p, T g, T& s, T& a, T lr, T rho, T eps,
                                             T weight_decay) {
  if (weight_decay != T(0)) g += weight_decay * p;
  s = rho * s + (T(1) - rho) * g * g;
  T d = std::sqrt(a + eps) / std::sqrt(s + eps) * g;
  a = rho * a + (T(1) - rho) * d * d;
  p -= lr * d;
}

class Adadelta : public Optimizer {
 public:
  Adadelta(std::vector<Tensor> params, double lr = 1.0, double rho = 0.9, double eps = 1e-6,
           double weight_decay = 0);
  const char* name() const override { return "Adadelta"; }
  std::vector<std::string> buffer_names() const override { return {"square_avg", "acc_delta"}; }

 private:
  void update(size_t i, const Tensor& g, const int32_t* skip) override;

  double rho_, eps_, weight_decay_;
};

}  // namespace kiln
