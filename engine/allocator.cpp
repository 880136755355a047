// allocator.cpp: the CPU allocator: 64-byte aligned blocks in size-keyed free lists, counted per cpu:N.
#include "engine/allocator.h"

#include <cstdlib>
#include <map>
#include <mutex>

#include "engine/error.h"

namespace kiln::cpu_allocator {
namespace {

constexpr size_t kAlign = 64;

// Sizes are rounded so that nearby requests share blocks: to 64 B below 4 KiB, to 4 KiB above.
size_t round_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  size_t step = bytes < 4096 ? 64 : 4096;
  return (bytes + step - 1) / step * step;
}

struct Pool {
  std::mutex mu;
  std::multimap<size_t, void*> free_blocks;  // rounded size -> block
  MemoryStats stats;
  std::map<int, MemoryStats> per_device;  // current and peak bytes by cpu:N index
};

void count_in(Pool& p, int device, size_t size) {
  p.stats.current_bytes += size;
  if (p.stats.current_bytes > p.stats.peak_bytes) p.stats.peak_bytes = p.stats.current_bytes;
  MemoryStats& d = p.per_device[device];
  d.current_bytes += size;
  if (d.current_bytes > d.peak_bytes) d.peak_bytes = d.current_bytes;
}

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: tensors may be freed during static teardown
  return *p;
}

}  // namespace

void* allocate(size_t bytes, int device) {
  size_t size = round_size(bytes);
  Pool& p = pool();
  {
    std::lock_guard<std::mutex> lock(p.mu);
    auto it = p.free_blocks.find(size);
    if (it != p.free_blocks.end()) {
      void* ptr = it->second;
      p.free_blocks.erase(it);
      count_in(p, device, size);
      return ptr;
    }
  }
  void* ptr = std::aligned_alloc(kAlign, size);
  if (!ptr) {
    release_cached();
    ptr = std::aligned_alloc(kAlign, size);
  }
  if (!ptr) {
    MemoryStats s = stats();
    throw OutOfMemory(detail::str("out of CPU memory allocating ", bytes, " bytes (in use ",
                            s.current_bytes, ", reserved ", s.reserved_bytes,
                            "): use a smaller batch size"));
  }
  std::lock_guard<std::mutex> lock(p.mu);
  p.stats.os_allocs++;
  p.stats.reserved_bytes += size;
  count_in(p, device, size);
  return ptr;
}

void deallocate(void* ptr, size_t bytes, int device) {
  if (!ptr) return;
  size_t size = round_size(bytes);
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  p.stats.current_bytes -= size;
  p.per_device[device].current_bytes -= size;
  p.free_blocks.emplace(size, ptr);
}

MemoryStats stats() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  return p.stats;
}

MemoryStats stats(int device) {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  auto it = p.per_device.find(device);
  return it == p.per_device.end() ? MemoryStats() : it->second;
}

void reset_peak(int device) {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  MemoryStats& d = p.per_device[device];
  d.peak_bytes = d.current_bytes;
}

void reset_peak() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  p.stats.peak_bytes = p.stats.current_bytes;
}

void release_cached() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  for (auto& [size, ptr] : p.free_blocks) {
    std::free(ptr);
    p.stats.reserved_bytes -= static_cast<int64_t>(size);
  }
  p.free_blocks.clear();
}

}  // namespace kiln::cpu_allocator
