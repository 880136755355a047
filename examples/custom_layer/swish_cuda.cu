// swish_cuda.cu: the CUDA kernels of Swish. One thread per element in a grid-stride loop,
// launched through kiln::cuda::launch(), so the same file runs on a GPU (nvcc) and on the CPU
// under Kiln's CUDA simulator (compiled as C++).
#include "engine/cuda/runtime.h"  // first: the real CUDA runtime or the simulator's

#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/launch.h"
#include "swish.h"
#include "swish_kernels.h"

namespace swish_example {

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;

kiln::cuda::LaunchConfig config_for(int64_t n) {
  return kiln::cuda::grid_stride_config_1d(n, kThreads, kMaxBlocks, kiln::cuda::current_stream());
}

template <typename T>
__global__ void swish_forward_kernel(const T* __restrict__ x, const T* __restrict__ beta,
                                     T* __restrict__ y, int64_t n) {
  const T b = *beta;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = swish_value(x[i], b);
}

template <typename T>
__global__ void swish_backward_kernel(const T* __restrict__ x, const T* __restrict__ beta,
                                      const T* __restrict__ gy, T* __restrict__ gx,
                                      T* __restrict__ gbeta, int64_t n) {
  const T b = *beta;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    swish_grads(x[i], b, gy[i], gx[i], gbeta[i]);
}

}  // namespace

template <typename T>
void swish_forward(kiln::cuda::Backend, const T* x, const T* beta, T* y, int64_t n) {
  if (n == 0) return;
  kiln::cuda::launch(swish_forward_kernel<T>, config_for(n), x, beta, y, n);
}

template <typename T>
void swish_backward(kiln::cuda::Backend, const T* x, const T* beta, const T* gy, T* gx, T* gbeta,
                    int64_t n) {
  if (n == 0) return;
  kiln::cuda::launch(swish_backward_kernel<T>, config_for(n), x, beta, gy, gx, gbeta, n);
}

using Cuda = kiln::cuda::Backend;
template void swish_forward<float>(Cuda, const float*, const float*, float*, int64_t);
template void swish_forward<double>(Cuda, const double*, const double*, double*, int64_t);
template void swish_backward<float>(Cuda, const float*, const float*, const float*, float*, float*,
                                    int64_t);
template void swish_backward<double>(Cuda, const double*, const double*, const double*, double*,
                                     double*, int64_t);

}  // namespace swish_example
