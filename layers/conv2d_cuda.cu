// conv2d_cuda.cu: the hand CUDA kernels of Conv2d, cuda::conv2d_forward, conv2d_backward_data
// and conv2d_backward_weight, in two steps (conv2d_cpu.cpp is the specification; the notation
// is the one of conv2d_kernels.h; the family's map is in layers/conv2d.h).
//
// Step 1, the direct kernels (ConvKernel::Direct): one thread per element of the result, plain
// loops over the sum, exactly the formula of conv2d.h. Forward: a thread per y[n][k][p][q] sums
// C*R*S products. Backward-data: a thread per dx[n][c][h][w] GATHERS the outputs whose window
// covers its pixel (no scatter, no atomics). Backward-weight: a thread per dw[k][c][r][s] sums
// over the N*P*Q positions. They are slow (every operand comes from global memory, and
// backward-weight runs only K*C*R*S threads), and kept as the readable reference the fast step
// is tested against.
//
// Step 2, implicit GEMM (ConvKernel::ImplicitGemm, the default). The CPU lowers a convolution
// to a GEMM through im2col (conv2d_cpu.cpp): col[(c,r,s)][(p,q)] = x[c][p*stride-pad+r]
// [q*stride-pad+s], then y[n] = w * col. On the GPU we run the same three GEMMs, but we never
// write col to memory: the GEMM kernel computes the address of col's element while it loads a
// tile into shared memory. Why implicit rather than im2col + cuda::gemm:
//   - col is R*S times the size of x (9x for 3x3): writing and re-reading it costs more memory
//     traffic than the whole convolution moves otherwise, and bounding its size means running
//     the batch in groups of images, each GEMM too small to fill the GPU;
//   - with col implicit, the GEMM's N dimension can span the whole batch (N*P*Q columns), so
//     one launch covers everything, and the output lands directly in NCHW (or NHWC) order (an
//     explicit (K, N*P*Q) GEMM result would need a transposing copy into (N, K, P, Q));
//   - backward-weight sums over N*P*Q, a long reduction into a small (K, C*R*S) result: a GEMM
//     over it has too few output tiles to fill the GPU, so it must be split along the sum
//     (split-K), which a call to a plain GEMM cannot do in one launch;
//   - col2im (backward-data) becomes a gather for free: each dx element is one GEMM output.
// The three GEMMs, with the rows (M), columns (N) and reduction (Kred) of each:
//
//   forward          y  = w   * col        M = K  N = N*P*Q  Kred = C*R*S
//                    A(k, crs) = w[k][crs]       B(crs, npq) = col of image n (zero padding)
//   backward-data    dx = w^T * dcol       M = C  N = N*H*W  Kred = K*R*S
//                    A(c, krs) = w[k][c][r][s]   B(krs, nhw) = dy[n][k][p][q] where
//                    h = p*stride - pad + r, w = q*stride - pad + s (else 0): the gather
//   backward-weight  dw = dy  * col^T      M = K  N = C*R*S  Kred = N*P*Q
//                    A(k, npq) = dy[n][k][pq]    B(npq, crs) = col again
//
// One kernel template runs all three (conv_implicit_gemm_kernel, with the problems in
// layers/conv2d_implicit_gemm.cuh, namespace conv_detail); a "problem" struct per GEMM
// says how to find A(i, kk), B(kk, j) and where C(i, j) goes. The kernel is the classic
// register-blocked GEMM (engine/cuda/kernels/gemm.cu step 3 explains each idea):
//   - a block of 256 threads (16 x 16) computes a BM x BN tile of the result, walking the
//     reduction in slices of BK = 8: each slice of A (BM x 8) and B (8 x BN) is loaded into
//     shared memory once and used by all threads;
//   - each thread owns a TM x TN = (BM/16) x (BN/16) micro-tile of accumulators in registers
//     and, per k, reads TM values of A and TN of B from shared memory for TM*TN multiply-adds
//     (an outer product); its rows are two (or one) groups of 4 consecutive rows 64 apart, so
//     the reads are 16-byte vector loads without bank conflicts, likewise its columns;
//   - double buffering: two shared slices; while the block computes on one, the next slice is
//     fetched from global memory into registers and stored into the other afterwards: one
//     __syncthreads per slice, and the load latency hides behind the arithmetic;
//   - the gather: a thread always loads B for the same columns (32 apart, so a warp reads 32
//     consecutive columns: for stride 1 consecutive addresses), so the column's half of the
//     address arithmetic (which image, which output pixel) is done once, before the loop; per
//     slice it decodes its row (c, r, s) once, and each element costs one add and a bounds
//     check. Out-of-range elements (padding, edges of the tile) load as 0.
// Tiles: 128x128 (8x8 per thread), 64x128 (4x8) or 64x64 (4x4), the largest that still gives
// every SM a block (rows beyond M would be wasted work: channel counts of 64 take 64-row tiles).
// Double uses 64x64 only (its 8x8 micro-tile would not fit in registers).
//
// Channels-last. x, dx, y, dy may be NHWC (g.x_nhwc) and w, dw KRSC (g.w_nhwc), in any
// combination: the problems read every operand through the strides of ConvDims, and in NHWC
// they order the filter taps (r, s, c), c fastest, so that consecutive reduction indices are
// consecutive addresses (conv2d_implicit_gemm.cuh explains the coalescing); y and dx land as
// NHWC rows, k (or c) fastest. The direct kernels walk their result in storage order and read
// through the same strides. The bias gradient of NHWC dy has its own kernel (coalesced
// per-channel column sums). Not measured on a GPU yet.
//
// Determinism. Every output element is one thread's accumulator, summed over the reduction in
// increasing order; the tile shape does not change that order. Backward-weight's split-K gives
// each of S splits a contiguous range of the N*P*Q sum and writes S partial results, which a
// second kernel adds in split order. S depends only on the shape (not on the GPU), so the bits
// are the same from run to run. The bias gradient is a per-channel block reduction in a fixed
// tree (no atomics). Stride > 1 in backward-data: 3 of 4 B elements are zero (the pixels no
// window starts on); they are still multiplied, which costs time, not correctness.
#include "engine/cuda/runtime.h"

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <type_traits>

