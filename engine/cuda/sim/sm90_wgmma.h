// sim/sm90_wgmma.h: the CUDA simulator's warpgroup MMA (Hopper's wgmma.mma_async), behind the
// simulator face of engine/cuda/sm90/wgmma.h. The model (sm90_wgmma.cpp; docs/cuda_simulator.md,
// "Hopper: warpgroup MMA"), after the PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-
// Accumulate Instructions"
// (https://docs.nvidia.com/cuda/parallel-thread-execution/#asynchronous-warpgroup-level-matrix-instructions):
//   - shared addresses: a descriptor's start address is the byte offset within the block's
//     dynamic shared memory (its only window here), which the simulator allocates 1024-byte
//     aligned, so swizzling on offset bits is swizzling on address bits;
//   - mma_async records the operation and fills d with NaN: the accumulator is undefined until
//     wait_group. The warpgroup's first thread to issue an mma decodes the descriptors and
//     snapshots the operands for all 128; the others' issues must match it and record their d;
//   - commit_group closes a group (numbered per thread in commit order); a group completes
//     warpgroup-wide: the first wait_group(n) that must retire group g waits until all 128
//     threads of the warpgroup have committed g, then computes D for all of them from shared
//     memory as it is then (faulting if an operand changed since issue), so every later wait
//     of the warpgroup finds g done, as on a GPU; a thread's d receives its share at its own
//     wait that retires g;
//   - setmaxnreg moves registers between the block's warpgroups through a pool of 65536
//     (sim/sm90_setmaxnreg.h): .inc waits while the pool lacks them;
//   - the rules (fence before mma_async, whole warpgroups, descriptors inside shared memory,
//     swizzled operands on their atom, nothing pending at exit) are kernel faults.
#pragma once

#include <cstdint>

namespace kiln::sim::sm90 {

// Descriptor fields (sm90/wgmma.h make_smem_desc): the 2-bit swizzle code of bits 62-63
// (0 none, 1 128B, 2 64B, 3 32B), byte offsets multiples of 16.
uint64_t make_smem_desc(const void* smem, unsigned swizzle_code, uint32_t leading_byte_offset,
                        uint32_t stride_byte_offset);
void wgmma_fence();
void wgmma_commit_group();
void wgmma_wait_group(int n);
// d: the calling thread's bn / 2 accumulators; bf16: the operands are bf16 (else f16).
void wgmma_mma_async(float* d, int bn, bool bf16, uint64_t desc_a, uint64_t desc_b,
                     bool accumulate);
void setmaxnreg(bool increase, int regs);

}  // namespace kiln::sim::sm90
