// sim/runtime.h: the CUDA simulator's stand-in for <cuda_runtime.h> (docs/cuda_simulator.md).
//
// Under -DKILN_CUDA_SIM=1 the project's .cu files are compiled as plain C++ by the host
// compiler; engine/cuda/runtime.h includes this header instead of the real runtime. It gives
// them, with CUDA's own names:
//   - the language: __global__, __device__, __shared__, ... (qualifiers, below), dim3/uint3
//     and the small vector types (float4, int2, ...);
//   - the host API: errors, devices, memory, streams, events        (sim/api.h);
//   - the kernel builtins: threadIdx & co, __syncthreads, warp shuffles, atomics (sim/kernel.h);
//   - the math intrinsics and bit tricks: __expf, rsqrtf, min/max, __popc (sim/intrinsics.h).
// Kernels are launched with kiln::sim::launch (sim/launch.h), which runs every thread of a
// block as a fiber on one OS thread and the blocks of a grid on a small thread pool.
#pragma once

#include <cstddef>
#include <cstdint>
// libstdc++'s shared_ptr header spells `__attribute__((__noinline__))`, which the __noinline__
// macro below would break: include it first, so its include guard keeps it from re-expanding.
#include <memory>

// ---- Qualifiers ---------------------------------------------------------------------------
// On a GPU these say where a function runs; here everything runs on the CPU, so they vanish.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// __shared__: Kiln's kernels declare static shared memory with KILN_SHARED
// (engine/cuda/runtime.h), which lives in the running block's arena: NaN at every block start,
// guard zones, counted against the shared-memory limit. Plain __shared__ still compiles, as a
// static thread_local variable: the simulator runs one block at a time on an OS thread, so that
// is "one copy per running block", but unchecked: it keeps the previous block's values, has no
// guard zones and its size is not counted.
#define __shared__ static thread_local
// __constant__: a plain static global here (one per .cu file, as in nvcc's default whole-program
// mode; read-only by convention, written with cudaMemcpyToSymbol from the same file).
#define __constant__ static
// __managed__ and device-side printf/assert are not part of the supported subset.

// ---- Vector types ---------------------------------------------------------------------------
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

#include "engine/cuda/sim/api.h"         // IWYU pragma: export
#include "engine/cuda/sim/kernel.h"      // IWYU pragma: export
#include "engine/cuda/sim/intrinsics.h"  // IWYU pragma: export
