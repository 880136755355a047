// png_check.h: the checks Kiln makes on a PNG before stb_image decodes it.
//
// stb_image 2.27 (Debian 12's libstb) sizes its buffers from what a file declares, and grows
// them as the data asks, before it knows whether the file is sound:
//   1. the buffer for the compressed image data (the IDAT chunks) from the lengths the chunks
//      declare, before reading them: a 200-byte file whose IDAT chunk says 2^31 bytes makes it
//      allocate 2 GiB, and only then find the file too short (found by tests/fuzz/image_decode
//      as an allocation over its 2 GB limit);
//   2. the buffer for the inflated data, doubled for as long as the deflate stream produces
//      bytes: deflate expands at most about 1032 times, so a PNG of F bytes whose stream
//      inflates past what its header's image needs (a "decompression bomb") can make stb
//      allocate about 1000 F bytes, whatever the pixel budget.
// ImageFolder decodes on several loader threads at once, so a folder of such files could
// exhaust the machine's memory. check_png_chunks refuses a chunk whose data runs past the end of
// the file (stb's compressed buffer then stays under twice the file's size), and
// check_png_inflated_size inflates the data once into a buffer of exactly the size the header
// implies, refusing a stream that does not fit (stb's own inflater, stbi_zlib_decode_buffer,
// which does not grow its buffer). PNG layout: https://www.w3.org/TR/png/ (chunks: 5.3; the
// filtered, interlaced image data's size: 7.2, 8.2).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln::detail {

// Throws a kiln::Error of kind Input naming `name` (the file, for messages) when a chunk before
// the IEND chunk declares more data than the file holds. `bytes` start with the PNG signature.
// Cheap (reads the chunk headers only): run before stbi_info.
void check_png_chunks(const unsigned char* bytes, size_t size, const std::string& name);

// The bytes the header's image takes once inflated: one filter byte per row and the packed
// samples, per Adam7 pass when interlaced. 0 when the header is not one stb decodes.
int64_t png_inflated_size(uint32_t width, uint32_t height, int bit_depth, int color_type,
                          bool interlaced);

// Throws a kiln::Error of kind Input naming `name` when the concatenated IDAT data inflates to
// more than png_inflated_size of the header (a damaged or malicious stream). A stream that
// fails for another reason is left to stb, which then reports it. Costs one inflate: run just
// before decoding, after check_png_chunks and the pixel budget.
void check_png_inflated_size(const unsigned char* bytes, size_t size, const std::string& name);

}  // namespace kiln::detail
