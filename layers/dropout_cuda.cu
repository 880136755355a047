// dropout_cuda.cu: CUDA kernels of dropout (see dropout_kernels.h for the mask rule).
//
// Parallelisation: one thread per group of 4 elements. A Philox4x32 call returns four 32-bit
// numbers, so thread j computes philox4x32_10(seed, base + j) once and masks elements
// 4j..4j+3 with outputs 0..3; the last group may be partial (n % 4 elements). A grid-stride
// loop covers any n with a bounded grid. The counter is a pure function of the element index,
// not of the thread or block that happens to handle it, which is why the CUDA mask equals the
// CPU's (dropout.cpp walks the same groups) bit for bit, for any grid size.
// The mask is applied as a multiplication by 0 or scale (as on the CPU, and as PyTorch's
// input * mask): a NaN or Inf in a dropped position stays visible.
#include "engine/cuda/runtime.h"

#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/launch.h"
#include "engine/philox.h"
#include "layers/dropout_kernels.h"

namespace kiln::cuda {

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;  // grid-stride beyond 1M groups (4M elements)

// in, out are (n); groups = ceil(n / 4).
template <typename T>
__global__ void dropout_apply_mask_kernel(const T* __restrict__ in, T* __restrict__ out,
                                          int64_t n, float p, T scale, uint64_t seed,
                                          uint64_t base, const uint64_t* base_offset) {
  if (base_offset != nullptr) base += *base_offset;  // a replayed graph's offset (philox.h)
  const int64_t groups = (n + 3) / 4;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < groups;
       j += stride) {
    const PhiloxOut r = philox4x32_10(seed, base + static_cast<uint64_t>(j));
    const int64_t first = 4 * j;
    const int count = n - first < 4 ? static_cast<int>(n - first) : 4;
    for (int k = 0; k < count; ++k)
      out[first + k] = in[first + k] * (dropout_keep(r.v[k], p) ? scale : T(0));
  }
}

template <typename T>
void apply_mask(const T* in, T* out, int64_t n, float p, T scale, uint64_t seed,
                uint64_t base, const uint64_t* base_offset) {
  if (n == 0) return;
  launch(dropout_apply_mask_kernel<T>,
         grid_stride_config_1d((n + 3) / 4, kThreads, kMaxBlocks, current_stream()),
         in, out, n, p, scale, seed, base, base_offset);
}

}  // namespace

template <typename T>
void dropout_forward(Backend, const T* x, T* y, int64_t n, float p, T scale, uint64_t seed,
                     uint64_t base, const uint64_t* base_offset) {
  apply_mask(x, y, n, p, scale, seed, base, base_offset);
}

template <typename T>
void dropout_backward(Backend, const T* gy, T* gx, int64_t n, float p, T scale, uint64_t seed,
                      uint64_t base, const uint64_t* base_offset) {
  apply_mask(gy, gx, n, p, scale, seed, base, base_offset);
}

template void dropout_forward<float>(Backend, const float*, float*, int64_t, float, float,
                                     uint64_t, uint64_t,
                                     const uint64_t*);
template void dropout_forward<double>(Backend, const double*, double*, int64_t, float, double,
                                      uint64_t, uint64_t,
                                     const uint64_t*);
template void dropout_backward<float>(Backend, const float*, float*, int64_t, float, float,
                                      uint64_t, uint64_t,
                                     const uint64_t*);
template void dropout_backward<double>(Backend, const double*, double*, int64_t, float, double,
                                       uint64_t, uint64_t,
                                     const uint64_t*);

}  // namespace kiln::cuda
