// png_check_test.cpp: the PNG chunk check made before stb_image decodes a file
// (data/png_check.h), through decode_image_chw: a chunk declaring more data than the file holds
// is refused with the chunk, its offset and both sizes named, while the same file intact, or
// cut after its IEND chunk's header, or with bytes after IEND, decodes.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "stb_image_write.h"

#include "data/image_decode.h"
#include "engine/error.h"

namespace kiln {
namespace {

using Bytes = std::vector<unsigned char>;

// A 4x3 RGB PNG from stb_image_write: signature, IHDR at byte 8, IDAT at byte 33, IEND.
Bytes small_png() {
  std::vector<unsigned char> rgb(4 * 3 * 3);
  for (size_t k = 0; k < rgb.size(); ++k) rgb[k] = static_cast<unsigned char>(k * 19 % 256);
  Bytes png;
  stbi_write_png_to_func([](void* ctx, void* data, int size) {
    auto* out = static_cast<Bytes*>(ctx);
    const auto* p = static_cast<const unsigned char*>(data);
    out->insert(out->end(), p, p + size);
  }, &png, 4, 3, 3, rgb.data(), 4 * 3);
  return png;
}

std::string decode_error(const Bytes& png) {
  std::vector<float> out(3 * 3 * 4);
  try {
    decode_image_chw(png.data(), png.size(), "x.png", 3, 3, 4, out.data());
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input) << e.what();
    return e.what();
  }
  return "(no error)";
}

void set_length(Bytes& png, size_t chunk, uint32_t length) {
  for (int i = 0; i < 4; ++i) png[chunk + static_cast<size_t>(i)] = static_cast<unsigned char>(length >> (24 - 8 * i));
}

TEST(PngCheck, RefusesAChunkLongerThanTheRestOfTheFile) {
  const Bytes good = small_png();
  ASSERT_EQ(std::string(good.begin() + 37, good.begin() + 41), "IDAT");
  EXPECT_EQ(decode_error(good), "(no error)");
  Bytes bad = good;
  set_length(bad, 33, 0x7FFFFFFFu);  // stb would allocate 2 GiB for it
  const size_t left = good.size() - 41;
  std::string msg = decode_error(bad);
  EXPECT_NE(msg.find("x.png is a corrupt PNG: its IDAT chunk at byte 33 declares 2147483647 bytes "
                     "of data, but only " + std::to_string(left) + " bytes follow in the file"),
            std::string::npos) << msg;
  // One byte too many is refused as well; a damaged type is shown in hex.
  bad = good;
  set_length(bad, 33, static_cast<uint32_t>(left + 1));
  bad[37] = 0x01;
  msg = decode_error(bad);
  EXPECT_NE(msg.find("its 0x01444154 chunk at byte 33 declares " + std::to_string(left + 1)),
            std::string::npos) << msg;
}

TEST(PngCheck, BytesAfterTheEndChunkAreNotLookedAt) {
  Bytes png = small_png();
  const Bytes trailer = {0x00, 0x00, 0xFF, 0xFF, 'J', 'U', 'N', 'K'};  // a "chunk" of 65535 bytes
  png.insert(png.end(), trailer.begin(), trailer.end());
  EXPECT_EQ(decode_error(png), "(no error)");
}

}  // namespace
}  // namespace kiln
