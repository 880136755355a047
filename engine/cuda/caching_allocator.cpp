// caching_allocator.cpp: see caching_allocator.h for the scheme (points 1-4 below refer to it).
#include "engine/cuda/caching_allocator.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
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
// A private pool's block (point 5) is handed out during a capture, where work queued on the
// stream is recorded into the graph rather than run. Recording the fill would run it again at
// every replay, at the allocation's place in the step: a block allocated in the capture but
// written only outside the graph (a static input) would be wiped by each replay, which a GPU
// never does. So nothing is queued. A fresh block (just from cudaMalloc: no work anywhere can
// use it yet) is made hostile here, on the host, so the first replay finds NaN where a kernel
// forgot to write, as eagerly. A block reused inside the pool is left as it is: the graph
// hands it over, at every replay, holding what its previous user in the step wrote, exactly
// as on a GPU, and only the graph's work (which has not run yet) ever used it.
void hand_out_hostile_now(void* ptr, size_t bytes, size_t size) {
  make_hostile(new HostileBlock{static_cast<char*>(ptr), bytes, size});
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
  PoolId pool = 0;  // the private pool it was allocated from (point 5); 0: none
  bool in_use = false;
  std::vector<cudaStream_t> other_streams;  // record_stream() calls while in use (point 3)
};

// A freed block waiting for the work on its other streams (one event each) to complete.
struct PendingFree {
  void* ptr = nullptr;
  std::vector<cudaEvent_t> events;
};

using FreeLists = std::map<cudaStream_t, std::multimap<size_t, void*>>;  // stream -> size -> block

struct DevicePool {
  FreeLists free_lists;
  std::vector<PendingFree> pending;
  // Point 5. Blocks freed during a capture with other streams to wait for: their events are
  // recorded (and then polled) once no capture is underway.
  std::vector<void*> deferred;
  // Blocks of released private pools, freed since: only release_cached() may take them (it
  // returns them to the driver).
  std::vector<void*> orphans;
  MemoryStats stats;
};

// A live private pool (point 5): its blocks' free lists, and how many streams allocate to it.
struct PrivatePool {
  int device = -1;  // set by the first begin_allocate_to_pool
  FreeLists free_lists;
  int streams = 0;
};

struct Route {
  int device;
  PoolId pool;
};

struct State {
  std::mutex mu;
  std::unordered_map<void*, Block> blocks;  // every block held from the driver
  std::vector<DevicePool> devices;
  std::map<PoolId, PrivatePool> pools;            // created and not yet released
  std::unordered_map<cudaStream_t, Route> routes;  // streams allocating to a pool now
  PoolId next_pool = 1;

  bool capturing() const { return !routes.empty(); }

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

// Puts a free block where its next user may come from: its private pool's list while that
// pool lives, the orphans once it was released (point 5), the device's list otherwise.
void put_free(State& s, DevicePool& dev, void* ptr) {
  const Block& b = s.blocks.at(ptr);
  if (b.pool == 0) {
    dev.free_lists[b.stream].emplace(b.size, ptr);
    return;
  }
  auto pool = s.pools.find(b.pool);
  if (pool != s.pools.end()) {
    pool->second.free_lists[b.stream].emplace(b.size, ptr);
  } else {
    dev.orphans.push_back(ptr);
  }
}

// Point 3: marks the end of the work queued so far on each other stream of a freed block with
// an event, and puts the block on the pending list. Not during a capture (point 5).
void mark_other_streams(State& s, DevicePool& dev, void* ptr) {
  Block& b = s.blocks.at(ptr);
  PendingFree p{ptr, {}};
  cuda::DeviceGuard guard(b.device);
  for (cudaStream_t other : b.other_streams) {
    cudaEvent_t e = nullptr;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    KILN_CUDA_CHECK(cudaEventRecord(e, other));
    p.events.push_back(e);
  }
  b.other_streams.clear();
  dev.pending.push_back(std::move(p));
}

// Point 5: the frees deferred during a capture get their events now that none is underway.
void mark_deferred(State& s, DevicePool& dev) {
  for (void* ptr : dev.deferred) mark_other_streams(s, dev, ptr);
  dev.deferred.clear();
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
    put_free(s, pool, p.ptr);
    pool.pending[i] = std::move(pool.pending.back());
    pool.pending.pop_back();
  }
}