#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/launch.h"
#include "engine/error.h"
#include "engine/tensor.h"
#include "layers/conv2d_implicit_gemm.cuh"
#include "layers/conv2d_kernels.h"

namespace kiln::cuda {

// The implicit GEMM's kernel, problems and ConvDims (conv2d_implicit_gemm.cuh): this file is
// their one user.
using namespace conv_detail;

namespace {

// ---- Options (tests and benchmarks) ----------------------------------------------------------

std::mutex g_options_mutex;
ConvCudaOptions g_options;

// ---- Step 1: direct kernels ------------------------------------------------------------------

constexpr int kDirectThreads = 256;

// The logical coordinates (a, b, h, w) of the i-th element, in storage order, of an (A, B, H, W)
// tensor: NCHW, or channels-last (B fastest). The direct kernels walk their result in storage
// order, so that neighbouring threads write neighbouring elements in either format, and read
// every operand through ConvDims' strides (the sums themselves are the same in both).
struct Coord {
  int a, b, h, w;
};
__device__ __forceinline__ Coord coord_of(int64_t i, int bdim, int hdim, int wdim, bool nhwc) {
  Coord c;
  if (nhwc) {
    c.b = static_cast<int>(i % bdim), i /= bdim;
    c.w = static_cast<int>(i % wdim), i /= wdim;
    c.h = static_cast<int>(i % hdim), c.a = static_cast<int>(i / hdim);
  } else {
    c.w = static_cast<int>(i % wdim), i /= wdim;
    c.h = static_cast<int>(i % hdim), i /= hdim;
    c.b = static_cast<int>(i % bdim), c.a = static_cast<int>(i / bdim);
  }
  return c;
}

// Element (a, b, h, w) of a tensor with strides st.
__device__ __forceinline__ int at(const Strides& st, int a, int b, int h, int w) {
  return a * st.n + b * st.c + h * st.h + w * st.w;
}

// One thread per y[n][k][p][q] (grid-stride): y = b[k] + sum over (c, r, s).
template <typename T>
__global__ void conv2d_forward_direct_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                             const T* __restrict__ b, T* __restrict__ y,
                                             ConvDims d, bool y_nhwc) {
  const int64_t total = static_cast<int64_t>(d.n) * d.k * d.pq;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Coord o = coord_of(i, d.k, d.p, d.q, y_nhwc);
    const int n = o.a, k = o.b, p = o.h, q = o.w;
    T acc = 0;
    for (int c = 0; c < d.c; ++c)
      for (int r = 0; r < d.r; ++r) {
        const int ih = p * d.stride - d.pad + r;
        if (ih < 0 || ih >= d.h) continue;  // zero padding
        for (int s = 0; s < d.s; ++s) {
          const int iw = q * d.stride - d.pad + s;
          if (iw < 0 || iw >= d.w) continue;
          acc += w[at(d.ws, k, c, r, s)] * x[at(d.xs, n, c, ih, iw)];
        }
      }
    y[i] = acc + (b ? b[k] : T(0));
  }
}

