// dim_split.h: the (outer, len, inner) view of a shape around one dim, the layout every
// dim-wise kernel (sum, softmax, argmax) uses: element (o, i, j) is at (o * len + i) * inner + j.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/tensor.h"

namespace kiln {

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
