// sim/fp16.h: __half and __nv_bfloat16, the CUDA simulator's stand-in for the part of
// <cuda_fp16.h> and <cuda_bf16.h> that Kiln's kernels use (included by sim/mma.h).
// Follows the CUDA Math API's "Half Precision" and "Bfloat16 Precision" intrinsics
// (https://docs.nvidia.com/cuda/cuda-math-api/).
//
// Both are 16 raw bits, as in CUDA (a struct whose one member is an unsigned short, so the
// size, alignment and bit layout match and device buffers of uint16_t bit patterns can be read
// as either). Conversions follow engine/host_device.h, the rules every Kiln device shares:
// to nearest, ties to even, subnormals kept, NaN quiet (CUDA's __float2half / __float2bfloat16
// round the same way). No arithmetic operators: kernels widen to float, as the tensor cores'
// f32 accumulation does.
#pragma once

#include <cstdint>

#include "engine/host_device.h"

struct __half {
  unsigned short __x;
};
struct __nv_bfloat16 {
  unsigned short __x;
};
static_assert(sizeof(__half) == 2 && alignof(__half) == 2, "__half is 16 bits, as in CUDA");
static_assert(sizeof(__nv_bfloat16) == 2 && alignof(__nv_bfloat16) == 2,
              "__nv_bfloat16 is 16 bits, as in CUDA");

inline __half __float2half(float f) { return __half{kiln::f32_to_f16(f)}; }
inline __half __float2half_rn(float f) { return __half{kiln::f32_to_f16(f)}; }
inline float __half2float(__half h) { return kiln::f16_to_f32(h.__x); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16{kiln::f32_to_bf16(f)}; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{kiln::f32_to_bf16(f)}; }
inline float __bfloat162float(__nv_bfloat16 b) { return kiln::bf16_to_f32(b.__x); }

// The raw bits, both ways.
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short bits) { return __half{bits}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) { return __nv_bfloat16{bits}; }
