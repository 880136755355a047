// sim/api.h: the host side of the simulated CUDA runtime (included by sim/runtime.h).
//
// Same names, signatures and error codes as the real runtime for the subset Kiln uses.
// Semantics follow the CUDA Runtime API reference, its "Error Handling", "Device
// Management", "Memory Management", "Stream Management" and "Event Management" sections:
// https://docs.nvidia.com/cuda/cuda-runtime-api/
// Implemented in device.cpp (errors, devices), streams.cpp (streams, events), memory.cpp
// (memory) and graphs.cpp (stream capture, graphs).
// Differences from a GPU, in one place:
//   - Device memory is host memory (64-byte aligned). Every allocation is registered with its
//     device, so freeing twice, freeing a stranger pointer, or copying out of bounds returns
//     cudaErrorInvalidValue instead of corrupting memory. Capacity per device: env
//     KILN_SIM_DEVICE_MEMORY (bytes, default 8 GiB); beyond it cudaMalloc fails like a full GPU.
//   - Streams are asynchronous, as on a GPU: each is a queue run by its own worker thread
//     (streams.cpp). Only what CUDA orders is ordered (stream order, events, the legacy default
//     stream's rules, the synchronising calls); a device fault becomes a sticky error.
//     KILN_SIM_DELAY_US=n adds a random delay before each operation; KILN_SIM_SYNC=1 makes the
//     host wait for each one.
//   - Graphs (stream capture only): a launch runs the nodes one after another in capture order,
//     a topological order, with no concurrency between branches; NCCL calls are not captured.
//   - Devices: env KILN_SIM_DEVICES (default 2, 0 allowed: then cudaGetDeviceCount fails with
//     cudaErrorNoDevice like a machine without a GPU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

// ---- Errors -------------------------------------------------------------------------------
// The values match the real runtime's, so printed numbers mean the same thing.
// The enums have a fixed underlying type (int): any int converted to one is then a valid value,
// which the simulator checks and rejects as the CUDA runtime does (an out-of-range value of an enum
// without one would be undefined behaviour, reported by UBSan before the check could run).
enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInsufficientDriver = 35,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorPeerAccessAlreadyEnabled = 704,
  cudaErrorPeerAccessNotEnabled = 705,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureMerge = 902,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorCapturedEvent = 907,
  cudaErrorStreamCaptureWrongThread = 908,
  cudaErrorUnknown = 999,
};
using cudaError = cudaError_t;

const char* cudaGetErrorName(cudaError_t error);
const char* cudaGetErrorString(cudaError_t error);
// Every failing call records its error for the calling host thread; cudaGetLastError returns
// it and resets it to cudaSuccess, cudaPeekAtLastError returns it and leaves it.
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();

// ---- Devices ------------------------------------------------------------------------------
struct cudaDeviceProp {
  char name[256];               // "Kiln CUDA simulator"
  size_t totalGlobalMem;        // the simulated capacity (KILN_SIM_DEVICE_MEMORY)
  size_t sharedMemPerBlock;     // 48 KiB: the default limit of static + dynamic shared memory
  size_t sharedMemPerBlockOptin;  // 227 KiB: the most cudaFuncSetAttribute can raise it to
  size_t sharedMemPerMultiprocessor;
  size_t totalConstMem;
  int regsPerBlock;
  int warpSize;                 // 32
  int maxThreadsPerBlock;       // 1024
  int maxThreadsDim[3];         // 1024, 1024, 64
  int maxGridSize[3];           // 2^31-1, 65535, 65535
  int maxThreadsPerMultiProcessor;
  int multiProcessorCount;      // 132, like an H100 SXM (kernels may size grids from it)
  int major, minor;             // 9.0 (sm_90, the architecture the real build targets)
  int l2CacheSize;
  int integrated;
  int concurrentKernels;
  int unifiedAddressing;
  int pciBusID, pciDeviceID, pciDomainID;
};

