// csv_out.cpp: see csv_out.h.
#include "apps/common/csv_out.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>

#include "engine/error.h"
#include "engine/output_file.h"

namespace kiln::apps {

CsvOut::~CsvOut() {
  if (fd_ >= 0) ::close(fd_);
}

void CsvOut::open(const std::string& path, bool append, const std::string& header) {
  if (path.empty()) return;
  if (fd_ >= 0) ::close(fd_);
  path_ = path;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC),
               0666);
  if (fd_ < 0) {
    const int err = errno;
    throw Error(output_failure("--csv", path, "opening it", err));
  }
  struct stat st;
  const bool has_rows = append && ::fstat(fd_, &st) == 0 && st.st_size > 0;
  if (!has_rows) write_line(header, "writing the header");
}

void CsvOut::row(const std::string& line) {
  if (fd_ < 0) return;
  write_line(line, "writing a row");
}

void CsvOut::write_line(const std::string& line, const char* what) {
  if (const int err = write_all(fd_, line + "\n"); err != 0) {
    throw Error(output_failure("--csv", path_, what, err));
  }
}

}  // namespace kiln::apps
