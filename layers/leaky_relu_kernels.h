// leaky_relu_kernels.h: the CPU and CUDA kernels behind layers/leaky_relu.h (internal to
// kiln_layers), and the element rule both apply. Twins of one name and signature in cpu:: and
// cuda:: (engine/dispatch.h): both apply leaky_relu_of / leaky_relu_grad_of to each element, so
// their results are bit-identical.
#pragma once

#include <cstdint>

#include "engine/backend.h"
#include "engine/host_device.h"  // KILN_HOST_DEVICE

namespace kiln {

// LeakyReLU of one element: x where x > 0, slope * x elsewhere.
template <typename T>
KILN_HOST_DEVICE inline T leaky_relu_of(T x, T slope) {
  return x > T(0) ? x : x * slope;
}

// Its backward for one element: the upstream gradient g where x > 0, g * slope elsewhere
// (x == 0 takes the slope, as PyTorch does).
template <typename T>
KILN_HOST_DEVICE inline T leaky_relu_grad_of(T x, T g, T slope) {
  return x > T(0) ? g : g * slope;
}

namespace cpu {
// x, y are (n): y[i] = leaky_relu_of(x[i], slope).
template <typename T>
void leaky_relu_forward(Backend, const T* x, T* y, int64_t n, T slope);
// x, gy, gx are (n): gx[i] = leaky_relu_grad_of(x[i], gy[i], slope).
template <typename T>
void leaky_relu_backward(Backend, const T* x, const T* gy, T* gx, int64_t n, T slope);
}  // namespace cpu

namespace cuda {
// The same on device arrays, launched on current_stream().
template <typename T>
void leaky_relu_forward(Backend, const T* x, T* y, int64_t n, T slope);
template <typename T>
void leaky_relu_backward(Backend, const T* x, const T* gy, T* gx, int64_t n, T slope);
}  // namespace cuda

}  // namespace kiln
