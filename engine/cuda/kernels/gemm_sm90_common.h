// gemm_sm90_common.h: what the Hopper GEMM steps share (step 5 in gemm_sm90.cu, steps 6 and 7
// in gemm_sm90_ws.cu): the K-slice and its swizzle, the wgmma descriptor of a slice, the store
// of a warpgroup's accumulators into C, and the host's K-major operands. Internal to those files.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/cuda/runtime.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/sm90/swizzle.h"
#include "engine/cuda/sm90/wgmma.h"
#include "engine/dtype.h"
#include "engine/tensor.h"

// The kernel bodies are compiled where wgmma and TMA exist: nvcc's sm_90a pass, and the
// simulator. (nvcc's host pass parses them too, as it parses every kernel.)
#if KILN_CUDA_SIM || !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KILN_SM90_BODY 1
#else
#define KILN_SM90_BODY 0
#endif

namespace kiln::cuda::sm90_gemm {

constexpr int kBK = 64;    // K-slice: 64 16-bit elements, one 128-byte swizzle row
constexpr int kMmaM = 64;  // rows of one wgmma
constexpr int kMmaK = 16;  // depth of one wgmma
constexpr sm90::Swizzle kSwizzle = sm90::Swizzle::B128;
static_assert(kBK * 2 == sm90::swizzle_row_bytes(kSwizzle),
              "a slice row is one swizzle row: the TMA box's inner dimension may not exceed it");

// The bytes of one operand's box: `rows` x one slice.
constexpr uint32_t box_bytes(int rows) { return static_cast<uint32_t>(rows) * kBK * 2; }

#if KILN_SM90_BODY
// The kernel's shared-memory layout S placed at `raw`, the block's dynamic shared memory, rounded
// up to the 1024-byte swizzle atom (the launch guarantees 16 bytes only, hence the kernels ask
// for sizeof(S) + 1024; generic addresses of shared memory keep its alignment: the window starts
// on a large power of two).
template <typename S>
__device__ __forceinline__ S& atom_aligned(unsigned char* raw) {
  return *reinterpret_cast<S*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t{1023});
}

// The descriptor of a K-major operand whose first row is at `rows`, k offset `kk` elements
// into a 128-byte swizzled slice: consecutive rows are 128 bytes apart, so groups of 8 rows
// (one swizzle atom, the "stride dimension") are 1024 bytes apart. The leading-dimension
// offset is unused for a swizzled K-major operand whose 16 k (32 bytes) lie inside one swizzle
// row; 16 bytes is the conventional value. Moving k by 16 moves the start address by 32 bytes;
// the swizzle is applied to the address bits by the hardware, which is why the slice must
// start on an atom.
__device__ __forceinline__ uint64_t slice_desc(const uint16_t* rows, int kk) {
  return sm90::make_smem_desc(rows + kk, kSwizzle, 16, 8 * sm90::swizzle_row_bytes(kSwizzle));
}

// Stores the accumulators of a 64-row wgmma result (64 x BN, rows row0 + ..., columns col0 +
// ...) into C, by thread t (0..127) of the warpgroup. The accumulator layout (sm90/wgmma.h):
// d[i] = C(row, col) with row = 16 w + l/4 + 8 ((i/2)%2), col = 8 (i/4) + 2 (l%4) + i%2 (warp
// w, lane l): pairs of adjacent columns, stored as one float2 where vec_c (C 8-byte aligned,
// N even) allows, each bounds-checked against M and N.
template <int BN>
__device__ __forceinline__ void store_rows(const float (&d)[BN / 2], float* __restrict__ c, int m,
                                           int n, int row0, int col0, bool vec_c, int t) {
  const int warp = t / 32, lane = t % 32;
  KILN_UNROLL
  for (int i = 0; i < BN / 2; i += 2) {
    const int row = row0 + 16 * warp + lane / 4 + 8 * ((i / 2) % 2);
    const int col = col0 + 8 * (i / 4) + 2 * (lane % 4);
    if (row >= m || col >= n) continue;
    float* out = c + static_cast<int64_t>(row) * n + col;
    if (vec_c && col + 1 < n) {
      *reinterpret_cast<float2*>(out) = make_float2(d[i], d[i + 1]);
    } else {
      out[0] = d[i];
      if (col + 1 < n) out[1] = d[i + 1];
    }
  }
}
#endif  // KILN_SM90_BODY

// ---- Host side -----------------------------------------------------------------------------

// An operand as the kernels read it: `rows` x `k`, K-major (each row's k contiguous), row
// stride `ld` elements, a multiple of 8 (16 bytes), base 16-byte aligned. `keep` owns a
// workspace when one was needed.
struct KMajor {
  const uint16_t* data;
  int64_t ld;
  Tensor keep;
};

// Steps 6 and 7 (gemm_sm90_ws.cu): C (m x n, f32) = A B^T from K-major A (m x k) and B (n x k),
// `in` bf16 or f16, k >= 1. persistent: step 7 with `blocks` blocks (0: one per SM).
void launch_warp_specialized(DType in, int m, int n, int k, const KMajor& a, const KMajor& b,
                             float* c, bool persistent, int blocks);

}  // namespace kiln::cuda::sm90_gemm
