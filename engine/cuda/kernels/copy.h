// copy.h: fill and dtype conversion of device buffers, so Tensor::fill_, to(dtype) and copy_
// with conversion run on the GPU without a round trip through the host (engine/cuda/tensor_copy.cpp
// uses them). Pointers are device memory of the current device; the work is queued on
// cuda::current_stream() and the call returns at once. Definitions: copy.cu.
#pragma once

#include <cstdint>

#include "engine/dtype.h"

namespace kiln::cuda {

// data[0..n) = value converted to `dtype` (static_cast, as Tensor::fill_ on the CPU).
void fill(void* data, DType dtype, int64_t n, double value);

// dst[i] = static_cast<dst_type>(src[i]) for i in [0, n): any pair of F32 F64 I32 I64 U8, each
// element converted exactly as the CPU converts it. As on the CPU, a value the destination
// cannot represent (a negative or > 255 value into U8, a NaN or huge float into an integer) has
// no defined result. Equal dtypes are a plain device-to-device copy.
void convert(const void* src, DType src_type, void* dst, DType dst_type, int64_t n);

}  // namespace kiln::cuda
