// sim/device.cpp: errors and devices of the simulated CUDA runtime (streams and events:
// streams.cpp).
//
// Models the CUDA Runtime API's "Error Handling" (the last error, sticky errors after a device
// fault, cudaGetErrorName/String) and "Device Management" sections (the current device per
// host thread, device count and properties, peer access):
// https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__ERROR.html
// https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__DEVICE.html
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <utility>

#include "engine/cuda/sim/internal.h"

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

std::mutex g_handles_mutex;
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

void set_current_device(int device) { t_device = device; }

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
    {cudaErrorIllegalState, "cudaErrorIllegalState",
     "the operation cannot be performed in the present state"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled",
     "peer access is already enabled"},
    {cudaErrorPeerAccessNotEnabled, "cudaErrorPeerAccessNotEnabled",
     "peer access has not been enabled"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureMerge, "cudaErrorStreamCaptureMerge",
     "operation would result in a merge of separate capture sequences"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched",
     "capture was not ended in the same stream as it began"},
    {cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined",
     "capturing stream has unjoined work"},
    {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation",
     "dependency created on uncaptured work in another stream"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorCapturedEvent, "cudaErrorCapturedEvent",
     "operation not permitted on an event last recorded in a capturing stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
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
