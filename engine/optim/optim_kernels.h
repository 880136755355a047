// optim_kernels.h: the fused updates of the optimizers, a CPU loop and a CUDA kernel of one name
// and signature each (engine/dispatch.h): cpu:: in engine/optim/{sgd,adam,adadelta}.cpp beside
// the step that calls it, cuda:: in engine/cuda/kernels/optim.cu.
//
// One pass per parameter and step: each element's p, g and state are read, the optimizer's
// per-element rule applied (sgd_update / adam_update / adadelta_update, the KILN_HOST_DEVICE
// functions of sgd.h, adam.h, adadelta.h: the very same code on both devices), and p and the
// state written back: one pass over memory instead of the handful of elementwise ops an unfused
// update would launch. Every buffer has n elements. The CUDA twins take device pointers of the
// current device and queue the kernel on cuda::current_stream().
#pragma once

#include <cstdint>

#include "engine/backend.h"

namespace kiln {

namespace cpu {

// buf may be null when momentum == 0.
template <typename T>
void sgd_step(Backend, T* p, const T* g, T* buf, int64_t n, T lr, T momentum, T dampening, T wd,
              bool nesterov, bool first_step);

// m: exp_avg, v: exp_avg_sq; step_size, bc2_sqrt, decay, wd_l2 as in adam_update (adam.h).
template <typename T>
void adam_step(Backend, T* p, const T* g, T* m, T* v, int64_t n, T beta1, T beta2, T eps,
               T step_size, T bc2_sqrt, T decay, T wd_l2);

// s: square_avg, a: acc_delta.
template <typename T>
void adadelta_step(Backend, T* p, const T* g, T* s, T* a, int64_t n, T lr, T rho, T eps, T wd);

}  // namespace cpu

namespace cuda {

template <typename T>
void sgd_step(Backend, T* p, const T* g, T* buf, int64_t n, T lr, T momentum, T dampening, T wd,
              bool nesterov, bool first_step);
template <typename T>
void adam_step(Backend, T* p, const T* g, T* m, T* v, int64_t n, T beta1, T beta2, T eps,
               T step_size, T bc2_sqrt, T decay, T wd_l2);
template <typename T>
void adadelta_step(Backend, T* p, const T* g, T* s, T* a, int64_t n, T lr, T rho, T eps, T wd);

}  // namespace cuda

}  // namespace kiln
