// gemm.cu: C = op(A) op(B) + beta C on the GPU, row-major like cpu::gemm, in three steps from
// naive to fast (gemm runs the fastest that applies, gemm_hand any), plus the cuBLAS twin
// gemm_vendor (engine/ops_matmul.cpp picks one); the fourth step, on tensor cores (16-bit
// inputs, f32 result), is gemm_tensor_core.cu. The steps are tested against the CPU
// (tests/cuda/gemm_cuda_test.cpp, gemm_tensor_core_test.cpp) and timed by apps/gemm_bench;
// docs/cuda.md explains them (their GPU figures come from tools/gpu_check.sh).
//
// Shapes: op(A) is (M,K), op(B) is (K,N), C is (M,N). A is stored (M,K) row-major, or (K,M)
// when trans_a (then op(A) = A^T is read without copying); the same for B. Leading dimensions
// follow: lda = trans_a ? M : K, ldb = trans_b ? K : N, ldc = N.
//
// Step 1, gemm_naive_kernel: one thread per element of C, looping over K and reading A and B
//   from global memory. Each element of A is read N times and each element of B M times:
//   2MNK loads for 2MNK flops, so the kernel is bound by memory traffic (the caches help,
//   but far from enough). Consecutive threads take consecutive columns, so the B and C
//   accesses of a warp are coalesced.
//
// Step 2, gemm_tiled_kernel: a block of 16x16 threads computes a 16x16 tile of C. It walks K
//   in steps of 16: the block loads a 16x16 tile of op(A) and one of op(B) into shared memory
//   (each thread loads one element of each), synchronises, and every thread does 16
//   multiply-adds from shared memory. Global traffic drops 16-fold. Loads of transposed
//   operands swap the thread mapping so a warp still reads consecutive addresses; the tiles
//   are padded by one column so the swapped stores do not hit the same shared-memory bank.
//   Out-of-range elements load as 0, so edge tiles need no special case in the inner loop.
//   This step is generic in T: it is the GPU path for double.
//
// Step 3, gemm_regblock_kernel (float): shared memory is still ~20x slower than registers,
//   and step 2 does one shared load per multiply-add. Register blocking fixes the ratio:
//   - a block of 256 threads computes a 128x128 tile of C, walking K in steps of 8;
//   - each thread owns an 8x8 micro-tile of C in 64 registers; per k it loads 8 values of
//     op(A) and 8 of op(B) from shared memory and does 8x8 = 64 multiply-adds (an outer
//     product): 16 shared loads per 64 FMAs instead of 2 per 1;
//   - the tiles are stored k-major (As[k][m], Bs[k][n]) so a thread's 8 values are contiguous
//     and come as two 16-byte loads; its micro-tile is split in four 4x4 quarters 64 rows /
//     columns apart, so the 8 threads of a quarter-warp read 8 consecutive float4 (no bank
//     conflicts) and the stores of C are coalesced float4 too;
//   - global loads are float4 when the operand is 16-byte aligned with a leading dimension
//     divisible by 4 (checked on the host), scalar and bounds-checked otherwise and at edges;
//   - double buffering: two shared tiles; while the block computes on one, the next K-slice
//     travels from global memory into registers, and lands in the other tile afterwards. One
//     __syncthreads per K-step, and the load latency hides behind 512 FMAs per thread.
//   The transposes only change how a tile is loaded (which of k or m/n is contiguous in
//   memory); the compute loop never sees them.
//
// The cuBLAS path (gemm_vendor) computes the row-major product with a column-major library
// through the identity C^T = op(B)^T op(A)^T: a row-major (M,N) matrix is a column-major (N,M)
// one, so we ask cuBLAS for the (N,M) product "op(B) op(A)" with the operands swapped.
#include "engine/cuda/runtime.h"

#include <type_traits>
#include <cstdint>
#include <string>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/kernels/gemm_shape.h"
#include "engine/cuda/launch.h"
#include "engine/error.h"
#include "engine/ops_cuda.h"
#include "engine/cuda/blas.h"

