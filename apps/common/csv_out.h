// csv_out.h: the --csv file of a benchmark: a header when the file is new (or without --append),
// then one flushed line per measured row, so a run cut short keeps what it measured.
//
// Rows go to the file as they are measured (one write(2) each), not through a temporary file:
// a failed write (a full disk, the file-size limit) throws kiln::Error (Runtime, exit 1)
// "--csv rows.csv: writing a row failed: File too large", and the rows written before it stay.
// The path itself is checked before any work by apps/common/output_paths.h.
#pragma once

#include <string>

namespace kiln::apps {

class CsvOut {
 public:
  CsvOut() = default;  // closed: row() does nothing (e.g. on ranks other than 0)
  CsvOut(const std::string& path, bool append, const std::string& header) {
    open(path, append, header);
  }
  ~CsvOut();
  CsvOut(const CsvOut&) = delete;
  CsvOut& operator=(const CsvOut&) = delete;

  // An empty path keeps it closed. Without `append` the file is replaced (truncated); with it,
  // rows are added at its end and the header is written only to an empty or new file. A file
  // that cannot be opened or written is a Runtime error naming it with the system's reason.
  void open(const std::string& path, bool append, const std::string& header);
  void row(const std::string& line);

 private:
  void write_line(const std::string& line, const char* what);
  int fd_ = -1;
  std::string path_;
};

}  // namespace kiln::apps
