// batchnorm2d_cpu.cpp: CPU kernels of 2-D batch normalisation (see batchnorm2d_kernels.h for
// the formulas). One thread owns a channel at a time; its N slabs of HW contiguous values are
// visited in order, so every reduction is deterministic for a given thread count. Sums are
// kept in double whatever T is: a channel of a ResNet batch holds ~10^5 values. The inner
// sums are `omp simd` reductions: vectorised, in an order fixed by the binary.
#include <cmath>
#include <cstdint>

#include "layers/batchnorm2d_kernels.h"

namespace kiln::cpu {

namespace {
// Below this many elements a kernel runs on the calling thread (a team costs more than it
// saves; gradient checks call tiny kernels thousands of times).
constexpr int64_t kParallelMinElements = 1 << 15;
}  // namespace

template <typename T>
void batch_norm2d_stats(Backend, const T* x, T* mean, T* var, int64_t n, int64_t c, int64_t hw) {
  const double m = static_cast<double>(n * hw);
#pragma omp parallel for schedule(static) if (n * c * hw >= kParallelMinElements)
  for (int64_t ch = 0; ch < c; ++ch) {
    // Pass 1: the mean.
    double s = 0;
    for (int64_t b = 0; b < n; ++b) {
      const T* xs = x + (b * c + ch) * hw;  // slab (b, ch): hw contiguous values
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < hw; ++i) s += static_cast<double>(xs[i]);
    }
    const double mu = s / m;
    // Pass 2: the biased variance from centred values (no E[x^2] - E[x]^2 cancellation).
    double ss = 0;
    for (int64_t b = 0; b < n; ++b) {
      const T* xs = x + (b * c + ch) * hw;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < hw; ++i) {
        const double d = static_cast<double>(xs[i]) - mu;
        ss += d * d;
      }
    }
    mean[ch] = static_cast<T>(mu);
    var[ch] = static_cast<T>(ss / m);
  }
}

template <typename T>
void batch_norm2d_invstd(Backend, const T* var, T* invstd, int64_t c, double eps) {
  for (int64_t ch = 0; ch < c; ++ch)
    invstd[ch] = static_cast<T>(1.0 / std::sqrt(static_cast<double>(var[ch]) + eps));
}

template <typename T>
void batch_norm2d_update_running(Backend, const T* mean, const T* var, T* running_mean,
                                 T* running_var, int64_t c, int64_t m, double momentum) {
  const double unbias = static_cast<double>(m) / static_cast<double>(m - 1);
  for (int64_t ch = 0; ch < c; ++ch) {
    running_mean[ch] = static_cast<T>((1 - momentum) * running_mean[ch] + momentum * mean[ch]);
    running_var[ch] =
        static_cast<T>((1 - momentum) * running_var[ch] + momentum * var[ch] * unbias);
  }
}

template <typename T>
void batch_norm2d_forward(Backend, const T* x, const T* mean, const T* invstd, const T* weight,
                          const T* bias, T* y, int64_t n, int64_t c, int64_t hw, bool relu) {
  // y = x * scale + shift with scale = invstd * weight, shift = bias - mean * scale.
#pragma omp parallel for collapse(2) schedule(static) if (n * c * hw >= kParallelMinElements)
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t ch = 0; ch < c; ++ch) {
      const auto [scale, shift] = bn_affine(mean, invstd, weight, bias, ch);
      const T* xs = x + (b * c + ch) * hw;
      T* ys = y + (b * c + ch) * hw;
      if (relu) {
        for (int64_t i = 0; i < hw; ++i) {
          const T v = bn_apply(xs[i], scale, shift);
          ys[i] = v > T(0) ? v : T(0);  // NaN -> 0, as relu()
        }
      } else {
        for (int64_t i = 0; i < hw; ++i) ys[i] = bn_apply(xs[i], scale, shift);
      }
    }
  }
}

