// host_device.h: KILN_HOST_DEVICE, and the element rules that the CPU and CUDA kernels share.
//
// A function marked KILN_HOST_DEVICE compiles for the host and, under nvcc, for the GPU too
// (under the simulator and in plain C++ builds the mark is empty). A rule written once here is
// the same rule on every device: a CPU kernel and its CUDA twin both call it instead of each
// retyping it, so they cannot drift apart.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif

namespace kiln {

// ---- Random draws --------------------------------------------------------------------------

// Uniform float in [0, 1) from the top 24 of 32 random bits (exact in float: same everywhere).
KILN_HOST_DEVICE inline float uniform01(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

// Dropout keeps an element iff the uniform draw of its random bits is >= p (layers/dropout.h).
KILN_HOST_DEVICE inline bool dropout_keep(uint32_t bits, float p) { return uniform01(bits) >= p; }

// ---- Average pooling windows (layers/pool2d_kernels.h) --------------------------------------
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

// ---- Activations (layers/leaky_relu.h) -------------------------------------------------------

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

}  // namespace kiln
