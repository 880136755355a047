// ops_softmax.cpp: softmax and log-softmax over one dim, max-subtracted for stability.
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/autograd.h"
#include "engine/cuda/context.h"
#include "engine/dim_split.h"
#include "engine/dispatch.h"
#include "engine/ops.h"
#include "engine/ops_cpu.h"
#include "engine/ops_cuda.h"

namespace kiln {

namespace {

struct SoftmaxBackward : Node {
  int64_t dim;
  bool log;
  SoftmaxBackward(int64_t d, bool l) : dim(d), log(l) {}
  const char* name() const override { return log ? "LogSoftmaxBackward" : "SoftmaxBackward"; }
  std::vector<Tensor> apply(const Tensor& g) override {
    const Tensor& y = saved[0];
    Tensor gx = Tensor::empty(g.shape(), g.dtype(), g.device());
    DimSplit s = split_at(g.shape(), dim);
    check_same_device(g, y, name());
    run_kernel(name(), g.device(), g.dtype(), [&](auto backend, auto tag) {
      using T = typename decltype(tag)::type;
      softmax_backward(backend, g.data<T>(), y.data<T>(), gx.data<T>(), s.outer, s.len, s.inner,
                       log);
    });
    return {gx};
  }
};

Tensor softmax_impl(const Tensor& x, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  int64_t d = wrap_dim(dim, x.dim(), op);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  DimSplit s = split_at(x.shape(), d);
  run_kernel(op, x.device(), x.dtype(), [&](auto backend, auto tag) {
    using T = typename decltype(tag)::type;
    softmax(backend, x.data<T>(), y.data<T>(), s.outer, s.len, s.inner, log);
  });
  if (any_requires_grad({&x})) {
    auto node = std::make_shared<SoftmaxBackward>(d, log);
    node->saved = {y.detach()};
    set_history(y, node, {x});
  }
  return y;
}

}  // namespace

Tensor softmax(const Tensor& a, int64_t dim) { return softmax_impl(a, dim, false); }
Tensor log_softmax(const Tensor& a, int64_t dim) { return softmax_impl(a, dim, true); }

}  // namespace kiln
