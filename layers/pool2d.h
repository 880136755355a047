// pool2d.h: 2-D pooling over NCHW tensors: max, average and adaptive average.
//
// Shapes: x is (N, C, H, W) (or (C, H, W), treated as N = 1); the output is (N, C, OH, OW).
// Output size, as PyTorch (floor mode, no dilation):
//     OH = (H + 2 * padding - kernel_size) / stride + 1          (integer division)
// The padding must be at most kernel_size / 2 (PyTorch's rule), so every window holds at
// least one real element. Max pooling pads with -inf; average pooling pads with zeros and by
// default divides by the full window area including the padding (count_include_pad = true).
//
// Adaptive average pooling to (OH, OW) averages, for output row i, input rows
// [floor(i * H / OH), ceil((i + 1) * H / OH)) (likewise for columns): PyTorch's windows,
// which overlap when H is not a multiple of OH.
//
// Max pooling records, for every output element, where its maximum came from (the index
// ih * W + iw inside its input plane); backward sends each output gradient to that element.
// Ties keep the first element in row-major order and NaN propagates, as in PyTorch, so the
// indices match PyTorch's exactly.
//
// A channels-last input (MemoryFormat::ChannelsLast, engine/tensor.h) runs channels-last kernels
// and returns channels-last results (the max-pool indices too, their values unchanged), equal to
// the NCHW ones bit for bit; no reordering happens, forward or backward.
//
// x may be f32, f64, bf16 or f16. A 16-bit x gives a 16-bit y and a 16-bit gradient, computed
// in f32 and rounded once: bit for bit the f32 op on the widened input, rounded once
// (docs/mixed_precision.md). The channel-blocked layout (layers/layout.h) holds f32 and f64 only.
//
// Parameters mirror torch.nn.functional: stride defaults to kernel_size (std::nullopt).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "layers/module.h"

namespace kiln {

// What average pooling divides by at the border (PyTorch's count_include_pad).
enum class AvgPoolDivisor {
  IncludePad,  // the whole window, padding included (count_include_pad = true, the default)
  ExcludePad,  // only the window's elements inside the input (count_include_pad = false)
};

// One output dimension of a pooling window sweep (floor mode): (in + 2p - k) / s + 1.
int64_t pool2d_output_size(int64_t in, int64_t kernel_size, int64_t stride, int64_t padding);

// ---- Functional ops ---------------------------------------------------------------------
Tensor max_pool2d(const Tensor& x, int64_t kernel_size,
                  std::optional<int64_t> stride = std::nullopt, int64_t padding = 0);
// Also returns the argmax indices (i64, (N, C, OH, OW), offsets in the input plane), like
// torch.nn.functional.max_pool2d(..., return_indices=True).
std::pair<Tensor, Tensor> max_pool2d_with_indices(const Tensor& x, int64_t kernel_size,
                                                  std::optional<int64_t> stride = std::nullopt,
                                                  int64_t padding = 0);
Tensor avg_pool2d(const Tensor& x, int64_t kernel_size,
                  std::optional<int64_t> stride = std::nullopt, int64_t padding = 0,
                  AvgPoolDivisor divisor = AvgPoolDivisor::IncludePad);
Tensor adaptive_avg_pool2d(const Tensor& x, int64_t out_h, int64_t out_w);

// ---- Modules ----------------------------------------------------------------------------
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int64_t kernel_size, std::optional<int64_t> stride = std::nullopt,
                     int64_t padding = 0);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "MaxPool2d"; }

 protected:
  std::string extra_repr() const override;

 private:
  int64_t kernel_size_, stride_, padding_;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(int64_t kernel_size, std::optional<int64_t> stride = std::nullopt,
                     int64_t padding = 0, AvgPoolDivisor divisor = AvgPoolDivisor::IncludePad);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "AvgPool2d"; }

 protected:
  std::string extra_repr() const override;

 private:
  int64_t kernel_size_, stride_, padding_;
  AvgPoolDivisor divisor_;
};

class AdaptiveAvgPool2d : public Module {
 public:
  AdaptiveAvgPool2d(int64_t out_h, int64_t out_w);
  explicit AdaptiveAvgPool2d(int64_t out_size) : AdaptiveAvgPool2d(out_size, out_size) {}
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "AdaptiveAvgPool2d"; }

 protected:
  std::string extra_repr() const override;

 private:
  int64_t out_h_, out_w_;
};

}  // namespace kiln
