// host_device.h: KILN_HOST_DEVICE, and the engine's own element rules that its CPU and CUDA
// kernels share: random draws, loss scaling, the 16-bit float formats and dtype conversion.
//
// A function marked KILN_HOST_DEVICE compiles for the host and, under nvcc, for the GPU too
// (under the simulator and in plain C++ builds the mark is empty). A rule written once is the
// same rule on every device: a CPU kernel and its CUDA twin both call it instead of each
// retyping it, so they cannot drift apart. A layer's rules live in that layer's own
// *_kernels.h (layers/leaky_relu_kernels.h, layers/pool2d_kernels.h, layers/dropout_kernels.h),
// beside the kernels that apply them.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif

namespace kiln {

// ---- Random draws --------------------------------------------------------------------------

// Uniform float in [0, 1) from the top 24 of 32 random bits (exact in float: same everywhere).
KILN_HOST_DEVICE inline float uniform01(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

// ---- Loss scaling (engine/optim/grad_scaler.h) -----------------------------------------------

// Whether x is inf or NaN: its exponent bits are all ones. Integer code, so the CPU loop
// vectorises and no floating-point compiler flag can fold the test away.
KILN_HOST_DEVICE inline bool is_nonfinite(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return (u & 0x7f800000u) == 0x7f800000u;
}
KILN_HOST_DEVICE inline bool is_nonfinite(double x) {
  uint64_t u;
  memcpy(&u, &x, sizeof u);
  return (u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
}

// One gradient element unscaled in place, g = g / scale (correctly rounded: exact for a
// power-of-two scale unless the result is subnormal), and whether the RESULT is inf or NaN.
// Testing the result, not the input, also catches a finite gradient that a scale below 1
// pushed past the largest finite value: the optimizer must never see an infinity.
template <typename T>
KILN_HOST_DEVICE inline bool unscale_elem(T& g, T scale) {
  g = g / scale;
  return is_nonfinite(g);
}

// ---- Low-precision floats: f16 (IEEE binary16) and bf16 (bfloat16) ------------------------------
//
//            sign  exponent  mantissa   largest finite   smallest normal   smallest subnormal
//   f32        1      8         23        3.4e38            1.2e-38           1.4e-45
//   f16        1      5         10        65504             6.1e-5            6.0e-8
//   bf16       1      8          7        3.4e38            1.2e-38           9.2e-41
//
// bf16 is the top half of an f32: the same range, 8 bits of precision instead of 24. f16 keeps
// 11 bits of precision but only 5 exponent bits. (docs/mixed_precision.md draws the layouts.)
//
// Storage types. A tensor element of dtype F16 is a Half, of BF16 a BFloat16: a struct around
// the 16 raw bits, with no arithmetic and no implicit conversions. Two distinct types are needed
// because both formats are 16 bits (dtype_of<T> must tell them apart), and a struct, rather than
// a plain uint16_t, keeps a half from being mistaken for an integer by an overload or a
// static_cast. Every conversion goes through the named functions below.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

// The bits of a float and back (memcpy is the defined way to reinterpret; it compiles to a move).
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

// The rules, for every conversion:
//   - narrowing rounds to nearest, ties to even (IEEE 754's default, and what cvt.rn on a GPU
//     and the x86 conversion instructions do);
//   - a finite value beyond the largest finite rounds to infinity when it is at or past the
//     halfway point to the next (absent) power of two: f16 65520 and up becomes inf;
//   - subnormals are kept in both directions (no flush to zero);
//   - NaN stays NaN, quiet (the top mantissa bit set), with its sign and the top payload bits;
//   - +-0 and +-inf keep their sign.
// All of it is integer code, so every device gives the same bits.

// f32 -> f16. The 13 float mantissa bits that do not fit are the remainder: above half an ulp
// round up, below round down, exactly half round to the even neighbour.
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
  if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to (signed) 0
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

// f16 -> f32: exact (every half is a float); a NaN comes back quiet.
KILN_HOST_DEVICE inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 31) {
    if (m == 0) return f32_from_bits(sign | 0x7f800000u);     // inf
    return f32_from_bits(sign | 0x7fc00000u | (m << 13));      // NaN, quiet
  }
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

// f32 -> bf16: keep the top 16 bits, rounding on the 16 dropped. Adding 0x7fff (just under half
// an ulp) plus the lowest kept bit carries into the kept bits exactly when the rest is above
// half, or exactly half with an odd kept part: round to nearest even in one add. The carry runs
// into the exponent where it must (1.99.. -> 2) and turns the largest floats into infinity.
// Subnormal floats round the same way (bf16 has the same exponent range). NaN is kept apart:
// the add could carry a NaN into infinity.
KILN_HOST_DEVICE inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// bf16 -> f32: exact, the bits shifted into the top half; a NaN comes back quiet.
KILN_HOST_DEVICE inline float bf16_to_f32(uint16_t b) {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  if ((x & 0x7fffffffu) > 0x7f800000u) x |= 0x00400000u;
  return f32_from_bits(x);
}

// f64 -> f32 rounded to odd: truncate toward zero, and set the last bit when anything was
// dropped. Rounding that to f16 or bf16 (nearest even) then gives the same bits as rounding the
// double directly, because the f32 keeps at least two bits beyond the narrow format's precision
// (Boldo and Melquiond, "When double rounding is odd", 2005). Plain f64 -> f32 -> f16, both to
// nearest, can round twice the wrong way: 1 + 2^-11 + 2^-40 becomes the f32 tie 1 + 2^-11,
// then 1.0, where the nearest half is 1 + 2^-10.
KILN_HOST_DEVICE inline float f64_to_f32_round_odd(double d) {
  if (d != d) return static_cast<float>(d);  // NaN
  const float f = static_cast<float>(d);     // to nearest
  const double back = static_cast<double>(f);
  if (back == d) return f;  // exact (also +-0, +-inf)
  uint32_t x = f32_bits(f);
  // Rounded away from zero (larger magnitude, or to infinity): step back one ulp toward zero.
  if ((back > d) == (d > 0)) --x;
  return f32_from_bits(x | 1u);  // inexact: odd
}

KILN_HOST_DEVICE inline uint16_t f64_to_f16(double d) { return f32_to_f16(f64_to_f32_round_odd(d)); }
KILN_HOST_DEVICE inline uint16_t f64_to_bf16(double d) {
  return f32_to_bf16(f64_to_f32_round_odd(d));
}

// Whether T is one of the 16-bit storage types.
template <typename T>
inline constexpr bool is_low_precision_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

KILN_HOST_DEVICE inline float widen(Half h) { return f16_to_f32(h.bits); }
KILN_HOST_DEVICE inline float widen(BFloat16 b) { return bf16_to_f32(b.bits); }

// float or double -> Half / BFloat16 (nearest even, as above).
template <typename T>
KILN_HOST_DEVICE inline T narrow(float f) {
  if constexpr (std::is_same_v<T, Half>) return Half{f32_to_f16(f)};
  else return BFloat16{f32_to_bf16(f)};
}
template <typename T>
KILN_HOST_DEVICE inline T narrow(double d) {
  if constexpr (std::is_same_v<T, Half>) return Half{f64_to_f16(d)};
  else return BFloat16{f64_to_bf16(d)};
}

// One element of dtype conversion, the rule of Tensor::to(DType) and copy_ on every device:
// static_cast between the built-in types (rounding to nearest where it rounds, truncating toward
// zero from float to integer); the rules above into and out of f16 and bf16. A low-precision
// value widens exactly to float first; an integer or double goes to a 16-bit float through
// double (exact for every integer up to 2^53) and one correct rounding.
template <typename Dst, typename Src>
KILN_HOST_DEVICE inline Dst convert_elem(Src v) {
  if constexpr (std::is_same_v<Src, Dst>) {
    return v;
  } else if constexpr (is_low_precision_v<Src>) {
    if constexpr (is_low_precision_v<Dst>) return narrow<Dst>(widen(v));  // f16 <-> bf16
    else return static_cast<Dst>(widen(v));
  } else if constexpr (is_low_precision_v<Dst>) {
    if constexpr (std::is_same_v<Src, float>) return narrow<Dst>(v);
    else return narrow<Dst>(static_cast<double>(v));
  } else {
    return static_cast<Dst>(v);
  }
}

}  // namespace kiln
