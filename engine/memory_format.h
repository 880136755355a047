// memory_format.h: moving tensors between memory formats (MemoryFormat, engine/tensor.h).
//
// Tensor::to(MemoryFormat) is the way in and out of channels-last; this header has what the
// layers with channels-last kernels need besides, and the counter that tells a test how many
// reorderings a training step made (a whole network in channels-last makes none between its
// layers: tests/layers/channels_last_test.cpp).
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace kiln {

// x's bytes read as a tensor of `shape` in `format`, without copying: a differentiable view
// (the gradient is brought into x's format and shape the same way). The caller guarantees that
// the bytes mean what the new shape and format say: e.g. a channels-last (N, C, H, W) tensor
// is, byte for byte, a contiguous (N * H * W, C) matrix.
Tensor reinterpret_view(const Tensor& x, const Shape& shape, MemoryFormat format);

// x relabelled as `format` where both orders are the same bytes (a 4-D tensor with C == 1 or
// H * W == 1); no copy.
Tensor relabel_memory_format(const Tensor& x, MemoryFormat format);

// True when x's two orders are the same bytes (C == 1 or H * W == 1 of a 4-D tensor).
bool formats_coincide(const Tensor& x);

// Reordering copies made so far by Tensor::to(MemoryFormat) in this process, on every device
// and thread (relabels, which copy nothing, are not counted).
int64_t memory_format_conversions();

}  // namespace kiln
