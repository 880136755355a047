// tensor_copy.h: Tensor::copy_ when either side is on a CUDA device.
//
// The rules (they are also what Tensor::to(device, non_blocking) does):
//   host -> device   Queued on the destination device's current_stream(). Asynchronous only
//                    when non_blocking is true AND the host tensor is pinned
//                    (Tensor::pin_memory()); otherwise copy_ returns once the copy is done.
//   device -> host   Queued on the source device's current_stream(), after the kernels that
//                    produced the source. Asynchronous only when non_blocking is true AND the
//                    host tensor is pinned: read it after an Event or cuda::synchronize().
//                    Otherwise copy_ returns with the data on the host.
//   device -> device Never blocks the host (non_blocking does not matter): on one device a
//                    stream-ordered copy; across devices (cuda:0 -> cuda:1) cudaMemcpyPeerAsync
//                    on the destination's stream, ordered after the work queued so far on both
//                    devices' streams with events, and the source device's stream waits for
//                    the copy before it can reuse the source's memory.
//   dtype conversion always runs on a GPU (kernels/copy.cu): after the transfer for
//                    host -> device (so u8 images cross the bus as bytes), before it for
//                    device -> host, on the destination device for device -> device.
// Why only pinned memory is ever asynchronous: a copy from pageable memory cannot overlap the
// host anyway, and returning early would let the caller free or overwrite a buffer the GPU is
// still reading. Pinned blocks used by an asynchronous copy are not reused before the copy has
// finished (pinned_allocator::record_stream), even if the tensor is freed at once.
#pragma once

#include "engine/cuda/sync_debug.h"
#include "engine/tensor.h"

namespace kiln::cuda {

// dst and src have the same number of elements; at least one is on a CUDA device. A copy that
// blocks (the rules above) is a wait the sync debug mode reports at `site` (sync_debug.h).
void copy_tensor(const Tensor& dst, const Tensor& src, bool non_blocking,
                 SyncSite site = SyncSite());

}  // namespace kiln::cuda
