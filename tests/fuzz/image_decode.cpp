// image_decode.cpp: fuzz target for ImageFolder's decoding of one file (data/image_decode.h:
// PNG or JPEG through stb_image, after the format and pixel-budget checks).
//
// Input layout: byte 0 picks the output (bit 0: 1 or 3 channels; bits 1..7: 0 = the image's
// own size, else a square of that many pixels a side, so the resize path runs too), the rest is
// the file. A PNG also goes through the inflate check on its own, and the PNG that check
// rewrites (its data stored) must decode in stb exactly as the original. The budget is 2^20
// pixels (1024 x 1024), small enough that no accepted input costs more than a few megabytes or
// milliseconds. An Input error is the expected answer to a bad file.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "stb_image.h"

#include "data/image_decode.h"
#include "data/png_check.h"
#include "engine/error.h"

namespace {

struct StbPixels {
  int w = 0, h = 0;
  std::vector<unsigned char> bytes;  // empty: stb failed
};

StbPixels stb_decode(const unsigned char* p, size_t n, int channels) {
  StbPixels out;
  int c = 0;
  unsigned char* px = stbi_load_from_memory(p, static_cast<int>(n), &out.w, &out.h, &c, channels);
  if (px != nullptr) {
    out.bytes.assign(px, px + static_cast<size_t>(out.w) * out.h * channels);
    stbi_image_free(px);
  }
  return out;
}

void check_rewritten_png(const unsigned char* file, size_t size, int channels) {
  std::vector<unsigned char> rewritten;
  try {
    // The chunk check and the pixel budget, as decode_image_chw makes them first.
    kiln::read_image_header(file, size, "input", int64_t{1} << 20);
    rewritten = kiln::detail::png_checked_for_stb(file, size, "input", /*harmless_bytes=*/0);
  } catch (const kiln::Error& e) {
    if (e.kind() != kiln::ErrorKind::Input) std::abort();
    return;
  }
  if (rewritten.empty()) return;
  const StbPixels a = stb_decode(file, size, channels);
  const StbPixels b = stb_decode(rewritten.data(), rewritten.size(), channels);
  if (a.w != b.w || a.h != b.h || a.bytes != b.bytes) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  constexpr int64_t kBudget = int64_t{1} << 20;
  const int channels = (data[0] & 1) ? 3 : 1;
  const int side = data[0] >> 1;
  const unsigned char* file = data + 1;
  const size_t file_size = size - 1;
  try {
    // The PNG inflate check runs on every input here (fuzz inputs are too small to need it in
    // decode_image_chw, which skips data that cannot inflate past 16 MiB), and the PNG it
    // rewrites must decode in stb exactly as the original does.
    if (file_size >= 8 && file[0] == 0x89) check_rewritten_png(file, file_size, channels);
    const kiln::ImageHeader h = kiln::read_image_header(file, file_size, "input", kBudget);
    if (h.width < 1 || h.height < 1 || int64_t{h.width} * h.height > kBudget) std::abort();
    const int height = side != 0 ? side : h.height;
    const int width = side != 0 ? side : h.width;
    std::vector<float> out(static_cast<size_t>(channels) * height * width, -1.0f);
    kiln::decode_image_chw(file, file_size, "input", channels, height, width, out.data(), kBudget);
    for (float v : out) {
      if (!(v >= 0.0f && v <= 1.0f)) std::abort();
    }
  } catch (const kiln::Error& e) {
    if (e.kind() != kiln::ErrorKind::Input) std::abort();
  }
  return 0;
}
