// convert_cpu.cpp: dtype conversion of host buffers (contract: convert_cpu.h).
//
// The vector loops convert 16 (AVX-512) or 8 (F16C) elements per step and leave the tail to the
// scalar rule. What the instructions do, and where it differs from Kiln's rule:
//   vcvtps2ph (f32 -> f16, imm8 = round to nearest even)  the same rule: nearest even,
//       subnormals kept, overflow to inf, a NaN quieted with its top payload bits.
//   vcvtph2ps (f16 -> f32)  exact; a signalling NaN comes back quiet, as in the scalar rule.
//   vcvtneps2bf16 (f32 -> bf16, AVX512_BF16)  nearest even and NaN quieted as the scalar rule,
//       but it treats subnormal inputs as zero. Kiln keeps them: lanes whose input is
//       subnormal are recomputed with the integer rule (and only when a vector has one).
//   bf16 -> f32  a shift by 16 bits, then the quiet bit set on NaN lanes.
// The chunks handed to OpenMP threads are multiples of 16 elements, so the vector path covers
// the same elements however many threads run.
#include "engine/convert_cpu.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__F16C__)
// GCC 12 warns that the intrinsics' internal _mm512_undefined_*() "may be used uninitialized"
// when they are inlined into an OpenMP region: a false alarm from inside its own headers.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#endif

namespace kiln::cpu {
namespace {

static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2, "16-bit storage types");

// Runs body(begin, end) over [0, n) in chunks of 64Ki elements, in parallel when there are many.
template <typename Body>
void for_chunks(int64_t n, Body&& body) {
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) body(c * kChunk, std::min(n, (c + 1) * kChunk));
}

template <typename Src, typename Dst>
void convert_loop(const Src* src, Dst* dst, int64_t n) {
  for_chunks(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dst[i] = convert_elem<Dst>(src[i]);
  });
}

#if defined(__AVX512F__)
// The integer bf16 rounding of f32_to_bf16 on 16 lanes (32-bit results, NaN lanes excluded).
inline __m512i bf16_round_lanes(__m512i x) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  return _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb),
                           16);
}
#endif

}  // namespace

void convert_f32_to_f16_serial(const float* src, Half* dst, int64_t n) {
  const int64_t e = n;
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= e; i += 16) {
    const __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
  }
#elif defined(__F16C__)
  for (; i + 8 <= e; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
#endif
  for (; i < e; ++i) dst[i].bits = f32_to_f16(src[i]);
}

void convert_f32_to_f16(const float* src, Half* dst, int64_t n) {
  for_chunks(n, [&](int64_t b, int64_t e) { convert_f32_to_f16_serial(src + b, dst + b, e - b); });
}

void convert_f16_to_f32_serial(const Half* src, float* dst, int64_t n) {
  const int64_t e = n;
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= e; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
  }
#elif defined(__F16C__)
  for (; i + 8 <= e; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < e; ++i) dst[i] = f16_to_f32(src[i].bits);
}

void convert_f16_to_f32(const Half* src, float* dst, int64_t n) {
  for_chunks(n, [&](int64_t b, int64_t e) { convert_f16_to_f32_serial(src + b, dst + b, e - b); });
}

void convert_f32_to_bf16_serial(const float* src, BFloat16* dst, int64_t n) {
  const int64_t e = n;
  int64_t i = 0;
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  for (; i + 16 <= e; i += 16) {
    const __m512 v = _mm512_loadu_ps(src + i);
    __m256i r = (__m256i)_mm512_cvtneps_pbh(v);  // a vector cast: the same 256 bits
    // Subnormal lanes: a nonzero magnitude with a zero exponent.
    const __m512i x = _mm512_castps_si512(v);
    const __mmask16 subnormal = static_cast<__mmask16>(
        _mm512_test_epi32_mask(x, magnitude) & ~_mm512_test_epi32_mask(x, exponent));
    if (subnormal) {
      const __m256i fixed = _mm512_cvtepi32_epi16(bf16_round_lanes(x));
      r = _mm256_mask_blend_epi16(subnormal, r, fixed);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), r);
  }
#elif defined(__AVX512F__)
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  const __m512i inf = _mm512_set1_epi32(0x7f800000);
  for (; i + 16 <= e; i += 16) {
    const __m512i x = _mm512_castps_si512(_mm512_loadu_ps(src + i));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, magnitude), inf);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
    const __m512i r = _mm512_mask_mov_epi32(bf16_round_lanes(x), nan, quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(r));
  }
#endif
  for (; i < e; ++i) dst[i].bits = f32_to_bf16(src[i]);
}

void convert_f32_to_bf16(const float* src, BFloat16* dst, int64_t n) {
  for_chunks(n, [&](int64_t b, int64_t e) { convert_f32_to_bf16_serial(src + b, dst + b, e - b); });
}

void convert_bf16_to_f32_serial(const BFloat16* src, float* dst, int64_t n) {
  const int64_t e = n;
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  const __m512i inf = _mm512_set1_epi32(0x7f800000);
  const __m512i quiet_bit = _mm512_set1_epi32(0x00400000);
  for (; i + 16 <= e; i += 16) {
    const __m256i b16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    __m512i x = _mm512_slli_epi32(_mm512_cvtepu16_epi32(b16), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, magnitude), inf);
    x = _mm512_mask_or_epi32(x, nan, x, quiet_bit);
    _mm512_storeu_si512(dst + i, x);
  }
#endif
  for (; i < e; ++i) dst[i] = bf16_to_f32(src[i].bits);
}

void convert_bf16_to_f32(const BFloat16* src, float* dst, int64_t n) {
  for_chunks(n, [&](int64_t b, int64_t e) { convert_bf16_to_f32_serial(src + b, dst + b, e - b); });
}

const char* f16_conversion_isa() {
#if defined(__AVX512F__)
  return "avx512f";
#elif defined(__F16C__)
  return "f16c";
#else
  return "scalar";
#endif
}

const char* bf16_conversion_isa() {
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
  return "avx512bf16";
#elif defined(__AVX512F__)
  return "avx512f";
#else
  return "scalar";
#endif
}

void convert(const void* src, DType src_type, void* dst, DType dst_type, int64_t n) {
  if (n <= 0) return;
  if (src_type == dst_type) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(src_type));
    return;
  }
  if (src_type == DType::F32 && dst_type == DType::F16)
    return convert_f32_to_f16(static_cast<const float*>(src), static_cast<Half*>(dst), n);
  if (src_type == DType::F16 && dst_type == DType::F32)
    return convert_f16_to_f32(static_cast<const Half*>(src), static_cast<float*>(dst), n);
  if (src_type == DType::F32 && dst_type == DType::BF16)
    return convert_f32_to_bf16(static_cast<const float*>(src), static_cast<BFloat16*>(dst), n);
  if (src_type == DType::BF16 && dst_type == DType::F32)
    return convert_bf16_to_f32(static_cast<const BFloat16*>(src), static_cast<float*>(dst), n);
  dispatch_any(src_type, [&](auto src_tag) {
    using Src = typename decltype(src_tag)::type;
    dispatch_any(dst_type, [&](auto dst_tag) {
      using Dst = typename decltype(dst_tag)::type;
      convert_loop(static_cast<const Src*>(src), static_cast<Dst*>(dst), n);
    });
  });
}

}  // namespace kiln::cpu
