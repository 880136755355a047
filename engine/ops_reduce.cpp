// ops_reduce.cpp: sum, mean and argmax over dims. Several dims are reduced one at a time,
// highest first, each as an (outer, len, inner) reduction: one small kernel serves them all.
// sum and mean of a 16-bit tensor (f16, bf16) promote: the first reduction widens each element
// and accumulates in f32, the rest run in f32, and the result is an F32 tensor (as PyTorch's
// autocast does for sums). Their gradient has the input's dtype: the f32 gradient is expanded
// (times 1/count for mean) in f32 and each element rounded once, by the last expansion.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/autograd.h"
#include "engine/cuda/context.h"
#include "engine/dim_split.h"
#include "engine/dispatch.h"
#include "engine/memory_format.h"
#include "engine/ops.h"
#include "engine/ops_cpu.h"
#include "engine/ops_cuda.h"

namespace kiln {

int64_t wrap_dim(int64_t dim, int64_t rank, const char* op) {
  int64_t d = dim < 0 ? dim + rank : dim;
  KILN_CHECK(d >= 0 && d < rank, op, ": dim ", dim, " is out of range for a tensor of rank ", rank);
  return d;
}

namespace {

// Sums x over one dim, keeping it as size 1.
// The dtype a sum of `t` accumulates in and returns: f32 for 16-bit, t itself otherwise.
DType sum_dtype(DType t) { return is_low_precision(t) ? DType::F32 : t; }

Tensor sum_one_dim(const Tensor& x, int64_t d) {
  Shape out_shape = x.shape();
  out_shape[static_cast<size_t>(d)] = 1;
  Tensor out = Tensor::empty(out_shape, sum_dtype(x.dtype()), x.device());
  DimSplit s = split_at(x.shape(), d);
  run_activation_kernel("sum", x.device(), x.dtype(), [&](auto backend, auto tag) {
    using T = typename decltype(tag)::type;
    sum_dim(backend, x.data<T>(), out.data<compute_t<T>>(), s.outer, s.len, s.inner);
  });
  return out;
}

// Broadcasts g (shape with dim d of size 1) back to `shape`, times scale, into a tensor of
// dtype `out_dtype`: g's dtype, or a 16-bit dtype whose sum_dtype is g's (one rounding).
Tensor expand_one_dim(const Tensor& g, const Shape& shape, int64_t d, double scale,
                      DType out_dtype) {
  KILN_CHECK(sum_dtype(out_dtype) == g.dtype(), "sum_backward: a ", dtype_name(g.dtype()),
             " gradient cannot expand into ", dtype_name(out_dtype), " (internal error)");
  Tensor out = Tensor::empty(shape, out_dtype, g.device());
  DimSplit s = split_at(shape, d);
  run_activation_kernel("sum_backward", g.device(), out_dtype, [&](auto backend, auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    expand_dim(backend, g.data<C>(), out.data<T>(), s.outer, s.len, s.inner, C(scale));
  });
  return out;
}

struct SumBackward : Node {
  Shape input_shape;
  DType input_dtype = DType::F32;  // the gradient's dtype (g is sum_dtype of it)
  std::vector<int64_t> dims;  // sorted ascending, wrapped
  double scale;               // 1 for sum, 1/count for mean
  const char* name() const override { return "SumBackward"; }
  std::vector<Tensor> apply(const Tensor& g) override {
    // Re-insert the reduced dims as size 1, then expand them back one by one.
    Shape kept = input_shape;
    for (auto d : dims) kept[static_cast<size_t>(d)] = 1;
    Tensor grad = g.reshape(kept);
    Shape cur = kept;
    // In g's dtype until the last expansion, which writes the input's dtype.
    for (size_t i = 0; i < dims.size(); ++i) {
      int64_t d = dims[i];
      cur[static_cast<size_t>(d)] = input_shape[static_cast<size_t>(d)];
      const DType out_dtype = i + 1 == dims.size() ? input_dtype : grad.dtype();
      grad = expand_one_dim(grad, cur, d, i == 0 ? scale : 1.0, out_dtype);
    }
    if (dims.empty()) grad = mul(grad, scale).to(input_dtype);
    return {grad};
  }
};

Tensor reduce(const Tensor& x, std::vector<int64_t> dims, bool keepdim, bool is_mean,
              const char* op) {
  int64_t rank = x.dim();
  for (auto& d : dims) d = wrap_dim(d, rank, op);
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  int64_t count = 1;
  for (auto d : dims) count *= x.size(d);

  Tensor out;
  {
    NoGradGuard no_grad;  // the pieces below are one op for autograd
    out = x;
    for (auto it = dims.rbegin(); it != dims.rend(); ++it) out = sum_one_dim(out, *it);
    if (dims.empty()) out = is_low_precision(out.dtype()) ? out.to(DType::F32) : out.clone();
    if (is_mean) out = mul(out, 1.0 / static_cast<double>(count));
    Shape out_shape;
    for (int64_t i = 0; i < rank; ++i) {
      bool reduced = std::binary_search(dims.begin(), dims.end(), i);
      if (!reduced) out_shape.push_back(x.size(i));
      else if (keepdim) out_shape.push_back(1);
    }
    out = out.reshape(out_shape);
  }
  if (any_requires_grad({&x})) {
    auto node = std::make_shared<SumBackward>();
    node->input_shape = x.shape();
    node->input_dtype = x.dtype();
    node->dims = dims;
    node->scale = is_mean ? 1.0 / static_cast<double>(count) : 1.0;
    set_history(out, node, {x});
  }
  return out;
}

std::vector<int64_t> all_dims(const Tensor& x) {
  std::vector<int64_t> d(static_cast<size_t>(x.dim()));
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<int64_t>(i);
  return d;
}

}  // namespace

// A reduction over every element does not care about their order: a channels-last tensor is
// reduced as the flat vector of its bytes (no copy). One over some dimensions indexes by the
// shape, so a channels-last input is made contiguous first (a counted conversion).
namespace {
Tensor flat_if_any_format(const Tensor& a) {
  return a.is_channels_last() ? reinterpret_view(a, {a.numel()}, MemoryFormat::Contiguous) : a;
}
}  // namespace

Tensor sum(const Tensor& a) {
  const Tensor flat = flat_if_any_format(a);
  return reduce(flat, all_dims(flat), false, false, "sum");
}
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce(a.contiguous(), dims, keepdim, false, "sum");
}
Tensor mean(const Tensor& a) {
  const Tensor flat = flat_if_any_format(a);
  return reduce(flat, all_dims(flat), false, true, "mean");
}
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce(a.contiguous(), dims, keepdim, true, "mean");
}

Tensor argmax(const Tensor& a, int64_t dim) {
  int64_t d = wrap_dim(dim, a.dim(), "argmax");
  Shape out_shape = a.shape();
  out_shape.erase(out_shape.begin() + d);
  Tensor out = Tensor::empty(out_shape, DType::I64, a.device());
  DimSplit s = split_at(a.shape(), d);
  run_kernel("argmax", a.device(), a.dtype(), [&](auto backend, auto tag) {
    using T = typename decltype(tag)::type;
    argmax_dim(backend, a.data<T>(), out.data<int64_t>(), s.outer, s.len, s.inner);
  });
  return out;
}

}  // namespace kiln
