// image_decode.cpp: format and size checks, then stb_image decoding (see image_decode.h). stb's
// implementations come from Debian's libstb.so (data/CMakeLists.txt), or from
// data/stb_instrumented.cpp in the fuzz build.
#include "data/image_decode.h"

#include <climits>
#include <cstring>
#include <memory>
#include <vector>

#include "stb_image.h"
#include "stb_image_resize.h"

#include "data/jpeg_check.h"
#include "data/png_check.h"
#include "engine/error.h"

namespace kiln {

namespace {

[[noreturn]] void input_error(const std::string& what) { throw Error(what, ErrorKind::Input); }

// stb's reason for the last failure on this thread (thread-local: STBI_THREAD_LOCAL).
std::string stb_reason() {
  const char* r = stbi_failure_reason();
  return r ? r : "unknown reason";
}

bool is_png(const unsigned char* b, size_t n) {
  static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  return n >= sizeof(sig) && std::memcmp(b, sig, sizeof(sig)) == 0;
}

bool is_jpeg(const unsigned char* b, size_t n) {
  return n >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF;
}

}  // namespace

ImageHeader read_image_header(const unsigned char* bytes, size_t size, const std::string& name,
                              int64_t max_pixels) {
  if (size == 0) input_error(detail::str("ImageFolder: ", name, " is empty"));
  if (!is_png(bytes, size) && !is_jpeg(bytes, size)) {
    input_error(detail::str("ImageFolder: ", name, " is neither a PNG nor a JPEG file (its first "
                            "bytes are not a PNG signature or a JPEG start-of-image marker)"));
  }
  // stb takes the length as an int.
  if (size > static_cast<size_t>(INT_MAX)) {
    input_error(detail::str("ImageFolder: ", name, " is ", size, " bytes, larger than the ",
                            INT_MAX, " bytes an image file may have"));
  }
  if (is_jpeg(bytes, size)) detail::check_jpeg_tables(bytes, size, name);
  if (is_png(bytes, size)) detail::check_png_chunks(bytes, size, name);
  ImageHeader h;
  if (!stbi_info_from_memory(bytes, static_cast<int>(size), &h.width, &h.height, &h.channels)) {
    input_error(detail::str("ImageFolder: cannot decode ", name, ": ", stb_reason()));
  }
  const int64_t pixels = int64_t{h.width} * h.height;
  if (pixels > max_pixels) {
    input_error(detail::str("ImageFolder: ", name, " is ", h.width, "x", h.height, " = ", pixels,
                            " pixels, over the limit of ", max_pixels, " pixels per image "
                            "(ImageFolderOptions::max_pixels): shrink the image, or raise the "
                            "limit if the file is trusted"));
  }
  return h;
}

void decode_image_chw(const unsigned char* bytes, size_t size, const std::string& name,
                      int channels, int height, int width, float* out, int64_t max_pixels) {
  KILN_CHECK((channels == 1 || channels == 3) && height >= 1 && width >= 1,
             "decode_image_chw: channels ", channels, " must be 1 or 3, and height ", height,
             " and width ", width, " >= 1");
  const ImageHeader header = read_image_header(bytes, size, name, max_pixels);
  // A PNG large enough to matter is inflated once here, checked, and handed to stb with its
  // data stored (data/png_check.h).
  const std::vector<unsigned char> checked_png =
      is_png(bytes, size) ? detail::png_checked_for_stb(bytes, size, name) : std::vector<unsigned char>();
  const unsigned char* stb_bytes = checked_png.empty() ? bytes : checked_png.data();
  const int stb_size = static_cast<int>(checked_png.empty() ? size : checked_png.size());
  // Decode to HWC uint8 with exactly `channels` channels (stb converts grey <-> RGB).
  int w = 0, h = 0, file_channels = 0;
  std::unique_ptr<stbi_uc, void (*)(void*)> pixels(
      stbi_load_from_memory(stb_bytes, stb_size, &w, &h, &file_channels, channels),
      &stbi_image_free);
  if (!pixels) input_error(detail::str("ImageFolder: cannot decode ", name, ": ", stb_reason()));
  // The header was read by the same decoder; a file whose pixels disagree with it is damaged.
  if (w != header.width || h != header.height) {
    input_error(detail::str("ImageFolder: ", name, " decodes to ", w, "x", h, " but its header "
                            "says ", header.width, "x", header.height, ": the file is damaged"));
  }

  // Another size: resize in uint8, as PIL would before ToTensor.
  const stbi_uc* hwc = pixels.get();
  std::vector<stbi_uc> resized;
  if (w != width || h != height) {
    resized.resize(static_cast<size_t>(height) * static_cast<size_t>(width) *
                   static_cast<size_t>(channels));
    if (!stbir_resize_uint8(hwc, w, h, 0, resized.data(), width, height, 0, channels)) {
      input_error(detail::str("ImageFolder: cannot resize ", name, " from ", w, "x", h, " to ",
                              width, "x", height));
    }
    hwc = resized.data();
  }
  // HWC uint8 -> CHW float in [0, 1], pixel / 255 like torchvision's ToTensor.
  const int64_t plane = int64_t{height} * width;
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t k = 0; k < plane; ++k) {
      out[c * plane + k] = static_cast<float>(hwc[k * channels + c]) / 255.0f;
    }
  }
}

}  // namespace kiln
