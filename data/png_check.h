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
// png_checked_for_stb inflates the data once into a buffer of exactly the size the header
// implies, refusing a stream that does not fit (stb's own inflater, stbi_zlib_decode_buffer,
// which does not grow its buffer), and hands stb that data stored, so nothing is inflated
// twice.
//
// stb_image checks no checksum either, so a damaged file decodes into damaged pixels that
// train silently. check_png_chunks verifies every chunk's CRC-32 (PNG 5.3) and
// png_checked_for_stb the zlib stream's Adler-32 (RFC 1950 2.2, https://www.rfc-editor.org/rfc/rfc1950)
// over the data it inflates; a mismatch is an Input error naming the file and the chunk. PNG
// layout: https://www.w3.org/TR/png/ (chunks and their CRC: 5.3; the filtered, interlaced
// image data's size: 7.2, 8.2).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::detail {

// Throws a kiln::Error of kind Input naming `name` (the file, for messages) when a chunk up to
// the IEND chunk declares more data than the file holds, the file ends inside its CRC, or its
// CRC does not match its type and data ("the CRC of chunk IDAT does not match its data: the
// file is damaged"). `bytes` start with the PNG signature. Reads each chunk once (a table-driven
// CRC-32): run before stbi_info.
void check_png_chunks(const unsigned char* bytes, size_t size, const std::string& name);

// The bytes the header's image takes once inflated: one filter byte per row and the packed
// samples, per Adam7 pass when interlaced. 0 when the header is not one stb decodes.
int64_t png_inflated_size(uint32_t width, uint32_t height, int bit_depth, int color_type,
                          bool interlaced);

// Inflates the concatenated IDAT data once, into a buffer of exactly png_inflated_size of the
// header, and throws a kiln::Error of kind Input naming `name` when the stream does not fit (a
// damaged or malicious stream) or when it fits but its Adler-32 trailer does not match the
// inflated data. Returns the PNG to give stb instead of `bytes`: the same chunks with that
// inflated data stored uncompressed, so that stb's own inflate is a copy and the check costs
// about nothing. Returns an empty vector when `bytes` should go to stb as they are: a file
// without an IEND chunk, or a stream that fails for another reason or comes out short (stb then
// refuses each with its own reason). Run just before decoding, after check_png_chunks and the
// pixel budget.
std::vector<unsigned char> png_checked_for_stb(const unsigned char* bytes, size_t size,
                                               const std::string& name);

}  // namespace kiln::detail
