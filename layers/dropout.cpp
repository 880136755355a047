// dropout.cpp: the dropout op (CPU kernels, autograd node) and the Dropout module. The CUDA
// kernels are in dropout_cuda.cu (declared in dropout_kernels.h).
#include "layers/dropout.h"

#include <cstdint>
#include <memory>
#include <sstream>
#include <vector>

#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/error.h"
#include "layers/dropout_kernels.h"

namespace kiln {

namespace {

void check_p(double p) {
  if (!(p >= 0.0 && p < 1.0))
    throw Error(detail::str("dropout: p must be in [0, 1), got ", p,
                            " (p is the probability of zeroing an element)"),
                ErrorKind::Usage);
}

}  // namespace

// ---- CPU kernels --------------------------------------------------------------------------
// One Philox call yields 4 numbers, so the loops run over groups of 4 elements: group j holds
// elements 4j..4j+3 and uses counter base + j, exactly what philox_u32(seed, base, i) reads,
// so dropout_keep(r.v[k], p) below is dropout_keep(seed, base, 4j + k, p) without 4x the work.
// The mask is applied as a multiplication by 0 or scale, not a branch: keep/drop is a coin flip
// the branch predictor cannot learn (the branchy loop was 5x slower), and x * 0 keeps NaN/Inf
// visible as PyTorch's input * mask does.

namespace cpu {

// x, y are (count <= 4): y[k] = x[k] * (keep(k) ? scale : 0), with the 4 numbers of one counter.
template <typename T>
static inline void mask_group(const T* x, T* y, int64_t count, const PhiloxOut& r, float p,
                              T scale) {
  for (int64_t k = 0; k < count; ++k) y[k] = x[k] * (dropout_keep(r.v[k], p) ? scale : T(0));
}

// x, y are (n): y[i] = keep(i) ? x[i] * scale : 0.
template <typename T>
void dropout_forward(Backend, const T* x, T* y, int64_t n, float p, T scale, uint64_t seed,
                     uint64_t base, const uint64_t* base_offset) {
  // Only a CUDA kernel inside a captured graph reads its base from the device.
  KILN_CHECK(base_offset == nullptr, "dropout: a CPU tensor inside a CUDA graph capture");
  const int64_t full = n / 4;  // complete groups; the last n % 4 elements form a partial one
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < full; ++j)
    mask_group(x + 4 * j, y + 4 * j, 4, philox4x32_10(seed, base + static_cast<uint64_t>(j)), p,
               scale);
  if (n % 4 != 0)
    mask_group(x + 4 * full, y + 4 * full, n % 4,
               philox4x32_10(seed, base + static_cast<uint64_t>(full)), p, scale);
}

// gy, gx are (n): gx[i] = keep(i) ? gy[i] * scale : 0 (the same mask, recomputed).
template <typename T>
void dropout_backward(Backend, const T* gy, T* gx, int64_t n, float p, T scale, uint64_t seed,
                      uint64_t base, const uint64_t* base_offset) {
  dropout_forward(Backend{}, gy, gx, n, p, scale, seed, base, base_offset);
}

template void dropout_forward<float>(Backend, const float*, float*, int64_t, float, float,
                                     uint64_t, uint64_t,
                                     const uint64_t*);
template void dropout_forward<double>(Backend, const double*, double*, int64_t, float, double,
                                      uint64_t, uint64_t,
                                     const uint64_t*);
template void dropout_backward<float>(Backend, const float*, float*, int64_t, float, float,
                                      uint64_t, uint64_t,
                                     const uint64_t*);
template void dropout_backward<double>(Backend, const double*, double*, int64_t, float, double,
                                       uint64_t, uint64_t,
                                     const uint64_t*);

}  // namespace cpu

namespace {

enum class Pass { Forward, Backward };

// Applies the mask of (seed, base) to `in` (x in forward, grad_out in backward).
Tensor apply_mask(Pass pass, const Tensor& in, float p, double scale,
                  const Generator::Range& range) {
  const uint64_t seed = range.seed, base = range.base;
  const uint64_t* base_offset = range.device_offset;
  const char* op = pass == Pass::Forward ? "dropout" : "dropout_backward";
  Tensor out = Tensor::empty(in.shape(), in.dtype(), in.device());
  run_kernel(op, in.device(), in.dtype(), [&](auto backend, auto tag) {
    using T = typename decltype(tag)::type;
    if (pass == Pass::Backward)
      dropout_backward(backend, in.data<T>(), out.data<T>(), in.numel(), p, T(scale), seed, base,
                       base_offset);
    else
      dropout_forward(backend, in.data<T>(), out.data<T>(), in.numel(), p, T(scale), seed, base,
                      base_offset);
  });
  return out;
}

struct DropoutBackward : Node {
  Generator::Range range{0, 0};
  float p = 0;
  double scale = 1;
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    return {apply_mask(Pass::Backward, grad_out, p, scale, range)};
  }
  const char* name() const override { return "DropoutBackward"; }
};

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  check_p(p);
  KILN_CHECK(x.defined(), "dropout: the input is undefined");
  KILN_CHECK(is_floating(x.dtype()), "dropout: expected an f32 or f64 tensor, got ", x.str());
  if (!training || p == 0.0) return x;
  const Generator::Range range = gen.reserve_range(static_cast<uint64_t>(x.numel()));
  const float pf = static_cast<float>(p);
  const double scale = 1.0 / (1.0 - p);
  Tensor y = apply_mask(Pass::Forward, x, pf, scale, range);
  if (any_requires_grad({&x})) {
    auto node = std::make_shared<DropoutBackward>();
    node->range = range;
    node->p = pf;
    node->scale = scale;
    set_history(y, node, {x});
  }
  return y;
}

Dropout::Dropout(double p, Generator& gen) : p_(p), gen_(&gen) { check_p(p); }

Tensor Dropout::forward(const Tensor& x) { return dropout(x, p_, is_training(), *gen_); }

std::string Dropout::extra_repr() const {
  std::ostringstream os;
  os << "p=" << p_;
  return os.str();
}

}  // namespace kiln
