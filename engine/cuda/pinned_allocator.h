// pinned_allocator.h: page-locked ("pinned") host memory, kept and reused.
//
// Why pinned memory: the GPU's copy engines can only DMA from memory the OS will not page out.
// A copy from ordinary (pageable) memory is staged through a driver buffer and cannot overlap
// with the host; a copy from pinned memory runs at full bus speed and can be asynchronous
// (cudaMemcpyAsync returns at once), so a loader can copy the next batch while the GPU
// computes. Tensor::pin_memory() allocates here.
//
// Why a pool: cudaHostAlloc is very slow (it locks every page of the buffer, often
// milliseconds) and a loader pins the same batch sizes over and over. Sizes are rounded to the
// 4 KiB page; the free lists are keyed by that rounded size (a request takes a cached block of
// exactly its size). Blocks are never returned to the OS until release_cached().
//
// Reuse must wait for the device: after an asynchronous copy from or into a pinned block, the
// copy may still be running when the host frees the tensor. record_stream(ptr, stream), called
// right after queuing the copy, records an event on the stream; a freed block goes back to its
// free list only once its events have completed (checked when memory is requested).
//
// Under UVA (every 64-bit platform) pinned memory is usable from every device, so one pool
// serves cuda:0 and cuda:1. Statistics: current/peak/reserved bytes, os_allocs = number of
// cudaHostAlloc calls. Thread-safe (one mutex).
#pragma once

#include <cstddef>

#include "engine/allocator.h"
#include "engine/cuda/runtime.h"

namespace kiln::pinned_allocator {

void* allocate(size_t bytes);  // never returns null; throws kiln::Error when pinning fails
void deallocate(void* ptr);
// Queued work on `stream` reads or writes the block starting at `ptr` (a pointer from
// allocate()): the block is not handed out again before that work has completed. Call it with
// the stream's device current.
void record_stream(void* ptr, cudaStream_t stream);
bool owns(const void* ptr);  // whether ptr is the start of a block from this pool

MemoryStats stats();
void reset_peak();
void release_cached();  // cudaFreeHost every cached block (waiting for pending ones)

size_t round_size(size_t bytes);

}  // namespace kiln::pinned_allocator
