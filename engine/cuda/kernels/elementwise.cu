// elementwise.cu: CUDA kernels of the elementwise ops (binary with broadcast, unary, relu
// backward; add_relu is the binary AddRelu): the twins of cpu::binary / cpu::unary /
// cpu::relu_backward.
//
// Parallelisation: one thread per element, blocks of 256 threads, consecutive threads on
// consecutive elements so every warp reads and writes 32 neighbouring values (coalesced).
// The grid is capped (kMaxElementwiseBlocks); a thread then handles elements i, i + stride,
// i + 2 stride, ... (a grid-stride loop), so one launch covers any n.
// The operation and the broadcast kind are template arguments: the host picks the
// instantiation once, and the per-element loop carries no switch.
// Each output element is computed exactly like the CPU's (the same single operation), so
// add/sub/mul/div/neg/square/relu and the scalar ops are bit-identical to the CPU; exp and log
// use the CUDA math library (within 2 ulp of the CPU's).
//
// 16-bit elements (Half, BFloat16): loaded, widened to f32 (compute_t), the same f32 operation,
// rounded once on store (convert_elem, engine/host_device.h: the CPU's rule, so the bits match
// the CPU's too). Where every pointer of an elementwise map (binary with Same or Scalar
// broadcast, unary, relu_backward) is 16-byte aligned, a thread moves 8 elements per 16-byte
// load and store (uint4: a warp reads 512 contiguous bytes per instruction instead of 64), and
// the last n % 8 elements go one at a time; otherwise every element goes one at a time.
#include "engine/cuda/runtime.h"

#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/launch.h"
#include "engine/host_device.h"
#include "engine/ops_cuda.h"

namespace kiln::cuda {

namespace {

template <typename T, BinaryOp Op>
__device__ __forceinline__ T apply_binary(T a, T b) {
  if (Op == BinaryOp::Add) return a + b;
  if (Op == BinaryOp::Sub) return a - b;
  if (Op == BinaryOp::Mul) return a * b;
  if (Op == BinaryOp::AddRelu) {
    const T v = a + b;
    return v > T(0) ? v : T(0);
  }
  return a / b;
}

// a, out are (n); b is (n) for Same, (1) for Scalar, (row) for Row (repeated along a).
template <typename T, BinaryOp Op, Broadcast Kind>
__global__ void binary_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                              int64_t n, int64_t row) {
  using C = compute_t<T>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const T bv = Kind == Broadcast::Same ? b[i] : Kind == Broadcast::Scalar ? b[0] : b[i % row];
    out[i] = convert_elem<T>(apply_binary<C, Op>(convert_elem<C>(a[i]), convert_elem<C>(bv)));
  }
}

template <typename T, UnaryOp Op>
__device__ __forceinline__ T apply_unary(T v, T scalar) {
  if (Op == UnaryOp::Neg) return -v;
  if (Op == UnaryOp::Exp) return exp_t(v);
  if (Op == UnaryOp::Log) return log_t(v);
  if (Op == UnaryOp::Square) return v * v;
  if (Op == UnaryOp::Relu) return v > T(0) ? v : T(0);
  if (Op == UnaryOp::AddScalar) return v + scalar;
  return v * scalar;  // MulScalar
}

// x, out are (n).
template <typename T, UnaryOp Op>
__global__ void unary_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t n, T scalar) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = apply_unary<T, Op>(x[i], scalar);
}

// grad_y, y, grad_x are (n).
template <typename T>
__global__ void relu_backward_kernel(const T* __restrict__ grad_y, const T* __restrict__ y,
                                     T* __restrict__ grad_x, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    grad_x[i] = y[i] > T(0) ? grad_y[i] : T(0);
}

// ---- 16-bit maps: 8 elements per 16-byte access ----------------------------------------------

// The f32 function of one element of a 16-bit map: f(a, b) (b is 0 in unary maps).
template <BinaryOp Op>
struct BinaryFn {
  __device__ __forceinline__ float operator()(float a, float b) const {
    return apply_binary<float, Op>(a, b);
  }
};
template <UnaryOp Op>
struct UnaryFn {
  float scalar;
  __device__ __forceinline__ float operator()(float a, float) const {
    return apply_unary<float, Op>(a, scalar);
  }
};
struct ReluBackwardFn {  // a = grad_y, b = y
  __device__ __forceinline__ float operator()(float g, float y) const { return y > 0.0f ? g : 0.0f; }
};

// What the second operand of a 16-bit map is: none (unary), n elements, or one (b[0]).
enum class Rhs { None, Same, Scalar };

