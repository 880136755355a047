// image_folder.cpp: scanning root/<class>/<image> and decoding with stb_image (see
// image_folder.h). stb's implementations come from Debian's libstb.so (data/CMakeLists.txt),
// so only the declarations are included here.
#include "data/image_folder.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "stb_image.h"
#include "stb_image_resize.h"

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

// stb's reason for the last failure on this thread (thread-local in Debian's libstb).
std::string stb_reason() {
  const char* r = stbi_failure_reason();
  return r ? r : "unknown reason";
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
  std::error_code ec;
  if (!fs::exists(root, ec)) input_error(detail::str("ImageFolder: root ", root, " does not exist"));
  if (!fs::is_directory(root, ec)) input_error(detail::str("ImageFolder: root ", root, " is not a directory"));

  ImageFolderDataset ds;
  ds.root_ = root;
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

  // Defaults from the first image's header.
  int w = 0, h = 0, c = 0;
  if (options.channels == 0 || options.height == 0) {
    const std::vector<unsigned char> bytes = read_file(ds.files_[0]);
    if (!stbi_info_from_memory(bytes.data(), static_cast<int>(bytes.size()), &w, &h, &c)) {
      input_error(detail::str("ImageFolder: cannot decode ", ds.files_[0], ": ", stb_reason()));
    }
  }
  ds.channels_ = options.channels != 0 ? options.channels : (c <= 2 ? 1 : 3);  // alpha dropped
  ds.height_ = options.height != 0 ? options.height : h;
  ds.width_ = options.width != 0 ? options.width : w;
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
  // Decode to HWC uint8 with exactly channels_ channels (stb converts grey <-> RGB).
  int w = 0, h = 0, file_channels = 0;
  const int channels = static_cast<int>(channels_);
  std::unique_ptr<stbi_uc, void (*)(void*)> pixels(
      stbi_load_from_memory(bytes.data(), static_cast<int>(bytes.size()), &w, &h,
                            &file_channels, channels),
      &stbi_image_free);
  if (!pixels) input_error(detail::str("ImageFolder: cannot decode ", file, ": ", stb_reason()));

  // Another size: resize in uint8, as PIL would before ToTensor.
  const stbi_uc* hwc = pixels.get();
  std::vector<stbi_uc> resized;
  if (w != width_ || h != height_) {
    resized.resize(static_cast<size_t>(height_ * width_ * channels_));
    if (!stbir_resize_uint8(hwc, w, h, 0, resized.data(), static_cast<int>(width_),
                            static_cast<int>(height_), 0, channels)) {
      input_error(detail::str("ImageFolder: cannot resize ", file, " from ", w, "x", h, " to ",
                              width_, "x", height_));
    }
    hwc = resized.data();
  }
  // HWC uint8 -> CHW float in [0, 1], pixel / 255 like torchvision's ToTensor.
  const int64_t plane = height_ * width_;
  for (int64_t c = 0; c < channels_; ++c) {
    for (int64_t k = 0; k < plane; ++k) {
      out[c * plane + k] = static_cast<float>(hwc[k * channels_ + c]) / 255.0f;
    }
  }
  return labels_[static_cast<size_t>(index)];
}

std::string ImageFolderDataset::describe() const {
  return detail::str("ImageFolder ", root_, ": ", size(), " images of ", shape_str(example_shape()),
                     " in ", num_classes(), " classes (", ignored_files_,
                     " files with other extensions ignored)");
}

}  // namespace kiln
