// make_seeds.cpp: writes the seed inputs of corpus/ with Kiln's own writers, so that every seed
// starts out valid (or, where named so, minimally broken) and the fuzzer mutates from there.
// Usage: fuzz_make_seeds <corpus dir> [<MNIST dir>]   (built with the tests; run it again after
// a format change and commit what changed). Spec strings (device_spec, dist_spec) are plain
// files written by hand; regression inputs are the files named regress_*.
//   checkpoint_reader/  checkpoints of a few dtypes and shapes, one with the training metadata
//                       (apps/common/train_checkpoint.h), one empty, and a regression input
//   idx_reader/         the first two MNIST examples as an IDX pair (the headers' counts set to
//                       2), and the real headers cut after 16 / 8 bytes (counts 60000: truncated)
//   image_decode/       tiny PNGs (grey, RGB, RGBA) and a JPEG, at their own size and resized
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "stb_image_write.h"

#include "engine/serialize.h"
#include "engine/tensor.h"

namespace {

using Bytes = std::vector<uint8_t>;

void write_bytes(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!out) {
    std::fprintf(stderr, "make_seeds: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

Bytes read_bytes(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  Bytes b(max_bytes);
  in.read(reinterpret_cast<char*>(b.data()), static_cast<std::streamsize>(max_bytes));
  b.resize(static_cast<size_t>(in.gcount()));
  return b;
}

void set_be32(Bytes& b, size_t at, uint32_t v) {
  for (int k = 0; k < 4; ++k) b[at + k] = static_cast<uint8_t>(v >> (24 - 8 * k));
}

// The idx_reader target's input: limit byte, labels length (big-endian u16), labels, images.
Bytes idx_input(uint8_t limit, const Bytes& labels, const Bytes& images) {
  Bytes b = {limit, static_cast<uint8_t>(labels.size() >> 8), static_cast<uint8_t>(labels.size())};
  b.insert(b.end(), labels.begin(), labels.end());
  b.insert(b.end(), images.begin(), images.end());
  return b;
}

void checkpoint_seeds(const std::string& dir) {
  using kiln::DType;
  using kiln::Tensor;
  kiln::write_checkpoint(dir + "/f32_i64",
                         {{"w", Tensor::full({2, 3}, 0.5)}, {"steps", Tensor::full({1}, 7, DType::I64)}},
                         {{"epoch", "1"}});
  kiln::write_checkpoint(dir + "/bf16_u8_scalar",  // format version 2
                         {{"h", Tensor::full({3}, 1.25, DType::BF16)},
                          {"mask", Tensor::full({2, 1, 2}, 1, DType::U8)},
                          {"s", Tensor::full({}, 2.0, DType::F64)}});
  kiln::write_checkpoint(dir + "/empty", {});
  const std::map<std::string, Tensor> train_tensors = {
      {"model.fc.weight", Tensor::full({2, 2}, 0.25)},
      {"optimizer.lr", Tensor::full({1}, 0.1, DType::F64)}};
  std::map<std::string, std::string> train_meta = {
      {"format", "kiln-train/1"}, {"epoch", "3"}, {"model", "cnn"}, {"optimizer", "adadelta"},
      {"seed", "1"}, {"generator_offset", "4096"}, {"lr", "0.69999999999999996"},
      {"test_accuracy", "0.98999999999999999"}};
  kiln::write_checkpoint(dir + "/train", train_tensors, train_meta);
  // Regression: an epoch count past INT64_MAX, which read_train_checkpoint once cast to a
  // negative epoch (a resumed run would have started at epoch -1).
  train_meta["epoch"] = "18446744073709551615";
  kiln::write_checkpoint(dir + "/regress_train_epoch_past_int64", train_tensors, train_meta);
}

void idx_seeds(const std::string& dir, const std::string& mnist) {
  const Bytes images = read_bytes(mnist + "/t10k-images-idx3-ubyte", 16 + 2 * 28 * 28);
  const Bytes labels = read_bytes(mnist + "/t10k-labels-idx1-ubyte", 8 + 2);
  if (images.size() != 16 + 2 * 28 * 28 || labels.size() != 8 + 2) {
    std::fprintf(stderr, "make_seeds: no MNIST test files in %s (datasets/fetch_mnist.sh)\n",
                 mnist.c_str());
    std::exit(1);
  }
  Bytes two_images = images, two_labels = labels;
  set_be32(two_images, 4, 2);
  set_be32(two_labels, 4, 2);
  write_bytes(dir + "/two_examples", idx_input(0, two_labels, two_images));
  write_bytes(dir + "/two_examples_limit_1", idx_input(1, two_labels, two_images));
  write_bytes(dir + "/real_headers_truncated",
              idx_input(0, Bytes(labels.begin(), labels.begin() + 8), Bytes(images.begin(), images.begin() + 16)));
}

void image_seeds(const std::string& dir) {
  auto on_write = [](void* context, void* data, int size) {
    auto* out = static_cast<Bytes*>(context);
    out->insert(out->end(), static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
  };
  auto pixels = [](int n) {
    Bytes p(static_cast<size_t>(n));
    for (int k = 0; k < n; ++k) p[static_cast<size_t>(k)] = static_cast<uint8_t>(k * 53 % 256);
    return p;
  };
  // (name, first byte of the target's input: bit 0 = RGB out, bits 1..7 = resize side)
  auto save = [&](const std::string& name, uint8_t mode, const Bytes& file) {
    Bytes b = {mode};
    b.insert(b.end(), file.begin(), file.end());
    write_bytes(dir + "/" + name, b);
  };
  for (int c : {1, 3, 4}) {
    Bytes png;
    const Bytes p = pixels(4 * 3 * c);
    stbi_write_png_to_func(on_write, &png, 4, 3, c, p.data(), 4 * c);
    save("png_c" + std::to_string(c), 0, png);
    save("png_c" + std::to_string(c) + "_rgb_resized_5", 1 | (5 << 1), png);
  }
  Bytes jpg;
  const Bytes p = pixels(8 * 8 * 3);
  stbi_write_jpg_to_func(on_write, &jpg, 8, 8, 3, p.data(), 90);
  save("jpeg_rgb", 1, jpg);
  save("jpeg_grey_resized_3", 3 << 1, jpg);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s <corpus dir> [<MNIST dir, default datasets/mnist>]\n", argv[0]);
    return 2;
  }
  const std::string corpus = argv[1];
  checkpoint_seeds(corpus + "/checkpoint_reader");
  idx_seeds(corpus + "/idx_reader", argc == 3 ? argv[2] : "datasets/mnist");
  image_seeds(corpus + "/image_decode");
  std::printf("make_seeds: wrote the seeds under %s\n", corpus.c_str());
  return 0;
}
