// optim_device.h: what the per-parameter kernels of SGD and Adam (optim.cu) and their
// one-launch-per-step twins (optim_multi.cu) share, as __device__ functions, so that both
// paths run the same code and agree bit for bit: the per-step values of one parameter
// (optim_kernels.h), and the loop of one thread over its elements of one parameter.
//
// The loops take their pointers __restrict__ (p, g and the state never overlap), so the
// compiler may keep an element in a register between the rule's statements and contract
// a * b + c across them into one FMA (nvcc does; the simulator's build does likewise,
// cmake/KilnCuda.cmake). Where it contracts depends on what it knows around the code: inlined
// into two different kernels, the same rule was contracted differently (seen under the
// simulator: Adam's parameters an ulp apart). So the loops are __noinline__: compiled once, on
// their own, whichever kernel calls them; the cost is one call per thread and launch.
//
// The per-step values are in double, as the CPU twins compute them. The product is _rn (never
// contracted into an FMA with the subtraction) so that both round alike. pow is the one place where a GPU may differ
// from the host's libm: the CUDA C++ Programming Guide's table of double-precision functions
// gives it 2 ulp of maximum error
// (https://docs.nvidia.com/cuda/cuda-c-programming-guide/#double-precision-floating-point-functions);
// the simulator calls the host's.
#pragma once

#include "engine/cuda/runtime.h"

#include <cstdint>

#include "engine/cuda/kernels/common.h"
#include "engine/optim/adam.h"
#include "engine/optim/optim_kernels.h"
#include "engine/optim/sgd.h"

namespace kiln::cuda {

// ++*count unless skip (may be null) is set.
__device__ __forceinline__ void count_step_one(int64_t* count, const int32_t* skip) {
  if (!skip || *skip == 0) ++*count;
}

// coefs[kSgdLr] = *lr, coefs[kSgdFirstStep] = (*step == 0); then the step count advances.
__device__ __forceinline__ void sgd_prepare_one(const double* lr, int64_t* step,
                                                const int32_t* skip, double* coefs) {
  coefs[kSgdLr] = *lr;
  coefs[kSgdFirstStep] = *step == 0 ? 1.0 : 0.0;
  count_step_one(step, skip);
}

// The bias corrections of step t = *step + 1 and the decoupled decay; then the count advances.
__device__ __forceinline__ void adam_prepare_one(const double* lr, int64_t* step,
                                                 const int32_t* skip, double beta1, double beta2,
                                                 double decoupled_wd, double* coefs) {
  const double t = static_cast<double>(*step + 1);
  const double bc1 = 1.0 - pow(beta1, t);
  const double bc2 = 1.0 - pow(beta2, t);
  coefs[kAdamStepSize] = *lr / bc1;
  coefs[kAdamBc2Sqrt] = sqrt(bc2);
  coefs[kAdamDecay] = 1.0 - mul_rn(*lr, decoupled_wd);
  count_step_one(step, skip);
}

// Elements i = first, first + stride, ... below end of one parameter through sgd_update; buf is
// null when momentum == 0. coefs from sgd_prepare_one.
template <typename T>
__device__ __noinline__ void sgd_elements(T* __restrict__ p, const T* __restrict__ g,
                                             T* __restrict__ buf, int64_t first, int64_t end,
                                             int64_t stride, const double* coefs, T momentum,
                                             T dampening, T wd, bool nesterov) {
  const T lr = T(coefs[kSgdLr]);
  const bool first_step = coefs[kSgdFirstStep] != 0;
  for (int64_t i = first; i < end; i += stride) {
    T unused = T(0);
    T& b = buf ? buf[i] : unused;
    sgd_update<T>(p[i], g[i], b, lr, momentum, dampening, wd, nesterov, first_step);
  }
}

// The same through adam_update; m: exp_avg, v: exp_avg_sq; coefs from adam_prepare_one.
template <typename T>
__device__ __noinline__ void adam_elements(T* __restrict__ p, const T* __restrict__ g,
                                              T* __restrict__ m, T* __restrict__ v, int64_t first,
                                              int64_t end, int64_t stride, const double* coefs,
                                              T beta1, T beta2, T eps, T wd_l2) {
  const T step_size = T(coefs[kAdamStepSize]), bc2_sqrt = T(coefs[kAdamBc2Sqrt]);
  const T decay = T(coefs[kAdamDecay]);
  for (int64_t i = first; i < end; i += stride)
    adam_update<T>(p[i], g[i], m[i], v[i], beta1, beta2, eps, step_size, bc2_sqrt, decay, wd_l2);
}

}  // namespace kiln::cuda
