// png_check_test.cpp: the PNG checks made before stb_image decodes a file (data/png_check.h),
// through decode_image_chw: a chunk declaring more data than the file holds is refused with the
// chunk, its offset and both sizes named, and so is image data inflating past what the header
// needs; the same files intact decode, bytes after IEND are not looked at, and the inflated
// size is exact for interlaced (Adam7) images too, shown on PNGs written here that stb decodes
// to the pixels put in.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "stb_image.h"
#include "stb_image_write.h"

#include "data/image_decode.h"
#include "data/png_check.h"
#include "engine/error.h"
#include "image_bytes.h"

namespace kiln {
namespace {

using test::Bytes;

// A 4x3 RGB PNG from stb_image_write: signature, IHDR at byte 8, IDAT at byte 33, IEND.
Bytes small_png() {
  std::vector<unsigned char> rgb(4 * 3 * 3);
  for (size_t k = 0; k < rgb.size(); ++k) rgb[k] = static_cast<unsigned char>(k * 19 % 256);
  Bytes png;
  stbi_write_png_to_func(test::append_to_bytes, &png, 4, 3, 3, rgb.data(), 4 * 3);
  return png;
}

std::string decode_error(const Bytes& png) {
  std::vector<float> out(3 * 3 * 4);
  return test::input_error_of(
      [&] { decode_image_chw(png.data(), png.size(), "x.png", 3, 3, 4, out.data()); });
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

// ---- PNGs written here: any colour type, interlaced or not, any image data ------------------

void put32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(v >> s));
}

void put_chunk(Bytes& png, const char* type, const Bytes& data) {
  put32(png, static_cast<uint32_t>(data.size()));
  const size_t start = png.size();
  png.insert(png.end(), type, type + 4);
  png.insert(png.end(), data.begin(), data.end());
  put32(png, test::png_crc32(png.data() + start, png.size() - start));
}

// `raw` as a zlib stream of stored (uncompressed) deflate blocks (RFC 1950, RFC 1951 3.2.4).
Bytes zlib_stored(const Bytes& raw) {
  Bytes z = {0x78, 0x01};
  size_t pos = 0;
  do {
    const size_t len = std::min<size_t>(raw.size() - pos, 65535);
    const bool last = pos + len == raw.size();
    z.push_back(last ? 1 : 0);
    z.push_back(static_cast<unsigned char>(len & 0xFF));
    z.push_back(static_cast<unsigned char>(len >> 8));
    z.push_back(static_cast<unsigned char>(~len & 0xFF));
    z.push_back(static_cast<unsigned char>((~len >> 8) & 0xFF));
    z.insert(z.end(), raw.begin() + static_cast<long>(pos), raw.begin() + static_cast<long>(pos + len));
    pos += len;
  } while (pos < raw.size());
  uint32_t a = 1, b = 0;  // Adler-32
  for (unsigned char c : raw) {
    a = (a + c) % 65521;
    b = (b + a) % 65521;
  }
  put32(z, (b << 16) | a);
  return z;
}

// An 8-bit PNG (colour type 0 grey or 2 RGB) of w x h with `raw` as its filtered image data.
Bytes png_with_data(int w, int h, int color_type, bool interlaced, const Bytes& raw) {
  Bytes png = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  Bytes ihdr;
  put32(ihdr, static_cast<uint32_t>(w));
  put32(ihdr, static_cast<uint32_t>(h));
  ihdr.insert(ihdr.end(), {8, static_cast<unsigned char>(color_type), 0, 0,
                           static_cast<unsigned char>(interlaced ? 1 : 0)});
  put_chunk(png, "IHDR", ihdr);
  put_chunk(png, "IDAT", zlib_stored(raw));
  put_chunk(png, "IEND", {});
  return png;
}

// Pixel (x, y) of the grey test image.
unsigned char grey_at(int x, int y) { return static_cast<unsigned char>(x * 31 + y * 7 + 1); }

// The filtered data of a grey image: per Adam7 pass (or the one pass of a plain image), per
// row, filter byte 0 ("None") and the row's pixels.
Bytes grey_data(int w, int h, bool interlaced) {
  static const int ox[7] = {0, 4, 0, 2, 0, 1, 0}, oy[7] = {0, 0, 4, 0, 2, 0, 1};
  static const int sx[7] = {8, 8, 4, 4, 2, 2, 1}, sy[7] = {8, 8, 8, 4, 4, 2, 2};
  Bytes raw;
  for (int p = 0; p < (interlaced ? 7 : 1); ++p) {
    const int x0 = interlaced ? ox[p] : 0, y0 = interlaced ? oy[p] : 0;
    const int dx = interlaced ? sx[p] : 1, dy = interlaced ? sy[p] : 1;
    if (x0 >= w || y0 >= h) continue;  // an empty pass has no rows
    for (int y = y0; y < h; y += dy) {
      raw.push_back(0);
      for (int x = x0; x < w; x += dx) raw.push_back(grey_at(x, y));
    }
  }
  return raw;
}

TEST(PngCheck, InflatedSizeIsExactForPlainAndInterlacedImages) {
  // By hand: 8x8 RGB, 8 bits, non-interlaced: 8 rows of 1 + 24 bytes; Adam7: passes of 1x1,
  // 1x1, 2x1, 2x2, 4x2, 4x4 and 8x4 pixels, each row with its filter byte.
  EXPECT_EQ(detail::png_inflated_size(8, 8, 8, 2, false), 8 * 25);
  EXPECT_EQ(detail::png_inflated_size(8, 8, 8, 2, true), 4 + 4 + 7 + 2 * 7 + 2 * 13 + 4 * 13 + 4 * 25);
  EXPECT_EQ(detail::png_inflated_size(3, 2, 1, 0, false), 2 * 2);  // 3 one-bit pixels: one byte
  EXPECT_EQ(detail::png_inflated_size(1, 1, 16, 6, true), 1 + 8);  // pass 1 alone
  EXPECT_EQ(detail::png_inflated_size(4, 4, 8, 5, false), 0);      // no colour type 5
  EXPECT_EQ(detail::png_inflated_size(4, 4, 3, 0, false), 0);      // no 3-bit depth
  // On files: stb decodes each to the pixels put in, so the data had exactly the right size.
  for (const bool interlaced : {false, true}) {
    for (const auto& [w, h] : std::vector<std::pair<int, int>>{{1, 1}, {5, 3}, {9, 9}, {16, 2}, {300, 300}}) {
      const Bytes raw = grey_data(w, h, interlaced);
      EXPECT_EQ(static_cast<int64_t>(raw.size()), detail::png_inflated_size(w, h, 8, 0, interlaced));
      const Bytes png = png_with_data(w, h, 0, interlaced, raw);
      // The check itself, made even on this small data, accepts the exact size, and the PNG it
      // rewrites with the data stored decodes to the same pixels.
      const Bytes stored = detail::png_checked_for_stb(png.data(), png.size(), "x.png");
      ASSERT_FALSE(stored.empty());
      // The rewrite is for stb alone (its new IDAT carries no CRC or Adler-32): stb decodes it.
      std::vector<float> out(static_cast<size_t>(w * h));
      decode_image_chw(png.data(), png.size(), "x.png", 1, h, w, out.data());
      int sw = 0, sh = 0, sc = 0;
      std::unique_ptr<unsigned char, void (*)(void*)> stb_pixels(
          stbi_load_from_memory(stored.data(), static_cast<int>(stored.size()), &sw, &sh, &sc, 1),
          &stbi_image_free);
      ASSERT_TRUE(stb_pixels != nullptr);
      ASSERT_EQ(sw, w);
      ASSERT_EQ(sh, h);
      for (const bool rewritten : {false, true}) {
        for (int y = 0; y < h; ++y) {
          for (int x = 0; x < w; ++x) {
            const size_t k = static_cast<size_t>(y * w + x);
            ASSERT_EQ(rewritten ? stb_pixels.get()[k] / 255.0f : out[k], grey_at(x, y) / 255.0f)
                << w << "x" << h << (interlaced ? " interlaced" : "") << " at " << x << "," << y
                << (rewritten ? " (rewritten)" : "");
          }
        }
      }
    }
  }
}

TEST(PngCheck, RefusesImageDataThatInflatesPastWhatTheHeaderNeeds) {
  // A 4x3 RGB image needs 3 x (1 + 12) = 39 bytes; this stream carries 1 MB more (stored
  // blocks here; deflate proper would pack it into about 1 KB).
  Bytes raw(39, 0);
  const Bytes good = png_with_data(4, 3, 2, false, raw);
  EXPECT_EQ(decode_error(good), "(no error)");
  raw.resize(39 + (1 << 20), 0);
  const std::string msg = decode_error(png_with_data(4, 3, 2, false, raw));
  EXPECT_NE(msg.find("x.png is a corrupt PNG: its compressed image data inflates to more than "
                     "the 39 bytes its 4x3 header needs"), std::string::npos) << msg;
  // One byte more is enough, however small the data: every stream is inflated once to check
  // its Adler-32 (stb alone would decode it, ignoring the extra byte).
  raw.resize(40);
  const Bytes one_more = png_with_data(4, 3, 2, false, raw);
  const std::string checked = test::input_error_of([&] {
    detail::png_checked_for_stb(one_more.data(), one_more.size(), "x.png");
  });
  EXPECT_NE(checked.find("more than the 39 bytes"), std::string::npos) << checked;
  EXPECT_NE(decode_error(one_more).find("more than the 39 bytes"), std::string::npos);
  // Without its IEND chunk the file is left to stb, which refuses it: the rewritten file, which
  // has one, would decode.
  Bytes no_end = png_with_data(4, 3, 2, false, Bytes(39, 0));
  no_end.resize(no_end.size() - 12);
  EXPECT_TRUE(detail::png_checked_for_stb(no_end.data(), no_end.size(), "x.png").empty());
  EXPECT_NE(decode_error(no_end).find("cannot decode x.png"), std::string::npos);
  // One byte less is stb's to refuse, with its own reason.
  raw.resize(38);
  const std::string short_msg = decode_error(png_with_data(4, 3, 2, false, raw));
  EXPECT_NE(short_msg.find("cannot decode x.png"), std::string::npos) << short_msg;
}

// stb_image checks no checksum: a damaged chunk would decode into damaged pixels. Every chunk's
// CRC is verified (IHDR, IDAT, IEND, and the ancillary ones), and the zlib stream's Adler-32
// over the data it inflates to; each mismatch names the file and the chunk.
TEST(PngCheck, RefusesAChunkWhoseCrcDoesNotMatch) {
  const Bytes good = small_png();
  ASSERT_EQ(decode_error(good), "(no error)");
  // A byte of each chunk's data (IHDR's width, IDAT's first deflate byte) or of the IEND CRC.
  const std::vector<std::pair<size_t, std::string>> damage = {
      {16 + 3, "IHDR"}, {41 + 2, "IDAT"}, {good.size() - 1, "IEND"}};
  for (const auto& [at, chunk] : damage) {
    Bytes bad = good;
    bad[at] ^= 0x10;
    const std::string msg = decode_error(bad);
    EXPECT_NE(msg.find("x.png: the CRC of chunk " + chunk + " does not match its data: the file "
                       "is damaged"), std::string::npos) << msg;
  }
  // A file that ends inside a CRC is truncated.
  Bytes cut = good;
  cut.resize(cut.size() - 2);
  EXPECT_NE(decode_error(cut).find("the file ends inside the CRC of its IEND chunk"),
            std::string::npos);
  // An ancillary chunk's CRC counts too (stb skips the chunk's data, unread).
  Bytes text = good;
  Bytes with_text(text.begin(), text.begin() + 33);
  put_chunk(with_text, "tEXt", {'a', 0, 'b'});
  with_text.insert(with_text.end(), text.begin() + 33, text.end());
  EXPECT_EQ(decode_error(with_text), "(no error)");
  with_text[33 + 8 + 2] = 'c';
  EXPECT_NE(decode_error(with_text).find("the CRC of chunk tEXt does not match"), std::string::npos);
}

TEST(PngCheck, RefusesImageDataWhoseAdlerDoesNotMatch) {
  // Stored deflate: a pixel byte changed inflates to a wrong image of the right size. With the
  // IDAT CRC recomputed (as a tool that rewrites chunks would), only the Adler-32 tells.
  Bytes raw(39, 0);
  for (size_t k = 0; k < raw.size(); ++k) raw[k] = k % 13 == 0 ? 0 : static_cast<unsigned char>(k * 7);
  Bytes png = png_with_data(4, 3, 2, false, raw);
  ASSERT_EQ(decode_error(png), "(no error)");
  const size_t idat_data = 8 + 25 + 8, first_pixel = idat_data + 2 + 5 + 1;
  png[first_pixel] ^= 0x01;
  test::fix_png_crcs(png);
  const std::string msg = decode_error(png);
  EXPECT_NE(msg.find("x.png: the Adler-32 of the zlib stream in chunk IDAT does not match the "
                     "data it inflates to: the file is damaged"), std::string::npos) << msg;
  // Images of any size are checked: the same on 300x300 grey, split over several IDAT chunks.
  const Bytes big_raw = grey_data(300, 300, false);
  const Bytes z = zlib_stored(big_raw);
  Bytes big = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  Bytes ihdr;
  put32(ihdr, 300);
  put32(ihdr, 300);
  ihdr.insert(ihdr.end(), {8, 0, 0, 0, 0});
  put_chunk(big, "IHDR", ihdr);
  const size_t half = z.size() / 2;
  put_chunk(big, "IDAT", Bytes(z.begin(), z.begin() + static_cast<long>(half)));
  put_chunk(big, "IDAT", Bytes(z.begin() + static_cast<long>(half), z.end()));
  put_chunk(big, "IEND", {});
  std::vector<float> out(300 * 300);
  decode_image_chw(big.data(), big.size(), "big.png", 1, 300, 300, out.data());
  big[big.size() - 12 - 4 - 4 - 1] ^= 0x01;  // the last byte of the Adler-32 itself
  test::fix_png_crcs(big);
  const std::string big_msg = test::input_error_of(
      [&] { decode_image_chw(big.data(), big.size(), "big.png", 1, 300, 300, out.data()); });
  EXPECT_NE(big_msg.find("big.png: the Adler-32 of the zlib stream"), std::string::npos) << big_msg;
}

}  // namespace
}  // namespace kiln
