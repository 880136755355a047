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
// Backward computes only the gradients needed.
//
// The family, file by file (internal files are included by layers/ alone):
//   conv2d.h                   this header: the op, the module, the map
//   conv2d.cpp                 the op: shape checks, conv_impl's choice (engine/impl.h), the
//                              calls into the kernel twins (run_kernel), the one backward node
//                              (also autocast's) and the bias gradient oneDNN leaves alone
//   conv2d_lowp.cpp            the op under autocast: bf16/f16 operands, f32 results
//   conv2d_dispatch.h          what conv2d.cpp and conv2d_lowp.cpp share (conv_detail)
//   conv2d_kernels.h           the kernels' declarations and contracts, ConvGeometry: twins
//                              cpu::/cuda::conv2d_forward (hand), conv2d_forward_vendor, ...
//   conv2d_cpu.cpp             CPU hand: im2col + OpenBLAS GEMM, float and double, NCHW and
//                              channels-last
//   conv2d_dnnl.cpp            CPU vendor: oneDNN, float (the primitives and their cache)
//   conv2d_dnnl_lowp.cpp       CPU vendor, bf16/f16 inputs with f32 outputs (mixed precision)
//   conv2d_dnnl_primitives.h   the oneDNN machinery the two files above share
//   conv2d_cuda.cu             CUDA hand: step 1 direct loops, step 2 implicit GEMM (host side)
//   conv2d_implicit_gemm.cuh   the implicit-GEMM kernel and its three problems (device code)
//   conv2d_cudnn.cu            CUDA vendor: cuDNN, float and double, and bf16/f16 inputs (the
//                              simulated cuDNN under the CUDA simulator)
// Hand or vendor: conv_impl (engine/impl.h) applies the thread's setting (KernelsGuard,
// KILN_KERNELS) and what exists (oneDNN is f32 only: f64 always runs the hand kernels).
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
// Process-wide, a benchmark and test knob: it chooses among oneDNN's algorithms only; whether
// oneDNN runs at all is conv_impl's decision (engine/impl.h).
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
