// sim/internal.h: what the simulator's .cpp files share with each other (not for kernels).
#pragma once

#include <cstddef>
#include <cstdint>

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
