// csv_out.cpp: see csv_out.h.
#include "apps/common/csv_out.h"

#include <filesystem>
#include <system_error>

#include "engine/error.h"

namespace kiln::apps {

void CsvOut::open(const std::string& path, bool append, const std::string& header) {
  if (path.empty()) return;
  std::error_code ec;
  const bool has_header = append && std::filesystem::exists(path, ec) &&
                          std::filesystem::file_size(path, ec) > 0;
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  if (!out_) {
    throw Error("--csv " + path + ": cannot open for writing: check that its directory exists",
                ErrorKind::Usage);
  }
  if (!has_header) out_ << header << "\n";
}

void CsvOut::row(const std::string& line) {
  if (!out_.is_open()) return;
  out_ << line << "\n";
  out_.flush();
}

}  // namespace kiln::apps
