// batchnorm2d_cpu.cpp: CPU kernels of 2-D batch normalisation (see batchnorm2d_kernels.h for
// the formulas). One thread owns a channel at a time; its N slabs of HW contiguous values are
// visited in order, so every reduction is deterministic for a given thread count. Sums are
// kept in double whatever T is: a channel of a ResNet batch holds ~10^5 values. The inner
// sums are `omp simd` reductions: vectorised, in an order fixed by the binary. For 16-bit x
// (Half, BFloat16) the same templates run with the per-channel values in P = compute_t<T>
// (f32): elements widen on load (in() below) and round once on store.
#include <cmath>
#include <cstdint>

#include "engine/dtype.h"
#include "engine/host_device.h"
#include "layers/batchnorm2d_kernels.h"

namespace kiln::cpu {

namespace {
// Below this many elements a kernel runs on the calling thread (a team costs more than it
// saves; gradient checks call tiny kernels thousands of times).
constexpr int64_t kParallelMinElements = 1 << 15;

// An element in the per-channel type P (exact: a 16-bit value widens to f32 without rounding).
template <typename T>
inline compute_t<T> in(T v) {
  return convert_elem<compute_t<T>>(v);
}
}  // namespace

template <typename T>
void batch_norm2d_stats(Backend, const T* x, compute_t<T>* mean, compute_t<T>* var, int64_t n,
                        int64_t c, int64_t hw) {
  using P = compute_t<T>;
  const double m = static_cast<double>(n * hw);
#pragma omp parallel for schedule(static) if (n * c * hw >= kParallelMinElements)
  for (int64_t ch = 0; ch < c; ++ch) {
    // Pass 1: the mean.
    double s = 0;
    for (int64_t b = 0; b < n; ++b) {
      const T* xs = x + (b * c + ch) * hw;  // slab (b, ch): hw contiguous values
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < hw; ++i) s += static_cast<double>(in(xs[i]));
    }
    const double mu = s / m;
    // Pass 2: the biased variance from centred values (no E[x^2] - E[x]^2 cancellation).
    double ss = 0;
    for (int64_t b = 0; b < n; ++b) {
      const T* xs = x + (b * c + ch) * hw;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < hw; ++i) {
        const double d = static_cast<double>(in(xs[i])) - mu;
        ss += d * d;
      }
    }
    mean[ch] = static_cast<P>(mu);
    var[ch] = static_cast<P>(ss / m);
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
void batch_norm2d_forward(Backend, const T* x, const compute_t<T>* mean,
                          const compute_t<T>* invstd, const compute_t<T>* weight,
                          const compute_t<T>* bias, T* y, int64_t n, int64_t c, int64_t hw,
                          bool relu) {
  using P = compute_t<T>;
  // y = x * scale + shift with scale = invstd * weight, shift = bias - mean * scale.
#pragma omp parallel for collapse(2) schedule(static) if (n * c * hw >= kParallelMinElements)
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t ch = 0; ch < c; ++ch) {
      const auto [scale, shift] = bn_affine(mean, invstd, weight, bias, ch);
      const T* xs = x + (b * c + ch) * hw;
      T* ys = y + (b * c + ch) * hw;
      if (relu) {
        for (int64_t i = 0; i < hw; ++i) {
          const P v = bn_apply(in(xs[i]), scale, shift);
          ys[i] = convert_elem<T>(v > P(0) ? v : P(0));  // NaN -> 0, as relu()
        }
      } else {
        for (int64_t i = 0; i < hw; ++i) ys[i] = convert_elem<T>(bn_apply(in(xs[i]), scale, shift));
      }
    }
  }
}

