// output_file.cpp: see output_file.h.
#include "engine/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/error.h"

namespace kiln {

namespace {

// The file a write to `path` replaces: the target of a symbolic link (so the link stays a
// link), else `path` itself.
std::string replaced_file(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return path;
  char* resolved = ::realpath(path.c_str(), nullptr);
  if (resolved == nullptr) return path;  // a dangling link: replaced as it is
  std::string target(resolved);
  std::free(resolved);
  return target;
}

// Opens a new temporary file next to `target`: "<target>.tmp.<pid>.<n>", O_EXCL so that an
// existing file is never truncated. Mode 0666 less the umask, as any created file.
int open_temporary(const std::string& target, std::string& tmp) {
  static std::atomic<unsigned> counter{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    tmp = target + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;  // errno is EEXIST
}

}  // namespace

std::string output_failure(const std::string& what, const std::string& path,
                           const std::string& step, int err) {
  return detail::str(what, " ", path, ": ", step, " failed: ", std::strerror(err));
}

void write_output_file(const std::string& what, const std::string& path, std::string_view bytes) {
  const std::string target = replaced_file(path);
  struct stat st;
  const bool existed = ::stat(target.c_str(), &st) == 0;
  std::string tmp;
  const int fd = open_temporary(target, tmp);
  // Every failure below: the temporary file goes, the target keeps its bytes.
  auto fail = [&](const std::string& step, int err, bool created) {
    if (created) ::unlink(tmp.c_str());
    throw Error(output_failure(what, path, step, err) +
                (existed ? "; the previous " + path + " is left as it was" : std::string()));
  };
  if (fd < 0) {
    const int err = errno;
    fail("creating a new file in its directory", err, false);
  }
  if (const int err = write_all(fd, bytes); err != 0) {
    ::close(fd);
    fail("writing", err, true);
  }
  // close() reports the errors of file systems that write back late (NFS: close(2), NOTES).
  if (::close(fd) != 0) {
    const int err = errno;
    fail("closing the new file", err, true);
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    fail("renaming the new file over it", err, true);
  }
}

int write_all(int fd, std::string_view bytes) {
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? errno : EIO;
    p += w;
    left -= static_cast<size_t>(w);
  }
  return 0;
}

void ignore_file_size_signal() { std::signal(SIGXFSZ, SIG_IGN); }

}  // namespace kiln
