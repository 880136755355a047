// gemm_shape.h: the shape checks and leading dimensions every CUDA GEMM entry point shares
// (gemm.cu, gemm_tensor_core.cu, gemm_lowp.cu). Row-major, as cuda::gemm: op(A) is (M,K), op(B) is (K,N), C is
// (M,N); A is stored (M,K), or (K,M) when transposed, likewise B, so lda = trans_a ? M : K,
// ldb = trans_b ? K : N, ldc = N.
#pragma once

#include <climits>
#include <cstdint>

#include "engine/error.h"

namespace kiln::cuda {

struct GemmShape {
  int m, n, k, lda, ldb;
};

// Checks the sizes (named after `who` in the error) and computes the leading dimensions.
inline GemmShape gemm_shape(const char* who, bool ta, bool tb, int64_t m, int64_t n, int64_t k) {
  KILN_CHECK(m >= 0 && n >= 0 && k >= 0, who, ": negative size (", m, ", ", n, ", ", k, ")");
  // Sizes are int in the kernels (and in cuBLAS); offsets into the matrices are int64_t.
  KILN_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX, who, ": sizes (", m, ", ", n, ", ", k,
             ") exceed the 32-bit range of the kernels");
  GemmShape s;
  s.m = static_cast<int>(m), s.n = static_cast<int>(n), s.k = static_cast<int>(k);
  s.lda = static_cast<int>(ta ? m : k);
  s.ldb = static_cast<int>(tb ? k : n);
  return s;
}

// Whether p may be read as 16-byte vectors (float4, uint4).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace kiln::cuda
