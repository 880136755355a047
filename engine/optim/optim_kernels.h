// optim_kernels.h: the fused updates of the optimizers, a CPU loop and a CUDA kernel of one name
// and signature each (engine/dispatch.h): cpu:: in engine/optim/{sgd,adam,adadelta}.cpp and
// optimizer.cpp beside the step that calls it, cuda:: in engine/cuda/kernels/optim.cu.
//
// One pass per parameter and step: each element's p, g and state are read, the optimizer's
// per-element rule applied (sgd_update / adam_update / adadelta_update, the KILN_HOST_DEVICE
// functions of sgd.h, adam.h, adadelta.h: the very same code on both devices), and p and the
// state written back: one pass over memory instead of the handful of elementwise ops an unfused
// update would launch. Every buffer has n elements. The CUDA twins take device pointers of the
// current device and queue the kernel on cuda::current_stream().
//
// Values that change from step to step are read from memory of the parameter's device when the
// kernel runs, never passed by value: the learning rate, the parameter's step count, the
// coefficients derived from them, and `skip`, a flag that makes the step leave everything
// unchanged (loss scaling's found_inf, engine/optim/grad_scaler.h). A step captured into a CUDA
// graph and replayed then uses the values of the replay, not those of the capture. Each
// parameter's step is two launches: a one-thread *_prepare that advances the parameter's step
// count (unless skipped) and writes the coefficients in double, as the host computed them
// before, then the fused update, which reads them and casts them to T.
#pragma once

#include <cstdint>

#include "engine/backend.h"

namespace kiln {

// Coefficient slots of the *_prepare functions (doubles in memory of the parameter's device).
inline constexpr int kSgdLr = 0, kSgdFirstStep = 1, kSgdCoefs = 2;
inline constexpr int kAdamStepSize = 0, kAdamBc2Sqrt = 1, kAdamDecay = 2, kAdamCoefs = 3;

namespace cpu {

// ++*count unless skip (may be null) is nonzero.
void count_step(Backend, int64_t* count, const int32_t* skip);

// coefs[kSgdLr] = *lr, coefs[kSgdFirstStep] = (*step == 0); then count_step(step, skip).
void sgd_prepare(Backend, const double* lr, int64_t* step, const int32_t* skip, double* coefs);
// buf may be null when momentum == 0. coefs from sgd_prepare. Nothing changes when *skip != 0.
template <typename T>
void sgd_step(Backend, T* p, const T* g, T* buf, int64_t n, const double* coefs,
              const int32_t* skip, T momentum, T dampening, T wd, bool nesterov);

// With t = *step + 1 (the step this update makes): coefs[kAdamStepSize] = lr / (1 - beta1^t),
// coefs[kAdamBc2Sqrt] = sqrt(1 - beta2^t), coefs[kAdamDecay] = 1 - lr * decoupled_wd; then
// count_step(step, skip).
void adam_prepare(Backend, const double* lr, int64_t* step, const int32_t* skip, double beta1,
                  double beta2, double decoupled_wd, double* coefs);
// m: exp_avg, v: exp_avg_sq; coefs from adam_prepare; wd_l2 as in adam_update (adam.h).
template <typename T>
void adam_step(Backend, T* p, const T* g, T* m, T* v, int64_t n, const double* coefs,
               const int32_t* skip, T beta1, T beta2, T eps, T wd_l2);

// s: square_avg, a: acc_delta; lr read from memory. The step count advances by count_step.
template <typename T>
void adadelta_step(Backend, T* p, const T* g, T* s, T* a, int64_t n, const double* lr,
                   const int32_t* skip, T rho, T eps, T wd);

}  // namespace cpu

namespace cuda {

void count_step(Backend, int64_t* count, const int32_t* skip);
void sgd_prepare(Backend, const double* lr, int64_t* step, const int32_t* skip, double* coefs);
template <typename T>
void sgd_step(Backend, T* p, const T* g, T* buf, int64_t n, const double* coefs,
              const int32_t* skip, T momentum, T dampening, T wd, bool nesterov);
void adam_prepare(Backend, const double* lr, int64_t* step, const int32_t* skip, double beta1,
                  double beta2, double decoupled_wd, double* coefs);
template <typename T>
void adam_step(Backend, T* p, const T* g, T* m, T* v, int64_t n, const double* coefs,
               const int32_t* skip, T beta1, T beta2, T eps, T wd_l2);
template <typename T>
void adadelta_step(Backend, T* p, const T* g, T* s, T* a, int64_t n, const double* lr,
                   const int32_t* skip, T rho, T eps, T wd);

}  // namespace cuda

}  // namespace kiln
