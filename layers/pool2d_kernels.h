// pool2d_kernels.h: the CPU kernels behind layers/pool2d.h (internal to kiln_layers), and their
// CUDA twins (pool2d_cuda.cu) at the end.
//
// Every kernel sees dense row-major buffers, NCHW, and works plane by plane: one (n, c) plane
// of the input produces one plane of the output and nothing else, so OpenMP splits the N*C
// planes between threads and no two threads ever touch the same element. That makes the
// backward passes (which scatter into the input gradient) deterministic without atomics: a
// plane is zeroed and accumulated by one thread, in a fixed order.
//
// Geometry (PyTorch's floor mode): out = (in + 2 * pad - kernel) / stride + 1.
// Max pool indices are int32 offsets inside the input plane (ih * W + iw), as PyTorch's
// (which are int64): int32 halves their memory and bandwidth in the training hot path, and
// a plane never holds 2^31 elements (the op checks it).
#pragma once

#include <cstdint>

#include "engine/host_device.h"  // the window rules both devices share

namespace kiln::cpu {

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

// ---- Max pooling --------------------------------------------------------------------------
// x is (N, C, H, W); y is (N, C, OH, OW); indices is (N, C, OH, OW): for each output, where
// its maximum sits in its input plane. Ties keep the first element in row-major order; a NaN
// wins (it propagates), as in PyTorch.
template <typename T>
void max_pool2d_forward_cpu(const T* x, T* y, int32_t* indices, const Pool2dGeometry& g);
// grad_y and indices are (N, C, OH, OW); grad_x is (N, C, H, W), fully overwritten:
// grad_x[plane][indices[o]] += grad_y[o], every other element 0.
template <typename T>
void max_pool2d_backward_cpu(const T* grad_y, const int32_t* indices, T* grad_x,
                             const Pool2dGeometry& g);

// The same two kernels on the channel-blocked layout of layers/layout.h: x and grad_x are
// (N, C/16, H, W, 16), y, grad_y and indices (N, C/16, OH, OW, 16); g.c is the number of
// channels (a multiple of 16). Indices are plane offsets ih * W + iw, as above.
// Definitions: layers/pool2d_blocked_cpu.cpp.
template <typename T>
void max_pool2d_forward_blocked_cpu(const T* x, T* y, int32_t* indices, const Pool2dGeometry& g);
template <typename T>
void max_pool2d_backward_blocked_cpu(const T* grad_y, const int32_t* indices, T* grad_x,
                                     const Pool2dGeometry& g);

// ---- Average pooling ----------------------------------------------------------------------
// x is (N, C, H, W); y is (N, C, OH, OW). Each output is the sum of its window's valid
// elements divided by the window area counting padding (count_include_pad, PyTorch's
// default) or by the number of valid elements only (count_include_pad = false).
template <typename T>
void avg_pool2d_forward_cpu(const T* x, T* y, const Pool2dGeometry& g, bool count_include_pad);
// grad_y is (N, C, OH, OW); grad_x is (N, C, H, W), fully overwritten.
template <typename T>
void avg_pool2d_backward_cpu(const T* grad_y, T* grad_x, const Pool2dGeometry& g,
                             bool count_include_pad);

// ---- Adaptive average pooling -------------------------------------------------------------
// Output row i averages input rows [floor(i * H / OH), ceil((i + 1) * H / OH)), likewise for
// columns (adaptive_start / adaptive_end in engine/host_device.h); windows may overlap when H
// is not a multiple of OH. kernel/stride/pad of `g` are ignored. x is (N, C, H, W); y is (N, C, OH, OW).
template <typename T>
void adaptive_avg_pool2d_forward_cpu(const T* x, T* y, const Pool2dGeometry& g);
// grad_y is (N, C, OH, OW); grad_x is (N, C, H, W), fully overwritten.
template <typename T>
void adaptive_avg_pool2d_backward_cpu(const T* grad_y, T* grad_x, const Pool2dGeometry& g);

}  // namespace kiln::cpu

// ---- CUDA (layers/pool2d_cuda.cu) ------------------------------------------------------------
// The same kernels for tensors on a CUDA device: the same arguments as device pointers, the same
// results. Max-pool indices are bit-identical to the CPU's (same window order, same tie and NaN
// rule), and so are the max-pool gradients. Backward passes are gathers (one thread per input
// element sums the outputs whose window covers it, in the CPU's order): deterministic, no
// atomics. They launch on cuda::current_stream() of the current device (the op holds a
// cuda::DeviceGuard) and return without synchronising.
namespace kiln::cuda {

using cpu::Pool2dGeometry;

template <typename T>
void max_pool2d_forward_cuda(const T* x, T* y, int32_t* indices, const Pool2dGeometry& g);
template <typename T>
void max_pool2d_backward_cuda(const T* grad_y, const int32_t* indices, T* grad_x,
                              const Pool2dGeometry& g);
template <typename T>
void avg_pool2d_forward_cuda(const T* x, T* y, const Pool2dGeometry& g, bool count_include_pad);
template <typename T>
void avg_pool2d_backward_cuda(const T* grad_y, T* grad_x, const Pool2dGeometry& g,
                              bool count_include_pad);
template <typename T>
void adaptive_avg_pool2d_forward_cuda(const T* x, T* y, const Pool2dGeometry& g);
template <typename T>
void adaptive_avg_pool2d_backward_cuda(const T* grad_y, T* grad_x, const Pool2dGeometry& g);

}  // namespace kiln::cuda
