// reduce.cu: CUDA kernels of the dim-wise reductions: sum_dim, its adjoint expand_dim, and
// argmax_dim, the twins of the cpu:: ones. Every tensor is viewed as (outer, len, inner) around
// the reduced dim (engine/dim_split.h), and we reduce over len.
//
// Parallelisation depends on where the reduced elements lie in memory:
//  - inner == 1 ("rows": the reduced elements are contiguous). Short rows (len <= 1024): one
//    warp per row; lane j adds elements j, j+32, ... and the warp combines its 32 partial sums
//    with shuffles (warp_sum, engine/cuda/kernels/common.h). Long rows: one block of 256
//    threads per piece of a row, combined by block_sum (shuffles, then shared memory).
//  - inner > 1 ("columns": the reduced elements are `inner` apart). A block of 32 x 8 threads
//    takes 32 consecutive outputs (threadIdx.x along inner, so each warp reads 32 neighbours:
//    coalesced); its 8 rows of threads (threadIdx.y) split the len elements between them, and
//    the 8 partial sums are added in shared memory, in a fixed order.
//  When there are few outputs and long reductions (sum of everything, bias gradients), one
//  block per output would leave most of the GPU idle, so len is cut into `parts` pieces
//  reduced by different blocks into a scratch tensor (outer, parts, inner), which is then
//  reduced again the same way. `parts` depends only on the shape.
// Deterministic: no atomics; every sum follows a fixed tree that depends on the shape only, so
// a run repeats bit for bit. The order differs from the CPU's left-to-right loop, hence the
// per-op tolerance of the parity tests.
// expand_dim is elementwise over the output (one thread per element, exact like the CPU).
// 16-bit inputs (Half, BFloat16) are widened on load and summed in f32 (compute_t): partial
// sums, shared memory and the result are f32; expand_dim reads an f32 gradient and rounds each
// product once to the 16-bit output.
// argmax_dim: the same layouts without splitting; ties go to the lowest index and NaNs are
// skipped (unless element 0 is NaN), exactly the CPU's sequential `x[l] > x[best]` scan.
#include "engine/cuda/runtime.h"

#include <cstddef>
#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/kernels/grid_stride.h"
#include "engine/cuda/launch.h"
#include "engine/host_device.h"
#include "engine/ops_cuda.h"
#include "engine/tensor.h"

namespace kiln::cuda {

namespace {

constexpr int kRowsPerBlock = 8;        // warp-per-row kernels: 8 warps, 256 threads
constexpr int kWarpRowMaxLen = 1024;    // longer rows get a block (or several) each
constexpr int kBlockRowThreads = 256;
constexpr int kColsX = 32, kColsY = 8;  // column kernels: 32 outputs x 8 partial sums
constexpr int64_t kMinPerThread = 16;   // never split len so finely that threads add < 16 values
constexpr int64_t kTargetBlocks = 1024; // split until the launch has about this many blocks
constexpr unsigned kMaxGridY = 65535;

// ---- sum_dim ---------------------------------------------------------------------------------

// x is (rows, len) contiguous; out is (rows). One warp per row.
template <typename T, typename C = compute_t<T>>
__global__ void sum_rows_warp_kernel(const T* __restrict__ x, C* __restrict__ out, int64_t rows,
                                     int64_t len) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;  // the whole warp leaves together: the shuffles stay full-warp
  const T* xr = x + row * len;
  C acc = C(0);
  for (int64_t l = lane; l < len; l += kWarpSize) acc += convert_elem<C>(xr[l]);
  acc = warp_sum(acc);
  if (lane == 0) out[row] = acc;
}

// x is (rows, len) contiguous; out is (rows, parts): block (p, r) sums piece p of row r,
// elements [p * piece, (p + 1) * piece).
template <typename T, typename C = compute_t<T>>
__global__ void sum_rows_block_kernel(const T* __restrict__ x, C* __restrict__ out, int64_t rows,
                                      int64_t len, int64_t parts, int64_t piece) {
  KILN_SHARED(C, scratch, [kWarpSize]);
  const int64_t p = blockIdx.x;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {  // rows beyond the grid limit
    const T* xr = x + row * len;
    const int64_t end = (p + 1) * piece < len ? (p + 1) * piece : len;
    C acc = C(0);
    for (int64_t l = p * piece + threadIdx.x; l < end; l += blockDim.x) acc += convert_elem<C>(xr[l]);
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) out[row * parts + p] = acc;
  }
}

