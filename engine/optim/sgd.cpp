// sgd.cpp: SGD's step: per parameter, one OpenMP loop over sgd_update (see sgd.h) on the CPU,
// or one fused kernel calling the same function on CUDA (engine/cuda/kernels/optim.cu).
#include "engine/optim/sgd.h"

#include <cmath>
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

SGD::SGD(std::vector<Tensor> params, double lr, double momentum, double dampening,
         double weight_decay, bool nesterov)
    : Optimizer(std::move(params), lr),
      momentum_(momentum),
      dampening_(dampening),
      weight_decay_(weight_decay),
      nesterov_(nesterov) {
  KILN_CHECK_INPUT(momentum >= 0, "SGD: momentum must be >= 0, got ", momentum);
  KILN_CHECK_INPUT(weight_decay >= 0, "SGD: weight_decay must be >= 0, got ", weight_decay);
  KILN_CHECK_INPUT(!nesterov || (momentum > 0 && dampening == 0),
                   "SGD: Nesterov momentum needs momentum > 0 and dampening == 0, got momentum ",
                   momentum, ", dampening ", dampening);
}

namespace cpu {

// p, g, buf are (n); buf may be null when momentum == 0.
template <typename T>
void sgd_step(Backend, T* p, const T* g, T* buf, int64_t n, T lr, T momentum, T dampening, T wd,
              bool nesterov, bool first_step) {
  T unused = T(0);
#pragma omp parallel for schedule(static) firstprivate(unused)
  for (int64_t i = 0; i < n; ++i)
    sgd_update<T>(p[i], g[i], buf ? buf[i] : unused, lr, momentum, dampening, wd, nesterov,
                  first_step);
}

template void sgd_step<float>(Backend, float*, const float*, float*, int64_t, float, float, float,
                              float, bool, bool);
template void sgd_step<double>(Backend, double*, const double*, double*, int64_t, double, double,
                               double, double, bool, bool);

}  // namespace cpu

void SGD::step() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = grad_of(i);
    if (!g.defined()) continue;
    Tensor& p = params_[i];
    bool first = false;
    Tensor buf = momentum_ != 0 ? buffer(i, "momentum_buffer", &first) : Tensor();
    run_kernel("SGD", p.device(), p.dtype(), [&](auto backend, auto tag) {
      using T = typename decltype(tag)::type;
      sgd_step(backend, p.data<T>(), g.data<T>(), buf.defined() ? buf.data<T>() : nullptr,
               p.numel(), T(lr_), T(momentum_), T(dampening_), T(weight_decay_), nesterov_, first);
    });
    ++state_[i].step;
  }
  ++step_count_;
}

}  // namespace kiln
