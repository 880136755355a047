// leaky_relu_cuda.cu: CUDA kernels of LeakyReLU (see leaky_relu_kernels.h).
//
// Parallelisation: one thread per element, blocks of 256, consecutive threads on consecutive
// elements (coalesced reads and writes). The grid is capped and each thread strides by the
// grid's size, so one launch covers any n. The arithmetic is the shared element rule, so every
// element equals the CPU's bit for bit.
#include "engine/cuda/runtime.h"

#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/launch.h"
#include "layers/leaky_relu_kernels.h"

namespace kiln::cuda {

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;  // beyond 1M elements, threads loop

LaunchConfig config_for(int64_t n) {
  return grid_stride_config_1d(n, kThreads, kMaxBlocks, current_stream());
}

template <typename T>
__global__ void leaky_relu_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                                          T slope) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = leaky_relu_of(x[i], slope);
}

template <typename T>
__global__ void leaky_relu_backward_kernel(const T* __restrict__ x, const T* __restrict__ gy,
                                           T* __restrict__ gx, int64_t n, T slope) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    gx[i] = leaky_relu_grad_of(x[i], gy[i], slope);
}

}  // namespace

template <typename T>
void leaky_relu_forward(Backend, const T* x, T* y, int64_t n, T slope) {
  if (n == 0) return;
  launch(leaky_relu_forward_kernel<T>, config_for(n), x, y, n, slope);
}

template <typename T>
void leaky_relu_backward(Backend, const T* x, const T* gy, T* gx, int64_t n, T slope) {
  if (n == 0) return;
  launch(leaky_relu_backward_kernel<T>, config_for(n), x, gy, gx, n, slope);
}

template void leaky_relu_forward<float>(Backend, const float*, float*, int64_t, float);
template void leaky_relu_forward<double>(Backend, const double*, double*, int64_t, double);
template void leaky_relu_backward<float>(Backend, const float*, const float*, float*, int64_t,
                                         float);
template void leaky_relu_backward<double>(Backend, const double*, const double*, double*, int64_t,
                                          double);

}  // namespace kiln::cuda
