// pool2d_nhwc_cpu.cpp: CPU kernels of max, average and adaptive average pooling on
// channels-last tensors, x (N, H, W, C) in memory and y (N, OH, OW, C).
//
// The C channels of a pixel sit side by side, so every kernel's inner loop runs over c with
// unit stride and the same work for each channel: it vectorises (compares become selects, as in
// pool2d_blocked_cpu.cpp), and each output pixel's C values are kept in place in y while its
// window is walked. Per channel the arithmetic is the NCHW kernels' (pool2d_cpu.cpp): the
// window in row-major order, the first maximum wins, NaN propagates, a sum starts at 0 and
// divides once; so the results are theirs bit for bit.
//
// Forward passes split the (n, oh) output rows between threads. Backward passes are gathers:
// the thread of input row (n, ih) computes each of its pixels' gradients from the outputs whose
// windows cover the pixel (window_covering, pool2d_kernels.h), in increasing (oh, ow) order: the
// order in which the NCHW scatter reaches that pixel. No two threads write the same element, and
// no atomics or zeroing pass are needed.
//
// 16-bit activations (Half, BFloat16) run the same templates, widened to f32 (compute_t) on
// load and rounded once on store: the sums of a pixel are kept in f32 for a block of up to
// kLowpChannels channels at a time (ChannelSums, on the stack) and rounded into the output when
// the window is done, so each channel sees the f32 kernel's operations in the f32 kernel's order.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "engine/dtype.h"
#include "engine/host_device.h"
#include "layers/pool2d_kernels.h"

namespace kiln::cpu {
namespace {

// Below this many input elements a kernel runs on the calling thread (as in pool2d_cpu.cpp).
constexpr int64_t kParallelMinElements = 1 << 15;
inline bool worth_threads(const Pool2dGeometry& g) {
  return g.planes() * g.in_h * g.in_w >= kParallelMinElements;
}

// Pixel (n, h, w) of an (N, H, W, C) buffer: the offset of its first channel.
inline int64_t pixel(int64_t n, int64_t h, int64_t w, int64_t height, int64_t width, int64_t c) {
  return ((n * height + h) * width + w) * c;
}

// An element widened to the arithmetic type (the identity for float and double).
template <typename T>
inline compute_t<T> ld(T v) {
  return convert_elem<compute_t<T>>(v);
}

// Where the per-channel sums of one pixel live while its window is walked. For float and double
// (T is its own compute type) they are the output pixel itself, all C channels in one block: the
// f32 kernel as it always was. For a 16-bit T they are f32 on the stack, kLowpChannels channels
// per block, rounded into the output by store().
constexpr int64_t kLowpChannels = 256;
template <typename T>
class ChannelSums {
 public:
  using C = compute_t<T>;
  static constexpr bool kInPlace = std::is_same_v<T, C>;
  // The channels of one block.
  static int64_t width(int64_t channels) {
    return kInPlace ? channels : std::min(channels, kLowpChannels);
  }
  // The sums of the block whose output channels start at out.
  C* sums(T* out) {
    if constexpr (kInPlace) {
      return out;
    } else {
      (void)out;
      return buf_;
    }
  }
  // Rounds the block's nc sums into out (nothing to do in place).
  void store(T* out, int64_t nc) const {
    if constexpr (!kInPlace)
      for (int64_t c = 0; c < nc; ++c) out[c] = convert_elem<T>(buf_[c]);
  }

