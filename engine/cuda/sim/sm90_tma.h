// sim/sm90_tma.h: the CUDA simulator's Tensor Memory Accelerator, the simulated side of
// engine/cuda/sm90/tma.h (docs/cuda_simulator.md, "Hopper: mbarriers and the TMA"): the tensor
// map type of <cuda.h>, its encoder (the rules of the CUDA Driver API's
// cuTensorMapEncodeTiled, https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__TENSOR__MEMORY.html)
// and the 2-D tiled load (PTX ISA, cp.async.bulk.tensor,
// https://docs.nvidia.com/cuda/parallel-thread-execution/#data-movement-and-conversion-instructions-cp-async-bulk-tensor).
//
// The load is asynchronous, as on a GPU: at issue the destination box is filled with NaN bytes
// (0xFF) and the copy, read from global memory now, is recorded on the mbarrier; it lands
// (swizzled, out-of-bounds elements zero) and completes its transaction bytes only when a
// thread next tests that barrier (sim/sm90_mbarrier.h). A kernel that reads the box without
// waiting for the phase reads NaN.
#pragma once

#include <cstdint>

#include "engine/cuda/sm90/swizzle.h"

// <cuda.h>'s opaque tensor map: 128 bytes, 64-byte aligned. The simulator keeps its encoded
// fields (and a tag that tells a map from random bytes) in the opaque words.
struct alignas(64) CUtensorMap {
  unsigned long long opaque[16];
};

namespace kiln::sim::sm90 {

// A 2-D tiled map of `elem_bytes`-byte elements: rows x cols, row-major with a row stride of
// row_stride_bytes, boxes of box_rows x box_cols. Throws kiln::Error (Usage) naming the broken
// rule of cuTensorMapEncodeTiled.
void encode_tiled_2d(CUtensorMap* map, const void* base, uint64_t rows, uint64_t cols,
                     uint64_t row_stride_bytes, uint32_t box_rows, uint32_t box_cols,
                     uint32_t elem_bytes, ::kiln::cuda::sm90::Swizzle swizzle);

// One thread issues the load of the box whose top-left element is (row, col) into `dst`
// (shared memory), completing box bytes of transactions on the mbarrier `bar`. A fault of the
// running kernel names the broken rule (map, alignment, shared memory, barrier).
void tma_load_2d(void* dst, const CUtensorMap* map, int32_t row, int32_t col, void* bar);

}  // namespace kiln::sim::sm90
