// reduce_cuda.cu: comm's reductions on GPU buffers (the hand algorithms over the nccl transport
// reduce received chunks here). One thread per element with a grid-stride loop; the element
// rules are reduce_kernels.h's, the same as the CPU's, so the two devices agree bit for bit.
#include "engine/cuda/runtime.h"

#include <cstddef>
#include <cstdint>

#include "comm/reduce_kernels.h"
#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/cuda/launch.h"
#include "engine/cuda/kernels/common.h"

namespace kiln::cuda {

namespace {

template <typename T>
__global__ void comm_reduce_into_kernel(T* __restrict__ dst, const T* __restrict__ src,
                                        int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    dst[i] = comm::add_elem(dst[i], src[i]);
}

template <typename T>
__global__ void comm_scale_kernel(T* __restrict__ buf, int64_t n, double factor) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    buf[i] = comm::scale_elem(buf[i], factor);
}

}  // namespace

template <typename T>
void comm_reduce_into(Backend, T* dst, const T* src, int64_t n) {
  if (n == 0) return;
  launch(comm_reduce_into_kernel<T>,
         LaunchConfig{dim3(elementwise_blocks(n)), dim3(kElementwiseThreads), 0, current_stream()},
         dst, src, n);
}

template <typename T>
void comm_scale(Backend, T* buf, int64_t n, double factor) {
  if (n == 0) return;
  launch(comm_scale_kernel<T>,
         LaunchConfig{dim3(elementwise_blocks(n)), dim3(kElementwiseThreads), 0, current_stream()},
         buf, n, factor);
}

void comm_copy(Backend, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, current_stream()));
}

void comm_finish(Backend) { synchronize(); }

template void comm_reduce_into<float>(Backend, float*, const float*, int64_t);
template void comm_reduce_into<double>(Backend, double*, const double*, int64_t);
template void comm_reduce_into<Half>(Backend, Half*, const Half*, int64_t);
template void comm_reduce_into<BFloat16>(Backend, BFloat16*, const BFloat16*, int64_t);
template void comm_scale<float>(Backend, float*, int64_t, double);
template void comm_scale<double>(Backend, double*, int64_t, double);
template void comm_scale<Half>(Backend, Half*, int64_t, double);
template void comm_scale<BFloat16>(Backend, BFloat16*, int64_t, double);

}  // namespace kiln::cuda
