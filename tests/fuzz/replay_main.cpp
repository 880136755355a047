// replay_main.cpp: the main() that runs a fuzz target's corpus without libFuzzer, so that every
// build tree (g++, ASan, ...) replays the committed seeds and regression inputs as an ordinary
// test. Arguments: corpus directories (every regular file in them, in name order) or files.
// Each input goes once through LLVMFuzzerTestOneInput; a finding aborts (the target's checks, a
// sanitizer, an uncaught exception), so the test fails naming the input printed just before.
// No input at all is a failure too: a corpus that went missing must not pass silently.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg(argv[i]);
    if (fs::is_directory(arg)) {
      for (const fs::directory_entry& e : fs::directory_iterator(arg)) {
        if (e.is_regular_file()) inputs.push_back(e.path());
      }
    } else if (fs::is_regular_file(arg)) {
      inputs.push_back(arg);
    } else {
      std::fprintf(stderr, "replay: %s is neither a corpus directory nor a file\n", argv[i]);
      return 1;
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "replay: no inputs (usage: %s <corpus dir or file>...)\n", argv[0]);
    return 1;
  }
  std::sort(inputs.begin(), inputs.end());
  for (const fs::path& p : inputs) {
    std::fprintf(stderr, "replay: %s\n", p.string().c_str());
    std::ifstream in(p, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.eof() && in.fail()) {
      std::fprintf(stderr, "replay: cannot read %s\n", p.string().c_str());
      return 1;
    }
    // A copy of exactly the input's size, so that ASan catches a read one byte past its end.
    std::vector<uint8_t> data(bytes.begin(), bytes.end());
    static const uint8_t kNoByte = 0;  // libFuzzer never passes a null pointer either
    LLVMFuzzerTestOneInput(data.empty() ? &kNoByte : data.data(), data.size());
  }
  std::printf("replay: %zu inputs, no finding\n", inputs.size());
  return 0;
}
