// batchnorm2d_rows_cuda.cu: the per-channel reductions of batch normalisation when each
// channel's values are a column of a row-major (M, C) matrix: the NCHW kernels' hw == 1 case,
// which is how a channels-last (N, C, H, W) tensor reaches them (M = N * H * W rows of C
// channels, layers/batchnorm2d.cpp). The element-wise passes need nothing new: with hw == 1
// the channel of element i is i % C, and neighbouring threads already read neighbouring bytes.
//
// The NCHW reduction kernels give each channel one block whose threads walk that channel's
// values; here those values are C elements apart, so a warp's 32 loads would touch 32 cache
// lines. Instead a block of 32 x 8 threads takes 32 neighbouring channels (threadIdx.x, so a
// warp reads 32 neighbours of one row: one coalesced 128-byte line for f32) and 8 row groups
// (threadIdx.y), like the column sums of engine/cuda/kernels/reduce.cu. The rows are cut into
// `parts` pieces, one per block row of the grid, so that a few channels still fill the GPU; a
// second kernel combines the pieces, one thread per channel. Every combination follows a fixed
// order that depends on the shape only: bit-for-bit reproducible, no atomics.
//
// 16-bit activations (T = Half or BFloat16): elements widen to f32 on load (exact) and the
// per-channel results are f32 (P = compute_t<T>); the sums are the same doubles.
//
// Statistics: each thread keeps a count, a mean and a sum of squared deviations (Welford's
// update, in double), and partial results merge with Chan, Golub and LeVeque's formula
// ("Algorithms for computing the sample variance: analysis and recommendations", The American
// Statistician 37(3), 1983): one pass over the data with the accuracy of two.
#include "layers/batchnorm2d_rows_cuda.cuh"

#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/launch.h"
#include "engine/tensor.h"

namespace kiln::cuda {

namespace {

constexpr int kColsX = 32;  // channels per block (one warp's width)
constexpr int kColsY = 8;   // row groups per block
constexpr int64_t kTargetBlocks = 512;
constexpr int64_t kMinRowsPerThread = 16;
constexpr int kFinishThreads = 256;

// An element in the per-channel type P (a 16-bit value widens exactly).
template <typename T>
__device__ __forceinline__ compute_t<T> in(T v) {
  return convert_elem<compute_t<T>>(v);
}

// count, mean, M2 (the sum of squared deviations from the mean) of some values.
struct Moments {
  double n, mean, m2;
};

__device__ __forceinline__ Moments merge(Moments a, Moments b) {
  const double n = a.n + b.n;
  if (n == 0) return a;
  const double delta = b.mean - a.mean;
  return {n, a.mean + delta * (b.n / n), a.m2 + b.m2 + delta * delta * (a.n * b.n / n)};
}

// Rows [begin, end) of piece p: the pieces split m rows as evenly as whole rows allow.
__device__ __forceinline__ void piece_rows(int64_t m, int64_t parts, int64_t p, int64_t* begin,
                                           int64_t* end) {
  const int64_t piece = (m + parts - 1) / parts;
  *begin = p * piece;
  *end = (p + 1) * piece < m ? (p + 1) * piece : m;
}

// grid (ceil(C / 32), parts), block (32, 8). Writes the moments of channel ch over piece p to
// scratch[(p * C + ch) * 3 + {0, 1, 2}].
template <typename T>
__global__ void __launch_bounds__(kColsX* kColsY)
    rows_moments_kernel(const T* __restrict__ x, double* __restrict__ scratch, int64_t m,
                        int64_t c, int64_t parts) {
  KILN_SHARED(double, part_n, [kColsY][kColsX]);
  KILN_SHARED(double, part_mean, [kColsY][kColsX]);
  KILN_SHARED(double, part_m2, [kColsY][kColsX]);
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * kColsX + threadIdx.x;
  const int64_t p = blockIdx.y;
  int64_t begin, end;
  piece_rows(m, parts, p, &begin, &end);
  Moments acc{0, 0, 0};
  if (ch < c) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kColsY) {
      const double v = static_cast<double>(in(x[r * c + ch]));
      acc.n += 1;
      const double delta = v - acc.mean;
      acc.mean += delta / acc.n;
      acc.m2 += delta * (v - acc.mean);
    }
  }
  part_n[threadIdx.y][threadIdx.x] = acc.n;
  part_mean[threadIdx.y][threadIdx.x] = acc.mean;
  part_m2[threadIdx.y][threadIdx.x] = acc.m2;
  __syncthreads();
  if (threadIdx.y == 0 && ch < c) {
    Moments total{part_n[0][threadIdx.x], part_mean[0][threadIdx.x], part_m2[0][threadIdx.x]};
    for (int y = 1; y < kColsY; ++y)
      total = merge(total, {part_n[y][threadIdx.x], part_mean[y][threadIdx.x],
                            part_m2[y][threadIdx.x]});
    double* out = scratch + (p * c + ch) * 3;
    out[0] = total.n;
    out[1] = total.mean;
    out[2] = total.m2;
  }
}