 private:
  C buf_[kInPlace ? 1 : kLowpChannels];
};

}  // namespace

// ---- Max pooling --------------------------------------------------------------------------

template <typename T>
void max_pool2d_forward_nhwc(Backend, const T* x, T* y, int32_t* indices,
                             const Pool2dGeometry& g) {
  const int64_t C = g.c;
#pragma omp parallel for collapse(2) schedule(static) if (worth_threads(g))
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      // The window clipped to the input: the padding is -inf, never the maximum.
      int64_t h0 = oh * g.stride_h - g.pad_h;
      const int64_t h1 = std::min(h0 + g.kernel_h, g.in_h);
      h0 = std::max<int64_t>(h0, 0);
      for (int64_t ow = 0; ow < g.out_w; ++ow) {
        int64_t w0 = ow * g.stride_w - g.pad_w;
        const int64_t w1 = std::min(w0 + g.kernel_w, g.in_w);
        w0 = std::max<int64_t>(w0, 0);
        T* best = y + pixel(n, oh, ow, g.out_h, g.out_w, C);
        int32_t* best_i = indices + pixel(n, oh, ow, g.out_h, g.out_w, C);
        const int32_t first = static_cast<int32_t>(h0 * g.in_w + w0);  // an all -inf window
        const T minus_inf = convert_elem<T>(-std::numeric_limits<compute_t<T>>::infinity());
        for (int64_t c = 0; c < C; ++c) {
          best[c] = minus_inf;
          best_i[c] = first;
        }
        for (int64_t ih = h0; ih < h1; ++ih) {
          for (int64_t iw = w0; iw < w1; ++iw) {
            const T* v = x + pixel(n, ih, iw, g.in_h, g.in_w, C);
            const int32_t pos = static_cast<int32_t>(ih * g.in_w + iw);
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) {
              // Compared widened; the winner is stored as the f32 kernel's result rounded
              // (the identity for float, for 16-bit the element itself: no rounding happens).
              const compute_t<T> vc = ld(v[c]);
              const bool take = vc > ld(best[c]) || vc != vc;  // greater, or NaN
              best[c] = take ? convert_elem<T>(vc) : best[c];
              best_i[c] = take ? pos : best_i[c];
            }
          }
        }
      }
    }
  }
}

template <typename T>
void max_pool2d_backward_nhwc(Backend, const T* grad_y, const int32_t* indices, T* grad_x,
                              const Pool2dGeometry& g) {
  const int64_t C = g.c;
#pragma omp parallel for collapse(2) schedule(static) if (worth_threads(g))
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t ih = 0; ih < g.in_h; ++ih) {
      int64_t oh0, oh1;
      window_covering(ih, g.pad_h, g.kernel_h, g.stride_h, g.out_h, oh0, oh1);
      for (int64_t iw = 0; iw < g.in_w; ++iw) {
        int64_t ow0, ow1;
        window_covering(iw, g.pad_w, g.kernel_w, g.stride_w, g.out_w, ow0, ow1);
        const int32_t self = static_cast<int32_t>(ih * g.in_w + iw);
        T* gx = grad_x + pixel(n, ih, iw, g.in_h, g.in_w, C);
        ChannelSums<T> acc;
        const int64_t cb = ChannelSums<T>::width(C);
        for (int64_t c0 = 0; c0 < C; c0 += cb) {
          const int64_t nc = std::min(cb, C - c0);
          compute_t<T>* s = acc.sums(gx + c0);
          for (int64_t c = 0; c < nc; ++c) s[c] = 0;
          for (int64_t oh = oh0; oh <= oh1; ++oh) {
            for (int64_t ow = ow0; ow <= ow1; ++ow) {
              const T* gy = grad_y + pixel(n, oh, ow, g.out_h, g.out_w, C) + c0;
              const int32_t* ix = indices + pixel(n, oh, ow, g.out_h, g.out_w, C) + c0;
              // Adding +0 where the maximum is elsewhere leaves the sum's bits alone: it starts
              // at +0 and a round-to-nearest sum is -0 only when both terms are.
#pragma omp simd
              for (int64_t c = 0; c < nc; ++c)
                s[c] += ix[c] == self ? ld(gy[c]) : compute_t<T>(0);
            }
          }
          acc.store(gx + c0, nc);
        }
      }
    }
  }
}

// ---- Average pooling ----------------------------------------------------------------------

