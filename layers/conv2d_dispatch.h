// conv2d_dispatch.h: what conv2d's op (conv2d.cpp) and its autocast path (conv2d_lowp.cpp)
// share, internal to layers/: running the kernels the implementation names, and the one
// backward node. layers/conv2d.h maps the family.
#pragma once

#include <cstdint>

#include "engine/impl.h"
#include "engine/tensor.h"
#include "layers/conv2d_kernels.h"

namespace kiln {

namespace conv_detail {

// y = conv(x, w) + b on x's device with `impl` (f32 or f64); y allocated by the caller, b may
// be undefined.
void run_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y,
                 const ConvGeometry& g, Impl impl);

// The gradients dx, dw, db that are defined (allocated by the caller); x is read for dw, w for
// dx. With the CPU's Vendor (oneDNN), db only together with dw.
void run_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor& dw,
                  Tensor& db, const ConvGeometry& g, Impl impl);

// The same with bf16/f16 x, w (and dy), f32 b, dw and db, and y and dx f32 or, with g.y_lowp,
// in the 16-bit dtype (conv2d_lowp.cpp).
void run_forward_lowp(const Tensor& x_low, const Tensor& w_low, const Tensor& b, Tensor& y,
                      const ConvGeometry& g, Impl impl);
void run_backward_lowp(const Tensor& x_low, const Tensor& w_low, const Tensor& dy_low,
                       Tensor& dx, Tensor& dw, Tensor& db, const ConvGeometry& g, Impl impl);

// Gives y the backward node when x, w or b needs a gradient. x_op and w_op are the operands the
// forward multiplied (detached x and w, or their bf16/f16 copies under autocast); the node saves
// x_op only if w needs a gradient, w_op only if x does.
void record_backward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b,
                     const Tensor& x_op, const Tensor& w_op, const ConvGeometry& g, Impl impl,
                     bool autocast);

// (N, C, H, W), or (N, C/16, H, W, 16) in the blocked layout.
Shape activation_shape(int64_t n, int64_t c, int64_t h, int64_t w, bool blocked);

}  // namespace conv_detail

// conv2d under autocast (engine/autocast.h): w, b f32 and checked, x f32 or a 16-bit
// activation of the guard's dtype, g computed; x NCHW or channels-last, w KCRS or KRSC
// (g.w_nhwc) in the order the kernels take (conv2d.cpp). y is autocast_output_dtype().
Tensor conv2d_autocast(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeometry& g);

}  // namespace kiln
