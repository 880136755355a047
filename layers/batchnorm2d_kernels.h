// batchnorm2d_kernels.h: the CPU (and CUDA) kernels behind layers/batchnorm2d.h (internal to
// kiln_layers).
//
// Layout: x is (N, C, HW) with HW = H * W, i.e. NCHW with the plane flattened. Channel c owns
// the N strided slabs x[n][c][0..HW); M = N * HW values are normalised together. The kernels
// run OpenMP over channels (each channel's statistics are reduced by one thread, in a fixed
// order: deterministic, whatever the thread count), and accumulate in double.
//
//   mean   = sum(x) / M,  var = sum((x - mean)^2) / M  (biased: what the forward divides by)
//   invstd = 1 / sqrt(var + eps)
//   y      = (x - mean) * invstd * weight + bias
// Backward, with xhat = (x - mean) * invstd:
//   grad_bias   = sum(grad_y)
//   grad_weight = sum(grad_y * xhat)
//   training:   grad_x = weight * invstd * (grad_y - grad_bias / M - xhat * grad_weight / M)
//               (mean and invstd depend on x: the full formula)
//   eval:       grad_x = weight * invstd * grad_y     (running statistics are constants)
// Fused ReLU (ResNet's BN -> ReLU pairs): the forward writes max(y, 0) instead of y, and the
// backward reads grad_y as 0 wherever y <= 0 (the ReLU's gradient) before the formulas above.
// The CPU backward recomputes y from x (see bn_affine); the CUDA one is given the output as
// relu_y. One pass over memory fewer each way than BN then ReLU, one tensor fewer.
#pragma once

#include <cmath>
#include <cstdint>

#include "engine/backend.h"
#include "engine/dtype.h"
#include "engine/host_device.h"

namespace kiln {

enum class BatchNormMode { Train, Eval };

}  // namespace kiln

namespace kiln::cpu {

// The forward's per-channel affine map y = x * scale + shift, defined once. The CPU backward of
// a fused ReLU recomputes its mask, y > 0, from x with it instead of reading the output back:
// two passes over memory fewer. bn_apply() makes the rounding explicit (one fused multiply-add
// where the CPU has FMA, which the compiler may not contract differently in two places), so
// the mask is bit for bit the forward's.
template <typename T>
struct BnAffine {
  T scale, shift;
};
template <typename T>
inline BnAffine<T> bn_affine(const T* mean, const T* invstd, const T* weight, const T* bias,
                             int64_t ch) {
  const T scale = invstd[ch] * (weight ? weight[ch] : T(1));
  return {scale, (bias ? bias[ch] : T(0)) - mean[ch] * scale};
}
template <typename T>
inline T bn_apply(T x, T scale, T shift) {
#if defined(__FMA__)
  return std::fma(x, scale, shift);
#else
  return x * scale + shift;  // no FMA unit: nothing to contract, one rounding order
#endif
}

// The gradient reaching the normalisation: grad_y, or 0 where the fused ReLU cut it (its
// input x * scale + shift was not positive). Relu is a template argument so the loops that
// call it vectorise.
template <bool Relu, typename T>
inline T relu_masked(T grad_y, T x, T scale, T shift) {
  if constexpr (Relu) return bn_apply(x, scale, shift) > T(0) ? grad_y : T(0);
  return grad_y;
}

// x is (N, C, HW); mean and var are (C), written: the batch mean and biased variance.
template <typename T>
void batch_norm2d_stats(Backend, const T* x, compute_t<T>* mean, compute_t<T>* var, int64_t n,
                        int64_t c, int64_t hw);

// var, invstd are (C): invstd = 1 / sqrt(var + eps). P is the per-channel type (f32 for 16-bit
// activations), as for the next one.
template <typename P>
void batch_norm2d_invstd(Backend, const P* var, P* invstd, int64_t c, double eps);

// mean, var (biased, over m values), running_mean, running_var are (C); the running
// statistics move towards the batch's by `momentum`, the variance made unbiased (m / (m - 1)).
template <typename P>
void batch_norm2d_update_running(Backend, const P* mean, const P* var, P* running_mean,
                                 P* running_var, int64_t c, int64_t m, double momentum);

// x, y are (N, C, HW); mean, invstd are (C); weight, bias are (C) or null (no affine: 1, 0).
// relu: y = max(y, 0).
template <typename T>
void batch_norm2d_forward(Backend, const T* x, const compute_t<T>* mean,
                          const compute_t<T>* invstd, const compute_t<T>* weight,
                          const compute_t<T>* bias, T* y, int64_t n, int64_t c, int64_t hw,
                          bool relu);

// grad_y, x are (N, C, HW); mean, invstd, weight are (C) (weight null: 1). Outputs may each
// be null when that gradient is not needed: grad_x (N, C, HW), grad_weight (C), grad_bias (C).
// relu: the forward had a fused ReLU, whose mask (output > 0) each twin finds its own way:
// this one recomputes it from x with bias ((C) or null, as in the forward; see bn_affine) and
// ignores relu_y; the CUDA one reads relu_y, the forward's output. coef: the CUDA twin's
// workspace (below); null here.
template <typename T>
void batch_norm2d_backward(Backend, BatchNormMode mode, const T* grad_y, const T* x,
                           const compute_t<T>* mean, const compute_t<T>* invstd,
                           const compute_t<T>* weight, const compute_t<T>* bias, bool relu,
                           const T* relu_y, T* grad_x, compute_t<T>* grad_weight,
                           compute_t<T>* grad_bias, compute_t<T>* coef, int64_t n, int64_t c,
                           int64_t hw);

// The same three kernels for x, y, grad_y, grad_x in the channel-blocked layout of
// layers/layout.h, (N, C/16, HW, 16); c is the number of channels (a multiple of 16).
// Definitions: layers/batchnorm2d_blocked_cpu.cpp. CPU only: the op unblocks a CUDA input first.
// They also serve channels-last inputs with C % 16 == 0 (layers/batchnorm2d.cpp), so they take
// 16-bit activations too.
template <typename T>
void batch_norm2d_stats_blocked(Backend, const T* x, compute_t<T>* mean, compute_t<T>* var,
                                int64_t n, int64_t c, int64_t hw);
template <typename T>
void batch_norm2d_forward_blocked(Backend, const T* x, const compute_t<T>* mean,
                                  const compute_t<T>* invstd, const compute_t<T>* weight,
                                  const compute_t<T>* bias, T* y, int64_t n, int64_t c,
                                  int64_t hw, bool relu);
template <typename T>
void batch_norm2d_backward_blocked(Backend, BatchNormMode mode, const T* grad_y, const T* x,
                                   const compute_t<T>* mean, const compute_t<T>* invstd,
                                   const compute_t<T>* weight, const compute_t<T>* bias,
                                   bool relu, T* grad_x, compute_t<T>* grad_weight,
                                   compute_t<T>* grad_bias, int64_t n, int64_t c, int64_t hw);

}  // namespace kiln::cpu

