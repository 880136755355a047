// sim/memory.cpp: device and pinned host memory of the simulated CUDA runtime.
//
// "Device memory" is host memory from posix_memalign, 64-byte aligned, with a 64-byte guard
// after the size asked. On a GPU, device and host memory never share an address range; here
// they share the heap, and without the guard a host buffer could start exactly one past the end
// of a device allocation, where the registry (which counts one-past-the-end as inside, for
// end pointers) would call it device memory. Under AddressSanitizer the guard is poisoned, so a
// kernel reading one element past the end is still caught. Every allocation is
// entered in a registry (address -> size, device). The registry is what makes the simulator a
// debugging tool: cudaFree of a pointer that is not the start of a live allocation, a copy
// whose device range leaves its allocation, or a memset on another device's memory returns
// cudaErrorInvalidValue instead of corrupting the heap, and kernel launches check their pointer
// arguments against it (launch.h).
//
// Models the CUDA Runtime API's "Memory Management" section (cudaMalloc, cudaFree,
// cudaMallocHost, cudaMemcpy*, cudaMemset*, cudaMemGetInfo):
// https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__MEMORY.html.
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "engine/cuda/sim/internal.h"

// AddressSanitizer's manual poisoning (sanitizer/asan_interface.h), a no-op in other builds.
#if defined(__SANITIZE_ADDRESS__)
#define KILN_SIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_SIM_ASAN 1
#endif
#endif
#ifdef KILN_SIM_ASAN
#include <sanitizer/asan_interface.h>
#define KILN_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define KILN_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define KILN_POISON(p, n) ((void)(p), (void)(n))
#define KILN_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace kiln::sim {

namespace {
// Unused bytes after every allocation: no other heap block can start at its end.
constexpr size_t kGuardBytes = 64;

struct Allocation {
  size_t size;
  MemoryKind kind;
  int device;
};
std::mutex g_mutex;
std::map<const char*, Allocation> g_allocations;  // by start address
std::vector<size_t> g_used;                        // bytes in use per device
size_t g_capacity = env_size("KILN_SIM_DEVICE_MEMORY", size_t{8} << 30);

// The allocation containing p, counting one-past-the-end as inside (g_mutex held).
Region find_locked(const void* p) {
  const char* c = static_cast<const char*>(p);
  auto it = g_allocations.upper_bound(c);
  if (it == g_allocations.begin()) return {};
  --it;
  if (c > it->first + it->second.size) return {};
  return Region{it->second.kind, it->second.device, it->first, it->second.size};
}

// Whether [p, p + count) lies in one live allocation of the given kind (device < 0: any).
bool range_in(const void* p, size_t count, MemoryKind kind, int device) {
  const Region r = find_region(p);
  const char* c = static_cast<const char*>(p);
  return r.kind == kind && (device < 0 || r.device == device) && c + count <= r.begin + r.size;
}

void* allocate(size_t size, MemoryKind kind, int device) {
  void* p = nullptr;
  if (posix_memalign(&p, 64, size + kGuardBytes) != 0) return nullptr;
  KILN_POISON(static_cast<char*>(p) + size, kGuardBytes);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_allocations[static_cast<const char*>(p)] = Allocation{size, kind, device};
  return p;
}

cudaError_t release(void* p, MemoryKind kind) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_allocations.find(static_cast<const char*>(p));
  if (it == g_allocations.end() || it->second.kind != kind) return fail(cudaErrorInvalidValue);
  if (kind == MemoryKind::Device) g_used[static_cast<size_t>(it->second.device)] -= it->second.size;
  KILN_UNPOISON(static_cast<char*>(p) + it->second.size, kGuardBytes);
  g_allocations.erase(it);
  std::free(p);
  return cudaSuccess;
}

// The direction a cudaMemcpyDefault copy takes, from where the pointers live.
bool is_device(const void* p) { return find_region(p).kind == MemoryKind::Device; }

// How a copy relates to the host, from where its host side lives (CUDA Runtime API, "API
// synchronization behavior"): a copy to pageable host memory returns when it is done; a copy
// from pageable host memory stages the source first, so the caller may reuse it at once; with
// pinned host memory or device to device the copy runs whenever the stream gets to it.
enum class HostSide { None, Pinned, Pageable };
HostSide host_side(const void* p, bool on_device) {
  if (on_device) return HostSide::None;
  // Strictly inside: find_region also accepts one past the end, which is where a neighbouring
  // pageable buffer of the heap may start.
  const Region r = find_region(p);
  const bool pinned = r.kind == MemoryKind::PinnedHost && static_cast<const char*>(p) < r.begin + r.size;
  return pinned ? HostSide::Pinned : HostSide::Pageable;
}

