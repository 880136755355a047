// adam.cpp: Adam/AdamW step: per parameter, adam_prepare (the bias corrections of the
// parameter's next step, from its step count and the learning rate in memory), then one OpenMP
// loop over adam_update (see adam.h) on the CPU, or one fused kernel calling the same function
// on CUDA (engine/cuda/kernels/optim.cu).
#include "engine/optim/adam.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/cuda/context.h"
#include "engine/dispatch.h"
#include "engine/error.h"
#include "engine/optim/multi_tensor.h"
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

void adam_prepare(Backend backend, const double* lr, int64_t* step, const int32_t* skip,
                  double beta1, double beta2, double decoupled_wd, double* coefs) {
  const double t = static_cast<double>(*step + 1);
  const double bc1 = 1.0 - std::pow(beta1, t);
  const double bc2 = 1.0 - std::pow(beta2, t);
  coefs[kAdamStepSize] = *lr / bc1;
  coefs[kAdamBc2Sqrt] = std::sqrt(bc2);
  coefs[kAdamDecay] = 1.0 - *lr * decoupled_wd;
  count_step(backend, step, skip);
}

// p, g, m, v are (n).
template <typename T>
void adam_step(Backend, T* p, const T* g, T* m, T* v, int64_t n, const double* coefs,
               const int32_t* skip, T beta1, T beta2, T eps, T wd_l2) {
  if (skip && *skip != 0) return;
  const T step_size = T(coefs[kAdamStepSize]), bc2_sqrt = T(coefs[kAdamBc2Sqrt]);
  const T decay = T(coefs[kAdamDecay]);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    adam_update<T>(p[i], g[i], m[i], v[i], beta1, beta2, eps, step_size, bc2_sqrt, decay, wd_l2);
}

template void adam_step<float>(Backend, float*, const float*, float*, float*, int64_t,
                               const double*, const int32_t*, float, float, float, float);
template void adam_step<double>(Backend, double*, const double*, double*, double*, int64_t,
                                const double*, const int32_t*, double, double, double, double);

}  // namespace cpu

void Adam::update(size_t i, const Tensor& g, const int32_t* skip) {
  const bool decoupled = mode_ == WeightDecayMode::Decoupled;
  Tensor& p = params_[i];
  Tensor m = buffer(i, "exp_avg");
  Tensor v = buffer(i, "exp_avg_sq");
  Tensor coefs = coefficients(i, kAdamCoefs);
  on_device(name(), p.device(), [&](auto backend) {
    adam_prepare(backend, lr_on(p.device()), step_of(i), skip, beta1_, beta2_,
                 decoupled ? weight_decay_ : 0.0, coefs.data<double>());
  });
  const double wd_l2 = decoupled ? 0.0 : weight_decay_;
  run_kernel(name(), p.device(), p.dtype(), [&](auto backend, auto tag) {
    using T = typename decltype(tag)::type;
    adam_step(backend, p.data_any_format<T>(), g.data_any_format<T>(),
              m.data_any_format<T>(), v.data_any_format<T>(), p.numel(),
              coefs.data<double>(), skip, T(beta1_), T(beta2_), T(eps_), T(wd_l2));
  });
}

// Every parameter in one adam_prepare_multi and one adam_step_multi launch (more when the
// tables overflow; multi_tensor.h). Buffers are created and coefficients allocated here as
// update() would, before the launches.
bool Adam::update_all(const std::vector<size_t>& indices, const std::vector<Tensor>& grads,
                      const int32_t* skip) {
  const bool decoupled = mode_ == WeightDecayMode::Decoupled;
  const Tensor& first = params_[indices[0]];
  std::vector<multi_tensor::PrepareArgs> prepare;
  std::vector<multi_tensor::TensorArgs> tensors;
  for (size_t k = 0; k < indices.size(); ++k) {
    const size_t i = indices[k];
    Tensor& p = params_[i];
    void* m = buffer(i, "exp_avg").raw_data_any_format();
    void* v = buffer(i, "exp_avg_sq").raw_data_any_format();
    double* coefs = coefficients(i, kAdamCoefs).data<double>();
    prepare.push_back({step_of(i), coefs});
    tensors.push_back({p.raw_data_any_format(), grads[k].raw_data_any_format(), m, v, coefs,
                       p.numel()});
  }
  const double* lr = lr_on(first.device());
  const double wd_l2 = decoupled ? 0.0 : weight_decay_;
  run_kernel(name(), first.device(), first.dtype(), [&](auto backend, auto tag) {
    if constexpr (std::is_same_v<decltype(backend), cuda::Backend>) {
      using T = typename decltype(tag)::type;
      adam_prepare_multi(backend, prepare, lr, skip, beta1_, beta2_,
                         decoupled ? weight_decay_ : 0.0);
      adam_step_multi(backend, tensors, skip, T(beta1_), T(beta2_), T(eps_), T(wd_l2));
    }
  });
  return true;
}

}  // namespace kiln
