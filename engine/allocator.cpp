// allocator.cpp: the CPU allocator: 64-byte aligned blocks in size-keyed free lists, counted per cpu:N.
#include "engine/allocator.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>

#include "engine/error.h"
#include "engine/sanitizer.h"

namespace kiln::cpu_allocator {
namespace {

constexpr size_t kAlign = 64;

// Blocks of this size and more are mapped by the pool (allocator.h says why). 128 KiB is
// glibc's initial mmap threshold: below it, malloc's bins serve small blocks well.
constexpr size_t kMapThreshold = size_t{128} << 10;


// Sizes are rounded so that nearby requests share blocks: to 64 B up to 4 KiB, to 4 KiB above
// (round_block_size, allocator.h).
size_t round_size(size_t bytes) { return round_block_size(bytes, kAlign, 4096, 4096); }

// Under AddressSanitizer every block comes from its malloc, whose redzones catch a write past a
// block's end (pages of an mmap'ed block are followed by whatever is mapped next).
bool maps(size_t size) {
#if KILN_ASAN
  (void)size;
  return false;
#else
  return size >= kMapThreshold;
#endif
}

void* os_allocate(size_t size) {
  if (!maps(size)) return std::aligned_alloc(kAlign, size);
  void* ptr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return ptr == MAP_FAILED ? nullptr : ptr;  // page-aligned, so 64-byte aligned
}

void os_free(void* ptr, size_t size) {
  if (maps(size)) {
    munmap(ptr, size);
  } else {
    std::free(ptr);
  }
}

struct Pool {
  std::mutex mu;
  std::multimap<size_t, void*> free_blocks;  // block size -> cached block
  std::unordered_map<void*, size_t> in_use;  // block handed out -> its size (>= the request's)
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

// Under AddressSanitizer a block handed out is addressable for the `bytes` asked for and no
// further: the rest of a rounded or larger cached block stays poisoned, so a write past a
// tensor's end is reported even inside Kiln's pool, as is any use of a cached (freed) block.
void expose(void* ptr, size_t bytes, size_t block_size) {
  KILN_ASAN_UNPOISON(ptr, bytes);
  KILN_ASAN_POISON(static_cast<char*>(ptr) + bytes, block_size - bytes);
}

// The smallest cached block of at least `size` bytes and at most 1.5 times that, taken out of
// the cache; null when there is none. Caller holds p.mu.
void* take_cached(Pool& p, size_t size, size_t& block_size) {
  auto it = p.free_blocks.lower_bound(size);
  if (it == p.free_blocks.end() || it->first - size > size / 2) return nullptr;
  block_size = it->first;
  void* ptr = it->second;
  p.free_blocks.erase(it);
  return ptr;
}

}  // namespace

void* allocate(size_t bytes, int device) {
  size_t size = round_size(bytes);
  Pool& p = pool();
  {
    std::lock_guard<std::mutex> lock(p.mu);
    size_t block_size = 0;
    if (void* ptr = take_cached(p, size, block_size)) {
      p.in_use.emplace(ptr, block_size);
      count_in(p, device, block_size);
      expose(ptr, bytes, block_size);
      return ptr;
    }
  }
  void* ptr = os_allocate(size);
  if (!ptr) {
    release_cached();
    ptr = os_allocate(size);
  }
  if (!ptr) {
    MemoryStats s = stats();
    throw OutOfMemory(detail::str("out of CPU memory allocating ", bytes, " bytes (in use ",
                            s.current_bytes, ", reserved ", s.reserved_bytes,
                            "): use a smaller batch size"));
  }
  std::lock_guard<std::mutex> lock(p.mu);
  p.stats.os_allocs++;
  p.stats.reserved_bytes += static_cast<int64_t>(size);
  p.in_use.emplace(ptr, size);
  count_in(p, device, size);
  expose(ptr, bytes, size);
  return ptr;
}

void deallocate(void* ptr, size_t bytes, int device) {
  if (!ptr) return;
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  auto it = p.in_use.find(ptr);
  KILN_CHECK(it != p.in_use.end(), "cpu_allocator::deallocate: ", ptr, " (", bytes,
             " bytes) is not a block handed out by this allocator, or was freed twice");
  const size_t size = it->second;
  p.in_use.erase(it);
  p.stats.current_bytes -= static_cast<int64_t>(size);
  p.per_device[device].current_bytes -= static_cast<int64_t>(size);
  KILN_ASAN_POISON(ptr, size);  // a cached block: any use of it now is a use after free
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
    KILN_ASAN_UNPOISON(ptr, size);
    os_free(ptr, size);
    p.stats.reserved_bytes -= static_cast<int64_t>(size);
  }
  p.free_blocks.clear();
}

}  // namespace kiln::cpu_allocator
