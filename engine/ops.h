// ops.h: the core differentiable ops. Each dispatches on its inputs' device with a plain
// switch to cpu::... (engine/*_cpu.cpp) or, with the CUDA backend, cuda::... kernels.
//
// Broadcasting is deliberately small: a binary op takes (a) two tensors of the same shape,
// (b) a tensor and a one-element tensor (a scalar), or (c) a tensor of shape [..., C] and a
// "bias row" of shape [C]. Anything else is an error that prints both shapes.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.h"

namespace kiln {

// ---- Elementwise ------------------------------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor square(const Tensor& a);
Tensor relu(const Tensor& a);
// relu(a + b) in one pass, a and b of the same shape: a residual block's join (ResNet). The
// sum is never stored; backward sends the same masked gradient, g * (y > 0), to both inputs.
Tensor add_relu(const Tensor& a, const Tensor& b);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, double b) { return add(a, -b); }
inline Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
inline Tensor operator*(double b, const Tensor& a) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, double b) { return mul(a, 1.0 / b); }
inline Tensor operator-(const Tensor& a) { return neg(a); }

// ---- Reductions -------------------------------------------------------------------------------
Tensor sum(const Tensor& a);                                                 // all elements -> [1]
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& a);
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor argmax(const Tensor& a, int64_t dim);  // i64 indices; not differentiable

// ---- Linear algebra and shape ------------------------------------------------------------------
// a is (M,K), b is (K,N) -> (M,N). trans_a / trans_b use a^T / b^T without copying.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
Tensor transpose(const Tensor& a, int64_t dim0, int64_t dim1);  // copies (tensors are contiguous)

// ---- Softmax family (over one dim; -1 = last) -------------------------------------------------
Tensor softmax(const Tensor& a, int64_t dim = -1);
Tensor log_softmax(const Tensor& a, int64_t dim = -1);

// Normalises a possibly negative dim against a rank, with an error naming the op.
int64_t wrap_dim(int64_t dim, int64_t rank, const char* op);

}  // namespace kiln
