// ops_matmul.cpp: matrix product and transpose, with their gradients. The product's kernels are
// twins (engine/dispatch.h): gemm (OpenBLAS on the CPU, our own GEMM on CUDA) and, on CUDA,
// gemm_vendor (cuBLAS); gemm_impl (engine/impl.h) says which runs.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/cuda/context.h"
#include "engine/dispatch.h"
#include "engine/impl.h"
#include "engine/ops.h"
#include "engine/ops_cpu.h"
#include "engine/ops_cuda.h"
#include "engine/ops_matmul_lowp.h"

namespace kiln {

namespace {

Tensor matmul_forward(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  int64_t m = ta ? a.size(1) : a.size(0);
  int64_t k = ta ? a.size(0) : a.size(1);
  int64_t kb = tb ? b.size(1) : b.size(0);
  int64_t n = tb ? b.size(0) : b.size(1);
  KILN_CHECK(k == kb, "matmul: inner dimensions differ: ", shape_str(a.shape()),
             ta ? "^T" : "", " x ", shape_str(b.shape()), tb ? "^T" : "");
  check_same_device(a, b, "matmul");
  Tensor c = Tensor::empty({m, n}, a.dtype(), a.device());
  const Impl impl = gemm_impl(a.device(), a.dtype());
  run_kernel("matmul", a.device(), a.dtype(), [&](auto backend, auto tag) {
    using T = typename decltype(tag)::type;
    const T *ap = a.data<T>(), *bp = b.data<T>();
    T* cp = c.data<T>();
    if constexpr (std::is_same_v<decltype(backend), cuda::Backend>) {  // the CPU has one GEMM
      if (impl == Impl::Vendor) {
        gemm_vendor(backend, ta, tb, m, n, k, ap, bp, cp);
        return;
      }
    }
    gemm(backend, ta, tb, m, n, k, ap, bp, cp);
  });
  return c;
}

struct MatmulBackward : Node {
  bool ta, tb;
  MatmulBackward(bool a, bool b) : ta(a), tb(b) {}
  const char* name() const override { return "MatmulBackward"; }
  SplitMode split_mode() const override { return SplitMode::ByEdges; }  // one GEMM per edge
  std::vector<Tensor> apply(const Tensor& g) override {
    const Tensor& a = saved[0];
    const Tensor& b = saved[1];
    Tensor ga, gb;
    // C = op(A) op(B).  dop(A) = dC op(B)^T,  dop(B) = op(A)^T dC; transpose back if needed.
    if (next[0]) ga = ta ? matmul_forward(b, g, tb, true) : matmul_forward(g, b, false, !tb);
    if (next[1]) gb = tb ? matmul_forward(g, a, true, ta) : matmul_forward(a, g, !ta, false);
    return {ga, gb};
  }
};

struct TransposeBackward : Node {
  int64_t d0, d1;
  TransposeBackward(int64_t a, int64_t b) : d0(a), d1(b) {}
  const char* name() const override { return "TransposeBackward"; }
  std::vector<Tensor> apply(const Tensor& g) override { return {transpose(g, d0, d1)}; }
};

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  KILN_CHECK(a.dim() == 2 && b.dim() == 2, "matmul needs 2-D tensors, got ", shape_str(a.shape()),
             " and ", shape_str(b.shape()));
  check_same_device(a, b, "matmul");
  // Under autocast a may be a 16-bit activation multiplied by an f32 weight.
  if (autocast_applies(a) && autocast_applies(b)) return matmul_autocast(a, b, trans_a, trans_b);
  check_same_dtype(a, b, "matmul");
  Tensor c = matmul_forward(a, b, trans_a, trans_b);
  if (any_requires_grad({&a, &b})) {
    auto node = std::make_shared<MatmulBackward>(trans_a, trans_b);
    node->saved = {a.detach(), b.detach()};
    set_history(c, node, {a, b});
  }
  return c;
}

Tensor transpose(const Tensor& a, int64_t dim0, int64_t dim1) {
  int64_t d0 = wrap_dim(dim0, a.dim(), "transpose");
  int64_t d1 = wrap_dim(dim1, a.dim(), "transpose");
  Shape out_shape = a.shape();
  std::swap(out_shape[static_cast<size_t>(d0)], out_shape[static_cast<size_t>(d1)]);
  Tensor out = Tensor::empty(out_shape, a.dtype(), a.device());
  // A copy of bytes: the kernels are instantiated per element size, so every dtype moves.
  on_device("transpose", a.device(), [&](auto backend) {
    auto run = [&](auto word) {
      using W = decltype(word);
      transpose(backend, static_cast<const W*>(a.raw_data()), static_cast<W*>(out.raw_data()),
                a.shape().data(), a.dim(), d0, d1);
    };
    switch (dtype_size(a.dtype())) {
      case 1: run(uint8_t{}); break;
      case 2: run(uint16_t{}); break;
      case 4: run(uint32_t{}); break;
      case 8: run(uint64_t{}); break;
      default: throw Error(detail::str("transpose: no kernel for ", dtype_name(a.dtype())));
    }
  });
  if (any_requires_grad({&a})) set_history(out, std::make_shared<TransposeBackward>(d0, d1), {a});
  return out;
}

}  // namespace kiln
