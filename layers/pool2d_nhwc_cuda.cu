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
using pool_detail::in_numel;
using pool_detail::ld;
using pool_detail::out_numel;
using pool_detail::pool_dims;
using pool_detail::PoolDims;

// The channels-last dims: C, and the images N (PoolDims keeps N * C as its planes).
struct NhwcDims {
  PoolDims d;
  int n, c;
};

NhwcDims nhwc_dims(const char* op, const Pool2dGeometry& g) {
  return {pool_dims(op, g), static_cast<int>(g.n), static_cast<int>(g.c)};
}

// Element e of an (N, rows, cols, C) buffer, split into its coordinates, channel fastest.
struct Pixel {
  int n, h, w, c;
};
__device__ __forceinline__ Pixel split(int e, int rows, int cols, int c) {
  Pixel p;
  p.c = e % c;
  const int pix = e / c;
  p.w = pix % cols;
  p.h = pix / cols % rows;
  p.n = pix / (cols * rows);
  return p;
}

// The offset of channel c of pixel (n, h, w) in an (N, rows, cols, C) buffer.
__device__ __forceinline__ int at(int n, int h, int w, int c, int rows, int cols, int channels) {
  return ((n * rows + h) * cols + w) * channels + c;
}

// ---- Max pooling -------------------------------------------------------------------------------

template <typename T>
__global__ void max_pool2d_forward_nhwc_kernel(const T* __restrict__ x, T* __restrict__ y,
                                               int32_t* __restrict__ indices, NhwcDims nd) {
  const PoolDims& d = nd.d;
  const int64_t total = static_cast<int64_t>(d.planes) * d.oh * d.ow;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int o = static_cast<int>(i);
    const Pixel p = split(o, d.oh, d.ow, nd.c);
    // The window clipped to the input: the padding is -inf, never the maximum.
    int h0 = p.h * d.sh - d.ph, w0 = p.w * d.sw - d.pw;
    const int h1 = min(h0 + d.kh, d.h), w1 = min(w0 + d.kw, d.w);
    h0 = max(h0, 0), w0 = max(w0, 0);
    using C = compute_t<T>;
    C best = static_cast<C>(-INFINITY);
    int best_i = h0 * d.w + w0;  // an all -inf window points at its first element
    for (int ih = h0; ih < h1; ++ih)
      for (int iw = w0; iw < w1; ++iw) {
        const C v = ld(x[at(p.n, ih, iw, p.c, d.h, d.w, nd.c)]);
        if (v > best || v != v) {  // strictly greater, or NaN: the CPU's rule
          best = v;
          best_i = ih * d.w + iw;
        }
      }
    y[o] = convert_elem<T>(best);
    indices[o] = best_i;
  }
}

template <typename T>
__global__ void max_pool2d_backward_nhwc_kernel(const T* __restrict__ grad_y,
                                                const int32_t* __restrict__ indices,
                                                T* __restrict__ grad_x, NhwcDims nd) {
  const PoolDims& d = nd.d;
  const int64_t total = static_cast<int64_t>(d.planes) * d.h * d.w;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int e = static_cast<int>(i);
    const Pixel p = split(e, d.h, d.w, nd.c);
    const int self = p.h * d.w + p.w;
    int oh0, oh1, ow0, ow1;
    window_covering(p.h, d.ph, d.kh, d.sh, d.oh, oh0, oh1);
    window_covering(p.w, d.pw, d.kw, d.sw, d.ow, ow0, ow1);
    compute_t<T> acc = 0;
    for (int oh = oh0; oh <= oh1; ++oh)
      for (int ow = ow0; ow <= ow1; ++ow) {
        const int o = at(p.n, oh, ow, p.c, d.oh, d.ow, nd.c);
        if (indices[o] == self) acc += ld(grad_y[o]);
      }
    grad_x[e] = convert_elem<T>(acc);
  }
}

// ---- Average pooling ---------------------------------------------------------------------------

