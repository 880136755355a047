// pool2d_nhwc_cuda.cu: CUDA kernels of max, average and adaptive average pooling on
// channels-last tensors, x (N, H, W, C) in memory and y (N, OH, OW, C); the CPU twins in
// pool2d_nhwc_cpu.cpp and the NCHW kernels are the specification, and the results are theirs
// bit for bit.
//
// The mapping is pool2d_cuda.cu's, with the channel as the fastest index:
//   - Forward: one thread per OUTPUT element (n, oh, ow, c), c fastest. A warp's 32 threads
//     take 32 channels of one output pixel, so at every step of the window walk they read 32
//     consecutive elements of one input pixel: coalesced loads, where the NCHW kernel's
//     threads read elements a stride apart. The walk is the NCHW thread's (rows, then columns;
//     first maximum wins, NaN propagates; a sum from 0, one division), so are the bits.
//   - Backward: one thread per INPUT element (n, ih, iw, c), a gather over the outputs whose
//     window covers the pixel (window_covering, adaptive_covering: pool2d_kernels.h) in
//     increasing (oh, ow) order, as the NCHW kernel: deterministic, no atomics, and the same
//     sums as the CPU's scatter. Max pooling adds grad_y[o] where indices[o] is this pixel's
//     offset ih * W + iw (the index keeps its NCHW meaning; only its place is NHWC).
//   - 16-bit activations (Half, BFloat16): a thread takes 8 neighbouring channels instead of one
//     (kVec), read with one 16-byte load per window step where they lie whole and aligned (and
//     one element at a time in a pixel's last, partial group), and written with one 16-byte
//     store. Per channel the walk, the f32 arithmetic and the single rounding are the f32
//     kernel's, so the bits are the CPU's. Each thread writes only its own group: no races.
// Index arithmetic is 32-bit (pool_dims checks the sizes).
#include "engine/cuda/runtime.h"

#include <cmath>
#include <cstdint>

#include "engine/cuda/launch.h"
#include "engine/dtype.h"
#include "engine/host_device.h"
#include "layers/pool2d_cuda.cuh"
#include "layers/pool2d_kernels.h"

