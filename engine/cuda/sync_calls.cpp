// sync_calls.cpp: the waiting CUDA runtime calls, each checked before it waits (sync_calls.h).
#include "engine/cuda/sync_calls.h"

#include <string>

#include "engine/cuda/check.h"

namespace kiln::cuda {
namespace {

// KILN_CUDA_CHECK, naming the caller's site rather than this file.
void check_result(cudaError_t err, const char* call, const SyncSite& site) {
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();  // clear the sticky-free error state
  throw_cuda_error(err, call, site.file, site.line);
}

}  // namespace

void stream_synchronize(cudaStream_t stream, SyncSite site) {
  if (!site.checked) check_sync(site.waiting_by("cudaStreamSynchronize"));
  check_result(cudaStreamSynchronize(stream), "cudaStreamSynchronize", site);
}

void event_synchronize(cudaEvent_t event, SyncSite site) {
  if (!site.checked) check_sync(site.waiting_by("cudaEventSynchronize"));
  check_result(cudaEventSynchronize(event), "cudaEventSynchronize", site);
}

void device_synchronize(SyncSite site) {
  if (!site.checked) check_sync(site.waiting_by("cudaDeviceSynchronize"));
  check_result(cudaDeviceSynchronize(), "cudaDeviceSynchronize", site);
}

void device_free(void* ptr, SyncSite site) {
  if (!site.checked) check_sync(site.waiting_by("cudaFree"));
  check_result(cudaFree(ptr), "cudaFree", site);
}

void host_free(void* ptr, SyncSite site) {
  if (!site.checked) check_sync(site.waiting_by("cudaFreeHost"));
  check_result(cudaFreeHost(ptr), "cudaFreeHost", site);
}

cudaError_t stream_synchronize_nothrow(cudaStream_t stream, SyncSite site) noexcept {
  if (!site.checked) check_sync_nothrow(site.waiting_by("cudaStreamSynchronize"));
  return cudaStreamSynchronize(stream);
}

}  // namespace kiln::cuda
