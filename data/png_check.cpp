// png_check.cpp: walks a PNG's chunks and refuses one whose declared length runs past the end of
// the file (png_check.h says why).
#include "data/png_check.h"

#include <cstdint>

#include "engine/error.h"

namespace kiln::detail {

namespace {

// A chunk type for a message: its four letters, or its bytes in hex when they are not letters
// (a damaged header).
std::string chunk_type(const unsigned char* t) {
  bool letters = true;
  for (int i = 0; i < 4; ++i) {
    letters = letters && ((t[i] >= 'A' && t[i] <= 'Z') || (t[i] >= 'a' && t[i] <= 'z'));
  }
  if (letters) return std::string(reinterpret_cast<const char*>(t), 4);
  static const char hex[] = "0123456789abcdef";
  std::string s = "0x";
  for (int i = 0; i < 4; ++i) {
    s += hex[t[i] >> 4];
    s += hex[t[i] & 15];
  }
  return s;
}

}  // namespace

void check_png_chunks(const unsigned char* b, size_t n, const std::string& name) {
  // A chunk: 4-byte big-endian data length, 4-byte type, the data, 4-byte CRC.
  size_t pos = 8;  // after the signature
  while (pos + 8 <= n) {
    const uint32_t length = (uint32_t{b[pos]} << 24) | (uint32_t{b[pos + 1]} << 16) |
                            (uint32_t{b[pos + 2]} << 8) | uint32_t{b[pos + 3]};
    const std::string type = chunk_type(b + pos + 4);
    const size_t left = n - (pos + 8);
    if (length > left) {
      throw Error(str("ImageFolder: ", name, " is a corrupt PNG: its ", type, " chunk at byte ",
                      pos, " declares ", length, " bytes of data, but only ", left,
                      " bytes follow in the file (truncated or damaged)"),
                  ErrorKind::Input);
    }
    if (type == "IEND") return;
    pos += 12 + size_t{length};
  }
}

}  // namespace kiln::detail