namespace kiln::cuda {

namespace {

using pool_detail::elementwise_config;
using pool_detail::ld;
using pool_detail::pool_dims;
using pool_detail::PoolDims;

// The channels-last dims: C, and the images N (PoolDims keeps N * C as its planes).
struct NhwcDims {
  PoolDims d;
  int n, c;
  int groups;  // channel groups of a pixel: ceil(C / V), one thread each
};

// Channels per thread: a 16-bit thread takes V = 8 neighbouring channels of a pixel, one 16-byte
// load (uint4) where the 8 lie whole and aligned, one element at a time otherwise (the pixel's
// last group when C is not a multiple of 8, or C not a multiple of 8 at all); f32 and f64 take
// one channel per thread (a warp's 32 loads are already 128 or 256 contiguous bytes).
template <typename T>
constexpr int kVec = is_low_precision_v<T> ? 8 : 1;

template <typename T>
NhwcDims nhwc_dims(const char* op, const Pool2dGeometry& g) {
  const int c = static_cast<int>(g.c);
  return {pool_dims(op, g), static_cast<int>(g.n), c, (c + kVec<T> - 1) / kVec<T>};
}

// The threads of a pass: one per channel group of every pixel of `rows` x `cols`.
KILN_HOST_DEVICE inline int64_t group_threads(const NhwcDims& nd, int rows, int cols) {
  return static_cast<int64_t>(nd.n) * rows * cols * nd.groups;
}

// Thread e's pixel and channel group in an (N, rows, cols, groups) grid, group fastest: c is the
// group's first channel, nc its number of channels (V, or fewer in a pixel's last group).
struct Pixel {
  int n, h, w, c, nc;
};
template <int V>
__device__ __forceinline__ Pixel split(int e, int rows, int cols, const NhwcDims& nd) {
  Pixel p;
  const int group = e % nd.groups;
  const int pix = e / nd.groups;
  p.c = group * V;
  p.nc = min(V, nd.c - p.c);
  p.w = pix % cols;
  p.h = pix / cols % rows;
  p.n = pix / (cols * rows);
  return p;
}

// The offset of channel c of pixel (n, h, w) in an (N, rows, cols, C) buffer.
__device__ __forceinline__ int at(int n, int h, int w, int c, int rows, int cols, int channels) {
  return ((n * rows + h) * cols + w) * channels + c;
}

template <typename T>
__device__ __forceinline__ bool whole_vector(const T* p, int nc) {
  return nc == 8 && (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Loads the nc (<= V) channels at p, widened; the lanes past nc are 0.
template <typename T, int V>
__device__ __forceinline__ void load_group(const T* p, int nc, compute_t<T> (&v)[V]) {
  if constexpr (V == 8) {
    if (whole_vector(p, nc)) {
      const uint4 raw = *reinterpret_cast<const uint4*>(p);
      const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
      for (int i = 0; i < 4; ++i) {  // little-endian: channel 2i in the low half
        v[2 * i] = ld(T{static_cast<uint16_t>(w[i] & 0xffffu)});
        v[2 * i + 1] = ld(T{static_cast<uint16_t>(w[i] >> 16)});
      }
      return;
    }
  }
  for (int i = 0; i < V; ++i) v[i] = i < nc ? ld(p[i]) : compute_t<T>(0);
}

// Stores the nc (<= V) values at p, each rounded once to T.
template <typename T, int V>
__device__ __forceinline__ void store_group(T* p, int nc, const compute_t<T> (&v)[V]) {
  if constexpr (V == 8) {
    if (whole_vector(p, nc)) {
      unsigned w[4];
      for (int i = 0; i < 4; ++i)
        w[i] = static_cast<unsigned>(convert_elem<T>(v[2 * i]).bits) |
               (static_cast<unsigned>(convert_elem<T>(v[2 * i + 1]).bits) << 16);
      *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
      return;
    }
  }
  for (int i = 0; i < nc; ++i) p[i] = convert_elem<T>(v[i]);
}

// ---- Max pooling -------------------------------------------------------------------------------

template <typename T>
__global__ void max_pool2d_forward_nhwc_kernel(const T* __restrict__ x, T* __restrict__ y,
                                               int32_t* __restrict__ indices, NhwcDims nd) {
  using C = compute_t<T>;
  constexpr int V = kVec<T>;
  const PoolDims& d = nd.d;
  const int64_t total = group_threads(nd, d.oh, d.ow);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Pixel p = split<V>(static_cast<int>(i), d.oh, d.ow, nd);
    // The window clipped to the input: the padding is -inf, never the maximum.
    int h0 = p.h * d.sh - d.ph, w0 = p.w * d.sw - d.pw;
    const int h1 = min(h0 + d.kh, d.h), w1 = min(w0 + d.kw, d.w);
    h0 = max(h0, 0), w0 = max(w0, 0);
    C best[V];
    int best_i[V];
    for (int j = 0; j < V; ++j) {
      best[j] = static_cast<C>(-INFINITY);
      best_i[j] = h0 * d.w + w0;  // an all -inf window points at its first element
    }
    for (int ih = h0; ih < h1; ++ih)
      for (int iw = w0; iw < w1; ++iw) {
        C v[V];
        load_group<T, V>(x + at(p.n, ih, iw, p.c, d.h, d.w, nd.c), p.nc, v);
        for (int j = 0; j < V; ++j)
          if (v[j] > best[j] || v[j] != v[j]) {  // strictly greater, or NaN: the CPU's rule
            best[j] = v[j];
            best_i[j] = ih * d.w + iw;
          }
      }
    const int o = at(p.n, p.h, p.w, p.c, d.oh, d.ow, nd.c);
    store_group<T, V>(y + o, p.nc, best);
    for (int j = 0; j < p.nc; ++j) indices[o + j] = best_i[j];
  }
}

template <typename T>
__global__ void max_pool2d_backward_nhwc_kernel(const T* __restrict__ grad_y,
                                                const int32_t* __restrict__ indices,
                                                T* __restrict__ grad_x, NhwcDims nd) {
  using C = compute_t<T>;
  constexpr int V = kVec<T>;
  const PoolDims& d = nd.d;
  const int64_t total = group_threads(nd, d.h, d.w);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Pixel p = split<V>(static_cast<int>(i), d.h, d.w, nd);
    const int self = p.h * d.w + p.w;
    int oh0, oh1, ow0, ow1;
    window_covering(p.h, d.ph, d.kh, d.sh, d.oh, oh0, oh1);
    window_covering(p.w, d.pw, d.kw, d.sw, d.ow, ow0, ow1);
    C acc[V] = {};
    for (int oh = oh0; oh <= oh1; ++oh)
      for (int ow = ow0; ow <= ow1; ++ow) {
        const int o = at(p.n, oh, ow, p.c, d.oh, d.ow, nd.c);
        C g[V];
        load_group<T, V>(grad_y + o, p.nc, g);
        for (int j = 0; j < p.nc; ++j)
          if (indices[o + j] == self) acc[j] += g[j];
      }
    store_group<T, V>(grad_x + at(p.n, p.h, p.w, p.c, d.h, d.w, nd.c), p.nc, acc);
  }
}

// ---- Average pooling ---------------------------------------------------------------------------

template <typename T>
__global__ void avg_pool2d_forward_nhwc_kernel(const T* __restrict__ x, T* __restrict__ y,
                                               NhwcDims nd, bool include_pad) {
  using C = compute_t<T>;
  constexpr int V = kVec<T>;
  const PoolDims& d = nd.d;
  const int64_t total = group_threads(nd, d.oh, d.ow);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Pixel p = split<V>(static_cast<int>(i), d.oh, d.ow, nd);
    const AvgWindow<int> wh = avg_window(p.h, d.h, d.kh, d.sh, d.ph);
    const AvgWindow<int> ww = avg_window(p.w, d.w, d.kw, d.sw, d.pw);
    C s[V] = {};
    for (int ih = wh.begin; ih < wh.end; ++ih)
      for (int iw = ww.begin; iw < ww.end; ++iw) {
        C v[V];
        load_group<T, V>(x + at(p.n, ih, iw, p.c, d.h, d.w, nd.c), p.nc, v);
        for (int j = 0; j < V; ++j) s[j] += v[j];
      }
    const auto count = static_cast<C>(avg_count(wh, ww, include_pad));
    for (int j = 0; j < V; ++j) s[j] = s[j] / count;
    store_group<T, V>(y + at(p.n, p.h, p.w, p.c, d.oh, d.ow, nd.c), p.nc, s);
  }
}

template <typename T>
__global__ void avg_pool2d_backward_nhwc_kernel(const T* __restrict__ grad_y,
                                                T* __restrict__ grad_x, NhwcDims nd,
                                                bool include_pad) {
  using C = compute_t<T>;
  constexpr int V = kVec<T>;
  const PoolDims& d = nd.d;
  const int64_t total = group_threads(nd, d.h, d.w);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Pixel p = split<V>(static_cast<int>(i), d.h, d.w, nd);
    int oh0, oh1, ow0, ow1;
    window_covering(p.h, d.ph, d.kh, d.sh, d.oh, oh0, oh1);
    window_covering(p.w, d.pw, d.kw, d.sw, d.ow, ow0, ow1);
    C acc[V] = {};
    for (int oh = oh0; oh <= oh1; ++oh) {
      const AvgWindow<int> wh = avg_window(oh, d.h, d.kh, d.sh, d.ph);
      for (int ow = ow0; ow <= ow1; ++ow) {
        const AvgWindow<int> ww = avg_window(ow, d.w, d.kw, d.sw, d.pw);
        const auto count = static_cast<C>(avg_count(wh, ww, include_pad));
        C g[V];
        load_group<T, V>(grad_y + at(p.n, oh, ow, p.c, d.oh, d.ow, nd.c), p.nc, g);
        for (int j = 0; j < V; ++j) acc[j] += g[j] / count;
      }
    }
    store_group<T, V>(grad_x + at(p.n, p.h, p.w, p.c, d.h, d.w, nd.c), p.nc, acc);
  }
}

