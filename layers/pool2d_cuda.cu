// pool2d_cuda.cu: CUDA kernels of max, average and adaptive average pooling; the CPU twins in
// pool2d_cpu.cpp are the specification (windows, divisors, tie and NaN rules: pool2d_kernels.h).
//
// How the work is split. Pooling does a handful of operations per element it reads: it is
// bound by memory traffic, and the simple mapping is the right one.
//   - Forward: one thread per OUTPUT element (grid-stride over the flattened (N*C, OH, OW)
//     tensor). The thread walks its window in the CPU's order (rows, then columns), so max
//     pooling keeps the first maximum in row-major order and lets NaN through exactly as the
//     CPU does, and writes the same int32 in-plane index (ih * W + iw): the indices are
//     bit-identical. Average pooling sums in the same order and divides by the same count: the
//     same bits as the CPU (IEEE add and divide are correctly rounded on both).
//     Consecutive threads take consecutive outputs of a row, so their window reads are close
//     together and the writes are coalesced.
//   - Backward: one thread per INPUT element, a GATHER. The CPU scatters every output gradient
//     into its window (or its argmax); with threads per output that would be a race, fixed with
//     atomics whose order (and so float rounding) varies from run to run. Instead the thread of
//     input pixel (ih, iw) finds the outputs whose window covers it, a small range:
//         oh from  ih + pad - kernel < 0 ? 0 : (ih + pad - kernel) / stride + 1
//            to    min((ih + pad) / stride, OH - 1)
//     (likewise ow), and adds their contributions in increasing (oh, ow) order: the order in
//     which the CPU's scatter reaches that pixel. So the gradients are deterministic and equal
//     the CPU's bit for bit. Max pooling adds grad_y[o] where indices[o] is this pixel; average
//     pooling adds grad_y[o] / count(o). For adaptive pooling the covering outputs are found
//     from the window formula (a range widened by one on each side, then checked).
// Index arithmetic is 32-bit (the op checks that the tensors have fewer than 2^31 elements):
// 64-bit division is many times slower on a GPU.
#include "engine/cuda/runtime.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/launch.h"
#include "engine/dtype.h"
#include "engine/error.h"
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

// ---- Max pooling -------------------------------------------------------------------------------

// One thread per output (plane, oh, ow).
template <typename T>
__global__ void max_pool2d_forward_kernel(const T* __restrict__ x, T* __restrict__ y,
                                          int32_t* __restrict__ indices, PoolDims d) {
  const int64_t total = static_cast<int64_t>(d.planes) * d.oh * d.ow;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int o = static_cast<int>(i);
    const int ow = o % d.ow, oh = o / d.ow % d.oh, plane = o / (d.ow * d.oh);
    const T* xp = x + static_cast<int64_t>(plane) * d.h * d.w;
    // The window clipped to the input: the padding is -inf, never the maximum.
    int h0 = oh * d.sh - d.ph, w0 = ow * d.sw - d.pw;
    const int h1 = min(h0 + d.kh, d.h), w1 = min(w0 + d.kw, d.w);
    h0 = max(h0, 0), w0 = max(w0, 0);
    using C = compute_t<T>;
    C best = static_cast<C>(-INFINITY);
    int best_i = h0 * d.w + w0;  // an all -inf window points at its first element
    for (int ih = h0; ih < h1; ++ih)
      for (int iw = w0; iw < w1; ++iw) {
        const C v = ld(xp[ih * d.w + iw]);
        if (v > best || v != v) {  // strictly greater, or NaN: the CPU's rule
          best = v;
          best_i = ih * d.w + iw;
        }
      }
    y[o] = convert_elem<T>(best);
    indices[o] = best_i;
  }
}

// One thread per input (plane, ih, iw): the sum of grad_y over the covering outputs whose
// argmax is this pixel.
template <typename T>
__global__ void max_pool2d_backward_kernel(const T* __restrict__ grad_y,
                                           const int32_t* __restrict__ indices,
                                           T* __restrict__ grad_x, PoolDims d) {
  const int64_t total = static_cast<int64_t>(d.planes) * d.h * d.w;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int e = static_cast<int>(i);
    const int iw = e % d.w, ih = e / d.w % d.h, plane = e / (d.w * d.h);
    const int self = ih * d.w + iw;
    const int base = plane * d.oh * d.ow;
    int oh0, oh1, ow0, ow1;
    window_covering(ih, d.ph, d.kh, d.sh, d.oh, oh0, oh1);
    window_covering(iw, d.pw, d.kw, d.sw, d.ow, ow0, ow1);
    compute_t<T> acc = 0;
    for (int oh = oh0; oh <= oh1; ++oh)
      for (int ow = ow0; ow <= ow1; ++ow) {
        const int o = base + oh * d.ow + ow;
        if (indices[o] == self) acc += ld(grad_y[o]);
      }
    grad_x[e] = convert_elem<T>(acc);
  }
}

