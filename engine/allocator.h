// allocator.h: the CPU allocator. 64-byte aligned blocks, kept and reused.
//
// Why keep blocks: glibc returns every large buffer to the OS (munmap) on free and the next
// training step page-faults it back in, one 4 KiB page at a time. A training step allocates
// the same sizes every iteration, so a free list keyed by size turns that into a lookup.
// This is the CPU twin of the CUDA caching allocator. Statistics feed `peak_memory_bytes`.
//
// Why the cache stays bounded over a long run (a training run's resident memory is flat from
// the second epoch on; the Allocator tests of tests/engine/tensor_test.cpp, tests/soak/):
//   - Blocks of 128 KiB and more are mmap'ed and munmap'ed by the pool itself, not taken from
//     malloc. glibc's malloc raises its mmap threshold to the size of every mmap'ed chunk it
//     frees (up to 32 MiB, mallopt(3) M_MMAP_THRESHOLD), so after release_cached() the next
//     epoch's activations came from the heap instead, and freeing them left ~200 MB of
//     fragmented heap that glibc never handed back: resident memory grew epoch after epoch.
//   - A request may take a cached block up to 1.5x its size: the smaller last batch of an
//     epoch (60,000 = 468 x 128 + 96) reuses the full batches' blocks instead of adding a
//     second set of every activation to the cache.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln {

// Shared by the three allocators: this CPU one, the CUDA caching allocator (per device,
// engine/cuda/caching_allocator.h) and the pinned host pool (engine/cuda/pinned_allocator.h).
// Sizes are the allocator's rounded sizes.
struct MemoryStats {
  int64_t current_bytes = 0;   // bytes handed out and not yet freed
  int64_t peak_bytes = 0;      // high-water mark of current_bytes
  int64_t reserved_bytes = 0;  // bytes held from the OS or driver (in use + cached)
  int64_t os_allocs = 0;       // real allocations: aligned_alloc, cudaMalloc or cudaHostAlloc
};

// The block size a caching allocator hands out for a request of `bytes`: rounded up to a
// multiple of small_step up to `threshold` bytes, of large_step above (0 bytes counts as 1, so
// every block has an address of its own). Rounding lets nearby sizes share cached blocks. The
// rule is shared by the three allocators; the steps are each one's own, chosen for its memory:
//   CPU (allocator.cpp)                 64 B (its alignment) up to 4 KiB, then 4 KiB pages
//   CUDA (cuda/caching_allocator.cpp)   512 B up to 1 MiB, then 2 MiB (the driver's device page)
//   pinned (cuda/pinned_allocator.cpp)  4 KiB pages throughout (page-locking works on pages)
inline size_t round_block_size(size_t bytes, size_t small_step, size_t threshold,
                               size_t large_step) {
  if (bytes == 0) bytes = 1;
  const size_t step = bytes <= threshold ? small_step : large_step;
  return (bytes + step - 1) / step * step;
}

// One pool serves every CPU "device" (cpu:0, cpu:1, ... are places for teaching model
// parallelism, not separate memories), but bytes are also counted per device index, so a
// pipeline stage on cpu:1 can report its own peak. The per-device stats have current and peak
// bytes; reserved bytes and OS allocations are the pool's, reported by stats().
namespace cpu_allocator {
void* allocate(size_t bytes, int device = 0);  // never null; throws kiln::Error on failure
void deallocate(void* ptr, size_t bytes, int device = 0);
MemoryStats stats();            // the whole pool
MemoryStats stats(int device);  // the bytes of cpu:device (current_bytes, peak_bytes)
void reset_peak();
void reset_peak(int device);
void release_cached();  // hand every cached block back to the OS (munmap or free)
}  // namespace cpu_allocator

}  // namespace kiln
