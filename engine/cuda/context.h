// context.h: which CUDA devices exist, which one is current, and the stream work is queued on.
//
//   if (!cuda::is_available()) std::cerr << cuda::unavailable_reason();
//   cuda::check_device(1);                  // kiln::Error (Usage) naming what exists
//   { cuda::DeviceGuard guard(1);           // cudaSetDevice(1) until the end of the scope
//     kernel launches on cuda::current_stream(); }
//
// A machine with the CUDA runtime but no usable GPU (no driver, a driver older than the runtime,
// zero devices) is a normal case, not an error: device_count() is 0 and unavailable_reason()
// says why. Under the simulator the devices are simulated (env KILN_SIM_DEVICES, default 2).
//
// Streams. Every host thread gets its own compute stream per device, created on first use with
// cudaStreamNonBlocking (so it never serialises with the legacy default stream that libraries
// and stray cudaMemcpy calls use). Work from one thread is ordered by its stream; work from two
// threads, or two devices, is ordered with an Event (record on one stream, wait from the other),
// never with a device-wide synchronisation in the hot path.
//
// In a build without a CUDA backend only the availability functions (device_count() is 0) and
// the declarations of DeviceGuard and synchronize() exist, so callers such as the apps'
// --device parsing need no #if.
#pragma once

#include <string>

#include "engine/build_config.h"  // kWithCuda, cuda::kSimulated
#include "engine/cuda/sync_debug.h"  // SyncSite: the waiting calls name their caller
#if KILN_WITH_CUDA
#include "engine/cuda/runtime.h"
#else
#include "engine/error.h"
#endif

namespace kiln::cuda {

#if KILN_WITH_CUDA

// Number of usable CUDA devices: 0 without a GPU or a working driver. Never throws; asked once.
int device_count();
bool is_available();  // device_count() > 0
// Why there is no CUDA device, and what to do: "no CUDA device: <reason>; use --device cpu".
// Empty when a device exists.
std::string unavailable_reason();
// Throws kiln::Error (Usage) unless cuda:index exists, e.g. "device cuda:3 is not available:
// this machine has 2 CUDA devices (cuda:0..cuda:1)".
void check_device(int index);

int current_device();  // this host thread's current device (cudaGetDevice)

// This host thread's compute stream on the current device / on `device`. Created on first use.
// Inside a StreamGuard for the device, the guard's stream instead.
cudaStream_t current_stream();
cudaStream_t current_stream(int device);

// Makes `stream` (a stream of cuda:`device`, owned by the caller) this thread's current stream
// on `device` until the end of the scope, then restores the previous one; guards nest. Every
// op queues its work on current_stream(), so this sends a region's work to another stream: a
// CUDA graph capture (graph.h) runs on a stream of its own. Made and destroyed on one thread.
class StreamGuard {
 public:
  StreamGuard(int device, cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  cudaStream_t previous_;  // the enclosing guard's stream, or null: the thread's own
};

// An event marks a point in a stream. Other streams (of any device) can wait for it without
// blocking the host; the host can wait for it or poll it; two timing events give the GPU time
// between them. The CUDA event is created on the first record(), on the current device (which
// must be the device of the stream recorded on). An event never recorded is complete.
enum class EventTiming { Off, On };  // On: elapsed_ms() works (timing costs a little)

class Event {
 public:
  explicit Event(EventTiming timing = EventTiming::Off) : timing_(timing) {}
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(cudaStream_t stream);  // marks the end of the work queued so far on `stream`
  void record() { record(current_stream()); }
  // Work queued on `stream` after this call starts only once the recorded point is reached.
  void wait(cudaStream_t stream) const;
  void wait() const { wait(current_stream()); }
  // Blocks the host until the recorded point is reached (checked by the sync debug mode).
  void synchronize(SyncSite site = SyncSite()) const;
  bool query() const;        // true once the recorded point is reached (never blocks)
  // Milliseconds of GPU time from this event to `end`; both recorded, both with timing on.
  float elapsed_ms(const Event& end) const;

  bool recorded() const { return event_ != nullptr; }
  int device() const { return device_; }  // -1 until recorded
  cudaEvent_t get() const { return event_; }

 private:
  EventTiming timing_;
  cudaEvent_t event_ = nullptr;
  int device_ = -1;
};

#else  // no CUDA backend in this build: nothing is available, and the error says so.

inline int device_count() { return 0; }
inline bool is_available() { return false; }
inline std::string unavailable_reason() {
  return "this build of Kiln has no CUDA backend (configured without the CUDA toolkit, or with "
         "-DKILN_CUDA=OFF); use --device cpu";
}
inline void check_device(int index) {
  throw Error("device cuda:" + std::to_string(index) +
                  " is not available: this build of Kiln has no CUDA backend yet; use --device cpu",
              ErrorKind::Usage);
}

#endif

// Makes `index` the current device of this host thread for the guard's scope, then restores the
// previous one. Every op holds one for its tensors' device before it launches a kernel
// (engine/dispatch.h, on_device). Declared in every build, defined in context.cpp, which only
// a build with a CUDA backend compiles: other code names it only in branches that
// `if constexpr (kWithCuda)` keeps out of a build without one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  int index_ = 0;
};

// Blocks the host until the work queued so far on current_stream() has finished (a wait the
// sync debug mode reports, at the caller's line: sync_debug.h). Declared in every build,
// defined (context.cpp) only with a CUDA backend, as DeviceGuard.
void synchronize(SyncSite site = SyncSite());

}  // namespace kiln::cuda
