// conv2d_cuda.cu: the hand CUDA kernels of Conv2d, in two steps (conv2d_cpu.cpp is the
// specification; the notation is the one of conv2d_kernels.h).
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
//     one launch covers everything, and the output lands directly in NCHW order (an explicit
//     (K, N*P*Q) GEMM result would need a transposing copy into (N, K, P, Q));
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
// One kernel template runs all three (conv_implicit_gemm_kernel); a "problem" struct per GEMM
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
#include <cstdint>
#include <mutex>
#include <type_traits>

#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/launch.h"
#include "engine/error.h"
#include "engine/tensor.h"
#include "layers/conv2d_kernels.h"

namespace kiln::cuda {

namespace {

// The geometry in 32-bit integers (the host checked every tensor has < 2^31 elements), with
// the products the kernels use over and over.
struct ConvDims {
  int n, c, h, w;  // input (N, C, H, W)
  int k, r, s;     // weights (K, C, R, S)
  int stride, pad;
  int p, q;        // output (P, Q)
  int rs, hw, pq, chw, crs, krs;
};

ConvDims conv_dims(const ConvGeometry& g) {
  const int64_t x_numel = g.n * g.c * g.h * g.w, y_numel = g.n * g.k * g.p * g.q;
  const int64_t w_numel = g.k * g.c * g.r * g.s;
  KILN_CHECK(x_numel < INT_MAX && y_numel < INT_MAX && w_numel < INT_MAX,
             "conv2d (CUDA): input [", g.n, ", ", g.c, ", ", g.h, ", ", g.w, "], weight [", g.k,
             ", ", g.c, ", ", g.r, ", ", g.s, "] or output [", g.n, ", ", g.k, ", ", g.p, ", ", g.q,
             "] has 2^31 elements or more, beyond the kernels' 32-bit indexing: split the batch");
  ConvDims d;
  d.n = static_cast<int>(g.n), d.c = static_cast<int>(g.c), d.h = static_cast<int>(g.h);
  d.w = static_cast<int>(g.w), d.k = static_cast<int>(g.k), d.r = static_cast<int>(g.r);
  d.s = static_cast<int>(g.s), d.stride = static_cast<int>(g.stride);
  d.pad = static_cast<int>(g.pad), d.p = static_cast<int>(g.p), d.q = static_cast<int>(g.q);
  d.rs = d.r * d.s, d.hw = d.h * d.w, d.pq = d.p * d.q, d.chw = d.c * d.hw;
  d.crs = d.c * d.rs, d.krs = d.k * d.rs;
  return d;
}

// ---- Options (tests and benchmarks) ----------------------------------------------------------

std::mutex g_options_mutex;
ConvCudaOptions g_options;

// ---- Step 1: direct kernels ------------------------------------------------------------------

constexpr int kDirectThreads = 256;

// One thread per y[n][k][p][q] (grid-stride): y = b[k] + sum over (c, r, s).
template <typename T>
__global__ void conv2d_forward_direct_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                             const T* __restrict__ b, T* __restrict__ y,
                                             ConvDims d) {
  const int64_t total = static_cast<int64_t>(d.n) * d.k * d.pq;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int q = static_cast<int>(i % d.q), p = static_cast<int>(i / d.q % d.p);
    const int k = static_cast<int>(i / d.pq % d.k), n = static_cast<int>(i / (int64_t(d.pq) * d.k));
    T acc = 0;
    for (int c = 0; c < d.c; ++c)
      for (int r = 0; r < d.r; ++r) {
        const int ih = p * d.stride - d.pad + r;
        if (ih < 0 || ih >= d.h) continue;  // zero padding
        for (int s = 0; s < d.s; ++s) {
          const int iw = q * d.stride - d.pad + s;
          if (iw < 0 || iw >= d.w) continue;
          acc += w[((k * d.c + c) * d.r + r) * d.s + s] * x[(n * d.c + c) * d.hw + ih * d.w + iw];
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
                                                   ConvDims d) {
  const int64_t total = static_cast<int64_t>(d.n) * d.chw;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int iw = static_cast<int>(i % d.w), ih = static_cast<int>(i / d.w % d.h);
    const int c = static_cast<int>(i / d.hw % d.c), n = static_cast<int>(i / d.chw);
    T acc = 0;
    for (int k = 0; k < d.k; ++k)
      for (int r = 0; r < d.r; ++r) {
        const int pn = ih + d.pad - r;  // p * stride
        if (pn < 0 || pn % d.stride != 0 || pn / d.stride >= d.p) continue;
        const int p = pn / d.stride;
        for (int s = 0; s < d.s; ++s) {
          const int qn = iw + d.pad - s;
          if (qn < 0 || qn % d.stride != 0 || qn / d.stride >= d.q) continue;
          acc += w[((k * d.c + c) * d.r + r) * d.s + s] *
                 dy[(n * d.k + k) * d.pq + p * d.q + qn / d.stride];
        }
      }
    dx[i] = acc;
  }
}

// One thread per dw[k][c][r][s] (grid-stride): the sum over images and output pixels.
template <typename T>
__global__ void conv2d_backward_weight_direct_kernel(const T* __restrict__ x,
                                                     const T* __restrict__ dy,
                                                     T* __restrict__ dw, ConvDims d) {
  const int total = d.k * d.crs;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int s = i % d.s, r = i / d.s % d.r, c = i / d.rs % d.c, k = i / d.crs;
    T acc = 0;
    for (int n = 0; n < d.n; ++n)
      for (int p = 0; p < d.p; ++p) {
        const int ih = p * d.stride - d.pad + r;
        if (ih < 0 || ih >= d.h) continue;
        for (int q = 0; q < d.q; ++q) {
          const int iw = q * d.stride - d.pad + s;
          if (iw < 0 || iw >= d.w) continue;
          acc += dy[(n * d.k + k) * d.pq + p * d.q + q] * x[(n * d.c + c) * d.hw + ih * d.w + iw];
        }
      }
    dw[i] = acc;
  }
}

// ---- Bias gradient (both steps) --------------------------------------------------------------

constexpr int kBiasThreads = 256;

// grid = K blocks: db[k] = sum of dy[n][k][p][q] over (n, p, q). The block's threads walk the
// N*P*Q values as one flat range (consecutive threads, consecutive pixels), then block_sum
// combines their partial sums in a fixed tree (warp shuffles, then one value per warp).
template <typename T>
__global__ void __launch_bounds__(kBiasThreads)
    conv2d_bias_grad_kernel(const T* __restrict__ dy, T* __restrict__ db, ConvDims d) {
  __shared__ T scratch[kWarpSize];
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

// ---- Step 2: implicit GEMM -------------------------------------------------------------------

constexpr int kGemmThreads = 256;  // 16 x 16
constexpr int kBK = 8;             // reduction slice per shared-memory tile
constexpr int kApad = 4;           // A tile row padding: conflict-free stores, 16-byte rows
constexpr int kOutside = -(1 << 29);  // a coordinate that fails every bounds check

// The problems. Each gives the kernel the GEMM sizes (m, n, kred) and the range of the
// reduction a split covers (chunk), plus four accessors:
//   column(j)            what a thread precomputes for B's column j (kOutside when j >= n)
//   b_step(kk, valid)    what it decodes once per slice for B's row kk
//   load_b(col, step)    B(kk, j), 0 outside the image
//   a_step(kk), load_a(i, step)   the same for A(i, kk) (the kernel checks i and kk)
//   store(i, j, v)       where result element (i, j) goes
struct GemmSizes {
  int m, n, kred, chunk;
};

// forward: A = w (K, CRS), B = col (CRS, N*PQ), C -> y (N, K, PQ) + bias.
template <typename T>
struct ForwardProblem : GemmSizes {
  const T* x;
  const T* w;
  const T* b;
  T* y;
  ConvDims d;

  struct Column {  // output pixel j = (n, p, q): its window's corner in the input
    int base, ih0, iw0;
  };
  struct Step {  // reduction index kk = (c, r, s): the tap
    int off, r, s;
  };
  __device__ Column column(int j) const {
    if (j >= n) return {0, kOutside, kOutside};
    const int img = j / d.pq, pq = j - img * d.pq, p = pq / d.q, q = pq - p * d.q;
    const int ih0 = p * d.stride - d.pad, iw0 = q * d.stride - d.pad;
    return {img * d.chw + ih0 * d.w + iw0, ih0, iw0};
  }
  __device__ Step b_step(int kk, bool valid) const {
    if (!valid) return {0, kOutside, kOutside};
    const int c = kk / d.rs, rs = kk - c * d.rs, r = rs / d.s, s = rs - r * d.s;
    return {c * d.hw + r * d.w + s, r, s};
  }
  __device__ T load_b(const Column& col, const Step& st) const {
    const int ih = col.ih0 + st.r, iw = col.iw0 + st.s;
    return static_cast<unsigned>(ih) < static_cast<unsigned>(d.h) &&
                   static_cast<unsigned>(iw) < static_cast<unsigned>(d.w)
               ? x[col.base + st.off]
               : T(0);
  }
  __device__ int a_step(int kk) const { return kk; }
  __device__ T load_a(int i, int kk) const { return w[i * d.crs + kk]; }
  __device__ void store(int i, int j, T v) const {
    const int img = j / d.pq;
    y[(img * d.k + i) * d.pq + (j - img * d.pq)] = v + (b ? b[i] : T(0));
  }
};

// backward-data: A(c, krs) = w[k][c][r][s], B(krs, nhw) = dy gathered, C -> dx (N, C, HW).
template <typename T>
struct BackwardDataProblem : GemmSizes {
  const T* dy;
  const T* w;
  T* dx;
  ConvDims d;

  struct Column {  // input pixel j = (n, h, w), shifted by the padding
    int base, hp, wp;
  };
  struct Step {  // reduction index kk = (k, r, s)
    int off, r, s;
  };
  struct AStep {
    int k, rs;
  };
  __device__ Column column(int j) const {
    if (j >= n) return {0, kOutside, kOutside};
    const int img = j / d.hw, hw = j - img * d.hw, h = hw / d.w, wi = hw - h * d.w;
    return {img * d.k * d.pq, h + d.pad, wi + d.pad};
  }
  __device__ Step b_step(int kk, bool valid) const {
    if (!valid) return {0, -kOutside, -kOutside};  // makes p, q negative below
    const int k = kk / d.rs, rs = kk - k * d.rs, r = rs / d.s, s = rs - r * d.s;
    return {k * d.pq, r, s};
  }
  __device__ T load_b(const Column& col, const Step& st) const {
    int p = col.hp - st.r, q = col.wp - st.s;  // p*stride, q*stride if the tap hits the pixel
    if (d.stride != 1) {
      if (p < 0 || q < 0 || p % d.stride != 0 || q % d.stride != 0) return T(0);
      p /= d.stride;
      q /= d.stride;
    }
    return static_cast<unsigned>(p) < static_cast<unsigned>(d.p) &&
                   static_cast<unsigned>(q) < static_cast<unsigned>(d.q)
               ? dy[col.base + st.off + p * d.q + q]
               : T(0);
  }
  __device__ AStep a_step(int kk) const {
    const int k = kk / d.rs;
    return {k, kk - k * d.rs};
  }
  __device__ T load_a(int i, const AStep& st) const {
    return w[(st.k * d.c + i) * d.rs + st.rs];
  }
  __device__ void store(int i, int j, T v) const {
    const int img = j / d.hw;
    dx[(img * d.c + i) * d.hw + (j - img * d.hw)] = v;
  }
};

// backward-weight: A(k, npq) = dy[n][k][pq], B(npq, crs) = col, C -> out + split * K*CRS
// (dw itself when there is one split, else that split's partial).
template <typename T>
struct BackwardWeightProblem : GemmSizes {
  const T* x;
  const T* dy;
  T* out;
  ConvDims d;

  struct Column {  // tap j = (c, r, s)
    int off, r, s;
  };
  struct Step {  // reduction index kk = (n, p, q): the window's corner
    int base, ih0, iw0;
  };
  struct AStep {
    int img, pq;
  };
  __device__ Column column(int j) const {
    if (j >= n) return {0, kOutside, kOutside};
    const int c = j / d.rs, rs = j - c * d.rs, r = rs / d.s, s = rs - r * d.s;
    return {c * d.hw + r * d.w + s, r, s};
  }
  __device__ Step b_step(int kk, bool valid) const {
    if (!valid) return {0, kOutside, kOutside};
    const int img = kk / d.pq, pq = kk - img * d.pq, p = pq / d.q, q = pq - p * d.q;
    const int ih0 = p * d.stride - d.pad, iw0 = q * d.stride - d.pad;
    return {img * d.chw + ih0 * d.w + iw0, ih0, iw0};
  }
  __device__ T load_b(const Column& col, const Step& st) const {
    const int ih = st.ih0 + col.r, iw = st.iw0 + col.s;
    return static_cast<unsigned>(ih) < static_cast<unsigned>(d.h) &&
                   static_cast<unsigned>(iw) < static_cast<unsigned>(d.w)
               ? x[st.base + col.off]
               : T(0);
  }
  __device__ AStep a_step(int kk) const {
    const int img = kk / d.pq;
    return {img, kk - img * d.pq};
  }
  __device__ T load_a(int i, const AStep& st) const {
    return dy[(st.img * d.k + i) * d.pq + st.pq];
  }
  __device__ void store(int i, int j, T v) const {
    out[static_cast<int64_t>(blockIdx.z) * d.k * d.crs + i * d.crs + j] = v;
  }
};

// The shared-memory slices, double-buffered. A is stored k-major (a[kk][i]) like B, so a
// thread's rows are contiguous; its rows are padded by kApad: the loaders store a column of A
// at a time, and the padding spreads those stores over the banks (rows stay 16-byte aligned).
template <typename T, int BM, int BN>
struct alignas(16) GemmTiles {
  T a[2][kBK][BM + kApad];
  T b[2][kBK][BN];
};

// Four consecutive values from shared memory; one 16-byte load on the GPU (p is 16-byte aligned).
template <typename T>
__device__ __forceinline__ void load4(const T* p, T* out) {
#if KILN_CUDA_SIM
  for (int i = 0; i < 4; ++i) out[i] = p[i];
#else
  if constexpr (std::is_same_v<T, float>) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  } else {
    const double2 v0 = reinterpret_cast<const double2*>(p)[0];
    const double2 v1 = reinterpret_cast<const double2*>(p)[1];
    out[0] = v0.x, out[1] = v0.y, out[2] = v1.x, out[3] = v1.y;
  }
#endif
}

// grid = (ceil(N / BN), ceil(M / BM), splits), block = 256. Block (x, y, z) computes the
// result tile at rows y*BM, columns x*BN, over the reduction range [z*chunk, (z+1)*chunk).
template <typename T, int BM, int BN, class Problem>
__global__ void __launch_bounds__(kGemmThreads) conv_implicit_gemm_kernel(Problem pb) {
  constexpr int TM = BM / 16, TN = BN / 16;   // the thread's micro-tile
  constexpr int kALoads = BM * kBK / kGemmThreads;  // A elements a thread loads per slice
  constexpr int kBLoads = BN * kBK / kGemmThreads;
  __shared__ GemmTiles<T, BM, BN> tiles;

  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int k_begin = blockIdx.z * pb.chunk;
  const int k_end = min(pb.kred, k_begin + pb.chunk);

  // Loader roles. A: column a_k of the slice, rows a_m + 32i (8 threads read 8 consecutive
  // reduction indices of a row). B: row b_k of the slice, columns b_n + 32j (a warp reads 32
  // consecutive columns). The columns never change, so their decoding happens once, here.
  const int a_k = tid % kBK, a_m = tid / kBK;
  const int b_k = tid / 32, b_n = tid % 32;
  typename Problem::Column cols[kBLoads];
  KILN_UNROLL
  for (int j = 0; j < kBLoads; ++j) cols[j] = pb.column(n0 + b_n + 32 * j);

  T a_reg[kALoads], b_reg[kBLoads];  // the next slice, in flight from global memory
  auto fetch = [&](int k0) {
    const int ka = k0 + a_k;
    const auto as = pb.a_step(ka);
    KILN_UNROLL
    for (int i = 0; i < kALoads; ++i) {
      const int row = m0 + a_m + 32 * i;
      a_reg[i] = ka < k_end && row < pb.m ? pb.load_a(row, as) : T(0);
    }
    const int kb = k0 + b_k;
    const auto bs = pb.b_step(kb, kb < k_end);
    KILN_UNROLL
    for (int j = 0; j < kBLoads; ++j) b_reg[j] = pb.load_b(cols[j], bs);
  };
  auto stash = [&](int buf) {
    KILN_UNROLL
    for (int i = 0; i < kALoads; ++i) tiles.a[buf][a_k][a_m + 32 * i] = a_reg[i];
    KILN_UNROLL
    for (int j = 0; j < kBLoads; ++j) tiles.b[buf][b_k][b_n + 32 * j] = b_reg[j];
  };

  // The thread's rows are ty*4 + {0..3} (+ 64 for the second group when TM = 8): element
  // i of the micro-tile is row (i / 4) * 64 + ty * 4 + i % 4. Columns likewise with tx.
  T acc[TM][TN];
  KILN_UNROLL
  for (int i = 0; i < TM; ++i)
    KILN_UNROLL
    for (int j = 0; j < TN; ++j) acc[i][j] = T(0);

  if (k_begin < k_end) {
    fetch(k_begin);
    stash(0);
  }
  __syncthreads();
  int buf = 0;
  for (int k0 = k_begin; k0 < k_end; k0 += kBK) {
    const bool more = k0 + kBK < k_end;
    if (more) fetch(k0 + kBK);  // global loads overlap the arithmetic below
    KILN_UNROLL
    for (int kk = 0; kk < kBK; ++kk) {
      T a[TM], b[TN];
      KILN_UNROLL
      for (int g = 0; g < TM / 4; ++g) load4(&tiles.a[buf][kk][g * 64 + ty * 4], a + 4 * g);
      KILN_UNROLL
      for (int g = 0; g < TN / 4; ++g) load4(&tiles.b[buf][kk][g * 64 + tx * 4], b + 4 * g);
      KILN_UNROLL
      for (int i = 0; i < TM; ++i)
        KILN_UNROLL
        for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
    }
    // The other buffer was last read in the previous slice, before the barrier that ended it.
    if (more) stash(buf ^ 1);
    __syncthreads();
    buf ^= 1;
  }

  KILN_UNROLL
  for (int i = 0; i < TM; ++i) {
    const int row = m0 + (i / 4) * 64 + ty * 4 + i % 4;
    if (row >= pb.m) continue;
    KILN_UNROLL
    for (int j = 0; j < TN; ++j) {
      const int col = n0 + (j / 4) * 64 + tx * 4 + j % 4;
      if (col < pb.n) pb.store(row, col, acc[i][j]);
    }
  }
}

// out[i] = sum of the splits' partials[z][i], z = 0, 1, ... in order (grid-stride).
template <typename T>
__global__ void conv2d_sum_splits_kernel(const T* __restrict__ partial, T* __restrict__ out,
                                         int count, int splits) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    T sum = partial[i];
    for (int z = 1; z < splits; ++z) sum += partial[static_cast<int64_t>(z) * count + i];
    out[i] = sum;
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

// One thread per element for `total` elements, grid-stride beyond 65535 blocks.
LaunchConfig elementwise_config(int64_t total) {
  const unsigned blocks = std::min(blocks_for(total, kDirectThreads), 65535u);
  return LaunchConfig{dim3(blocks), dim3(kDirectThreads), 0, current_stream()};
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
void conv2d_forward_cuda(const T* x, const T* w, const T* b, T* y, const ConvGeometry& g) {
  const ConvDims d = conv_dims(g);
  if (d.n == 0) return;
  const ConvCudaOptions opt = conv2d_cuda_options();
  if (opt.kernel == ConvKernel::Direct) {
    const int64_t total = static_cast<int64_t>(d.n) * d.k * d.pq;
    launch(conv2d_forward_direct_kernel<T>, elementwise_config(total), x, w, b, y, d);
    return;
  }
  ForwardProblem<T> pb;
  pb.m = d.k, pb.n = d.n * d.pq, pb.kred = d.crs, pb.chunk = d.crs;
  pb.x = x, pb.w = w, pb.b = b, pb.y = y, pb.d = d;
  launch_implicit_gemm<T>(pb, 1, opt.tile);
}

template <typename T>
void conv2d_backward_data_cuda(const T* dy, const T* w, T* dx, const ConvGeometry& g) {
  const ConvDims d = conv_dims(g);
  if (d.n == 0) return;
  const ConvCudaOptions opt = conv2d_cuda_options();
  if (opt.kernel == ConvKernel::Direct) {
    const int64_t total = static_cast<int64_t>(d.n) * d.chw;
    launch(conv2d_backward_data_direct_kernel<T>, elementwise_config(total), dy, w, dx, d);
    return;
  }
  BackwardDataProblem<T> pb;
  pb.m = d.c, pb.n = d.n * d.hw, pb.kred = d.krs, pb.chunk = d.krs;
  pb.dy = dy, pb.w = w, pb.dx = dx, pb.d = d;
  launch_implicit_gemm<T>(pb, 1, opt.tile);
}

template <typename T>
void conv2d_backward_weight_cuda(const T* x, const T* dy, T* dw, T* db, const ConvGeometry& g) {
  const ConvDims d = conv_dims(g);
  const ConvCudaOptions opt = conv2d_cuda_options();
  if (dw) {
    if (opt.kernel == ConvKernel::Direct) {
      launch(conv2d_backward_weight_direct_kernel<T>,
             elementwise_config(static_cast<int64_t>(d.k) * d.crs), x, dy, dw, d);
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
      BackwardWeightProblem<T> pb;
      pb.m = d.k, pb.n = d.crs, pb.kred = length, pb.chunk = chunk;
      pb.x = x, pb.dy = dy, pb.out = out, pb.d = d;
      launch_implicit_gemm<T>(pb, splits, opt.tile);
      if (splits > 1)
        launch(conv2d_sum_splits_kernel<T>, elementwise_config(count), partial.data<T>(), dw,
               count, splits);
    }
  }
  if (db) {
    if (d.n == 0) {
      KILN_CUDA_CHECK(cudaMemsetAsync(db, 0, sizeof(T) * static_cast<size_t>(d.k),
                                      current_stream()));
    } else {
      const LaunchConfig cfg{dim3(static_cast<unsigned>(d.k)), dim3(kBiasThreads), 0,
                             current_stream()};
      launch(conv2d_bias_grad_kernel<T>, cfg, dy, db, d);
    }
  }
}

#define KILN_INSTANTIATE_CONV(T)                                                               \
  template void conv2d_forward_cuda<T>(const T*, const T*, const T*, T*, const ConvGeometry&); \
  template void conv2d_backward_data_cuda<T>(const T*, const T*, T*, const ConvGeometry&);     \
  template void conv2d_backward_weight_cuda<T>(const T*, const T*, T*, T*, const ConvGeometry&);
KILN_INSTANTIATE_CONV(float)
KILN_INSTANTIATE_CONV(double)
#undef KILN_INSTANTIATE_CONV

}  // namespace kiln::cuda