// ---- Adaptive average pooling ------------------------------------------------------------------

template <typename T>
__global__ void adaptive_avg_pool2d_forward_nhwc_kernel(const T* __restrict__ x,
                                                        T* __restrict__ y, NhwcDims nd) {
  using C = compute_t<T>;
  constexpr int V = kVec<T>;
  const PoolDims& d = nd.d;
  const int64_t total = group_threads(nd, d.oh, d.ow);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Pixel p = split<V>(static_cast<int>(i), d.oh, d.ow, nd);
    const int h0 = static_cast<int>(adaptive_start(p.h, d.h, d.oh));
    const int h1 = static_cast<int>(adaptive_end(p.h, d.h, d.oh));
    const int w0 = static_cast<int>(adaptive_start(p.w, d.w, d.ow));
    const int w1 = static_cast<int>(adaptive_end(p.w, d.w, d.ow));
    C s[V] = {};
    for (int ih = h0; ih < h1; ++ih)
      for (int iw = w0; iw < w1; ++iw) {
        C v[V];
        load_group<T, V>(x + at(p.n, ih, iw, p.c, d.h, d.w, nd.c), p.nc, v);
        for (int j = 0; j < V; ++j) s[j] += v[j];
      }
    const auto count = static_cast<C>((h1 - h0) * (w1 - w0));
    for (int j = 0; j < V; ++j) s[j] = s[j] / count;
    store_group<T, V>(y + at(p.n, p.h, p.w, p.c, d.oh, d.ow, nd.c), p.nc, s);
  }
}

