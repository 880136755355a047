// dropout_kernels.h: the kernels behind layers/dropout.h (the CPU ones in dropout.cpp, next to
// the op, the CUDA ones in dropout_cuda.cu), and the keep rule both apply. Twins of one name and
// signature in cpu:: and cuda::, the backend's tag first (engine/dispatch.h).
//
// Both devices apply the same rule (dropout_keep below) in the same grouping: group j holds
// elements 4j..4j+3 and reads the four 32-bit outputs of ONE Philox call at counter base + j,
// element 4j + k using output k; a kept element is x * scale, a dropped one x * 0. The mask is
// therefore bit-identical on the CPU and on every CUDA device for the same (seed, base),
// whatever the launch configuration.
//
// `base_offset` is null, or (CUDA, inside a captured graph: engine/philox.h) a device scalar the
// kernel adds to `base` when it runs, so that each replay draws new numbers.
#pragma once

#include <cstdint>

#include "engine/backend.h"
#include "engine/host_device.h"  // KILN_HOST_DEVICE, uniform01

namespace kiln {

// Dropout keeps an element iff the uniform draw of its random bits is >= p (layers/dropout.h).
KILN_HOST_DEVICE inline bool dropout_keep(uint32_t bits, float p) { return uniform01(bits) >= p; }

namespace cpu {

// x, y are (n): y[i] = x[i] * (keep(i) ? scale : 0), with
// keep(i) = dropout_keep(philox_u32(seed, base, i), p).
template <typename T>
void dropout_forward(Backend, const T* x, T* y, int64_t n, float p, T scale, uint64_t seed,
                     uint64_t base, const uint64_t* base_offset);

// gy, gx are (n): gx[i] = gy[i] * (keep(i) ? scale : 0), the forward's mask recomputed.
template <typename T>
void dropout_backward(Backend, const T* gy, T* gx, int64_t n, float p, T scale, uint64_t seed,
                      uint64_t base, const uint64_t* base_offset);

}  // namespace cpu

namespace cuda {

// The same on device arrays; launched on current_stream().
template <typename T>
void dropout_forward(Backend, const T* x, T* y, int64_t n, float p, T scale, uint64_t seed,
                     uint64_t base, const uint64_t* base_offset);
template <typename T>
void dropout_backward(Backend, const T* gy, T* gx, int64_t n, float p, T scale, uint64_t seed,
                      uint64_t base, const uint64_t* base_offset);

}  // namespace cuda

}  // namespace kiln
