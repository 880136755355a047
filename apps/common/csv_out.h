// csv_out.h: the --csv file of a benchmark: a header when the file is new (or without --append),
// then one flushed line per measured row, so a run cut short keeps what it measured.
#pragma once

#include <fstream>
#include <string>

namespace kiln::apps {

class CsvOut {
 public:
  CsvOut() = default;  // closed: row() does nothing (e.g. on ranks other than 0)
  CsvOut(const std::string& path, bool append, const std::string& header) {
    open(path, append, header);
  }
  // An empty path keeps it closed. A file that cannot be created is a Usage error naming it.
  void open(const std::string& path, bool append, const std::string& header);
  void row(const std::string& line);

 private:
  std::ofstream out_;
};

}  // namespace kiln::apps
