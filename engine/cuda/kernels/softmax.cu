// softmax.cu: softmax / log-softmax over one dim, forward and backward: the twins of
// cpu::softmax and cpu::softmax_backward. Tensors are viewed as (outer, len, inner); the
// softmax runs over len.
//
// Numerical stability: as on the CPU, the row maximum is subtracted before exp, so exp never
// overflows (the largest term is exp(0) = 1) and the result is unchanged, since
// exp(x - m) / sum exp(x - m) = exp(x) / sum exp(x). Log-softmax is x - (m + log sum exp(x - m)).
//
// Parallelisation:
//  - inner == 1 (softmax over the last dim: logits (batch, classes)), rows of len <= 1024: one
//    warp per row, 8 rows per block of 256 threads. Lane j handles elements j, j+32, ... The
//    row maximum and the sum are combined across the warp with shuffles (warp_max / warp_sum,
//    engine/cuda/kernels/common.h): no shared memory, no __syncthreads. Three passes over the
//    row (max, sum, write); the second and third hit the L1/L2 cache.
//  - inner == 1, longer rows: one block of 256 threads per row, reduced with block_max /
//    block_sum (warp shuffles, then one value per warp through shared memory).
//  - inner > 1 (softmax over a middle dim, e.g. channels of an image): one thread per (o, i)
//    column, looping over len exactly like the CPU; neighbouring threads take neighbouring i,
//    so each step of the loop is a coalesced read.
// Backward, with y the forward output (softmax, or log-softmax when log):
//   softmax:     gx = y * (gy - sum(gy * y))
//   log-softmax: gx = gy - exp(y) * sum(gy)
// with the same three layouts (the dot product reduced like the sum above).
#include "engine/cuda/runtime.h"

#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/launch.h"
#include "engine/ops_cuda.h"

namespace kiln::cuda {

namespace {

constexpr int kRowsPerBlock = 8;      // warp-per-row kernels: 8 warps
constexpr int kWarpRowMaxLen = 1024;  // longer rows get a block each
constexpr int kBlockRowThreads = 256;

// How the threads of one row cooperate: a warp (32 lanes, shuffles only) or a whole block.
enum class RowGroup { Warp, Block };

// Sum / max over the threads sharing a row. `scratch`: 32 elements of shared memory (Block).
template <RowGroup G, typename T>
__device__ __forceinline__ T group_sum(T v, T* scratch) {
  if (G == RowGroup::Warp) return warp_sum(v);
  return block_sum(v, scratch);
}
template <RowGroup G, typename T>
__device__ __forceinline__ T group_max(T v, T* scratch) {
  if (G == RowGroup::Warp) return warp_max(v);
  return block_max(v, scratch);
}

// Which row this thread works on, its index in the row's group, and the group size.
template <RowGroup G>
__device__ __forceinline__ void row_position(int64_t& row, int& lane, int& group) {
  if (G == RowGroup::Warp) {
    row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
    lane = threadIdx.x % kWarpSize;
    group = kWarpSize;
  } else {
    row = blockIdx.x;
    lane = threadIdx.x;
    group = blockDim.x;
  }
}

// x, y are (rows, len) contiguous.
template <typename T, RowGroup G>
__global__ void softmax_rows_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows,
                                    int64_t len, bool log) {
  KILN_SHARED(T, scratch, [kWarpSize]);
  int64_t row;
  int lane, group;
  row_position<G>(row, lane, group);
  if (row >= rows) return;  // Warp: whole warps leave; Block: row < rows always
  const T* xr = x + row * len;
  T* yr = y + row * len;
  T mx = xr[0];
  for (int64_t l = lane; l < len; l += group) mx = xr[l] > mx ? xr[l] : mx;
  mx = group_max<G>(mx, scratch);
  T total = T(0);
  for (int64_t l = lane; l < len; l += group) total += exp_t(xr[l] - mx);
  total = group_sum<G>(total, scratch);
  if (log) {
    const T lse = mx + log_t(total);
    for (int64_t l = lane; l < len; l += group) yr[l] = xr[l] - lse;
  } else {
    for (int64_t l = lane; l < len; l += group) yr[l] = exp_t(xr[l] - mx) / total;
  }
}

// grad_y, y, grad_x are (rows, len) contiguous.
template <typename T, RowGroup G>
__global__ void softmax_backward_rows_kernel(const T* __restrict__ gy, const T* __restrict__ y,
                                             T* __restrict__ gx, int64_t rows, int64_t len,
                                             bool log) {
  KILN_SHARED(T, scratch, [kWarpSize]);
  int64_t row;
  int lane, group;
  row_position<G>(row, lane, group);
  if (row >= rows) return;
  const int64_t base = row * len;
  T dot = T(0);
  for (int64_t l = lane; l < len; l += group) dot += log ? gy[base + l] : gy[base + l] * y[base + l];
  dot = group_sum<G>(dot, scratch);
  for (int64_t l = lane; l < len; l += group) {
    const int64_t j = base + l;
    gx[j] = log ? gy[j] - exp_t(y[j]) * dot : y[j] * (gy[j] - dot);
  }
}

// x, y are (outer, len, inner); one thread per (o, i).
template <typename T>
__global__ void softmax_cols_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t outer,
                                    int64_t len, int64_t inner, bool log) {
  const int64_t n = outer * inner;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride) {
    const int64_t o = j / inner, i = j % inner;
    const T* xc = x + o * len * inner + i;
    T* yc = y + o * len * inner + i;
    T mx = xc[0];
    for (int64_t l = 1; l < len; ++l) mx = xc[l * inner] > mx ? xc[l * inner] : mx;
    T total = T(0);
    for (int64_t l = 0; l < len; ++l) total += exp_t(xc[l * inner] - mx);
    if (log) {
      const T lse = mx + log_t(total);
      for (int64_t l = 0; l < len; ++l) yc[l * inner] = xc[l * inner] - lse;
    } else {
      for (int64_t l = 0; l < len; ++l) yc[l * inner] = exp_t(xc[l * inner] - mx) / total;
    }
  }
}

