// dropout_kernels.h: the CUDA kernels behind layers/dropout.h (internal to kiln_layers). The
// CPU kernels are small enough to live in dropout.cpp, next to the op.
//
// Both devices apply the same rule (dropout_keep in engine/host_device.h) in the same
// grouping: group j holds elements 4j..4j+3 and reads the four 32-bit outputs of ONE Philox
// call at counter base + j, element 4j + k using output k; a kept element is x * scale, a
// dropped one x * 0. The mask is therefore bit-identical on the CPU and on every CUDA device
// for the same (seed, base), whatever the launch configuration.
#pragma once

#include <cstdint>

namespace kiln::cuda {

// x, y are (n) device arrays: y[i] = x[i] * (keep(i) ? scale : 0), with
// keep(i) = uniform01(philox_u32(seed, base, i)) >= p. Launches on current_stream().
template <typename T>
void dropout_forward_cuda(const T* x, T* y, int64_t n, float p, T scale, uint64_t seed,
                          uint64_t base);

// gy, gx are (n): gx[i] = gy[i] * (keep(i) ? scale : 0), the forward's mask recomputed.
template <typename T>
void dropout_backward_cuda(const T* gy, T* gx, int64_t n, float p, T scale, uint64_t seed,
                           uint64_t base);

}  // namespace kiln::cuda
