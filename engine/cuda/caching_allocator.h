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
//   5. Private pools, for CUDA graph capture (PyTorch's "graph-private memory pools": the "CUDA
//      Graphs" section of https://pytorch.org/docs/stable/notes/cuda.html). A captured graph
//      has its kernels' pointers baked in, so every block its work uses must keep its address
//      and hold no one else's data for as long as the graph may be replayed. Between
//      begin_allocate_to_pool(device, pool, stream) and end_allocate_to_pool(device, pool),
//      allocations on `stream` (the capturing stream; a side stream forked into the capture is
//      routed with a second begin call) come from the pool: its own free lists, per stream as
//      in point 2, filled by cudaMalloc and by the frees of its own blocks. A block freed during
//      the capture is reused later in the same capture exactly as the eager allocator would
//      reuse it, so a captured step needs the memory an eager step needs. Keyed by stream, not
//      by thread: capture records work by stream, and another stream of the same thread (a
//      copy stream outside the capture) must keep eager memory. A pool's block, freed at any
//      time (an output tensor freed after the capture), goes back to the pool, and nothing
//      else ever gets it while the pool lives: not eager code, not another pool, not
//      release_cached(), not the out-of-memory retry. release_pool() (when the graph is
//      destroyed) returns its cached blocks to the driver; its blocks still held by tensors
//      are returned by release_cached() once freed (never to eager code: a replay on a stream
//      the allocator does not know may still read them, and cudaFree waits for it).
//      While any capture is underway (a pool is being allocated to) the allocator makes no call
//      that a capture forbids (the CUDA Runtime API, cudaStreamBeginCapture and
//      cudaThreadExchangeStreamCaptureMode): it polls no event (cudaEventQuery) and records
//      none, deferring the frees of point 3 until the capture ends; it frees nothing, so the
//      out-of-memory retry of point 4 is skipped and release_cached() is an error. Its
//      cudaMalloc runs with the thread's capture mode set to relaxed: the allocation is not
//      part of the graph and is not replayed, it is the pool's for the graph's whole life,
//      which is what a graph needs (PyTorch's allocator also calls cudaMalloc during capture).
// Statistics per device (kiln::MemoryStats): current = bytes of blocks in use (rounded sizes),
// peak = high-water mark of current, reserved = bytes held from the driver (in use + cached),
// os_allocs = number of cudaMalloc calls; a private pool's blocks count like any other.
// Thread-safe (one mutex).
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/allocator.h"
#include "engine/cuda/runtime.h"
#include "engine/cuda/sync_debug.h"  // SyncSite

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
// cudaFree every cached block of the device, but a live private pool's (point 5). An error
// during a capture (cudaFree would invalidate it).
void release_cached(int device);
void release_cached();  // ... of every device

size_t round_size(size_t bytes);  // the size a request is rounded to (point 1)

// Private pools (point 5). A pool is named by a PoolId (never 0) and used on one device.
using PoolId = uint64_t;
PoolId create_pool();
// From now on allocations on `stream` (a stream of cuda:`device`) come from `pool`, until
// end_allocate_to_pool. A stream allocates to one pool at a time; a released pool cannot be
// used again. A pool may take a second capture (graphs that replay one after the other in
// stream order may share one): its blocks freed since are reused.
void begin_allocate_to_pool(int device, PoolId pool, cudaStream_t stream);
void end_allocate_to_pool(int device, PoolId pool);  // every stream allocating to `pool`
// Ends the pool: its cached blocks go back to the driver (cudaFree: waits for the device,
// reported by KILN_SYNC_DEBUG; while another capture is underway they wait for the next
// release_cached() instead), its blocks in use when they are freed. Not while allocating to it.
void release_pool(int device, PoolId pool, cuda::SyncSite site = cuda::SyncSite());
// True while some stream, of any device, allocates to a pool (a capture is underway).
bool capture_underway();

}  // namespace kiln::cuda_allocator