namespace kiln::cuda {

namespace {

// ---- Element access shared by steps 1 and 2 ----------------------------------------------------

// op(A)(i, p) with A stored row-major, leading dimension lda.
template <typename T>
__device__ __forceinline__ T op_a(const T* a, bool ta, int64_t lda, int64_t i, int64_t p) {
  return ta ? a[p * lda + i] : a[i * lda + p];
}
// op(B)(p, j).
template <typename T>
__device__ __forceinline__ T op_b(const T* b, bool tb, int64_t ldb, int64_t p, int64_t j) {
  return tb ? b[j * ldb + p] : b[p * ldb + j];
}

// C = acc + beta C, without reading C when beta is 0 (C may be uninitialised then).
template <typename T>
__device__ __forceinline__ void store_c(T* c, T acc, T beta) {
  *c = beta == T(0) ? acc : acc + beta * *c;
}

// ---- Step 1: naive -------------------------------------------------------------------------

constexpr int kNaiveBlock = 16;  // 16x16 threads per block

// a is op(A) (M,K), b is op(B) (K,N), c is (M,N); see the file comment for lda/ldb.
template <typename T>
__global__ void gemm_naive_kernel(bool ta, bool tb, int m, int n, int k, const T* __restrict__ a,
                                  int lda, const T* __restrict__ b, int ldb, T* __restrict__ c,
                                  T beta) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;  // consecutive threads: columns
  const int row = blockIdx.y * blockDim.y + threadIdx.y;
  if (row >= m || col >= n) return;
  T acc = T(0);
  for (int p = 0; p < k; ++p) acc += op_a(a, ta, lda, row, p) * op_b(b, tb, ldb, p, col);
  store_c(c + static_cast<int64_t>(row) * n + col, acc, beta);
}

// ---- Step 2: shared-memory tiles -----------------------------------------------------------

constexpr int kTile = 16;  // the block is kTile x kTile threads and computes a kTile^2 tile of C

template <typename T>
__global__ void gemm_tiled_kernel(bool ta, bool tb, int m, int n, int k, const T* __restrict__ a,
                                  int lda, const T* __restrict__ b, int ldb, T* __restrict__ c,
                                  T beta) {
  // as[r][p] = op(A)(row0 + r, k0 + p); bs[p][q] = op(B)(k0 + p, col0 + q). The +1 column of
  // padding puts the elements of a tile column in different banks (see the transposed loads).
  KILN_SHARED(T, as, [kTile][kTile + 1]);
  KILN_SHARED(T, bs, [kTile][kTile + 1]);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row0 = blockIdx.y * kTile, col0 = blockIdx.x * kTile;
  const int row = row0 + ty, col = col0 + tx;
  T acc = T(0);
  for (int k0 = 0; k0 < k; k0 += kTile) {
    // Load one element of each tile per thread, threadIdx.x running along memory: for A
    // (M,K) that is along k, for A^T stored (K,M) along m, hence the swapped roles.
    if (!ta) {
      const int r = ty, p = tx;
      as[r][p] = row0 + r < m && k0 + p < k ? a[static_cast<int64_t>(row0 + r) * lda + k0 + p] : T(0);
    } else {
      const int r = tx, p = ty;
      as[r][p] = row0 + r < m && k0 + p < k ? a[static_cast<int64_t>(k0 + p) * lda + row0 + r] : T(0);
    }
    if (!tb) {
      const int p = ty, q = tx;
      bs[p][q] = k0 + p < k && col0 + q < n ? b[static_cast<int64_t>(k0 + p) * ldb + col0 + q] : T(0);
    } else {
      const int p = tx, q = ty;
      bs[p][q] = k0 + p < k && col0 + q < n ? b[static_cast<int64_t>(col0 + q) * ldb + k0 + p] : T(0);
    }
    __syncthreads();  // the tiles are complete
    KILN_UNROLL
    for (int p = 0; p < kTile; ++p) acc += as[ty][p] * bs[p][tx];
    __syncthreads();  // everyone is done with the tiles before they are overwritten
  }
  if (row < m && col < n) store_c(c + static_cast<int64_t>(row) * n + col, acc, beta);
}

// ---- Step 3: register blocking (float) -------------------------------------------------------

constexpr int kBM = 128;     // block tile: rows of C
constexpr int kBN = 128;     // block tile: columns of C
constexpr int kBK = 8;       // K-slice per step
constexpr int kThreads = 256;  // 16 x 16 threads, each with an 8x8 micro-tile
constexpr int kPad = 4;      // shared row padding (floats): keeps float4 alignment, spreads banks
static_assert(kBM == kBN, "the tile loader below serves A and B with one shape");
static_assert(kBM * kBK == 4 * kThreads, "each thread loads 4 elements of each operand tile");

// One operand's 128x8 slice is loaded by 256 threads, 4 elements each. "KContig" operands
// (A not transposed, B transposed) have k running along memory rows: thread t takes row
// mn = t/2 and k = (t%2)*4..+3. The others (A^T, B) have m or n along rows: thread t takes
// k = t/32 and mn = (t%32)*4..+3. Either way 4 consecutive floats: one float4 when allowed.
template <bool KContig>
__device__ __forceinline__ void load_slice(const float* __restrict__ src, int ld, int mn0, int k0,
                                           int mn_size, int k_size, bool vec, float (&r)[4]) {
  const int t = threadIdx.x;
  if (KContig) {
    const int mn = mn0 + t / 2, k = k0 + (t % 2) * 4;
    const float* p = src + static_cast<int64_t>(mn) * ld + k;
    if (vec && mn < mn_size && k + 3 < k_size) {
      const Vec4f v = *reinterpret_cast<const Vec4f*>(p);
      r[0] = v.x, r[1] = v.y, r[2] = v.z, r[3] = v.w;
    } else {
      KILN_UNROLL
      for (int i = 0; i < 4; ++i) r[i] = mn < mn_size && k + i < k_size ? p[i] : 0.0f;
    }
  } else {
    const int k = k0 + t / 32, mn = mn0 + (t % 32) * 4;
    const float* p = src + static_cast<int64_t>(k) * ld + mn;
    if (vec && k < k_size && mn + 3 < mn_size) {
      const Vec4f v = *reinterpret_cast<const Vec4f*>(p);
      r[0] = v.x, r[1] = v.y, r[2] = v.z, r[3] = v.w;
    } else {
      KILN_UNROLL
      for (int i = 0; i < 4; ++i) r[i] = k < k_size && mn + i < mn_size ? p[i] : 0.0f;
    }
  }
}

// Stores the 4 values of load_slice into the k-major shared tile[k][mn].
template <bool KContig>
__device__ __forceinline__ void store_slice(float (*tile)[kBM + kPad], const float (&r)[4]) {
  const int t = threadIdx.x;
  if (KContig) {
    const int mn = t / 2, k = (t % 2) * 4;  // a column of the tile: the transposing store
    KILN_UNROLL
    for (int i = 0; i < 4; ++i) tile[k + i][mn] = r[i];
  } else {
    const int k = t / 32, mn = (t % 32) * 4;
    *reinterpret_cast<Vec4f*>(&tile[k][mn]) = Vec4f{r[0], r[1], r[2], r[3]};
  }
}

__device__ __forceinline__ void load4_shared(const float* p, float* out) {
  const Vec4f v = *reinterpret_cast<const Vec4f*>(p);
  out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
}

// a, b, c as in step 1; vec_a / vec_b / vec_c: the operand allows float4 access.
template <bool TA, bool TB>
__global__ void __launch_bounds__(kThreads)
    gemm_regblock_kernel(int m, int n, int k, const float* __restrict__ a, int lda,
                         const float* __restrict__ b, int ldb, float* __restrict__ c, float beta,
                         bool vec_a, bool vec_b, bool vec_c) {
  // Two k-major tiles per operand (double buffering), 16-byte aligned: float4 reads of the rows.
  KILN_SHARED(float, as, [2][kBK][kBM + kPad]);
  KILN_SHARED(float, bs, [2][kBK][kBN + kPad]);

  const int m0 = blockIdx.y * kBM, n0 = blockIdx.x * kBN;
  // The thread's micro-tile: rows ty*4..+3 and 64+ty*4..+3 of the block tile, columns
  // tx*4..+3 and 64+tx*4..+3. A warp is two values of ty and all 16 of tx.
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;

  float acc[8][8];
  KILN_UNROLL
  for (int i = 0; i < 8; ++i) {
    KILN_UNROLL
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
  }

  // Prologue: the first K-slice into buffer 0.
  float ra[4], rb[4];
  load_slice<!TA>(a, lda, m0, 0, m, k, vec_a, ra);
  load_slice<TB>(b, ldb, n0, 0, n, k, vec_b, rb);
  store_slice<!TA>(as[0], ra);
  store_slice<TB>(bs[0], rb);
  __syncthreads();

  int cur = 0;
  for (int k0 = 0; k0 < k; k0 += kBK) {
    const bool has_next = k0 + kBK < k;
    // Start the next slice's global loads now; they complete while we compute below.
    if (has_next) {
      load_slice<!TA>(a, lda, m0, k0 + kBK, m, k, vec_a, ra);
      load_slice<TB>(b, ldb, n0, k0 + kBK, n, k, vec_b, rb);
    }
    // 8 outer products: per k, 8 values of A and 8 of B from shared memory, 64 FMAs.
    KILN_UNROLL
    for (int kk = 0; kk < kBK; ++kk) {
      float fa[8], fb[8];
      load4_shared(&as[cur][kk][ty * 4], fa);
      load4_shared(&as[cur][kk][64 + ty * 4], fa + 4);
      load4_shared(&bs[cur][kk][tx * 4], fb);
      load4_shared(&bs[cur][kk][64 + tx * 4], fb + 4);
      KILN_UNROLL
      for (int i = 0; i < 8; ++i) {
        KILN_UNROLL
        for (int j = 0; j < 8; ++j) acc[i][j] += fa[i] * fb[j];
      }
    }
    // The other buffer was last read before the previous __syncthreads: safe to fill.
    if (has_next) {
      store_slice<!TA>(as[cur ^ 1], ra);
      store_slice<TB>(bs[cur ^ 1], rb);
    }
    __syncthreads();
    cur ^= 1;
  }

  // Epilogue: write the micro-tile, 4 columns at a time (float4 when aligned and inside).
  KILN_UNROLL
  for (int i = 0; i < 8; ++i) {
    const int row = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
    if (row >= m) continue;
    KILN_UNROLL
    for (int half = 0; half < 2; ++half) {
      const int col = n0 + half * 64 + tx * 4;
      float* out = c + static_cast<int64_t>(row) * n + col;
      const float* v = &acc[i][half * 4];
      if (vec_c && col + 3 < n) {
        Vec4f o{v[0], v[1], v[2], v[3]};
        if (beta != 0.0f) {
          const Vec4f old = *reinterpret_cast<const Vec4f*>(out);
          o.x += beta * old.x, o.y += beta * old.y, o.z += beta * old.z, o.w += beta * old.w;
        }
        *reinterpret_cast<Vec4f*>(out) = o;
      } else {
        for (int j = 0; j < 4; ++j)
          if (col + j < n) store_c(out + j, v[j], beta);
      }
    }
  }
}

// ---- Host side -----------------------------------------------------------------------------

template <typename T>
void launch_naive(bool ta, bool tb, const GemmShape& s, const T* a, const T* b, T* c, T beta) {
  const dim3 block(kNaiveBlock, kNaiveBlock);
  const dim3 grid(blocks_for(s.n, kNaiveBlock), blocks_for(s.m, kNaiveBlock));
  KILN_CHECK(grid.y <= 65535, "gemm: M = ", s.m, " needs more than 65535 block rows");
  launch(gemm_naive_kernel<T>, LaunchConfig{grid, block, 0, current_stream()}, ta, tb, s.m, s.n,
         s.k, a, s.lda, b, s.ldb, c, beta);
}

template <typename T>
void launch_tiled(bool ta, bool tb, const GemmShape& s, const T* a, const T* b, T* c, T beta) {
  const dim3 block(kTile, kTile);
  const dim3 grid(blocks_for(s.n, kTile), blocks_for(s.m, kTile));
  KILN_CHECK(grid.y <= 65535, "gemm: M = ", s.m, " needs more than 65535 block rows");
  launch(gemm_tiled_kernel<T>, LaunchConfig{grid, block, 0, current_stream()}, ta, tb, s.m, s.n,
         s.k, a, s.lda, b, s.ldb, c, beta);
}

void launch_regblock(bool ta, bool tb, const GemmShape& s, const float* a, const float* b,
                     float* c, float beta) {
  const dim3 grid(blocks_for(s.n, kBN), blocks_for(s.m, kBM));
  KILN_CHECK(grid.y <= 65535, "gemm: M = ", s.m, " needs more than 65535 block rows");
  const bool vec_a = aligned16(a) && s.lda % 4 == 0;
  const bool vec_b = aligned16(b) && s.ldb % 4 == 0;
  const bool vec_c = aligned16(c) && s.n % 4 == 0;
  const LaunchConfig cfg{grid, dim3(kThreads), 0, current_stream()};
  // The transposes are template arguments: each of the four variants is compiled with its
  // own loaders, and the compute loop is the same.
  auto go = [&](auto kernel) {
    launch(kernel, cfg, s.m, s.n, s.k, a, s.lda, b, s.ldb, c, beta, vec_a, vec_b, vec_c);
  };
  if (!ta && !tb) go(gemm_regblock_kernel<false, false>);
  else if (!ta && tb) go(gemm_regblock_kernel<false, true>);
  else if (ta && !tb) go(gemm_regblock_kernel<true, false>);
  else go(gemm_regblock_kernel<true, true>);
}

// The row-major product as the column-major one C^T = op(B)^T op(A)^T (see the file comment).
template <typename T, typename Fn>
void cublas_gemm(Fn gemm_fn, bool ta, bool tb, const GemmShape& s, const T* a, const T* b, T* c,
                 T beta) {
  cublasHandle_t handle = cublas_handle();
  const T alpha = T(1);
  // Leading dimensions must be >= 1 even for empty operands.
  const int lda = s.lda > 0 ? s.lda : 1, ldb = s.ldb > 0 ? s.ldb : 1, ldc = s.n > 0 ? s.n : 1;
  KILN_CUBLAS_LAUNCH(gemm_fn(handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                            s.n, s.m, s.k, &alpha, b, ldb, a, lda, &beta, c, ldc));
}

}  // namespace