template <typename T>
void avg_pool2d_forward_nhwc(Backend, const T* x, T* y, const Pool2dGeometry& g,
                             bool count_include_pad) {
  const int64_t C = g.c;
#pragma omp parallel for collapse(2) schedule(static) if (worth_threads(g))
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      const AvgWindow<int64_t> wh = avg_window(oh, g.in_h, g.kernel_h, g.stride_h, g.pad_h);
      for (int64_t ow = 0; ow < g.out_w; ++ow) {
        const AvgWindow<int64_t> ww = avg_window(ow, g.in_w, g.kernel_w, g.stride_w, g.pad_w);
        T* out = y + pixel(n, oh, ow, g.out_h, g.out_w, C);
        const auto count = static_cast<compute_t<T>>(avg_count(wh, ww, count_include_pad));
        ChannelSums<T> acc;
        const int64_t cb = ChannelSums<T>::width(C);
        for (int64_t c0 = 0; c0 < C; c0 += cb) {
          const int64_t nc = std::min(cb, C - c0);
          compute_t<T>* s = acc.sums(out + c0);
          for (int64_t c = 0; c < nc; ++c) s[c] = 0;
          for (int64_t ih = wh.begin; ih < wh.end; ++ih) {
            for (int64_t iw = ww.begin; iw < ww.end; ++iw) {
              const T* v = x + pixel(n, ih, iw, g.in_h, g.in_w, C) + c0;
#pragma omp simd
              for (int64_t c = 0; c < nc; ++c) s[c] += ld(v[c]);
            }
          }
          for (int64_t c = 0; c < nc; ++c) s[c] = s[c] / count;
          acc.store(out + c0, nc);
        }
      }
    }
  }
}

template <typename T>
void avg_pool2d_backward_nhwc(Backend, const T* grad_y, T* grad_x, const Pool2dGeometry& g,
                              bool count_include_pad) {
  const int64_t C = g.c;
#pragma omp parallel for collapse(2) schedule(static) if (worth_threads(g))
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t ih = 0; ih < g.in_h; ++ih) {
      int64_t oh0, oh1;
      window_covering(ih, g.pad_h, g.kernel_h, g.stride_h, g.out_h, oh0, oh1);
      for (int64_t iw = 0; iw < g.in_w; ++iw) {
        int64_t ow0, ow1;
        window_covering(iw, g.pad_w, g.kernel_w, g.stride_w, g.out_w, ow0, ow1);
        T* gx = grad_x + pixel(n, ih, iw, g.in_h, g.in_w, C);
        ChannelSums<T> acc;
        const int64_t cb = ChannelSums<T>::width(C);
        for (int64_t c0 = 0; c0 < C; c0 += cb) {
          const int64_t nc = std::min(cb, C - c0);
          compute_t<T>* s = acc.sums(gx + c0);
          for (int64_t c = 0; c < nc; ++c) s[c] = 0;
          for (int64_t oh = oh0; oh <= oh1; ++oh) {
            const AvgWindow<int64_t> wh =
                avg_window(oh, g.in_h, g.kernel_h, g.stride_h, g.pad_h);
            for (int64_t ow = ow0; ow <= ow1; ++ow) {
              const AvgWindow<int64_t> ww =
                  avg_window(ow, g.in_w, g.kernel_w, g.stride_w, g.pad_w);
              const auto count =
                  static_cast<compute_t<T>>(avg_count(wh, ww, count_include_pad));
              const T* gy = grad_y + pixel(n, oh, ow, g.out_h, g.out_w, C) + c0;
#pragma omp simd
              for (int64_t c = 0; c < nc; ++c) s[c] += ld(gy[c]) / count;  // the NCHW share
            }
          }
          acc.store(gx + c0, nc);
        }
      }
    }
  }
}

// ---- Adaptive average pooling -------------------------------------------------------------

template <typename T>
void adaptive_avg_pool2d_forward_nhwc(Backend, const T* x, T* y, const Pool2dGeometry& g) {
  const int64_t C = g.c;
#pragma omp parallel for collapse(2) schedule(static) if (worth_threads(g))
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      const int64_t h0 = adaptive_start(oh, g.in_h, g.out_h);
      const int64_t h1 = adaptive_end(oh, g.in_h, g.out_h);
      for (int64_t ow = 0; ow < g.out_w; ++ow) {
        const int64_t w0 = adaptive_start(ow, g.in_w, g.out_w);
        const int64_t w1 = adaptive_end(ow, g.in_w, g.out_w);
        T* out = y + pixel(n, oh, ow, g.out_h, g.out_w, C);
        const auto count = static_cast<compute_t<T>>((h1 - h0) * (w1 - w0));
        ChannelSums<T> acc;
        const int64_t cb = ChannelSums<T>::width(C);
        for (int64_t c0 = 0; c0 < C; c0 += cb) {
          const int64_t nc = std::min(cb, C - c0);
          compute_t<T>* s = acc.sums(out + c0);
          for (int64_t c = 0; c < nc; ++c) s[c] = 0;
          for (int64_t ih = h0; ih < h1; ++ih) {
            for (int64_t iw = w0; iw < w1; ++iw) {
              const T* v = x + pixel(n, ih, iw, g.in_h, g.in_w, C) + c0;
#pragma omp simd
              for (int64_t c = 0; c < nc; ++c) s[c] += ld(v[c]);
            }
          }
          for (int64_t c = 0; c < nc; ++c) s[c] = s[c] / count;
          acc.store(out + c0, nc);
        }
      }
    }
  }
}

