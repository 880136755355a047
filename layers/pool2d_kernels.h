// pool2d_kernels.h: the CPU kernels behind layers/pool2d.h (internal to kiln_layers), their
// CUDA twins (pool2d_cuda.cu) at the end, and the window rules both apply. Twins of one name and
// signature in cpu:: and cuda::, the backend's tag first (engine/dispatch.h).
//
// Every kernel sees dense row-major buffers. The NCHW kernels work plane by plane: one (n, c)
// plane of the input produces one plane of the output and nothing else, so OpenMP splits the
// N*C planes between threads and no two threads ever touch the same element. That makes the
// backward passes (which scatter into the input gradient) deterministic without atomics: a
// plane is zeroed and accumulated by one thread, in a fixed order. The channels-last (*_nhwc)
// kernels work pixel by pixel with the C channels as the inner, contiguous loop; their
// backward passes are gathers (window_covering below) that add in the same order.
//
// Geometry (PyTorch's floor mode): out = (in + 2 * pad - kernel) / stride + 1.
// Max pool indices are int32 offsets inside the input plane (ih * W + iw), as PyTorch's
// (which are int64): int32 halves their memory and bandwidth in the training hot path, and
// a plane never holds 2^31 elements (the op checks it).
//
// T is float, double, Half or BFloat16. A 16-bit kernel is the same template: it widens each
// element to compute_t<T> (f32) on load, compares or sums in f32 in the f32 kernel's order, and
// rounds once on store, so its results are the f32 kernel's on the widened input, rounded once.
#pragma once

#include <cstdint>

#include "engine/backend.h"
#include "engine/host_device.h"  // KILN_HOST_DEVICE

namespace kiln {

// The shape of one pooling problem. Output sizes are computed by the op (pool2d.cpp).
struct Pool2dGeometry {
  int64_t n = 0, c = 0;            // batch and channels: n * c independent planes
  int64_t in_h = 0, in_w = 0;      // input plane
  int64_t out_h = 0, out_w = 0;    // output plane
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t planes() const { return n * c; }
};

// ---- Average pooling windows: the rules both devices apply ---------------------------------
// I is the index type: int64_t on the CPU, int in the CUDA kernels (32-bit indexing).

// The window of output o along one dimension: [begin, end) clipped to the input [0, in), and
// padded_len, its length clipped only to the padded extent [-pad, in + pad) (PyTorch's rule).
template <typename I>
struct AvgWindow {
  I begin, end, padded_len;
};
template <typename I>
KILN_HOST_DEVICE inline AvgWindow<I> avg_window(I o, I in, I kernel, I stride, I pad) {
  const I b = o * stride - pad;
  const I e = b + kernel < in + pad ? b + kernel : in + pad;
  return {b > 0 ? b : I(0), e < in ? e : in, e - b};
}

// The divisor of an average-pool output with windows wh x ww: the padded area
// (count_include_pad) or the number of input elements it covers.
template <typename I>
KILN_HOST_DEVICE inline I avg_count(const AvgWindow<I>& wh, const AvgWindow<I>& ww,
                                    bool count_include_pad) {
  return count_include_pad ? wh.padded_len * ww.padded_len
                           : (wh.end - wh.begin) * (ww.end - ww.begin);
}

// Adaptive pooling: output cell i of `out` cells along a dimension of `in` elements averages
// input elements [adaptive_start, adaptive_end) = [floor(i * in / out), ceil((i + 1) * in / out)).
KILN_HOST_DEVICE inline int64_t adaptive_start(int64_t i, int64_t in, int64_t out) {
  return (i * in) / out;
}
KILN_HOST_DEVICE inline int64_t adaptive_end(int64_t i, int64_t in, int64_t out) {
  return ((i + 1) * in + out - 1) / out;
}

// ---- Gathers: the outputs whose window covers one input element ---------------------------
// A backward pass written as a gather (one input element sums the outputs that read it) walks
// these ranges in increasing order: the order in which the scatter of the NCHW CPU kernels
// reaches that element, so both give the same bits.

// The outputs o (along one dimension) whose window [o*stride - pad, o*stride - pad + kernel)
// contains input i: [lo, hi] (empty when lo > hi).
template <typename I>
KILN_HOST_DEVICE inline void window_covering(I i, I pad, I kernel, I stride, I out, I& lo,
                                             I& hi) {
  const I a = i + pad - kernel;
  lo = a < 0 ? I(0) : a / stride + 1;
  const I b = (i + pad) / stride;
  hi = b < out - 1 ? b : out - 1;
}

// The outputs whose adaptive window contains input i: start(o) <= i < end(o) holds for o in
// [floor(i * out / in), ceil((i + 1) * out / in) - 1]; the range returned is one wider on each
// side, so rounding at the ends can never drop one, and the caller checks each o.
template <typename I>
KILN_HOST_DEVICE inline void adaptive_covering(I i, I in, I out, I& lo, I& hi) {
  const I a = static_cast<I>((static_cast<int64_t>(i) * out) / in) - 1;
  const I b = static_cast<I>(((static_cast<int64_t>(i) + 1) * out + in - 1) / in);
  lo = a > 0 ? a : I(0);
  hi = b < out - 1 ? b : out - 1;
}

}  // namespace kiln