// x is (outer, len, inner); out is (outer, parts, inner): block (bx, o, p) sums piece p of the
// columns bx*32..+31 of slice o.
template <typename T, typename C = compute_t<T>>
__global__ void sum_cols_kernel(const T* __restrict__ x, C* __restrict__ out, int64_t outer,
                                int64_t len, int64_t inner, int64_t parts, int64_t piece) {
  KILN_SHARED(C, partial, [kColsY][kColsX]);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kColsX + threadIdx.x;
  const int64_t p = blockIdx.z;
  const int64_t begin = p * piece, end = (p + 1) * piece < len ? (p + 1) * piece : len;
  for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
    C acc = C(0);
    if (i < inner)
      for (int64_t l = begin + threadIdx.y; l < end; l += kColsY)
        acc += convert_elem<C>(x[(o * len + l) * inner + i]);
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && i < inner) {
      C total = partial[0][threadIdx.x];
      for (int y = 1; y < kColsY; ++y) total += partial[y][threadIdx.x];
      out[(o * parts + p) * inner + i] = total;
    }
    __syncthreads();  // partial is reused by the next o
  }
}

unsigned grid_y(int64_t n) { return grid_stride_blocks(n, kMaxGridY); }

// Pieces to cut len into so that about kTargetBlocks blocks run, each thread adding at least
// kMinPerThread values. `blocks` is the launch size without splitting; `threads_along_len` how
// many threads of a block share one reduction.
int64_t split_parts(int64_t len, int64_t blocks, int64_t threads_along_len) {
  const int64_t by_work = len / (threads_along_len * kMinPerThread);
  const int64_t by_blocks = (kTargetBlocks + blocks - 1) / blocks;
  int64_t parts = by_work < by_blocks ? by_work : by_blocks;
  return parts > 1 ? parts : 1;
}

// A scratch buffer of n elements on the current device (through the caching allocator; freed
// when the Tensor goes, and reused only by work queued later on the same stream).
template <typename T>
Tensor scratch_tensor(int64_t n) {
  return Tensor::empty({n}, dtype_of<T>::value, Device(DeviceType::CUDA, current_device()));
}

}  // namespace

template <typename T>
void sum_dim(Backend, const T* x, compute_t<T>* out, int64_t outer, int64_t len, int64_t inner) {
  using C = compute_t<T>;
  if (outer == 0 || inner == 0) return;
  const cudaStream_t stream = current_stream();
  if (len == 0) {  // an empty sum is 0
    KILN_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(outer * inner) * sizeof(C), stream));
    return;
  }
  if (inner == 1 && len <= kWarpRowMaxLen) {
    launch(sum_rows_warp_kernel<T>,
           LaunchConfig{dim3(blocks_for(outer, kRowsPerBlock)), dim3(kRowsPerBlock * kWarpSize), 0,
                        stream},
           x, out, outer, len);
    return;
  }
  int64_t parts;
  Tensor partial;  // (outer, parts, inner) when len is split
  C* dst = out;
  if (inner == 1) {
    parts = split_parts(len, outer, kBlockRowThreads);
    if (parts > 1) {
      partial = scratch_tensor<C>(outer * parts);
      dst = partial.data<C>();
    }
    const int64_t piece = (len + parts - 1) / parts;
    launch(sum_rows_block_kernel<T>,
           LaunchConfig{dim3(static_cast<unsigned>(parts), grid_y(outer)), dim3(kBlockRowThreads), 0,
                        stream},
           x, dst, outer, len, parts, piece);
  } else {
    const unsigned gx = blocks_for(inner, kColsX);
    parts = split_parts(len, static_cast<int64_t>(gx) * outer, kColsY);
    if (parts > 65535) parts = 65535;  // grid.z limit
    if (parts > 1) {
      partial = scratch_tensor<C>(outer * parts * inner);
      dst = partial.data<C>();
    }
    const int64_t piece = (len + parts - 1) / parts;
    launch(sum_cols_kernel<T>,
           LaunchConfig{dim3(gx, grid_y(outer), static_cast<unsigned>(parts)), dim3(kColsX, kColsY),
                        0, stream},
           x, dst, outer, len, inner, parts, piece);
  }
  // The pieces' partial sums are one more (much shorter) reduction of the same shape.
  // (in C: a 16-bit input's partial sums are already f32).
  if (parts > 1) sum_dim(Backend{}, static_cast<const C*>(dst), out, outer, parts, inner);
}

namespace {

// out (outer, len, inner)[o, l, i] = g (outer, inner)[o, i] * scale; one thread per output.
template <typename T, typename C = compute_t<T>>
__global__ void expand_dim_kernel(const C* __restrict__ g, T* __restrict__ out, int64_t outer,
                                  int64_t len, int64_t inner, C scale) {
  const int64_t n = outer * len * inner;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride) {
    const int64_t o = j / (len * inner), i = j % inner;
    out[j] = convert_elem<T>(g[o * inner + i] * scale);
  }
}

}  // namespace

