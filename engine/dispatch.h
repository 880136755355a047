// dispatch.h: small helpers shared by the op files (not part of the public API).
#pragma once

#include "engine/error.h"
#include "engine/tensor.h"

namespace kiln {

// What an op says on a CUDA tensor until the CUDA backend is built in.
[[noreturn]] inline void no_cuda_backend(const char* op) {
  throw Error(std::string(op) + ": this build of Kiln has no CUDA backend; use --device cpu");
}

// (outer, len, inner) view of `shape` around dim d: the layout every dim-wise kernel uses.
struct DimSplit {
  int64_t outer = 1, len = 1, inner = 1;
};
inline DimSplit split_at(const Shape& shape, int64_t d) {
  DimSplit s;
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
    if (i < d) s.outer *= shape[static_cast<size_t>(i)];
    else if (i == d) s.len = shape[static_cast<size_t>(i)];
    else s.inner *= shape[static_cast<size_t>(i)];
  }
  return s;
}

}  // namespace kiln
