// optim_cuda.h: the fused CUDA updates of the optimizers (engine/cuda/kernels/optim.cu).
//
// One kernel per parameter and step: each thread reads p, g and the state of one element,
// applies the very same per-element rule as the CPU loop (sgd_update / adam_update /
// adadelta_update, the KILN_HOST_DEVICE functions of sgd.h, adam.h, adadelta.h) and writes
// p and the state back: one pass over memory instead of the handful of elementwise ops an
// unfused update would launch. Arguments mirror the CPU loops in engine/optim/*.cpp; all
// pointers are device memory of the current device, every buffer has n elements, and the
// kernel is queued on cuda::current_stream().
#pragma once

#include <cstdint>

namespace kiln::cuda {

// buf may be null when momentum == 0.
template <typename T>
void sgd_step_cuda(T* p, const T* g, T* buf, int64_t n, T lr, T momentum, T dampening, T wd,
                   bool nesterov, bool first_step);

// m: exp_avg, v: exp_avg_sq; step_size, bc2_sqrt, decay, wd_l2 as in adam_update (adam.h).
template <typename T>
void adam_step_cuda(T* p, const T* g, T* m, T* v, int64_t n, T beta1, T beta2, T eps,
                    T step_size, T bc2_sqrt, T decay, T wd_l2);

// s: square_avg, a: acc_delta.
template <typename T>
void adadelta_step_cuda(T* p, const T* g, T* s, T* a, int64_t n, T lr, T rho, T eps, T wd);

}  // namespace kiln::cuda
