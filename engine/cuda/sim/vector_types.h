// sim/vector_types.h: the CUDA simulator's dim3, uint3 and small vector types (float4, int2,
// ...), CUDA's vector_types.h and the make_* helpers of vector_functions.h. Included by
// sim/runtime.h, and by sim/kernel.h, whose builtins (threadIdx, blockDim, ...) are of them.
// Follows the Programming Guide's "Built-in Vector Types"
// (https://docs.nvidia.com/cuda/cuda-c-programming-guide/#built-in-vector-types).
#pragma once

// Same members, sizes and alignment as CUDA's vector_types.h, so 16-byte loads stay legal.
struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}  // NOLINT: implicit like CUDA's
  constexpr operator uint3() const { return uint3{x, y, z}; }
};
struct int3 { int x, y, z; };
struct float3 { float x, y, z; };
struct alignas(8) int2 { int x, y; };
struct alignas(8) uint2 { unsigned int x, y; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };
inline constexpr int2 make_int2(int x, int y) { return {x, y}; }
inline constexpr uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline constexpr float2 make_float2(float x, float y) { return {x, y}; }
inline constexpr int3 make_int3(int x, int y, int z) { return {x, y, z}; }
inline constexpr uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return {x, y, z}; }
inline constexpr float3 make_float3(float x, float y, float z) { return {x, y, z}; }
inline constexpr int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline constexpr uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
  return {x, y, z, w};
}
inline constexpr float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline constexpr double2 make_double2(double x, double y) { return {x, y}; }
