// transpose.cu: out = x with two dims swapped (a copy: Kiln tensors are always contiguous),
// the twin of cpu::transpose.
//
// Swapping dims d0 < d1 of a contiguous tensor views it as (A, D0, B, D1, C), with A the
// product of the dims before d0, B of those between, C of those after d1; the output is
// (A, D1, B, D0, C). Element (a, j0, b, j1, c) moves from
//   (((a * D0 + j0) * B + b) * D1 + j1) * C + c   to   (((a * D1 + j1) * B + b) * D0 + j0) * C + c.
//
// Parallelisation:
//  - C == 1 (the last dim takes part, e.g. a matrix transpose): a naive copy reads along j1 and
//    writes along j0, so either the reads or the writes of a warp are `D0` apart (uncoalesced:
//    one memory transaction per element). The tiled kernel fixes both: a block of 32 x 8 threads
//    loads a 32x32 tile reading along j1 (coalesced) into shared memory, synchronises, and
//    writes the tile's transpose along j0 (coalesced). Each thread moves 4 elements (rows ty,
//    ty+8, ...). The tile has 33 columns so a column read hits 32 different banks. grid.z runs
//    over the (a, b) matrices.
//  - C > 1: runs of C elements stay contiguous, so one thread per output element, gathering from
//    its source, already moves contiguous runs; nothing to tile.
//  - d0 == d1: a plain device-to-device copy.
#include "engine/cuda/runtime.h"

#include <cstddef>
#include <cstdint>
#include <utility>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/kernels/grid_stride.h"
#include "engine/cuda/launch.h"
#include "engine/ops_cuda.h"

namespace kiln::cuda {

namespace {

constexpr int kTileDim = 32;
constexpr int kTileRows = 8;  // block is 32 x 8; each thread copies 32 / 8 = 4 elements
constexpr unsigned kMaxGridZ = 65535;

// x is (A, D0, B, D1) with ab = A * B matrices; out is (A, D1, B, D0).
template <typename T>
__global__ void transpose_tiled_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t ab,
                                       int64_t d0_size, int64_t b_size, int64_t d1_size) {
  KILN_SHARED(T, tile, [kTileDim][kTileDim + 1]);
  const int64_t j1_0 = static_cast<int64_t>(blockIdx.x) * kTileDim;
  const int64_t j0_0 = static_cast<int64_t>(blockIdx.y) * kTileDim;
  for (int64_t m = blockIdx.z; m < ab; m += gridDim.z) {
    const int64_t a = m / b_size, b = m % b_size;
    // Read: rows j0 of the tile, threadIdx.x along j1 (contiguous in x).
    for (int r = threadIdx.y; r < kTileDim; r += kTileRows) {
      const int64_t j0 = j0_0 + r, j1 = j1_0 + threadIdx.x;
      if (j0 < d0_size && j1 < d1_size)
        tile[r][threadIdx.x] = x[((a * d0_size + j0) * b_size + b) * d1_size + j1];
    }
    __syncthreads();
    // Write: rows j1 of the output tile, threadIdx.x along j0 (contiguous in out).
    for (int r = threadIdx.y; r < kTileDim; r += kTileRows) {
      const int64_t j1 = j1_0 + r, j0 = j0_0 + threadIdx.x;
      if (j0 < d0_size && j1 < d1_size)
        out[((a * d1_size + j1) * b_size + b) * d0_size + j0] = tile[threadIdx.x][r];
    }
    __syncthreads();  // the tile is reused by the next matrix
  }
}

// x is (A, D0, B, D1, C); out is (A, D1, B, D0, C), n elements. One thread per output element.
template <typename T>
__global__ void transpose_gather_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t n,
                                        int64_t d0_size, int64_t b_size, int64_t d1_size,
                                        int64_t c_size) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride) {
    // Output index j = (((a * D1 + j1) * B + b) * D0 + j0) * C + c, peeled from the right.
    int64_t rest = j;
    const int64_t c = rest % c_size;
    rest /= c_size;
    const int64_t j0 = rest % d0_size;
    rest /= d0_size;
    const int64_t b = rest % b_size;
    rest /= b_size;
    const int64_t j1 = rest % d1_size;
    const int64_t a = rest / d1_size;
    out[j] = x[(((a * d0_size + j0) * b_size + b) * d1_size + j1) * c_size + c];
  }
}

}  // namespace

template <typename T>
void transpose(Backend, const T* x, T* out, const int64_t* dims, int64_t rank, int64_t d0,
               int64_t d1) {
  const cudaStream_t stream = current_stream();
  if (d0 == d1) {  // nothing moves
    int64_t n = 1;
    for (int64_t d = 0; d < rank; ++d) n *= dims[d];
    if (n > 0)
      KILN_CUDA_CHECK(cudaMemcpyAsync(out, x, static_cast<size_t>(n) * sizeof(T),
                                      cudaMemcpyDeviceToDevice, stream));
    return;
  }
  if (d0 > d1) std::swap(d0, d1);
  int64_t a_size = 1, b_size = 1, c_size = 1;
  for (int64_t d = 0; d < d0; ++d) a_size *= dims[d];
  for (int64_t d = d0 + 1; d < d1; ++d) b_size *= dims[d];
  for (int64_t d = d1 + 1; d < rank; ++d) c_size *= dims[d];
  const int64_t d0_size = dims[d0], d1_size = dims[d1];
  const int64_t n = a_size * d0_size * b_size * d1_size * c_size;
  if (n == 0) return;
  if (c_size == 1) {
    const int64_t ab = a_size * b_size;
    const dim3 grid(blocks_for(d1_size, kTileDim), blocks_for(d0_size, kTileDim),
                    grid_stride_blocks(ab, kMaxGridZ));
    KILN_CHECK(grid.y <= 65535, "transpose: dim of size ", d0_size, " is too large for the grid");
    launch(transpose_tiled_kernel<T>, LaunchConfig{grid, dim3(kTileDim, kTileRows), 0, stream}, x,
           out, ab, d0_size, b_size, d1_size);
  } else {
    launch(transpose_gather_kernel<T>,
           LaunchConfig{dim3(elementwise_blocks(n)), dim3(kElementwiseThreads), 0, stream}, x, out,
           n, d0_size, b_size, d1_size, c_size);
  }
}

// transpose moves bytes: one instantiation per element size serves every dtype.
template void transpose<uint8_t>(Backend, const uint8_t*, uint8_t*, const int64_t*, int64_t,
                                 int64_t, int64_t);
template void transpose<uint16_t>(Backend, const uint16_t*, uint16_t*, const int64_t*, int64_t,
                                  int64_t, int64_t);
template void transpose<uint32_t>(Backend, const uint32_t*, uint32_t*, const int64_t*, int64_t,
                                  int64_t, int64_t);
template void transpose<uint64_t>(Backend, const uint64_t*, uint64_t*, const int64_t*, int64_t,
                                  int64_t, int64_t);

}  // namespace kiln::cuda
