// jpeg_check.h: the checks Kiln makes on a JPEG's tables before stb_image decodes it.
//
// stb_image 2.27 (Debian 12's libstb) trusts a JPEG's table segments more than a file from an
// untrusted folder deserves. Three holes, each found by tests/fuzz/image_decode:
//   1. a Huffman table (DHT) declaring more than 256 codes makes stbi__build_huffman write past
//      its 257-entry size table, and the values that follow are read past the 256-entry value
//      table (stb_image 2.28 refuses it: "bad DHT header");
//   2. a scan (SOS) may name a Huffman table that no DHT segment defined: stb allocates its
//      decoder state with malloc and never clears it, so it then decodes with whatever the heap
//      held. The result depends on earlier allocations (the input alone does not reproduce it),
//      and ends in wrong pixels or in the assertion of stbi__jpeg_huff_decode, which aborts the
//      process. The same goes for a quantization table (DQT) that was never defined: pixels
//      from stale heap memory;
//   3. a defined table of 256 codes, none longer than 9 bits: stb's 9-bit lookup table marks
//      "no short code here" with the value 255, which is also the index of the 256th code, so
//      that code is decoded through the slow path, which lands on a neighbouring symbol, and the
//      same assertion aborts the process.
// check_jpeg_tables walks the file's segments as stb reads them and refuses all three, so stb
// only ever decodes a file whose tables are complete and in range. The rules are those of the
// JPEG standard (ITU-T T.81, https://www.w3.org/Graphics/JPEG/itu-t81.pdf, B.2.4: a table must
// be defined before the first scan that uses it) except the third, which refuses a legal but
// rare table (real encoders' tables have at most 162 codes) that this stb cannot decode.
#pragma once

#include <cstddef>
#include <string>

namespace kiln::detail {

// Throws a kiln::Error of kind Input naming `name` (the file, for messages) when one of the
// tables above is found. Reads at most `size` bytes of `bytes` (which start FF D8).
void check_jpeg_tables(const unsigned char* bytes, size_t size, const std::string& name);

// Hole 3: whether stb_image 2.27 misreads a Huffman table with these code counts (counts[i]
// codes of i + 1 bits). tests/data/stb_huffman_test.cpp holds the rule against stb's decoder.
bool stb_misreads_huffman_table(const unsigned counts[16]);

}  // namespace kiln::detail