template <typename T>
void expand_dim(Backend, const compute_t<T>* g, T* out, int64_t outer, int64_t len,
                int64_t inner, compute_t<T> scale) {
  const int64_t n = outer * len * inner;
  if (n == 0) return;
  launch(expand_dim_kernel<T>,
         LaunchConfig{dim3(elementwise_blocks(n)), dim3(kElementwiseThreads), 0, current_stream()},
         g, out, outer, len, inner, scale);
}

namespace {

// ---- argmax_dim ------------------------------------------------------------------------------

// A candidate of the argmax: the best value seen and its index (idx < 0: none yet, i.e. only
// NaNs or nothing). `better` is the CPU scan's order: a larger value, or an equal value at a
// lower index (the scan keeps the first maximum); NaNs never win.
template <typename T>
struct ArgBest {
  T value;
  int64_t idx;
};

template <typename T>
__device__ __forceinline__ bool better(T v, int64_t i, const ArgBest<T>& b) {
  if (i < 0) return false;
  if (b.idx < 0) return true;
  return v > b.value || (v == b.value && i < b.idx);
}

// x is (rows, len) contiguous; out is (rows). One warp per row.
template <typename T>
__global__ void argmax_rows_kernel(const T* __restrict__ x, int64_t* __restrict__ out,
                                   int64_t rows, int64_t len) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;
  const T* xr = x + row * len;
  ArgBest<T> best{T(0), -1};
  for (int64_t l = lane; l < len; l += kWarpSize) {
    const T v = xr[l];
    if (v == v && better(v, l, best)) best = {v, l};  // v == v: not NaN
  }
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const T v = __shfl_xor_sync(kFullMask, best.value, offset);
    const int64_t i = __shfl_xor_sync(kFullMask, best.idx, offset);
    if (better(v, i, best)) best = {v, i};
  }
  if (lane == 0) {
    // The CPU scan starts from element 0: if that is NaN nothing compares greater, answer 0.
    const T first = xr[0];
    out[row] = best.idx < 0 || first != first ? 0 : best.idx;
  }
}

// x is (outer, len, inner); out is (outer, inner). One thread per output, scanning len in order
// exactly like the CPU (threads along inner: coalesced).
template <typename T>
__global__ void argmax_cols_kernel(const T* __restrict__ x, int64_t* __restrict__ out,
                                   int64_t outer, int64_t len, int64_t inner) {
  const int64_t n = outer * inner;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride) {
    const int64_t o = j / inner, i = j % inner;
    const T* xc = x + o * len * inner + i;
    int64_t best = 0;
    for (int64_t l = 1; l < len; ++l)
      if (xc[l * inner] > xc[best * inner]) best = l;
    out[j] = best;
  }
}

}  // namespace

template <typename T>
void argmax_dim(Backend, const T* x, int64_t* out, int64_t outer, int64_t len, int64_t inner) {
  if (outer == 0 || inner == 0) return;
  if (len == 0) {  // as the CPU: index 0 when there is nothing to compare
    KILN_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(outer * inner) * sizeof(int64_t),
                                    current_stream()));
    return;
  }
  if (inner == 1) {
    launch(argmax_rows_kernel<T>,
           LaunchConfig{dim3(blocks_for(outer, kRowsPerBlock)), dim3(kRowsPerBlock * kWarpSize), 0,
                        current_stream()},
           x, out, outer, len);
  } else {
    launch(argmax_cols_kernel<T>,
           LaunchConfig{dim3(elementwise_blocks(outer * inner)), dim3(kElementwiseThreads), 0,
                        current_stream()},
           x, out, outer, len, inner);
  }
}

#define KILN_INSTANTIATE_SUM(T)                                                              \
  template void sum_dim<T>(Backend, const T*, compute_t<T>*, int64_t, int64_t, int64_t);     \
  template void expand_dim<T>(Backend, const compute_t<T>*, T*, int64_t, int64_t, int64_t,   \
                              compute_t<T>);
KILN_INSTANTIATE_SUM(float)
KILN_INSTANTIATE_SUM(double)
KILN_INSTANTIATE_SUM(Half)
KILN_INSTANTIATE_SUM(BFloat16)
#undef KILN_INSTANTIATE_SUM
template void argmax_dim<float>(Backend, const float*, int64_t*, int64_t, int64_t, int64_t);
template void argmax_dim<double>(Backend, const double*, int64_t*, int64_t, int64_t, int64_t);

}  // namespace kiln::cuda
