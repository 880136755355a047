// sim/device.cpp: errors, devices, streams and events of the simulated CUDA runtime.
//
// Streams and events are small host objects. Because every operation runs to completion when
// it is submitted, a stream needs no queue: it only remembers its device (work may only be
// queued on a stream of the current device). An event remembers its device and the host time
// of its last record, which is also the time all work submitted before it had finished.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <unordered_set>
#include <utility>

#include "engine/cuda/sim/internal.h"

struct CUstream_st {
  int device;
  unsigned int flags;
};
struct CUevent_st {
  int device;
  unsigned int flags;
  bool recorded;
  std::chrono::steady_clock::time_point time;
};

namespace kiln::sim {

size_t env_size(const char* name, size_t fallback) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(env, &end, 10);
  if (end == env) return fallback;
  switch (*end) {  // optional K/M/G suffix (binary units)
    case 'k': case 'K': return static_cast<size_t>(v) << 10;
    case 'm': case 'M': return static_cast<size_t>(v) << 20;
    case 'g': case 'G': return static_cast<size_t>(v) << 30;
    default: return static_cast<size_t>(v);
  }
}

int configured_device_count() {
  static const int count = static_cast<int>(env_size("KILN_SIM_DEVICES", 2));
  return count;
}

namespace {
thread_local cudaError_t t_last_error = cudaSuccess;
thread_local int t_device = 0;

// Live handles, so a destroyed or made-up handle is an error instead of a crash.
std::mutex g_handles_mutex;
std::unordered_set<CUstream_st*> g_streams;
std::unordered_set<CUevent_st*> g_events;
std::set<std::pair<int, int>> g_peer_access;  // (device, peer) pairs enabled

cudaError_t check_has_device() {
  return configured_device_count() > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}
}  // namespace

cudaError_t record_error(cudaError_t error) {
  if (error != cudaSuccess) t_last_error = error;
  return error;
}
int current_device() { return t_device; }
bool valid_device(int device) { return device >= 0 && device < configured_device_count(); }

bool stream_device(cudaStream_t stream, int* device) {
  if (stream == nullptr) {
    *device = t_device;
    return true;
  }
  std::lock_guard<std::mutex> lock(g_handles_mutex);
  if (g_streams.count(stream) == 0) return false;
  *device = stream->device;
  return true;
}

// Synchronous for now: the work runs on the calling thread before enqueue returns.
cudaError_t enqueue(cudaStream_t stream, const char* what, std::function<void()> work) {
  (void)what;
  int device = 0;
  if (!stream_device(stream, &device) || device != t_device)
    return fail(cudaErrorInvalidResourceHandle);
  work();
  return cudaSuccess;
}

}  // namespace kiln::sim

using kiln::sim::fail;

// ---- Errors -------------------------------------------------------------------------------
namespace {
struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled",
     "peer access is already enabled"},
    {cudaErrorPeerAccessNotEnabled, "cudaErrorPeerAccessNotEnabled",
     "peer access has not been enabled"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};
const ErrorText* find_error(cudaError_t code) {
  for (const ErrorText& e : kErrors)
    if (e.code == code) return &e;
  return nullptr;
}
}  // namespace

const char* cudaGetErrorName(cudaError_t error) {
  const ErrorText* e = find_error(error);
  return e ? e->name : "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t error) {
  const ErrorText* e = find_error(error);
  return e ? e->text : "unrecognized error code";
}
cudaError_t cudaGetLastError() {
  const cudaError_t e = kiln::sim::t_last_error;
  kiln::sim::t_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return kiln::sim::t_last_error; }

