// image_decode.cpp: fuzz target for ImageFolder's decoding of one file (data/image_decode.h:
// PNG or JPEG through stb_image, after the format and pixel-budget checks).
//
// Input layout: byte 0 picks the output (bit 0: 1 or 3 channels; bits 1..7: 0 = the image's
// own size, else a square of that many pixels a side, so the resize path runs too), the rest is
// the file. The budget is 2^20 pixels (1024 x 1024), small enough that no accepted input costs
// more than a few megabytes or milliseconds. An Input error is the expected answer to a bad file.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "data/image_decode.h"
#include "engine/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  constexpr int64_t kBudget = int64_t{1} << 20;
  const int channels = (data[0] & 1) ? 3 : 1;
  const int side = data[0] >> 1;
  const unsigned char* file = data + 1;
  const size_t file_size = size - 1;
  try {
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
