// gemm_tensor_core.cu: step 4 of the GPU GEMM (steps 1 to 3 and the cuBLAS path are in
// gemm.cu, whose conventions it shares: row-major, op(A) (M,K), op(B) (K,N), C (M,N)). Tested
// against a double-precision product (tests/cuda/gemm_tensor_core_test.cpp), timed by
// apps/gemm_bench, explained in docs/cuda.md.
//
// Step 4, gemm_tensor_core_kernel (bf16 or f16 in, f32 out): tensor cores.
//   A tensor core is a matrix unit next to the FMA units of each SM quarter: one instruction of
//   a warp multiplies two small 16-bit matrices and adds the product to an f32 one. A 16x16x16
//   product is 4096 multiply-adds; the FMA units would need 128 instructions per lane for it.
//   On an H100 SXM that is 989 dense bf16 TFLOP/s against 67 f32 (NVIDIA H100 Tensor Core GPU
//   datasheet, https://www.nvidia.com/en-us/data-center/h100/): 15 times step 3's ceiling.
//   - Fragments. CUDA's C++ face of the tensor cores is WMMA (nvcuda::wmma in <mma.h>; CUDA C++
//     Programming Guide, "Warp Matrix Functions"): a fragment is a 16x16 tile spread over the
//     registers of the warp's 32 lanes in an unspecified way. load_matrix_sync reads a tile of
//     A or B from memory (row- or column-major, any leading dimension that is a multiple of 8
//     elements, a 32-byte aligned start), mma_sync computes D = A B + C on fragments, and
//     store_matrix_sync writes an accumulator back. All 32 lanes call each one together.
//   - Why f32 accumulation. bf16 keeps 8 significant bits, f16 11: a sum kept in bf16 stops
//     growing once its addends fall below half an ulp (after a few hundred terms of similar
//     size). The product of two 16-bit values is exact in f32 (at most 22 significant bits),
//     and the sum is kept in f32, so the result is an f32 GEMM of the rounded inputs: the only
//     precision lost is the inputs' own rounding (tests/cuda/gemm_tensor_core_test.cpp checks
//     against a double-precision product of the same rounded inputs).
//   - The kernel. A block of 8 warps computes a 128x128 tile of C; each warp owns a 64x32 part
//     of it as 4x2 accumulator fragments (64 f32 registers per lane). K is walked in slices of
//     32, staged through shared memory and double-buffered as in step 3 (the next slice travels
//     into registers while the tensor cores work; one __syncthreads per slice). Per 16 of k a
//     warp loads 4 A and 2 B fragments and issues 8 mma_sync: each A fragment serves 2
//     products, each B fragment 4.
//   - Transposes cost nothing: a slice is copied as it lies in memory (16-byte vectors of 8
//     elements, contiguous in every case), and the fragment's layout says how to read it: the
//     slice of a transposed A is (k, m) in shared memory and is loaded as a col_major matrix_a.
//     Rows are padded by 8 elements (16 bytes): ldm stays a multiple of 8, the vectors stay
//     aligned, and consecutive rows start 4 banks apart.
//   - Edges: elements outside A or B load as 0 (the bits of +0.0 in both formats), so the
//     padded products add nothing. Every accumulator goes out through a 16x16 f32 staging tile
//     of its warp in shared memory (store_matrix_sync, __syncwarp, then each lane copies half a
//     row to C, bounds-checked, as two float4 where C allows): the fragment's own layout is
//     unknown, the staging tile's is not.
//   What limits the speed: feeding the tensor cores. Each mma_sync needs its fragments from
//   shared memory, so shared-memory bandwidth and the latency of global loads decide; bigger
//   warp tiles reuse fragments more but need more registers. The tools that go further are the
//   ones cuBLAS uses: cp.async (Ampere; global to shared without registers, several stages in
//   flight), ldmatrix, and on Hopper TMA copies and wgmma (four warps issue one larger product
//   that reads its operands from shared memory directly). WMMA compiles to the older mma.sync,
//   which Hopper runs at a fraction of wgmma's rate. apps/gemm_bench measures the gap on a GPU.
//   bf16 fragments need sm_80 or newer: the body is compiled for those architectures only, and
//   the host refuses older devices with an error.
#include "engine/cuda/runtime.h"

#include <cstdint>
#include <string>
#include <type_traits>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/kernels/gemm_shape.h"
#include "engine/cuda/launch.h"
#include "engine/cuda/mma.h"
#include "engine/error.h"
#include "engine/ops_cuda.h"

