// conv2d_lowp.cpp: conv2d under autocast (engine/autocast.h): x and w rounded to bf16 or f16,
// the products summed in f32, y and every gradient f32; the bias stays f32.
//
// The kernels: where a vendor library has a low-precision convolution (oneDNN bf16 on the CPU,
// cuDNN bf16/f16 on CUDA) it runs on the rounded tensors directly; otherwise (the hand kernels,
// f16 on the CPU) the rounded values are widened back to f32 (exactly) and the f32 kernels run
// on them. Both compute the same thing, sums of products of bf16/f16 values in f32;
// the first reads half the bytes and, on hardware with bf16 dot-product or tensor-core units,
// multiplies several times faster.
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"
#include "layers/conv2d_dispatch.h"

namespace kiln {

namespace {

Tensor widen(const Tensor& t) { return t.defined() ? t.to(DType::F32) : Tensor(); }

const uint16_t* bits(const Tensor& t) {
  return t.defined() ? static_cast<const uint16_t*>(t.raw_data()) : nullptr;
}
float* f32_or_null(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

// y = conv(x_low, w_low) + b, y f32. Vendor: oneDNN's bf16 convolution on the CPU (where it
// has one for the dtype) and cuDNN's on CUDA.
void forward_lowp(const Tensor& x_low, const Tensor& w_low, const Tensor& b, Tensor& y,
                  const ConvGeometry& g, Impl impl) {
  const float* bp = b.defined() ? b.data<float>() : nullptr;
  if (impl == Impl::Vendor) {
    bool done = false;
    on_device("conv2d", x_low.device(), [&] {
      done = conv2d_forward_dnnl_lowp(x_low.dtype(), bits(x_low), bits(w_low), bp,
                                      y.data<float>(), g);
    }, [&] {
      cuda::conv2d_forward_cudnn_lowp(x_low.dtype(), bits(x_low), bits(w_low), bp,
                                      y.data<float>(), g);
      done = true;
    });
    if (done) return;
  }
  conv_detail::run_forward(widen(x_low), widen(w_low), b, y, g, impl);
}

void backward_lowp(const Tensor& x_low, const Tensor& w_low, const Tensor& dy_low, Tensor& dx,
                   Tensor& dw, Tensor& db, const ConvGeometry& g, Impl impl) {
  // oneDNN computes db only together with dw (it needs x); a lone db (a frozen weight, a
  // trained bias) is a plain sum over dy.
  const bool lone_db = db.defined() && !dw.defined();
  if (impl == Impl::Vendor) {
    bool done = false;
    on_device("conv2d_backward", dy_low.device(), [&] {
      done = conv2d_backward_dnnl_lowp(dy_low.dtype(), bits(x_low), bits(dy_low), bits(w_low),
                                       f32_or_null(dx), f32_or_null(dw),
                                       lone_db ? nullptr : f32_or_null(db), g);
      // dy is (N, K, P, Q), or (N, K/16, P, Q, 16) blocked: sum all but the channel dims.
      if (done && lone_db) db.copy_(sum(widen(dy_low), {0, 2, 3}).reshape({g.k}));
    }, [&] {
      cuda::conv2d_backward_cudnn_lowp(dy_low.dtype(), bits(x_low), bits(dy_low), bits(w_low),
                                       f32_or_null(dx), f32_or_null(dw), f32_or_null(db), g);
      done = true;
    });
    if (done) return;
  }
  conv_detail::run_backward(widen(x_low), widen(w_low), widen(dy_low), dx, dw, db, g, impl);
}

struct Conv2dAutocastBackward : Node {
  ConvGeometry g{};
  Impl impl = Impl::Hand;
  bool has_bias = false;
  // saved = {x_low or undefined, w_low or undefined}: x for dw, w for dx.

  std::vector<Tensor> apply(const Tensor& grad_out) override {
    const Shape y_shape = conv_detail::activation_shape(g.n, g.k, g.p, g.q, g.y_blocked);
    KILN_CHECK(grad_out.shape() == y_shape, "conv2d backward: the output gradient has shape ",
               shape_str(grad_out.shape()), ", expected ", shape_str(y_shape));
    const Device dev = grad_out.device();
    Tensor dx, dw, db;
    if (next[0])
      dx = Tensor::empty(conv_detail::activation_shape(g.n, g.c, g.h, g.w, g.x_blocked),
                         DType::F32, dev);
    if (next[1]) dw = Tensor::empty({g.k, g.c, g.r, g.s}, DType::F32, dev);
    if (has_bias && next[2]) db = Tensor::empty({g.k}, DType::F32, dev);
    if (g.n == 0) {
      if (dw.defined()) dw.zero_();
      if (db.defined()) db.zero_();
    } else {
      const DType low = saved[0].defined() ? saved[0].dtype() : saved[1].dtype();
      backward_lowp(saved[0], saved[1], grad_out.to(low), dx, dw, db, g, impl);
    }
    std::vector<Tensor> grads{dx, dw};
    if (has_bias) grads.push_back(db);
    return grads;
  }
  const char* name() const override { return "Conv2dAutocastBackward"; }
};

}  // namespace

Tensor conv2d_autocast(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeometry& g) {
  const Tensor x_low = autocast_cast(x);
  const Tensor w_low = autocast_cast(w);
  const Impl impl = conv_impl(x.device(), autocast_dtype());
  Tensor y = Tensor::empty(conv_detail::activation_shape(g.n, g.k, g.p, g.q, g.y_blocked),
                           DType::F32, x.device());
  if (g.n > 0) forward_lowp(x_low, w_low, b, y, g, impl);
  const bool with_b = b.defined();
  if (with_b ? any_requires_grad({&x, &w, &b}) : any_requires_grad({&x, &w})) {
    auto node = std::make_shared<Conv2dAutocastBackward>();
    node->g = g;
    node->impl = impl;
    node->has_bias = with_b;
    node->saved = {w.requires_grad() ? x_low : Tensor(), x.requires_grad() ? w_low : Tensor()};
    std::vector<Tensor> inputs{x, w};
    if (with_b) inputs.push_back(b);
    set_history(y, node, inputs);
  }
  return y;
}

}  // namespace kiln
