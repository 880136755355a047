// batchnorm2d_rows_cuda.cuh: the CUDA per-channel reductions of batch normalisation for a
// row-major (M, C) input, each channel a column (batchnorm2d_rows_cuda.cu explains why and how).
// The CUDA batch_norm2d_stats and batch_norm2d_backward (batchnorm2d_cuda.cu) call them when
// hw == 1, the shape a channels-last activation takes there; it also holds the device code both
// backward reductions end with. Included by those two files alone.
#pragma once

#include "engine/cuda/runtime.h"

#include <cstdint>

#include "engine/dtype.h"
#include "layers/batchnorm2d_kernels.h"

namespace kiln::cuda {

// V neighbouring elements, loaded or stored at once (one aligned V * sizeof(T)-byte access: the
// caller checks the alignment).
template <typename T, int V>
struct alignas(sizeof(T) * V) Lanes {
  T v[V];
};
template <int V, typename T>
__device__ __forceinline__ Lanes<T, V> load_lanes(const T* p) {
  return *reinterpret_cast<const Lanes<T, V>*>(p);
}
template <int V, typename T>
__device__ __forceinline__ void store_lanes(T* p, const Lanes<T, V>& v) {
  *reinterpret_cast<Lanes<T, V>*>(p) = v;
}

// From channel ch's sum(grad_y) and sum(grad_y * (x - mean)) over its m values: grad_bias,
// grad_weight and the coefficients of grad_x = k * grad_y - a * (x - mean) + d (coef[ch],
// coef[c + ch], coef[2c + ch]; see the CPU batch_norm2d_backward for their derivation), each
// written where its pointer is not null. T here is the per-channel type (f32 for 16-bit
// activations).
template <typename T>
__device__ __forceinline__ void write_backward_reduction(BatchNormMode mode, double sum_gy,
                                                         double sum_gy_xc, const T* invstd,
                                                         const T* weight, T* grad_weight,
                                                         T* grad_bias, T* coef, int64_t ch,
                                                         int64_t m, int64_t c) {
  const double is = static_cast<double>(invstd[ch]);
  const double sum_gy_xhat = sum_gy_xc * is;
  if (grad_bias) grad_bias[ch] = static_cast<T>(sum_gy);
  if (grad_weight) grad_weight[ch] = static_cast<T>(sum_gy_xhat);
  if (!coef) return;
  const double k = (weight ? static_cast<double>(weight[ch]) : 1.0) * is;
  double a = 0, d = 0;
  if (mode == BatchNormMode::Train) {
    a = k * is * sum_gy_xhat / static_cast<double>(m);
    d = -k * sum_gy / static_cast<double>(m);
  }
  coef[ch] = static_cast<T>(k);
  coef[c + ch] = static_cast<T>(a);
  coef[2 * c + ch] = static_cast<T>(d);
}

// mean[ch] and the biased var[ch] of column ch of the (m, c) matrix x; queued on the current
// stream.
template <typename T>
void batch_norm2d_stats_rows(const T* x, compute_t<T>* mean, compute_t<T>* var, int64_t m,
                             int64_t c);

// What batch_norm2d_backward's reduction writes (grad_weight, grad_bias, the grad_x
// coefficients in coef; each may be null), for (m, c) matrices grad_y and x; need_sums false
// (eval mode, grad_x only) skips the sums.
template <typename T>
void batch_norm2d_backward_reduce_rows(BatchNormMode mode, const T* grad_y, const T* x,
                                       const compute_t<T>* mean, const compute_t<T>* invstd,
                                       const compute_t<T>* weight, const T* relu_y,
                                       compute_t<T>* grad_weight, compute_t<T>* grad_bias,
                                       compute_t<T>* coef, bool need_sums, int64_t m, int64_t c);

}  // namespace kiln::cuda