template <typename T>
__global__ void avg_pool2d_forward_nhwc_kernel(const T* __restrict__ x, T* __restrict__ y,
                                               NhwcDims nd, bool include_pad) {
  const PoolDims& d = nd.d;
  const int64_t total = static_cast<int64_t>(d.planes) * d.oh * d.ow;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int o = static_cast<int>(i);
    const Pixel p = split(o, d.oh, d.ow, nd.c);
    const AvgWindow<int> wh = avg_window(p.h, d.h, d.kh, d.sh, d.ph);
    const AvgWindow<int> ww = avg_window(p.w, d.w, d.kw, d.sw, d.pw);
    compute_t<T> s = 0;
    for (int ih = wh.begin; ih < wh.end; ++ih)
      for (int iw = ww.begin; iw < ww.end; ++iw) s += ld(x[at(p.n, ih, iw, p.c, d.h, d.w, nd.c)]);
    const auto count = static_cast<compute_t<T>>(avg_count(wh, ww, include_pad));
    y[o] = convert_elem<T>(s / count);
  }
}

template <typename T>
__global__ void avg_pool2d_backward_nhwc_kernel(const T* __restrict__ grad_y,
                                                T* __restrict__ grad_x, NhwcDims nd,
                                                bool include_pad) {
  const PoolDims& d = nd.d;
  const int64_t total = static_cast<int64_t>(d.planes) * d.h * d.w;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int e = static_cast<int>(i);
    const Pixel p = split(e, d.h, d.w, nd.c);
    int oh0, oh1, ow0, ow1;
    window_covering(p.h, d.ph, d.kh, d.sh, d.oh, oh0, oh1);
    window_covering(p.w, d.pw, d.kw, d.sw, d.ow, ow0, ow1);
    compute_t<T> acc = 0;
    for (int oh = oh0; oh <= oh1; ++oh) {
      const AvgWindow<int> wh = avg_window(oh, d.h, d.kh, d.sh, d.ph);
      for (int ow = ow0; ow <= ow1; ++ow) {
        const AvgWindow<int> ww = avg_window(ow, d.w, d.kw, d.sw, d.pw);
        acc += ld(grad_y[at(p.n, oh, ow, p.c, d.oh, d.ow, nd.c)]) /
               static_cast<compute_t<T>>(avg_count(wh, ww, include_pad));
      }
    }
    grad_x[e] = convert_elem<T>(acc);
  }
}

// ---- Adaptive average pooling ------------------------------------------------------------------

template <typename T>
__global__ void adaptive_avg_pool2d_forward_nhwc_kernel(const T* __restrict__ x,
                                                        T* __restrict__ y, NhwcDims nd) {
  const PoolDims& d = nd.d;
  const int64_t total = static_cast<int64_t>(d.planes) * d.oh * d.ow;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int o = static_cast<int>(i);
    const Pixel p = split(o, d.oh, d.ow, nd.c);
    const int h0 = static_cast<int>(adaptive_start(p.h, d.h, d.oh));
    const int h1 = static_cast<int>(adaptive_end(p.h, d.h, d.oh));
    const int w0 = static_cast<int>(adaptive_start(p.w, d.w, d.ow));
    const int w1 = static_cast<int>(adaptive_end(p.w, d.w, d.ow));
    compute_t<T> s = 0;
    for (int ih = h0; ih < h1; ++ih)
      for (int iw = w0; iw < w1; ++iw) s += ld(x[at(p.n, ih, iw, p.c, d.h, d.w, nd.c)]);
    y[o] = convert_elem<T>(s / static_cast<compute_t<T>>((h1 - h0) * (w1 - w0)));
  }
}

