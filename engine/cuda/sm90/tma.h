// sm90/tma.h: Hopper's Tensor Memory Accelerator (TMA): one thread copies a whole 2-D box of a
// global tensor into shared memory, asynchronously, completing the bytes on an mbarrier
// (sm90/mbarrier.h), and swizzling it (sm90/swizzle.h) the way wgmma reads it.
//
// The host describes the tensor once in a tensor map (CUDA Driver API, cuTensorMapEncodeTiled,
// https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__TENSOR__MEMORY.html); the kernel
// takes it by value as `const __grid_constant__ CUtensorMap map` and passes &map. The copy is
// PTX's cp.async.bulk.tensor (PTX ISA, "cp.async.bulk.tensor",
// https://docs.nvidia.com/cuda/parallel-thread-execution/#data-movement-and-conversion-instructions-cp-async-bulk-tensor):
//
//   if (threadIdx.x == 0) {
//     mbarrier_arrive_expect_tx(&full, box_rows * box_cols * 2);
//     tma_load_2d(tile, &map, row, col, &full);
//   }
//   mbarrier_wait(&full, phase);   // only now is `tile` valid
//
// Under nvcc CUtensorMap comes from <cuda.h> and encode_tma_2d (sm90/tensor_map.cpp) calls
// the driver's encoder; under the simulator both are engine/cuda/sim/sm90_tma.h's, which models
// the copy's asynchrony (the box reads NaN until the phase completes) and checks the rules.
#pragma once

#include <cstdint>

#include "engine/cuda/runtime.h"
#include "engine/cuda/sm90/mbarrier.h"
#include "engine/cuda/sm90/swizzle.h"

#if KILN_CUDA_SIM
#include "engine/cuda/sim/sm90_tma.h"
#else
#include <cuda.h>
#endif

namespace kiln::cuda::sm90 {

// Host: `map` describes a rows x cols row-major tensor of 16-bit elements at `base` (rows
// row_stride_bytes apart) read in boxes of box_rows x box_cols, stored swizzled by `swizzle`.
// Throws kiln::Error (Usage) naming the broken rule: base not 16-byte aligned, a stride not a
// multiple of 16 (or >= 2^40), a box dimension 0 or > 256, the box's inner bytes not a multiple
// of 16 or larger than the swizzle row (swizzle_row_bytes).
#if KILN_CUDA_SIM
inline void encode_tma_2d(CUtensorMap* map, const void* base, uint64_t rows, uint64_t cols,
                          uint64_t row_stride_bytes, uint32_t box_rows, uint32_t box_cols,
                          Swizzle swizzle) {
  ::kiln::sim::sm90::encode_tiled_2d(map, base, rows, cols, row_stride_bytes, box_rows, box_cols,
                                     2, swizzle);
}
#else
void encode_tma_2d(CUtensorMap* map, const void* base, uint64_t rows, uint64_t cols,
                   uint64_t row_stride_bytes, uint32_t box_rows, uint32_t box_cols,
                   Swizzle swizzle);
#endif

// Device, one thread: starts copying the box whose top-left element is (row, col) into
// smem_dst (aligned to 128 bytes and to the swizzle atom, swizzle_atom_bytes), completing
// box_rows * box_cols * 2 transaction bytes on `bar`. Elements outside the tensor are written
// as zero.
__device__ __forceinline__ void tma_load_2d(void* smem_dst, const CUtensorMap* map, int32_t row,
                                            int32_t col, Mbarrier* bar) {
#if KILN_CUDA_SIM
  ::kiln::sim::sm90::tma_load_2d(smem_dst, map, row, col, bar);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Coordinates innermost first: {column, row}.
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(detail::shared_address(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(detail::shared_address(bar))
      : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#else
  (void)smem_dst;
  (void)map;
  (void)row;
  (void)col;
  (void)bar;
#endif
}

// Orders this thread's earlier generic-proxy writes to shared memory before later async-proxy
// accesses (a TMA store, wgmma's operand reads). The simulator has one proxy: nothing to do.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if !KILN_CUDA_SIM && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#elif !KILN_CUDA_SIM && defined(__CUDA_ARCH__)
  __trap();
#endif
}

}  // namespace kiln::cuda::sm90
