// pool2d_cpu.cpp: CPU kernels of max, average and adaptive average pooling (NCHW).
//
// Every kernel loops over the N*C planes with OpenMP; a plane is read and written by one
// thread only, so the scatters of the backward passes need no atomics and are deterministic.
// The plain loops are the specification. One fast path exists, for the 2x2 stride-2
// unpadded max pool of the MNIST CNN (128 x 64 planes of 24 x 24 per training step): it
// keeps the same semantics (first maximum in row-major order wins, NaN propagates) but is
// written without branches so the compiler vectorises it; the tests check both paths against
// a naive loop. Measured on the 2-core Zen 5 box, 1 thread, (128, 64, 24, 24) f32: the general
// loop takes 22 ms (a mispredicted branch per element), the fast path 0.9 ms (memory bound),
// PyTorch 1.13 31-40 ms; backward 1.0 ms (PyTorch 1.6-1.9 ms).
//
// 16-bit activations (Half, BFloat16) run the same templates: every element is widened to
// compute_t<T> (f32) as it is loaded, compared or summed in f32 in the same order as the f32
// kernel, and rounded once as it is stored, so a 16-bit result is the f32 kernel's on the
// widened input, rounded once (max pooling moves the winning element, no rounding at all). The
// backward scatters accumulate a plane in f32 (PlaneAccumulator) and round it once at the end.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "engine/dtype.h"
#include "engine/host_device.h"
#include "layers/pool2d_kernels.h"

namespace kiln::cpu {
namespace {

// Below this many input elements a kernel runs on the calling thread: waking a team costs
// more than it saves (and gradient checks call tiny kernels thousands of times).
constexpr int64_t kParallelMinElements = 1 << 15;
inline bool worth_threads(const Pool2dGeometry& g) {
  return g.planes() * g.in_h * g.in_w >= kParallelMinElements;
}

// "v beats the current maximum m": strictly greater, or NaN (NaN propagates, as in PyTorch).
template <typename T>
inline bool beats(T v, T m) {
  return v > m || std::isnan(v);
}

// An element widened to the arithmetic type (the identity for float and double).
template <typename T>
inline compute_t<T> ld(T v) {
  return convert_elem<compute_t<T>>(v);
}

// Where a backward scatter accumulates one input plane: in place in grad_x when T is its own
// compute type; otherwise in an f32 plane owned by the thread, rounded into grad_x once by
// finish(). Either way the plane starts at zero.
template <typename T>
class PlaneAccumulator {
 public:
  using C = compute_t<T>;
  explicit PlaneAccumulator(int64_t plane) {
    if constexpr (!std::is_same_v<T, C>) buf_.resize(static_cast<size_t>(plane));
  }
  C* begin(T* gxp, int64_t plane) {
    if constexpr (std::is_same_v<T, C>) {
      std::memset(gxp, 0, sizeof(T) * static_cast<size_t>(plane));
      return gxp;
    } else {
      std::fill(buf_.begin(), buf_.end(), C(0));
      return buf_.data();
    }
  }
  void finish(T* gxp, int64_t plane) const {
    if constexpr (!std::is_same_v<T, C>)
      for (int64_t i = 0; i < plane; ++i) gxp[i] = convert_elem<T>(buf_[static_cast<size_t>(i)]);
  }

