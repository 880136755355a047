// caching_allocator.cpp: see caching_allocator.h for the scheme (points 1-4 below refer to it).
#include "engine/cuda/caching_allocator.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/cuda/sync_calls.h"
#include "engine/error.h"

#include "engine/sanitizer.h"

namespace kiln::cuda_allocator {
namespace {

#if KILN_CUDA_SIM
// The simulator makes device memory hostile, as a GPU's is (its memory is the host's, so the
// allocator can do it directly): every block handed out, fresh or reused, holds NaN (all bytes
// 0xFF: a NaN in f32 and f64, -1 in integers) rather than zeros or a previous tensor's values
// that would let a kernel that forgets part of its output pass; and under AddressSanitizer the
// slack between the requested size and the rounded block is poisoned, so a kernel writing one
// element past the end fails at once instead of landing in memory nothing checks. Both happen
// in stream order (device work queued on the block's stream, as a memset would be; not a host
// function, which would serialise with the program's own): work queued earlier by the
// block's previous user may still be running when the block is handed out again.
struct HostileBlock {
  char* ptr;
  size_t bytes, size;
};
void make_hostile(void* data) {
  const std::unique_ptr<HostileBlock> b(static_cast<HostileBlock*>(data));
  KILN_ASAN_UNPOISON(b->ptr, b->size);
  std::memset(b->ptr, 0xFF, b->size);
  KILN_ASAN_POISON(b->ptr + b->bytes, b->size - b->bytes);
}
void hand_out_hostile(void* ptr, size_t bytes, size_t size, cudaStream_t stream) {
  auto* b = new HostileBlock{static_cast<char*>(ptr), bytes, size};
  const cudaError_t err = kiln::sim::enqueue_device_work(stream, "NaN fill", make_hostile, b);
  if (err != cudaSuccess) {
    delete b;
    (void)cudaGetLastError();  // a faulted device: the block is left as it is
  }
}
#endif

constexpr size_t kSmallGranule = 512;       // requests up to kLargeThreshold
constexpr size_t kLargeThreshold = 1 << 20;  // 1 MiB
constexpr size_t kLargeGranule = 2 << 20;    // 2 MiB, the driver's page size for device memory

// A block's bookkeeping. Not shared with the pinned pool's Block (pinned_allocator.cpp): a
// device block belongs to one device and stream and lists the other streams that used it,
// freed to its stream's list; a pinned block serves every device and stream and keeps one
// event per stream instead. (The CPU pool needs no record beyond the size: allocator.cpp.)
struct Block {
  size_t size = 0;  // rounded
  int device = 0;
  cudaStream_t stream = nullptr;         // the stream it was allocated on: its free list
  bool in_use = false;
  std::vector<cudaStream_t> other_streams;  // record_stream() calls while in use (point 3)
};

// A freed block waiting for the work on its other streams (one event each) to complete.
struct PendingFree {
  void* ptr = nullptr;
  std::vector<cudaEvent_t> events;
};

struct DevicePool {
  std::map<cudaStream_t, std::multimap<size_t, void*>> free_lists;  // stream -> size -> block
  std::vector<PendingFree> pending;
  MemoryStats stats;
};

struct State {
  std::mutex mu;
  std::unordered_map<void*, Block> blocks;  // every block held from the driver
  std::vector<DevicePool> devices;

  DevicePool& pool(int device) {
    if (devices.size() <= static_cast<size_t>(device)) devices.resize(static_cast<size_t>(device) + 1);
    return devices[static_cast<size_t>(device)];
  }
};

State& state() {
  static State* s = new State();  // never destroyed: tensors may be freed during static teardown
  return *s;
}

std::string human_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

// Moves the pending blocks whose events have all completed onto their free lists (point 3).
void collect_pending(State& s, DevicePool& pool) {
  for (size_t i = 0; i < pool.pending.size();) {
    PendingFree& p = pool.pending[i];
    bool done = true;
    for (cudaEvent_t e : p.events) {
      const cudaError_t err = cudaEventQuery(e);
      if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        done = false;
        break;
      }
      KILN_CUDA_CHECK(err);
    }
    if (!done) {
      ++i;
      continue;
    }
    for (cudaEvent_t e : p.events) (void)cudaEventDestroy(e);
    const Block& b = s.blocks.at(p.ptr);
    pool.free_lists[b.stream].emplace(b.size, p.ptr);
    pool.pending[i] = std::move(pool.pending.back());
    pool.pending.pop_back();
  }
}

// cudaFree of every cached block of the device; pending blocks are waited for first.
// Returns the bytes released.
int64_t release_cached_locked(State& s, int device) {
  DevicePool& pool = s.pool(device);
  if (pool.free_lists.empty() && pool.pending.empty()) return 0;
  cuda::DeviceGuard guard(device);
  for (PendingFree& p : pool.pending) {
    for (cudaEvent_t e : p.events) {
      cuda::event_synchronize(e, cuda::SyncSite().named("cuda_allocator::release_cached()"));
      (void)cudaEventDestroy(e);
    }
    p.events.clear();
  }
  collect_pending(s, pool);
  int64_t released = 0;
  for (auto& [stream, list] : pool.free_lists) {
    for (auto& [size, ptr] : list) {
      cuda::device_free(ptr, cuda::SyncSite().named("cuda_allocator::release_cached()"));
      released += static_cast<int64_t>(size);
      s.blocks.erase(ptr);
    }
  }
  pool.free_lists.clear();
  pool.stats.reserved_bytes -= released;
  return released;
}

[[noreturn]] void throw_out_of_memory(DevicePool& pool, size_t bytes, size_t size, int device,
                                      int64_t released) {
  const MemoryStats& st = pool.stats;
  const std::string dev = "cuda:" + std::to_string(device);
  std::string msg = "CUDA out of memory on " + dev + ": tried to allocate " + human_bytes(bytes) +
                    " (" + std::to_string(bytes) + " bytes, rounded to " + std::to_string(size) +
                    ")";
  if (released > 0) msg += ", even after releasing " + human_bytes(released) + " of cached blocks";
  msg += ". Kiln's memory on " + dev + ": " + human_bytes(st.current_bytes) +
         " in use by tensors (peak " + human_bytes(st.peak_bytes) + "), " +
         human_bytes(st.reserved_bytes) + " reserved from the driver in " +
         std::to_string(st.os_allocs) + " cudaMalloc calls";
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    msg += "; the device has " + human_bytes(static_cast<int64_t>(free_bytes)) + " free of " +
           human_bytes(static_cast<int64_t>(total_bytes));
  } else {
    (void)cudaGetLastError();
  }
  msg += ". Use a smaller batch size (--batch-size) or a smaller model, and drop references to "
         "tensors you no longer need (a kept loss still holds its whole graph).";
  throw OutOfMemory(msg);
}