template <typename T>
__global__ void adaptive_avg_pool2d_backward_nhwc_kernel(const T* __restrict__ grad_y,
                                                         T* __restrict__ grad_x, NhwcDims nd) {
  const PoolDims& d = nd.d;
  const int64_t total = static_cast<int64_t>(d.planes) * d.h * d.w;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int e = static_cast<int>(i);
    const Pixel p = split(e, d.h, d.w, nd.c);
    int oh0, oh1, ow0, ow1;
    adaptive_covering(p.h, d.h, d.oh, oh0, oh1);
    adaptive_covering(p.w, d.w, d.ow, ow0, ow1);
    compute_t<T> acc = 0;
    for (int oh = oh0; oh <= oh1; ++oh) {
      const int h0 = static_cast<int>(adaptive_start(oh, d.h, d.oh));
      const int h1 = static_cast<int>(adaptive_end(oh, d.h, d.oh));
      if (p.h < h0 || p.h >= h1) continue;
      for (int ow = ow0; ow <= ow1; ++ow) {
        const int w0 = static_cast<int>(adaptive_start(ow, d.w, d.ow));
        const int w1 = static_cast<int>(adaptive_end(ow, d.w, d.ow));
        if (p.w < w0 || p.w >= w1) continue;
        acc += ld(grad_y[at(p.n, oh, ow, p.c, d.oh, d.ow, nd.c)]) /
               static_cast<compute_t<T>>((h1 - h0) * (w1 - w0));
      }
    }
    grad_x[e] = convert_elem<T>(acc);
  }
}

}  // namespace

template <typename T>
void max_pool2d_forward_nhwc(Backend, const T* x, T* y, int32_t* indices,
                             const Pool2dGeometry& g) {
  const NhwcDims nd = nhwc_dims("max_pool2d", g);
  if (out_numel(nd.d) == 0) return;
  launch(max_pool2d_forward_nhwc_kernel<T>, elementwise_config(out_numel(nd.d)), x, y, indices,
         nd);
}

template <typename T>
void max_pool2d_backward_nhwc(Backend, const T* grad_y, const int32_t* indices, T* grad_x,
                              const Pool2dGeometry& g) {
  const NhwcDims nd = nhwc_dims("max_pool2d_backward", g);
  if (in_numel(nd.d) == 0) return;
  launch(max_pool2d_backward_nhwc_kernel<T>, elementwise_config(in_numel(nd.d)), grad_y,
         indices, grad_x, nd);
}

template <typename T>
void avg_pool2d_forward_nhwc(Backend, const T* x, T* y, const Pool2dGeometry& g,
                             bool count_include_pad) {
  const NhwcDims nd = nhwc_dims("avg_pool2d", g);
  if (out_numel(nd.d) == 0) return;
  launch(avg_pool2d_forward_nhwc_kernel<T>, elementwise_config(out_numel(nd.d)), x, y, nd,
         count_include_pad);
}

template <typename T>
void avg_pool2d_backward_nhwc(Backend, const T* grad_y, T* grad_x, const Pool2dGeometry& g,
                              bool count_include_pad) {
  const NhwcDims nd = nhwc_dims("avg_pool2d_backward", g);
  if (in_numel(nd.d) == 0) return;
  launch(avg_pool2d_backward_nhwc_kernel<T>, elementwise_config(in_numel(nd.d)), grad_y, grad_x,
         nd, count_include_pad);
}

template <typename T>
void adaptive_avg_pool2d_forward_nhwc(Backend, const T* x, T* y, const Pool2dGeometry& g) {
  const NhwcDims nd = nhwc_dims("adaptive_avg_pool2d", g);
  if (out_numel(nd.d) == 0) return;
  launch(adaptive_avg_pool2d_forward_nhwc_kernel<T>, elementwise_config(out_numel(nd.d)), x, y,
         nd);
}

template <typename T>
void adaptive_avg_pool2d_backward_nhwc(Backend, const T* grad_y, T* grad_x,
                                       const Pool2dGeometry& g) {
  const NhwcDims nd = nhwc_dims("adaptive_avg_pool2d_backward", g);
  if (in_numel(nd.d) == 0) return;
  launch(adaptive_avg_pool2d_backward_nhwc_kernel<T>, elementwise_config(in_numel(nd.d)),
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
