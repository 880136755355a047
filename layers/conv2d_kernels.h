// conv2d_kernels.h: the raw CPU kernels of Conv2d (internal to layers/; include conv2d.h to
// use convolutions). Kernels see contiguous row-major buffers and a ConvGeometry; all shape
// and device checks happened before, in conv2d.cpp.
//
//   hand   (conv2d_cpu.cpp)  im2col + GEMM (OpenBLAS), OpenMP over the images of the batch;
//                            templated on float and double
//   vendor (conv2d_dnnl.cpp) oneDNN primitives, float only
//
// Names: x (N, C, H, W) input, w (K, C, R, S) weights, b (K) bias, y (N, K, P, Q) output,
// with P = (H + 2*pad - R) / stride + 1 and Q = (W + 2*pad - S) / stride + 1.
// dy, dx, dw, db are the gradients of y, x, w, b (same shapes).
#pragma once

#include <cstdint>

namespace kiln {

struct ConvGeometry {
  int64_t n, c, h, w;  // input (N, C, H, W)
  int64_t k, r, s;     // weights (K, C, R, S)
  int64_t stride, pad;
  int64_t p, q;        // output spatial size (P, Q)
};

// ---- hand kernels (conv2d_cpu.cpp) -------------------------------------------------------------
// y = conv(x, w) + b. b may be null (no bias). y is written, never read.
template <typename T>
void conv2d_forward_cpu(const T* x,  // x is (N, C, H, W)
                        const T* w,  // w is (K, C, R, S)
                        const T* b,  // b is (K) or null
                        T* y,        // y is (N, K, P, Q)
                        const ConvGeometry& g);

// dx = conv_transpose(dy, w). dx is written, never read.
template <typename T>
void conv2d_backward_data_cpu(const T* dy,  // dy is (N, K, P, Q)
                              const T* w,   // w is (K, C, R, S)
                              T* dx,        // dx is (N, C, H, W)
                              const ConvGeometry& g);

// dw = sum over images of dy[n] * im2col(x[n])^T; db = sum of dy over (N, P, Q).
// dw or db may be null when that gradient is not needed. Both are written, never read.
// Bit-reproducible for a fixed thread count (partial sums reduced in thread order).
template <typename T>
void conv2d_backward_weight_cpu(const T* x,   // x is (N, C, H, W)
                                const T* dy,  // dy is (N, K, P, Q)
                                T* dw,        // dw is (K, C, R, S) or null
                                T* db,        // db is (K) or null
                                const ConvGeometry& g);

// ---- vendor kernels (conv2d_dnnl.cpp), float only ------------------------------------------------
// Same contracts as the hand kernels above. Backward is one call: dy is reordered into
// oneDNN's layout once for both gradients. dx, dw, db may each be null (not needed).
void conv2d_forward_dnnl(const float* x, const float* w, const float* b, float* y,
                         const ConvGeometry& g);
void conv2d_backward_dnnl(const float* x,   // x is (N, C, H, W)
                          const float* dy,  // dy is (N, K, P, Q)
                          const float* w,   // w is (K, C, R, S)
                          float* dx,        // dx is (N, C, H, W) or null
                          float* dw,        // dw is (K, C, R, S) or null
                          float* db,        // db is (K) or null
                          const ConvGeometry& g);

}  // namespace kiln
