// copy.h: fill and dtype conversion of device buffers, so Tensor::fill_, to(dtype) and copy_
// with conversion run on the GPU without a round trip through the host (engine/cuda/tensor_copy.cpp
// uses them). Pointers are device memory of the current device; the work is queued on
// cuda::current_stream() and the call returns at once. Definitions: copy.cu.
#pragma once

#include <cstdint>

#include "engine/dtype.h"

namespace kiln::cuda {

// data[0..n) = value converted to `dtype` (convert_elem, as Tensor::fill_ on the CPU).
void fill(void* data, DType dtype, int64_t n, double value);

// dst[i] = convert_elem<dst_type>(src[i]) for i in [0, n): any pair of dtypes (F16 and BF16
// included), each element converted exactly as the CPU converts it (engine/host_device.h). As on the CPU, a value the destination
// cannot represent (a negative or > 255 value into U8, a NaN or huge float into an integer) has
// no defined result. Equal dtypes are a plain device-to-device copy.
void convert(const void* src, DType src_type, void* dst, DType dst_type, int64_t n);

// One u64 in device memory, exact for every value (fill() goes through a double): set to
// `value`, or advanced by `n` on the device, which is how a CUDA graph moves a counter from one
// replay to the next (engine/step_graph.cpp: dropout's random-number offset). One thread.
void set_counter(uint64_t* counter, uint64_t value);
void advance_counter(uint64_t* counter, uint64_t n);

}  // namespace kiln::cuda