// ---- Devices ------------------------------------------------------------------------------
cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = kiln::sim::configured_device_count();
  return kiln::sim::check_has_device();
}
cudaError_t cudaSetDevice(int device) {
  if (kiln::sim::check_has_device() != cudaSuccess) return cudaErrorNoDevice;
  if (!kiln::sim::valid_device(device)) return fail(cudaErrorInvalidDevice);
  kiln::sim::t_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  if (kiln::sim::check_has_device() != cudaSuccess) return cudaErrorNoDevice;
  *device = kiln::sim::t_device;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { return kiln::sim::check_has_device(); }

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return fail(cudaErrorInvalidValue);
  if (!kiln::sim::valid_device(device)) return fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof *prop);
  std::strncpy(prop->name, "Kiln CUDA simulator", sizeof prop->name - 1);
  prop->totalGlobalMem = kiln::sim::device_capacity();
  prop->sharedMemPerBlock = 48 * 1024;
  prop->sharedMemPerBlockOptin = 227 * 1024;
  prop->sharedMemPerMultiprocessor = 228 * 1024;
  prop->totalConstMem = 64 * 1024;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->multiProcessorCount = 132;
  prop->major = 9;
  prop->minor = 0;
  prop->l2CacheSize = 50 * 1024 * 1024;
  prop->concurrentKernels = 1;
  prop->unifiedAddressing = 1;
  prop->pciBusID = device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  cudaDeviceProp p;
  if (value == nullptr) return fail(cudaErrorInvalidValue);
  if (const cudaError_t e = cudaGetDeviceProperties(&p, device); e != cudaSuccess) return e;
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: *value = p.maxThreadsDim[0]; break;
    case cudaDevAttrMaxBlockDimY: *value = p.maxThreadsDim[1]; break;
    case cudaDevAttrMaxBlockDimZ: *value = p.maxThreadsDim[2]; break;
    case cudaDevAttrMaxGridDimX: *value = p.maxGridSize[0]; break;
    case cudaDevAttrMaxGridDimY: *value = p.maxGridSize[1]; break;
    case cudaDevAttrMaxGridDimZ: *value = p.maxGridSize[2]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = static_cast<int>(p.sharedMemPerBlock); break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = p.maxThreadsPerMultiProcessor; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(p.sharedMemPerBlockOptin);
      break;
    default: return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int* can_access, int device, int peer_device) {
  if (can_access == nullptr) return fail(cudaErrorInvalidValue);
  if (!kiln::sim::valid_device(device) || !kiln::sim::valid_device(peer_device))
    return fail(cudaErrorInvalidDevice);
  *can_access = device != peer_device;  // all simulated devices share one "bus"
  return cudaSuccess;
}
cudaError_t cudaDeviceEnablePeerAccess(int peer_device, unsigned int flags) {
  const int device = kiln::sim::t_device;
  if (flags != 0) return fail(cudaErrorInvalidValue);
  if (!kiln::sim::valid_device(peer_device) || peer_device == device)
    return fail(cudaErrorInvalidDevice);
  std::lock_guard<std::mutex> lock(kiln::sim::g_handles_mutex);
  if (!kiln::sim::g_peer_access.insert({device, peer_device}).second)
    return fail(cudaErrorPeerAccessAlreadyEnabled);
  return cudaSuccess;
}
cudaError_t cudaDeviceDisablePeerAccess(int peer_device) {
  std::lock_guard<std::mutex> lock(kiln::sim::g_handles_mutex);
  if (kiln::sim::g_peer_access.erase({kiln::sim::t_device, peer_device}) == 0)
    return fail(cudaErrorPeerAccessNotEnabled);
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return fail(cudaErrorInvalidValue);
  *version = 13000;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* version) { return cudaDriverGetVersion(version); }

// ---- Streams ------------------------------------------------------------------------------
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr || (flags & ~cudaStreamNonBlocking) != 0) return fail(cudaErrorInvalidValue);
  if (kiln::sim::check_has_device() != cudaSuccess) return cudaErrorNoDevice;
  auto* s = new CUstream_st{kiln::sim::t_device, flags};
  std::lock_guard<std::mutex> lock(kiln::sim::g_handles_mutex);
  kiln::sim::g_streams.insert(s);
  *stream = s;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(kiln::sim::g_handles_mutex);
  if (stream == nullptr || kiln::sim::g_streams.erase(stream) == 0)
    return fail(cudaErrorInvalidResourceHandle);
  delete stream;
  return cudaSuccess;
}
// Work on a stream is finished when it was submitted: synchronising only validates the handle.
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  int device = 0;
  return kiln::sim::stream_device(stream, &device) ? cudaSuccess
                                                   : fail(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaStreamQuery(cudaStream_t stream) { return cudaStreamSynchronize(stream); }
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  int device = 0;
  if (!kiln::sim::stream_device(stream, &device)) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(kiln::sim::g_handles_mutex);
  if (kiln::sim::g_events.count(event) == 0) return fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;  // the event's work is already done: nothing to wait for
}

// ---- Events -------------------------------------------------------------------------------
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming)) != 0)
    return fail(cudaErrorInvalidValue);
  if (kiln::sim::check_has_device() != cudaSuccess) return cudaErrorNoDevice;
  auto* e = new CUevent_st{kiln::sim::t_device, flags, false, {}};
  std::lock_guard<std::mutex> lock(kiln::sim::g_handles_mutex);
  kiln::sim::g_events.insert(e);
  *event = e;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(kiln::sim::g_handles_mutex);
  if (kiln::sim::g_events.erase(event) == 0) return fail(cudaErrorInvalidResourceHandle);
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  int device = 0;
  if (!kiln::sim::stream_device(stream, &device)) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(kiln::sim::g_handles_mutex);
  if (kiln::sim::g_events.count(event) == 0 || event->device != device)
    return fail(cudaErrorInvalidResourceHandle);
  event->recorded = true;
  event->time = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) { return cudaEventQuery(event); }
cudaError_t cudaEventQuery(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(kiln::sim::g_handles_mutex);
  return kiln::sim::g_events.count(event) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(kiln::sim::g_handles_mutex);
  if (kiln::sim::g_events.count(start) == 0 || kiln::sim::g_events.count(end) == 0)
    return fail(cudaErrorInvalidResourceHandle);
  if ((start->flags | end->flags) & cudaEventDisableTiming)
    return fail(cudaErrorInvalidResourceHandle);
  if (!start->recorded || !end->recorded) return fail(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(end->time - start->time).count();
  return cudaSuccess;
}