// ---- Average pooling ---------------------------------------------------------------------------

// The windows and divisors of average pooling are the CPU's: avg_window and avg_count
// (pool2d_kernels.h), here in 32-bit indices.

template <typename T>
__global__ void avg_pool2d_forward_kernel(const T* __restrict__ x, T* __restrict__ y, PoolDims d,
                                          bool include_pad) {
  const int64_t total = static_cast<int64_t>(d.planes) * d.oh * d.ow;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int o = static_cast<int>(i);
    const int ow = o % d.ow, oh = o / d.ow % d.oh, plane = o / (d.ow * d.oh);
    const T* xp = x + static_cast<int64_t>(plane) * d.h * d.w;
    const AvgWindow<int> wh = avg_window(oh, d.h, d.kh, d.sh, d.ph);
    const AvgWindow<int> ww = avg_window(ow, d.w, d.kw, d.sw, d.pw);
    compute_t<T> s = 0;
    for (int ih = wh.begin; ih < wh.end; ++ih)
      for (int iw = ww.begin; iw < ww.end; ++iw) s += ld(xp[ih * d.w + iw]);
    const auto count = static_cast<compute_t<T>>(avg_count(wh, ww, include_pad));
    y[o] = convert_elem<T>(s / count);
  }
}

// One thread per input: the sum of grad_y[o] / count(o) over the covering outputs.
template <typename T>
__global__ void avg_pool2d_backward_kernel(const T* __restrict__ grad_y, T* __restrict__ grad_x,
                                           PoolDims d, bool include_pad) {
  const int64_t total = static_cast<int64_t>(d.planes) * d.h * d.w;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int e = static_cast<int>(i);
    const int iw = e % d.w, ih = e / d.w % d.h, plane = e / (d.w * d.h);
    const T* gyp = grad_y + static_cast<int64_t>(plane) * d.oh * d.ow;
    int oh0, oh1, ow0, ow1;
    window_covering(ih, d.ph, d.kh, d.sh, d.oh, oh0, oh1);
    window_covering(iw, d.pw, d.kw, d.sw, d.ow, ow0, ow1);
    compute_t<T> acc = 0;
    for (int oh = oh0; oh <= oh1; ++oh) {
      const AvgWindow<int> wh = avg_window(oh, d.h, d.kh, d.sh, d.ph);
      for (int ow = ow0; ow <= ow1; ++ow) {
        const AvgWindow<int> ww = avg_window(ow, d.w, d.kw, d.sw, d.pw);
        const auto count = static_cast<compute_t<T>>(avg_count(wh, ww, include_pad));
        acc += ld(gyp[oh * d.ow + ow]) / count;
      }
    }
    grad_x[e] = convert_elem<T>(acc);
  }
}

// ---- Adaptive average pooling ------------------------------------------------------------------

template <typename T>
__global__ void adaptive_avg_pool2d_forward_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                   PoolDims d) {
  const int64_t total = static_cast<int64_t>(d.planes) * d.oh * d.ow;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int o = static_cast<int>(i);
    const int ow = o % d.ow, oh = o / d.ow % d.oh, plane = o / (d.ow * d.oh);
    const T* xp = x + static_cast<int64_t>(plane) * d.h * d.w;
    const int h0 = static_cast<int>(adaptive_start(oh, d.h, d.oh));
    const int h1 = static_cast<int>(adaptive_end(oh, d.h, d.oh));
    const int w0 = static_cast<int>(adaptive_start(ow, d.w, d.ow));
    const int w1 = static_cast<int>(adaptive_end(ow, d.w, d.ow));
    compute_t<T> s = 0;
    for (int ih = h0; ih < h1; ++ih)
      for (int iw = w0; iw < w1; ++iw) s += ld(xp[ih * d.w + iw]);
    y[o] = convert_elem<T>(s / static_cast<compute_t<T>>((h1 - h0) * (w1 - w0)));
  }
}

