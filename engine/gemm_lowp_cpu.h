// gemm_lowp_cpu.h: matrix products of bf16 or f16 inputs with f32 accumulation and f32 output,
// the CPU kernels of mixed-precision training.
//
// The inputs are 16-bit bit patterns (DType::BF16 or DType::F16, engine/dtype.h); every product
// of two low-precision values is exact in f32 and the products are summed in f32, so the result
// is as good as an f32 GEMM of the rounded inputs (the order of the sum differs between paths,
// so the last bits do too). Three code paths:
//
//   "onednn"       oneDNN's matmul with bf16/f16 src and weights and an f32 dst: the vendor
//                  twin, gemm_lowp_vendor(); the op runs it for a dtype only where oneDNN has a
//                  JIT kernel for it on this CPU (gemm_impl, engine/impl.cpp)
//   "avx512-bf16"  our own AVX-512 BF16 kernel (the hand twin gemm_lowp(), BF16, on CPUs with
//                  avx512_bf16): engine/gemm_bf16_avx512.cpp, which teaches the instruction and
//                  the packing
//   "convert+f32"  A and B widened to f32 into scratch, then cpu::gemm<float> (OpenBLAS): the
//                  path everywhere else
#pragma once

#include <cstdint>

#include "engine/backend.h"
#include "engine/dtype.h"
#include "engine/impl.h"

namespace kiln::cpu {

// C (M,N) f32 = op(A) op(B); A and B hold bf16 or f16 bit patterns, as `in` says (BF16 or
// F16). Row-major, as cpu::gemm (engine/ops_cpu.h): A is stored (M,K), or (K,M) when trans_a;
// B is (K,N), or (N,K) when trans_b. C is written, never read. The hand twin: "avx512-bf16"
// where it can run, else "convert+f32". The CUDA twin is in engine/ops_cuda.h.
void gemm_lowp(Backend, DType in, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
               const uint16_t* a, const uint16_t* b, float* c);
// The vendor twin, same contract: "onednn" where oneDNN has a kernel for `in` and the shape,
// else "convert+f32".
void gemm_lowp_vendor(Backend, DType in, bool trans_a, bool trans_b, int64_t m, int64_t n,
                      int64_t k, const uint16_t* a, const uint16_t* b, float* c);

// Which code path the twin of `impl` (gemm_lowp for Hand, gemm_lowp_vendor for Vendor) takes for
// `in` on this CPU: "onednn", "avx512-bf16" or "convert+f32". (A shape for which oneDNN would
// fall back to its reference code takes "convert+f32" too, though this says "onednn".)
const char* gemm_lowp_path(DType in, Impl impl);

// ---- each path on its own, for the tests and gemm_bench --------------------------------------
enum class LowpGemmPath { OneDnn, Avx512Bf16, ConvertF32 };
const char* lowp_gemm_path_name(LowpGemmPath path);  // the names gemm_lowp_path() returns

// Whether `path` can run `in` on this CPU: ConvertF32 always; Avx512Bf16 for BF16 on CPUs with
// avx512_bf16 (and builds for x86-64); OneDnn where oneDNN has a non-reference matmul for `in`.
bool lowp_gemm_path_available(LowpGemmPath path, DType in);

// Runs one path (same contract as gemm_lowp). Throws kiln::Error when it is not available for
// `in` here. OneDnn runs whatever oneDNN chose for the shape, reference code included.
void gemm_lowp_with(LowpGemmPath path, DType in, bool trans_a, bool trans_b, int64_t m, int64_t n,
                    int64_t k, const uint16_t* a, const uint16_t* b, float* c);

}  // namespace kiln::cpu