namespace {

template <bool Relu, typename T, typename P = compute_t<T>>
void backward_nchw(BatchNormMode mode, const T* grad_y, const T* x, const P* mean,
                   const P* invstd, const P* weight, const P* bias, T* grad_x, P* grad_weight,
                   P* grad_bias, int64_t n, int64_t c, int64_t hw) {
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
    const BnAffine<P> affine = bn_affine(mean, invstd, weight, bias, ch);
    const P scale = affine.scale, shift = affine.shift;
    // Pass 1: sum(grad_y) and sum(grad_y * (x - mean)).
    double sum_gy = 0, sum_gy_xc = 0;
    if (need_sums) {
      for (int64_t b = 0; b < n; ++b) {
        const int64_t base = (b * c + ch) * hw;
#pragma omp simd reduction(+ : sum_gy, sum_gy_xc)
        for (int64_t i = base; i < base + hw; ++i) {
          const P xi = in(x[i]);
          const double gy =
              static_cast<double>(relu_masked<Relu>(in(grad_y[i]), xi, scale, shift));
          sum_gy += gy;
          sum_gy_xc += gy * (static_cast<double>(xi) - mu);
        }
      }
    }
    const double sum_gy_xhat = sum_gy_xc * is;  // = grad_weight
    if (grad_bias) grad_bias[ch] = static_cast<P>(sum_gy);
    if (grad_weight) grad_weight[ch] = static_cast<P>(sum_gy_xhat);
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
    const P kt = static_cast<P>(k), at = static_cast<P>(a), dt = static_cast<P>(d);
    const P mut = mean[ch];
    for (int64_t b = 0; b < n; ++b) {
      const int64_t base = (b * c + ch) * hw;
#pragma omp simd
      for (int64_t i = base; i < base + hw; ++i) {
        const P xi = in(x[i]);
        grad_x[i] = convert_elem<T>(kt * relu_masked<Relu>(in(grad_y[i]), xi, scale, shift) -
                                    at * (xi - mut) + dt);
      }
    }
  }
}

}  // namespace

template <typename T>
void batch_norm2d_backward(Backend, BatchNormMode mode, const T* grad_y, const T* x,
                           const compute_t<T>* mean, const compute_t<T>* invstd,
                           const compute_t<T>* weight, const compute_t<T>* bias, bool relu,
                           const T* /*relu_y*/, T* grad_x, compute_t<T>* grad_weight,
                           compute_t<T>* grad_bias, compute_t<T>* /*coef*/, int64_t n, int64_t c,
                           int64_t hw) {
  if (relu)
    backward_nchw<true>(mode, grad_y, x, mean, invstd, weight, bias, grad_x, grad_weight,
                        grad_bias, n, c, hw);
  else
    backward_nchw<false>(mode, grad_y, x, mean, invstd, weight, bias, grad_x, grad_weight,
                         grad_bias, n, c, hw);
}

#define KILN_INSTANTIATE_BN_PARAMS(P)                                                        \
  template void batch_norm2d_invstd<P>(Backend, const P*, P*, int64_t, double);                \
  template void batch_norm2d_update_running<P>(Backend, const P*, const P*, P*, P*, int64_t,   \
                                               int64_t, double);
#define KILN_INSTANTIATE_BN(T)                                                                 \
  template void batch_norm2d_stats<T>(Backend, const T*, compute_t<T>*, compute_t<T>*,         \
                                      int64_t, int64_t, int64_t);                              \
  template void batch_norm2d_forward<T>(Backend, const T*, const compute_t<T>*,                \
                                        const compute_t<T>*, const compute_t<T>*,              \
                                        const compute_t<T>*, T*, int64_t, int64_t, int64_t,    \
                                        bool);                                                 \
  template void batch_norm2d_backward<T>(Backend, BatchNormMode, const T*, const T*,           \
                                         const compute_t<T>*, const compute_t<T>*,             \
                                         const compute_t<T>*, const compute_t<T>*, bool,       \
                                         const T*, T*, compute_t<T>*, compute_t<T>*,           \
                                         compute_t<T>*, int64_t, int64_t, int64_t);
KILN_INSTANTIATE_BN_PARAMS(float)
KILN_INSTANTIATE_BN_PARAMS(double)
KILN_INSTANTIATE_BN(float)
KILN_INSTANTIATE_BN(double)
KILN_INSTANTIATE_BN(Half)
KILN_INSTANTIATE_BN(BFloat16)
#undef KILN_INSTANTIATE_BN
#undef KILN_INSTANTIATE_BN_PARAMS

}  // namespace kiln::cpu
