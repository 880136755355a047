// reduce_kernels.h: the element rules of comm's reductions (reduce_into, scale), shared by the
// CPU loops in reduce.cpp and the CUDA kernels in reduce_cuda.cu, so both devices give the same
// bits; and those loops and kernels (internal to kiln_comm): twins of one name and signature in
// cpu:: and cuda::, the backend's tag first, which reduce.cpp calls unqualified
// (engine/dispatch.h).
//
//   add    f32, f64: dst + src in the type;  f16, bf16: widened to f32 (exactly), added in f32,
//          rounded once to nearest even (engine/host_device.h)
//   scale  x * factor computed in f64 and rounded once to the type
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "engine/backend.h"
#include "engine/host_device.h"

namespace kiln::comm {

KILN_HOST_DEVICE inline float scale_elem(float x, double f) {
  return static_cast<float>(static_cast<double>(x) * f);
}
KILN_HOST_DEVICE inline double scale_elem(double x, double f) { return x * f; }
// Half or BFloat16.
template <typename W, std::enable_if_t<is_low_precision_v<W>, int> = 0>
KILN_HOST_DEVICE inline W scale_elem(W x, double f) {
  return narrow<W>(static_cast<double>(widen(x)) * f);
}

KILN_HOST_DEVICE inline float add_elem(float a, float b) { return a + b; }
KILN_HOST_DEVICE inline double add_elem(double a, double b) { return a + b; }
// Half or BFloat16: the f32 sum of the widened values, rounded back once.
template <typename W, std::enable_if_t<is_low_precision_v<W>, int> = 0>
KILN_HOST_DEVICE inline W add_elem(W a, W b) {
  return narrow<W>(widen(a) + widen(b));
}

}  // namespace kiln::comm

namespace kiln::cpu {

// dst[i] = add_elem(dst[i], src[i]) / buf[i] = scale_elem(buf[i], factor) for i < n. T is
// float, double, Half or BFloat16.
template <typename T>
void comm_reduce_into(Backend, T* dst, const T* src, int64_t n);
template <typename T>
void comm_scale(Backend, T* buf, int64_t n, double factor);
// dst = src (bytes of host memory).
void comm_copy(Backend, void* dst, const void* src, size_t bytes);
// Waits until the work above is visible to a transport: nothing to wait for on the CPU.
inline void comm_finish(Backend) {}

}  // namespace kiln::cpu

namespace kiln::cuda {

// The same on the current device's current_stream(), asynchronously: comm_finish waits.
template <typename T>
void comm_reduce_into(Backend, T* dst, const T* src, int64_t n);
template <typename T>
void comm_scale(Backend, T* buf, int64_t n, double factor);
// dst = src, both on the current device (a stream-ordered cudaMemcpyAsync).
void comm_copy(Backend, void* dst, const void* src, size_t bytes);
// Synchronizes the current stream: a transport's requests are not ordered with it, and the
// next send must not read a buffer before the kernel wrote it.
void comm_finish(Backend);

}  // namespace kiln::cuda