template <typename T>
__global__ void adaptive_avg_pool2d_backward_nhwc_kernel(const T* __restrict__ grad_y,
                                                         T* __restrict__ grad_x, NhwcDims nd) {
  using C = compute_t<T>;
  constexpr int V = kVec<T>;
  const PoolDims& d = nd.d;
  const int64_t total = group_threads(nd, d.h, d.w);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Pixel p = split<V>(static_cast<int>(i), d.h, d.w, nd);
    int oh0, oh1, ow0, ow1;
    adaptive_covering(p.h, d.h, d.oh, oh0, oh1);
    adaptive_covering(p.w, d.w, d.ow, ow0, ow1);
    C acc[V] = {};
    for (int oh = oh0; oh <= oh1; ++oh) {
      const int h0 = static_cast<int>(adaptive_start(oh, d.h, d.oh));
      const int h1 = static_cast<int>(adaptive_end(oh, d.h, d.oh));
      if (p.h < h0 || p.h >= h1) continue;
      for (int ow = ow0; ow <= ow1; ++ow) {
        const int w0 = static_cast<int>(adaptive_start(ow, d.w, d.ow));
        const int w1 = static_cast<int>(adaptive_end(ow, d.w, d.ow));
        if (p.w < w0 || p.w >= w1) continue;
        const auto count = static_cast<C>((h1 - h0) * (w1 - w0));
        C g[V];
        load_group<T, V>(grad_y + at(p.n, oh, ow, p.c, d.oh, d.ow, nd.c), p.nc, g);
        for (int j = 0; j < V; ++j) acc[j] += g[j] / count;
      }
    }
    store_group<T, V>(grad_x + at(p.n, p.h, p.w, p.c, d.h, d.w, nd.c), p.nc, acc);
  }
}

}  // namespace

template <typename T>
void max_pool2d_forward_nhwc(Backend, const T* x, T* y, int32_t* indices,
                             const Pool2dGeometry& g) {
  const NhwcDims nd = nhwc_dims<T>("max_pool2d", g);
  const int64_t threads = group_threads(nd, nd.d.oh, nd.d.ow);
  if (threads == 0) return;
  launch(max_pool2d_forward_nhwc_kernel<T>, elementwise_config(threads), x, y, indices,
         nd);
}

template <typename T>
void max_pool2d_backward_nhwc(Backend, const T* grad_y, const int32_t* indices, T* grad_x,
                              const Pool2dGeometry& g) {
  const NhwcDims nd = nhwc_dims<T>("max_pool2d_backward", g);
  const int64_t threads = group_threads(nd, nd.d.h, nd.d.w);
  if (threads == 0) return;
  launch(max_pool2d_backward_nhwc_kernel<T>, elementwise_config(threads), grad_y,
         indices, grad_x, nd);
}

template <typename T>
void avg_pool2d_forward_nhwc(Backend, const T* x, T* y, const Pool2dGeometry& g,
                             bool count_include_pad) {
  const NhwcDims nd = nhwc_dims<T>("avg_pool2d", g);
  const int64_t threads = group_threads(nd, nd.d.oh, nd.d.ow);
  if (threads == 0) return;
  launch(avg_pool2d_forward_nhwc_kernel<T>, elementwise_config(threads), x, y, nd,
         count_include_pad);
}

template <typename T>
void avg_pool2d_backward_nhwc(Backend, const T* grad_y, T* grad_x, const Pool2dGeometry& g,
                              bool count_include_pad) {
  const NhwcDims nd = nhwc_dims<T>("avg_pool2d_backward", g);
  const int64_t threads = group_threads(nd, nd.d.h, nd.d.w);
  if (threads == 0) return;
  launch(avg_pool2d_backward_nhwc_kernel<T>, elementwise_config(threads), grad_y, grad_x,
         nd, count_include_pad);
}

template <typename T>
void adaptive_avg_pool2d_forward_nhwc(Backend, const T* x, T* y, const Pool2dGeometry& g) {
  const NhwcDims nd = nhwc_dims<T>("adaptive_avg_pool2d", g);
  const int64_t threads = group_threads(nd, nd.d.oh, nd.d.ow);
  if (threads == 0) return;
  launch(adaptive_avg_pool2d_forward_nhwc_kernel<T>, elementwise_config(threads), x, y,
         nd);
}

template <typename T>
void adaptive_avg_pool2d_backward_nhwc(Backend, const T* grad_y, T* grad_x,
                                       const Pool2dGeometry& g) {
  const NhwcDims nd = nhwc_dims<T>("adaptive_avg_pool2d_backward", g);
  const int64_t threads = group_threads(nd, nd.d.h, nd.d.w);
  if (threads == 0) return;
  launch(adaptive_avg_pool2d_backward_nhwc_kernel<T>, elementwise_config(threads),
         grad_y, grad_x, nd);
}

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

}  // namespace kiln::cuda
