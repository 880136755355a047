// sm90/wgmma.h: Hopper's warpgroup MMA (wgmma.mma_async), the tensor-core instruction of
// compute capability 9.0 that a warpgroup (4 consecutive warps, 128 threads) issues together:
// D (64 x N, f32 in registers) = A (64 x 16) * B (16 x N) (+ D), both operands read from shared
// memory through 64-bit matrix descriptors, asynchronously. The PTX ISA, "Asynchronous
// Warpgroup Level Matrix Multiply-Accumulate Instructions":
// https://docs.nvidia.com/cuda/parallel-thread-execution/#asynchronous-warpgroup-level-matrix-instructions
//
// The protocol of a k-loop (every call by all 128 threads of the warpgroup):
//   wgmma_fence();                              // before the first mma_async, and again after
//                                               // the thread touched the accumulators
//   wgmma_m64k16<BN, E>(d, desc_a, desc_b, acc);  // issue (several, e.g. one per k16 step)
//   wgmma_commit_group();                       // close the issued ones into a group
//   wgmma_wait_group<0>();                      // until all groups (but the N newest) finished
// Between issue and the wait that retires its group the accumulators are undefined (the
// simulator fills them with NaN), and the shared-memory operands must not change. wgmma reads
// shared memory through the async proxy: operands the threads stored themselves (rather than
// the TMA) need fence_proxy_async_shared() (sm90/tma.h) and a barrier before the mma.
//
// Operands are K-major (imm-trans-a/b = 0): A stored as 64 rows of 16 k, B as BN rows of 16 k,
// in the canonical layouts of the PTX ISA's "Shared Memory Matrix Layout": without swizzle,
// core matrices of 8 rows x 16 bytes, LBO = the byte distance of the next 8 k, SBO = of the
// next 8 rows; swizzled (sm90/swizzle.h), rows of 32/64/128 bytes in atoms of 8 rows on their
// atom boundary, SBO = the distance of the next 8 rows, LBO unused (1 by convention). Within a
// 128B-swizzled tile of 64 k, the k16 step j starts 32 * j bytes into the atom: advance the
// descriptor's start field by 2 * j (the swizzle acts on the address bits, so this is legal).
//
// Two faces: inline PTX under nvcc for sm_90a (arch-specific: -arch=sm_90a), and calls into the
// simulator (engine/cuda/sim/sm90_wgmma.h; docs/cuda_simulator.md, "Hopper: warpgroup MMA"),
// where a shared address is the offset into the block's dynamic shared memory.
#pragma once

#include <cstdint>
#include <type_traits>

#include "engine/cuda/mma.h"
#include "engine/cuda/runtime.h"
#include "engine/cuda/sm90/swizzle.h"

#if KILN_CUDA_SIM
#include "engine/cuda/sim/sm90_wgmma.h"
#endif

// wgmma and setmaxnreg exist only on the arch-specific target sm_90a: nvcc -arch=sm_90a also
// embeds portable compute_90 PTX, whose pass (without __CUDA_ARCH_FEAT_SM90_ALL) gets __trap().
#if !KILN_CUDA_SIM && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && \
    defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KILN_SM90A_PTX 1
#else
#define KILN_SM90A_PTX 0
#endif

