// swish_kernels.h: the kernels of swish.h, declared for swish.cpp: a CPU loop (swish.cpp) and a
// CUDA kernel (swish_cuda.cu) of one name and one signature, told apart by their first
// parameter, the backend's tag (kiln::cpu::Backend or kiln::cuda::Backend, engine/backend.h).
// swish.cpp calls them through kiln::run_kernel, which passes the tag of the tensor's device;
// overload resolution then picks the twin. (Kiln's own twins live in kiln::cpu and kiln::cuda,
// where argument-dependent lookup finds them; a layer outside Kiln keeps both overloads in its
// own namespace, where the unqualified call finds them by name.)
//
// Declared in every build: a CPU-only Kiln leaves the .cu file out (kiln_add_cuda_sources), and
// run_kernel never passes kiln::cuda::Backend there, so nothing calls the CUDA overloads.
#pragma once

#include <cstdint>

#include "engine/backend.h"

namespace swish_example {

// x, y are (n), beta points at one value: y[i] = swish_value(x[i], *beta).
template <typename T>
void swish_forward(kiln::cpu::Backend, const T* x, const T* beta, T* y, int64_t n);
// x, gy, gx, gbeta are (n): gx[i], gbeta[i] = swish_grads(x[i], *beta, gy[i]) (gbeta per
// element; the caller sums it).
template <typename T>
void swish_backward(kiln::cpu::Backend, const T* x, const T* beta, const T* gy, T* gx, T* gbeta,
                    int64_t n);

// The same on device arrays of the current device, launched on kiln::cuda::current_stream().
template <typename T>
void swish_forward(kiln::cuda::Backend, const T* x, const T* beta, T* y, int64_t n);
template <typename T>
void swish_backward(kiln::cuda::Backend, const T* x, const T* beta, const T* gy, T* gx, T* gbeta,
                    int64_t n);

}  // namespace swish_example