// One thread per channel: the pieces' moments merged in order; mean and the biased variance.
template <typename P>  // the per-channel type
__global__ void rows_finish_stats_kernel(const double* __restrict__ scratch, P* __restrict__ mean,
                                         P* __restrict__ var, int64_t c, int64_t parts) {
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  Moments total{0, 0, 0};
  for (int64_t p = 0; p < parts; ++p) {
    const double* in = scratch + (p * c + ch) * 3;
    total = merge(total, {in[0], in[1], in[2]});
  }
  mean[ch] = static_cast<P>(total.mean);
  var[ch] = static_cast<P>(total.m2 / total.n);
}

// grid (ceil(C / 32), parts), block (32, 8): sum(grad_y) and sum(grad_y * (x - mean)) of
// channel ch over piece p (grad_y masked by the fused ReLU's output when relu_y is given), to
// scratch[(p * C + ch) * 2 + {0, 1}].
template <typename T, typename P = compute_t<T>>
__global__ void __launch_bounds__(kColsX* kColsY)
    rows_backward_sums_kernel(const T* __restrict__ grad_y, const T* __restrict__ x,
                              const P* __restrict__ mean, const T* __restrict__ relu_y,
                              double* __restrict__ scratch, int64_t m, int64_t c, int64_t parts) {
  KILN_SHARED(double, part_gy, [kColsY][kColsX]);
  KILN_SHARED(double, part_gy_xc, [kColsY][kColsX]);
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * kColsX + threadIdx.x;
  const int64_t p = blockIdx.y;
  int64_t begin, end;
  piece_rows(m, parts, p, &begin, &end);
  double sum_gy = 0, sum_gy_xc = 0;
  if (ch < c) {
    const double mu = static_cast<double>(mean[ch]);
    for (int64_t r = begin + threadIdx.y; r < end; r += kColsY) {
      const int64_t off = r * c + ch;
      const double gy =
          relu_y && !(in(relu_y[off]) > P(0)) ? 0.0 : static_cast<double>(in(grad_y[off]));
      sum_gy += gy;
      sum_gy_xc = fma_t(gy, static_cast<double>(in(x[off])) - mu, sum_gy_xc);
    }
  }
  part_gy[threadIdx.y][threadIdx.x] = sum_gy;
  part_gy_xc[threadIdx.y][threadIdx.x] = sum_gy_xc;
  __syncthreads();
  if (threadIdx.y == 0 && ch < c) {
    double total_gy = part_gy[0][threadIdx.x], total_gy_xc = part_gy_xc[0][threadIdx.x];
    for (int y = 1; y < kColsY; ++y) {
      total_gy += part_gy[y][threadIdx.x];
      total_gy_xc += part_gy_xc[y][threadIdx.x];
    }
    double* out = scratch + (p * c + ch) * 2;
    out[0] = total_gy;
    out[1] = total_gy_xc;
  }
}

// One thread per channel: the pieces' sums added in order, then what the NCHW reduction kernel
// writes from them (batchnorm2d_cuda.cu): grad_bias, grad_weight and the coefficients of
// grad_x = k * grad_y - a * (x - mean) + d.
template <typename P>  // the per-channel type
__global__ void rows_finish_backward_kernel(BatchNormMode mode, const double* __restrict__ scratch,
                                            const P* __restrict__ invstd,
                                            const P* __restrict__ weight,
                                            P* __restrict__ grad_weight, P* __restrict__ grad_bias,
                                            P* __restrict__ coef, int64_t m, int64_t c,
                                            int64_t parts) {
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  double sum_gy = 0, sum_gy_xc = 0;
  for (int64_t p = 0; p < parts; ++p) {
    sum_gy += scratch[(p * c + ch) * 2];
    sum_gy_xc += scratch[(p * c + ch) * 2 + 1];
  }
  write_backward_reduction(mode, sum_gy, sum_gy_xc, invstd, weight, grad_weight, grad_bias, coef,
                           ch, m, c);
}

