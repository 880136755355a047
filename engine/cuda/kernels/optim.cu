// optim.cu: fused optimizer updates on the GPU and their one-thread *_prepare kernels (declared
// in engine/optim/optim_kernels.h), and loss scaling's fused unscale-and-check (declared in
// engine/ops_cuda.h) and the loss-scale update (engine/optim/grad_scaler_kernels.h).
//
// Parallelisation: one thread per parameter element, 256 threads per block, a grid-stride loop
// beyond kMaxElementwiseBlocks blocks; one launch per parameter tensor. (SGD and Adam step all
// of a device's parameters in one launch instead when they can, optim_multi.cu; the loop of
// one thread is shared with it, optim_device.h.) Each thread loads the
// element's parameter, gradient and state, runs the optimizer's per-element rule, and stores
// the parameter and state: the whole update is one read and one write of each buffer. The
// learning rate and coefficients come from device memory (written by a *_prepare kernel queued
// just before), and a set skip flag makes every thread return at once.
// The rule is the same inline function the CPU loop calls (sgd_update in sgd.h, adam_update in
// adam.h, adadelta_update in adadelta.h, marked KILN_HOST_DEVICE), so the two devices cannot
// drift apart; results differ from the CPU only by rounding (nvcc fuses a * b + c into one
// FMA, and sqrt may differ by an ulp).
//
// unscale_and_check: the same grid-stride loop over one gradient, dividing by the scale (an f32
// value read from device memory, so a replayed graph uses the current one)
// (unscale_elem, engine/host_device.h: a division, so CPU and GPU agree bit for bit) and noting
// in a register whether any result was inf or NaN. After the loop each warp votes
// (__any_sync) and lane 0 of a warp that saw one sets the device flag with atomicOr: at most
// one atomic per warp, none when every gradient is finite (the common case). No shared memory,
// no barrier. The flag is the caller's: zeroed once, shared by every gradient of the device,
// read by the host once (engine/optim/grad_scaler.cpp).
#include "engine/cuda/runtime.h"

#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/kernels/optim_device.h"
#include "engine/cuda/launch.h"
#include "engine/optim/adadelta.h"
#include "engine/optim/adam.h"
#include "engine/optim/grad_scaler_kernels.h"
#include "engine/optim/optim_kernels.h"
#include "engine/optim/sgd.h"
#include "engine/ops_cuda.h"

namespace kiln::cuda {

namespace {

// The per-step values (one thread; optim_kernels.h): the rules of optim_device.h.
__global__ void count_step_kernel(int64_t* count, const int32_t* skip) {
  count_step_one(count, skip);
}

__global__ void sgd_prepare_kernel(const double* lr, int64_t* step, const int32_t* skip,
                                   double* coefs) {
  sgd_prepare_one(lr, step, skip, coefs);
}

__global__ void adam_prepare_kernel(const double* lr, int64_t* step, const int32_t* skip,
                                    double beta1, double beta2, double decoupled_wd,
                                    double* coefs) {
  adam_prepare_one(lr, step, skip, beta1, beta2, decoupled_wd, coefs);
}

// p, g, buf are (n); buf is null when momentum == 0. A set skip flag returns at once (every
// thread reads the same flag, so the whole grid does).
template <typename T>
__global__ void sgd_step_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ buf,
                                int64_t n, const double* coefs, const int32_t* skip, T momentum,
                                T dampening, T wd, bool nesterov) {
  if (skip && *skip != 0) return;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  sgd_elements<T>(p, g, buf, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, n,
                  stride, coefs, momentum, dampening, wd, nesterov);
}

// p, g, m, v are (n).
template <typename T>
__global__ void adam_step_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m,
                                 T* __restrict__ v, int64_t n, const double* coefs,
                                 const int32_t* skip, T beta1, T beta2, T eps, T wd_l2) {
  if (skip && *skip != 0) return;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  adam_elements<T>(p, g, m, v, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, n,
                   stride, coefs, beta1, beta2, eps, wd_l2);
}

