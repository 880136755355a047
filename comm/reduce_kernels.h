// reduce_kernels.h: the element rules of comm's reductions (reduce_into, scale), shared by the
// CPU loops in reduce.cpp and the CUDA kernels in reduce_cuda.cu, so both devices give the same
// bits; and the CUDA entry points (internal to kiln_comm).
//
//   add    f32, f64: dst + src in the type;  f16: added in f32, rounded to nearest even
//   scale  x * factor computed in f64 and rounded once to the type (f16: via f32)
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/fp16.h"

namespace kiln::comm {

KILN_HOST_DEVICE inline float scale_elem(float x, double f) {
  return static_cast<float>(static_cast<double>(x) * f);
}
KILN_HOST_DEVICE inline double scale_elem(double x, double f) { return x * f; }
KILN_HOST_DEVICE inline uint16_t scale_elem(uint16_t x, double f) {
  return f32_to_f16(static_cast<float>(static_cast<double>(f16_to_f32(x)) * f));
}

KILN_HOST_DEVICE inline float add_elem(float a, float b) { return a + b; }
KILN_HOST_DEVICE inline double add_elem(double a, double b) { return a + b; }
KILN_HOST_DEVICE inline uint16_t add_elem(uint16_t a, uint16_t b) { return f16_add(a, b); }

}  // namespace kiln::comm

namespace kiln::cuda {

// dst[i] = add_elem(dst[i], src[i]) / buf[i] = scale_elem(buf[i], factor) for i < n, on the
// current device's current_stream(). T is float, double or uint16_t (f16 bits). Asynchronous:
// the caller synchronizes.
template <typename T>
void comm_reduce_into_cuda(T* dst, const T* src, int64_t n);
template <typename T>
void comm_scale_cuda(T* buf, int64_t n, double factor);
// dst = src, both on the current device (a stream-ordered cudaMemcpyAsync).
void comm_copy_cuda(void* dst, const void* src, size_t bytes);

}  // namespace kiln::cuda