// One thread per dx[n][c][h][w] (grid-stride). Pixel (h, w) was read by output (p, q) through
// filter tap (r, s) when h = p*stride - pad + r: so for each tap, p = (h + pad - r) / stride if
// that divides exactly and lands inside [0, P). A gather: each dx element is written once.
template <typename T>
__global__ void conv2d_backward_data_direct_kernel(const T* __restrict__ dy,
                                                   const T* __restrict__ w, T* __restrict__ dx,
                                                   ConvDims d, bool x_nhwc) {
  const int64_t total = static_cast<int64_t>(d.n) * d.chw;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Coord o = coord_of(i, d.c, d.h, d.w, x_nhwc);
    const int n = o.a, c = o.b, ih = o.h, iw = o.w;
    T acc = 0;
    for (int k = 0; k < d.k; ++k)
      for (int r = 0; r < d.r; ++r) {
        const int pn = ih + d.pad - r;  // p * stride
        if (pn < 0 || pn % d.stride != 0 || pn / d.stride >= d.p) continue;
        const int p = pn / d.stride;
        for (int s = 0; s < d.s; ++s) {
          const int qn = iw + d.pad - s;
          if (qn < 0 || qn % d.stride != 0 || qn / d.stride >= d.q) continue;
          acc += w[at(d.ws, k, c, r, s)] * dy[at(d.ys, n, k, p, qn / d.stride)];
        }
      }
    dx[i] = acc;
  }
}

// One thread per dw[k][c][r][s] (grid-stride): the sum over images and output pixels.
template <typename T>
__global__ void conv2d_backward_weight_direct_kernel(const T* __restrict__ x,
                                                     const T* __restrict__ dy,
                                                     T* __restrict__ dw, ConvDims d, bool w_nhwc) {
  const int total = d.k * d.crs;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const Coord o = coord_of(i, d.c, d.r, d.s, w_nhwc);
    const int k = o.a, c = o.b, r = o.h, s = o.w;
    T acc = 0;
    for (int n = 0; n < d.n; ++n)
      for (int p = 0; p < d.p; ++p) {
        const int ih = p * d.stride - d.pad + r;
        if (ih < 0 || ih >= d.h) continue;
        for (int q = 0; q < d.q; ++q) {
          const int iw = q * d.stride - d.pad + s;
          if (iw < 0 || iw >= d.w) continue;
          acc += dy[at(d.ys, n, k, p, q)] * x[at(d.xs, n, c, ih, iw)];
        }
      }
    dw[i] = acc;
  }
}

// ---- Bias gradient (both steps) --------------------------------------------------------------

constexpr int kBiasThreads = 256;

