// memory_format.cpp: Tensor::to(MemoryFormat) and the views between formats.
//
// NCHW -> NHWC is a batch of matrix transposes: each image's (C, H * W) matrix becomes
// (H * W, C). So the conversion is transpose(1, 2) of the (N, C, H * W) view, and its result's
// bytes, relabelled, are the channels-last tensor. Its gradient is the conversion back, so a
// conversion in forward is one in backward too, and both are counted.
#include "engine/memory_format.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/ops.h"

namespace kiln {

namespace {

std::atomic<int64_t> g_conversions{0};

// The gradient of x.to(format): the incoming gradient brought back into x's format.
struct ToMemoryFormatBackward : Node {
  MemoryFormat source;
  explicit ToMemoryFormatBackward(MemoryFormat s) : source(s) {}
  const char* name() const override { return "ToMemoryFormatBackward"; }
  std::vector<Tensor> apply(const Tensor& g) override { return {g.to(source)}; }
};

// x (contiguous, 4-D) reordered into `target`, or a channels-last x into contiguous; no
// autograd history.
Tensor reorder(const Tensor& x, MemoryFormat target) {
  NoGradGuard no_grad;
  const int64_t n = x.size(0), c = x.size(1), hw = x.size(2) * x.size(3);
  if (target == MemoryFormat::ChannelsLast) {
    // (N, C, H * W) -> (N, H * W, C): the bytes of (N, H, W, C).
    return reinterpret_view(transpose(x.detach().reshape({n, c, hw}), 1, 2), x.shape(),
                            MemoryFormat::ChannelsLast);
  }
  return transpose(reinterpret_view(x.detach(), {n, hw, c}, MemoryFormat::Contiguous), 1, 2)
      .reshape(x.shape());
}

// The gradient of reinterpret_view: the incoming gradient (the view's shape, any format) is
// brought into the view's format, then read back with the input's shape and format.
struct ReinterpretViewBackward : Node {
  Shape input_shape, view_shape;
  MemoryFormat input_format, view_format;
  const char* name() const override { return "ReinterpretViewBackward"; }
  std::vector<Tensor> apply(const Tensor& g) override {
    return {reinterpret_view(g.to(view_format), input_shape, input_format)};
  }
};

}  // namespace

const char* memory_format_name(MemoryFormat f) {
  return f == MemoryFormat::ChannelsLast ? "channels_last" : "contiguous";
}

bool formats_coincide(const Tensor& x) {
  return x.dim() == 4 && (x.size(1) == 1 || x.size(2) * x.size(3) == 1);
}

Tensor reinterpret_view(const Tensor& x, const Shape& shape, MemoryFormat format) {
  KILN_CHECK(x.defined(), "reinterpret_view of an undefined tensor");
  KILN_CHECK(shape_numel(shape) == x.numel(), "reinterpret_view: ", x.str(), " has ", x.numel(),
             " elements, the shape ", shape_str(shape), " ", shape_numel(shape));
  KILN_CHECK(format == MemoryFormat::Contiguous || shape.size() == 4, "reinterpret_view: the ",
             memory_format_name(format), " format needs a 4-D shape, got ", shape_str(shape));
  Tensor out = Tensor::from_storage(x.impl()->storage, shape, x.dtype(), x.impl()->offset);
  out.impl()->memory_format = format;
  if (any_requires_grad({&x})) {
    auto node = std::make_shared<ReinterpretViewBackward>();
    node->input_shape = x.shape();
    node->view_shape = shape;
    node->input_format = x.memory_format();
    node->view_format = format;
    set_history(out, node, {x});
  }
  return out;
}

Tensor relabel_memory_format(const Tensor& x, MemoryFormat format) {
  KILN_CHECK(x.memory_format() == format || formats_coincide(x), "relabel_memory_format: ",
             x.str(), " is not the same bytes in the ", memory_format_name(format),
             " format; convert it with to(MemoryFormat)");
  return x.memory_format() == format ? x : reinterpret_view(x, x.shape(), format);
}

int64_t memory_format_conversions() { return g_conversions.load(std::memory_order_relaxed); }

Tensor Tensor::to(MemoryFormat target) const {
  KILN_CHECK(defined(), "to(", memory_format_name(target), ") of an undefined tensor");
  if (memory_format() == target) return *this;
  KILN_CHECK(dim() == 4, "to(", memory_format_name(target), "): ", str(),
             " is not 4-D (N, C, H, W); only activations and convolution weights have a "
             "channels-last format");
  if (formats_coincide(*this)) return relabel_memory_format(*this, target);
  g_conversions.fetch_add(1, std::memory_order_relaxed);
  Tensor out = reorder(*this, target);
  if (any_requires_grad({this}))
    set_history(out, std::make_shared<ToMemoryFormatBackward>(memory_format()), {*this});
  return out;
}

}  // namespace kiln