const char* gemm_kernel_name(GemmKernel kernel) {
  switch (kernel) {
    case GemmKernel::Naive: return "naive";
    case GemmKernel::Tiled: return "tiled";
    case GemmKernel::RegisterBlocked: return "regblock";
  }
  return "?";
}

template <typename T>
void gemm_hand(GemmKernel kernel, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a,
               const T* b, T* c, T beta) {
  const GemmShape s = gemm_shape("gemm", ta, tb, m, n, k);
  if (s.m == 0 || s.n == 0) return;
  switch (kernel) {
    case GemmKernel::Naive: launch_naive(ta, tb, s, a, b, c, beta); return;
    case GemmKernel::Tiled: launch_tiled(ta, tb, s, a, b, c, beta); return;
    case GemmKernel::RegisterBlocked:
      if constexpr (std::is_same_v<T, float>) {
        launch_regblock(ta, tb, s, a, b, c, beta);
        return;
      } else {
        throw Error("gemm: the register-blocked kernel is float only; use the tiled one for double",
                    ErrorKind::Usage);
      }
  }
}

template <typename T>
void gemm_vendor(Backend, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, const T* b,
                 T* c, T beta) {
  const GemmShape s = gemm_shape("gemm (cuBLAS)", ta, tb, m, n, k);
  if (s.m == 0 || s.n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    // FP32 unless TF32 is switched on (engine/cuda/blas.h: cublas_handle() applies the math
    // mode): TF32 rounds the inputs to 10 mantissa bits for the tensor cores, ~1e-3 relative
    // error, several times faster.
    cublas_gemm(cublas().sgemm, ta, tb, s, a, b, c, beta);
  } else {
    cublas_gemm(cublas().dgemm, ta, tb, s, a, b, c, beta);
  }
}

template <typename T>
void gemm(Backend, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c,
          T beta) {
  // The fastest step that applies. Double stops at the tiled kernel.
  const GemmKernel kernel =
      std::is_same_v<T, float> ? GemmKernel::RegisterBlocked : GemmKernel::Tiled;
  gemm_hand(kernel, ta, tb, m, n, k, a, b, c, beta);
}

#define KILN_INSTANTIATE(T)                                                                   \
  template void gemm<T>(Backend, bool, bool, int64_t, int64_t, int64_t, const T*, const T*, T*,  \
                        T);                                                                     \
  template void gemm_hand<T>(GemmKernel, bool, bool, int64_t, int64_t, int64_t, const T*,       \
                             const T*, T*, T);                                                  \
  template void gemm_vendor<T>(Backend, bool, bool, int64_t, int64_t, int64_t, const T*,        \
                               const T*, T*, T);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(double)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
