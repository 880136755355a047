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
// The language follows the CUDA C++ Programming Guide
// (https://docs.nvidia.com/cuda/cuda-c-programming-guide/),
// the host API the CUDA Runtime API reference (https://docs.nvidia.com/cuda/cuda-runtime-api/).
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
// A kernel parameter the GPU reads in place (a TMA tensor map): an ordinary parameter here.
#define __grid_constant__
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

// ---- Vector types: dim3, uint3, float4, ... (sim/vector_types.h) ----------------------------
#include "engine/cuda/sim/vector_types.h"  // IWYU pragma: export

#include "engine/cuda/sim/api.h"         // IWYU pragma: export
#include "engine/cuda/sim/kernel.h"      // IWYU pragma: export
#include "engine/cuda/sim/intrinsics.h"  // IWYU pragma: export
