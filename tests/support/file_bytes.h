// file_bytes.h: reading and writing a whole file as bytes, for tests that damage files on
// purpose (truncated or corrupted checkpoints) and check the loader's error.
#pragma once

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace kiln::testing {

inline std::vector<char> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

inline void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace kiln::testing
