// ops_matmul_lowp.cpp: matmul under autocast: bf16/f16 operands, f32 sums and f32 results. The
// kernels are twins (engine/dispatch.h): gemm_lowp (ours) and gemm_lowp_vendor (oneDNN, cuBLAS),
// in engine/gemm_lowp_cpu.h and engine/ops_cuda.h; gemm_impl (engine/impl.h) says which runs.
#include "engine/ops_matmul_lowp.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/gemm_lowp_cpu.h"
#include "engine/impl.h"
#include "engine/ops_cuda.h"
#include "engine/ops.h"

namespace kiln {

namespace {
const uint16_t* bits(const Tensor& t) { return static_cast<const uint16_t*>(t.raw_data()); }
}  // namespace

Tensor matmul_lowp_product(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  KILN_CHECK(is_low_precision(a.dtype()) && a.dtype() == b.dtype(),
             "matmul_lowp_product: expected two bf16 or two f16 tensors, got ", a.str(), " and ",
             b.str());
  check_same_device(a, b, "matmul");
  const int64_t m = ta ? a.size(1) : a.size(0), k = ta ? a.size(0) : a.size(1);
  const int64_t n = tb ? b.size(0) : b.size(1);
  KILN_CHECK(k == (tb ? b.size(1) : b.size(0)), "matmul: inner dimensions differ: ",
             shape_str(a.shape()), ta ? "^T" : "", " x ", shape_str(b.shape()), tb ? "^T" : "");
  Tensor c = Tensor::empty({m, n}, DType::F32, a.device());
  const Impl impl = gemm_impl(a.device(), a.dtype());
  on_device("matmul", a.device(), [&](auto backend) {
    if (impl == Impl::Vendor)
      gemm_lowp_vendor(backend, a.dtype(), ta, tb, m, n, k, bits(a), bits(b), c.data<float>());
    else
      gemm_lowp(backend, a.dtype(), ta, tb, m, n, k, bits(a), bits(b), c.data<float>());
  });
  return c;
}

namespace {

struct MatmulAutocastBackward : Node {
  bool ta, tb;
  MatmulAutocastBackward(bool a, bool b) : ta(a), tb(b) {}
  const char* name() const override { return "MatmulAutocastBackward"; }
  SplitMode split_mode() const override { return SplitMode::ByEdges; }  // one GEMM per edge
  std::vector<Tensor> apply(const Tensor& g32) override {
    const Tensor& a = saved[0];  // low precision
    const Tensor& b = saved[1];
    const Tensor g = g32.to(a.dtype());
    Tensor ga, gb;
    // The same identities as MatmulBackward (ops_matmul.cpp), on the rounded operands.
    if (next[0]) ga = ta ? matmul_lowp_product(b, g, tb, true) : matmul_lowp_product(g, b, false, !tb);
    if (next[1]) gb = tb ? matmul_lowp_product(g, a, true, ta) : matmul_lowp_product(a, g, !ta, false);
    // Each gradient in its input's dtype: f32 for f32 inputs, 16-bit for a 16-bit activation.
    if (ga.defined() && ga.dtype() != a_dtype) ga = ga.to(a_dtype);
    if (gb.defined() && gb.dtype() != b_dtype) gb = gb.to(b_dtype);
    return {ga, gb};
  }
  DType a_dtype = DType::F32, b_dtype = DType::F32;  // of the inputs matmul was given
};

}  // namespace

Tensor matmul_autocast(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  const Tensor a_low = autocast_cast(a);
  const Tensor b_low = autocast_cast(b);
  Tensor c = matmul_lowp_product(a_low, b_low, trans_a, trans_b);
  if (any_requires_grad({&a, &b})) {
    auto node = std::make_shared<MatmulAutocastBackward>(trans_a, trans_b);
    node->saved = {a_low, b_low};
    node->a_dtype = a.dtype();
    node->b_dtype = b.dtype();
    set_history(c, node, {a, b});
  }
  return c;
}

}  // namespace kiln
