// gemm_bf16_avx512.cpp: a bf16 GEMM with f32 accumulation on AVX-512 BF16, written to be read.
// C (M,N) = A (M,K) B (K,N), inputs bf16, sums and output f32 (contract: gemm_bf16_avx512.h).
//
// 1. The instruction. AVX512_BF16 (Cooper Lake, Sapphire Rapids, Zen 4) adds
//        vdpbf16ps zmm_acc, zmm_a, zmm_b          intrinsic: _mm512_dpbf16_ps(acc, a, b)
//    zmm_a and zmm_b each hold 32 bf16 values, seen as 16 PAIRS; acc holds 16 f32 lanes. Lane j:
//        acc[j] += a[2j+1] * b[2j+1];  acc[j] += a[2j] * b[2j]      (in that order)
//    A bf16 has 8 significant bits, so the product of two is exact in f32 (16 bits <= 24); only
//    the additions round, as in an f32 GEMM. One instruction does 32 multiply-adds: twice an f32
//    FMA's 16. Two quirks (Intel SDM, VDPBF16PS): it rounds to nearest even whatever MXCSR says,
//    and it treats subnormal inputs and results as zero (bf16 subnormals are below 1e-38).
//
// 2. The packing. A lane multiplies a pair of consecutive k's: lane j of the B vector must
//    hold (B[2p][j], B[2p+1][j]), column j at k-steps 2p and 2p+1, and the A operand must hold
//    (A[i][2p], A[i][2p+1]) in every lane (one row, broadcast). Neither matrix is laid out like
//    that, so both are first copied ("packed") into that pair-interleaved order:
//      B panel of kNR = 64 columns:  [pair p][column c][2]    64 x 2 bf16 = 4 zmm per pair
//      A panel of kMR = 6 rows:      [pair p][row r][2]       one 32-bit word per row and pair
//    K odd: the last pair's second half is a zero in both (0 * 0 adds nothing), which is why
//    K need not be a multiple of 2. Rows and columns past the edge of A and B are packed as
//    zeros too, so the micro-kernel always computes a full tile and masks only its stores.
//    Packing also makes transposition free: op(A) and op(B) are read once, in any order, by
//    the packing loops, and the kernel sees one layout.
//
// 3. The register blocking (the micro-kernel). A 6 x 64 tile of C lives in 24 zmm registers
//    (6 rows x 4 vectors of 16 columns) for the whole k loop. Each pair p costs 4 loads of B,
//    6 broadcasts of A words, and 24 vdpbf16ps: 24 * 32 = 768 multiply-adds per 10 loads, which
//    keeps the two FMA ports busy rather than the load ports. 24 accumulators + 4 B vectors +
//    1 broadcast A = 29 of the 32 zmm registers. (This is the shape of the BLIS and oneDNN
//    kernels; see Van Zee and van de Geijn, "BLIS: A Framework for Rapidly Instantiating BLAS
//    Functionality", ACM TOMS 2015, https://doi.org/10.1145/2764454.)
//
// 4. The cache blocking. C is cut into kMC x kNC = 96 x 256 blocks, the unit of OpenMP work.
//    Within a block, K is walked in slices of kKC = 256 (128 pairs): the micro-kernels of a
//    slice reuse one B micro-panel (128 pairs x 64 columns x 4 bytes = 32 KB, in L1) for all
//    the row panels of the block, and one A block (96 x 256 x 2 bytes = 48 KB, in L2) for all
//    its column panels. The first slice stores into C, the later ones add to it.
//
// 5. What to expect. The kernel runs near the instruction's peak, and that peak is the lesson:
//    on the Sapphire Rapids machine Kiln is measured on, a loop of independent vdpbf16ps
//    retires about one every two cycles (~110 GFLOP/s on one core), while two f32 FMAs retire
//    per cycle (~225 GFLOP/s). One AVX-512 BF16 dot product does twice an FMA's work at a
//    quarter of its rate, so a bf16 GEMM on it saves memory and bandwidth but not arithmetic
//    time; apps/gemm_bench shows it at about 100 GFLOP/s per core, below f32 OpenBLAS. oneDNN's
//    bf16 matmul on the same CPU uses AMX tile instructions (TDPBF16PS: a 16 x 32 by 32 x 16
//    product per instruction) and is an order of magnitude faster: the hardware to use for
//    bf16 there. This kernel is the portable teaching step before that.
//
// Compiled into every x86-64 build: the functions that use AVX-512 carry a target attribute
// (the rest of the file, and of Kiln, does not need AVX-512), and gemm_lowp calls this only
// when __builtin_cpu_supports("avx512bf16") says the CPU has it.
#include "engine/gemm_bf16_avx512.h"