 private:
  std::vector<C> buf_;
};

// One plane, any kernel/stride/padding. xp is (H, W); yp and ip are (OH, OW).
template <typename T>
void max_pool_plane_general(const T* xp, T* yp, int32_t* ip, const Pool2dGeometry& g) {
  for (int64_t oh = 0; oh < g.out_h; ++oh) {
    // The window's rows, clipped to the input: padding is -inf, i.e. never the maximum.
    int64_t h0 = oh * g.stride_h - g.pad_h;
    int64_t h1 = std::min(h0 + g.kernel_h, g.in_h);
    h0 = std::max<int64_t>(h0, 0);
    for (int64_t ow = 0; ow < g.out_w; ++ow) {
      int64_t w0 = ow * g.stride_w - g.pad_w;
      int64_t w1 = std::min(w0 + g.kernel_w, g.in_w);
      w0 = std::max<int64_t>(w0, 0);
      compute_t<T> best = -std::numeric_limits<compute_t<T>>::infinity();
      int64_t best_i = h0 * g.in_w + w0;  // an all -inf window points at its first element
      for (int64_t ih = h0; ih < h1; ++ih) {
        for (int64_t iw = w0; iw < w1; ++iw) {
          const compute_t<T> v = ld(xp[ih * g.in_w + iw]);
          if (beats(v, best)) {
            best = v;
            best_i = ih * g.in_w + iw;
          }
        }
      }
      yp[oh * g.out_w + ow] = convert_elem<T>(best);
      ip[oh * g.out_w + ow] = static_cast<int32_t>(best_i);
    }
  }
}

// One plane, 2x2 window, stride 2, no padding: the four candidates of output (oh, ow) are
// x[2oh][2ow], x[2oh][2ow+1], x[2oh+1][2ow], x[2oh+1][2ow+1], compared in that order with
// selects instead of branches (the loop over ow vectorises). simdlen(8): the MNIST rows have
// 12 outputs, and GCC 12's default 16-lane AVX-512 loop would never run, leaving everything to
// its scalar epilogue (6.7 ms instead of 0.9 ms).
template <typename T>
void max_pool_plane_2x2(const T* xp, T* yp, int32_t* ip, const Pool2dGeometry& g) {
  const int64_t W = g.in_w;
  for (int64_t oh = 0; oh < g.out_h; ++oh) {
    const T* r0 = xp + 2 * oh * W;  // top row of this output row's windows
    const T* r1 = r0 + W;           // bottom row
    T* yr = yp + oh * g.out_w;
    int32_t* ir = ip + oh * g.out_w;
    const int32_t top = static_cast<int32_t>(2 * oh * W);
    const int32_t bottom = static_cast<int32_t>(top + W);
#pragma omp simd simdlen(8)
    for (int64_t ow = 0; ow < g.out_w; ++ow) {
      const int32_t col = static_cast<int32_t>(2 * ow);
      compute_t<T> m = ld(r0[2 * ow]);
      int32_t i = top + col;
      compute_t<T> v = ld(r0[2 * ow + 1]);
      bool take = v > m || v != v;
      m = take ? v : m;
      i = take ? top + col + 1 : i;
      v = ld(r1[2 * ow]);
      take = v > m || v != v;
      m = take ? v : m;
      i = take ? bottom + col : i;
      v = ld(r1[2 * ow + 1]);
      take = v > m || v != v;
      m = take ? v : m;
      i = take ? bottom + col + 1 : i;
      yr[ow] = convert_elem<T>(m);
      ir[ow] = i;
    }
  }
}

}  // namespace

template <typename T>
void max_pool2d_forward(Backend, const T* x, T* y, int32_t* indices, const Pool2dGeometry& g) {
  const int64_t in_plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
  const bool fast = g.kernel_h == 2 && g.kernel_w == 2 && g.stride_h == 2 && g.stride_w == 2 &&
                    g.pad_h == 0 && g.pad_w == 0;
#pragma omp parallel for schedule(static) if (worth_threads(g))
  for (int64_t p = 0; p < g.planes(); ++p) {
    const T* xp = x + p * in_plane;  // plane p of x: (H, W)
    T* yp = y + p * out_plane;       // plane p of y: (OH, OW)
    int32_t* ip = indices + p * out_plane;
    if (fast) {
      max_pool_plane_2x2(xp, yp, ip, g);
    } else {
      max_pool_plane_general(xp, yp, ip, g);
    }
  }
}

template <typename T>
void max_pool2d_backward(Backend, const T* grad_y, const int32_t* indices, T* grad_x,
                         const Pool2dGeometry& g) {
  const int64_t in_plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
#pragma omp parallel if (worth_threads(g))
  {
    PlaneAccumulator<T> acc(in_plane);
#pragma omp for schedule(static)
    for (int64_t p = 0; p < g.planes(); ++p) {
      // The plane is zeroed then scattered into while it sits in L1: one pass over memory.
      T* gxp = grad_x + p * in_plane;
      const T* gyp = grad_y + p * out_plane;
      const int32_t* ip = indices + p * out_plane;
      compute_t<T>* a = acc.begin(gxp, in_plane);
      for (int64_t o = 0; o < out_plane; ++o) a[ip[o]] += ld(gyp[o]);
      acc.finish(gxp, in_plane);
    }
  }
}

// ---- Average pooling ----------------------------------------------------------------------
// The windows and divisors are avg_window / avg_count (pool2d_kernels.h), shared with CUDA.

template <typename T>
void avg_pool2d_forward(Backend, const T* x, T* y, const Pool2dGeometry& g,
                        bool count_include_pad) {
  const int64_t in_plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
#pragma omp parallel for schedule(static) if (worth_threads(g))
  for (int64_t p = 0; p < g.planes(); ++p) {
    const T* xp = x + p * in_plane;
    T* yp = y + p * out_plane;
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      const AvgWindow<int64_t> wh = avg_window(oh, g.in_h, g.kernel_h, g.stride_h, g.pad_h);
      for (int64_t ow = 0; ow < g.out_w; ++ow) {
        const AvgWindow<int64_t> ww = avg_window(ow, g.in_w, g.kernel_w, g.stride_w, g.pad_w);
        compute_t<T> s = 0;
        for (int64_t ih = wh.begin; ih < wh.end; ++ih)
          for (int64_t iw = ww.begin; iw < ww.end; ++iw) s += ld(xp[ih * g.in_w + iw]);
        const int64_t count = avg_count(wh, ww, count_include_pad);
        yp[oh * g.out_w + ow] = convert_elem<T>(s / static_cast<compute_t<T>>(count));
      }
    }
  }
}

