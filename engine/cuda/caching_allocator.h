// caching_allocator.h: device memory for tensors on cuda:N, kept and reused.
//
// Why cache: cudaMalloc and cudaFree are slow (cudaFree also waits for the whole device to go
// idle), and a training step allocates the same sizes every iteration. So a freed block is not
// returned to the driver but kept on a free list, and the next request of that size takes it.
//
// The scheme (simpler than PyTorch's: blocks are never split or merged):
//   1. Sizes are rounded so that nearby requests share blocks: up to 1 MiB to a multiple of
//      512 B; above, to a multiple of 2 MiB (the driver maps device memory in 2 MiB pages, so a
//      1.1 MiB cudaMalloc occupies 2 MiB anyway). A request takes a cached block of exactly its
//      rounded size.
//   2. A block belongs to the stream it was allocated on, and when freed it goes back to that
//      stream's free list: free lists are per (device, stream). Why: when the host frees a
//      tensor, kernels that read it may still be queued on its stream. Any later work on the
//      SAME stream runs after them (a stream is a queue), so handing the block to the next
//      allocation on that stream is safe with no synchronisation at all. Another stream gives
//      no such order, so it never gets the block.
//   3. A block used on a second stream (a copy stream, another thread's stream) must be told so
//      with record_stream(); when freed, it returns to its free list only after the work queued
//      on those streams up to the free has completed (an event per stream, polled on allocate).
//   4. When cudaMalloc fails, every cached block of the device is released (cudaFree) and the
//      allocation is tried once more; if it fails again, the error prints the request and the
//      device's statistics and says what to do.
// Statistics per device (kiln::MemoryStats): current = bytes of blocks in use (rounded sizes),
// peak = high-water mark of current, reserved = bytes held from the driver (in use + cached),
// os_allocs = number of cudaMalloc calls. Thread-safe (one mutex).
#pragma once

#include <cstddef>

#include "engine/allocator.h"
#include "engine/cuda/runtime.h"

namespace kiln::cuda_allocator {

// A block of at least `bytes` on cuda:`device`, for use on `stream` (default: this thread's
// current_stream(device)). Never returns null (0 bytes still gets a block); throws kiln::Error
// when the device is out of memory.
void* allocate(size_t bytes, int device);
void* allocate(size_t bytes, int device, cudaStream_t stream);
// Returns a block from allocate() to its stream's free list.
void deallocate(void* ptr);
// Declares that work on `stream` (not the block's own stream) uses the block: see point 3.
void record_stream(void* ptr, cudaStream_t stream);

MemoryStats stats(int device);
void reset_peak(int device);      // peak := current
void release_cached(int device);  // cudaFree every cached block of the device
void release_cached();            // ... of every device

size_t round_size(size_t bytes);  // the size a request is rounded to (point 1)

}  // namespace kiln::cuda_allocator