// NCHW. grid = K blocks: db[k] = sum of dy[n][k][p][q] over (n, p, q). The block's threads walk
// the N*P*Q values as one flat range (consecutive threads, consecutive pixels), then block_sum
// combines their partial sums in a fixed tree (warp shuffles, then one value per warp).
template <typename T>
__global__ void __launch_bounds__(kBiasThreads)
    conv2d_bias_grad_kernel(const T* __restrict__ dy, T* __restrict__ db, ConvDims d) {
  KILN_SHARED(T, scratch, [kWarpSize]);
  const int k = blockIdx.x;
  const int total = d.n * d.pq;
  T sum = 0;
  for (int j = threadIdx.x; j < total; j += blockDim.x) {
    const int n = j / d.pq;
    sum += dy[(n * d.k + k) * d.pq + (j - n * d.pq)];
  }
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) db[k] = sum;
}

// Channels-last: dy is N*P*Q rows of K channels, and a channel's values are K apart, so the
// NCHW kernel's threads would each touch their own cache line. As the channels-last BatchNorm
// sums (layers/batchnorm2d_rows_cuda.cu): block (32, 8) takes 32 neighbouring channels
// (threadIdx.x: a warp reads 32 neighbours of one row, one coalesced line) and 8 row groups
// (threadIdx.y, rows y, y + 8, ...); thread y = 0 then adds the 8 groups' sums in order. A
// fixed order that depends on the shape only.
constexpr int kBiasCols = 32, kBiasRows = 8;
template <typename T>
__global__ void __launch_bounds__(kBiasCols* kBiasRows)
    conv2d_bias_grad_nhwc_kernel(const T* __restrict__ dy, T* __restrict__ db, ConvDims d) {
  KILN_SHARED(T, part, [kBiasRows][kBiasCols]);
  const int k = blockIdx.x * kBiasCols + threadIdx.x;
  const int rows = d.n * d.pq;
  T sum = 0;
  if (k < d.k)
    for (int j = threadIdx.y; j < rows; j += kBiasRows) sum += dy[j * d.k + k];
  part[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && k < d.k) {
    T total = part[0][threadIdx.x];
    for (int y = 1; y < kBiasRows; ++y) total += part[y][threadIdx.x];
    db[k] = total;
  }
}

// ---- Host side -------------------------------------------------------------------------------

// Multiprocessors of the current device, asked once per device.
int sm_count() {
  static std::mutex mutex;
  static int counts[64] = {};
  const int dev = current_device();
  std::lock_guard<std::mutex> lock(mutex);
  if (dev < 0 || dev >= 64) return 132;
  if (counts[dev] == 0) {
    int v = 0;
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    counts[dev] = v > 0 ? v : 1;
  }
  return counts[dev];
}

struct TileShape {
  int bm, bn;
};

// The largest tile that still gives every SM a block; never more rows than M needs.
template <typename T>
TileShape pick_tile(int m, int n, int splits, ConvTile forced) {
  if constexpr (!std::is_same_v<T, float>) {
    return {64, 64};
  } else {
    switch (forced) {
      case ConvTile::T64x64: return {64, 64};
      case ConvTile::T64x128: return {64, 128};
      case ConvTile::T128x128: return {128, 128};
      case ConvTile::Auto: break;
    }
    const int64_t wave = sm_count();
    auto blocks = [&](int bm, int bn) {
      return static_cast<int64_t>((m + bm - 1) / bm) * ((n + bn - 1) / bn) * splits;
    };
    if (m > 64 && blocks(128, 128) >= wave) return {128, 128};
    if (blocks(64, 128) >= wave) return {64, 128};
    return {64, 64};
  }
}

template <typename T, class Problem>
void launch_implicit_gemm(const Problem& pb, int splits, ConvTile forced) {
  const TileShape t = pick_tile<T>(pb.m, pb.n, splits, forced);
  const dim3 grid(blocks_for(pb.n, t.bn), blocks_for(pb.m, t.bm), static_cast<unsigned>(splits));
  KILN_CHECK(grid.y <= 65535 && grid.z <= 65535, "conv2d (CUDA): a GEMM of ", pb.m, " rows and ",
             splits, " splits exceeds the grid limits");
  const LaunchConfig cfg{grid, dim3(kGemmThreads), 0, current_stream()};
  if constexpr (std::is_same_v<T, float>) {
    if (t.bm == 128) return launch(conv_implicit_gemm_kernel<float, 128, 128, Problem>, cfg, pb);
    if (t.bn == 128) return launch(conv_implicit_gemm_kernel<float, 64, 128, Problem>, cfg, pb);
  }
  launch(conv_implicit_gemm_kernel<T, 64, 64, Problem>, cfg, pb);
}

