// image_decode.cpp: fuzz target for ImageFolder's decoding of one file (data/image_decode.h:
// PNG or JPEG through stb_image, after the format and pixel-budget checks).
//
// Input layout: byte 0 picks the output (bit 0: 1 or 3 channels; bits 1..7: 0 = the image's
// own size, else a square of that many pixels a side, so the resize path runs too), the rest is
// the file. A PNG also goes through the inflate check on its own, and the PNG that check
// rewrites (its data stored) must decode in stb exactly as the original. The budget is 2^20
// pixels (1024 x 1024), small enough that no accepted input costs more than a few megabytes or
// milliseconds. An Input error is the expected answer to a bad file.
//
// Kiln verifies every PNG chunk's CRC and the zlib stream's Adler-32 before stb sees the file,
// so almost every mutation of a PNG would stop there. Each PNG input is therefore decoded a
// second time with its checksums recomputed (as the checkpoint target does with its CRCs), and
// the mutations reach the checks behind them and stb itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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
    rewritten = kiln::detail::png_checked_for_stb(file, size, "input");
  } catch (const kiln::Error& e) {
    if (e.kind() != kiln::ErrorKind::Input) std::abort();
    return;
  }
  if (rewritten.empty()) return;
  const StbPixels a = stb_decode(file, size, channels);
  const StbPixels b = stb_decode(rewritten.data(), rewritten.size(), channels);
  if (a.w != b.w || a.h != b.h || a.bytes != b.bytes) std::abort();
}

uint32_t be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

void put_be32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (24 - 8 * i));
}

uint32_t crc32(const unsigned char* p, size_t n) {  // PNG 5.3, bit by bit
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return c ^ 0xFFFFFFFFu;
}

uint32_t adler32(const unsigned char* p, size_t n) {  // RFC 1950
  uint32_t a = 1, b = 0;
  for (size_t i = 0; i < n; ++i) {
    a = (a + p[i]) % 65521;
    b = (b + a) % 65521;
  }
  return (b << 16) | a;
}

// `png` with the Adler-32 trailer of its image data (when the last IDAT chunk holds it whole
// and the data inflates) and every chunk's CRC up to IEND set to match.
std::vector<unsigned char> with_checksums_recomputed(std::vector<unsigned char> png) {
  std::vector<size_t> idat;  // offsets of the IDAT chunks
  std::vector<char> joined;
  size_t pos = 8;
  while (pos + 12 <= png.size()) {
    const uint32_t length = be32(&png[pos]);
    if (length > png.size() - pos - 12) break;
    if (std::memcmp(&png[pos + 4], "IDAT", 4) == 0) {
      idat.push_back(pos);
      joined.insert(joined.end(), png.begin() + static_cast<long>(pos + 8),
                    png.begin() + static_cast<long>(pos + 8 + length));
    }
    if (std::memcmp(&png[pos + 4], "IEND", 4) == 0) break;
    pos += 12 + size_t{length};
  }
  if (!idat.empty() && be32(&png[idat.back()]) >= 4 && joined.size() >= 6) {
    int inflated_size = 0;
    char* inflated = stbi_zlib_decode_malloc(joined.data(), static_cast<int>(joined.size()),
                                             &inflated_size);
    if (inflated != nullptr) {
      const size_t trailer = idat.back() + 8 + be32(&png[idat.back()]) - 4;
      put_be32(&png[trailer], adler32(reinterpret_cast<const unsigned char*>(inflated),
                                      static_cast<size_t>(inflated_size)));
      stbi_image_free(inflated);
    }
  }
  for (pos = 8; pos + 12 <= png.size();) {
    const uint32_t length = be32(&png[pos]);
    if (length > png.size() - pos - 12) break;
    put_be32(&png[pos + 8 + length], crc32(&png[pos + 4], 4 + size_t{length}));
    if (std::memcmp(&png[pos + 4], "IEND", 4) == 0) break;
    pos += 12 + size_t{length};
  }
  return png;
}

void decode_one(const uint8_t* data, size_t size);

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  decode_one(data, size);
  if (size >= 9 && data[1] == 0x89) {
    const std::vector<unsigned char> fixed = with_checksums_recomputed(
        std::vector<unsigned char>(data, data + size));
    decode_one(fixed.data(), fixed.size());
  }
  return 0;
}

namespace {

// One input: byte 0 picks the output, the rest is the file (the layout above).
void decode_one(const uint8_t* data, size_t size) {
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
}

}  // namespace
