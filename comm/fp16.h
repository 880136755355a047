// fp16.h: IEEE 754 binary16 ("half") <-> float, bit by bit, on the host and in CUDA kernels.
//
// A half has 1 sign bit, 5 exponent bits (bias 15) and 10 mantissa bits:
//   normal      (-1)^s * 1.m * 2^(e - 15)    e in [1, 30]: 6.1e-5 .. 65504, ~3 decimal digits
//   subnormal   (-1)^s * 0.m * 2^-14         e == 0: down to 2^-24 = 6.0e-8, with less precision
//   inf / NaN   e == 31 (m == 0: infinity; m != 0: NaN)
// Gradients sent as f16 halve the bytes on the wire (DataParallel's --fp16-allreduce); the
// reductions add in f32 and round once per addition.
//
// float -> half rounds to nearest, ties to even (what the hardware's cvt.rn.f16.f32 does): the
// 13 float mantissa bits that do not fit are the remainder; above half an ulp round up, below
// round down, exactly half round to the even neighbour. Values >= 65520 become infinity; NaN
// stays NaN (quiet, sign and the top payload bits kept). Both functions are pure integer code,
// so the CPU and every GPU give the same bits.
#pragma once

#include <cstdint>
#include <cstring>

#include "engine/host_device.h"

namespace kiln::comm {

KILN_HOST_DEVICE inline uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

KILN_HOST_DEVICE inline float f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

KILN_HOST_DEVICE inline uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    if (abs == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // quiet NaN
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (abs >= 0x38800000u) {  // >= 2^-14: a normal half
    // Re-bias the exponent (127 -> 15) and keep the top 10 mantissa bits...
    uint32_t h = (abs >> 13) - ((127u - 15u) << 10);
    // ...then round on the 13 bits dropped (0x1000 is exactly half an ulp).
    const uint32_t rem = abs & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent
    return static_cast<uint16_t>(sign | h);
  }
  if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25: rounds to (signed) 0
  // Subnormal half: value = q * 2^-24. The float is m * 2^(e - 150) with the implicit bit in
  // m (24 bits), so q = m * 2^(e - 126): shift right by 126 - e (14..24) and round.
  const uint32_t e = abs >> 23;
  const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (q & 1u))) ++q;  // 0x400 is the smallest normal: right
  return static_cast<uint16_t>(sign | q);
}

KILN_HOST_DEVICE inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 31) return f32_from_bits(sign | 0x7f800000u | (m << 13));  // inf, NaN
  if (e == 0) {
    if (m == 0) return f32_from_bits(sign);  // +-0
    // Subnormal: shift the mantissa up until its leading 1 becomes the implicit bit; every
    // shift lowers the exponent by one. 113 = 127 - 15 + 1.
    e = 113;
    while ((m & 0x400u) == 0) {
      m <<= 1;
      --e;
    }
    return f32_from_bits(sign | (e << 23) | ((m & 0x3ffu) << 13));
  }
  return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

// a + b in f32, rounded back to half: how f16 buffers are reduced on both devices.
KILN_HOST_DEVICE inline uint16_t f16_add(uint16_t a, uint16_t b) {
  return f32_to_f16(f16_to_f32(a) + f16_to_f32(b));
}

}  // namespace kiln::comm
