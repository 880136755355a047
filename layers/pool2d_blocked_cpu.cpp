// pool2d_blocked_cpu.cpp: max pooling on the channel-blocked layout of layers/layout.h,
// x (N, C/16, H, W, 16): a ResNet stem's 3x3/2 pool between its blocked BN and its blocked
// first block. Same semantics as the NCHW kernels of pool2d_cpu.cpp: padding is -inf, the
// first maximum in row-major window order wins, NaN propagates; the index of a maximum is
// its offset ih * W + iw inside its channel's plane, exactly as in NCHW. Each window step
// compares 16 channels at once with selects (one AVX-512 register of floats).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "layers/layout.h"
#include "layers/pool2d_kernels.h"

namespace kiln::cpu {

namespace {
constexpr int64_t L = kChannelBlock;
constexpr int64_t kParallelMinElements = 1 << 15;
}  // namespace

template <typename T>
void max_pool2d_forward_blocked(Backend, const T* x, T* y, int32_t* indices,
                                const Pool2dGeometry& g) {
  const int64_t cblocks = g.c / L;
  const int64_t in_plane = g.in_h * g.in_w * L, out_plane = g.out_h * g.out_w * L;
#pragma omp parallel for collapse(2) schedule(static) \
    if (g.planes() * g.in_h * g.in_w >= kParallelMinElements)
  for (int64_t b = 0; b < g.n; ++b) {
    for (int64_t cb = 0; cb < cblocks; ++cb) {
      const T* xp = x + (b * cblocks + cb) * in_plane;
      T* yp = y + (b * cblocks + cb) * out_plane;
      int32_t* ip = indices + (b * cblocks + cb) * out_plane;
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        int64_t h0 = oh * g.stride_h - g.pad_h;
        const int64_t h1 = std::min(h0 + g.kernel_h, g.in_h);
        h0 = std::max<int64_t>(h0, 0);
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          int64_t w0 = ow * g.stride_w - g.pad_w;
          const int64_t w1 = std::min(w0 + g.kernel_w, g.in_w);
          w0 = std::max<int64_t>(w0, 0);
          T best[L];
          int32_t best_i[L];
          for (int64_t l = 0; l < L; ++l) {
            best[l] = -std::numeric_limits<T>::infinity();
            best_i[l] = static_cast<int32_t>(h0 * g.in_w + w0);
          }
          for (int64_t ih = h0; ih < h1; ++ih) {
            for (int64_t iw = w0; iw < w1; ++iw) {
              const T* v = xp + (ih * g.in_w + iw) * L;
              const int32_t pos = static_cast<int32_t>(ih * g.in_w + iw);
#pragma omp simd
              for (int64_t l = 0; l < L; ++l) {
                const bool take = v[l] > best[l] || v[l] != v[l];  // greater, or NaN
                best[l] = take ? v[l] : best[l];
                best_i[l] = take ? pos : best_i[l];
              }
            }
          }
          for (int64_t l = 0; l < L; ++l) {
            yp[(oh * g.out_w + ow) * L + l] = best[l];
            ip[(oh * g.out_w + ow) * L + l] = best_i[l];
          }
        }
      }
    }
  }
}

template <typename T>
void max_pool2d_backward_blocked(Backend, const T* grad_y, const int32_t* indices, T* grad_x,
                                 const Pool2dGeometry& g) {
  const int64_t cblocks = g.c / L;
  const int64_t in_plane = g.in_h * g.in_w * L, out_plane = g.out_h * g.out_w * L;
  // One (image, block) group of planes per thread at a time: the scatter needs no atomics.
#pragma omp parallel for collapse(2) schedule(static) \
    if (g.planes() * g.in_h * g.in_w >= kParallelMinElements)
  for (int64_t b = 0; b < g.n; ++b) {
    for (int64_t cb = 0; cb < cblocks; ++cb) {
      T* gx = grad_x + (b * cblocks + cb) * in_plane;
      const T* gy = grad_y + (b * cblocks + cb) * out_plane;
      const int32_t* ip = indices + (b * cblocks + cb) * out_plane;
      std::fill(gx, gx + in_plane, T(0));
      for (int64_t o = 0; o < g.out_h * g.out_w; ++o)
        for (int64_t l = 0; l < L; ++l) gx[ip[o * L + l] * L + l] += gy[o * L + l];
    }
  }
}

#define KILN_INSTANTIATE_POOL_BLOCKED(T)                                                    \
  template void max_pool2d_forward_blocked<T>(Backend, const T*, T*, int32_t*,                   \
                                                  const Pool2dGeometry&);                   \
  template void max_pool2d_backward_blocked<T>(Backend, const T*, const int32_t*, T*,            \
                                                   const Pool2dGeometry&);
KILN_INSTANTIATE_POOL_BLOCKED(float)
KILN_INSTANTIATE_POOL_BLOCKED(double)
#undef KILN_INSTANTIATE_POOL_BLOCKED

}  // namespace kiln::cpu