#include <algorithm>
#include <cstring>

#include "engine/error.h"
#include "engine/tensor.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KILN_HAVE_AVX512_BF16_KERNEL 1
#include <immintrin.h>
#define KILN_TARGET_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))
#else
#define KILN_HAVE_AVX512_BF16_KERNEL 0
#endif

namespace kiln::cpu {
namespace {

constexpr int64_t kMR = 6;              // rows of a micro-tile of C
constexpr int64_t kNR = 64;             // columns of a micro-tile: kNV vectors of 16 f32
constexpr int64_t kNV = kNR / 16;
constexpr int64_t kKCPairs = 128;       // pairs of k per slice (kKC = 256 values of k)
constexpr int64_t kMC = 16 * kMR;       // rows of a block of C (96)
constexpr int64_t kNC = 4 * kNR;        // columns of a block of C (256)

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Packs rows [i0, i0 + kMR) of op(A) into `dst` ([pairs][kMR][2]); out-of-range rows and the
// odd k's partner are zeros. op(A)[i][kk] is a[i*K + kk], or a[kk*M + i] when trans_a.
void pack_a_panel(bool trans_a, int64_t m, int64_t k, const uint16_t* a, int64_t i0,
                  int64_t pairs, uint16_t* dst) {
  for (int64_t p = 0; p < pairs; ++p) {
    for (int64_t r = 0; r < kMR; ++r) {
      const int64_t i = i0 + r;
      for (int64_t t = 0; t < 2; ++t) {
        const int64_t kk = 2 * p + t;
        uint16_t v = 0;
        if (i < m && kk < k) v = trans_a ? a[kk * m + i] : a[i * k + kk];
        dst[(p * kMR + r) * 2 + t] = v;
      }
    }
  }
}

// Packs columns [j0, j0 + kNR) of op(B) into `dst` ([pairs][kNR][2]). op(B)[kk][j] is
// b[kk*N + j], or b[j*K + kk] when trans_b.
void pack_b_panel(bool trans_b, int64_t n, int64_t k, const uint16_t* b, int64_t j0,
                  int64_t pairs, uint16_t* dst) {
  for (int64_t p = 0; p < pairs; ++p) {
    for (int64_t t = 0; t < 2; ++t) {
      const int64_t kk = 2 * p + t;
      for (int64_t col = 0; col < kNR; ++col) {
        const int64_t j = j0 + col;
        uint16_t v = 0;
        if (j < n && kk < k) v = trans_b ? b[j * k + kk] : b[kk * n + j];
        dst[(p * kNR + col) * 2 + t] = v;
      }
    }
  }
}

#if KILN_HAVE_AVX512_BF16_KERNEL
// The micro-kernel: the kMR x kNR tile of C at `c` (row stride ldc) gets the product of one
// packed A panel slice and one packed B panel slice of `pairs` pairs; only the top-left
// rows x cols of the tile exist in C. accumulate: add to C (a later K slice) or store (the first).
KILN_TARGET_AVX512_BF16
void micro_kernel(int64_t pairs, const uint16_t* a, const uint16_t* b, float* c, int64_t ldc,
                  int64_t rows, int64_t cols, bool accumulate) {
  __m512 acc[kMR][kNV];
#pragma GCC unroll 8
  for (int64_t r = 0; r < kMR; ++r)
#pragma GCC unroll 8
    for (int64_t v = 0; v < kNV; ++v) acc[r][v] = _mm512_setzero_ps();

  for (int64_t p = 0; p < pairs; ++p) {
    // 64 columns x (k = 2p, 2p+1): four vectors of 16 pairs.
    __m512bh bv[kNV];
#pragma GCC unroll 8
    for (int64_t v = 0; v < kNV; ++v)
      bv[v] = (__m512bh)_mm512_loadu_si512(b + (p * kNR + v * 16) * 2);
#pragma GCC unroll 8
    for (int64_t r = 0; r < kMR; ++r) {
      // Row r's pair (A[r][2p], A[r][2p+1]) as one 32-bit word, copied to all 16 lanes.
      int32_t word;
      std::memcpy(&word, a + (p * kMR + r) * 2, sizeof word);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(word);
#pragma GCC unroll 8
      for (int64_t v = 0; v < kNV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }

  // The stores: a lane mask per vector keeps the columns past n out of C.
  __mmask16 mask[kNV];
#pragma GCC unroll 8
  for (int64_t v = 0; v < kNV; ++v) {
    const int64_t valid = std::min<int64_t>(std::max<int64_t>(cols - v * 16, 0), 16);
    mask[v] = static_cast<__mmask16>((1u << valid) - 1u);
  }
#pragma GCC unroll 8
  for (int64_t r = 0; r < kMR; ++r) {
    if (r >= rows) break;
#pragma GCC unroll 8
    for (int64_t v = 0; v < kNV; ++v) {
      float* dst = c + r * ldc + v * 16;
      __m512 sum = acc[r][v];
      if (accumulate) sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(mask[v], dst));
      _mm512_mask_storeu_ps(dst, mask[v], sum);
    }
  }
}
#endif

}  // namespace

bool cpu_has_avx512_bf16() {
#if KILN_HAVE_AVX512_BF16_KERNEL
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

void gemm_bf16_avx512(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                      const uint16_t* a, const uint16_t* b, float* c) {
  KILN_CHECK(cpu_has_avx512_bf16(),
             "gemm_bf16_avx512: this CPU has no AVX512_BF16; use the convert+f32 path");
#if KILN_HAVE_AVX512_BF16_KERNEL
  if (m <= 0 || n <= 0) return;
  const int64_t pairs = ceil_div(k, 2);
  const int64_t m_panels = ceil_div(m, kMR), n_panels = ceil_div(n, kNR);
  if (pairs == 0) {  // K = 0: the empty sum
    std::fill(c, c + m * n, 0.0f);
    return;
  }

  // Step 2: pack all of op(A) and op(B) once (bf16 scratch tensors, reused by the allocator).
  const int64_t a_panel = pairs * kMR * 2, b_panel = pairs * kNR * 2;  // elements per panel
  Tensor a_scratch = Tensor::empty({m_panels * a_panel}, DType::BF16);
  Tensor b_scratch = Tensor::empty({n_panels * b_panel}, DType::BF16);
  uint16_t* a_packed = static_cast<uint16_t*>(a_scratch.raw_data());
  uint16_t* b_packed = static_cast<uint16_t*>(b_scratch.raw_data());
#pragma omp parallel
  {
#pragma omp for schedule(static) nowait
    for (int64_t ip = 0; ip < m_panels; ++ip)
      pack_a_panel(trans_a, m, k, a, ip * kMR, pairs, a_packed + ip * a_panel);
#pragma omp for schedule(static)
    for (int64_t jp = 0; jp < n_panels; ++jp)
      pack_b_panel(trans_b, n, k, b, jp * kNR, pairs, b_packed + jp * b_panel);
  }

  // Steps 3 and 4: blocks of C to threads; in a block, K slices, then column panels (one B
  // micro-panel per slice stays in L1), then row panels.
  const int64_t m_blocks = ceil_div(m, kMC), n_blocks = ceil_div(n, kNC);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t mb = 0; mb < m_blocks; ++mb) {
    for (int64_t nb = 0; nb < n_blocks; ++nb) {
      const int64_t ip_end = std::min(m_panels, (mb + 1) * (kMC / kMR));
      const int64_t jp_end = std::min(n_panels, (nb + 1) * (kNC / kNR));
      for (int64_t p0 = 0; p0 < pairs; p0 += kKCPairs) {
        const int64_t slice = std::min(kKCPairs, pairs - p0);
        for (int64_t jp = nb * (kNC / kNR); jp < jp_end; ++jp) {
          const uint16_t* b_slice = b_packed + jp * b_panel + p0 * kNR * 2;
          for (int64_t ip = mb * (kMC / kMR); ip < ip_end; ++ip) {
            const uint16_t* a_slice = a_packed + ip * a_panel + p0 * kMR * 2;
            micro_kernel(slice, a_slice, b_slice, c + ip * kMR * n + jp * kNR, n,
                         std::min(kMR, m - ip * kMR), std::min(kNR, n - jp * kNR), p0 > 0);
          }
        }
      }
    }
  }
#endif
}

}  // namespace kiln::cpu
