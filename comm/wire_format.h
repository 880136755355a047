// wire_format.h: the element type DataParallel's gradients travel in (gradient compression).
//
//   Uncompressed  the gradients' own type, f32 or f64: the average is exact to the last bits
//   F16           IEEE binary16, half the bytes of f32: 11 bits of precision, but a gradient
//                 above 65504 becomes inf and one below 6e-8 becomes 0
//   BF16          bfloat16, half the bytes of f32: f32's range (no overflow on large gradients,
//                 no extra underflow) with 8 bits of precision
//
// A compressed gradient is rounded to the wire format once per rank (engine/host_device.h's
// rule, the same as Tensor::to(DType::F16 / BF16): nearest even, subnormals kept, NaN kept), the
// reduction adds two wire values in f32 and rounds the sum back (comm/reduce_kernels.h), and the
// receiver widens the sum exactly and divides by N in f32. Relative error per rounding: 2^-11
// (f16), 2^-8 (bf16).
#pragma once

#include <cstdint>
#include <string>

#include "comm/transport.h"
#include "engine/dtype.h"

namespace kiln::comm {

enum class WireFormat : uint8_t { Uncompressed, F16, BF16 };
const char* wire_format_name(WireFormat w);  // "uncompressed" | "f16" | "bf16"

// The dtype of the buffer that travels for gradients of dtype `grad` (grad itself when
// uncompressed).
DType wire_dtype(WireFormat w, DType grad);

// The transport element type of a tensor dtype: f32, f64, f16 or bf16 (others: an Error).
ElemType elem_type_of(DType t);

}  // namespace kiln::comm