// A copy on `stream`; `blocking`: the host waits for it (cudaMemcpy).
cudaError_t copy(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                 cudaStream_t stream, bool blocking) {
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue);
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
    return fail(cudaErrorInvalidMemcpyDirection);
  if (kind == cudaMemcpyDefault) {
    const bool d = is_device(dst), s = is_device(src);
    kind = d ? (s ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
             : (s ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  }
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  // With unified addressing any device may be read or written by a copy; the range must
  // be inside one live allocation. (Host ranges cannot be checked: any host pointer is fine.)
  if (dst_device && !range_in(dst, count, MemoryKind::Device, -1)) return fail(cudaErrorInvalidValue);
  if (src_device && !range_in(src, count, MemoryKind::Device, -1)) return fail(cudaErrorInvalidValue);
  const HostSide to = host_side(dst, dst_device), from = host_side(src, src_device);
  // A graph replays a copy long after the capture: a pageable source cannot be staged for it,
  // nor can a replay make the host wait for a pageable destination. CUDA refuses both.
  const bool captured = capturing(stream);
  if (captured && (from == HostSide::Pageable || to == HostSide::Pageable)) {
    invalidate_capture(stream);
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  if (kind == cudaMemcpyHostToHost && to != HostSide::Pinned && from != HostSide::Pinned) {
    std::memmove(dst, src, count);  // nothing of a GPU's is involved
    return cudaSuccess;
  }
  std::function<void()> work = [dst, src, count] { std::memmove(dst, src, count); };
  if (from == HostSide::Pageable) {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + count);
    work = [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); };
  }
  // A copy between two addresses of one device's memory is an implicit synchronisation of that
  // device: it waits for the work issued before it, and the work issued after waits for it.
  const Region same = kind == cudaMemcpyDeviceToDevice ? find_region(dst) : Region{};
  // (Captured, the copy runs only when the graph does: nothing to order now.)
  const bool fence = same.kind == MemoryKind::Device && find_region(src).device == same.device &&
                     !captured;
  if (fence) implicit_synchronization(same.device);
  Ticket done;
  if (const cudaError_t e = enqueue(stream, "cudaMemcpy", std::move(work), &done); e != cudaSuccess)
    return e;
  if (fence) implicit_synchronization(same.device);
  return blocking || to == HostSide::Pageable ? wait(done) : cudaSuccess;
}

}  // namespace

Region find_region(const void* p) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return find_locked(p);
}

size_t device_capacity() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_capacity;
}

void set_device_memory_capacity(size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_capacity = bytes;
}

size_t device_memory_used(int device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return device >= 0 && static_cast<size_t>(device) < g_used.size()
             ? g_used[static_cast<size_t>(device)]
             : 0;
}

}  // namespace kiln::sim

using kiln::sim::fail;
using kiln::sim::MemoryKind;

// The allocation and release calls, cudaMemcpy and cudaMemcpyPeer are "potentially unsafe"
// during a stream capture (CUDA Runtime API, cudaThreadExchangeStreamCaptureMode): they are
// not captured, so they fail while a capture forbids them.
cudaError_t cudaMalloc(void** dev_ptr, size_t size) {
  if (dev_ptr == nullptr) return fail(cudaErrorInvalidValue);
  if (const cudaError_t e = kiln::sim::check_unsafe_call(); e != cudaSuccess) return e;
  const int device = kiln::sim::current_device();
  if (!kiln::sim::valid_device(device)) return fail(cudaErrorNoDevice);
  {
    // Reserve the bytes first, so two threads cannot both squeeze under the capacity.
    std::lock_guard<std::mutex> lock(kiln::sim::g_mutex);
    auto& used = kiln::sim::g_used;
    if (used.size() <= static_cast<size_t>(device)) used.resize(static_cast<size_t>(device) + 1, 0);
    if (size > kiln::sim::g_capacity - used[static_cast<size_t>(device)]) {
      *dev_ptr = nullptr;
      return fail(cudaErrorMemoryAllocation);
    }
    used[static_cast<size_t>(device)] += size;
  }
  *dev_ptr = kiln::sim::allocate(size, MemoryKind::Device, device);
  if (*dev_ptr == nullptr) {  // the host itself is out of memory
    std::lock_guard<std::mutex> lock(kiln::sim::g_mutex);
    kiln::sim::g_used[static_cast<size_t>(device)] -= size;
    return fail(cudaErrorMemoryAllocation);
  }
  // A device allocation is an implicit synchronisation: work queued after it, on any stream of
  // the device, waits for all work queued before it (the host does not wait).
  kiln::sim::implicit_synchronization(device);
  return cudaSuccess;
}

