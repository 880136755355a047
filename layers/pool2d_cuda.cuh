// pool2d_cuda.cuh: what the NCHW (pool2d_cuda.cu) and channels-last (pool2d_nhwc_cuda.cu) CUDA
// pooling kernels share: the geometry in 32-bit integers and the launch shape of their
// one-thread-per-element grid-stride loops, and the load that widens a 16-bit element to f32.
// Included by those two files alone.
//
// Every kernel is one template for f32, f64 and the 16-bit activations (Half, BFloat16): an
// element is widened to compute_t<T> as it is loaded (ld), the window is compared or summed in
// compute_t<T> in the f32 kernel's order, and the result is rounded once as it is stored
// (convert_elem<T>). So a 16-bit result is the f32 kernel's on the widened input, rounded once,
// and the CPU's bit for bit.
#pragma once

#include "engine/cuda/runtime.h"

#include <climits>
#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/launch.h"
#include "engine/dtype.h"
#include "engine/error.h"
#include "engine/host_device.h"
#include "layers/pool2d_kernels.h"

namespace kiln::cuda::pool_detail {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 8192;  // grid-stride beyond

// Pool2dGeometry in 32-bit integers: 64-bit division is many times slower on a GPU.
struct PoolDims {
  int planes;          // N * C
  int h, w, oh, ow;    // input and output planes
  int kh, kw, sh, sw, ph, pw;
};

// Checks that every index fits in an int (fewer than 2^31 elements in and out).
inline PoolDims pool_dims(const char* op, const Pool2dGeometry& g) {
  const int64_t in = g.n * g.c * g.in_h * g.in_w, out = g.n * g.c * g.out_h * g.out_w;
  KILN_CHECK(in < INT_MAX && out < INT_MAX, op, " (CUDA): input [", g.n, ", ", g.c, ", ", g.in_h,
             ", ", g.in_w, "] or output [", g.n, ", ", g.c, ", ", g.out_h, ", ", g.out_w,
             "] has 2^31 elements or more, beyond the kernels' 32-bit indexing: split the batch");
  PoolDims d;
  d.planes = static_cast<int>(g.n * g.c);
  d.h = static_cast<int>(g.in_h), d.w = static_cast<int>(g.in_w);
  d.oh = static_cast<int>(g.out_h), d.ow = static_cast<int>(g.out_w);
  d.kh = static_cast<int>(g.kernel_h), d.kw = static_cast<int>(g.kernel_w);
  d.sh = static_cast<int>(g.stride_h), d.sw = static_cast<int>(g.stride_w);
  d.ph = static_cast<int>(g.pad_h), d.pw = static_cast<int>(g.pad_w);
  return d;
}

// An element widened to the arithmetic type (the identity for float and double).
template <typename T>
__device__ __forceinline__ compute_t<T> ld(T v) {
  return convert_elem<compute_t<T>>(v);
}

inline LaunchConfig elementwise_config(int64_t n) {
  return grid_stride_config_1d(n, kThreads, kMaxBlocks, current_stream());
}

inline int64_t in_numel(const PoolDims& d) { return static_cast<int64_t>(d.planes) * d.h * d.w; }
inline int64_t out_numel(const PoolDims& d) {
  return static_cast<int64_t>(d.planes) * d.oh * d.ow;
}

}  // namespace kiln::cuda::pool_detail
