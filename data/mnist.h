// mnist.h: the MNIST handwritten-digit data set, read from its original IDX files.
//
// Files (as installed by datasets/fetch_mnist.sh into datasets/mnist/):
//   train-images-idx3-ubyte  train-labels-idx1-ubyte    60,000 examples  (MnistSplit::Train)
//   t10k-images-idx3-ubyte   t10k-labels-idx1-ubyte     10,000 examples  (MnistSplit::Test)
//
// The IDX format (LeCun & Cortes, http://yann.lecun.com/exdb/mnist/): a big-endian header,
// then the raw payload, nothing else.
//   bytes 0..3   magic: 0x00 0x00 <type code> <number of dimensions>; type 0x08 = unsigned
//                byte, so images (3 dims) have magic 0x00000803 = 2051 and labels (1 dim)
//                0x00000801 = 2049.
//   then one 32-bit big-endian size per dimension:
//     images: count, rows (28), cols (28)  -> header 16 bytes, payload count*28*28 bytes,
//             one image after another, row-major, 0 = background .. 255 = ink;
//     labels: count                         -> header 8 bytes, payload count bytes, 0..9.
//
// Validation is strict, because a silently wrong data set trains a silently wrong model:
// missing file (or one that cannot be reached: the system's reason, "Permission denied"),
// magic, dimensions, image and label counts equal and not 0, file size exactly header +
// payload (so a truncated download or trailing bytes are caught), every label in 0..9, and a
// gzip-compressed file is recognised. Each failure throws kiln::Error (ErrorKind::Input)
// naming the file, what is wrong, and what to do (usually: run datasets/fetch_mnist.sh).
//
// Memory: the pixels stay as raw uint8 (60,000 * 784 = 47 MB for the training set);
// get() converts one example to float32 on the fly, normalised like the PyTorch MNIST example
// (the Keras and Horovod MNIST examples):  x = (pixel / 255 - 0.1307) / 0.3081, computed in float32 exactly as
// torchvision's ToTensor + Normalize do, via a 256-entry lookup table of mnist_pixel_of
// (data/mnist_kernels.h: the rule the on-device gather of data/device_mnist.h applies too).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/mnist_kernels.h"  // mnist_pixel_of, kMnistMean, kMnistStd

namespace kiln {

enum class MnistSplit { Train, Test };

class MnistDataset : public Dataset {
 public:
  static constexpr int64_t kRows = 28, kCols = 28, kClasses = 10;
  static constexpr float kMean = kMnistMean, kStd = kMnistStd;  // of the training pixels / 255
  static constexpr uint32_t kImagesMagic = 2051, kLabelsMagic = 2049;

  // Loads `split` from directory `dir` (the standard file names above). `limit` = -1 keeps
  // every example; limit >= 1 keeps the first min(limit, count). Throws kiln::Error (Input)
  // on a missing or malformed file, (Usage) on a bad limit.
  static MnistDataset load(const std::string& dir, MnistSplit split, int64_t limit = -1);
  // Same, from explicit file paths (any names).
  static MnistDataset load_files(const std::string& images_path, const std::string& labels_path,
                                 int64_t limit = -1);
  // The standard file names of a split: {"train-images-idx3-ubyte", "train-labels-idx1-ubyte"}.
  static std::string images_file_name(MnistSplit split);
  static std::string labels_file_name(MnistSplit split);

  int64_t size() const override { return count_; }
  Shape example_shape() const override { return {1, kRows, kCols}; }
  int64_t num_classes() const override { return kClasses; }
  // out is (1, 28, 28) float32, normalised; returns the label 0..9.
  int64_t get(int64_t index, float* out) const override;
  std::string describe() const override;

  // Raw access (for loaders that normalise or augment themselves, and for tests).
  const uint8_t* image_bytes(int64_t index) const;  // 784 bytes, row-major
  int64_t label(int64_t index) const;
  // The float32 value get() writes for a raw pixel value.
  static float normalize_pixel(uint8_t pixel);

 private:
  MnistDataset() = default;
  void check_index(int64_t index) const;

  std::vector<uint8_t> pixels_;  // (count, 28, 28) raw bytes
  std::vector<uint8_t> labels_;  // (count)
  int64_t count_ = 0;
  std::string images_path_, labels_path_;
};

}  // namespace kiln
