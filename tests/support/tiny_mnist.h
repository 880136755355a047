// tiny_mnist.h: a small MNIST in IDX files, written by a test that runs the real apps without
// the downloaded set: `write_tiny_mnist_split(dir, "train", 64)` writes
// dir/train-images-idx3-ubyte and dir/train-labels-idx1-ubyte (the names mnist_train reads).
// The images are a fixed pattern (not digits: nothing learns from them), labels 0..9 in turn.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace kiln::testing {

inline void put_be32(std::ofstream& out, uint32_t v) {
  const char b[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
  out.write(b, 4);
}

// n 28x28 examples; `prefix` is "train" or "t10k".
inline void write_tiny_mnist_split(const std::filesystem::path& dir, const std::string& prefix,
                                   uint32_t n) {
  std::ofstream images(dir / (prefix + "-images-idx3-ubyte"), std::ios::binary);
  for (uint32_t v : {2051u, n, 28u, 28u}) put_be32(images, v);
  for (uint32_t i = 0; i < n; ++i) {
    for (uint32_t p = 0; p < 28 * 28; ++p) images.put(static_cast<char>((p * 7 + i * 13) % 256));
  }
  std::ofstream labels(dir / (prefix + "-labels-idx1-ubyte"), std::ios::binary);
  for (uint32_t v : {2049u, n}) put_be32(labels, v);
  for (uint32_t i = 0; i < n; ++i) labels.put(static_cast<char>(i % 10));
}

}  // namespace kiln::testing
