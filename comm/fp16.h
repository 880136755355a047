// fp16.h: IEEE 754 binary16 ("half") for DataParallel's f16 gradient compression.
//
// Gradients sent as f16 halve the bytes on the wire (DataParallel's --fp16-allreduce); the
// reductions add in f32 and round once per addition. The conversions themselves are the engine's
// (f32_to_f16 and f16_to_f32 in engine/host_device.h: round to nearest even, subnormals kept,
// overflow to infinity, NaN stays a quiet NaN), the same rule f16 tensors use, on every device.
#pragma once

#include <cstdint>

#include "engine/host_device.h"

namespace kiln::comm {

using kiln::f16_to_f32;
using kiln::f32_bits;
using kiln::f32_from_bits;
using kiln::f32_to_f16;

// a + b in f32, rounded back to half: how f16 buffers are reduced on both devices.
KILN_HOST_DEVICE inline uint16_t f16_add(uint16_t a, uint16_t b) {
  return f32_to_f16(f16_to_f32(a) + f16_to_f32(b));
}

}  // namespace kiln::comm
