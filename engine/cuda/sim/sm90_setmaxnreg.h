// sim/sm90_setmaxnreg.h: the simulator's register pool behind setmaxnreg (internal; called by
// setmaxnreg in sim/sm90_wgmma.cpp after its checks). The model, after the PTX ISA's
// "setmaxnreg" (https://docs.nvidia.com/cuda/parallel-thread-execution/#miscellaneous-instructions-setmaxnreg):
//   - a block owns 65536 registers; each warpgroup starts at the launch's per-thread limit,
//     65536 / (threads rounded up to 128), rounded down to a multiple of 8, at most 248, and
//     the registers no warpgroup holds are the block's free pool;
//   - .dec to r needs r <= the warpgroup's current count and returns (current - r) * 128
//     registers to the pool; .inc to r needs r >= current and takes (r - current) * 128,
//     waiting (poll_yield) while the pool lacks them, as a GPU blocks there: an .inc that can
//     never be met ends as the scheduler's deadlock, naming setmaxnreg;
//   - the instruction is warpgroup-wide: the first thread of the warpgroup to reach its k-th
//     setmaxnreg applies it, the others find it applied (sim/sm90_wgmma.cpp's call hashes check
//     that all 128 threads made the same calls).
#pragma once

namespace kiln::sim::sm90 {

// The calling thread's warpgroup sets its per-thread register count to `regs` (a multiple of 8
// in [24, 256], checked by the caller).
void change_register_limit(bool increase, int regs);

}  // namespace kiln::sim::sm90
