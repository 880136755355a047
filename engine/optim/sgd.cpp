// sgd.cpp: SGD's step: per parameter, sgd_prepare (the learning rate and whether this is the
// parameter's first step, read from memory) and one OpenMP loop over sgd_update (see sgd.h) on
// the CPU, or one fused kernel calling the same function on CUDA (engine/cuda/kernels/optim.cu).
#include "engine/optim/sgd.h"

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

void sgd_prepare(Backend backend, const double* lr, int64_t* step, const int32_t* skip,
                 double* coefs) {
  coefs[kSgdLr] = *lr;
  coefs[kSgdFirstStep] = *step == 0 ? 1.0 : 0.0;
  count_step(backend, step, skip);
}

// p, g, buf are (n); buf may be null when momentum == 0.
template <typename T>
void sgd_step(Backend, T* p, const T* g, T* buf, int64_t n, const double* coefs,
              const int32_t* skip, T momentum, T dampening, T wd, bool nesterov) {
  if (skip && *skip != 0) return;
  const T lr = T(coefs[kSgdLr]);
  const bool first_step = coefs[kSgdFirstStep] != 0;
  T unused = T(0);
#pragma omp parallel for schedule(static) firstprivate(unused)
  for (int64_t i = 0; i < n; ++i)
    sgd_update<T>(p[i], g[i], buf ? buf[i] : unused, lr, momentum, dampening, wd, nesterov,
                  first_step);
}

template void sgd_step<float>(Backend, float*, const float*, float*, int64_t, const double*,
                              const int32_t*, float, float, float, bool);
template void sgd_step<double>(Backend, double*, const double*, double*, int64_t, const double*,
                               const int32_t*, double, double, double, bool);

}  // namespace cpu

void SGD::update(size_t i, const Tensor& g, const int32_t* skip) {
  Tensor& p = params_[i];
  Tensor buf = momentum_ != 0 ? buffer(i, "momentum_buffer") : Tensor();
  Tensor coefs = coefficients(i, kSgdCoefs);
  on_device("SGD", p.device(), [&](auto backend) {
    sgd_prepare(backend, lr_on(p.device()), step_of(i), skip, coefs.data<double>());
  });
  run_kernel("SGD", p.device(), p.dtype(), [&](auto backend, auto tag) {
    using T = typename decltype(tag)::type;
    sgd_step(backend, p.data_any_format<T>(), g.data_any_format<T>(),
             buf.defined() ? buf.data_any_format<T>() : nullptr,
             p.numel(), coefs.data<double>(), skip, T(momentum_), T(dampening_), T(weight_decay_),
             nesterov_);
  });
}

// Every parameter in one sgd_prepare_multi and one sgd_step_multi launch (more when the
// tables overflow; multi_tensor.h). Buffers are created and coefficients allocated here as
// update() would, before the launches.
bool SGD::update_all(const std::vector<size_t>& indices, const std::vector<Tensor>& grads,
                     const int32_t* skip) {
  const Tensor& first = params_[indices[0]];
  std::vector<multi_tensor::PrepareArgs> prepare;
  std::vector<multi_tensor::TensorArgs> tensors;
  for (size_t k = 0; k < indices.size(); ++k) {
    const size_t i = indices[k];
    Tensor& p = params_[i];
    void* buf =
        momentum_ != 0 ? buffer(i, "momentum_buffer").raw_data_any_format() : nullptr;
    double* coefs = coefficients(i, kSgdCoefs).data<double>();
    prepare.push_back({step_of(i), coefs});
    tensors.push_back({p.raw_data_any_format(), grads[k].raw_data_any_format(), buf, nullptr,
                       coefs, p.numel()});
  }
  const double* lr = lr_on(first.device());
  run_kernel("SGD", first.device(), first.dtype(), [&](auto backend, auto tag) {
    if constexpr (std::is_same_v<decltype(backend), cuda::Backend>) {
      using T = typename decltype(tag)::type;
      sgd_prepare_multi(backend, prepare, lr, skip);
      sgd_step_multi(backend, tensors, skip, T(momentum_), T(dampening_), T(weight_decay_),
                     nesterov_);
    }
  });
  return true;
}

}  // namespace kiln