template <typename T>
__global__ void adaptive_avg_pool2d_backward_kernel(const T* __restrict__ grad_y,
                                                    T* __restrict__ grad_x, PoolDims d) {
  const int64_t total = static_cast<int64_t>(d.planes) * d.h * d.w;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int e = static_cast<int>(i);
    const int iw = e % d.w, ih = e / d.w % d.h, plane = e / (d.w * d.h);
    const T* gyp = grad_y + static_cast<int64_t>(plane) * d.oh * d.ow;
    int oh0, oh1, ow0, ow1;
    adaptive_covering(ih, d.h, d.oh, oh0, oh1);
    adaptive_covering(iw, d.w, d.ow, ow0, ow1);
    compute_t<T> acc = 0;
    for (int oh = oh0; oh <= oh1; ++oh) {
      const int h0 = static_cast<int>(adaptive_start(oh, d.h, d.oh));
      const int h1 = static_cast<int>(adaptive_end(oh, d.h, d.oh));
      if (ih < h0 || ih >= h1) continue;
      for (int ow = ow0; ow <= ow1; ++ow) {
        const int w0 = static_cast<int>(adaptive_start(ow, d.w, d.ow));
        const int w1 = static_cast<int>(adaptive_end(ow, d.w, d.ow));
        if (iw < w0 || iw >= w1) continue;
        acc += ld(gyp[oh * d.ow + ow]) / static_cast<compute_t<T>>((h1 - h0) * (w1 - w0));
      }
    }
    grad_x[e] = convert_elem<T>(acc);
  }
}

}  // namespace

template <typename T>
void max_pool2d_forward(Backend, const T* x, T* y, int32_t* indices, const Pool2dGeometry& g) {
  const PoolDims d = pool_dims("max_pool2d", g);
  if (out_numel(d) == 0) return;
  launch(max_pool2d_forward_kernel<T>, elementwise_config(out_numel(d)), x, y, indices, d);
}

template <typename T>
void max_pool2d_backward(Backend, const T* grad_y, const int32_t* indices, T* grad_x,
                         const Pool2dGeometry& g) {
  const PoolDims d = pool_dims("max_pool2d_backward", g);
  if (in_numel(d) == 0) return;
  launch(max_pool2d_backward_kernel<T>, elementwise_config(in_numel(d)), grad_y, indices, grad_x,
         d);
}

template <typename T>
void avg_pool2d_forward(Backend, const T* x, T* y, const Pool2dGeometry& g,
                        bool count_include_pad) {
  const PoolDims d = pool_dims("avg_pool2d", g);
  if (out_numel(d) == 0) return;
  launch(avg_pool2d_forward_kernel<T>, elementwise_config(out_numel(d)), x, y, d,
         count_include_pad);
}

template <typename T>
void avg_pool2d_backward(Backend, const T* grad_y, T* grad_x, const Pool2dGeometry& g,
                         bool count_include_pad) {
  const PoolDims d = pool_dims("avg_pool2d_backward", g);
  if (in_numel(d) == 0) return;
  launch(avg_pool2d_backward_kernel<T>, elementwise_config(in_numel(d)), grad_y, grad_x, d,
         count_include_pad);
}

template <typename T>
void adaptive_avg_pool2d_forward(Backend, const T* x, T* y, const Pool2dGeometry& g) {
  const PoolDims d = pool_dims("adaptive_avg_pool2d", g);
  if (out_numel(d) == 0) return;
  launch(adaptive_avg_pool2d_forward_kernel<T>, elementwise_config(out_numel(d)), x, y, d);
}

template <typename T>
void adaptive_avg_pool2d_backward(Backend, const T* grad_y, T* grad_x, const Pool2dGeometry& g) {
  const PoolDims d = pool_dims("adaptive_avg_pool2d_backward", g);
  if (in_numel(d) == 0) return;
  launch(adaptive_avg_pool2d_backward_kernel<T>, elementwise_config(in_numel(d)), grad_y, grad_x,
         d);
}

#define KILN_INSTANTIATE_POOL(T)                                                               \
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

}  // namespace kiln::cuda
