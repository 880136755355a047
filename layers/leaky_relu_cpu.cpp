// leaky_relu_cpu.cpp: CPU kernels of LeakyReLU (see leaky_relu_kernels.h). One pass over the
// elements, split across OpenMP threads; the branch-free rule vectorises.
#include <cstdint>

#include "layers/leaky_relu_kernels.h"

namespace kiln::cpu {

template <typename T>
void leaky_relu_forward(Backend, const T* x, T* y, int64_t n, T slope) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = leaky_relu_of(x[i], slope);
}

template <typename T>
void leaky_relu_backward(Backend, const T* x, const T* gy, T* gx, int64_t n, T slope) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) gx[i] = leaky_relu_grad_of(x[i], gy[i], slope);
}

template void leaky_relu_forward<float>(Backend, const float*, float*, int64_t, float);
template void leaky_relu_forward<double>(Backend, const double*, double*, int64_t, double);
template void leaky_relu_backward<float>(Backend, const float*, const float*, float*, int64_t,
                                         float);
template void leaky_relu_backward<double>(Backend, const double*, const double*, double*, int64_t,
                                          double);

}  // namespace kiln::cpu