// The problem in NCHW or channels-last order (g.x_nhwc: y_nhwc is the same for these kernels),
// filled by `fill` and launched.
template <typename T, template <typename, bool> class Problem, class Fill>
void launch_problem(bool nhwc, int splits, ConvTile forced, Fill fill) {
  if (nhwc) {
    Problem<T, true> pb;
    fill(pb);
    launch_implicit_gemm<T>(pb, splits, forced);
  } else {
    Problem<T, false> pb;
    fill(pb);
    launch_implicit_gemm<T>(pb, splits, forced);
  }
}

// One thread per element for `total` elements, grid-stride beyond 65535 blocks.
LaunchConfig elementwise_config(int64_t total) {
  return grid_stride_config_1d(total, kDirectThreads, 65535u, current_stream());
}

// Backward-weight's split-K factor: enough splits that ~512 blocks of 64x64 run, but no split
// shorter than 512 terms of the sum (then the extra partials cost more than they gain). A
// function of the shape only, so the summation order is the same on every GPU.
int auto_weight_splits(const ConvDims& d) {
  constexpr int64_t kTargetBlocks = 512, kMinSplitLength = 512;
  const int64_t tiles = static_cast<int64_t>((d.k + 63) / 64) * ((d.crs + 63) / 64);
  const int64_t length = static_cast<int64_t>(d.n) * d.pq;
  int64_t splits = (kTargetBlocks + tiles - 1) / tiles;
  splits = std::min(splits, length / kMinSplitLength);
  return static_cast<int>(std::clamp<int64_t>(splits, 1, 1024));
}

}  // namespace

// ---- Entry points ----------------------------------------------------------------------------

ConvCudaOptions conv2d_cuda_options() {
  std::lock_guard<std::mutex> lock(g_options_mutex);
  return g_options;
}

void set_conv2d_cuda_options(const ConvCudaOptions& options) {
  KILN_CHECK(options.weight_splits >= 0, "set_conv2d_cuda_options: weight_splits must be >= 0 "
             "(0 = automatic), got ", options.weight_splits);
  std::lock_guard<std::mutex> lock(g_options_mutex);
  g_options = options;
}

const char* conv_kernel_name(ConvKernel kernel) {
  return kernel == ConvKernel::Direct ? "direct" : "implicit-gemm";
}

template <typename T>
void conv2d_forward(Backend, const T* x, const T* w, const T* b, T* y, const ConvGeometry& g) {
  const ConvDims d = conv_dims(g);
  if (d.n == 0) return;
  const ConvCudaOptions opt = conv2d_cuda_options();
  if (opt.kernel == ConvKernel::Direct) {
    const int64_t total = static_cast<int64_t>(d.n) * d.k * d.pq;
    launch(conv2d_forward_direct_kernel<T>, elementwise_config(total), x, w, b, y, d, g.y_nhwc);
    return;
  }
  launch_problem<T, ForwardProblem>(g.x_nhwc, 1, opt.tile, [&](auto& pb) {
    pb.m = d.k, pb.n = d.n * d.pq, pb.kred = d.crs, pb.chunk = d.crs;
    pb.x = x, pb.w = w, pb.b = b, pb.y = y, pb.d = d;
  });
}