namespace kiln::cuda {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTcBM = 128;  // block tile: rows of C
constexpr int kTcBN = 128;  // block tile: columns of C
constexpr int kTcBK = 32;   // K-slice per step (two 16-deep mma steps)
constexpr int kTcWarpsM = 2, kTcWarpsN = 4;  // 8 warps, each a 64x32 part of the block tile
constexpr int kTcWarps = kTcWarpsM * kTcWarpsN;
constexpr int kTcThreads = 32 * kTcWarps;
constexpr int kTcF = 16;                          // the fragment: 16x16x16
constexpr int kTcFragsM = kTcBM / kTcWarpsM / kTcF;  // 4 accumulators down a warp's part
constexpr int kTcFragsN = kTcBN / kTcWarpsN / kTcF;  // 2 across
constexpr int kTcPad = 8;  // shared row padding, in 16-bit elements (16 bytes)
// A slice of one operand is kTcBM x kTcBK = 4096 elements: 512 vectors of 8, 2 per thread.
constexpr int kTcVecs = kTcBM * kTcBK / 8 / kTcThreads;
static_assert(kTcBM == kTcBN, "the slice loader serves A and B with one count of vectors");
static_assert(kTcBM * kTcBK == 8 * kTcVecs * kTcThreads, "whole vectors per thread");

// The block's shared memory, one struct so it is 32-byte aligned as load_matrix_sync requires.
// Each operand's slice is stored as it lies in memory: A as (m, k) rows, A^T as (k, m); B as
// (k, n), B^T as (n, k). Two buffers of each (double buffering), and each warp's output tile.
template <bool TA, bool TB>
struct alignas(32) TensorCoreTiles {
  static constexpr int kARows = TA ? kTcBK : kTcBM, kACols = TA ? kTcBM : kTcBK;
  static constexpr int kBRows = TB ? kTcBN : kTcBK, kBCols = TB ? kTcBK : kTcBN;
  static constexpr int kALd = kACols + kTcPad, kBLd = kBCols + kTcPad;
  uint16_t a[2][kARows * kALd];
  uint16_t b[2][kBRows * kBLd];
  float stage[kTcWarps][kTcF * kTcF];
};
static_assert(sizeof(TensorCoreTiles<false, true>) <= 48 * 1024, "static shared memory limit");

// Loads this thread's vectors of a Rows x Cols slice whose top-left element is (row0, col0) of
// a matrix of rows x cols 16-bit elements, leading dimension ld. Outside the matrix: 0 (+0.0).
// `vec`: the matrix is 16-byte aligned with ld a multiple of 8, so whole vectors are legal.
template <int Rows, int Cols>
__device__ __forceinline__ void tc_load_slice(const uint16_t* __restrict__ src, int ld, int row0,
                                              int col0, int rows, int cols, bool vec,
                                              uint4 (&r)[kTcVecs]) {
  static_assert(Rows * Cols == 8 * kTcVecs * kTcThreads, "the slice is 2 vectors per thread");
  KILN_UNROLL
  for (int i = 0; i < kTcVecs; ++i) {
    const int v = threadIdx.x + i * kTcThreads;  // consecutive threads: along a row
    const int row = row0 + v / (Cols / 8), col = col0 + v % (Cols / 8) * 8;
    const uint16_t* p = src + static_cast<int64_t>(row) * ld + col;
    if (vec && row < rows && col + 7 < cols) {
      r[i] = *reinterpret_cast<const uint4*>(p);
    } else {
      uint32_t w[4];
      KILN_UNROLL
      for (int e = 0; e < 8; e += 2) {
        const uint32_t lo = row < rows && col + e < cols ? p[e] : 0u;
        const uint32_t hi = row < rows && col + e + 1 < cols ? p[e + 1] : 0u;
        w[e / 2] = lo | hi << 16;  // little-endian: element e in the low half
      }
      r[i] = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

// Stores the vectors of tc_load_slice into a shared Rows x Cols slice (leading dimension Ld).
template <int Rows, int Cols, int Ld>
__device__ __forceinline__ void tc_store_slice(uint16_t* tile, const uint4 (&r)[kTcVecs]) {
  KILN_UNROLL
  for (int i = 0; i < kTcVecs; ++i) {
    const int v = threadIdx.x + i * kTcThreads;
    *reinterpret_cast<uint4*>(&tile[v / (Cols / 8) * Ld + v % (Cols / 8) * 8]) = r[i];
  }
}

// E: __nv_bfloat16 or __half, the type the tensor cores read the 16-bit bit patterns as.
// a, b, c as in step 1 (a and b hold bit patterns); vec_a / vec_b: 16-byte vectors allowed
// (tc_load_slice); vec_c: C is 16-byte aligned with N a multiple of 4 (float4 stores).
template <typename E, bool TA, bool TB>
__global__ void __launch_bounds__(kTcThreads)
    gemm_tensor_core_kernel(int m, int n, int k, const uint16_t* __restrict__ a, int lda,
                            const uint16_t* __restrict__ b, int ldb, float* __restrict__ c,
                            bool vec_a, bool vec_b, bool vec_c) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  using Tiles = TensorCoreTiles<TA, TB>;
  KILN_SHARED(Tiles, s);
  using LayoutA = std::conditional_t<TA, wmma::col_major, wmma::row_major>;
  using LayoutB = std::conditional_t<TB, wmma::col_major, wmma::row_major>;
  using FragA = wmma::fragment<wmma::matrix_a, kTcF, kTcF, kTcF, E, LayoutA>;
  using FragB = wmma::fragment<wmma::matrix_b, kTcF, kTcF, kTcF, E, LayoutB>;
  using FragC = wmma::fragment<wmma::accumulator, kTcF, kTcF, kTcF, float>;

  const int m0 = blockIdx.y * kTcBM, n0 = blockIdx.x * kTcBN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / kTcWarpsN * (kTcBM / kTcWarpsM);  // the warp's part: rows wm..+63
  const int wn = warp % kTcWarpsN * (kTcBN / kTcWarpsN);  //                   columns wn..+31

  FragC acc[kTcFragsM][kTcFragsN];
  KILN_UNROLL
  for (int i = 0; i < kTcFragsM; ++i) {
    KILN_UNROLL
    for (int j = 0; j < kTcFragsN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  }

  // A's slice: rows m, columns k (or, transposed, rows k, columns m); B's likewise.
  auto load_a = [&](int k0, uint4 (&r)[kTcVecs]) {
    if (TA) tc_load_slice<Tiles::kARows, Tiles::kACols>(a, lda, k0, m0, k, m, vec_a, r);
    else tc_load_slice<Tiles::kARows, Tiles::kACols>(a, lda, m0, k0, m, k, vec_a, r);
  };
  auto load_b = [&](int k0, uint4 (&r)[kTcVecs]) {
    if (TB) tc_load_slice<Tiles::kBRows, Tiles::kBCols>(b, ldb, n0, k0, n, k, vec_b, r);
    else tc_load_slice<Tiles::kBRows, Tiles::kBCols>(b, ldb, k0, n0, k, n, vec_b, r);
  };
  // Where the fragment starting at (i, p) of op(A) / (p, j) of op(B) lies in a shared slice.
  auto a_at = [&](int buf, int i, int p) {
    return reinterpret_cast<const E*>(&s.a[buf][TA ? p * Tiles::kALd + i : i * Tiles::kALd + p]);
  };
  auto b_at = [&](int buf, int p, int j) {
    return reinterpret_cast<const E*>(&s.b[buf][TB ? j * Tiles::kBLd + p : p * Tiles::kBLd + j]);
  };

  // Prologue: the first K-slice into buffer 0.
  uint4 ra[kTcVecs], rb[kTcVecs];
  load_a(0, ra);
  load_b(0, rb);
  tc_store_slice<Tiles::kARows, Tiles::kACols, Tiles::kALd>(s.a[0], ra);
  tc_store_slice<Tiles::kBRows, Tiles::kBCols, Tiles::kBLd>(s.b[0], rb);
  __syncthreads();  // tensor-core prologue: the first slice is in shared memory

  int cur = 0;
  for (int k0 = 0; k0 < k; k0 += kTcBK) {
    const bool has_next = k0 + kTcBK < k;
    if (has_next) {  // the next slice's global loads, in flight during the mma below
      load_a(k0 + kTcBK, ra);
      load_b(k0 + kTcBK, rb);
    }
    KILN_UNROLL
    for (int kk = 0; kk < kTcBK; kk += kTcF) {
      FragA fa[kTcFragsM];
      FragB fb[kTcFragsN];
      KILN_UNROLL
      for (int i = 0; i < kTcFragsM; ++i)
        wmma::load_matrix_sync(fa[i], a_at(cur, wm + i * kTcF, kk), Tiles::kALd);
      KILN_UNROLL
      for (int j = 0; j < kTcFragsN; ++j)
        wmma::load_matrix_sync(fb[j], b_at(cur, kk, wn + j * kTcF), Tiles::kBLd);
      KILN_UNROLL
      for (int i = 0; i < kTcFragsM; ++i) {
        KILN_UNROLL
        for (int j = 0; j < kTcFragsN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
    }
    // The other buffer was last read before the previous __syncthreads: safe to fill.
    if (has_next) {
      tc_store_slice<Tiles::kARows, Tiles::kACols, Tiles::kALd>(s.a[cur ^ 1], ra);
      tc_store_slice<Tiles::kBRows, Tiles::kBCols, Tiles::kBLd>(s.b[cur ^ 1], rb);
    }
    __syncthreads();  // tensor-core slice: the next slice is stored, this one is read
    cur ^= 1;
  }

  // Epilogue: each accumulator through the warp's staging tile; lane l copies row l/2, columns
  // (l%2)*8..+7 of it. The next store_matrix_sync waits for every lane of the warp (it is a
  // collective), so the copies of one tile are done before the next overwrites it.
  float* stage = s.stage[warp];
  const int sr = lane / 2, sc = lane % 2 * 8;
  KILN_UNROLL
  for (int i = 0; i < kTcFragsM; ++i) {
    KILN_UNROLL
    for (int j = 0; j < kTcFragsN; ++j) {
      wmma::store_matrix_sync(stage, acc[i][j], kTcF, wmma::mem_row_major);
      __syncwarp();  // tensor-core staging: every lane's share of the tile is written
      const int row = m0 + wm + i * kTcF + sr, col = n0 + wn + j * kTcF + sc;
      if (row >= m) continue;
      const float* v = stage + sr * kTcF + sc;
      float* out = c + static_cast<int64_t>(row) * n + col;
      if (vec_c && col + 7 < n) {
        reinterpret_cast<Vec4f*>(out)[0] = reinterpret_cast<const Vec4f*>(v)[0];
        reinterpret_cast<Vec4f*>(out)[1] = reinterpret_cast<const Vec4f*>(v)[1];
      } else {
        for (int e = 0; e < 8; ++e)
          if (col + e < n) out[e] = v[e];
      }
    }
  }
#else
  __trap();  // compiled for an architecture without bf16 tensor cores (the host checks first)
#endif
}

// ---- Host side -----------------------------------------------------------------------------

// Tensor cores with bf16 inputs exist from compute capability 8.0 (Ampere) on.
void check_tensor_cores() {
  const int device = current_device();
  int major = 0, minor = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (!tensor_cores_available())
    throw Error(detail::str("gemm_tensor_core: cuda:", device, " has compute capability ", major,
                            ".", minor, "; the kernel needs 8.0 or newer (bf16 tensor cores): "
                            "use the f32 GEMM (gemm_hand) on this device"),
                ErrorKind::Usage);
}

template <typename E>
void launch_tensor_core(bool ta, bool tb, const GemmShape& s, const uint16_t* a,
                        const uint16_t* b, float* c) {
  const dim3 grid(blocks_for(s.n, kTcBN), blocks_for(s.m, kTcBM));
  KILN_CHECK(grid.y <= 65535, "gemm_tensor_core: M = ", s.m, " needs more than 65535 block rows");
  const bool vec_a = aligned16(a) && s.lda % 8 == 0;
  const bool vec_b = aligned16(b) && s.ldb % 8 == 0;
  const bool vec_c = aligned16(c) && s.n % 4 == 0;
  const LaunchConfig cfg{grid, dim3(kTcThreads), 0, current_stream()};
  // As in step 3, the transposes are template arguments (here they pick the fragment layouts).
  auto go = [&](auto kernel) {
    launch(kernel, cfg, s.m, s.n, s.k, a, s.lda, b, s.ldb, c, vec_a, vec_b, vec_c);
  };
  if (!ta && !tb) go(gemm_tensor_core_kernel<E, false, false>);
  else if (!ta && tb) go(gemm_tensor_core_kernel<E, false, true>);
  else if (ta && !tb) go(gemm_tensor_core_kernel<E, true, false>);
  else go(gemm_tensor_core_kernel<E, true, true>);
}

}  // namespace

bool tensor_cores_available() {
  int major = 0;
  KILN_CUDA_CHECK(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, current_device()));
  return major >= 8;
}

void gemm_tensor_core(DType in, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                      const uint16_t* a, const uint16_t* b, float* c) {
  if (in != DType::BF16 && in != DType::F16)
    throw Error(detail::str("gemm_tensor_core: the inputs are ", dtype_name(in),
                            "; the tensor-core GEMM takes bf16 or f16 (convert with Tensor::to)"),
                ErrorKind::Usage);
  const GemmShape s = gemm_shape("gemm_tensor_core", trans_a, trans_b, m, n, k);
  if (s.m == 0 || s.n == 0) return;
  check_tensor_cores();
  if (in == DType::BF16) launch_tensor_core<__nv_bfloat16>(trans_a, trans_b, s, a, b, c);
  else launch_tensor_core<__half>(trans_a, trans_b, s, a, b, c);
}

}  // namespace kiln::cuda
