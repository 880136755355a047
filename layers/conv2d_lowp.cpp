// conv2d_lowp.cpp: conv2d under autocast (engine/autocast.h): x and w rounded to bf16 or f16,
// the products summed in f32; the bias, dw and db stay f32. y and dx are f32, or under
// AutocastOutputs::LowPrecision 16-bit (g.y_lowp: each f32 sum rounded once on store), and
// then a 16-bit x arrives as it is, with no rounding of its own. The backward node is conv2d's
// own (conv2d.cpp); layers/conv2d.h maps the family.
//
// The kernels: where a vendor library has a low-precision convolution (oneDNN bf16 on the CPU,
// cuDNN bf16/f16 on CUDA) it runs on the rounded tensors directly; otherwise (the hand kernels,
// f16 on the CPU) the rounded values are widened back to f32 (exactly) and the f32 kernels run
// on them, into f32 results rounded afterwards for a 16-bit y or dx. Both compute the same
// thing, sums of products of bf16/f16 values in f32; the first reads half the bytes and, on
// hardware with bf16 dot-product or tensor-core units, multiplies several times faster.
#include <cstdint>

#include "engine/autocast.h"
#include "engine/dispatch.h"
#include "layers/conv2d_dispatch.h"

namespace kiln {

namespace {

Tensor widen(const Tensor& t) { return t.defined() ? t.to(DType::F32) : Tensor(); }

// In any memory format: the geometry says which (g.x_nhwc, g.y_nhwc).
const uint16_t* bits(const Tensor& t) {
  return t.defined() ? static_cast<const uint16_t*>(t.raw_data_any_format()) : nullptr;
}
void* raw_or_null(const Tensor& t) { return t.defined() ? t.raw_data_any_format() : nullptr; }
float* f32_or_null(const Tensor& t) { return t.defined() ? t.data_any_format<float>() : nullptr; }

// An f32 tensor for the f32 kernels to write a 16-bit output into (`out` itself when it is
// f32), and the copy back that rounds each element once.
Tensor f32_target(const Tensor& out) {
  if (!out.defined() || out.dtype() == DType::F32) return out;
  return Tensor::empty(out.shape(), DType::F32, out.device(), out.memory_format());
}
void round_into(Tensor& out, const Tensor& f32) {
  if (out.defined() && !out.same(f32)) out.copy_(f32);
}

}  // namespace

namespace conv_detail {

// Vendor: oneDNN's bf16 convolution on the CPU (where it has one for the dtype: the twin says
// whether it ran) and cuDNN's on CUDA; otherwise the f32 kernels of `impl` on the widened values.
void run_forward_lowp(const Tensor& x_low, const Tensor& w_low, const Tensor& b, Tensor& y,
                      const ConvGeometry& g, Impl impl) {
  const float* bp = b.defined() ? b.data<float>() : nullptr;
  if (impl == Impl::Vendor) {
    bool done = false;
    on_device("conv2d", x_low.device(), [&](auto backend) {
      done = conv2d_forward_lowp_vendor(backend, x_low.dtype(), bits(x_low), bits(w_low), bp,
                                        raw_or_null(y), g);
    });
    if (done) return;
  }
  Tensor y32 = f32_target(y);
  run_forward(widen(x_low), widen(w_low), b, y32, g, impl);
  round_into(y, y32);
}

void run_backward_lowp(const Tensor& x_low, const Tensor& w_low, const Tensor& dy_low,
                       Tensor& dx, Tensor& dw, Tensor& db, const ConvGeometry& g, Impl impl) {
  if (impl == Impl::Vendor) {
    bool done = false;
    on_device("conv2d_backward", dy_low.device(), [&](auto backend) {
      done = conv2d_backward_lowp_vendor(backend, dy_low.dtype(), bits(x_low), bits(dy_low),
                                         bits(w_low), raw_or_null(dx), f32_or_null(dw),
                                         f32_or_null(db), g);
    });
    if (done) return;
  }
  Tensor dx32 = f32_target(dx);
  run_backward(widen(x_low), widen(w_low), widen(dy_low), dx32, dw, db, g, impl);
  round_into(dx, dx32);
}

}  // namespace conv_detail

Tensor conv2d_autocast(const Tensor& x, const Tensor& w, const Tensor& b,
                       const ConvGeometry& geometry) {
  const Tensor x_low = autocast_cast(x);
  const Tensor w_low = autocast_cast(w);
  const Impl impl = conv_impl(x.device(), autocast_dtype());
  ConvGeometry g = geometry;
  const DType y_dtype = autocast_output_dtype();
  g.y_lowp = y_dtype != DType::F32;
  Tensor y = Tensor::empty(conv_detail::activation_shape(g.n, g.k, g.p, g.q, g.y_blocked),
                           y_dtype, x.device(), x.memory_format());
  if (g.n > 0) conv_detail::run_forward_lowp(x_low, w_low, b, y, g, impl);
  conv_detail::record_backward(y, x, w, b, x_low, w_low, g, impl, /*autocast=*/true);
  return y;
}

}  // namespace kiln
