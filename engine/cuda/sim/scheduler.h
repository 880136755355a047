// sim/scheduler.h: runs one thread block on the calling OS thread (internal; scheduler.cpp).
// The block's threads progress as the Programming Guide's "SIMT Architecture" allows
// (https://docs.nvidia.com/cuda/cuda-c-programming-guide/#simt-architecture).
#pragma once

#include <cstddef>
#include <cstdint>

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
// pending operations): block_start(threads) runs on the OS thread at every block start, before
// any of the block's threads; thread_exit() runs in each fiber when its kernel body returns,
// and what it throws is that thread's kernel fault. Registered once, before any launch.
struct BlockHooks {
  void (*block_start)(unsigned threads);
  void (*thread_exit)();
};
void add_block_hooks(BlockHooks hooks);
}  // namespace detail

}  // namespace kiln::sim
