// idx_export.cpp: MNIST split -> split_dir/<label>/<index>.png (see idx_export.h).
#include "data/idx_export.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <string>
#include <system_error>

#include "stb_image_write.h"

#include "engine/error.h"
#include "engine/output_file.h"

namespace kiln {

namespace {

namespace fs = std::filesystem;

const char* kMarker = ".kiln_complete";

[[noreturn]] void input_error(const std::string& what) { throw Error(what, ErrorKind::Input); }

// The count recorded in dir's marker, or -1 when there is no readable marker.
int64_t marker_count(const fs::path& dir) {
  std::ifstream in(dir / kMarker);
  int64_t count = -1;
  if (!(in >> count)) return -1;
  return count;
}

// stb_image_write's output callback: appends the encoded bytes to a std::string.
void append_bytes(void* context, void* data, int size) {
  static_cast<std::string*>(context)->append(static_cast<const char*>(data),
                                              static_cast<size_t>(size));
}

// Every example of `dataset` as tmp_dir/<label>/<index>.png, then the marker. Each file is
// written by write_output_file (engine/output_file.h): a failed write throws a Runtime error
// naming the file and the system's reason ("File too large", "No space left on device").
void write_split_files(const MnistDataset& dataset, const fs::path& tmp_dir) {
  const int64_t count = dataset.size();
  std::error_code ec;
  const int width = static_cast<int>(std::to_string(std::max<int64_t>(count - 1, 0)).size());
  for (int64_t i = 0; i < count; ++i) {
    const fs::path class_dir = tmp_dir / std::to_string(dataset.label(i));
    fs::create_directories(class_dir, ec);
    if (ec) input_error(detail::str("cannot create ", class_dir.string(), ": ", ec.message()));
    std::ostringstream name;
    name << std::setw(width) << std::setfill('0') << i << ".png";
    const std::string file = (class_dir / name.str()).string();
    const int rows = static_cast<int>(MnistDataset::kRows), cols = static_cast<int>(MnistDataset::kCols);
    std::string png;
    if (!stbi_write_png_to_func(append_bytes, &png, cols, rows, 1, dataset.image_bytes(i), cols)) {
      throw Error(detail::str("cannot encode ", file, " as PNG"));
    }
    write_output_file("the image", file, png);
  }
  write_output_file("the marker", (tmp_dir / kMarker).string(), std::to_string(count) + "\n");
}

}  // namespace

IdxExportResult export_idx_split(const MnistDataset& dataset, const std::string& split_dir) {
  const auto start = std::chrono::steady_clock::now();
  const fs::path final_dir(split_dir);
  const int64_t count = dataset.size();
  IdxExportResult result;
  std::error_code ec;

  if (fs::exists(final_dir, ec)) {
    const int64_t found = marker_count(final_dir);
    if (found == count) {
      result.files = count;
      result.skipped = true;
      return result;
    }
    input_error(detail::str(
        split_dir, " already exists and ",
        found < 0 ? std::string("is not a complete export (no ") + kMarker + ")"
                  : detail::str("holds ", found, " images, not the ", count, " asked for"),
        ": delete it or choose another output directory"));
  }

  fs::path tmp_dir = final_dir;
  tmp_dir += ".tmp";
  fs::remove_all(tmp_dir, ec);  // left by an interrupted run
  if (ec) input_error(detail::str("cannot remove the stale ", tmp_dir.string(), ": ", ec.message()));

  // A write that fails (a full disk, the file-size limit) is a runtime error naming the file;
  // the half-written ".tmp" folder goes with it.
  try {
    write_split_files(dataset, tmp_dir);
  } catch (const Error&) {
    std::error_code ignored;
    fs::remove_all(tmp_dir, ignored);
    throw;
  }
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) {
    input_error(detail::str("cannot rename ", tmp_dir.string(), " to ", split_dir, ": ", ec.message()));
  }
  result.files = count;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace kiln