namespace kiln::cuda::sm90 {

// The swizzle field of a descriptor (bits 62-63): 0 none, 1 128B, 2 64B, 3 32B.
__host__ __device__ constexpr uint32_t descriptor_swizzle_code(Swizzle s) {
  return s == Swizzle::B128 ? 1u : s == Swizzle::B64 ? 2u : s == Swizzle::B32 ? 3u : 0u;
}

// The shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): bits 0-13 the start
// address, 16-29 the leading-dimension byte offset, 32-45 the stride-dimension byte offset (each
// (x & 0x3FFFF) >> 4), 49-51 the base offset (0: tiles start on their swizzle atom), 62-63 the
// swizzle mode.
__device__ inline uint64_t make_smem_desc(const void* smem, Swizzle swizzle,
                                          uint32_t leading_byte_offset,
                                          uint32_t stride_byte_offset) {
#if KILN_CUDA_SIM
  return ::kiln::sim::sm90::make_smem_desc(smem, descriptor_swizzle_code(swizzle),
                                           leading_byte_offset, stride_byte_offset);
#else
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const auto encode = [](uint32_t x) { return static_cast<uint64_t>((x & 0x3FFFFu) >> 4); };
  return encode(address) | encode(leading_byte_offset) << 16 | encode(stride_byte_offset) << 32 |
         static_cast<uint64_t>(descriptor_swizzle_code(swizzle)) << 62;
#endif
}

__device__ inline void wgmma_fence() {
#if KILN_CUDA_SIM
  ::kiln::sim::sm90::wgmma_fence();
#elif KILN_SM90A_PTX
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

__device__ inline void wgmma_commit_group() {
#if KILN_CUDA_SIM
  ::kiln::sim::sm90::wgmma_commit_group();
#elif KILN_SM90A_PTX
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

template <int N>
__device__ inline void wgmma_wait_group() {
  static_assert(N >= 0 && N <= 7, "wgmma_wait_group: N (the groups left pending) is 0..7");
#if KILN_CUDA_SIM
  ::kiln::sim::sm90::wgmma_wait_group(N);
#elif KILN_SM90A_PTX
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#else
  __trap();
#endif
}

// Keeps the compiler from moving reads or writes of the accumulators across the wgmma calls
// (it does not know wait_group writes them): call it on d after issuing and after waiting.
template <int Size>
__device__ inline void wgmma_fence_operand(float (&d)[Size]) {
#if !KILN_CUDA_SIM && defined(__CUDA_ARCH__)
#pragma unroll
  for (int i = 0; i < Size; ++i) asm volatile("" : "+f"(d[i])::"memory");
#else
  (void)d;
#endif
}

#if KILN_SM90A_PTX
namespace detail {
// The register lists of the PTX (N/2 f32 accumulators), built from two-digit operand numbers:
// KILN_WGMMA_S(t, u) is the text "%tu" and KILN_WGMMA_R(t, u) the operand d[tu]; with t empty,
// the digits 0-9.
#define KILN_WGMMA_S(t, u) "%" #t #u
#define KILN_WGMMA_R(t, u) "+f"(d[t##u])
#define KILN_WGMMA_S10(t)                                                                     \
  KILN_WGMMA_S(t, 0) "," KILN_WGMMA_S(t, 1) "," KILN_WGMMA_S(t, 2) "," KILN_WGMMA_S(t, 3) "," \
  KILN_WGMMA_S(t, 4) "," KILN_WGMMA_S(t, 5) "," KILN_WGMMA_S(t, 6) "," KILN_WGMMA_S(t, 7) "," \
  KILN_WGMMA_S(t, 8) "," KILN_WGMMA_S(t, 9)
#define KILN_WGMMA_R10(t)                                                                      \
  KILN_WGMMA_R(t, 0), KILN_WGMMA_R(t, 1), KILN_WGMMA_R(t, 2), KILN_WGMMA_R(t, 3),              \
      KILN_WGMMA_R(t, 4), KILN_WGMMA_R(t, 5), KILN_WGMMA_R(t, 6), KILN_WGMMA_R(t, 7),          \
      KILN_WGMMA_R(t, 8), KILN_WGMMA_R(t, 9)
#define KILN_WGMMA_S4(t) KILN_WGMMA_S(t, 0) "," KILN_WGMMA_S(t, 1) "," KILN_WGMMA_S(t, 2) "," KILN_WGMMA_S(t, 3)
#define KILN_WGMMA_R4(t) KILN_WGMMA_R(t, 0), KILN_WGMMA_R(t, 1), KILN_WGMMA_R(t, 2), KILN_WGMMA_R(t, 3)
#define KILN_WGMMA_S8(t) \
  KILN_WGMMA_S4(t) "," KILN_WGMMA_S(t, 4) "," KILN_WGMMA_S(t, 5) "," KILN_WGMMA_S(t, 6) "," KILN_WGMMA_S(t, 7)
#define KILN_WGMMA_R8(t) \
  KILN_WGMMA_R4(t), KILN_WGMMA_R(t, 4), KILN_WGMMA_R(t, 5), KILN_WGMMA_R(t, 6), KILN_WGMMA_R(t, 7)
#define KILN_WGMMA_S2X(t) KILN_WGMMA_S(t, 0) "," KILN_WGMMA_S(t, 1)
#define KILN_WGMMA_R2X(t) KILN_WGMMA_R(t, 0), KILN_WGMMA_R(t, 1)
// 32, 64 and 128 registers: %0..%31, %0..%63, %0..%127.
#define KILN_WGMMA_S32 \
  KILN_WGMMA_S10() "," KILN_WGMMA_S10(1) "," KILN_WGMMA_S10(2) "," KILN_WGMMA_S2X(3)
#define KILN_WGMMA_R32 KILN_WGMMA_R10(), KILN_WGMMA_R10(1), KILN_WGMMA_R10(2), KILN_WGMMA_R2X(3)
#define KILN_WGMMA_S64                                                                    \
  KILN_WGMMA_S10() "," KILN_WGMMA_S10(1) "," KILN_WGMMA_S10(2) "," KILN_WGMMA_S10(3) "," \
  KILN_WGMMA_S10(4) "," KILN_WGMMA_S10(5) "," KILN_WGMMA_S4(6)
#define KILN_WGMMA_R64                                                                 \
  KILN_WGMMA_R10(), KILN_WGMMA_R10(1), KILN_WGMMA_R10(2), KILN_WGMMA_R10(3),           \
      KILN_WGMMA_R10(4), KILN_WGMMA_R10(5), KILN_WGMMA_R4(6)
#define KILN_WGMMA_S128                                                                     \
  KILN_WGMMA_S10() "," KILN_WGMMA_S10(1) "," KILN_WGMMA_S10(2) "," KILN_WGMMA_S10(3) ","   \
  KILN_WGMMA_S10(4) "," KILN_WGMMA_S10(5) "," KILN_WGMMA_S10(6) "," KILN_WGMMA_S10(7) ","  \
  KILN_WGMMA_S10(8) "," KILN_WGMMA_S10(9) "," KILN_WGMMA_S10(10) "," KILN_WGMMA_S10(11) "," \
  KILN_WGMMA_S8(12)
#define KILN_WGMMA_R128                                                                       \
  KILN_WGMMA_R10(), KILN_WGMMA_R10(1), KILN_WGMMA_R10(2), KILN_WGMMA_R10(3), KILN_WGMMA_R10(4), \
      KILN_WGMMA_R10(5), KILN_WGMMA_R10(6), KILN_WGMMA_R10(7), KILN_WGMMA_R10(8),              \
      KILN_WGMMA_R10(9), KILN_WGMMA_R10(10), KILN_WGMMA_R10(11), KILN_WGMMA_R8(12)
// One wgmma.mma_async: REGS the register list, then the operands numbered A (desc_a), B
// (desc_b) and S (scale-d, from `accumulate` through a predicate); imm-scale-a/b 1, trans 0.
#define KILN_WGMMA_ASM(SHAPE, TYPE, REGS, OPERANDS, A, B, S)                                 \
  asm volatile(                                                                              \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %" S ", 0;\n"                                        \
      "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE " {" REGS "}, %" A ", %" B \
      ", p, 1, 1, 0, 0;\n}\n"                                                                \
      : OPERANDS                                                                             \
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)))

template <int BN, typename E>
struct Wgmma;
template <typename E>
struct Wgmma<64, E> {
  __device__ static void run(float (&d)[32], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
    if constexpr (std::is_same_v<E, __nv_bfloat16>)
      KILN_WGMMA_ASM("m64n64k16", "bf16", KILN_WGMMA_S32, KILN_WGMMA_R32, "32", "33", "34");
    else
      KILN_WGMMA_ASM("m64n64k16", "f16", KILN_WGMMA_S32, KILN_WGMMA_R32, "32", "33", "34");
  }
};
template <typename E>
struct Wgmma<128, E> {
  __device__ static void run(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
    if constexpr (std::is_same_v<E, __nv_bfloat16>)
      KILN_WGMMA_ASM("m64n128k16", "bf16", KILN_WGMMA_S64, KILN_WGMMA_R64, "64", "65", "66");
    else
      KILN_WGMMA_ASM("m64n128k16", "f16", KILN_WGMMA_S64, KILN_WGMMA_R64, "64", "65", "66");
  }
};
template <typename E>
struct Wgmma<256, E> {
  __device__ static void run(float (&d)[128], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
    if constexpr (std::is_same_v<E, __nv_bfloat16>)
      KILN_WGMMA_ASM("m64n256k16", "bf16", KILN_WGMMA_S128, KILN_WGMMA_R128, "128", "129", "130");
    else
      KILN_WGMMA_ASM("m64n256k16", "f16", KILN_WGMMA_S128, KILN_WGMMA_R128, "128", "129", "130");
  }
};
}  // namespace detail
#undef KILN_WGMMA_S
#undef KILN_WGMMA_R
#undef KILN_WGMMA_S10
#undef KILN_WGMMA_R10
#undef KILN_WGMMA_S4
#undef KILN_WGMMA_R4
#undef KILN_WGMMA_S8
#undef KILN_WGMMA_R8
#undef KILN_WGMMA_S2X
#undef KILN_WGMMA_R2X
#undef KILN_WGMMA_S32
#undef KILN_WGMMA_R32
#undef KILN_WGMMA_S64
#undef KILN_WGMMA_R64
#undef KILN_WGMMA_S128
#undef KILN_WGMMA_R128
#undef KILN_WGMMA_ASM
#endif

// D (64 x BN, f32) = A (64 x 16) * B (16 x BN) + (accumulate ? D : 0), A and B K-major in shared
// memory (desc_a: 64 rows of 16 k; desc_b: BN rows of 16 k). All 128 threads of an aligned
// warpgroup call it together; thread t (warp w = t/32, lane l = t%32) holds in d[i] the element
//   row = 16 w + l/4 + 8 ((i/2) % 2),   col = 8 (i/4) + 2 (l%4) + (i%2).
template <int BN, typename E>
__device__ inline void wgmma_m64k16(float (&d)[BN / 2], uint64_t desc_a, uint64_t desc_b,
                                    bool accumulate) {
  static_assert(BN == 64 || BN == 128 || BN == 256, "wgmma_m64k16: BN is 64, 128 or 256");
  static_assert(std::is_same_v<E, __nv_bfloat16> || std::is_same_v<E, __half>,
                "wgmma_m64k16: the operands are __nv_bfloat16 or __half");
#if KILN_CUDA_SIM
  ::kiln::sim::sm90::wgmma_mma_async(d, BN, std::is_same_v<E, __nv_bfloat16>, desc_a, desc_b,
                                     accumulate);
#elif KILN_SM90A_PTX
  detail::Wgmma<BN, E>::run(d, desc_a, desc_b, accumulate);
#else
  (void)d, (void)desc_a, (void)desc_b, (void)accumulate;
  __trap();
#endif
}

// Warp-specialised kernels move registers between warpgroups: a producer gives some back
// (dec), the consumers take them (inc). Regs: the new per-thread limit, a multiple of 8 in
// [24, 256]; all threads of the warpgroup call it.
template <int Regs>
__device__ inline void setmaxnreg_inc() {
  static_assert(Regs % 8 == 0 && Regs >= 24 && Regs <= 256, "setmaxnreg: Regs is 24..256, by 8");
#if KILN_CUDA_SIM
  ::kiln::sim::sm90::setmaxnreg(true, Regs);
#elif KILN_SM90A_PTX
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs));
#else
  __trap();
#endif
}
template <int Regs>
__device__ inline void setmaxnreg_dec() {
  static_assert(Regs % 8 == 0 && Regs >= 24 && Regs <= 256, "setmaxnreg: Regs is 24..256, by 8");
#if KILN_CUDA_SIM
  ::kiln::sim::sm90::setmaxnreg(false, Regs);
#elif KILN_SM90A_PTX
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs));
#else
  __trap();
#endif
}

}  // namespace kiln::cuda::sm90
