// sim/internal.h: what the simulator's .cpp files share with each other (not for kernels).
// Models no CUDA API itself: the device, stream and memory state behind api.h's calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

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
// handle that was never created or was destroyed. `blocking`, if given, receives whether the
// stream takes part in the legacy default stream's implicit waits (not cudaStreamNonBlocking).
bool stream_device(cudaStream_t stream, int* device, bool* blocking = nullptr);

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
// `ticket`, if given, receives the point at which the work has run. `after`: points the work
// also waits for (a graph launch waits for the previous launch of its graph). While the stream
// captures (graphs.cpp), the work is recorded instead and `ticket` is the always-reached point.
cudaError_t enqueue(cudaStream_t stream, const char* what, std::function<void()> work,
                    Ticket* ticket = nullptr, std::vector<Ticket> after = {});
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

// ---- Stream capture (graphs.cpp) ----------------------------------------------------------
// The capture rules of the CUDA C++ Programming Guide ("CUDA Graphs", "Stream Capture"). Each
// returns cudaSuccess, or the capture error (already recorded with fail()) after invalidating
// the captures CUDA invalidates. Called without streams.cpp's lock held.
//
// enqueue(): work for a capturing stream is moved out of `*work` into the capture and
// *recorded is set; work for the legacy stream while a blocking stream of its device captures
// is cudaErrorStreamCaptureImplicit.
cudaError_t capture_work(cudaStream_t stream, const char* what, std::function<void()>* work,
                         bool* recorded);
// cudaEventRecord: on a capturing stream the event records the stream's place in the capture
// (*recorded, nothing is queued); on another stream the event leaves any capture.
cudaError_t capture_event_record(cudaEvent_t event, cudaStream_t stream, bool* recorded);
// cudaStreamWaitEvent: waiting for an event recorded in a capture makes `stream` join that
// capture, or adds the event's place to its dependencies (*handled). `ever_recorded`: whether
// the event was ever recorded outside a capture.
cudaError_t capture_event_wait(cudaStream_t stream, cudaEvent_t event, bool ever_recorded,
                               bool* handled);
// cudaEventQuery, cudaEventSynchronize, cudaEventElapsedTime: cudaErrorCapturedEvent for an
// event last recorded in a capture still open.
cudaError_t check_event_not_captured(cudaEvent_t event);
void forget_event(cudaEvent_t event);    // cudaEventDestroy
void forget_stream(cudaStream_t stream);  // cudaStreamDestroy: its capture is invalidated
// cudaStreamSynchronize, cudaStreamQuery: cudaErrorStreamCaptureUnsupported for a capturing
// stream; cudaErrorStreamCaptureImplicit for the legacy stream while a blocking stream of the
// device captures.
cudaError_t check_stream_wait(cudaStream_t stream);
// cudaDeviceSynchronize: cudaErrorStreamCaptureUnsupported while a stream of `device` captures.
cudaError_t check_device_wait(int device);
// The "potentially unsafe" calls (cudaMalloc, cudaFree, cudaMallocHost, cudaHostAlloc,
// cudaFreeHost, cudaMemcpy): cudaErrorStreamCaptureUnsupported when a capture forbids them
// under the capture modes (cudaThreadExchangeStreamCaptureMode).
cudaError_t check_unsafe_call();
// Whether `stream` takes part in a capture (active or invalidated).
bool capturing(cudaStream_t stream);
// Work that cannot be captured (a copy from or to pageable host memory, an NCCL call) was
// queued on `stream`: invalidates its capture, if any (the caller reports the error).
void invalidate_capture(cudaStream_t stream);

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
