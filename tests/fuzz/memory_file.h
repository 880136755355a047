// memory_file.h: a fuzz input as a file, for readers that take a path (MNIST's IDX reader, the
// checkpoint reader). The bytes go into an anonymous in-memory file (memfd_create(2): no disk
// I/O, nothing left behind), reached by the path /proc/self/fd/<fd>, which open(2), stat(2)
// and std::filesystem follow to it like any regular file.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace kiln::fuzz {

class MemoryFile {
 public:
  MemoryFile(const uint8_t* data, size_t size) {
    fd_ = memfd_create("kiln-fuzz-input", MFD_CLOEXEC);
    if (fd_ < 0) die("memfd_create");
    size_t done = 0;
    while (done < size) {
      const ssize_t w = ::write(fd_, data + done, size - done);
      if (w <= 0) die("write");
      done += static_cast<size_t>(w);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemoryFile() { ::close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  const std::string& path() const { return path_; }

 private:
  // A harness failure, not a finding in Kiln: stop loudly.
  [[noreturn]] static void die(const char* what) {
    std::perror(what);
    std::abort();
  }
  int fd_ = -1;
  std::string path_;
};

}  // namespace kiln::fuzz
