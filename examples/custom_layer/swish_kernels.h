// swish_kernels.h: the CUDA kernels of swish.h (swish_cuda.cu), declared for swish.cpp.
// Only with a CUDA backend (real or simulated): a CPU-only Kiln leaves the .cu file out
// (kiln_add_cuda_sources) and KILN_WITH_CUDA undefined.
#pragma once

#include <cstdint>

#if KILN_WITH_CUDA
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
#endif  // KILN_WITH_CUDA