// Element k (0 or 1) of a 32-bit word of two 16-bit elements (little endian: element 0 is the
// low half), widened; and two results narrowed into one word.
template <typename T>
__device__ __forceinline__ float lane16(uint32_t w, int k) {
  return widen(T{static_cast<uint16_t>(k == 0 ? w & 0xffffu : w >> 16)});
}
template <typename T>
__device__ __forceinline__ uint32_t pack16(float lo, float hi) {
  return static_cast<uint32_t>(convert_elem<T>(lo).bits) |
         (static_cast<uint32_t>(convert_elem<T>(hi).bits) << 16);
}
template <typename T, Rhs R, typename F>
__device__ __forceinline__ uint32_t map_word(uint32_t a, uint32_t b, float scalar_b, F f) {
  if (R == Rhs::Same)
    return pack16<T>(f(lane16<T>(a, 0), lane16<T>(b, 0)), f(lane16<T>(a, 1), lane16<T>(b, 1)));
  return pack16<T>(f(lane16<T>(a, 0), scalar_b), f(lane16<T>(a, 1), scalar_b));
}

// out[i] = f(a[i], b(i)) for i < n, b(i) = b[i] (Same), b[0] (Scalar) or 0 (None). a, out and
// (Same) b are 16-byte aligned: vector v is elements 8v..8v+7, one uint4 each; the n % 8
// elements after the last whole vector are then done one per thread.
template <typename T, Rhs R, typename F>
__global__ void map16_vec8_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                  T* __restrict__ out, int64_t n, F f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t vectors = n / 8;
  const float scalar_b = R == Rhs::Scalar ? widen(b[0]) : 0.0f;
  const uint4* av = reinterpret_cast<const uint4*>(a);
  const uint4* bv = reinterpret_cast<const uint4*>(b);
  uint4* ov = reinterpret_cast<uint4*>(out);
  for (int64_t v = first; v < vectors; v += stride) {
    const uint4 x = av[v];
    const uint4 y = R == Rhs::Same ? bv[v] : make_uint4(0u, 0u, 0u, 0u);
    ov[v] = make_uint4(map_word<T, R>(x.x, y.x, scalar_b, f), map_word<T, R>(x.y, y.y, scalar_b, f),
                       map_word<T, R>(x.z, y.z, scalar_b, f), map_word<T, R>(x.w, y.w, scalar_b, f));
  }
  for (int64_t i = vectors * 8 + first; i < n; i += stride)
    out[i] = convert_elem<T>(f(widen(a[i]), R == Rhs::Same ? widen(b[i]) : scalar_b));
}

// The same map one element per thread (for pointers that are not 16-byte aligned).
template <typename T, Rhs R, typename F>
__global__ void map16_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                             int64_t n, F f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const float scalar_b = R == Rhs::Scalar ? widen(b[0]) : 0.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = convert_elem<T>(f(widen(a[i]), R == Rhs::Same ? widen(b[i]) : scalar_b));
}

LaunchConfig elementwise_config(int64_t n) {
  return LaunchConfig{dim3(elementwise_blocks(n)), dim3(kElementwiseThreads), 0, current_stream()};
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Runs the 16-bit map out = f(a, b), vectorised where the pointers allow.
template <typename T, Rhs R, typename F>
void launch_map16(const T* a, const T* b, T* out, int64_t n, F f) {
  if (aligned16(a) && (R != Rhs::Same || aligned16(b)) && aligned16(out)) {
    // Threads for the vectors, and at least enough for the tail's (up to 7) elements.
    const int64_t work = n / 8 > n % 8 ? n / 8 : n % 8;
    launch(map16_vec8_kernel<T, R, F>, elementwise_config(work), a, b, out, n, f);
  } else {
    launch(map16_kernel<T, R, F>, elementwise_config(n), a, b, out, n, f);
  }
}

template <typename T, BinaryOp Op>
void launch_binary(Broadcast kind, const T* a, const T* b, T* out, int64_t n, int64_t row) {
  if constexpr (is_low_precision_v<T>) {
    if (kind == Broadcast::Same) return launch_map16<T, Rhs::Same>(a, b, out, n, BinaryFn<Op>{});
    if (kind == Broadcast::Scalar)
      return launch_map16<T, Rhs::Scalar>(a, b, out, n, BinaryFn<Op>{});
  }
  const LaunchConfig cfg = elementwise_config(n);
  switch (kind) {
    case Broadcast::Same: return launch(binary_kernel<T, Op, Broadcast::Same>, cfg, a, b, out, n, row);
    case Broadcast::Scalar: return launch(binary_kernel<T, Op, Broadcast::Scalar>, cfg, a, b, out, n, row);
    case Broadcast::Row: return launch(binary_kernel<T, Op, Broadcast::Row>, cfg, a, b, out, n, row);
  }
}

}  // namespace

