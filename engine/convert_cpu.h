// convert_cpu.h: dtype conversion of host buffers (Tensor::to(DType), copy_, to_vector).
//
// Every element follows convert_elem (engine/host_device.h), the rule the CUDA conversion
// kernels use too. The f32 <-> f16 and f32 <-> bf16 loops have vector paths (AVX-512 / F16C,
// chosen at compile time by -march) that give the same bits as that scalar rule, which
// tests/engine/low_precision_test.cpp checks over every half and millions of floats.
#pragma once

#include <cstdint>

#include "engine/dtype.h"

namespace kiln::cpu {

// dst[i] = src[i] converted from `src_type` to `dst_type`, i in [0, n). Equal dtypes: memcpy.
void convert(const void* src, DType src_type, void* dst, DType dst_type, int64_t n);

// The vectorised loops convert() uses for these pairs.
void convert_f32_to_f16(const float* src, Half* dst, int64_t n);
void convert_f16_to_f32(const Half* src, float* dst, int64_t n);
void convert_f32_to_bf16(const float* src, BFloat16* dst, int64_t n);
void convert_bf16_to_f32(const BFloat16* src, float* dst, int64_t n);
// The same loops on the calling thread alone (no parallel region): for kernels that convert a
// small block at a time inside their own parallel loop (the 16-bit elementwise ops,
// engine/ops_cpu.cpp).
void convert_f32_to_f16_serial(const float* src, Half* dst, int64_t n);
void convert_f16_to_f32_serial(const Half* src, float* dst, int64_t n);
void convert_f32_to_bf16_serial(const float* src, BFloat16* dst, int64_t n);
void convert_bf16_to_f32_serial(const BFloat16* src, float* dst, int64_t n);

// The instruction set those loops were built for, e.g. "avx512bf16", "avx512f", "f16c",
// "scalar": what the vector-versus-scalar tests exercised.
const char* f16_conversion_isa();
const char* bf16_conversion_isa();

}  // namespace kiln::cpu
