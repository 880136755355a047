// data_paths.cpp: see data_paths.h.
#include "apps/common/data_paths.h"

#include <filesystem>
#include <system_error>

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

namespace kiln::apps {

std::string in_source_tree(const std::string& relative) {
  const std::filesystem::path in_tree = std::filesystem::path(KILN_SOURCE_DIR) / relative;
  std::error_code ec;
  return std::filesystem::exists(in_tree, ec) ? in_tree.string() : relative;
}

}  // namespace kiln::apps
