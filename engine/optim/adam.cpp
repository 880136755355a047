// adam.cpp: Adam/AdamW step: bias corrections on the host, then per parameter one OpenMP loop
// over adam_update (see adam.h) on the CPU, or one fused kernel calling the same function on
// CUDA (engine/cuda/kernels/optim.cu).
#include "engine/optim/adam.h"

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/cuda/context.h"
#include "engine/dispatch.h"
#include "engine/error.h"
#include "engine/optim/optim_kernels.h"

namespace kiln {

Adam::Adam(std::vector<Tensor> params, double lr, double beta1, double beta2, double eps,
           double weight_decay, WeightDecayMode mode)
    : Optimizer(std::move(params), lr),
      beta1_(beta1),
      beta2_(beta2),
      eps_(eps),
      weight_decay_(weight_decay),
      mode_(mode) {
  KILN_CHECK_INPUT(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, name(),
                   ": betas must be in [0, 1), got (", beta1, ", ", beta2, ")");
  KILN_CHECK_INPUT(eps >= 0, name(), ": eps must be >= 0, got ", eps);
  KILN_CHECK_INPUT(weight_decay >= 0, name(), ": weight_decay must be >= 0, got ", weight_decay);
}

namespace cpu {

// p, g, m, v are (n).
template <typename T>
void adam_step(Backend, T* p, const T* g, T* m, T* v, int64_t n, T beta1, T beta2, T eps,
               T step_size, T bc2_sqrt, T decay, T wd_l2) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    adam_update<T>(p[i], g[i], m[i], v[i], beta1, beta2, eps, step_size, bc2_sqrt, decay, wd_l2);
}

template void adam_step<float>(Backend, float*, const float*, float*, float*, int64_t, float,
                               float, float, float, float, float, float);
template void adam_step<double>(Backend, double*, const double*, double*, double*, int64_t, double,
                                double, double, double, double, double, double);

}  // namespace cpu

void Adam::step() {
  NoGradGuard no_grad;
  const bool decoupled = mode_ == WeightDecayMode::Decoupled;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = grad_of(i);
    if (!g.defined()) continue;
    Tensor& p = params_[i];
    Tensor m = buffer(i, "exp_avg");
    Tensor v = buffer(i, "exp_avg_sq");
    const int64_t t = ++state_[i].step;
    const double bc1 = 1.0 - std::pow(beta1_, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(beta2_, static_cast<double>(t));
    const double step_size = lr_ / bc1;
    const double decay = decoupled ? 1.0 - lr_ * weight_decay_ : 1.0;
    const double wd_l2 = decoupled ? 0.0 : weight_decay_;
    run_kernel(name(), p.device(), p.dtype(), [&](auto backend, auto tag) {
      using T = typename decltype(tag)::type;
      adam_step(backend, p.data<T>(), g.data<T>(), m.data<T>(), v.data<T>(), p.numel(), T(beta1_),
                T(beta2_), T(eps_), T(step_size), T(std::sqrt(bc2)), T(decay), T(wd_l2));
    });
  }
  ++step_count_;
}

}  // namespace kiln
