// image_bytes.h: what the image-check tests share: encoded files as bytes, written by
// stb_image_write into memory, and the message of the Input error a call throws.
#pragma once

#include <gtest/gtest.h>

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