// cudaMalloc with one retry after releasing the cache (point 4). Called with the mutex held.
void* device_malloc(State& s, DevicePool& pool, size_t bytes, size_t size, int device) {
  cuda::DeviceGuard guard(device);
  void* ptr = nullptr;
  cudaError_t err = cudaMalloc(&ptr, size);
  int64_t released = 0;
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    released = release_cached_locked(s, device);
    err = cudaMalloc(&ptr, size);
  }
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    throw_out_of_memory(pool, bytes, size, device, released);
  }
  KILN_CUDA_CHECK(err);
  pool.stats.os_allocs++;
  pool.stats.reserved_bytes += static_cast<int64_t>(size);
  return ptr;
}

}  // namespace

size_t round_size(size_t bytes) {
  return round_block_size(bytes, kSmallGranule, kLargeThreshold, kLargeGranule);
}

void* allocate(size_t bytes, int device) {
  return allocate(bytes, device, cuda::current_stream(device));
}

void* allocate(size_t bytes, int device, cudaStream_t stream) {
  cuda::check_device(device);
  const size_t size = round_size(bytes);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  DevicePool& pool = s.pool(device);
  if (!pool.pending.empty()) collect_pending(s, pool);

  void* ptr = nullptr;
  auto list = pool.free_lists.find(stream);
  if (list != pool.free_lists.end()) {
    auto it = list->second.find(size);
    if (it != list->second.end()) {
      ptr = it->second;
      list->second.erase(it);
    }
  }
  if (!ptr) {
    ptr = device_malloc(s, pool, bytes, size, device);
    Block& b = s.blocks[ptr];
    b.size = size;
    b.device = device;
    b.stream = stream;
  }
  s.blocks.at(ptr).in_use = true;
#if KILN_CUDA_SIM
  hand_out_hostile(ptr, bytes, size, stream);
#endif
  pool.stats.current_bytes += static_cast<int64_t>(size);
  if (pool.stats.current_bytes > pool.stats.peak_bytes) pool.stats.peak_bytes = pool.stats.current_bytes;
  return ptr;
}

void deallocate(void* ptr) {
  if (!ptr) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.blocks.find(ptr);
  KILN_CHECK(it != s.blocks.end() && it->second.in_use,
             "cuda_allocator::deallocate: ", ptr, " is not an allocated CUDA block (double free?)");
  Block& b = it->second;
  DevicePool& pool = s.pool(b.device);
  b.in_use = false;
  KILN_ASAN_UNPOISON(ptr, b.size);  // the whole block is the allocator's again
  pool.stats.current_bytes -= static_cast<int64_t>(b.size);
  if (b.other_streams.empty()) {
    pool.free_lists[b.stream].emplace(b.size, ptr);
    return;
  }
  // Point 3: mark the end of the work queued so far on each other stream.
  PendingFree p{ptr, {}};
  cuda::DeviceGuard guard(b.device);
  for (cudaStream_t other : b.other_streams) {
    cudaEvent_t e = nullptr;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    KILN_CUDA_CHECK(cudaEventRecord(e, other));
    p.events.push_back(e);
  }
  b.other_streams.clear();
  pool.pending.push_back(std::move(p));
}

void record_stream(void* ptr, cudaStream_t stream) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.blocks.find(ptr);
  KILN_CHECK(it != s.blocks.end() && it->second.in_use, "cuda_allocator::record_stream: ", ptr,
             " is not the start of an allocated CUDA block (pass the storage's base pointer)");
  Block& b = it->second;
  if (stream == b.stream) return;
  for (cudaStream_t o : b.other_streams)
    if (o == stream) return;
  b.other_streams.push_back(stream);
}

MemoryStats stats(int device) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.pool(device).stats;
}

void reset_peak(int device) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  MemoryStats& st = s.pool(device).stats;
  st.peak_bytes = st.current_bytes;
}

void release_cached(int device) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  release_cached_locked(s, device);
}

void release_cached() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  for (size_t d = 0; d < s.devices.size(); ++d) release_cached_locked(s, static_cast<int>(d));
}

}  // namespace kiln::cuda_allocator
