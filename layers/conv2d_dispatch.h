// conv2d_dispatch.h: conv2d's device and implementation switch (internal to layers/), shared by
// the f32/f64 op (conv2d.cpp) and its autocast path (conv2d_lowp.cpp).
#pragma once

#include <cstdint>

#include "engine/impl.h"
#include "engine/tensor.h"
#include "layers/conv2d_kernels.h"

namespace kiln {

namespace conv_detail {

// y = conv(x, w) + b on x's device with `impl`; y allocated by the caller, b may be undefined.
void run_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y,
                 const ConvGeometry& g, Impl impl);

// The gradients dx, dw, db that are defined (allocated by the caller); x is read for dw, w for dx.
void run_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor& dw,
                  Tensor& db, const ConvGeometry& g, Impl impl);

// (N, C, H, W), or (N, C/16, H, W, 16) in the blocked layout.
Shape activation_shape(int64_t n, int64_t c, int64_t h, int64_t w, bool blocked);

}  // namespace conv_detail

// conv2d under autocast (engine/autocast.h): x, w, b f32 and checked, NCHW, g computed.
Tensor conv2d_autocast(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeometry& g);

}  // namespace kiln
