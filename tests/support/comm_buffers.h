// comm_buffers.h: a comm::Buffer over a host vector of floats, for the tests of comm/.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/transport.h"

namespace kiln::testing {

inline comm::Buffer f32_buffer(std::vector<float>& v) {
  comm::Buffer b;
  b.data = v.data();
  b.count = static_cast<int64_t>(v.size());
  b.type = comm::ElemType::F32;
  return b;
}

}  // namespace kiln::testing
