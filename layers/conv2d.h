// conv2d.h: 2-D convolution (cross-correlation, as in every DL framework), the functional op
// conv2d() and the Conv2d module.
//
// Shapes: x is (N, C, H, W), w is (K, C, R, S), b is (K) or undefined, and
//   y = conv2d(x, w, b, stride, padding) is (N, K, P, Q) with
//   P = (H + 2*padding - R) / stride + 1,  Q = (W + 2*padding - S) / stride + 1,
//   y[n][k][p][q] = b[k] + sum_{c,r,s} w[k][c][r][s] * x[n][c][p*stride - padding + r]
//                                                         [q*stride - padding + s]
// (x reads as zero outside the image). Same stride and padding in both directions.
//
// Kernels (see layers/conv2d_kernels.h): conv_impl() (engine/impl.h) picks Impl::Hand (im2col +
// OpenBLAS GEMM on the CPU, layers/conv2d_cpu.cpp; implicit GEMM on CUDA, layers/conv2d_cuda.cu)
// or Impl::Vendor (oneDNN, layers/conv2d_dnnl.cpp, f32 only: f64 always uses the hand kernels;
// cuDNN, layers/conv2d_cudnn.cu).
// Backward computes only the gradients needed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/philox.h"
#include "layers/layout.h"
#include "layers/module.h"

namespace kiln {

// The vendor CPU kernels (oneDNN) compute 3x3 stride-1 convolutions directly by default, as
// PyTorch does. With set_conv_winograd(true) (or env KILN_CONV_WINOGRAD=1) they may use
// Winograd's F(4x4, 3x3) minimal filtering instead (Lavin & Gray, "Fast Algorithms for
// Convolutional Neural Networks", 2016, https://arxiv.org/abs/1509.09308): fewer multiplies,
// at the price of a larger rounding error (~1e-5 relative in f32 instead of ~1e-6).
void set_conv_winograd(bool on);
bool conv_winograd();

// Throws kiln::Error naming both shapes when x, w, b do not fit together.
// x may be NCHW or channel-blocked (layers/layout.h); y is in out_layout, by default x's.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, int64_t stride = 1,
              int64_t padding = 0, std::optional<Layout> out_layout = std::nullopt);

class Conv2d : public Module {
 public:
  // Weights (out, in, k, k) and bias (out) drawn from U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
  // fan_in = in_channels * k * k, as PyTorch does.
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride = 1,
         int64_t padding = 0, bool bias = true, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;
  Tensor forward(const Tensor& x, Layout out_layout);  // the output in out_layout
  std::string type_name() const override { return "Conv2d"; }
  // Gives a convolution built without bias one (out_channels), registered as "bias"; used
  // when a BatchNorm is folded into it (models/resnet.h).
  void set_bias(const Tensor& b);

  Tensor weight;  // (out_channels, in_channels, kernel_size, kernel_size)
  Tensor bias;    // (out_channels), undefined when bias = false

 protected:
  std::string extra_repr() const override;  // "1, 32, kernel_size=(3, 3), stride=(1, 1)"

 private:
  int64_t in_channels_, out_channels_, kernel_size_, stride_, padding_;
};

}  // namespace kiln