template <typename T>
void adaptive_avg_pool2d_backward_nhwc(Backend, const T* grad_y, T* grad_x,
                                       const Pool2dGeometry& g) {
  const int64_t C = g.c;
#pragma omp parallel for collapse(2) schedule(static) if (worth_threads(g))
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t ih = 0; ih < g.in_h; ++ih) {
      int64_t oh0, oh1;
      adaptive_covering(ih, g.in_h, g.out_h, oh0, oh1);
      for (int64_t iw = 0; iw < g.in_w; ++iw) {
        int64_t ow0, ow1;
        adaptive_covering(iw, g.in_w, g.out_w, ow0, ow1);
        T* gx = grad_x + pixel(n, ih, iw, g.in_h, g.in_w, C);
        ChannelSums<T> acc;
        const int64_t cb = ChannelSums<T>::width(C);
        for (int64_t c0 = 0; c0 < C; c0 += cb) {
          const int64_t nc = std::min(cb, C - c0);
          compute_t<T>* s = acc.sums(gx + c0);
          for (int64_t c = 0; c < nc; ++c) s[c] = 0;
          for (int64_t oh = oh0; oh <= oh1; ++oh) {
            const int64_t h0 = adaptive_start(oh, g.in_h, g.out_h);
            const int64_t h1 = adaptive_end(oh, g.in_h, g.out_h);
            if (ih < h0 || ih >= h1) continue;
            for (int64_t ow = ow0; ow <= ow1; ++ow) {
              const int64_t w0 = adaptive_start(ow, g.in_w, g.out_w);
              const int64_t w1 = adaptive_end(ow, g.in_w, g.out_w);
              if (iw < w0 || iw >= w1) continue;
              const auto count = static_cast<compute_t<T>>((h1 - h0) * (w1 - w0));
              const T* gy = grad_y + pixel(n, oh, ow, g.out_h, g.out_w, C) + c0;
#pragma omp simd
              for (int64_t c = 0; c < nc; ++c) s[c] += ld(gy[c]) / count;
            }
          }
          acc.store(gx + c0, nc);
        }
      }
    }
  }
}

// float for training, double for gradient checks, Half and BFloat16 for 16-bit activations, as
// the NCHW kernels.
#define KILN_INSTANTIATE_POOL_NHWC(T)                                                          \
  template void max_pool2d_forward_nhwc<T>(Backend, const T*, T*, int32_t*,                    \
                                           const Pool2dGeometry&);                             \
  template void max_pool2d_backward_nhwc<T>(Backend, const T*, const int32_t*, T*,             \
                                            const Pool2dGeometry&);                            \
  template void avg_pool2d_forward_nhwc<T>(Backend, const T*, T*, const Pool2dGeometry&, bool); \
  template void avg_pool2d_backward_nhwc<T>(Backend, const T*, T*, const Pool2dGeometry&,      \
                                            bool);                                             \
  template void adaptive_avg_pool2d_forward_nhwc<T>(Backend, const T*, T*,                     \
                                                    const Pool2dGeometry&);                    \
  template void adaptive_avg_pool2d_backward_nhwc<T>(Backend, const T*, T*,                    \
                                                     const Pool2dGeometry&);
KILN_INSTANTIATE_POOL_NHWC(float)
KILN_INSTANTIATE_POOL_NHWC(double)
KILN_INSTANTIATE_POOL_NHWC(Half)
KILN_INSTANTIATE_POOL_NHWC(BFloat16)
#undef KILN_INSTANTIATE_POOL_NHWC

}  // namespace kiln::cpu
