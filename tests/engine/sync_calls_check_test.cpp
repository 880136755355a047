// sync_calls_check_test: no waiting call bypasses the sync debug mode (engine/cuda/sync_debug.h).
//
// The mode sees a wait only when it goes through a wrapper of engine/cuda/sync_calls.h (or an API
// built on one: cuda::synchronize(), Event::synchronize(), Tensor copies). A raw
// cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, cudaFree, cudaFreeHost or
// synchronous cudaMemcpy anywhere else in Kiln's sources would wait unseen, so this test reads
// every source file of the libraries, apps and examples and fails naming each such call
// (file:line). Likewise a device->host cudaMemcpyAsync outside tensor_copy.cpp: into pageable
// memory it is synchronous, and only tensor_copy.cpp knows which memory it copies into.
// The simulator (engine/cuda/sim, which implements these calls) and the tests are not Kiln's
// callers, and are not read. It needs no GPU and runs in every build (label unit).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

fs::path source_dir() {
  const char* dir = std::getenv("KILN_SOURCE_DIR");
  return dir != nullptr ? fs::path(dir) : fs::path(KILN_SOURCE_DIR);
}

// The file with comments blanked out (newlines kept, so line numbers stay), and string literals
// emptied: a comment or a message that names a call is not a call.
std::string code_only(const std::string& text) {
  std::string out = text;
  enum { Code, Line, Block, String, Char } state = Code;
  for (size_t i = 0; i < out.size(); ++i) {
    const char c = out[i], next = i + 1 < out.size() ? out[i + 1] : '\0';
    switch (state) {
      case Code:
        if (c == '/' && next == '/') state = Line, out[i] = ' ';
        else if (c == '/' && next == '*') state = Block, out[i] = ' ';
        else if (c == '"') state = String;
        else if (c == '\'') state = Char;
        break;
      case Line:
        if (c == '\n') state = Code;
        else out[i] = ' ';
        break;
      case Block:
        if (c == '*' && next == '/') out[i] = out[i + 1] = ' ', ++i, state = Code;
        else if (c != '\n') out[i] = ' ';
        break;
      case String:
      case Char:
        if (c == '\\') out[i] = ' ', out[i + 1] = ' ', ++i;
        else if (c == (state == String ? '"' : '\'')) state = Code;
        else if (c != '\n') out[i] = ' ';
        break;
    }
  }
  return out;
}

struct Rule {
  std::regex pattern;
  std::vector<std::string> allowed_files;  // relative to the source dir
  std::string what;
};

std::vector<std::string> violations(const Rule& rule) {
  static const char* kDirs[] = {"engine", "layers", "data", "comm", "models", "apps", "examples"};
  const fs::path root = source_dir();
  std::vector<std::string> found;
  for (const char* dir : kDirs) {
    for (const auto& entry : fs::recursive_directory_iterator(root / dir)) {
      if (!entry.is_regular_file()) continue;
      const std::string ext = entry.path().extension().string();
      if (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh") continue;
      const std::string rel = fs::relative(entry.path(), root).generic_string();
      if (rel.rfind("engine/cuda/sim/", 0) == 0) continue;
      bool allowed = false;
      for (const std::string& a : rule.allowed_files) allowed = allowed || rel == a;
      if (allowed) continue;
      std::ifstream in(entry.path());
      std::stringstream text;
      text << in.rdbuf();
      std::istringstream lines(code_only(text.str()));
      std::string line;
      for (int n = 1; std::getline(lines, line); ++n) {
        if (std::regex_search(line, rule.pattern)) {
          found.push_back(rel + ":" + std::to_string(n) + ": " + rule.what);
        }
      }
    }
  }
  return found;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += "  " + x + "\n";
  return s;
}

TEST(SyncCallsCheck, WaitingRuntimeCallsOnlyInTheWrappers) {
  const Rule rule{
      std::regex(R"(\b(cudaStreamSynchronize|cudaEventSynchronize|cudaDeviceSynchronize|)"
                 R"(cudaThreadSynchronize|cudaFree|cudaFreeHost|cudaFreeArray|cudaMemcpy|)"
                 R"(cudaMemcpy2D|cudaMemcpy3D|cudaMemcpyPeer|cudaMemcpyToSymbol|)"
                 R"(cudaMemcpyFromSymbol)\s*\()"),
      {"engine/cuda/sync_calls.cpp"},
      "a CUDA call that waits for the device: call the wrapper of engine/cuda/sync_calls.h "
      "instead (cuda::stream_synchronize, event_synchronize, device_synchronize, device_free, "
      "host_free), so that KILN_SYNC_DEBUG sees it"};
  const std::vector<std::string> found = violations(rule);
  EXPECT_TRUE(found.empty()) << found.size() << " waiting call(s) bypass the sync debug mode:\n"
                             << joined(found);
}

TEST(SyncCallsCheck, DeviceToHostCopiesOnlyInTensorCopy) {
  const Rule rule{std::regex(R"(\b(cudaMemcpyDeviceToHost|cudaMemcpyDefault)\b)"),
                  {"engine/cuda/tensor_copy.cpp"},
                  "a device->host copy outside engine/cuda/tensor_copy.cpp: into pageable "
                  "memory it waits for the device unseen; copy with Tensor::copy_ / to(), which "
                  "the sync debug mode checks"};
  const std::vector<std::string> found = violations(rule);
  EXPECT_TRUE(found.empty()) << found.size() << " device->host copies outside tensor_copy.cpp:\n"
                             << joined(found);
}

// The check itself finds what it looks for (a rule that can never fire proves nothing).
TEST(SyncCallsCheck, FindsARawCall) {
  const std::string code =
      "void f() {\n  // cudaFree(p) in a comment\n  const char* s = \"cudaFree(p)\";\n"
      "  cudaFree(p);\n}\n";
  const std::string stripped = code_only(code);
  std::istringstream lines(stripped);
  std::string line;
  std::vector<int> hits;
  const std::regex pattern(R"(\bcudaFree\s*\()");
  for (int n = 1; std::getline(lines, line); ++n) {
    if (std::regex_search(line, pattern)) hits.push_back(n);
  }
  EXPECT_EQ(hits, std::vector<int>{4});
}

}  // namespace