// ---- CUDA (layers/batchnorm2d_cuda.cu) -------------------------------------------------------
// The same kernels for tensors on a CUDA device: the same arguments, as device pointers, the
// same formulas and the same double accumulation. They launch on cuda::current_stream() of the
// current device (the op holds a cuda::DeviceGuard) and return without synchronising. Each
// reduction runs in a fixed order (one block per channel, a fixed tree): deterministic.
namespace kiln::cuda {

template <typename T>
void batch_norm2d_stats(Backend, const T* x, compute_t<T>* mean, compute_t<T>* var, int64_t n,
                        int64_t c, int64_t hw);

template <typename P>
void batch_norm2d_invstd(Backend, const P* var, P* invstd, int64_t c, double eps);

template <typename P>
void batch_norm2d_update_running(Backend, const P* mean, const P* var, P* running_mean,
                                 P* running_var, int64_t c, int64_t m, double momentum);

template <typename T>
void batch_norm2d_forward(Backend, const T* x, const compute_t<T>* mean,
                          const compute_t<T>* invstd, const compute_t<T>* weight,
                          const compute_t<T>* bias, T* y, int64_t n, int64_t c, int64_t hw,
                          bool relu);

// As the CPU twin, but the fused ReLU's mask is read from relu_y (the forward's output, (N, C,
// HW); non-null when relu), and bias is not read. coef: a (3 * C) device workspace the op
// allocates when grad_x is wanted (null otherwise): the per-channel constants k, a, d of
// grad_x, computed by the reduction kernel and read by the element-wise one.
template <typename T>
void batch_norm2d_backward(Backend, BatchNormMode mode, const T* grad_y, const T* x,
                           const compute_t<T>* mean, const compute_t<T>* invstd,
                           const compute_t<T>* weight, const compute_t<T>* bias, bool relu,
                           const T* relu_y, T* grad_x, compute_t<T>* grad_weight,
                           compute_t<T>* grad_bias, compute_t<T>* coef, int64_t n, int64_t c,
                           int64_t hw);

}  // namespace kiln::cuda