enum cudaDeviceAttr : int {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxBlockDimX = 2,
  cudaDevAttrMaxBlockDimY = 3,
  cudaDevAttrMaxBlockDimZ = 4,
  cudaDevAttrMaxGridDimX = 5,
  cudaDevAttrMaxGridDimY = 6,
  cudaDevAttrMaxGridDimZ = 7,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrMaxThreadsPerMultiProcessor = 39,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaDeviceSynchronize();  // waits for every stream of the device
// Waits for the device's work and clears its sticky error (the simulator keeps memory and
// handles valid; a GPU would destroy them).
cudaError_t cudaDeviceReset();
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceCanAccessPeer(int* can_access, int device, int peer_device);
cudaError_t cudaDeviceEnablePeerAccess(int peer_device, unsigned int flags);
cudaError_t cudaDeviceDisablePeerAccess(int peer_device);
cudaError_t cudaDriverGetVersion(int* version);   // 13000: the toolkit the real build uses
cudaError_t cudaRuntimeGetVersion(int* version);

// ---- Streams and events -------------------------------------------------------------------
// Opaque handles, as in the real runtime; nullptr is the legacy default stream.
struct CUstream_st;
struct CUevent_st;
using cudaStream_t = CUstream_st*;
using cudaEvent_t = CUevent_st*;

constexpr unsigned int cudaStreamDefault = 0x0;
constexpr unsigned int cudaStreamNonBlocking = 0x1;
constexpr unsigned int cudaEventDefault = 0x0;
constexpr unsigned int cudaEventBlockingSync = 0x1;
constexpr unsigned int cudaEventDisableTiming = 0x2;

cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);  // cudaErrorNotReady while work is queued
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);
// Queues a host function on the stream: it runs (on the simulator's worker thread) when the
// stream reaches it, and must not call the CUDA API, as on a GPU.
using cudaHostFn_t = void (*)(void* user_data);
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data);

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
// Queues a record: the event completes (and takes the host time) when the stream reaches it.
// The event and the stream must belong to the same device, as on a GPU.
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);  // cudaErrorNotReady until the record has run
// Milliseconds between two completed timing events (host wall time in the simulator).
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

// ---- Graphs and stream capture ------------------------------------------------------------
// Work queued on a capturing stream is recorded into a graph instead of run; the graph is
// instantiated once and launched as one unit of stream work (graphs.cpp, and the CUDA C++
// Programming Guide, "CUDA Graphs": https://docs.nvidia.com/cuda/cuda-c-programming-guide/).
struct CUgraph_st;
struct CUgraphExec_st;
struct CUgraphNode_st;
struct cudaGraphEdgeData_st;
using cudaGraph_t = CUgraph_st*;
using cudaGraphExec_t = CUgraphExec_st*;
using cudaGraphNode_t = CUgraphNode_st*;
using cudaGraphEdgeData = cudaGraphEdgeData_st;

enum cudaStreamCaptureStatus : int {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
// Which "potentially unsafe" calls (cudaMalloc, synchronous copies, ...) a capture forbids:
// those of every thread (Global), of the capturing thread (ThreadLocal), or none (Relaxed).
enum cudaStreamCaptureMode : int {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaGraphInstantiateFlags : int {
  cudaGraphInstantiateFlagAutoFreeOnLaunch = 1,
  cudaGraphInstantiateFlagUpload = 2,
  cudaGraphInstantiateFlagDeviceLaunch = 4,
  cudaGraphInstantiateFlagUseNodePriority = 8,
};

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);
// Status, id and graph; the dependency outputs are not modelled (cudaErrorNotSupported when
// asked for).
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* status,
                                     unsigned long long* id = nullptr,
                                     cudaGraph_t* graph = nullptr,
                                     const cudaGraphNode_t** dependencies = nullptr,
                                     const cudaGraphEdgeData** edge_data = nullptr,
                                     size_t* num_dependencies = nullptr);
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode);
// Flags: 0, AutoFreeOnLaunch or UseNodePriority (no effect here: the simulator has no graph
// memory nodes and no priorities); the others are cudaErrorInvalidValue.
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);  // a queued launch still runs
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

// ---- Memory -------------------------------------------------------------------------------
enum cudaMemcpyKind : int {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,  // direction inferred from the pointers (unified addressing)
};
constexpr unsigned int cudaHostAllocDefault = 0x0;
constexpr unsigned int cudaHostAllocPortable = 0x1;

cudaError_t cudaMalloc(void** dev_ptr, size_t size);
template <typename T>
cudaError_t cudaMalloc(T** dev_ptr, size_t size) {  // the typed overload of cuda_runtime.h
  return cudaMalloc(reinterpret_cast<void**>(dev_ptr), size);
}
cudaError_t cudaFree(void* dev_ptr);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
// Pinned host memory: ordinary host memory here, registered so cudaFreeHost can check it.
cudaError_t cudaMallocHost(void** ptr, size_t size);
template <typename T>
cudaError_t cudaMallocHost(T** ptr, size_t size) {
  return cudaMallocHost(reinterpret_cast<void**>(ptr), size);
}
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags);  // Default | Portable
cudaError_t cudaFreeHost(void* ptr);