// cudaFree of every cached block of the device (not of a live private pool); pending blocks are
// waited for first. Returns the bytes released. Never during a capture (point 5).
int64_t release_cached_locked(State& s, int device) {
  DevicePool& pool = s.pool(device);
  if (pool.free_lists.empty() && pool.pending.empty() && pool.deferred.empty() &&
      pool.orphans.empty())
    return 0;
  cuda::DeviceGuard guard(device);
  mark_deferred(s, pool);
  for (PendingFree& p : pool.pending) {
    for (cudaEvent_t e : p.events) {
      cuda::event_synchronize(e, cuda::SyncSite().named("cuda_allocator::release_cached()"));
      (void)cudaEventDestroy(e);
    }
    p.events.clear();
  }
  collect_pending(s, pool);
  int64_t released = 0;
  const cuda::SyncSite site = cuda::SyncSite().named("cuda_allocator::release_cached()");
  for (auto& [stream, list] : pool.free_lists) {
    for (auto& [size, ptr] : list) {
      cuda::device_free(ptr, site);
      released += static_cast<int64_t>(size);
      s.blocks.erase(ptr);
    }
  }
  pool.free_lists.clear();
  for (void* ptr : pool.orphans) {
    cuda::device_free(ptr, site);
    released += static_cast<int64_t>(s.blocks.at(ptr).size);
    s.blocks.erase(ptr);
  }
  pool.orphans.clear();
  pool.stats.reserved_bytes -= released;
  return released;
}

[[noreturn]] void throw_out_of_memory(DevicePool& pool, size_t bytes, size_t size, int device,
                                      int64_t released, bool capturing) {
  const MemoryStats& st = pool.stats;
  const std::string dev = "cuda:" + std::to_string(device);
  std::string msg = "CUDA out of memory on " + dev + ": tried to allocate " + human_bytes(bytes) +
                    " (" + std::to_string(bytes) + " bytes, rounded to " + std::to_string(size) +
                    ")";
  if (released > 0) msg += ", even after releasing " + human_bytes(released) + " of cached blocks";
  if (capturing) {
    msg += ", during a CUDA graph capture (the cached blocks were not released: cudaFree would "
           "invalidate the capture; call cuda_allocator::release_cached() before capturing)";
  }
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

// cudaMalloc. During a capture (point 5) with this thread's capture mode relaxed for the call:
// a capture in the global or thread-local mode forbids cudaMalloc, because the allocation is
// not recorded in the graph and a graph that needed it made at every replay would be wrong.
// Here the block is made once and kept by the pool for the graph's whole life, which is what
// the graph needs. (PyTorch's allocator also calls cudaMalloc during capture.)
cudaError_t cuda_malloc(void** ptr, size_t size, bool capturing) {
  if (!capturing) return cudaMalloc(ptr, size);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  KILN_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  const cudaError_t err = cudaMalloc(ptr, size);
  (void)cudaThreadExchangeStreamCaptureMode(&mode);  // the thread's own mode again
  return err;
}

// cudaMalloc with one retry after releasing the cache (point 4); during a capture, no retry
// (point 5). Called with the mutex held.
void* device_malloc(State& s, DevicePool& pool, size_t bytes, size_t size, int device) {
  cuda::DeviceGuard guard(device);
  const bool capturing = s.capturing();
  void* ptr = nullptr;
  cudaError_t err = cuda_malloc(&ptr, size, capturing);
  int64_t released = 0;
  if (err == cudaErrorMemoryAllocation && !capturing) {
    (void)cudaGetLastError();
    released = release_cached_locked(s, device);
    err = cudaMalloc(&ptr, size);
  }
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    throw_out_of_memory(pool, bytes, size, device, released, capturing);
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
  if (!s.capturing()) {  // point 5: no event is recorded or polled during a capture
    if (!pool.deferred.empty()) mark_deferred(s, pool);
    if (!pool.pending.empty()) collect_pending(s, pool);
  }

  // Point 5: a stream allocating to a private pool takes the pool's blocks, and only those.
  PoolId private_pool = 0;
  FreeLists* lists = &pool.free_lists;
  if (auto route = s.routes.find(stream); route != s.routes.end()) {
    KILN_CHECK(route->second.device == device, "cuda_allocator::allocate on cuda:", device,
               " with a stream of cuda:", route->second.device);
    private_pool = route->second.pool;
    lists = &s.pools.at(private_pool).free_lists;
  }
  void* ptr = nullptr;
  auto list = lists->find(stream);
  if (list != lists->end()) {
    auto it = list->second.find(size);
    if (it != list->second.end()) {
      ptr = it->second;
      list->second.erase(it);
    }
  }
  const bool fresh = ptr == nullptr;
  if (fresh) {
    ptr = device_malloc(s, pool, bytes, size, device);
    Block& b = s.blocks[ptr];
    b.size = size;
    b.device = device;
    b.stream = stream;
    b.pool = private_pool;
  }
  s.blocks.at(ptr).in_use = true;
#if KILN_CUDA_SIM
  if (private_pool == 0) {
    hand_out_hostile(ptr, bytes, size, stream);
  } else if (fresh) {
    hand_out_hostile_now(ptr, bytes, size);
  }
#else
  (void)fresh;
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
    put_free(s, pool, ptr);
  } else if (s.capturing()) {
    // Point 5: an event recorded now on a capturing stream would be part of the capture, and
    // could never be polled; the block waits, unused, until no capture is underway.
    pool.deferred.push_back(ptr);
  } else {
    mark_other_streams(s, pool, ptr);  // point 3
  }
}

