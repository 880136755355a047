// png_check.h: the check Kiln makes on a PNG's chunks before stb_image decodes it.
//
// stb_image 2.27 (Debian 12's libstb) sizes its buffer for the compressed image data (the IDAT
// chunks) from the lengths the chunks declare, before reading them: a 200-byte file whose IDAT
// chunk says 2^31 bytes makes it allocate 2 GiB, and only then find the file too short (found
// by tests/fuzz/image_decode as an allocation over its 2 GB limit). ImageFolder decodes on
// several loader threads at once, so a folder of such files could exhaust the machine's memory.
// check_png_chunks walks the chunk headers (PNG specification, chunk layout:
// https://www.w3.org/TR/png/#5Chunk-layout) and refuses a chunk whose data runs past the end of
// the file, which stb would refuse anyway, after the allocation; so stb's buffer never grows
// past twice the file's size.
#pragma once

#include <cstddef>
#include <string>

namespace kiln::detail {

// Throws a kiln::Error of kind Input naming `name` (the file, for messages) when a chunk before
// the IEND chunk declares more data than the file holds. `bytes` start with the PNG signature.
void check_png_chunks(const unsigned char* bytes, size_t size, const std::string& name);

}  // namespace kiln::detail