namespace {

template <bool Relu, typename T>
void backward_nchw(BatchNormMode mode, const T* grad_y, const T* x, const T* mean,
                   const T* invstd, const T* weight, const T* bias, T* grad_x, T* grad_weight,
                   T* grad_bias, int64_t n, int64_t c, int64_t hw) {
  const double m = static_cast<double>(n * hw);
  // The sums are needed for grad_weight / grad_bias, and in training also for grad_x.
  const bool need_sums = grad_weight || grad_bias || (grad_x && mode == BatchNormMode::Train);
#pragma omp parallel for schedule(static) if (n * c * hw >= kParallelMinElements)
  for (int64_t ch = 0; ch < c; ++ch) {
    const double mu = static_cast<double>(mean[ch]);
    const double is = static_cast<double>(invstd[ch]);
    const double w = weight ? static_cast<double>(weight[ch]) : 1.0;
    // The ReLU's mask. (Named members, not a structured binding: C++17 lets no lambda capture
    // one, and clang's OpenMP outlines the simd loops below as such captures.)
    const BnAffine<T> affine = bn_affine(mean, invstd, weight, bias, ch);
    const T scale = affine.scale, shift = affine.shift;
    // Pass 1: sum(grad_y) and sum(grad_y * (x - mean)).
    double sum_gy = 0, sum_gy_xc = 0;
    if (need_sums) {
      for (int64_t b = 0; b < n; ++b) {
        const int64_t base = (b * c + ch) * hw;
#pragma omp simd reduction(+ : sum_gy, sum_gy_xc)
        for (int64_t i = base; i < base + hw; ++i) {
          const double gy = static_cast<double>(relu_masked<Relu>(grad_y[i], x[i], scale, shift));
          sum_gy += gy;
          sum_gy_xc += gy * (static_cast<double>(x[i]) - mu);
        }
      }
    }
    const double sum_gy_xhat = sum_gy_xc * is;  // = grad_weight
    if (grad_bias) grad_bias[ch] = static_cast<T>(sum_gy);
    if (grad_weight) grad_weight[ch] = static_cast<T>(sum_gy_xhat);
    if (!grad_x) continue;
    // Pass 2: grad_x = k * grad_y - a * (x - mean) + d, with per-channel constants:
    //   training: w * is * (gy - sum_gy / M - (x - mean) * is * sum_gy_xhat / M)
    //             k = w * is,  a = k * is * sum_gy_xhat / M,  d = -k * sum_gy / M
    //   eval:     k = w * is,  a = d = 0
    const double k = w * is;
    double a = 0, d = 0;
    if (mode == BatchNormMode::Train) {
      a = k * is * sum_gy_xhat / m;
      d = -k * sum_gy / m;
    }
    const T kt = static_cast<T>(k), at = static_cast<T>(a), dt = static_cast<T>(d);
    const T mut = mean[ch];
    for (int64_t b = 0; b < n; ++b) {
      const int64_t base = (b * c + ch) * hw;
#pragma omp simd
      for (int64_t i = base; i < base + hw; ++i)
        grad_x[i] = kt * relu_masked<Relu>(grad_y[i], x[i], scale, shift) - at * (x[i] - mut) + dt;
    }
  }
}

}  // namespace

template <typename T>
void batch_norm2d_backward(Backend, BatchNormMode mode, const T* grad_y, const T* x,
                           const T* mean, const T* invstd, const T* weight, const T* bias,
                           bool relu, const T* /*relu_y*/, T* grad_x, T* grad_weight,
                           T* grad_bias, T* /*coef*/, int64_t n, int64_t c, int64_t hw) {
  if (relu)
    backward_nchw<true>(mode, grad_y, x, mean, invstd, weight, bias, grad_x, grad_weight,
                        grad_bias, n, c, hw);
  else
    backward_nchw<false>(mode, grad_y, x, mean, invstd, weight, bias, grad_x, grad_weight,
                         grad_bias, n, c, hw);
}

#define KILN_INSTANTIATE_BN(T)                                                                 \
  template void batch_norm2d_invstd<T>(Backend, const T*, T*, int64_t, double);                \
  template void batch_norm2d_update_running<T>(Backend, const T*, const T*, T*, T*, int64_t,   \
                                               int64_t, double);                               \
  template void batch_norm2d_stats<T>(Backend, const T*, T*, T*, int64_t, int64_t, int64_t);   \
  template void batch_norm2d_forward<T>(Backend, const T*, const T*, const T*, const T*,        \
                                        const T*, T*, int64_t, int64_t, int64_t, bool);        \
  template void batch_norm2d_backward<T>(Backend, BatchNormMode, const T*, const T*, const T*, \
                                         const T*, const T*, const T*, bool, const T*, T*, T*, \
                                         T*, T*, int64_t, int64_t, int64_t);
KILN_INSTANTIATE_BN(float)
KILN_INSTANTIATE_BN(double)
#undef KILN_INSTANTIATE_BN

}  // namespace kiln::cpu
