// low_precision_bits.h: bf16 / f16 bit patterns for the tests of the 16-bit kernels: one value
// each way (the rules of engine/host_device.h), and random operands already rounded.
#pragma once

#include <cmath>
#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/dtype.h"
#include "engine/host_device.h"

namespace kiln::testing {

inline uint16_t to_bits(DType t, float v) {
  return t == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
}
inline double from_bits(DType t, uint16_t b) {
  return t == DType::BF16 ? bf16_to_f32(b) : f16_to_f32(b);
}

// n values uniform in [-1, 1), rounded to `t`.
inline std::vector<uint16_t> random_bits(DType t, int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (uint16_t& x : v) x = to_bits(t, dist(gen));
  return v;
}

// The spacing of `t`'s values at magnitude |v| (one ulp): 2^(e - 7) for bf16 and 2^(e - 10) for
// f16, e = floor(log2 |v|), never below the format's subnormal spacing (bf16 2^-133, f16 2^-24).
inline double ulp_of(DType t, double v) {
  const int mantissa_bits = t == DType::BF16 ? 7 : 10;
  const int min_exponent = t == DType::BF16 ? -126 : -14;
  const double a = std::fabs(v);
  const int e = a > 0 ? std::max(static_cast<int>(std::floor(std::log2(a))), min_exponent)
                      : min_exponent;
  return std::ldexp(1.0, e - mantissa_bits);
}

}  // namespace kiln::testing