// Pieces to cut the rows into: about kTargetBlocks blocks in all, each thread taking at least
// kMinRowsPerThread rows. A function of the shape only.
int64_t row_parts(int64_t m, int64_t c) {
  const int64_t col_blocks = (c + kColsX - 1) / kColsX;
  const int64_t by_work = m / (kColsY * kMinRowsPerThread);
  const int64_t by_blocks = (kTargetBlocks + col_blocks - 1) / col_blocks;
  const int64_t parts = by_work < by_blocks ? by_work : by_blocks;
  return parts > 1 ? (parts < 65535 ? parts : 65535) : 1;
}

// A scratch buffer of n doubles on the current device (the caching allocator: freed when the
// Tensor goes, reused only by work queued later on the same stream).
Tensor scratch_doubles(int64_t n) {
  return Tensor::empty({n}, DType::F64, Device(DeviceType::CUDA, current_device()));
}

dim3 moments_grid(int64_t c, int64_t parts) {
  return dim3(static_cast<unsigned>((c + kColsX - 1) / kColsX), static_cast<unsigned>(parts));
}

}  // namespace

template <typename T>
void batch_norm2d_stats_rows(const T* x, compute_t<T>* mean, compute_t<T>* var, int64_t m,
                             int64_t c) {
  const int64_t parts = row_parts(m, c);
  const Tensor scratch = scratch_doubles(parts * c * 3);
  double* s = scratch.data<double>();
  const cudaStream_t stream = current_stream();
  launch(rows_moments_kernel<T>,
         LaunchConfig{moments_grid(c, parts), dim3(kColsX, kColsY), 0, stream}, x, s, m, c,
         parts);
  launch(rows_finish_stats_kernel<compute_t<T>>,
         LaunchConfig{dim3(blocks_for(c, kFinishThreads)), dim3(kFinishThreads), 0, stream}, s,
         mean, var, c, parts);
}

template <typename T>
void batch_norm2d_backward_reduce_rows(BatchNormMode mode, const T* grad_y, const T* x,
                                       const compute_t<T>* mean, const compute_t<T>* invstd,
                                       const compute_t<T>* weight, const T* relu_y,
                                       compute_t<T>* grad_weight, compute_t<T>* grad_bias,
                                       compute_t<T>* coef, bool need_sums, int64_t m, int64_t c) {
  const int64_t parts = need_sums ? row_parts(m, c) : 0;
  const Tensor scratch = scratch_doubles(parts > 0 ? parts * c * 2 : 1);
  double* s = scratch.data<double>();
  const cudaStream_t stream = current_stream();
  if (need_sums)
    launch(rows_backward_sums_kernel<T>,
           LaunchConfig{moments_grid(c, parts), dim3(kColsX, kColsY), 0, stream}, grad_y, x, mean,
           relu_y, s, m, c, parts);
  launch(rows_finish_backward_kernel<compute_t<T>>,
         LaunchConfig{dim3(blocks_for(c, kFinishThreads)), dim3(kFinishThreads), 0, stream},
         mode, s, invstd, weight, grad_weight, grad_bias, coef, m, c, parts);
}

#define KILN_INSTANTIATE_BN_ROWS(T)                                                           \
  template void batch_norm2d_stats_rows<T>(const T*, compute_t<T>*, compute_t<T>*, int64_t,   \
                                           int64_t);                                          \
  template void batch_norm2d_backward_reduce_rows<T>(                                         \
      BatchNormMode, const T*, const T*, const compute_t<T>*, const compute_t<T>*,            \
      const compute_t<T>*, const T*, compute_t<T>*, compute_t<T>*, compute_t<T>*, bool,       \
      int64_t, int64_t);
KILN_INSTANTIATE_BN_ROWS(float)
KILN_INSTANTIATE_BN_ROWS(double)
KILN_INSTANTIATE_BN_ROWS(Half)
KILN_INSTANTIATE_BN_ROWS(BFloat16)
#undef KILN_INSTANTIATE_BN_ROWS

}  // namespace kiln::cuda
