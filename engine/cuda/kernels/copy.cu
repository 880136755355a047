// copy.cu: fill and dtype conversion on the device (declarations and contract: copy.h).
//
// Parallelisation: one thread per element, blocks of 256 threads, consecutive threads on
// consecutive elements (coalesced). The grid is capped at kMaxBlocks; each thread then walks
// the buffer with a grid-stride loop, so one launch covers any n.
// A conversion is one convert_elem per element (engine/host_device.h), the same function the
// CPU evaluates, so the results are bit-identical to the host conversion: static_cast between
// the built-in types (to nearest where rounding happens, e.g. f64 -> f32 and i64 -> f32,
// toward zero for float -> integer), and Kiln's integer rules into and out of f16 and bf16
// (not the GPU's own cvt instructions, which agree on f16 but might not on every NaN payload).
#include "engine/cuda/runtime.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/kernels/copy.h"
#include "engine/cuda/launch.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;

LaunchConfig config_for(int64_t n) {
  return grid_stride_config_1d(n, kThreads, kMaxBlocks, current_stream());
}

// data is (n).
template <typename T>
__global__ void fill_kernel(T* __restrict__ data, int64_t n, T value) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    data[i] = value;
}

// src and dst are (n).
template <typename Src, typename Dst>
__global__ void convert_kernel(const Src* __restrict__ src, Dst* __restrict__ dst, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = convert_elem<Dst>(src[i]);
}

// counter is (1).
__global__ void counter_kernel(uint64_t* counter, uint64_t value, bool advance) {
  *counter = advance ? *counter + value : value;
}

}  // namespace

void set_counter(uint64_t* counter, uint64_t value) {
  launch(counter_kernel, LaunchConfig{1, 1, 0, current_stream()}, counter, value, false);
}

void advance_counter(uint64_t* counter, uint64_t n) {
  launch(counter_kernel, LaunchConfig{1, 1, 0, current_stream()}, counter, n, true);
}

void fill(void* data, DType dtype, int64_t n, double value) {
  if (n <= 0) return;
  dispatch_any(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = convert_elem<T>(value);
    // 0 (but not -0.0) has all bits zero in every dtype: a memset, no kernel.
    if (value == 0.0 && !std::signbit(value)) {
      KILN_CUDA_CHECK(cudaMemsetAsync(data, 0, static_cast<size_t>(n) * sizeof(T), current_stream()));
    } else {
      launch(fill_kernel<T>, config_for(n), static_cast<T*>(data), n, v);
    }
  });
}

void convert(const void* src, DType src_type, void* dst, DType dst_type, int64_t n) {
  if (n <= 0) return;
  if (src_type == dst_type) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * dtype_size(src_type),
                                    cudaMemcpyDeviceToDevice, current_stream()));
    return;
  }
  dispatch_any(src_type, [&](auto src_tag) {
    using Src = typename decltype(src_tag)::type;
    dispatch_any(dst_type, [&](auto dst_tag) {
      using Dst = typename decltype(dst_tag)::type;
      launch(convert_kernel<Src, Dst>, config_for(n), static_cast<const Src*>(src),
             static_cast<Dst*>(dst), n);
    });
  });
}

}  // namespace kiln::cuda