// cudaFree waits for the device's work first (it synchronises implicitly on a GPU too), so
// queued kernels never touch freed memory.
cudaError_t cudaFree(void* dev_ptr) {
  if (dev_ptr == nullptr) return cudaSuccess;  // like free(nullptr)
  if (const cudaError_t e = kiln::sim::check_unsafe_call(); e != cudaSuccess) return e;
  const kiln::sim::Region r = kiln::sim::find_region(dev_ptr);
  if (r.kind == MemoryKind::Device) (void)kiln::sim::synchronize_device(r.device);
  return kiln::sim::release(dev_ptr, MemoryKind::Device);
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return fail(cudaErrorInvalidValue);
  const int device = kiln::sim::current_device();
  if (!kiln::sim::valid_device(device)) return fail(cudaErrorNoDevice);
  const size_t used = kiln::sim::device_memory_used(device);
  *total_bytes = kiln::sim::device_capacity();
  *free_bytes = *total_bytes > used ? *total_bytes - used : 0;
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  if (ptr == nullptr || (flags & ~cudaHostAllocPortable) != 0) return fail(cudaErrorInvalidValue);
  if (const cudaError_t e = kiln::sim::check_unsafe_call(); e != cudaSuccess) return e;
  *ptr = kiln::sim::allocate(size, MemoryKind::PinnedHost, -1);
  if (*ptr == nullptr) return fail(cudaErrorMemoryAllocation);
  // A page-locked allocation is an implicit synchronisation of the current device, like a
  // device allocation.
  const int device = kiln::sim::current_device();
  if (kiln::sim::valid_device(device)) kiln::sim::implicit_synchronization(device);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** ptr, size_t size) {
  return cudaHostAlloc(ptr, size, cudaHostAllocDefault);
}
cudaError_t cudaFreeHost(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  if (const cudaError_t e = kiln::sim::check_unsafe_call(); e != cudaSuccess) return e;
  (void)kiln::sim::synchronize_all_devices();  // any device's copy may still read it
  return kiln::sim::release(ptr, MemoryKind::PinnedHost);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (const cudaError_t e = kiln::sim::check_unsafe_call(); e != cudaSuccess) return e;
  return kiln::sim::copy(dst, src, count, kind, nullptr, /*blocking=*/true);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return kiln::sim::copy(dst, src, count, kind, stream, /*blocking=*/false);
}

namespace {
cudaError_t copy_peer(void* dst, int dst_device, const void* src, int src_device, size_t count,
                      cudaStream_t stream, bool blocking) {
  if (!kiln::sim::valid_device(dst_device) || !kiln::sim::valid_device(src_device))
    return fail(cudaErrorInvalidDevice);
  if (count == 0) return cudaSuccess;
  if (!kiln::sim::range_in(dst, count, MemoryKind::Device, dst_device) ||
      !kiln::sim::range_in(src, count, MemoryKind::Device, src_device))
    return fail(cudaErrorInvalidValue);
  kiln::sim::Ticket done;
  const cudaError_t e = kiln::sim::enqueue(
      stream, "cudaMemcpyPeer", [=] { std::memmove(dst, src, count); }, &done);
  if (e != cudaSuccess) return e;
  return blocking ? kiln::sim::wait(done) : cudaSuccess;
}

// Memset needs memory of the stream's device (a missing DeviceGuard shows up here).
cudaError_t set(void* dev_ptr, int value, size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  int device = 0;
  if (!kiln::sim::stream_device(stream, &device)) return fail(cudaErrorInvalidResourceHandle);
  if (!kiln::sim::range_in(dev_ptr, count, MemoryKind::Device, device))
    return fail(cudaErrorInvalidValue);
  // A device memset is an implicit synchronisation of its device: it waits for the work issued
  // before it, on every stream, and the work issued after it waits for it. (Captured, it runs
  // only when the graph does: nothing to order now.)
  const bool fence = !kiln::sim::capturing(stream);
  if (fence) kiln::sim::implicit_synchronization(device);
  const cudaError_t e = kiln::sim::enqueue(stream, "cudaMemset",
                                           [=] { std::memset(dev_ptr, value, count); });
  if (e == cudaSuccess && fence) kiln::sim::implicit_synchronization(device);
  return e;
}
}  // namespace

// The peer copies are ordered on the current device's stream (legacy for cudaMemcpyPeer).
cudaError_t cudaMemcpyPeer(void* dst, int dst_device, const void* src, int src_device,
                           size_t count) {
  if (const cudaError_t e = kiln::sim::check_unsafe_call(); e != cudaSuccess) return e;
  return copy_peer(dst, dst_device, src, src_device, count, nullptr, /*blocking=*/true);
}
cudaError_t cudaMemcpyPeerAsync(void* dst, int dst_device, const void* src, int src_device,
                                size_t count, cudaStream_t stream) {
  return copy_peer(dst, dst_device, src, src_device, count, stream, /*blocking=*/false);
}

cudaError_t cudaMemset(void* dev_ptr, int value, size_t count) {
  return set(dev_ptr, value, count, nullptr);
}
cudaError_t cudaMemsetAsync(void* dev_ptr, int value, size_t count, cudaStream_t stream) {
  return set(dev_ptr, value, count, stream);
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  if (attributes == nullptr) return fail(cudaErrorInvalidValue);
  const kiln::sim::Region r = kiln::sim::find_region(ptr);
  void* p = const_cast<void*>(ptr);
  switch (r.kind) {
    case MemoryKind::Device: *attributes = {cudaMemoryTypeDevice, r.device, p, nullptr}; break;
    case MemoryKind::PinnedHost: *attributes = {cudaMemoryTypeHost, -1, nullptr, p}; break;
    default: *attributes = {cudaMemoryTypeUnregistered, -1, nullptr, p}; break;
  }
  return cudaSuccess;
}
