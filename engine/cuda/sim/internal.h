// sim/internal.h: what the simulator's .cpp files share with each other (not for kernels).
// Models no CUDA API itself: the device, stream and memory state behind api.h's calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine/cuda/sim/runtime.h"

namespace kiln::sim {

// ---- Configuration (env, read once; a few can be changed by tests through api.h) -----------
int configured_device_count();          // KILN_SIM_DEVICES, default 2
size_t env_size(const char* name, size_t fallback);  // a non-negative integer from env

// ---- Errors (device.cpp) ------------------------------------------------------------------
// record_error (api.h) sets the calling thread's last error and returns it: `return fail(x);`.
inline cudaError_t fail(cudaError_t error) { return record_error(error); }

// ---- Devices (device.cpp) and streams (streams.cpp) -----------------------------------------------------
int current_device();                   // this host thread's device (cudaSetDevice)
void set_current_device(int device);    // for the simulator's own threads (stream workers)
bool valid_device(int device);          // 0 <= device < count
// The device a stream belongs to (nullptr: the current device's legacy stream). False for a
// handle that was never created or was destroyed.
bool stream_device(cudaStream_t stream, int* device);

// ---- Stream work (streams.cpp) -------------------------------------------------------------
struct Queue;  // one stream's queue and worker
// A point in a stream: reached when the queue has completed `seq` operations.
struct Ticket {
  std::shared_ptr<Queue> queue;  // null: a point that is always reached
  uint64_t seq = 0;
};

// Queues `work` on `stream` (nullptr: the current device's legacy default stream), as the
// GPU queues a kernel or a copy: it runs after everything submitted to that stream before it
// (and what the legacy stream's rules order before it), on the stream's own worker thread with
// the stream's device current, asynchronously to the calling host thread. An exception thrown
// by `work` is a device fault: it becomes the device's sticky error, returned (with its
// message in `fault_message()`) by the next synchronising call. `what` names the work in that
// message ("kernel", "cublasSgemm", "ncclAllReduce", ...; a string literal). The caller
// validates its arguments first and returns their errors synchronously, as the real APIs do.
// Returns cudaErrorInvalidResourceHandle for a destroyed stream, or the device's sticky error.
// `ticket`, if given, receives the point at which the work has run.
cudaError_t enqueue(cudaStream_t stream, const char* what, std::function<void()> work,
                    Ticket* ticket = nullptr);
// Blocks until the ticket's work has run; returns its device's sticky error.
cudaError_t wait(const Ticket& ticket);
// Blocks until all work queued so far on `device` (every stream) has run; returns the sticky
// error. synchronize_all_devices: the same for every device (cudaFreeHost's implicit sync).
cudaError_t synchronize_device(int device);
cudaError_t synchronize_all_devices();
cudaError_t fail_if(cudaError_t error);  // fail(error) unless cudaSuccess
// An implicit synchronisation on `device` (CUDA C++ Programming Guide, "Implicit
// Synchronization"): work queued from now on, on any stream of the device, starts only after
// all work queued on the device so far has completed. The host does not wait.
void implicit_synchronization(int device);
bool synchronous_streams();              // KILN_SIM_SYNC=1

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