// Bookkeeping only, so it is the same during a capture: the events are recorded when the block
// is freed (and deferred if that happens during a capture, point 5).
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

namespace {
void check_not_capturing(const State& s) {
  KILN_CHECK(!s.capturing(),
             "cuda_allocator::release_cached() during a CUDA graph capture: its cudaFree waits "
             "for the device, which invalidates the capture; call it before the capture begins "
             "or after it ends");
}
}  // namespace

void release_cached(int device) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  check_not_capturing(s);
  release_cached_locked(s, device);
}

void release_cached() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  check_not_capturing(s);
  for (size_t d = 0; d < s.devices.size(); ++d) release_cached_locked(s, static_cast<int>(d));
}

// ---- Private pools (point 5) ----------------------------------------------------------------

PoolId create_pool() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const PoolId id = s.next_pool++;
  s.pools.emplace(id, PrivatePool{});
  return id;
}

namespace {
// The live pool `id`, to be used on `device`; a kiln::Error naming `api` otherwise.
PrivatePool& live_pool(State& s, PoolId id, int device, const char* api) {
  auto it = s.pools.find(id);
  KILN_CHECK(it != s.pools.end(), "cuda_allocator::", api, ": pool ", id,
             id > 0 && id < s.next_pool ? " was released already"
                                        : " was never created (use create_pool())");
  PrivatePool& p = it->second;
  KILN_CHECK(p.device == -1 || p.device == device, "cuda_allocator::", api, ": pool ", id,
             " belongs to cuda:", p.device, ", not cuda:", device);
  return p;
}
}  // namespace

void begin_allocate_to_pool(int device, PoolId pool, cudaStream_t stream) {
  cuda::check_device(device);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  PrivatePool& p = live_pool(s, pool, device, "begin_allocate_to_pool");
  auto route = s.routes.find(stream);
  KILN_CHECK(route == s.routes.end(), "cuda_allocator::begin_allocate_to_pool: the stream "
             "allocates to pool ", route == s.routes.end() ? 0 : route->second.pool,
             " already; end_allocate_to_pool first");
  p.device = device;
  p.streams++;
  s.routes.emplace(stream, Route{device, pool});
}

void end_allocate_to_pool(int device, PoolId pool) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  PrivatePool& p = live_pool(s, pool, device, "end_allocate_to_pool");
  for (auto it = s.routes.begin(); it != s.routes.end();) {
    it = it->second.pool == pool ? s.routes.erase(it) : std::next(it);
  }
  p.streams = 0;
}

void release_pool(int device, PoolId pool, cuda::SyncSite site) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  PrivatePool& p = live_pool(s, pool, device, "release_pool");
  KILN_CHECK(p.streams == 0, "cuda_allocator::release_pool: pool ", pool,
             " is still being allocated to; end_allocate_to_pool first");
  if (p.device == -1) {  // never used
    s.pools.erase(pool);
    return;
  }
  DevicePool& dev = s.pool(device);
  // From now on the pool's blocks are orphans: its cached ones now, the others when freed
  // (put_free). They go to the driver, never to eager code.
  for (auto& [stream, list] : p.free_lists)
    for (auto& [size, ptr] : list) dev.orphans.push_back(ptr);
  s.pools.erase(pool);
  if (s.capturing()) return;  // cudaFree would invalidate the capture: release_cached() will
  cuda::DeviceGuard guard(device);
  while (!dev.orphans.empty()) {
    void* ptr = dev.orphans.back();
    dev.orphans.pop_back();
    const int64_t size = static_cast<int64_t>(s.blocks.at(ptr).size);
    s.blocks.erase(ptr);
    dev.stats.reserved_bytes -= size;
    cuda::device_free(ptr, site.named("cuda_allocator::release_pool()"));
  }
}

bool capture_underway() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.capturing();
}

}  // namespace kiln::cuda_allocator
