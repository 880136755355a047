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
#include "engine/cuda/runtime.h"

#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/launch.h"
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
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const T bv = Kind == Broadcast::Same ? b[i] : Kind == Broadcast::Scalar ? b[0] : b[i % row];
    out[i] = apply_binary<T, Op>(a[i], bv);
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

LaunchConfig elementwise_config(int64_t n) {
  return LaunchConfig{dim3(elementwise_blocks(n)), dim3(kElementwiseThreads), 0, current_stream()};
}

template <typename T, BinaryOp Op>
void launch_binary(Broadcast kind, const T* a, const T* b, T* out, int64_t n, int64_t row) {
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
void unary(Backend, UnaryOp op, const T* x, T* out, int64_t n, T scalar) {
  if (n == 0) return;
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

template <typename T>
void relu_backward(Backend, const T* grad_y, const T* y, T* grad_x, int64_t n) {
  if (n == 0) return;
  launch(relu_backward_kernel<T>, elementwise_config(n), grad_y, y, grad_x, n);
}

#define KILN_INSTANTIATE(T)                                                                 \
  template void binary<T>(Backend, BinaryOp, Broadcast, const T*, const T*, T*, int64_t,    \
                          int64_t);                                                         \
  template void unary<T>(Backend, UnaryOp, const T*, T*, int64_t, T);                       \
  template void relu_backward<T>(Backend, const T*, const T*, T*, int64_t);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(double)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
