// mnist.cpp: reads and strictly validates the MNIST IDX files (format described in mnist.h).
#include "data/mnist.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>

#include "engine/error.h"

namespace kiln {

namespace {

namespace fs = std::filesystem;

const char* kRefetch =
    "The file is damaged or is not MNIST: run datasets/fetch_mnist.sh to download it again "
    "(it verifies checksums and replaces bad files)";

// Throws the one kind of error this file raises: bad input, naming the file.
[[noreturn]] void fail(const std::string& path, const std::string& what, const std::string& todo) {
  throw Error(detail::str("MNIST file ", path, ": ", what, ". ", todo), ErrorKind::Input);
}

uint32_t read_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// What one IDX file must look like.
struct IdxSpec {
  const char* kind;      // "images" or "labels"
  uint32_t magic;        // 2051 or 2049
  uint32_t other_magic;  // the magic of the other kind, to recognise swapped files
  int dims;              // 3 or 1
};
constexpr IdxSpec kImagesSpec{"images", MnistDataset::kImagesMagic, MnistDataset::kLabelsMagic, 3};
constexpr IdxSpec kLabelsSpec{"labels", MnistDataset::kLabelsMagic, MnistDataset::kImagesMagic, 1};

// An opened, header-validated IDX file: its sizes per dimension; the stream is positioned at
// the first payload byte. The file size has been checked to be exactly header + payload.
struct IdxFile {
  std::ifstream in;
  std::vector<uint32_t> sizes;
};

IdxFile open_idx(const std::string& path, const IdxSpec& spec) {
  std::error_code ec;
  const bool exists = fs::exists(path, ec);
  if (ec) {
    // stat(2) failed for another reason than a missing file: a directory on the way that may
    // not be searched (EACCES), a loop of symbolic links (ELOOP), ...: say the system's reason.
    fail(path, detail::str("cannot be reached: ", ec.message()),
         "Check the permissions of the file and of the directories above it");
  }
  if (!exists) {
    fail(path, "file not found",
         "Run datasets/fetch_mnist.sh to download MNIST into datasets/mnist/, or pass the "
         "directory that holds the four IDX files");
  }
  if (!fs::is_regular_file(path, ec)) fail(path, "is not a regular file", "Point at the IDX file itself");
  const uint64_t file_size = fs::file_size(path, ec);
  if (ec) fail(path, "cannot read its size (" + ec.message() + ")", "Check the permissions");

  IdxFile f;
  f.in.open(path, std::ios::binary);
  if (!f.in) fail(path, "cannot be opened for reading", "Check the file's permissions");

  const size_t header_bytes = 4 + 4 * static_cast<size_t>(spec.dims);
  uint8_t header[16] = {0};
  const size_t got = static_cast<size_t>(std::min<uint64_t>(file_size, header_bytes));
  if (!f.in.read(reinterpret_cast<char*>(header), static_cast<std::streamsize>(got))) {
    fail(path, "read error in the header", "Check the disk, then run datasets/fetch_mnist.sh");
  }
  if (got >= 2 && header[0] == 0x1f && header[1] == 0x8b) {
    fail(path, "is gzip-compressed (a .gz file under the IDX name)",
         "Decompress it with gunzip, or run datasets/fetch_mnist.sh, which installs uncompressed files");
  }
  if (got < 4) {
    fail(path, detail::str("is only ", file_size, " bytes, too short for an IDX header"), kRefetch);
  }
  const uint32_t magic = read_be32(header);
  if (magic != spec.magic) {
    std::string what = detail::str("bad magic number ", magic, " (expected ", spec.magic,
                                   " for an IDX ", spec.kind, " file)");
    if (magic == spec.other_magic) {
      what += detail::str("; it looks like an IDX ", spec.kind == std::string("images") ? "labels" : "images",
                          " file: are the images and labels files swapped?");
    }
    fail(path, what, kRefetch);
  }
  if (file_size < header_bytes) {
    fail(path, detail::str("truncated: ", file_size, " bytes, shorter than its ", header_bytes,
                           "-byte header"), kRefetch);
  }
  for (int d = 0; d < spec.dims; ++d) f.sizes.push_back(read_be32(header + 4 + 4 * d));

  uint64_t payload = 1;
  for (uint32_t s : f.sizes) payload *= s;
  const uint64_t expected = header_bytes + payload;
  if (spec.dims == 3 && (f.sizes[1] != MnistDataset::kRows || f.sizes[2] != MnistDataset::kCols)) {
    fail(path, detail::str("images are ", f.sizes[1], "x", f.sizes[2], ", expected ",
                           MnistDataset::kRows, "x", MnistDataset::kCols), kRefetch);
  }
  if (file_size < expected) {
    fail(path, detail::str("truncated: the header announces ", f.sizes[0], " ", spec.kind, " (",
                           expected, " bytes in all) but the file has only ", file_size, " bytes"),
         kRefetch);
  }
  if (file_size > expected) {
    fail(path, detail::str("has ", file_size - expected, " trailing bytes after the ", f.sizes[0],
                           " ", spec.kind, " the header announces (expected exactly ", expected,
                           " bytes, found ", file_size, ")"), kRefetch);
  }
  return f;
}

void read_payload(IdxFile& f, const std::string& path, uint8_t* dst, uint64_t bytes) {
  if (bytes == 0) return;
  if (!f.in.read(reinterpret_cast<char*>(dst), static_cast<std::streamsize>(bytes))) {
    fail(path, "read error (the file changed while it was read, or a disk error)",
         "Run datasets/fetch_mnist.sh again");
  }
}

// The 256 normalised values a pixel byte can take, computed once.
const std::array<float, 256>& pixel_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int p = 0; p < 256; ++p) t[p] = MnistDataset::normalize_pixel(static_cast<uint8_t>(p));
    return t;
  }();
  return table;
}

}  // namespace

