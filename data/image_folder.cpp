// image_folder.cpp: scanning root/<class>/<image> (see image_folder.h); the checks and the
// decoding of one file are data/image_decode.cpp's.
#include "data/image_folder.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "data/image_decode.h"
#include "engine/error.h"

namespace kiln {

namespace {

namespace fs = std::filesystem;

[[noreturn]] void input_error(const std::string& what) { throw Error(what, ErrorKind::Input); }

bool is_hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

bool has_image_extension(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

// The whole file, or an Input error naming it. (We read the bytes ourselves, rather than
// stbi_load(path), to tell "cannot read" from "cannot decode".)
std::vector<unsigned char> read_file(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) input_error(detail::str("ImageFolder: cannot open ", path, ": ", std::strerror(errno)));
  std::vector<unsigned char> bytes;
  unsigned char chunk[1 << 16];
  size_t got;
  while ((got = std::fread(chunk, 1, sizeof(chunk), f.get())) > 0) {
    bytes.insert(bytes.end(), chunk, chunk + got);
  }
  if (std::ferror(f.get())) input_error(detail::str("ImageFolder: read error in ", path));
  if (bytes.empty()) input_error(detail::str("ImageFolder: ", path, " is empty"));
  return bytes;
}

}  // namespace

ImageFolderDataset ImageFolderDataset::open(const std::string& root, ImageFolderOptions options) {
  try {
    return scan(root, options);
  } catch (const fs::filesystem_error& e) {  // e.g. a directory that vanishes mid-listing
    input_error(detail::str("ImageFolder: cannot scan ", root, ": ", e.what()));
  }
}

ImageFolderDataset ImageFolderDataset::scan(const std::string& root, const ImageFolderOptions& options) {
  if (options.channels != 0 && options.channels != 1 && options.channels != 3) {
    throw Error(detail::str("ImageFolder: channels ", options.channels, " must be 0 (from the "
                            "first image), 1 (grey) or 3 (RGB)"), ErrorKind::Usage);
  }
  if (options.height < 0 || options.width < 0 || ((options.height == 0) != (options.width == 0))) {
    throw Error(detail::str("ImageFolder: height ", options.height, " and width ", options.width,
                            ": set both (>= 1) or neither (0: the first image's size)"),
                ErrorKind::Usage);
  }
  if (options.max_pixels < 1) {
    throw Error(detail::str("ImageFolder: max_pixels ", options.max_pixels, " must be >= 1"),
                ErrorKind::Usage);
  }
  std::error_code ec;
  const bool exists = fs::exists(root, ec);
  if (ec) {
    // stat(2) failed for another reason than a missing path (a directory on the way that may
    // not be searched: EACCES; a loop of symbolic links: ELOOP): the system's reason.
    input_error(detail::str("ImageFolder: cannot reach root ", root, ": ", ec.message(),
                            " (check the permissions of it and of the directories above it)"));
  }
  if (!exists) input_error(detail::str("ImageFolder: root ", root, " does not exist"));
  if (!fs::is_directory(root, ec)) input_error(detail::str("ImageFolder: root ", root, " is not a directory"));

  ImageFolderDataset ds;
  ds.root_ = root;
  ds.max_pixels_ = options.max_pixels;
  // Classes: the non-hidden sub-directories of root, sorted by name.
  std::vector<fs::path> class_dirs;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    if (!is_hidden(e.path()) && e.is_directory(ec)) class_dirs.push_back(e.path());
  }
  if (ec) input_error(detail::str("ImageFolder: cannot list ", root, ": ", ec.message()));
  if (class_dirs.empty()) {
    input_error(detail::str("ImageFolder: ", root, " has no class directories (expected "
                            "root/<class>/<image>.png|.jpg|.jpeg)"));
  }
  std::sort(class_dirs.begin(), class_dirs.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename().string() < b.filename().string(); });

  for (const fs::path& dir : class_dirs) {
    const int64_t label = static_cast<int64_t>(ds.classes_.size());
    ds.classes_.push_back(dir.filename().string());
    std::vector<std::string> images;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      if (is_hidden(e.path()) || !e.is_regular_file(ec)) continue;
      if (has_image_extension(e.path())) {
        images.push_back(e.path().filename().string());
      } else {
        ++ds.ignored_files_;
      }
    }
    if (ec) input_error(detail::str("ImageFolder: cannot list ", dir.string(), ": ", ec.message()));
    if (images.empty()) {
      input_error(detail::str("ImageFolder: class directory ", dir.string(),
                              " holds no .png, .jpg or .jpeg file"));
    }
    std::sort(images.begin(), images.end());
    for (const std::string& name : images) {
      ds.files_.push_back((dir / name).string());
      ds.labels_.push_back(label);
    }
  }

  // Defaults from the first image's header (checked against the pixel budget).
  ImageHeader first;
  if (options.channels == 0 || options.height == 0) {
    const std::vector<unsigned char> bytes = read_file(ds.files_[0]);
    first = read_image_header(bytes.data(), bytes.size(), ds.files_[0], ds.max_pixels_);
  }
  ds.channels_ = options.channels != 0 ? options.channels : (first.channels <= 2 ? 1 : 3);  // alpha dropped
  ds.height_ = options.height != 0 ? options.height : first.height;
  ds.width_ = options.width != 0 ? options.width : first.width;
  return ds;
}