template <typename T>
void binary(Backend, BinaryOp op, Broadcast kind, const T* a, const T* b, T* out, int64_t n,
            int64_t row) {
  if (n == 0) return;
  KILN_CHECK(kind != Broadcast::Row || row > 0, "binary: a broadcast row needs at least one element");
  switch (op) {
    case BinaryOp::Add: return launch_binary<T, BinaryOp::Add>(kind, a, b, out, n, row);
    case BinaryOp::Sub: return launch_binary<T, BinaryOp::Sub>(kind, a, b, out, n, row);
    case BinaryOp::Mul: return launch_binary<T, BinaryOp::Mul>(kind, a, b, out, n, row);
    case BinaryOp::Div: return launch_binary<T, BinaryOp::Div>(kind, a, b, out, n, row);
    case BinaryOp::AddRelu: return launch_binary<T, BinaryOp::AddRelu>(kind, a, b, out, n, row);
  }
}

template <typename T>
void unary(Backend, UnaryOp op, const T* x, T* out, int64_t n, compute_t<T> scalar) {
  if (n == 0) return;
  if constexpr (is_low_precision_v<T>) {
    const T* none = nullptr;
    switch (op) {
      case UnaryOp::Neg: return launch_map16<T, Rhs::None>(x, none, out, n, UnaryFn<UnaryOp::Neg>{scalar});
      case UnaryOp::Exp: return launch_map16<T, Rhs::None>(x, none, out, n, UnaryFn<UnaryOp::Exp>{scalar});
      case UnaryOp::Log: return launch_map16<T, Rhs::None>(x, none, out, n, UnaryFn<UnaryOp::Log>{scalar});
      case UnaryOp::Square: return launch_map16<T, Rhs::None>(x, none, out, n, UnaryFn<UnaryOp::Square>{scalar});
      case UnaryOp::Relu: return launch_map16<T, Rhs::None>(x, none, out, n, UnaryFn<UnaryOp::Relu>{scalar});
      case UnaryOp::AddScalar: return launch_map16<T, Rhs::None>(x, none, out, n, UnaryFn<UnaryOp::AddScalar>{scalar});
      case UnaryOp::MulScalar: return launch_map16<T, Rhs::None>(x, none, out, n, UnaryFn<UnaryOp::MulScalar>{scalar});
    }
  } else {
    const LaunchConfig cfg = elementwise_config(n);
    switch (op) {
      case UnaryOp::Neg: return launch(unary_kernel<T, UnaryOp::Neg>, cfg, x, out, n, scalar);
      case UnaryOp::Exp: return launch(unary_kernel<T, UnaryOp::Exp>, cfg, x, out, n, scalar);
      case UnaryOp::Log: return launch(unary_kernel<T, UnaryOp::Log>, cfg, x, out, n, scalar);
      case UnaryOp::Square: return launch(unary_kernel<T, UnaryOp::Square>, cfg, x, out, n, scalar);
      case UnaryOp::Relu: return launch(unary_kernel<T, UnaryOp::Relu>, cfg, x, out, n, scalar);
      case UnaryOp::AddScalar: return launch(unary_kernel<T, UnaryOp::AddScalar>, cfg, x, out, n, scalar);
      case UnaryOp::MulScalar: return launch(unary_kernel<T, UnaryOp::MulScalar>, cfg, x, out, n, scalar);
    }
  }
}

template <typename T>
void relu_backward(Backend, const T* grad_y, const T* y, T* grad_x, int64_t n) {
  if (n == 0) return;
  if constexpr (is_low_precision_v<T>) {
    launch_map16<T, Rhs::Same>(grad_y, y, grad_x, n, ReluBackwardFn{});
  } else {
    launch(relu_backward_kernel<T>, elementwise_config(n), grad_y, y, grad_x, n);
  }
}

#define KILN_INSTANTIATE(T)                                                                 \
  template void binary<T>(Backend, BinaryOp, Broadcast, const T*, const T*, T*, int64_t,    \
                          int64_t);                                                         \
  template void unary<T>(Backend, UnaryOp, const T*, T*, int64_t, compute_t<T>);            \
  template void relu_backward<T>(Backend, const T*, const T*, T*, int64_t);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(double)
KILN_INSTANTIATE(Half)
KILN_INSTANTIATE(BFloat16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
