// ops_cpu.h: CPU kernels of the core ops (engine/ops_cpu.cpp). Raw pointers, contiguous
// buffers, templated on the element type (float, double; binary, unary and relu_backward also
// Half and BFloat16: 16-bit activations, computed in f32 and rounded once on store). The CUDA twins are declared in
// engine/ops_cuda.h (namespace kiln::cuda, same names and arguments, device pointers); the
// first argument, the backend's tag, lets an op call either unqualified (engine/dispatch.h).
#pragma once

#include <cstdint>

#include "engine/backend.h"
#include "engine/dtype.h"
#include "engine/elementwise_ops.h"

namespace kiln::cpu {

// out[i] = a[i] op b[j(i)], a and out have n elements; b has n (Same), 1 (Scalar) or
// `row` elements (Row: b is repeated every `row` elements of a).
template <typename T>
void binary(Backend, BinaryOp op, Broadcast kind, const T* a, const T* b, T* out, int64_t n,
            int64_t row);

// out[i] = f(x[i]); `scalar` is the operand of AddScalar / MulScalar.
template <typename T>
void unary(Backend, UnaryOp op, const T* x, T* out, int64_t n, compute_t<T> scalar);

// grad_x[i] = grad_y[i] if y[i] > 0 else 0.
template <typename T>
void relu_backward(Backend, const T* grad_y, const T* y, T* grad_x, int64_t n);

// x viewed as (outer, len, inner); out is (outer, inner) = sum over len. A 16-bit x (Half,
// BFloat16) is summed in f32 into an f32 out (compute_t); f32 and f64 sum in their own type.
template <typename T>
void sum_dim(Backend, const T* x, compute_t<T>* out, int64_t outer, int64_t len,
             int64_t inner);
// The adjoint of sum_dim: out (outer, len, inner)[o, l, i] = g (outer, inner)[o, i] * scale,
// g and scale in compute_t<T>, the product rounded once to T.
template <typename T>
void expand_dim(Backend, const compute_t<T>* g, T* out, int64_t outer, int64_t len,
                int64_t inner, compute_t<T> scale);
// out (outer, inner) = argmax over len of x (outer, len, inner).
template <typename T>
void argmax_dim(Backend, const T* x, int64_t* out, int64_t outer, int64_t len,
                int64_t inner);

// C (M,N) = op(A) op(B) + beta C through BLAS (OpenBLAS); op(A) is (M,K), op(B) is (K,N). The
// CPU's one f32/f64 GEMM, which both kernel settings run (engine/impl.cpp, gemm_impl); the CUDA
// twin is our own GEMM, and cuda::gemm_vendor is cuBLAS.
template <typename T>
void gemm(Backend, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a,
          const T* b, T* c, T beta = T(0));

// out = x with dims d0 and d1 swapped; x has shape dims[0..rank).
template <typename T>
void transpose(Backend, const T* x, T* out, const int64_t* dims, int64_t rank, int64_t d0,
               int64_t d1);

// Softmax / log-softmax of x (outer, len, inner) over len.
template <typename T>
void softmax(Backend, const T* x, T* y, int64_t outer, int64_t len, int64_t inner, bool log);
// Backward of softmax (log=false: y is softmax) or log-softmax (log=true: y is log-softmax).
template <typename T>
void softmax_backward(Backend, const T* grad_y, const T* y, T* grad_x, int64_t outer,
                      int64_t len, int64_t inner, bool log);

// Loss scaling's fused unscale-and-check (engine/optim/grad_scaler.h): g[i] = g[i] / T(*scale)
// for i < n (unscale_elem, engine/host_device.h), and *found_inf = 1 if any result is inf or NaN
// (otherwise *found_inf is left as it was, so one flag can collect many buffers). g is (n); the
// scale is an f32 value in memory (the CUDA twin reads it on the device).
template <typename T>
void unscale_and_check(Backend, T* g, int64_t n, const float* scale, int32_t* found_inf);

}  // namespace kiln::cpu
