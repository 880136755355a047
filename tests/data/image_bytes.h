// image_bytes.h: what the image-check tests share: encoded files as bytes, written by
// stb_image_write into memory, and the message of the Input error a call throws.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/error.h"

namespace kiln::test {

using Bytes = std::vector<unsigned char>;

// An stb_image_write callback (stbi_write_*_to_func) appending to the Bytes at `ctx`.
inline void append_to_bytes(void* ctx, void* data, int size) {
  auto* out = static_cast<Bytes*>(ctx);
  const auto* p = static_cast<const unsigned char*>(data);
  out->insert(out->end(), p, p + size);
}

// PNG's CRC-32 (ISO 3309, PNG 5.3), bit by bit: independent of the table-driven one under test.
inline uint32_t png_crc32(const unsigned char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return c ^ 0xFFFFFFFFu;
}

// Rewrites the CRC of every chunk of `png` up to IEND to match its type and data: a test that
// damages a chunk on purpose, to reach a check behind the CRCs (a bad zlib header, data that
// inflates too far), fixes them afterwards, as a damaged file with recomputed CRCs would be.
inline void fix_png_crcs(Bytes& png) {
  size_t pos = 8;
  while (pos + 12 <= png.size()) {
    const size_t length = (size_t{png[pos]} << 24) | (size_t{png[pos + 1]} << 16) |
                          (size_t{png[pos + 2]} << 8) | size_t{png[pos + 3]};
    if (length > png.size() - pos - 12) return;
    const uint32_t crc = png_crc32(png.data() + pos + 4, 4 + length);
    for (int i = 0; i < 4; ++i) {
      png[pos + 8 + length + static_cast<size_t>(i)] = static_cast<unsigned char>(crc >> (24 - 8 * i));
    }
    if (png[pos + 4] == 'I' && png[pos + 5] == 'E' && png[pos + 6] == 'N' && png[pos + 7] == 'D') return;
    pos += 12 + length;
  }
}

// The message of the kiln::Error `f` throws, which must be of kind Input; "(no error)" if none.
inline std::string input_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input) << e.what();
    return e.what();
  }
  return "(no error)";
}

}  // namespace kiln::test
