// adadelta.cpp: Adadelta's step: per parameter, one OpenMP loop over adadelta_update on the CPU,
// or one fused kernel calling the same function on CUDA (engine/cuda/kernels/optim.cu), the
// learning rate read from memory; then the parameter's step count advances (count_step).
#include "engine/optim/adadelta.h"

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

Adadelta::Adadelta(std::vector<Tensor> params, double lr, double rho, double eps,
                   double weight_decay)
    : Optimizer(std::move(params), lr), rho_(rho), eps_(eps), weight_decay_(weight_decay) {
  KILN_CHECK_INPUT(rho >= 0 && rho <= 1, "Adadelta: rho must be in [0, 1], got ", rho);
  KILN_CHECK_INPUT(eps >= 0, "Adadelta: eps must be >= 0, got ", eps);
  KILN_CHECK_INPUT(weight_decay >= 0, "Adadelta: weight_decay must be >= 0, got ", weight_decay);
}

namespace cpu {

// p, g, s, a are (n).
template <typename T>
void adadelta_step(Backend, T* p, const T* g, T* s, T* a, int64_t n, const double* lr,
                   const int32_t* skip, T rho, T eps, T wd) {
  if (skip && *skip != 0) return;
  const T rate = T(*lr);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) adadelta_update<T>(p[i], g[i], s[i], a[i], rate, rho, eps, wd);
}

template void adadelta_step<float>(Backend, float*, const float*, float*, float*, int64_t,
                                   const double*, const int32_t*, float, float, float);
template void adadelta_step<double>(Backend, double*, const double*, double*, double*, int64_t,
                                    const double*, const int32_t*, double, double, double);

}  // namespace cpu

void Adadelta::update(size_t i, const Tensor& g, const int32_t* skip) {
  Tensor& p = params_[i];
  Tensor s = buffer(i, "square_avg");
  Tensor a = buffer(i, "acc_delta");
  const double* lr = lr_on(p.device());
  run_kernel("Adadelta", p.device(), p.dtype(), [&](auto backend, auto tag) {
    using T = typename decltype(tag)::type;
    adadelta_step(backend, p.data_any_format<T>(), g.data_any_format<T>(),
                  s.data_any_format<T>(), a.data_any_format<T>(), p.numel(), lr,
                  skip, T(rho_), T(eps_), T(weight_decay_));
    count_step(backend, step_of(i), skip);
  });
}

}  // namespace kiln
