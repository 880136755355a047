// jpeg_check_test.cpp: the JPEG table checks made before stb_image decodes a file
// (data/jpeg_check.h), through decode_image_chw. Each refusal is shown on a real file with one
// byte or one segment changed, next to the unchanged file decoding; the progressive files
// (tests/data/images, written by libjpeg) show that a table a scan names but does not decode
// with is not required.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "stb_image_write.h"

#include "data/image_decode.h"
#include "engine/error.h"
#include "image_bytes.h"

namespace kiln {
namespace {

using test::Bytes;

// An 8x8 RGB baseline JPEG from stb_image_write: DQT (tables 0, 1), SOF0 (components 1, 2, 3
// with quantization tables 0, 1, 1), DHT (DC 0, AC 0, DC 1, AC 1), one SOS (component 1 with
// tables DC 0 / AC 0, components 2 and 3 with DC 1 / AC 1).
Bytes baseline_jpeg() {
  std::vector<unsigned char> rgb(8 * 8 * 3);
  for (size_t k = 0; k < rgb.size(); ++k) rgb[k] = static_cast<unsigned char>(k * 7 % 256);
  Bytes jpg;
  stbi_write_jpg_to_func(test::append_to_bytes, &jpg, 8, 8, 3, rgb.data(), 90);
  return jpg;
}

Bytes read_fixture(const std::string& name) {
  const char* source = std::getenv("KILN_SOURCE_DIR");
  const std::string path = std::string(source ? source : ".") + "/tests/data/images/" + name;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot read " << path;
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Offset of the n-th (from 0) segment with this marker code (its FF byte), walking segment
// lengths from the start; scans' entropy-coded data is skipped to the next marker.
size_t segment(const Bytes& jpg, unsigned marker, int n = 0) {
  size_t pos = 2;
  while (pos + 3 < jpg.size()) {
    if (jpg[pos] != 0xFF || jpg[pos + 1] == 0x00 || jpg[pos + 1] == 0xFF ||
        (jpg[pos + 1] >= 0xD0 && jpg[pos + 1] <= 0xD7)) {
      ++pos;
      continue;
    }
    if (jpg[pos + 1] == marker && n-- == 0) return pos;
    pos += 2 + ((size_t{jpg[pos + 2]} << 8) | jpg[pos + 3]);
  }
  ADD_FAILURE() << "no segment FF " << std::hex << marker;
  return 0;
}

constexpr unsigned kSof0 = 0xC0, kSof2 = 0xC2, kDht = 0xC4, kSos = 0xDA;

std::vector<float> decode(const Bytes& jpg, int channels, int h, int w) {
  std::vector<float> out(static_cast<size_t>(channels * h * w), -1.0f);
  decode_image_chw(jpg.data(), jpg.size(), "x.jpg", channels, h, w, out.data());
  return out;
}

std::string decode_error(const Bytes& jpg) {
  return test::input_error_of([&] { decode(jpg, 3, 8, 8); });
}

TEST(JpegCheck, BaselineAndProgressiveFilesDecode) {
  EXPECT_EQ(decode(baseline_jpeg(), 3, 8, 8).size(), 3u * 8 * 8);
  // libjpeg's progressive files define each Huffman table just before the scan that needs it:
  // the first DC scan names AC table 0 (the standard asks for 0 there), defined only later.
  const Bytes rgb = read_fixture("progressive_rgb_16x12.jpg");
  const Bytes grey = read_fixture("progressive_grey_9x7.jpg");
  ASSERT_EQ(rgb[segment(rgb, kSof2) + 1], kSof2);
  EXPECT_EQ(decode(rgb, 3, 12, 16).size(), 3u * 12 * 16);
  EXPECT_EQ(decode(grey, 1, 7, 9).size(), 1u * 7 * 9);
}

TEST(JpegCheck, RefusesAHuffmanTableOfMoreThan256Codes) {
  Bytes jpg = baseline_jpeg();
  jpg[segment(jpg, kDht) + 5 + 15] += 255;  // the first table's count of 16-bit codes
  const std::string msg = decode_error(jpg);
  EXPECT_NE(msg.find("x.jpg is a corrupt JPEG: a Huffman table declares"), std::string::npos) << msg;
  EXPECT_NE(msg.find("more than the 256 JPEG allows"), std::string::npos) << msg;
}

TEST(JpegCheck, RefusesAScanThatUsesAHuffmanTableNoSegmentDefined) {
  const Bytes good = baseline_jpeg();
  // The scan header: FF DA, length, count, then (component id, DC << 4 | AC) per component.
  const size_t sos = segment(good, kSos);
  ASSERT_EQ(good[sos + 4], 3);
  ASSERT_EQ(good[sos + 8], 0x11);  // component 2: DC 1, AC 1
  Bytes ac = good;
  ac[sos + 8] = 0x12;
  std::string msg = decode_error(ac);
  EXPECT_NE(msg.find("x.jpg is a corrupt JPEG: component 2 of scan 1 uses AC Huffman table 2, "
                     "which no DHT segment before the scan defines"), std::string::npos) << msg;
  Bytes dc = good;
  dc[sos + 6] = 0x30;  // component 1: DC 3
  msg = decode_error(dc);
  EXPECT_NE(msg.find("component 1 of scan 1 uses DC Huffman table 3"), std::string::npos) << msg;
  // The same tables defined only after the scan are still undefined when it is decoded.
  Bytes late = good;
  const size_t dht = segment(late, kDht);
  const size_t dht_size = 2 + ((size_t{late[dht + 2]} << 8) | late[dht + 3]);
  Bytes dht_bytes(late.begin() + static_cast<long>(dht), late.begin() + static_cast<long>(dht + dht_size));
  late.erase(late.begin() + static_cast<long>(dht), late.begin() + static_cast<long>(dht + dht_size));
  late.insert(late.end() - 2, dht_bytes.begin(), dht_bytes.end());  // before the end-of-image marker
  msg = decode_error(late);
  EXPECT_NE(msg.find("component 1 of scan 1 uses DC Huffman table 0"), std::string::npos) << msg;
}

TEST(JpegCheck, ProgressiveScansNeedOnlyTheTablesTheyDecodeWith) {
  const Bytes good = read_fixture("progressive_rgb_16x12.jpg");
  const auto spectral_start = [](const Bytes& jpg, size_t sos) { return jpg[sos + 5 + 2 * jpg[sos + 4]]; };
  const auto approximation_high = [](const Bytes& jpg, size_t sos) { return jpg[sos + 7 + 2 * jpg[sos + 4]] >> 4; };
  // Find the first DC scan, the first AC scan and a DC refinement scan of the file.
  size_t dc_first = 0, ac = 0, dc_refine = 0;
  for (int n = 0; n < 20 && (dc_first == 0 || ac == 0 || dc_refine == 0); ++n) {
    const size_t sos = segment(good, kSos, n);
    if (sos == 0) break;
    if (spectral_start(good, sos) != 0) {
      if (ac == 0) ac = sos;
    } else if (approximation_high(good, sos) == 0) {
      if (dc_first == 0) dc_first = sos;
    } else if (dc_refine == 0) {
      dc_refine = sos;
    }
  }
  ASSERT_NE(dc_first, 0u);
  ASSERT_NE(ac, 0u);
  ASSERT_NE(dc_refine, 0u);
  const auto decode_rgb = [](const Bytes& jpg) {
    return test::input_error_of([&] { decode(jpg, 3, 12, 16); });
  };
  Bytes bad = good;
  bad[dc_first + 6] = 0x30 | (bad[dc_first + 6] & 15);  // first DC scan: DC table 3
  EXPECT_NE(decode_rgb(bad).find("uses DC Huffman table 3"), std::string::npos) << decode_rgb(bad);
  bad = good;
  bad[ac + 6] = (bad[ac + 6] & 0xF0) | 3;  // AC scan: AC table 3
  EXPECT_NE(decode_rgb(bad).find("uses AC Huffman table 3"), std::string::npos) << decode_rgb(bad);
  // A DC refinement scan reads raw bits, no Huffman table: naming an undefined one is harmless.
  Bytes refine = good;
  refine[dc_refine + 6] = 0x33;
  EXPECT_EQ(decode_rgb(refine), "(no error)");
  EXPECT_EQ(decode(refine, 3, 12, 16), decode(good, 3, 12, 16));
}

TEST(JpegCheck, RefusesAComponentWhoseQuantizationTableNoSegmentDefined) {
  Bytes jpg = baseline_jpeg();
  // The frame header: FF C0, length, precision, height, width, count, then (id, sampling,
  // quantization table) per component.
  const size_t sof = segment(jpg, kSof0);
  ASSERT_EQ(jpg[sof + 9], 3);
  ASSERT_EQ(jpg[sof + 16], 3);  // component 3's id
  jpg[sof + 18] = 2;            // its quantization table: 1 -> 2, never defined
  const std::string msg = decode_error(jpg);
  EXPECT_NE(msg.find("component 3 of scan 1 uses quantization table 2, which no DQT segment "
                     "before the scan defines"), std::string::npos) << msg;
}

// An extra DHT segment, right after the start of image, defining DC table 2 (which no scan
// uses) with `counts` codes of each length 1..16 and values 0, 1, 2, ...
Bytes with_extra_dht(const Bytes& jpg, const std::vector<unsigned char>& counts) {
  size_t codes = 0;
  for (unsigned char c : counts) codes += c;
  const size_t length = 2 + 1 + 16 + codes;
  Bytes dht = {0xFF, 0xC4, static_cast<unsigned char>(length >> 8),
               static_cast<unsigned char>(length & 0xFF), 0x02};
  dht.insert(dht.end(), counts.begin(), counts.end());
  for (size_t v = 0; v < codes; ++v) dht.push_back(static_cast<unsigned char>(v));
  Bytes out = jpg;
  out.insert(out.begin() + 2, dht.begin(), dht.end());
  return out;
}

TEST(JpegCheck, RefusesAHuffmanTableOf256CodesNoneLongerThan9Bits) {
  const Bytes good = baseline_jpeg();
  // 255 codes of 8 bits and one of 9: a legal prefix code (the all-ones 8-bit word stays free),
  // whose 256th code stb_image 2.27 cannot look up in its 9-bit table.
  std::vector<unsigned char> counts(16, 0);
  counts[7] = 255;
  counts[8] = 1;
  const std::string msg = decode_error(with_extra_dht(good, counts));
  EXPECT_NE(msg.find("x.jpg has a JPEG Huffman table of 256 codes none longer than 9 bits"),
            std::string::npos) << msg;
  // 255 codes, or a 256th code of 10 bits, are fine, and the unused table changes no pixel.
  counts[8] = 0;
  EXPECT_EQ(decode(with_extra_dht(good, counts), 3, 8, 8), decode(good, 3, 8, 8));
  counts[9] = 1;
  EXPECT_EQ(decode(with_extra_dht(good, counts), 3, 8, 8), decode(good, 3, 8, 8));
}

}  // namespace
}  // namespace kiln
