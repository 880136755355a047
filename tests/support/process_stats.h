// process_stats.h: what a long run must not grow, read from /proc/self and the allocators, for
// the soak tests (tests/soak/) and anything else that checks a process stays flat.
//
//   ProcessStats a = process_stats();  ...  ProcessStats b = process_stats();
//   EXPECT_LT(growth(a.rss_bytes, b.rss_bytes), 0.05);  EXPECT_EQ(a.threads, b.threads);
//
// rss_bytes is the resident set (/proc/self/statm, field 2, in pages: proc(5)); threads and fds
// count the entries of /proc/self/task and /proc/self/fd (the directory's own descriptor, open
// while counting, is not counted). The allocator figures are Kiln's CPU pool
// (engine/allocator.h: reserved = cached + in use) and glibc's heap (mallinfo2(3): bytes in use
// in the arenas plus mmap'ed chunks).
#pragma once

#include <dirent.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "engine/allocator.h"

namespace kiln::testing {

struct ProcessStats {
  int64_t rss_bytes = 0;
  int threads = 0;
  int fds = 0;
  int64_t allocator_reserved_bytes = 0;  // Kiln's CPU pool: held from the OS
  int64_t allocator_current_bytes = 0;   // Kiln's CPU pool: handed out
  int64_t malloc_in_use_bytes = 0;       // glibc: arenas' bytes in use + mmap'ed chunks
};

// Resident set size of this process, in bytes; -1 if /proc is not readable.
inline int64_t resident_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long long size = 0, resident = -1;
  const int n = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE)) : -1;
}

// Entries of a /proc directory (not "." and ".."; nor, for /proc/self/fd, the descriptor of the
// listing itself); -1 if it cannot be opened.
inline int count_entries(const char* path) {
  DIR* d = opendir(path);
  if (!d) return -1;
  const std::string own_fd = std::to_string(dirfd(d));
  int n = 0;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (std::string(path) == "/proc/self/fd" && name == own_fd) continue;
    ++n;
  }
  closedir(d);
  return n;
}

inline ProcessStats process_stats() {
  ProcessStats s;
  s.rss_bytes = resident_bytes();
  s.threads = count_entries("/proc/self/task");
  s.fds = count_entries("/proc/self/fd");
  const MemoryStats pool = cpu_allocator::stats();
  s.allocator_reserved_bytes = pool.reserved_bytes;
  s.allocator_current_bytes = pool.current_bytes;
  const struct mallinfo2 m = mallinfo2();
  s.malloc_in_use_bytes = static_cast<int64_t>(m.uordblks + m.hblkhd);
  return s;
}

// Relative growth from `before` to `after` (0.05 = 5%); 0 when both are 0.
inline double growth(int64_t before, int64_t after) {
  if (before == 0) return after == 0 ? 0.0 : 1.0;
  return static_cast<double>(after - before) / static_cast<double>(before);
}

}  // namespace kiln::testing