namespace kiln::cpu {

// ---- Max pooling --------------------------------------------------------------------------
// x is (N, C, H, W); y is (N, C, OH, OW); indices is (N, C, OH, OW): for each output, where
// its maximum sits in its input plane. Ties keep the first element in row-major order; a NaN
// wins (it propagates), as in PyTorch.
template <typename T>
void max_pool2d_forward(Backend, const T* x, T* y, int32_t* indices, const Pool2dGeometry& g);
// grad_y and indices are (N, C, OH, OW); grad_x is (N, C, H, W), fully overwritten:
// grad_x[plane][indices[o]] += grad_y[o], every other element 0.
template <typename T>
void max_pool2d_backward(Backend, const T* grad_y, const int32_t* indices, T* grad_x,
                         const Pool2dGeometry& g);

// The same two kernels on the channel-blocked layout of layers/layout.h: x and grad_x are
// (N, C/16, H, W, 16), y, grad_y and indices (N, C/16, OH, OW, 16); g.c is the number of
// channels (a multiple of 16). Indices are plane offsets ih * W + iw, as above.
// Definitions: layers/pool2d_blocked_cpu.cpp. CPU only: the op unblocks a CUDA input first.
template <typename T>
void max_pool2d_forward_blocked(Backend, const T* x, T* y, int32_t* indices,
                                const Pool2dGeometry& g);
template <typename T>
void max_pool2d_backward_blocked(Backend, const T* grad_y, const int32_t* indices, T* grad_x,
                                 const Pool2dGeometry& g);

// ---- Channels-last (layers/pool2d_nhwc_cpu.cpp) -------------------------------------------
// The six kernels below on channels-last tensors (MemoryFormat::ChannelsLast, engine/tensor.h):
// x and grad_x lie in memory as (N, H, W, C), y, grad_y and indices as (N, OH, OW, C). The
// results are the NCHW kernels' bit for bit, each element stored at its NHWC place: an index is
// still the offset ih * W + iw in its channel's plane, and each output sums (or compares) the
// same elements in the same order.
template <typename T>
void max_pool2d_forward_nhwc(Backend, const T* x, T* y, int32_t* indices,
                             const Pool2dGeometry& g);
template <typename T>
void max_pool2d_backward_nhwc(Backend, const T* grad_y, const int32_t* indices, T* grad_x,
                              const Pool2dGeometry& g);
template <typename T>
void avg_pool2d_forward_nhwc(Backend, const T* x, T* y, const Pool2dGeometry& g,
                             bool count_include_pad);
template <typename T>
void avg_pool2d_backward_nhwc(Backend, const T* grad_y, T* grad_x, const Pool2dGeometry& g,
                              bool count_include_pad);
template <typename T>
void adaptive_avg_pool2d_forward_nhwc(Backend, const T* x, T* y, const Pool2dGeometry& g);
template <typename T>
void adaptive_avg_pool2d_backward_nhwc(Backend, const T* grad_y, T* grad_x,
                                       const Pool2dGeometry& g);

// ---- Average pooling ----------------------------------------------------------------------
// x is (N, C, H, W); y is (N, C, OH, OW). Each output is the sum of its window's valid
// elements divided by the window area counting padding (count_include_pad, PyTorch's
// default) or by the number of valid elements only (count_include_pad = false).
template <typename T>
void avg_pool2d_forward(Backend, const T* x, T* y, const Pool2dGeometry& g,
                        bool count_include_pad);
// grad_y is (N, C, OH, OW); grad_x is (N, C, H, W), fully overwritten.
template <typename T>
void avg_pool2d_backward(Backend, const T* grad_y, T* grad_x, const Pool2dGeometry& g,
                         bool count_include_pad);

// ---- Adaptive average pooling -------------------------------------------------------------
// Output row i averages input rows [floor(i * H / OH), ceil((i + 1) * H / OH)), likewise for
// columns (adaptive_start / adaptive_end above); windows may overlap when H is not a multiple
// of OH. kernel/stride/pad of `g` are ignored. x is (N, C, H, W); y is (N, C, OH, OW).
template <typename T>
void adaptive_avg_pool2d_forward(Backend, const T* x, T* y, const Pool2dGeometry& g);
// grad_y is (N, C, OH, OW); grad_x is (N, C, H, W), fully overwritten.
template <typename T>
void adaptive_avg_pool2d_backward(Backend, const T* grad_y, T* grad_x, const Pool2dGeometry& g);

}  // namespace kiln::cpu