// grad_y, y, grad_x are (outer, len, inner); one thread per (o, i).
template <typename T>
__global__ void softmax_backward_cols_kernel(const T* __restrict__ gy, const T* __restrict__ y,
                                             T* __restrict__ gx, int64_t outer, int64_t len,
                                             int64_t inner, bool log) {
  const int64_t n = outer * inner;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride) {
    const int64_t o = j / inner, i = j % inner;
    const int64_t base = o * len * inner + i;
    T dot = T(0);
    for (int64_t l = 0; l < len; ++l)
      dot += log ? gy[base + l * inner] : gy[base + l * inner] * y[base + l * inner];
    for (int64_t l = 0; l < len; ++l) {
      const int64_t k = base + l * inner;
      gx[k] = log ? gy[k] - exp_t(y[k]) * dot : y[k] * (gy[k] - dot);
    }
  }
}

// The launch shape for each layout (see the file comment).
LaunchConfig rows_config(RowGroup g, int64_t rows) {
  if (g == RowGroup::Warp)
    return LaunchConfig{dim3(blocks_for(rows, kRowsPerBlock)), dim3(kRowsPerBlock * kWarpSize), 0,
                        current_stream()};
  return LaunchConfig{dim3(static_cast<unsigned>(rows)), dim3(kBlockRowThreads), 0, current_stream()};
}
LaunchConfig cols_config(int64_t n) {
  return LaunchConfig{dim3(elementwise_blocks(n)), dim3(kElementwiseThreads), 0, current_stream()};
}

}  // namespace

template <typename T>
void softmax(Backend, const T* x, T* y, int64_t outer, int64_t len, int64_t inner, bool log) {
  if (outer == 0 || len == 0 || inner == 0) return;
  if (inner == 1) {
    KILN_CHECK(outer <= 0x7fffffff, "softmax: too many rows (", outer, ")");
    if (len <= kWarpRowMaxLen)
      launch(softmax_rows_kernel<T, RowGroup::Warp>, rows_config(RowGroup::Warp, outer), x, y,
             outer, len, log);
    else
      launch(softmax_rows_kernel<T, RowGroup::Block>, rows_config(RowGroup::Block, outer), x, y,
             outer, len, log);
  } else {
    launch(softmax_cols_kernel<T>, cols_config(outer * inner), x, y, outer, len, inner, log);
  }
}

template <typename T>
void softmax_backward(Backend, const T* grad_y, const T* y, T* grad_x, int64_t outer,
                      int64_t len, int64_t inner, bool log) {
  if (outer == 0 || len == 0 || inner == 0) return;
  if (inner == 1) {
    KILN_CHECK(outer <= 0x7fffffff, "softmax_backward: too many rows (", outer, ")");
    if (len <= kWarpRowMaxLen)
      launch(softmax_backward_rows_kernel<T, RowGroup::Warp>, rows_config(RowGroup::Warp, outer),
             grad_y, y, grad_x, outer, len, log);
    else
      launch(softmax_backward_rows_kernel<T, RowGroup::Block>, rows_config(RowGroup::Block, outer),
             grad_y, y, grad_x, outer, len, log);
  } else {
    launch(softmax_backward_cols_kernel<T>, cols_config(outer * inner), grad_y, y, grad_x, outer,
           len, inner, log);
  }
}

#define KILN_INSTANTIATE(T)                                                                 \
  template void softmax<T>(Backend, const T*, T*, int64_t, int64_t, int64_t, bool);         \
  template void softmax_backward<T>(Backend, const T*, const T*, T*, int64_t, int64_t,      \
                                    int64_t, bool);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(double)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
