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
// per-channel results are f32 (P = compute_t<T>); the sums are the same doubles. A warp's 32
// neighbouring 16-bit channels are only 64 bytes, so when C is even (and the pointers 4-byte
// aligned) each thread takes two neighbouring channels with one 4-byte load (V = 2): a block
// then covers 64 channels and a warp reads a whole 128-byte line of a row, as for f32. Each
// channel's values are visited, summed and merged in the same order as with one channel per
// thread (the same pieces, the same row groups), so the result does not depend on V. An odd C
// leaves every other row's pair misaligned: those shapes take V = 1.
//
// Statistics: each thread keeps a count, a mean and a sum of squared deviations (Welford's
// update, in double), and partial results merge with Chan, Golub and LeVeque's formula
// ("Algorithms for computing the sample variance: analysis and recommendations", The American
// Statistician 37(3), 1983): one pass over the data with the accuracy of two.
#include "layers/batchnorm2d_rows_cuda.cuh"

#include <cstdint>
#include <initializer_list>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/launch.h"
#include "engine/host_device.h"
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

// grid (ceil(C / (32 * V)), parts), block (32, 8); thread x takes channels ch0 .. ch0 + V - 1,
// ch0 = (blockIdx.x * 32 + x) * V (V divides C). Writes the moments of channel ch over piece p
// to scratch[(p * C + ch) * 3 + {0, 1, 2}].
template <typename T, int V>
__global__ void __launch_bounds__(kColsX* kColsY)
    rows_moments_kernel(const T* __restrict__ x, double* __restrict__ scratch, int64_t m,
                        int64_t c, int64_t parts) {
  KILN_SHARED(double, part_n, [kColsY][kColsX * V]);
  KILN_SHARED(double, part_mean, [kColsY][kColsX * V]);
  KILN_SHARED(double, part_m2, [kColsY][kColsX * V]);
  const int64_t ch0 = (static_cast<int64_t>(blockIdx.x) * kColsX + threadIdx.x) * V;
  const int64_t p = blockIdx.y;
  int64_t begin, end;
  piece_rows(m, parts, p, &begin, &end);
  Moments acc[V];
  for (int j = 0; j < V; ++j) acc[j] = {0, 0, 0};
  if (ch0 < c) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kColsY) {
      const Lanes<T, V> row = load_lanes<V>(x + r * c + ch0);
      for (int j = 0; j < V; ++j) {
        const double v = static_cast<double>(in(row.v[j]));
        acc[j].n += 1;
        const double delta = v - acc[j].mean;
        acc[j].mean += delta / acc[j].n;
        acc[j].m2 += delta * (v - acc[j].mean);
      }
    }
  }
  for (int j = 0; j < V; ++j) {
    part_n[threadIdx.y][threadIdx.x * V + j] = acc[j].n;
    part_mean[threadIdx.y][threadIdx.x * V + j] = acc[j].mean;
    part_m2[threadIdx.y][threadIdx.x * V + j] = acc[j].m2;
  }
  __syncthreads();
  if (threadIdx.y == 0 && ch0 < c) {
    for (int j = 0; j < V; ++j) {
      const int col = threadIdx.x * V + j;
      Moments total{part_n[0][col], part_mean[0][col], part_m2[0][col]};
      for (int y = 1; y < kColsY; ++y)
        total = merge(total, {part_n[y][col], part_mean[y][col], part_m2[y][col]});
      double* out = scratch + (p * c + ch0 + j) * 3;
      out[0] = total.n;
      out[1] = total.mean;
      out[2] = total.m2;
    }
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

// grid (ceil(C / (32 * V)), parts), block (32, 8), channels per thread as in
// rows_moments_kernel: sum(grad_y) and sum(grad_y * (x - mean)) of channel ch over piece p
// (grad_y masked by the fused ReLU's output when relu_y is given), to
// scratch[(p * C + ch) * 2 + {0, 1}].
template <typename T, int V, typename P = compute_t<T>>
__global__ void __launch_bounds__(kColsX* kColsY)
    rows_backward_sums_kernel(const T* __restrict__ grad_y, const T* __restrict__ x,
                              const P* __restrict__ mean, const T* __restrict__ relu_y,
                              double* __restrict__ scratch, int64_t m, int64_t c, int64_t parts) {
  KILN_SHARED(double, part_gy, [kColsY][kColsX * V]);
  KILN_SHARED(double, part_gy_xc, [kColsY][kColsX * V]);
  const int64_t ch0 = (static_cast<int64_t>(blockIdx.x) * kColsX + threadIdx.x) * V;
  const int64_t p = blockIdx.y;
  int64_t begin, end;
  piece_rows(m, parts, p, &begin, &end);
  double sum_gy[V], sum_gy_xc[V];
  for (int j = 0; j < V; ++j) sum_gy[j] = sum_gy_xc[j] = 0;
  if (ch0 < c) {
    double mu[V];
    for (int j = 0; j < V; ++j) mu[j] = static_cast<double>(mean[ch0 + j]);
    for (int64_t r = begin + threadIdx.y; r < end; r += kColsY) {
      const int64_t off = r * c + ch0;
      const Lanes<T, V> g = load_lanes<V>(grad_y + off), xs = load_lanes<V>(x + off);
      Lanes<T, V> ys{};
      if (relu_y) ys = load_lanes<V>(relu_y + off);
      for (int j = 0; j < V; ++j) {
        const double gy =
            relu_y && !(in(ys.v[j]) > P(0)) ? 0.0 : static_cast<double>(in(g.v[j]));
        sum_gy[j] += gy;
        sum_gy_xc[j] = fma_t(gy, static_cast<double>(in(xs.v[j])) - mu[j], sum_gy_xc[j]);
      }
    }
  }
  for (int j = 0; j < V; ++j) {
    part_gy[threadIdx.y][threadIdx.x * V + j] = sum_gy[j];
    part_gy_xc[threadIdx.y][threadIdx.x * V + j] = sum_gy_xc[j];
  }
  __syncthreads();
  if (threadIdx.y == 0 && ch0 < c) {
    for (int j = 0; j < V; ++j) {
      const int col = threadIdx.x * V + j;
      double total_gy = part_gy[0][col], total_gy_xc = part_gy_xc[0][col];
      for (int y = 1; y < kColsY; ++y) {
        total_gy += part_gy[y][col];
        total_gy_xc += part_gy_xc[y][col];
      }
      double* out = scratch + (p * c + ch0 + j) * 2;
      out[0] = total_gy;
      out[1] = total_gy_xc;
    }
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

dim3 moments_grid(int64_t c, int64_t parts, int v) {
  const int64_t cols = kColsX * v;
  return dim3(static_cast<unsigned>((c + cols - 1) / cols), static_cast<unsigned>(parts));
}

// The channels per thread of the reduction kernels: 2 for 16-bit elements when C is even and
// every pointer is aligned for a pair, else 1.
template <typename T>
int lanes_for(int64_t c, std::initializer_list<const T*> ptrs) {
  if constexpr (is_low_precision_v<T>) {
    if (c % 2 != 0) return 1;
    for (const T* p : ptrs)
      if (reinterpret_cast<uintptr_t>(p) % (2 * sizeof(T)) != 0) return 1;
    return 2;
  } else {
    (void)c;
    (void)ptrs;
    return 1;
  }
}

}  // namespace

template <typename T>
void batch_norm2d_stats_rows(const T* x, compute_t<T>* mean, compute_t<T>* var, int64_t m,
                             int64_t c) {
  const int64_t parts = row_parts(m, c);
  const Tensor scratch = scratch_doubles(parts * c * 3);
  double* s = scratch.data<double>();
  const cudaStream_t stream = current_stream();
  const int v = lanes_for<T>(c, {x});
  const LaunchConfig config{moments_grid(c, parts, v), dim3(kColsX, kColsY), 0, stream};
  if (v == 2)
    launch(rows_moments_kernel<T, 2>, config, x, s, m, c, parts);
  else
    launch(rows_moments_kernel<T, 1>, config, x, s, m, c, parts);
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
  if (need_sums) {
    const int v = lanes_for<T>(c, {grad_y, x, relu_y});  // a null relu_y is aligned
    const LaunchConfig config{moments_grid(c, parts, v), dim3(kColsX, kColsY), 0, stream};
    if (v == 2)
      launch(rows_backward_sums_kernel<T, 2>, config, grad_y, x, mean, relu_y, s, m, c, parts);
    else
      launch(rows_backward_sums_kernel<T, 1>, config, grad_y, x, mean, relu_y, s, m, c, parts);
  }
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