// ---- CUDA (layers/pool2d_cuda.cu) ------------------------------------------------------------
// The same kernels for tensors on a CUDA device: the same arguments as device pointers, the same
// results. Max-pool indices are bit-identical to the CPU's (same window order, same tie and NaN
// rule), and so are the max-pool gradients. Backward passes are gathers (one thread per input
// element sums the outputs whose window covers it, in the CPU's order): deterministic, no
// atomics. They launch on cuda::current_stream() of the current device (the op holds a
// cuda::DeviceGuard) and return without synchronising.
namespace kiln::cuda {

template <typename T>
void max_pool2d_forward(Backend, const T* x, T* y, int32_t* indices, const Pool2dGeometry& g);
template <typename T>
void max_pool2d_backward(Backend, const T* grad_y, const int32_t* indices, T* grad_x,
                         const Pool2dGeometry& g);
template <typename T>
void avg_pool2d_forward(Backend, const T* x, T* y, const Pool2dGeometry& g,
                        bool count_include_pad);
template <typename T>
void avg_pool2d_backward(Backend, const T* grad_y, T* grad_x, const Pool2dGeometry& g,
                         bool count_include_pad);
template <typename T>
void adaptive_avg_pool2d_forward(Backend, const T* x, T* y, const Pool2dGeometry& g);
template <typename T>
void adaptive_avg_pool2d_backward(Backend, const T* grad_y, T* grad_x, const Pool2dGeometry& g);

// Channels-last twins (layers/pool2d_nhwc_cuda.cu): the cpu:: *_nhwc kernels' arguments and
// results, bit for bit.
template <typename T>
void max_pool2d_forward_nhwc(Backend, const T* x, T* y, int32_t* indices,
                             const Pool2dGeometry& g);
template <typename T>
void max_pool2d_backward_nhwc(Backend, const T* grad_y, const int32_t* indices, T* grad_x,
                              const Pool2dGeometry& g);
template <typename T>
void avg_pool2d_forward_nhwc(Backend, const T* x, T* y, const Pool2dGeometry& g,
                             bool count_include_pad);
template <typename T>
void avg_pool2d_backward_nhwc(Backend, const T* grad_y, T* grad_x, const Pool2dGeometry& g,
                              bool count_include_pad);
template <typename T>
void adaptive_avg_pool2d_forward_nhwc(Backend, const T* x, T* y, const Pool2dGeometry& g);
template <typename T>
void adaptive_avg_pool2d_backward_nhwc(Backend, const T* grad_y, T* grad_x,
                                       const Pool2dGeometry& g);

}  // namespace kiln::cuda
