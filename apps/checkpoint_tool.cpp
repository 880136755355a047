// checkpoint_tool: looks inside Kiln checkpoint files (engine/serialize.h) and compares them.
//
//   checkpoint_tool info FILE            meta entries (key=value, sorted) and one line per tensor
//                                        record: name, dtype, shape
//   checkpoint_tool get FILE KEY         the value of one meta entry (for scripts)
//   checkpoint_tool compare A B          exit 0 when A and B hold the same tensors, bit for bit
//                                        (meta is not compared: it may hold timings); else
//                                        each differing record on stderr and exit 1
//
// Every file is fully validated on the way in (CRCs, sizes, layout): a damaged file is an
// error naming it (exit 2). tools/kill_resume.sh uses get and compare.
#include <cstdio>
#include <cstring>
#include <string>

#include "engine/error.h"
#include "engine/serialize.h"

using namespace kiln;

namespace {

int usage() {
  std::fprintf(stderr, "usage: checkpoint_tool info FILE | get FILE KEY | compare A B\n");
  return 2;
}

int info(const std::string& path) {
  const Checkpoint c = read_checkpoint(path);
  for (const auto& [k, v] : c.meta) std::printf("%s=%s\n", k.c_str(), v.c_str());
  for (const auto& [name, t] : c.tensors) {
    std::printf("tensor %s %s %s\n", name.c_str(), dtype_name(t.dtype()),
                shape_str(t.shape()).c_str());
  }
  return 0;
}

int get(const std::string& path, const std::string& key) {
  const Checkpoint c = read_checkpoint(path);
  auto it = c.meta.find(key);
  if (it == c.meta.end()) {
    throw Error("checkpoint '" + path + "' has no meta entry '" + key + "' (checkpoint_tool info " +
                path + " lists them)", ErrorKind::Input);
  }
  std::printf("%s\n", it->second.c_str());
  return 0;
}

// Records present in one file only, or with another dtype, shape or bytes, are differences.
int compare(const std::string& a_path, const std::string& b_path) {
  const Checkpoint a = read_checkpoint(a_path), b = read_checkpoint(b_path);
  int differ = 0;
  for (const auto& [name, ta] : a.tensors) {
    auto it = b.tensors.find(name);
    if (it == b.tensors.end()) {
      std::fprintf(stderr, "%s: only in %s\n", name.c_str(), a_path.c_str());
      ++differ;
      continue;
    }
    const Tensor& tb = it->second;
    if (ta.dtype() != tb.dtype() || ta.shape() != tb.shape()) {
      std::fprintf(stderr, "%s: %s %s vs %s %s\n", name.c_str(), dtype_name(ta.dtype()),
                   shape_str(ta.shape()).c_str(), dtype_name(tb.dtype()),
                   shape_str(tb.shape()).c_str());
      ++differ;
    } else if (ta.nbytes() > 0 && std::memcmp(ta.raw_data(), tb.raw_data(), ta.nbytes()) != 0) {
      std::fprintf(stderr, "%s: the values differ\n", name.c_str());
      ++differ;
    }
  }
  for (const auto& [name, tb] : b.tensors) {
    if (!a.tensors.count(name)) {
      std::fprintf(stderr, "%s: only in %s\n", name.c_str(), b_path.c_str());
      ++differ;
    }
  }
  if (differ > 0) {
    std::fprintf(stderr, "checkpoint_tool: %d of the tensor records differ\n", differ);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 3 && std::strcmp(argv[1], "info") == 0) return info(argv[2]);
    if (argc == 4 && std::strcmp(argv[1], "get") == 0) return get(argv[2], argv[3]);
    if (argc == 4 && std::strcmp(argv[1], "compare") == 0) return compare(argv[2], argv[3]);
    return usage();
  } catch (const Error& e) {
    std::fprintf(stderr, "checkpoint_tool: error: %s\n", e.what());
    return 2;
  }
}