void ImageFolderDataset::check_index(int64_t index) const {
  KILN_CHECK(index >= 0 && index < size(), "ImageFolderDataset: index ", index,
             " is out of range for a data set of ", size(), " examples");
}

const std::string& ImageFolderDataset::path(int64_t index) const {
  check_index(index);
  return files_[static_cast<size_t>(index)];
}

int64_t ImageFolderDataset::label(int64_t index) const {
  check_index(index);
  return labels_[static_cast<size_t>(index)];
}

int64_t ImageFolderDataset::get(int64_t index, float* out) const {
  check_index(index);
  const std::string& file = files_[static_cast<size_t>(index)];
  const std::vector<unsigned char> bytes = read_file(file);
  decode_image_chw(bytes.data(), bytes.size(), file, static_cast<int>(channels_),
                   static_cast<int>(height_), static_cast<int>(width_), out, max_pixels_);
  return labels_[static_cast<size_t>(index)];
}

void check_same_classes(const ImageFolderDataset& train, const ImageFolderDataset& test) {
  if (train.classes() == test.classes()) return;
  // Both lists are sorted (scan() sorts the class folders by name).
  std::vector<std::string> only_train, only_test;
  std::set_difference(train.classes().begin(), train.classes().end(), test.classes().begin(),
                      test.classes().end(), std::back_inserter(only_train));
  std::set_difference(test.classes().begin(), test.classes().end(), train.classes().begin(),
                      train.classes().end(), std::back_inserter(only_test));
  const auto join = [](const std::vector<std::string>& names, const char* separator) {
    std::string s;
    for (const std::string& n : names) s += (s.empty() ? "" : separator) + n;
    return s;
  };
  std::vector<std::string> parts;
  if (!only_train.empty()) parts.push_back(detail::str("only in ", train.root(), ": ", join(only_train, ", ")));
  if (!only_test.empty()) parts.push_back(detail::str("only in ", test.root(), ": ", join(only_test, ", ")));
  input_error(detail::str("ImageFolder: ", train.root(), " and ", test.root(),
                          " have different class folders (", join(parts, "; "), "): each split numbers "
                          "its own folders, so the labels would name other classes in one than "
                          "in the other. Give both splits the same class folders"));
}

std::string ImageFolderDataset::describe() const {
  return detail::str("ImageFolder ", root_, ": ", size(), " images of ", shape_str(example_shape()),
                     " in ", num_classes(), " classes (", ignored_files_,
                     " files with other extensions ignored)");
}

}  // namespace kiln
