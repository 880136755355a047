// tensor_copy.cpp: the copies between host and device and between devices (rules: tensor_copy.h).
#include "engine/cuda/tensor_copy.h"

#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/cuda/kernels/copy.h"
#include "engine/cuda/pinned_allocator.h"
#include "engine/cuda/sync_calls.h"
#include "engine/error.h"

namespace kiln::cuda {
namespace {

void* storage_base(const Tensor& t) { return t.impl()->storage->data; }

// A device buffer shaped like `like` but of `dtype` on `device`, for a conversion on the way.
// It comes from the caching allocator on the current stream and goes back to it when the copy
// function returns, which is safe before the queued work has run: the block is only reused by
// later work on the same stream (see caching_allocator.h).
Tensor staging(const Tensor& like, DType dtype, Device device) {
  return Tensor::empty(like.shape(), dtype, device);
}

// Finishes a host <-> device copy queued on `stream`: either waits for it (checked by the sync
// debug mode before the copy was queued: copy_checked), or (asynchronous) keeps the pinned host
// block from being reused until the copy is done.
void finish_host_copy(const Tensor& host, cudaStream_t stream, bool async, SyncSite site) {
  if (async) {
    pinned_allocator::record_stream(storage_base(host), stream);
  } else {
    stream_synchronize(stream, site);
  }
}

// A copy that will block is checked by the sync debug mode before anything is queued: in error
// mode it throws with nothing in flight that reads or writes the host buffer.
SyncSite copy_checked(SyncSite site, bool async, bool to_device, bool pinned) {
  if (async) return site;
  const char* how = to_device ? (pinned ? "a blocking host->device copy from pinned memory"
                                        : "a blocking host->device copy from pageable memory")
                              : (pinned ? "a blocking device->host copy into pinned memory"
                                        : "a blocking device->host copy");
  site = site.waiting_by(how);
  check_sync(site);
  return site.after_check();
}

void host_to_device(const Tensor& dst, const Tensor& src, bool non_blocking, SyncSite site) {
  DeviceGuard guard(dst.device().index);
  cudaStream_t stream = current_stream();
  const bool async = non_blocking && src.is_pinned();
  site = copy_checked(site, async, /*to_device=*/true, src.is_pinned());
  const bool same = src.dtype() == dst.dtype();
  const Tensor landing = same ? dst : staging(src, src.dtype(), dst.device());
  KILN_CUDA_CHECK(cudaMemcpyAsync(landing.raw_data(), src.raw_data(), src.nbytes(),
                                  cudaMemcpyHostToDevice, stream));
  if (!same) convert(landing.raw_data(), src.dtype(), dst.raw_data(), dst.dtype(), dst.numel());
  finish_host_copy(src, stream, async, site);
}

void device_to_host(const Tensor& dst, const Tensor& src, bool non_blocking, SyncSite site) {
  DeviceGuard guard(src.device().index);
  cudaStream_t stream = current_stream();
  const bool async = non_blocking && dst.is_pinned();
  site = copy_checked(site, async, /*to_device=*/false, dst.is_pinned());
  const bool same = src.dtype() == dst.dtype();
  const Tensor converted = same ? src : staging(src, dst.dtype(), src.device());
  if (!same) convert(src.raw_data(), src.dtype(), converted.raw_data(), dst.dtype(), src.numel());
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), converted.raw_data(), dst.nbytes(),
                                  cudaMemcpyDeviceToHost, stream));
  finish_host_copy(dst, stream, async, site);
}

void device_to_device(const Tensor& dst, const Tensor& src) {
  const int src_device = src.device().index, dst_device = dst.device().index;
  if (src_device == dst_device) {
    DeviceGuard guard(dst_device);
    convert(src.raw_data(), src.dtype(), dst.raw_data(), dst.dtype(), dst.numel());
    return;
  }
  cudaStream_t src_stream = current_stream(src_device);
  cudaStream_t dst_stream = current_stream(dst_device);
  {  // The copy starts after the work queued so far on the source's stream (which wrote src).
    DeviceGuard guard(src_device);
    Event src_ready;
    src_ready.record(src_stream);
    src_ready.wait(dst_stream);
  }
  DeviceGuard guard(dst_device);
  const bool same = src.dtype() == dst.dtype();
  const Tensor landing = same ? dst : staging(src, src.dtype(), dst.device());
  KILN_CUDA_CHECK(cudaMemcpyPeerAsync(landing.raw_data(), dst_device, src.raw_data(), src_device,
                                      src.nbytes(), dst_stream));
  // The source's block returns to the source stream's free list when src is freed; work on that
  // stream must not overwrite it before the copy has read it.
  Event copied;
  copied.record(dst_stream);
  copied.wait(src_stream);
  if (!same) convert(landing.raw_data(), src.dtype(), dst.raw_data(), dst.dtype(), dst.numel());
}

}  // namespace

void copy_tensor(const Tensor& dst, const Tensor& src, bool non_blocking, SyncSite site) {
  KILN_CHECK(dst.numel() == src.numel(), "copy_: source ", src.str(), " does not match ",
             dst.str());
  if (dst.numel() == 0) return;
  const bool from_device = src.device().is_cuda(), to_device = dst.device().is_cuda();
  KILN_CHECK(from_device || to_device, "cuda::copy_tensor: neither ", src.str(), " nor ",
             dst.str(), " is on a CUDA device");
  if (from_device && to_device) return device_to_device(dst, src);
  if (to_device) return host_to_device(dst, src, non_blocking, site);
  device_to_host(dst, src, non_blocking, site);
}

}  // namespace kiln::cuda
