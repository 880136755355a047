// sim/scheduler.h: runs one thread block on the calling OS thread (internal; scheduler.cpp).
// The block's threads progress as the Programming Guide's "SIMT Architecture" allows
// (https://docs.nvidia.com/cuda/cuda-c-programming-guide/#simt-architecture).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/cuda/sim/launch.h"

namespace kiln::sim {

// Runs block `block_idx` of `launch` to completion: every thread of the block as a fiber.
// shuffle_seed = 0 runs the fibers in order between barriers; any other value shuffles them
// (reproducibly for one seed). Throws kiln::Error if the block's threads diverge on a barrier
// or the kernel throws.
void run_block(const KernelLaunch& launch, uint3 block_idx, uint64_t shuffle_seed);

// The most shared memory (static + dynamic) a block of `kernel` may use: 48 KiB, or what
// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, n) set (grid.cpp).
size_t shared_memory_limit(const void* kernel);

// True while the calling code runs inside a simulated GPU thread (a kernel body).
bool inside_kernel();

namespace detail {
// Simulator parts with state of their own per block (sim/sm90_wgmma.cpp, the warpgroup MMA's
// pending operations; sim/sm90_setmaxnreg.cpp, the register pool): block_start(threads) runs
// on the OS thread at every block start, before any of the block's threads; thread_exit() (may
// be null) runs in each fiber when its kernel body returns, and what it throws is that
// thread's kernel fault. Registered once, before any launch.
struct BlockHooks {
  void (*block_start)(unsigned threads);
  void (*thread_exit)();
};
void add_block_hooks(BlockHooks hooks);
}  // namespace detail

// For primitives whose waits are polls of a condition another thread of the block sets (the
// Hopper mbarriers, sim/sm90_mbarrier.cpp; wgmma groups, sim/sm90_wgmma.cpp; setmaxnreg's
// register pool, sim/sm90_setmaxnreg.cpp):
//   poll_yield     suspends the calling GPU thread until the block's other threads have had a
//                  turn. If two rounds of the block in a row change nothing (no arrival, no
//                  barrier or warp operation reached, no exit, no note_progress), no thread
//                  can ever make progress: the launch fails with a deadlock naming what a
//                  poller waits on, `describe(object)`.
//   note_progress  tells the scheduler the state a poller may wait on has changed.
//   in_shared_memory  true when [p, p + bytes) lies in the running block's shared memory
//                  (dynamic, or a KILN_SHARED variable's arena).
void poll_yield(const void* object, std::string (*describe)(const void*));
void note_progress();
bool in_shared_memory(const void* p, size_t bytes);

}  // namespace kiln::sim
