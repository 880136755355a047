// stb_huffman_test.cpp: holds Kiln's rule for the Huffman tables stb_image 2.27 misreads
// (detail::stb_misreads_huffman_table, data/jpeg_check.h) against stb's own decoder. This file
// compiles stb_image's JPEG decoder privately (STB_IMAGE_STATIC) with an STBI_ASSERT that
// records instead of aborting, builds tables with stbi__build_huffman and decodes each code of
// each table with stbi__jpeg_huff_decode: the assertion must fire for exactly the tables the
// rule names, and every code must decode to its own symbol in every other table. Should Debian
// ship an stb_image that decodes those tables correctly, this test says so, and the refusal
// can go.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {
bool stb_assertion_failed = false;
}  // namespace

#define STBI_ASSERT(x)                        \
  do {                                        \
    if (!(x)) stb_assertion_failed = true;    \
  } while (0)
#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_JPEG
#define STBI_NO_STDIO
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wconversion"
#endif
#include "stb_image.h"
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#include "data/jpeg_check.h"

namespace kiln {
namespace {

// How stb decodes a table of these code counts: `built` false when stb refuses the table,
// `misread` when some code decodes to another symbol or trips stb's assertion.
struct Outcome {
  bool built = false;
  bool misread = false;
};

Outcome decode_every_code(const unsigned counts[16]) {
  static stbi__huffman table;  // large: not on the stack
  static stbi__jpeg decoder;
  std::memset(&table, 0, sizeof table);
  int stb_counts[16];
  for (int i = 0; i < 16; ++i) stb_counts[i] = static_cast<int>(counts[i]);
  Outcome outcome;
  if (!stbi__build_huffman(&table, stb_counts)) return outcome;
  outcome.built = true;
  int codes = 0;
  for (int i = 0; i < 16; ++i) codes += stb_counts[i];
  for (int i = 0; i < 256; ++i) table.values[i] = static_cast<stbi_uc>(i);
  static const unsigned char no_more_bytes[1] = {0};
  stbi__context source;
  stbi__start_mem(&source, no_more_bytes, 1);
  for (int symbol = 0; symbol < codes; ++symbol) {
    const int bits = table.size[symbol];
    // The code, left-aligned in the 32-bit bit buffer, followed by all zeros or all ones.
    for (const unsigned tail : {0u, 0xFFFFFFFFu}) {
      std::memset(&decoder, 0, sizeof decoder);
      decoder.s = &source;
      decoder.code_buffer = (static_cast<unsigned>(table.code[symbol]) << (32 - bits)) |
                            (tail >> bits);
      decoder.code_bits = 32;
      stb_assertion_failed = false;
      const int decoded = stbi__jpeg_huff_decode(&decoder, &table);
      if (stb_assertion_failed || decoded != symbol) outcome.misread = true;
    }
  }
  return outcome;
}

// A random prefix code: leaves of a binary tree grown by splitting random leaves (at most
// `max_bits` deep), some dropped so that incomplete codes come too; at most 256 codes.
void random_counts(std::mt19937& rng, unsigned counts[16]) {
  std::vector<int> depth = {0};
  const size_t target = 1 + rng() % 256;
  const int max_bits = 1 + static_cast<int>(rng() % 16);
  while (depth.size() < target) {
    std::vector<size_t> splittable;
    for (size_t i = 0; i < depth.size(); ++i) {
      if (depth[i] < max_bits) splittable.push_back(i);
    }
    if (splittable.empty()) break;
    const size_t i = splittable[rng() % splittable.size()];
    ++depth[i];
    depth.push_back(depth[i]);
  }
  const size_t dropped = rng() % 3 == 0 ? rng() % depth.size() : 0;
  std::memset(counts, 0, 16 * sizeof(unsigned));
  for (size_t i = dropped; i < depth.size(); ++i) {
    if (depth[i] >= 1) ++counts[depth[i] - 1];
  }
}

TEST(StbHuffman, KilnRefusesExactlyTheTablesStbMisreads) {
  // The tables the rule names, next to ones one code away from it.
  std::vector<std::vector<unsigned>> tables = {
      {0, 0, 0, 0, 0, 0, 0, 255, 1, 0, 0, 0, 0, 0, 0, 0},  // 256 codes, 9 bits at most: misread
      {0, 0, 0, 0, 0, 0, 0, 254, 2, 0, 0, 0, 0, 0, 0, 0},  // the same
      {0, 0, 0, 0, 0, 0, 0, 255, 0, 1, 0, 0, 0, 0, 0, 0},  // 256th code of 10 bits: fine
      {0, 0, 0, 0, 0, 0, 0, 255, 0, 0, 0, 0, 0, 0, 0, 0},  // 255 codes: fine
      {0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0},    // a usual DC table: fine
      {0, 2, 1, 3, 3, 2, 4, 3, 5, 5, 4, 4, 0, 0, 1, 125},  // the standard's luminance AC table
  };
  std::mt19937 rng(7);
  int built = 0, misread = 0;
  for (int t = 0; t < 3000; ++t) {
    unsigned counts[16];
    if (t < static_cast<int>(tables.size())) {
      std::copy(tables[t].begin(), tables[t].end(), counts);
    } else {
      random_counts(rng, counts);
    }
    const Outcome outcome = decode_every_code(counts);
    if (!outcome.built) continue;
    ++built;
    misread += outcome.misread;
    std::string text;
    for (unsigned c : counts) text += std::to_string(c) + " ";
    EXPECT_EQ(outcome.misread, detail::stb_misreads_huffman_table(counts))
        << "code counts by length: " << text;
  }
  EXPECT_GE(built, 2500);
  EXPECT_GE(misread, 2);
}

}  // namespace
}  // namespace kiln