// p, g, s, a are (n).
template <typename T>
__global__ void adadelta_step_kernel(T* __restrict__ p, const T* __restrict__ g,
                                     T* __restrict__ s, T* __restrict__ a, int64_t n,
                                     const double* lr, const int32_t* skip, T rho, T eps, T wd) {
  if (skip && *skip != 0) return;
  const T rate = T(*lr);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    adadelta_update<T>(p[i], g[i], s[i], a[i], rate, rho, eps, wd);
}

// g is (n); found_inf is one int32 of device memory.
template <typename T>
__global__ void unscale_and_check_kernel(T* __restrict__ g, int64_t n, const float* scale_in,
                                         int32_t* __restrict__ found_inf) {
  const T scale = T(*scale_in);
  bool bad = false;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    bad |= unscale_elem<T>(g[i], scale);
  // Every thread of the block reaches this vote (256 threads: whole warps, no early return).
  if (__any_sync(kFullMask, bad) && threadIdx.x % kWarpSize == 0) atomicOr(found_inf, 1);
}

// One step of the loss-scale rule (grad_scaler_kernels.h).
__global__ void update_scale_kernel(const int32_t* found_inf, ScaleState state, ScaleRule rule) {
  update_scale_state(*found_inf != 0, state, rule);
}

LaunchConfig optim_config(int64_t n) {
  return LaunchConfig{dim3(elementwise_blocks(n)), dim3(kElementwiseThreads), 0, current_stream()};
}

}  // namespace

LaunchConfig one_thread() { return LaunchConfig{dim3(1), dim3(1), 0, current_stream()}; }

void count_step(Backend, int64_t* count, const int32_t* skip) {
  launch(count_step_kernel, one_thread(), count, skip);
}

void sgd_prepare(Backend, const double* lr, int64_t* step, const int32_t* skip, double* coefs) {
  launch(sgd_prepare_kernel, one_thread(), lr, step, skip, coefs);
}

template <typename T>
void sgd_step(Backend, T* p, const T* g, T* buf, int64_t n, const double* coefs,
              const int32_t* skip, T momentum, T dampening, T wd, bool nesterov) {
  if (n == 0) return;
  launch(sgd_step_kernel<T>, optim_config(n), p, g, buf, n, coefs, skip, momentum, dampening, wd,
         nesterov);
}

void adam_prepare(Backend, const double* lr, int64_t* step, const int32_t* skip, double beta1,
                  double beta2, double decoupled_wd, double* coefs) {
  launch(adam_prepare_kernel, one_thread(), lr, step, skip, beta1, beta2, decoupled_wd, coefs);
}

template <typename T>
void adam_step(Backend, T* p, const T* g, T* m, T* v, int64_t n, const double* coefs,
               const int32_t* skip, T beta1, T beta2, T eps, T wd_l2) {
  if (n == 0) return;
  launch(adam_step_kernel<T>, optim_config(n), p, g, m, v, n, coefs, skip, beta1, beta2, eps,
         wd_l2);
}

template <typename T>
void adadelta_step(Backend, T* p, const T* g, T* s, T* a, int64_t n, const double* lr,
                   const int32_t* skip, T rho, T eps, T wd) {
  if (n == 0) return;
  launch(adadelta_step_kernel<T>, optim_config(n), p, g, s, a, n, lr, skip, rho, eps, wd);
}

void update_scale(Backend, const int32_t* found_inf, ScaleState state, ScaleRule rule) {
  launch(update_scale_kernel, one_thread(), found_inf, state, rule);
}

template <typename T>
void unscale_and_check(Backend, T* g, int64_t n, const float* scale, int32_t* found_inf) {
  if (n == 0) return;
  launch(unscale_and_check_kernel<T>, optim_config(n), g, n, scale, found_inf);
}

#define KILN_INSTANTIATE(T)                                                                   \
  template void sgd_step<T>(Backend, T*, const T*, T*, int64_t, const double*, const int32_t*, \
                            T, T, T, bool);                                                   \
  template void adam_step<T>(Backend, T*, const T*, T*, T*, int64_t, const double*,           \
                             const int32_t*, T, T, T, T);                                     \
  template void adadelta_step<T>(Backend, T*, const T*, T*, T*, int64_t, const double*,       \
                                 const int32_t*, T, T, T);                                    \
  template void unscale_and_check<T>(Backend, T*, int64_t, const float*, int32_t*);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(double)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