// Copies check that each device-side range lies inside one live allocation.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemcpyPeer(void* dst, int dst_device, const void* src, int src_device,
                           size_t count);
cudaError_t cudaMemcpyPeerAsync(void* dst, int dst_device, const void* src, int src_device,
                                size_t count, cudaStream_t stream = nullptr);
// Memset needs memory of the *current* device (a missing DeviceGuard shows up here).
cudaError_t cudaMemset(void* dev_ptr, int value, size_t count);
cudaError_t cudaMemsetAsync(void* dev_ptr, int value, size_t count, cudaStream_t stream = nullptr);

enum cudaMemoryType : int {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
};
struct cudaPointerAttributes {
  cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr);

namespace kiln::sim {
cudaError_t record_error(cudaError_t error);  // sets the thread's last error, returns it
}
// __constant__ variables are plain globals: the symbol copies are plain memcpy.
template <typename T>
cudaError_t cudaMemcpyToSymbol(T& symbol, const void* src, size_t count, size_t offset = 0,
                               cudaMemcpyKind kind = cudaMemcpyHostToDevice) {
  if (offset + count > sizeof(T)) return kiln::sim::record_error(cudaErrorInvalidValue);
  return cudaMemcpy(reinterpret_cast<char*>(&symbol) + offset, src, count, cudaMemcpyHostToHost);
}
template <typename T>
cudaError_t cudaMemcpyFromSymbol(void* dst, const T& symbol, size_t count, size_t offset = 0,
                                 cudaMemcpyKind kind = cudaMemcpyDeviceToHost) {
  if (offset + count > sizeof(T)) return kiln::sim::record_error(cudaErrorInvalidValue);
  return cudaMemcpy(dst, reinterpret_cast<const char*>(&symbol) + offset, count,
                    cudaMemcpyHostToHost);
}

// ---- Library data types (library_types.h, which cuda_runtime.h includes) -----------------------
// The element types the libraries' typed entry points take (cublasGemmEx). Only the real types
// Kiln uses are listed; the values are the real ones.
enum cudaDataType_t : int {
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_16F = 2,
  CUDA_R_8I = 3,
  CUDA_R_16BF = 14,
};
using cudaDataType = cudaDataType_t;

// ---- Kernel attributes --------------------------------------------------------------------
enum cudaFuncAttribute : int {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};
namespace kiln::sim {
cudaError_t set_function_attribute(const void* kernel, cudaFuncAttribute attr, int value);
}
// Raising MaxDynamicSharedMemorySize above 48 KiB (up to 227 KiB) lets later launches of that
// kernel ask for that much dynamic shared memory, as on an H100.
template <typename T>
cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attr, int value) {
  return kiln::sim::set_function_attribute(reinterpret_cast<const void*>(kernel), attr, value);
}

// ---- Simulator controls (tests and debugging; no CUDA equivalent) ---------------------------
namespace kiln::sim {
// Debug shuffle (env KILN_SIM_SHUFFLE=1, KILN_SIM_SHUFFLE_SEED=n): run the warps of a block and
// the lanes of a warp in a pseudo-random order between barriers, so a missing __syncthreads
// or __syncwarp shows up as a wrong result. The order depends on (seed, launch, block).
void set_shuffle(bool enabled, uint64_t seed = 1);
bool shuffle_enabled();
// Per-device memory capacity in bytes (env KILN_SIM_DEVICE_MEMORY), for every device.
void set_device_memory_capacity(size_t bytes);
size_t device_memory_used(int device);
// Host functions that run this many seconds while the host waits are reported as a deadlock
// (env KILN_SIM_HOST_FN_LIMIT_S, default 20; 0: never). See streams.cpp.
void set_host_function_limit(uint64_t seconds);
// Queues fn(data) on `stream` as device work (like a kernel or a memset), not as a host
// function: the simulator's own instrumentation of device memory (the caching allocator's NaN
// fill) uses it, so it neither waits behind nor serialises with the program's host functions.
cudaError_t enqueue_device_work(cudaStream_t stream, const char* what, void (*fn)(void*),
                                void* data);
// What the current device's sticky error was about ("cuda:0: kernel ...: <what failed>"), or
// empty. A real GPU says only cudaErrorLaunchFailure; KILN_CUDA_CHECK appends this text.
std::string fault_message();
}  // namespace kiln::sim