template <typename T>
void avg_pool2d_backward(Backend, const T* grad_y, T* grad_x, const Pool2dGeometry& g,
                         bool count_include_pad) {
  using C = compute_t<T>;
  const int64_t in_plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
#pragma omp parallel if (worth_threads(g))
  {
    PlaneAccumulator<T> acc(in_plane);
#pragma omp for schedule(static)
    for (int64_t p = 0; p < g.planes(); ++p) {
      T* gxp = grad_x + p * in_plane;
      const T* gyp = grad_y + p * out_plane;
      C* a = acc.begin(gxp, in_plane);
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        const AvgWindow<int64_t> wh = avg_window(oh, g.in_h, g.kernel_h, g.stride_h, g.pad_h);
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          const AvgWindow<int64_t> ww =
              avg_window(ow, g.in_w, g.kernel_w, g.stride_w, g.pad_w);
          const int64_t count = avg_count(wh, ww, count_include_pad);
          // Each element of the window received grad_y / count of this output.
          const C share = ld(gyp[oh * g.out_w + ow]) / static_cast<C>(count);
          for (int64_t ih = wh.begin; ih < wh.end; ++ih)
            for (int64_t iw = ww.begin; iw < ww.end; ++iw) a[ih * g.in_w + iw] += share;
        }
      }
      acc.finish(gxp, in_plane);
    }
  }
}

// ---- Adaptive average pooling -------------------------------------------------------------

template <typename T>
void adaptive_avg_pool2d_forward(Backend, const T* x, T* y, const Pool2dGeometry& g) {
  const int64_t in_plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
#pragma omp parallel for schedule(static) if (worth_threads(g))
  for (int64_t p = 0; p < g.planes(); ++p) {
    const T* xp = x + p * in_plane;
    T* yp = y + p * out_plane;
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      int64_t h0 = adaptive_start(oh, g.in_h, g.out_h), h1 = adaptive_end(oh, g.in_h, g.out_h);
      for (int64_t ow = 0; ow < g.out_w; ++ow) {
        int64_t w0 = adaptive_start(ow, g.in_w, g.out_w);
        int64_t w1 = adaptive_end(ow, g.in_w, g.out_w);
        compute_t<T> s = 0;
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) s += ld(xp[ih * g.in_w + iw]);
        yp[oh * g.out_w + ow] =
            convert_elem<T>(s / static_cast<compute_t<T>>((h1 - h0) * (w1 - w0)));
      }
    }
  }
}

template <typename T>
void adaptive_avg_pool2d_backward(Backend, const T* grad_y, T* grad_x, const Pool2dGeometry& g) {
  using C = compute_t<T>;
  const int64_t in_plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
#pragma omp parallel if (worth_threads(g))
  {
    PlaneAccumulator<T> acc(in_plane);
#pragma omp for schedule(static)
    for (int64_t p = 0; p < g.planes(); ++p) {
      T* gxp = grad_x + p * in_plane;
      const T* gyp = grad_y + p * out_plane;
      C* a = acc.begin(gxp, in_plane);
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        int64_t h0 = adaptive_start(oh, g.in_h, g.out_h);
        int64_t h1 = adaptive_end(oh, g.in_h, g.out_h);
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          int64_t w0 = adaptive_start(ow, g.in_w, g.out_w);
          int64_t w1 = adaptive_end(ow, g.in_w, g.out_w);
          const C share = ld(gyp[oh * g.out_w + ow]) / static_cast<C>((h1 - h0) * (w1 - w0));
          for (int64_t ih = h0; ih < h1; ++ih)
            for (int64_t iw = w0; iw < w1; ++iw) a[ih * g.in_w + iw] += share;
        }
      }
      acc.finish(gxp, in_plane);
    }
  }
}

// float for training, double for gradient checks, Half and BFloat16 for 16-bit activations.
#define KILN_INSTANTIATE_POOL(T)                                                              \
  template void max_pool2d_forward<T>(Backend, const T*, T*, int32_t*, const Pool2dGeometry&);     \
  template void max_pool2d_backward<T>(Backend, const T*, const int32_t*, T*,                      \
                                           const Pool2dGeometry&);                            \
  template void avg_pool2d_forward<T>(Backend, const T*, T*, const Pool2dGeometry&, bool);         \
  template void avg_pool2d_backward<T>(Backend, const T*, T*, const Pool2dGeometry&, bool);        \
  template void adaptive_avg_pool2d_forward<T>(Backend, const T*, T*, const Pool2dGeometry&);      \
  template void adaptive_avg_pool2d_backward<T>(Backend, const T*, T*, const Pool2dGeometry&);
KILN_INSTANTIATE_POOL(float)
KILN_INSTANTIATE_POOL(double)
KILN_INSTANTIATE_POOL(Half)
KILN_INSTANTIATE_POOL(BFloat16)
#undef KILN_INSTANTIATE_POOL

}  // namespace kiln::cpu
