// common.h: small device-side helpers shared by the engine's kernel files (engine/cuda/kernels).
// Include after engine/cuda/runtime.h. Everything here compiles under nvcc and the simulator.
#pragma once

#include <cstdint>

#include "engine/cuda/runtime.h"
#include "engine/cuda/launch.h"

// KILN_UNROLL: "#pragma unroll" for nvcc; the host compiler of the simulator does not know
// the pragma (and the simulator does not need the speed).
#if KILN_CUDA_SIM
#define KILN_UNROLL
#else
#define KILN_UNROLL _Pragma("unroll")
#endif

namespace kiln::cuda {

// Four floats moved as one 16-byte load or store (ld.global.v4.f32). The address must be
// 16-byte aligned: callers check that on the host (base pointer and leading dimension).
using Vec4f = float4;

// exp / log for float and double in device code (expf is the accurate float version, within
// 2 ulp; __expf would be faster and less accurate).
__device__ __forceinline__ float exp_t(float x) { return expf(x); }
__device__ __forceinline__ double exp_t(double x) { return exp(x); }
__device__ __forceinline__ float log_t(float x) { return logf(x); }
__device__ __forceinline__ double log_t(double x) { return log(x); }

// A multiply-add whose rounding is spelled out, for kernels that promise their bits (two paths
// that must agree bit for bit; docs/cuda_simulator.md, "Floating point: contraction as nvcc
// does it"). nvcc contracts a * b + c into one fused multiply-add where it chooses to, and so
// does the simulator's host compiler, each by its own rules; these leave no choice.
// fma_t: a * b + c rounded once (IEEE 754 fusedMultiplyAdd). mul_rn: a * b rounded on its own,
// never fused with the addition that reads it.
__device__ __forceinline__ float fma_t(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double fma_t(double a, double b, double c) { return __fma_rn(a, b, c); }
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

// The 1-D grid of a grid-stride kernel over n items: ceil(n / threads) blocks (at least 1, so
// an empty launch stays valid), at most max_blocks. Beyond that each thread loops,
//   for (i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
// so any n fits in one launch. The one place this sizing is written: every kernel file that
// launches such a loop calls it with its own block size and cap.
inline unsigned grid_stride_blocks_1d(int64_t n, int threads, unsigned max_blocks) {
  const unsigned b = blocks_for(n, threads);
  return b < max_blocks ? b : max_blocks;
}
// ... and its launch configuration: `threads` per block, no dynamic shared memory.
inline LaunchConfig grid_stride_config_1d(int64_t n, int threads, unsigned max_blocks,
                                          cudaStream_t stream) {
  return LaunchConfig{dim3(grid_stride_blocks_1d(n, threads, max_blocks)), dim3(threads), 0,
                      stream};
}

// Threads per block of the simple one-element-per-thread kernels, and the most blocks they
// launch (grid_stride_blocks_1d).
constexpr int kElementwiseThreads = 256;
constexpr unsigned kMaxElementwiseBlocks = 8192;
inline unsigned elementwise_blocks(int64_t n) {
  return grid_stride_blocks_1d(n, kElementwiseThreads, kMaxElementwiseBlocks);
}

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Sum / max of v over the 32 lanes of a warp, by a butterfly of shuffles: after log2(32) = 5
// steps every lane holds the result. The order of additions is fixed, so it is reproducible.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}
template <typename T>
__device__ __forceinline__ T warp_max(T v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    T other = __shfl_xor_sync(kFullMask, v, offset);
    v = other > v ? other : v;
  }
  return v;
}

// Sum / max of v over the whole block (blockDim.x a multiple of 32, at most 1024): each warp
// reduces with shuffles, warp leaders write their partial to `scratch` (32 elements of
// shared memory), and the first warp reduces the partials. Every thread gets the result.
// Contains __syncthreads(): every thread of the block must call it.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : T(0);
  return warp_sum(v);  // every warp reduces the partials: all threads get the same value
}
template <typename T>
__device__ __forceinline__ T block_max(T v, T* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : scratch[0];
  return warp_max(v);
}

}  // namespace kiln::cuda