float MnistDataset::normalize_pixel(uint8_t pixel) {
  // float32 throughout, in torchvision's order: ToTensor (x / 255), then Normalize.
  return mnist_pixel_of(pixel);
}

std::string MnistDataset::images_file_name(MnistSplit split) {
  return split == MnistSplit::Train ? "train-images-idx3-ubyte" : "t10k-images-idx3-ubyte";
}

std::string MnistDataset::labels_file_name(MnistSplit split) {
  return split == MnistSplit::Train ? "train-labels-idx1-ubyte" : "t10k-labels-idx1-ubyte";
}

MnistDataset MnistDataset::load(const std::string& dir, MnistSplit split, int64_t limit) {
  const fs::path d(dir);
  return load_files((d / images_file_name(split)).string(), (d / labels_file_name(split)).string(),
                    limit);
}

MnistDataset MnistDataset::load_files(const std::string& images_path,
                                      const std::string& labels_path, int64_t limit) {
  if (limit != -1 && limit < 1) {
    throw Error(detail::str("MNIST: limit must be -1 (all examples) or >= 1, got ", limit),
                ErrorKind::Usage);
  }
  // Validate both headers (and both file sizes) before reading any payload.
  IdxFile images = open_idx(images_path, kImagesSpec);
  IdxFile labels = open_idx(labels_path, kLabelsSpec);
  const int64_t count = images.sizes[0];
  if (count != static_cast<int64_t>(labels.sizes[0])) {
    fail(images_path, detail::str("holds ", count, " images but ", labels_path, " holds ",
                                  labels.sizes[0], " labels; they must be equal (files from "
                                  "different splits or versions?)"), kRefetch);
  }

  // An empty set would train and evaluate on nothing and report a loss of 0 and an accuracy
  // of 0% as if they were results.
  if (count == 0) {
    fail(images_path, "holds no images (its header announces 0)",
         "Point --data at a directory holding MNIST's files, or run datasets/fetch_mnist.sh");
  }

  MnistDataset ds;
  ds.images_path_ = images_path;
  ds.labels_path_ = labels_path;
  // All labels are read and checked even with a limit (they are small); pixels only as needed.
  std::vector<uint8_t> all_labels(static_cast<size_t>(count));
  read_payload(labels, labels_path, all_labels.data(), all_labels.size());
  for (int64_t i = 0; i < count; ++i) {
    if (all_labels[static_cast<size_t>(i)] >= kClasses) {
      fail(labels_path, detail::str("label ", int{all_labels[static_cast<size_t>(i)]}, " at index ",
                                    i, " is out of range 0..", kClasses - 1), kRefetch);
    }
  }
  ds.count_ = limit < 0 ? count : std::min(limit, count);
  all_labels.resize(static_cast<size_t>(ds.count_));
  ds.labels_ = std::move(all_labels);
  ds.pixels_.resize(static_cast<size_t>(ds.count_ * kRows * kCols));
  read_payload(images, images_path, ds.pixels_.data(), ds.pixels_.size());
  return ds;
}

void MnistDataset::check_index(int64_t index) const {
  KILN_CHECK(index >= 0 && index < count_, "MnistDataset: index ", index,
             " is out of range for a data set of ", count_, " examples");
}

int64_t MnistDataset::get(int64_t index, float* out) const {
  check_index(index);
  const std::array<float, 256>& table = pixel_table();
  const uint8_t* src = pixels_.data() + index * kRows * kCols;  // (28, 28) bytes
  for (int64_t i = 0; i < kRows * kCols; ++i) out[i] = table[src[i]];
  return labels_[static_cast<size_t>(index)];
}

const uint8_t* MnistDataset::image_bytes(int64_t index) const {
  check_index(index);
  return pixels_.data() + index * kRows * kCols;
}

int64_t MnistDataset::label(int64_t index) const {
  check_index(index);
  return labels_[static_cast<size_t>(index)];
}

std::string MnistDataset::describe() const {
  return detail::str("MNIST: ", count_, " examples of 1x", kRows, "x", kCols, ", ", kClasses,
                     " classes, from ", images_path_, " + ", labels_path_);
}

}  // namespace kiln
