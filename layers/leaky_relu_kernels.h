// leaky_relu_kernels.h: the CPU and CUDA kernels behind layers/leaky_relu.h (internal to
// kiln_layers). Twins with one signature: both apply leaky_relu_of / leaky_relu_grad_of
// (engine/host_device.h) to each element, so their results are bit-identical.
#pragma once

#include <cstdint>

namespace kiln {

namespace cpu {
// x, y are (n): y[i] = leaky_relu_of(x[i], slope).
template <typename T>
void leaky_relu_forward_cpu(const T* x, T* y, int64_t n, T slope);
// x, gy, gx are (n): gx[i] = leaky_relu_grad_of(x[i], gy[i], slope).
template <typename T>
void leaky_relu_backward_cpu(const T* x, const T* gy, T* gx, int64_t n, T slope);
}  // namespace cpu

namespace cuda {
// The same on device arrays, launched on current_stream().
template <typename T>
void leaky_relu_forward_cuda(const T* x, T* y, int64_t n, T slope);
template <typename T>
void leaky_relu_backward_cuda(const T* x, const T* gy, T* gx, int64_t n, T slope);
}  // namespace cuda

}  // namespace kiln
