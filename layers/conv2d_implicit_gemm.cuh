// conv2d_implicit_gemm.cuh: step 2 of the hand CUDA convolution, the implicit-GEMM kernel and
// its three "problems" (forward, backward-data, backward-weight), in kiln::cuda::conv_detail.
// Device code and the geometry it indexes with, included by layers/conv2d_cuda.cu alone, whose
// top comment explains the method; split out to keep each file readable in one sitting.
#pragma once

#include "engine/cuda/runtime.h"

#include <climits>
#include <cstdint>
#include <type_traits>

#include "engine/cuda/kernels/common.h"
#include "engine/error.h"
#include "layers/conv2d_kernels.h"

namespace kiln::cuda::conv_detail {

// Where the element of logical coordinates (a, b, h, w) of a 4-d tensor lives: a*n + b*c +
// h*h + w*w (b is the channel: C of x, K of y, C of w). NCHW: (B*H*W, H*W, W, 1); channels-last
// NHWC: (H*W*B, 1, W*B, B). For the weight (K, C, R, S): KCRS (C*R*S, R*S, S, 1) or KRSC
// (R*S*C, 1, S*C, C). In both orders of an activation a pixel (h, w) is h*H-stride + w*w, and
// h's stride is W times w's: a flat pixel index hw = h*W + w sits at hw*w.
struct Strides {
  int n, c, h, w;
};

inline Strides strides_of(int b, int h, int w, bool channels_last) {
  return channels_last ? Strides{h * w * b, 1, w * b, b} : Strides{b * h * w, h * w, w, 1};
}

// The geometry in 32-bit integers (the host checked every tensor has < 2^31 elements), with
// the products the kernels use over and over, and the strides of x (and dx), y (and dy) and w
// (and dw) in the formats ConvGeometry gives (x_nhwc, y_nhwc, w_nhwc).
struct ConvDims {
  int n, c, h, w;  // input (N, C, H, W)
  int k, r, s;     // weights (K, C, R, S)
  int stride, pad;
  int p, q;        // output (P, Q)
  int rs, hw, pq, chw, crs, krs;
  Strides xs, ys, ws;
};

inline ConvDims conv_dims(const ConvGeometry& g) {
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
  d.xs = strides_of(d.c, d.h, d.w, g.x_nhwc);
  d.ys = strides_of(d.k, d.p, d.q, g.y_nhwc);
  d.ws = strides_of(d.c, d.r, d.s, g.w_nhwc);
  return d;
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
// and kBRowsFast, which of B's two loader roles the kernel takes (see the kernel).
//
// Channels-last (kNhwc: x, dx, y, dy in NHWC). Every address goes through the strides of
// ConvDims, so the same problem reads either format and a KCRS or KRSC weight; what kNhwc
// changes is the ORDER of the filter taps along the reduction (forward, backward-data) or the
// columns (backward-weight), tap_of below: (c, r, s) with s fastest for NCHW, (r, s, c) with c
// fastest for NHWC. In NCHW a channel is a plane, and the neighbours along a row of x are
// neighbouring pixels; in NHWC a pixel's C channels are neighbours in memory. Taking c fastest
// makes consecutive reduction indices consecutive addresses of x (and of dy: (r, s, k) in
// backward-data), so the 8 indices of a slice a warp loads for one pixel are one 32-byte
// sector, and consecutive indices of a KRSC weight are consecutive too. With NCHW's order
// (c, r, s) the same slice would hop C apart in NHWC memory, one sector per element. The order
// of the sum changes with it, so NHWC results differ from NCHW ones in the last bits (forward,
// backward-data); the weight order never changes the order, only the addresses.
struct GemmSizes {
  int m, n, kred, chunk;
};

// A filter tap: channel (c of x, or k of dy in backward-data), row r, column s.
struct Tap {
  int c, r, s;
};

// Tap i of the reduction (or of backward-weight's columns) over `ch` channels of an s-wide,
// rs-tap filter: (c, r, s) with s fastest, or in NHWC (r, s, c) with c fastest.
template <bool kNhwc>
__device__ __forceinline__ Tap tap_of(int i, int ch, int s, int rs) {
  if constexpr (kNhwc) {
    const int pix = i / ch, r = pix / s;
    return {i - pix * ch, r, pix - r * s};
  } else {
    const int c = i / rs, t = i - c * rs, r = t / s;
    return {c, r, t - r * s};
  }
}

// forward: A = w (K, CRS), B = col (CRS, N*PQ), C -> y (N, K, PQ) + bias.
template <typename T, bool kNhwc>
struct ForwardProblem : GemmSizes {
  static constexpr bool kBRowsFast = kNhwc;  // B's rows are x's channels in NHWC
  const T* x;
  const T* w;
  const T* b;
  T* y;
  ConvDims d;

  struct Column {  // output pixel j = (n, p, q): its window's corner in the input
    int base, ih0, iw0;
  };
  struct Step {  // reduction index kk = the tap (c, r, s)
    int off, r, s;
  };
  __device__ Column column(int j) const {
    if (j >= n) return {0, kOutside, kOutside};
    const int img = j / d.pq, pq = j - img * d.pq, p = pq / d.q, q = pq - p * d.q;
    const int ih0 = p * d.stride - d.pad, iw0 = q * d.stride - d.pad;
    return {img * d.xs.n + ih0 * d.xs.h + iw0 * d.xs.w, ih0, iw0};
  }
  __device__ Step b_step(int kk, bool valid) const {
    if (!valid) return {0, kOutside, kOutside};
    const Tap t = tap_of<kNhwc>(kk, d.c, d.s, d.rs);
    return {t.c * d.xs.c + t.r * d.xs.h + t.s * d.xs.w, t.r, t.s};
  }
  __device__ T load_b(const Column& col, const Step& st) const {
    const int ih = col.ih0 + st.r, iw = col.iw0 + st.s;
    return static_cast<unsigned>(ih) < static_cast<unsigned>(d.h) &&
                   static_cast<unsigned>(iw) < static_cast<unsigned>(d.w)
               ? x[col.base + st.off]
               : T(0);
  }
  __device__ int a_step(int kk) const {  // the tap's offset in a filter
    const Tap t = tap_of<kNhwc>(kk, d.c, d.s, d.rs);
    return t.c * d.ws.c + t.r * d.ws.h + t.s * d.ws.w;
  }
  __device__ T load_a(int i, int off) const { return w[i * d.ws.n + off]; }
  __device__ void store(int i, int j, T v) const {
    const int img = j / d.pq;
    y[img * d.ys.n + i * d.ys.c + (j - img * d.pq) * d.ys.w] = v + (b ? b[i] : T(0));
  }
};

// backward-data: A(c, krs) = w[k][c][r][s], B(krs, nhw) = dy gathered, C -> dx (N, C, HW).
template <typename T, bool kNhwc>
struct BackwardDataProblem : GemmSizes {
  static constexpr bool kBRowsFast = kNhwc;  // B's rows are dy's channels in NHWC
  const T* dy;
  const T* w;
  T* dx;
  ConvDims d;

  struct Column {  // input pixel j = (n, h, w), shifted by the padding
    int base, hp, wp;
  };
  struct Step {  // reduction index kk = the tap (k, r, s)
    int off, r, s;
  };
  __device__ Column column(int j) const {
    if (j >= n) return {0, kOutside, kOutside};
    const int img = j / d.hw, hw = j - img * d.hw, h = hw / d.w, wi = hw - h * d.w;
    return {img * d.ys.n, h + d.pad, wi + d.pad};
  }
  __device__ Step b_step(int kk, bool valid) const {
    if (!valid) return {0, -kOutside, -kOutside};  // makes p, q negative below
    const Tap t = tap_of<kNhwc>(kk, d.k, d.s, d.rs);
    return {t.c * d.ys.c, t.r, t.s};
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
               ? dy[col.base + st.off + p * d.ys.h + q * d.ys.w]
               : T(0);
  }
  __device__ int a_step(int kk) const {  // filter k's tap (r, s), channel 0
    const Tap t = tap_of<kNhwc>(kk, d.k, d.s, d.rs);
    return t.c * d.ws.n + t.r * d.ws.h + t.s * d.ws.w;
  }
  __device__ T load_a(int i, int off) const { return w[off + i * d.ws.c]; }
  __device__ void store(int i, int j, T v) const {
    const int img = j / d.hw;
    dx[img * d.xs.n + i * d.xs.c + (j - img * d.hw) * d.xs.w] = v;
  }
};

// backward-weight: A(k, npq) = dy[n][k][pq], B(npq, crs) = col, C -> out + split * K*CRS
// (dw itself when there is one split, else that split's partial, in dw's order).
template <typename T, bool kNhwc>
struct BackwardWeightProblem : GemmSizes {
  // B's columns are taps: in NHWC c is the fastest, so neighbouring columns are neighbouring
  // channels of x and the column-fast role reads them together.
  static constexpr bool kBRowsFast = false;
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
  __device__ Column column(int j) const {
    if (j >= n) return {0, kOutside, kOutside};
    const Tap t = tap_of<kNhwc>(j, d.c, d.s, d.rs);
    return {t.c * d.xs.c + t.r * d.xs.h + t.s * d.xs.w, t.r, t.s};
  }
  __device__ Step b_step(int kk, bool valid) const {
    if (!valid) return {0, kOutside, kOutside};
    const int img = kk / d.pq, pq = kk - img * d.pq, p = pq / d.q, q = pq - p * d.q;
    const int ih0 = p * d.stride - d.pad, iw0 = q * d.stride - d.pad;
    return {img * d.xs.n + ih0 * d.xs.h + iw0 * d.xs.w, ih0, iw0};
  }
  __device__ T load_b(const Column& col, const Step& st) const {
    const int ih = st.ih0 + col.r, iw = st.iw0 + col.s;
    return static_cast<unsigned>(ih) < static_cast<unsigned>(d.h) &&
                   static_cast<unsigned>(iw) < static_cast<unsigned>(d.w)
               ? x[st.base + col.off]
               : T(0);
  }
  __device__ int a_step(int kk) const {  // output pixel kk = (n, pq) of dy, channel 0
    const int img = kk / d.pq;
    return img * d.ys.n + (kk - img * d.pq) * d.ys.w;
  }
  __device__ T load_a(int i, int off) const { return dy[off + i * d.ys.c]; }
  __device__ void store(int i, int j, T v) const {
    const Tap t = tap_of<kNhwc>(j, d.c, d.s, d.rs);
    out[static_cast<int64_t>(blockIdx.z) * d.k * d.crs + i * d.ws.n + t.c * d.ws.c +
        t.r * d.ws.h + t.s * d.ws.w] = v;
  }
};

// The shared-memory slices, double-buffered. A is stored k-major (a[kk][i]) like B, so a
// thread's rows are contiguous; its rows are padded by kApad: the loaders store a column of A
// at a time, and the padding spreads those stores over the banks (rows stay 16-byte aligned).
// B is padded the same way when its loaders store a column at a time (kBRowsFast).
template <typename T, int BM, int BN, bool kBRowsFast>
struct alignas(16) GemmTiles {
  T a[2][kBK][BM + kApad];
  T b[2][kBK][BN + (kBRowsFast ? kApad : 0)];
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
  using Tiles = GemmTiles<T, BM, BN, Problem::kBRowsFast>;
  KILN_SHARED(Tiles, tiles);

  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int k_begin = blockIdx.z * pb.chunk;
  const int k_end = min(pb.kred, k_begin + pb.chunk);

  // Loader roles. A: column a_k of the slice, rows a_m + 32i (8 threads read 8 consecutive
  // reduction indices of a row). B: row b_k of the slice, columns b_n + 32j (a warp reads 32
  // consecutive columns: neighbouring pixels in NCHW), or with kBRowsFast (channels-last) the
  // role of A (a warp reads 8 consecutive reduction indices, neighbouring channels, of each of
  // 4 columns). The columns never change, so their decoding happens once, here.
  const int a_k = tid % kBK, a_m = tid / kBK;
  const int b_k = Problem::kBRowsFast ? tid % kBK : tid / 32;
  const int b_n = Problem::kBRowsFast ? tid / kBK : tid % 32;
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

}  // namespace kiln::cuda::conv_detail
