// batchnorm2d_blocked_cpu.cpp: the CPU kernels of 2-D batch normalisation for activations in
// the channel-blocked layout of layers/layout.h: x is (N, C/16, HW, 16), the 16 channels of a
// pixel side by side. The formulas are those of batchnorm2d_kernels.h; only the walk differs.
//
// In NCHW a channel is N slabs of HW contiguous values and the kernels vectorise along the
// pixels. Here a pixel is 16 contiguous channels, so every loop's innermost step is "16
// channels at once": one AVX-512 register of floats (two of doubles for the sums). Block cb
// holds channels cb*16 .. cb*16+15 for every image and pixel; one thread owns a block at a
// time for the reductions (fixed order: deterministic for a given thread count), and the
// element-wise passes split over (image, block). 16-bit x (Half, BFloat16) runs the same
// templates with the per-channel values and the per-plane sums in P = compute_t<T> (f32): the
// f32 kernel's arithmetic on the widened elements, rounded once on store.
#include "layers/batchnorm2d_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/dtype.h"
#include "engine/host_device.h"
#include "layers/layout.h"

namespace kiln::cpu {

namespace {

constexpr int64_t L = kChannelBlock;
constexpr int64_t kParallelMinElements = 1 << 15;

// An element in the per-channel type (exact: a 16-bit value widens to f32 without rounding).
template <typename T>
inline compute_t<T> in(T v) {
  return convert_elem<compute_t<T>>(v);
}

// The forward's scale and shift (bn_affine) of the 16 channels of block cb.
template <typename T>
void block_affine(const T* mean, const T* invstd, const T* weight, const T* bias, int64_t cb,
                  T* scale, T* shift) {
  for (int64_t l = 0; l < L; ++l) {
    const auto affine = bn_affine(mean, invstd, weight, bias, cb * L + l);
    scale[l] = affine.scale;
    shift[l] = affine.shift;
  }
}

template <bool Relu, typename T, typename P = compute_t<T>>
void backward_blocked(BatchNormMode mode, const T* grad_y, const T* x, const P* mean,
                      const P* invstd, const P* weight, const P* bias, T* grad_x,
                      P* grad_weight, P* grad_bias, int64_t n, int64_t c, int64_t hw) {
  const int64_t cblocks = c / L;
  const double m = static_cast<double>(n * hw);
  const bool need_sums = grad_weight || grad_bias || (grad_x && mode == BatchNormMode::Train);
  // Per channel: grad_x = k * grad_y - a * (x - mean) + d (see batch_norm2d_backward in
  // batchnorm2d_cpu.cpp).
  std::vector<P> k_coef(static_cast<size_t>(c)), a_coef(static_cast<size_t>(c)),
      d_coef(static_cast<size_t>(c));
#pragma omp parallel for schedule(static) if (n * c * hw >= kParallelMinElements)
  for (int64_t cb = 0; cb < cblocks; ++cb) {
    double sum_gy[L] = {}, sum_gy_xc[L] = {};
    P scale[L], shift[L];  // the forward's affine map, per lane
    block_affine(mean, invstd, weight, bias, cb, scale, shift);
    if (need_sums) {
      const P* mt = mean + cb * L;
      for (int64_t b = 0; b < n; ++b) {
        // One image's plane in T (16 lanes of registers), then into the double totals: the
        // inner loop vectorises, and a plane holds at most a few thousand values.
        P plane_gy[L] = {}, plane_gy_xc[L] = {};
        const int64_t base = (b * cblocks + cb) * hw * L;
        for (int64_t p = 0; p < hw; ++p) {
#pragma omp simd
          for (int64_t l = 0; l < L; ++l) {
            const int64_t i = base + p * L + l;
            const P xi = in(x[i]);
            const P gy = relu_masked<Relu>(in(grad_y[i]), xi, scale[l], shift[l]);
            plane_gy[l] += gy;
            plane_gy_xc[l] += gy * (xi - mt[l]);
          }
        }
        for (int64_t l = 0; l < L; ++l) {
          sum_gy[l] += static_cast<double>(plane_gy[l]);
          sum_gy_xc[l] += static_cast<double>(plane_gy_xc[l]);
        }
      }
    }
    for (int64_t l = 0; l < L; ++l) {
      const int64_t ch = cb * L + l;
      const double is = static_cast<double>(invstd[ch]);
      const double sum_gy_xhat = sum_gy_xc[l] * is;
      if (grad_bias) grad_bias[ch] = static_cast<P>(sum_gy[l]);
      if (grad_weight) grad_weight[ch] = static_cast<P>(sum_gy_xhat);
      const double k = (weight ? static_cast<double>(weight[ch]) : 1.0) * is;
      double a = 0, d = 0;
      if (mode == BatchNormMode::Train) {
        a = k * is * sum_gy_xhat / m;
        d = -k * sum_gy[l] / m;
      }
      k_coef[static_cast<size_t>(ch)] = static_cast<P>(k);
      a_coef[static_cast<size_t>(ch)] = static_cast<P>(a);
      d_coef[static_cast<size_t>(ch)] = static_cast<P>(d);
    }
  }
  if (!grad_x) return;
#pragma omp parallel for collapse(2) schedule(static) if (n * c * hw >= kParallelMinElements)
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t cb = 0; cb < cblocks; ++cb) {
      const P* kc = k_coef.data() + cb * L;
      const P* ac = a_coef.data() + cb * L;
      const P* dc = d_coef.data() + cb * L;
      const P* mc = mean + cb * L;
      P scale[L], shift[L];  // the forward's affine map, per lane
      block_affine(mean, invstd, weight, bias, cb, scale, shift);
      const int64_t base = (b * cblocks + cb) * hw * L;
      for (int64_t p = 0; p < hw; ++p) {
#pragma omp simd
        for (int64_t l = 0; l < L; ++l) {
          const int64_t i = base + p * L + l;
          const P xi = in(x[i]);
          grad_x[i] = convert_elem<T>(kc[l] * relu_masked<Relu>(in(grad_y[i]), xi, scale[l],
                                                                 shift[l]) -
                                      ac[l] * (xi - mc[l]) + dc[l]);
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void batch_norm2d_stats_blocked(Backend, const T* x, compute_t<T>* mean, compute_t<T>* var,
                                int64_t n, int64_t c, int64_t hw) {
  using P = compute_t<T>;
  const int64_t cblocks = c / L;
  const double m = static_cast<double>(n * hw);
#pragma omp parallel for schedule(static) if (n * c * hw >= kParallelMinElements)
  for (int64_t cb = 0; cb < cblocks; ++cb) {
    // One pass: sum(x) and sum(x^2) together, var = E[x^2] - mean^2. The NCHW kernel reads x
    // twice (the mean, then squared deviations from it) to avoid the cancellation of that
    // difference; here each image's plane is summed in T and the planes in double, so the
    // relative error of var is ~u * (mean^2 / var) with u the rounding of T: small while a
    // channel's mean is within a few hundred of its spread, which BN inputs are. One read of
    // every BN input fewer per training step.
    double s[L] = {}, sq[L] = {};
    for (int64_t b = 0; b < n; ++b) {
      const T* xs = x + (b * cblocks + cb) * hw * L;
      P plane_s[L] = {}, plane_sq[L] = {};  // one image's plane in P, then into double
      for (int64_t p = 0; p < hw; ++p) {
#pragma omp simd
        for (int64_t l = 0; l < L; ++l) {
          const P v = in(xs[p * L + l]);
          plane_s[l] += v;
          plane_sq[l] += v * v;
        }
      }
      for (int64_t l = 0; l < L; ++l) {
        s[l] += static_cast<double>(plane_s[l]);
        sq[l] += static_cast<double>(plane_sq[l]);
      }
    }
    for (int64_t l = 0; l < L; ++l) {
      const double mu = s[l] / m;
      mean[cb * L + l] = static_cast<P>(mu);
      var[cb * L + l] = static_cast<P>(std::max(sq[l] / m - mu * mu, 0.0));
    }
  }
}

template <typename T>
void batch_norm2d_forward_blocked(Backend, const T* x, const compute_t<T>* mean,
                                  const compute_t<T>* invstd, const compute_t<T>* weight,
                                  const compute_t<T>* bias, T* y, int64_t n, int64_t c,
                                  int64_t hw, bool relu) {
  using P = compute_t<T>;
  const int64_t cblocks = c / L;
#pragma omp parallel for collapse(2) schedule(static) if (n * c * hw >= kParallelMinElements)
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t cb = 0; cb < cblocks; ++cb) {
      // y = x * scale + shift, per channel, as the NCHW kernel computes them.
      P scale[L], shift[L];  // the forward's affine map, per lane
      block_affine(mean, invstd, weight, bias, cb, scale, shift);
      const int64_t base = (b * cblocks + cb) * hw * L;
      const T* xs = x + base;
      T* ys = y + base;
      for (int64_t p = 0; p < hw; ++p) {
        if (relu) {
#pragma omp simd
          for (int64_t l = 0; l < L; ++l) {
            const P v = bn_apply(in(xs[p * L + l]), scale[l], shift[l]);
            ys[p * L + l] = convert_elem<T>(v > P(0) ? v : P(0));
          }
        } else {
#pragma omp simd
          for (int64_t l = 0; l < L; ++l)
            ys[p * L + l] = convert_elem<T>(bn_apply(in(xs[p * L + l]), scale[l], shift[l]));
        }
      }
    }
  }
}

template <typename T>
void batch_norm2d_backward_blocked(Backend, BatchNormMode mode, const T* grad_y, const T* x,
                                   const compute_t<T>* mean, const compute_t<T>* invstd,
                                   const compute_t<T>* weight, const compute_t<T>* bias,
                                   bool relu, T* grad_x, compute_t<T>* grad_weight,
                                   compute_t<T>* grad_bias, int64_t n, int64_t c, int64_t hw) {
  if (relu)
    backward_blocked<true>(mode, grad_y, x, mean, invstd, weight, bias, grad_x, grad_weight,
                           grad_bias, n, c, hw);
  else
    backward_blocked<false>(mode, grad_y, x, mean, invstd, weight, bias, grad_x, grad_weight,
                            grad_bias, n, c, hw);
}

#define KILN_INSTANTIATE_BN_BLOCKED(T)                                                        \
  template void batch_norm2d_stats_blocked<T>(Backend, const T*, compute_t<T>*, compute_t<T>*, \
                                              int64_t, int64_t, int64_t);                     \
  template void batch_norm2d_forward_blocked<T>(Backend, const T*, const compute_t<T>*,       \
                                                const compute_t<T>*, const compute_t<T>*,     \
                                                const compute_t<T>*, T*, int64_t, int64_t,    \
                                                int64_t, bool);                               \
  template void batch_norm2d_backward_blocked<T>(                                             \
      Backend, BatchNormMode, const T*, const T*, const compute_t<T>*, const compute_t<T>*,   \
      const compute_t<T>*, const compute_t<T>*, bool, T*, compute_t<T>*, compute_t<T>*,       \
      int64_t, int64_t, int64_t);
KILN_INSTANTIATE_BN_BLOCKED(float)
KILN_INSTANTIATE_BN_BLOCKED(double)
KILN_INSTANTIATE_BN_BLOCKED(Half)
KILN_INSTANTIATE_BN_BLOCKED(BFloat16)
#undef KILN_INSTANTIATE_BN_BLOCKED

}  // namespace kiln::cpu
