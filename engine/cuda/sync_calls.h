// sync_calls.h: the CUDA runtime calls that make the host wait for the device, each checked by
// the sync debug mode (sync_debug.h) before it waits. They are the only place in Kiln where
// these runtime calls are made (tests/engine/sync_calls_check_test.cpp fails on any other):
//
//   cudaStreamSynchronize   stream_synchronize        cuda::synchronize(), blocking copies
//   cudaEventSynchronize    event_synchronize         cuda::Event::synchronize()
//   cudaFree                device_free               the caching allocator's release_cached()
//   cudaFreeHost            host_free                 the pinned allocator's release_cached()
//   cudaDeviceSynchronize   device_synchronize
//
// cudaFree and cudaFreeHost synchronise with the device before they free (which is why caching
// allocators exist, PyTorch's and Kiln's: caching_allocator.h, pinned_allocator.h).
// A failed call throws kiln::Error naming the call and the caller's site, like KILN_CUDA_CHECK.
// stream_synchronize_nothrow is for destructors and cleanup paths: it never throws (in error
// mode the report is printed instead, see sync_debug.h) and returns the runtime's error.
//
// Only a build with a CUDA backend has this header's functions.
#pragma once

#include "engine/cuda/runtime.h"
#include "engine/cuda/sync_debug.h"

namespace kiln::cuda {

void stream_synchronize(cudaStream_t stream, SyncSite site = SyncSite());
void event_synchronize(cudaEvent_t event, SyncSite site = SyncSite());
void device_synchronize(SyncSite site = SyncSite());
void device_free(void* ptr, SyncSite site = SyncSite());
void host_free(void* ptr, SyncSite site = SyncSite());

cudaError_t stream_synchronize_nothrow(cudaStream_t stream, SyncSite site = SyncSite()) noexcept;

}  // namespace kiln::cuda
