// image_folder.h: a folder of image files as a Dataset, like torchvision's ImageFolder.
//
// Layout:   root/<class name>/<file>.png | .jpg | .jpeg   (extension case-insensitive)
//
//   - Classes are the sub-directories of root, sorted by name (byte order, like Python's
//     sorted()) and numbered 0..n-1; examples are ordered by class, then by file name, so
//     index -> (file, label) is the same on every machine and every run.
//   - Names starting with '.' (hidden files and directories) are ignored, and so are plain
//     files directly in root and sub-directories of a class (no recursion).
//   - Files with other extensions are ignored and counted (describe() says how many).
//   - Errors (kiln::Error, ErrorKind::Input), all at open(): root missing or not a directory
//     (or unreachable: the system's reason, "Permission denied"),
//     no class directory, a class directory without images, a first image that cannot be
//     read; at get(): a file that cannot be read or decoded, naming the file and stb's reason.
//   - Untrusted files: only PNG and JPEG content is decoded, and an image whose header announces
//     more than options.max_pixels pixels is refused before decoding (data/image_decode.h).
//
// Decoding: get() reads and decodes the file on every call (stb_image: PNG, JPEG), which is
// the real per-example work the multi-threaded Loader parallelises; nothing is cached. The
// pixels are converted to `channels` by stb (grey <-> RGB, alpha dropped), resized to
// height x width with stb_image_resize if the file has another size (in uint8, like PIL's
// resize before torchvision's ToTensor), and written as float32 CHW in [0, 1]: pixel / 255.
// get() is thread-safe: stb_image keeps no shared state except its failure reason, which
// Debian's libstb keeps thread-local (STBI_THREAD_LOCAL), so each thread reads its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/image_decode.h"

namespace kiln {

struct ImageFolderOptions {
  int channels = 0;  // 1 (grey) or 3 (RGB); 0: from the first image (grey, or RGB if colour)
  int height = 0, width = 0;  // 0, 0: the first image's size; set both or neither
  int64_t max_pixels = kImageMaxPixels;  // larger images (width x height) are an Input error
};

class ImageFolderDataset : public Dataset {
 public:
  // Scans root (see the header comment) and reads the first image's header for the defaults
  // of `options`. Throws kiln::Error (Input) for a bad folder, (Usage) for bad options.
  static ImageFolderDataset open(const std::string& root, ImageFolderOptions options = {});

  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  Shape example_shape() const override { return {channels_, height_, width_}; }
  int64_t num_classes() const override { return static_cast<int64_t>(classes_.size()); }
  // Decodes file `index` into out[C*H*W] (CHW, [0, 1]) and returns its class index.
  int64_t get(int64_t index, float* out) const override;
  // "ImageFolder <root>: 60000 images of [1, 28, 28] in 10 classes (3 other files ignored)".
  std::string describe() const override;

  // Class names; class i is classes()[i].
  const std::vector<std::string>& classes() const { return classes_; }
  // The file of example `index` and its label.
  const std::string& path(int64_t index) const;
  int64_t label(int64_t index) const;
  // Files skipped because of their extension.
  int64_t ignored_files() const { return ignored_files_; }
  const std::string& root() const { return root_; }

 private:
  ImageFolderDataset() = default;
  static ImageFolderDataset scan(const std::string& root, const ImageFolderOptions& options);
  void check_index(int64_t index) const;

  std::string root_;
  std::vector<std::string> classes_;
  std::vector<std::string> files_;  // full paths, in example order
  std::vector<int64_t> labels_;     // per example
  int64_t channels_ = 0, height_ = 0, width_ = 0;
  int64_t ignored_files_ = 0;
  int64_t max_pixels_ = kImageMaxPixels;
};

// Train and test splits are numbered each on its own (class i is the i-th folder of each), so
// their labels mean the same classes only when both hold the same class folders: a folder
// missing from one shifts every label after it. Throws kiln::Error (Input) naming both roots
// and the classes found in only one of them. Apps call it after opening the two splits.
void check_same_classes(const ImageFolderDataset& train, const ImageFolderDataset& test);

}  // namespace kiln