template <typename T>
void conv2d_backward_data(Backend, const T* dy, const T* w, T* dx, const ConvGeometry& g) {
  const ConvDims d = conv_dims(g);
  if (d.n == 0) return;
  const ConvCudaOptions opt = conv2d_cuda_options();
  if (opt.kernel == ConvKernel::Direct) {
    const int64_t total = static_cast<int64_t>(d.n) * d.chw;
    launch(conv2d_backward_data_direct_kernel<T>, elementwise_config(total), dy, w, dx, d,
           g.x_nhwc);
    return;
  }
  launch_problem<T, BackwardDataProblem>(g.x_nhwc, 1, opt.tile, [&](auto& pb) {
    pb.m = d.c, pb.n = d.n * d.hw, pb.kred = d.krs, pb.chunk = d.krs;
    pb.dy = dy, pb.w = w, pb.dx = dx, pb.d = d;
  });
}

template <typename T>
void conv2d_backward_weight(Backend, const T* x, const T* dy, T* dw, T* db, const ConvGeometry& g) {
  const ConvDims d = conv_dims(g);
  const ConvCudaOptions opt = conv2d_cuda_options();
  if (dw) {
    if (opt.kernel == ConvKernel::Direct) {
      launch(conv2d_backward_weight_direct_kernel<T>,
             elementwise_config(static_cast<int64_t>(d.k) * d.crs), x, dy, dw, d, g.w_nhwc);
    } else {
      // Split the N*P*Q sum into `splits` ranges of `chunk` terms (a multiple of the slice).
      const int length = d.n * d.pq;
      int splits = opt.weight_splits > 0 ? opt.weight_splits : auto_weight_splits(d);
      int chunk = (length + splits - 1) / std::max(splits, 1);
      chunk = std::max(kBK, (chunk + kBK - 1) / kBK * kBK);
      splits = std::max(1, (length + chunk - 1) / chunk);  // no empty split
      const int count = d.k * d.crs;
      KILN_CHECK(static_cast<int64_t>(splits) * count < INT_MAX,
                 "conv2d (CUDA): backward-weight partials exceed 2^31 elements");
      Tensor partial;  // the splits' results; freed on return, after the queued kernels (the
                       // caching allocator reuses a block only in this stream's order)
      T* out = dw;
      if (splits > 1) {
        partial = Tensor::empty({static_cast<int64_t>(splits) * count}, dtype_of<T>::value,
                                Device(DeviceType::CUDA, current_device()));
        out = partial.data<T>();
      }
      launch_problem<T, BackwardWeightProblem>(g.x_nhwc, splits, opt.tile, [&](auto& pb) {
        pb.m = d.k, pb.n = d.crs, pb.kred = length, pb.chunk = chunk;
        pb.x = x, pb.dy = dy, pb.out = out, pb.d = d;
      });
      if (splits > 1)
        launch(conv2d_sum_splits_kernel<T>, elementwise_config(count), partial.data<T>(), dw,
               count, splits);
    }
  }
  if (db) {
    if (d.n == 0) {
      KILN_CUDA_CHECK(cudaMemsetAsync(db, 0, sizeof(T) * static_cast<size_t>(d.k),
                                      current_stream()));
    } else if (g.y_nhwc) {
      const LaunchConfig cfg{dim3(static_cast<unsigned>(blocks_for(d.k, kBiasCols))),
                             dim3(kBiasCols, kBiasRows), 0, current_stream()};
      launch(conv2d_bias_grad_nhwc_kernel<T>, cfg, dy, db, d);
    } else {
      const LaunchConfig cfg{dim3(static_cast<unsigned>(d.k)), dim3(kBiasThreads), 0,
                             current_stream()};
      launch(conv2d_bias_grad_kernel<T>, cfg, dy, db, d);
    }
  }
}

#define KILN_INSTANTIATE_CONV(T)                                                             \
  template void conv2d_forward<T>(Backend, const T*, const T*, const T*, T*,                 \
                                  const ConvGeometry&);                                      \
  template void conv2d_backward_data<T>(Backend, const T*, const T*, T*, const ConvGeometry&); \
  template void conv2d_backward_weight<T>(Backend, const T*, const T*, T*, T*,               \
                                          const ConvGeometry&);
KILN_INSTANTIATE_CONV(float)
KILN_INSTANTIATE_CONV(double)
#undef KILN_INSTANTIATE_CONV

}  // namespace kiln::cuda
