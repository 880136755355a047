// sim/internal.h: what the simulator's .cpp files share with each other (not for kernels).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "engine/cuda/sim/runtime.h"

namespace kiln::sim {

// ---- Configuration (env, read once; a few can be changed by tests through api.h) -----------
int configured_device_count();          // KILN_SIM_DEVICES, default 2
size_t env_size(const char* name, size_t fallback);  // a non-negative integer from env

// ---- Errors (device.cpp) ------------------------------------------------------------------
// record_error (api.h) sets the calling thread's last error and returns it: `return fail(x);`.
inline cudaError_t fail(cudaError_t error) { return record_error(error); }

// ---- Devices and streams (device.cpp) -----------------------------------------------------
int current_device();                   // this host thread's device (cudaSetDevice)
bool valid_device(int device);          // 0 <= device < count
// The device a stream belongs to (nullptr: the current device's legacy stream). False for a
// handle that was never created or was destroyed.
bool stream_device(cudaStream_t stream, int* device);

// ---- Stream work (device.cpp) --------------------------------------------------------------
// Queues `work` on `stream` (nullptr: the current device's legacy default stream), as the
// GPU queues a kernel or a copy: it runs after everything submitted to that stream before it
// (and what the legacy stream's rules order before it), on the stream's own worker thread with
// the stream's device current, asynchronously to the calling host thread. An exception thrown
// by `work` is a device fault: it becomes the device's sticky error, returned (with its
// message in `fault_message()`) by the next synchronising call. `what` names the work in that
// message ("kernel gemm_kernel", "cublasSgemm", "ncclAllReduce", ...). The caller validates
// its arguments first and returns their errors synchronously, as the real APIs do.
// Returns cudaErrorInvalidResourceHandle for a destroyed stream or one of another device.
cudaError_t enqueue(cudaStream_t stream, const char* what, std::function<void()> work);

// ---- Memory (memory.cpp) ------------------------------------------------------------------
enum class MemoryKind { None, Device, PinnedHost };
struct Region {
  MemoryKind kind = MemoryKind::None;
  int device = -1;          // for Device
  const char* begin = nullptr;
  size_t size = 0;
};
// The live allocation containing p (an address up to and including one past its end).
Region find_region(const void* p);
size_t device_capacity();

}  // namespace kiln::sim
