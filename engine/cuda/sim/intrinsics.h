// sim/intrinsics.h: CUDA's device math functions and bit intrinsics on the CPU (included by
// sim/runtime.h).
// Follows the CUDA Math API (https://docs.nvidia.com/cuda/cuda-math-api/) and the
// Programming Guide's "Intrinsic Functions":
// https://docs.nvidia.com/cuda/cuda-c-programming-guide/
//
// The standard math functions (expf, logf, sqrtf, fminf, tanhf, powf, ...) come from <math.h>,
// which in C++ also puts the float overloads (sqrt(float), exp(float), abs(float)) in the
// global namespace, as CUDA's math headers do. Added here: CUDA's own names.
//   - Fast-math intrinsics (__expf, __logf, __fdividef, ...): on a GPU they trade accuracy for
//     speed; here they are the accurate library functions, so a kernel that uses them can be
//     slightly *more* accurate in the simulator than on the GPU. Tolerances must allow for it.
//   - min/max overloads for integer and floating types, as CUDA provides in device code.
//   - Bit casts and bit counting (__float_as_int, __popc, __clz, __ffs, ...).
#pragma once

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <math.h>  // NOLINT: the global-namespace overloads CUDA code expects (sqrt(float), ...)

// ---- Fast-math and rounding-mode intrinsics (all round-to-nearest here) ---------------------
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return powf(10.0f, x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float __tanhf(float x) { return tanhf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
// The _rn additions, subtractions and multiplications are never contracted: "This operation
// will never be merged into a single multiply-add instruction" (CUDA Math API, __fadd_rn,
// __fmul_rn, __dadd_rn, ...). The simulator compiles kernels with contraction on, as nvcc does
// (docs/cuda_simulator.md, "Floating point: contraction as nvcc does it"), so a product these
// return, and a product passed to their additions, goes through kiln::sim::detail::rounded():
// the compiler cannot fuse it with the operation on the other side.
namespace kiln::sim::detail {
// v, as a value the compiler knows nothing about (an empty asm statement that "changes" it in
// its register): no multiply before it is fused with an add after it.
template <typename T>
inline T rounded(T v) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && defined(__SSE2__)
  __asm__("" : "+x"(v));
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(v));
#else
  volatile T r = v;
  v = r;
#endif
  return v;
}
}  // namespace kiln::sim::detail
inline float __fadd_rn(float a, float b) {
  return kiln::sim::detail::rounded(a) + kiln::sim::detail::rounded(b);
}
inline float __fsub_rn(float a, float b) {
  return kiln::sim::detail::rounded(a) - kiln::sim::detail::rounded(b);
}
inline float __fmul_rn(float a, float b) { return kiln::sim::detail::rounded(a * b); }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __dadd_rn(double a, double b) {
  return kiln::sim::detail::rounded(a) + kiln::sim::detail::rounded(b);
}
inline double __dsub_rn(double a, double b) {
  return kiln::sim::detail::rounded(a) - kiln::sim::detail::rounded(b);
}
inline double __dmul_rn(double a, double b) { return kiln::sim::detail::rounded(a * b); }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline double __drcp_rn(double x) { return 1.0 / x; }
inline double __dsqrt_rn(double x) { return sqrt(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
// Clamp to [0, 1]; NaN gives 0, as on a GPU.
inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }
inline float normcdff(float x) { return 0.5f * erfcf(-x * 0.70710678118654752f); }
inline double normcdf(double x) { return 0.5 * erfc(-x * 0.70710678118654752); }

// ---- min / max ----------------------------------------------------------------------------
// CUDA device code calls unqualified min/max on ints, 64-bit ints and floats; mixed
// signed/unsigned pairs promote to unsigned as in CUDA's headers. (Mixing int and int64_t is
// ambiguous here as it is under nvcc: cast one side.)
#define KILN_SIM_MINMAX_(T)                           \
  inline T min(T a, T b) { return b < a ? b : a; }    \
  inline T max(T a, T b) { return a < b ? b : a; }
KILN_SIM_MINMAX_(int)
KILN_SIM_MINMAX_(unsigned int)
KILN_SIM_MINMAX_(long)
KILN_SIM_MINMAX_(unsigned long)
KILN_SIM_MINMAX_(long long)
KILN_SIM_MINMAX_(unsigned long long)
#undef KILN_SIM_MINMAX_
inline unsigned int min(int a, unsigned int b) { return min(static_cast<unsigned>(a), b); }
inline unsigned int min(unsigned int a, int b) { return min(a, static_cast<unsigned>(b)); }
inline unsigned int max(int a, unsigned int b) { return max(static_cast<unsigned>(a), b); }
inline unsigned int max(unsigned int a, int b) { return max(a, static_cast<unsigned>(b)); }
// Floating min/max follow fminf/fmaxf (a NaN argument loses), as CUDA's float overloads do.
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline double min(float a, double b) { return fmin(a, b); }
inline double min(double a, float b) { return fmin(a, b); }
inline double max(float a, double b) { return fmax(a, b); }
inline double max(double a, float b) { return fmax(a, b); }

// ---- Loads --------------------------------------------------------------------------------
// __ldg: a load through the read-only data cache on a GPU; a plain load here.
template <typename T>
inline T __ldg(const T* p) { return *p; }

// ---- Bit casts ----------------------------------------------------------------------------
namespace kiln::sim::detail {
template <typename To, typename From>
inline To bit_cast(From v) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast between types of different sizes");
  To out;
  std::memcpy(&out, &v, sizeof(To));
  return out;
}
}  // namespace kiln::sim::detail
inline int __float_as_int(float x) { return kiln::sim::detail::bit_cast<int>(x); }
inline unsigned int __float_as_uint(float x) { return kiln::sim::detail::bit_cast<unsigned int>(x); }
inline float __int_as_float(int x) { return kiln::sim::detail::bit_cast<float>(x); }
inline float __uint_as_float(unsigned int x) { return kiln::sim::detail::bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return kiln::sim::detail::bit_cast<long long>(x); }
inline double __longlong_as_double(long long x) { return kiln::sim::detail::bit_cast<double>(x); }

// ---- Bit counting -------------------------------------------------------------------------
inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
// Leading zeros; defined for 0 (32 / 64) unlike the GCC builtin.
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) {
  return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x));
}
// Position (1-based) of the least significant set bit, 0 for 0.
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned int __brev(unsigned int x) {
  unsigned int r = 0;
  for (int i = 0; i < 32; ++i, x >>= 1) r = (r << 1) | (x & 1u);
  return r;
}
inline unsigned int __umulhi(unsigned int a, unsigned int b) {
  return static_cast<unsigned int>((static_cast<unsigned long long>(a) * b) >> 32);
}
