// idx_reader.cpp: fuzz target for the MNIST IDX reader (data/mnist.h), which validates a pair of
// files: images (magic 2051, count x 28 x 28) and labels (magic 2049, count).
//
// Input layout: byte 0 = limit (0: all examples, else 1..255), bytes 1..2 = the labels file's
// length L (big-endian, clamped to what is left), then L bytes of labels file, then the images
// file. Both are handed to MnistDataset::load_files as in-memory files. An Input error is the
// expected answer to a bad pair; a pair that loads must give every example a label in 0..9 and
// a readable image.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "data/mnist.h"
#include "engine/error.h"
#include "memory_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const int64_t limit = data[0] == 0 ? -1 : data[0];
  const size_t labels_len = std::min<size_t>((size_t{data[1]} << 8) | data[2], size - 3);
  const kiln::fuzz::MemoryFile labels(data + 3, labels_len);
  const kiln::fuzz::MemoryFile images(data + 3 + labels_len, size - 3 - labels_len);
  try {
    const kiln::MnistDataset ds = kiln::MnistDataset::load_files(images.path(), labels.path(), limit);
    if (ds.size() < 0 || (limit > 0 && ds.size() > limit)) std::abort();
    std::vector<float> x(kiln::MnistDataset::kRows * kiln::MnistDataset::kCols);
    for (int64_t i = 0; i < ds.size(); ++i) {
      const int64_t label = ds.get(i, x.data());
      if (label < 0 || label >= kiln::MnistDataset::kClasses) std::abort();
    }
  } catch (const kiln::Error& e) {
    if (e.kind() != kiln::ErrorKind::Input) std::abort();
  }
  return 0;
}
