// swish_kernels.h: the CUDA kernels of swish.h (swish_cuda.cu), declared for swish.cpp.
// Declared in every build: a CPU-only Kiln leaves the .cu file out (kiln_add_cuda_sources),
// and swish.cpp names these functions only in on_device's CUDA branch, which such a build
// never compiles into a call.
#pragma once

#include <cstdint>

namespace swish_example::cuda {

// x, y are (n) device arrays, beta points at one device value: y[i] = swish_value(x[i], *beta).
// Launches on kiln::cuda::current_stream().
template <typename T>
void swish_forward_cuda(const T* x, const T* beta, T* y, int64_t n);

// x, gy, gx, gbeta are (n): gx[i], gbeta[i] = swish_grads(x[i], *beta, gy[i]) (gbeta per
// element; the caller sums it).
template <typename T>
void swish_backward_cuda(const T* x, const T* beta, const T* gy, T* gx, T* gbeta, int64_t n);

}  // namespace swish_example::cuda
