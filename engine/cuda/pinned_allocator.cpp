// pinned_allocator.cpp: see pinned_allocator.h.
#include "engine/cuda/pinned_allocator.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/cuda/check.h"
#include "engine/cuda/sync_calls.h"
#include "engine/error.h"

namespace kiln::pinned_allocator {
namespace {

constexpr size_t kPage = 4096;

// A pinned block's bookkeeping. Not the caching allocator's Block (caching_allocator.cpp): a
// pinned block has no device or stream of its own (any stream of any device copies from it),
// so it keeps the last event of each stream that used it rather than a home stream.
struct Block {
  size_t size = 0;  // rounded
  bool in_use = false;
  // The last event recorded on each stream that used the block. One per stream is enough: a
  // stream runs in order, so its latest event completing implies the earlier ones did.
  std::vector<std::pair<cudaStream_t, cudaEvent_t>> events;
};

struct State {
  std::mutex mu;
  std::unordered_map<void*, Block> blocks;  // every pinned block, in use or cached
  std::multimap<size_t, void*> free_list;   // rounded size -> block, ready for reuse
  std::vector<void*> pending;               // freed, waiting for their events
  MemoryStats stats;
};

State& state() {
  static State* s = new State();  // never destroyed: tensors may be freed during static teardown
  return *s;
}

// True once every event of the block completed; completed events are destroyed.
// An event whose query fails with another error belongs to a device whose context has failed
// (a kernel fault: a sticky error, after which the device runs no more work, so no copy still
// reads the block). It counts as done: the block may be reused, and the error stays the
// device's, reported by its next synchronising call. Throwing here instead would throw out of
// a tensor's destructor (deallocate), ending the process while it reports the failure, as a
// rank that loses its peers mid-step does (tools/rank_death.sh).
bool events_done(Block& b) {
  for (size_t i = 0; i < b.events.size();) {
    const cudaError_t err = cudaEventQuery(b.events[i].second);
    if (err == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    if (err != cudaSuccess) (void)cudaGetLastError();  // the device's failure, not this block's
    (void)cudaEventDestroy(b.events[i].second);
    b.events[i] = b.events.back();
    b.events.pop_back();
  }
  return true;
}

void collect_pending(State& s) {
  for (size_t i = 0; i < s.pending.size();) {
    Block& b = s.blocks.at(s.pending[i]);
    if (!events_done(b)) {
      ++i;
      continue;
    }
    s.free_list.emplace(b.size, s.pending[i]);
    s.pending[i] = s.pending.back();
    s.pending.pop_back();
  }
}

void release_cached_locked(State& s) {
  for (void* ptr : s.pending) {
    for (auto& [stream, event] : s.blocks.at(ptr).events) {
      cuda::event_synchronize(event, cuda::SyncSite().named("pinned_allocator::release_cached()"));
    }
  }
  collect_pending(s);
  for (auto& [size, ptr] : s.free_list) {
    cuda::host_free(ptr, cuda::SyncSite().named("pinned_allocator::release_cached()"));
    s.stats.reserved_bytes -= static_cast<int64_t>(size);
    s.blocks.erase(ptr);
  }
  s.free_list.clear();
}

}  // namespace

size_t round_size(size_t bytes) { return round_block_size(bytes, kPage, kPage, kPage); }

void* allocate(size_t bytes) {
  const size_t size = round_size(bytes);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.pending.empty()) collect_pending(s);
  void* ptr = nullptr;
  auto it = s.free_list.find(size);
  if (it != s.free_list.end()) {
    ptr = it->second;
    s.free_list.erase(it);
  } else {
    cudaError_t err = cudaHostAlloc(&ptr, size, cudaHostAllocDefault);
    if (err != cudaSuccess) {  // out of lockable memory: give the cache back and try once more
      (void)cudaGetLastError();
      release_cached_locked(s);
      err = cudaHostAlloc(&ptr, size, cudaHostAllocDefault);
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      throw OutOfMemory(detail::str("cannot pin ", bytes, " bytes of host memory (cudaHostAlloc: ",
                              cudaGetErrorName(err), "; pinned in use ", s.stats.current_bytes,
                              " bytes, reserved ", s.stats.reserved_bytes,
                              "): use smaller batches or fewer prefetched batches, or raise the "
                              "locked-memory limit (ulimit -l)"));
    }
    s.blocks[ptr].size = size;
    s.stats.os_allocs++;
    s.stats.reserved_bytes += static_cast<int64_t>(size);
  }
  s.blocks.at(ptr).in_use = true;
  s.stats.current_bytes += static_cast<int64_t>(size);
  if (s.stats.current_bytes > s.stats.peak_bytes) s.stats.peak_bytes = s.stats.current_bytes;
  return ptr;
}

void deallocate(void* ptr) {
  if (!ptr) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.blocks.find(ptr);
  KILN_CHECK(it != s.blocks.end() && it->second.in_use, "pinned_allocator::deallocate: ", ptr,
             " is not an allocated pinned block (double free?)");
  Block& b = it->second;
  b.in_use = false;
  s.stats.current_bytes -= static_cast<int64_t>(b.size);
  if (events_done(b)) {
    s.free_list.emplace(b.size, ptr);
  } else {
    s.pending.push_back(ptr);
  }
}

void record_stream(void* ptr, cudaStream_t stream) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.blocks.find(ptr);
  KILN_CHECK(it != s.blocks.end() && it->second.in_use, "pinned_allocator::record_stream: ", ptr,
             " is not the start of an allocated pinned block");
  auto& events = it->second.events;
  for (auto& [st, event] : events) {
    if (st == stream) {  // re-record: the new point follows the old one on the same stream
      KILN_CUDA_CHECK(cudaEventRecord(event, stream));
      return;
    }
  }
  cudaEvent_t event = nullptr;
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  KILN_CUDA_CHECK(cudaEventRecord(event, stream));
  events.emplace_back(stream, event);
}

bool owns(const void* ptr) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.blocks.count(const_cast<void*>(ptr)) > 0;
}

MemoryStats stats() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.stats;
}

void reset_peak() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.stats.peak_bytes = s.stats.current_bytes;
}

void release_cached() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  release_cached_locked(s);
}

}  // namespace kiln::pinned_allocator
