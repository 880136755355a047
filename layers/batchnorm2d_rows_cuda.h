// batchnorm2d_rows_cuda.h: the CUDA per-channel reductions of batch normalisation for a
// row-major (M, C) input, each channel a column (batchnorm2d_rows_cuda.cu explains why and how).
// The CUDA batch_norm2d_stats and batch_norm2d_backward (batchnorm2d_cuda.cu) call them when
// hw == 1, the shape a channels-last activation takes there.
#pragma once

#include <cstdint>

#include "layers/batchnorm2d_kernels.h"

namespace kiln::cuda {

// mean[ch] and the biased var[ch] of column ch of the (m, c) matrix x; queued on the current
// stream.
template <typename T>
void batch_norm2d_stats_rows(const T* x, T* mean, T* var, int64_t m, int64_t c);

// What batch_norm2d_backward's reduction writes (grad_weight, grad_bias, the grad_x
// coefficients in coef; each may be null), for (m, c) matrices grad_y and x; need_sums false
// (eval mode, grad_x only) skips the sums.
template <typename T>
void batch_norm2d_backward_reduce_rows(BatchNormMode mode, const T* grad_y, const T* x,
                                       const T* mean, const T* invstd, const T* weight,
                                       const T* relu_y, T* grad_weight, T* grad_bias, T* coef,
                                       bool need_sums, int64_t m, int64_t c);

}  // namespace kiln::cuda
