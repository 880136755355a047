// gemm_bf16_avx512.h: our bf16 GEMM on the AVX-512 BF16 dot-product instruction (internal to
// engine/; use cpu::gemm_lowp in engine/gemm_lowp_cpu.h). engine/gemm_bf16_avx512.cpp teaches it.
#pragma once

#include <cstdint>

namespace kiln::cpu {

// True on x86-64 CPUs that have AVX512_BF16 (with the AVX512F and AVX512BW it builds on),
// asked at run time: the kernel is compiled into every x86-64 build and only called here.
bool cpu_has_avx512_bf16();

// C (M,N) f32 = op(A) op(B), A and B bf16 bit patterns; the contract of cpu::gemm_lowp. Call
// only when cpu_has_avx512_bf16() (elsewhere it throws kiln::Error).
void gemm_bf16_avx512(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                      const uint16_t* a,  // a is (M,K), or (K,M) when trans_a
                      const uint16_t* b,  // b is (K,N), or (N,K) when trans_b
                      float* c);          // c is (M,N), written, never read

}  // namespace kiln::cpu
