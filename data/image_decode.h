// image_decode.h: one PNG or JPEG file's bytes -> float32 CHW pixels in [0, 1], for ImageFolder.
//
// stb_image (https://github.com/nothings/stb, stb_image.h) says of itself that it is not meant
// for untrusted input and advises checking an image's dimensions with stbi_info before
// decoding it: a few header bytes can announce a 65535 x 65535 image, and decoding allocates
// width * height * channels bytes for it. So every decode here first
//   1. refuses content that is neither PNG (signature 89 'P' 'N' 'G' 0D 0A 1A 0A) nor JPEG
//      (starts FF D8 FF): stb also reads BMP, GIF, PSD, PIC, PNM, HDR and TGA, and ImageFolder
//      promises only the two, so the other decoders are never reached;
//   2. refuses what stb_image 2.27 (Debian 12's) would mishandle: in a JPEG, a Huffman table
//      of more than 256 codes, a scan using a table no segment defined, a table of 256 short
//      codes (data/jpeg_check.h says why each one matters); in a PNG, a chunk declaring more
//      data than the file holds, for which stb would first allocate the declared size, up to
//      2 GiB, and, just before decoding, data inflating to more than the header's image
//      needs (data/png_check.h);
//   3. reads the header (stbi_info_from_memory) and refuses an image of more than max_pixels
//      pixels (width x height) before any pixel is decoded.
// Every refusal is a kiln::Error of kind Input naming the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln {

// Default pixel budget: 8192 x 8192 (64 Mi pixels: 256 MB decoded as RGBA uint8).
constexpr int64_t kImageMaxPixels = int64_t{1} << 26;

struct ImageHeader {
  int width = 0, height = 0;
  int channels = 0;  // in the file: 1 grey, 2 grey + alpha, 3 RGB, 4 RGBA
};

// Checks the format, the JPEG tables or PNG chunks, and the budget (steps 1 to 3 above) and returns the
// header. `name` (the file's path) is for messages.
ImageHeader read_image_header(const unsigned char* bytes, size_t size, const std::string& name,
                              int64_t max_pixels = kImageMaxPixels);

// Decodes into out[channels * height * width] (CHW, pixel / 255, like torchvision's ToTensor):
// stb converts to `channels` (1 or 3; grey <-> RGB, alpha dropped), and an image of another
// size is resized to height x width in uint8 first (stb_image_resize, as PIL's resize before
// ToTensor). Checks the header first (read_image_header).
void decode_image_chw(const unsigned char* bytes, size_t size, const std::string& name,
                      int channels, int height, int width, float* out,
                      int64_t max_pixels = kImageMaxPixels);

}  // namespace kiln
