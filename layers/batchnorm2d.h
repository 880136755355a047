// batchnorm2d.h: batch normalisation over the channels of NCHW tensors (Ioffe & Szegedy, 2015).
//
// x is (N, C, H, W); every channel c is normalised over its M = N * H * W values:
//     y = (x - mean_c) / sqrt(var_c + eps) * weight_c + bias_c
// Training: mean and var are the batch's (var biased, divided by M); the running statistics
// are then updated in place, without autograd, as PyTorch does:
//     running_mean = (1 - momentum) * running_mean + momentum * mean
//     running_var  = (1 - momentum) * running_var  + momentum * var * M / (M - 1)  (unbiased)
// Evaluation: mean and var are running_mean and running_var (the op is then an affine map).
// Backward is one fused kernel (see batchnorm2d_kernels.h), with the full formula in training
// (the batch statistics depend on x) and the plain scale in evaluation; the node saves x and
// the per-channel mean and 1/sqrt(var + eps), nothing else.
//
// weight, bias: (C), or undefined for no affine transform. running_mean, running_var: (C),
// or undefined, in which case batch statistics are used in both modes and nothing is updated
// (PyTorch's track_running_stats=False). All tensors share x's device, and x's dtype when x is
// f32 or f64. x may also be bf16 or f16 (16-bit activations, engine/autocast.h): y, and the
// gradient of x, are then in x's dtype, while weight, bias and the running statistics are f32
// (as their gradients, and the mean and invstd the node saves); the statistics are computed in
// double as for f32, the normalisation in f32 and rounded once on store, and the node saves x
// (or y) in 16 bits.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "layers/module.h"

namespace kiln {

// What follows the normalisation inside the same kernel. Relu gives relu(batch_norm2d(...))
// with one pass over memory fewer each way (ResNet's BN -> ReLU pairs); backward saves the
// output, which is the ReLU's mask.
enum class BatchNormActivation { None, Relu };

// The functional op, like torch.nn.functional.batch_norm for 4-D inputs.
Tensor batch_norm2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Tensor& running_mean, const Tensor& running_var, bool training,
                    double momentum = 0.1, double eps = 1e-5,
                    BatchNormActivation activation = BatchNormActivation::None);

// Parameters weight (ones) and bias (zeros) when affine; buffers running_mean (zeros),
// running_var (ones) and num_batches_tracked (i64, shape [1], counts training steps).
// momentum = std::nullopt uses the cumulative average, momentum = 1 / num_batches_tracked,
// as PyTorch's momentum=None. dtype: the dtype of the parameters and buffers (f32 or f64); an
// f32 module also takes bf16 and f16 inputs (see batch_norm2d).
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5,
                       std::optional<double> momentum = 0.1, bool affine = true,
                       DType dtype = DType::F32);
  Tensor forward(const Tensor& x) override { return forward(x, BatchNormActivation::None); }
  // forward(x) then the activation, fused: forward(x, BatchNormActivation::Relu) is
  // relu(forward(x)), computed in one kernel.
  Tensor forward(const Tensor& x, BatchNormActivation activation);
  std::string type_name() const override { return "BatchNorm2d"; }

  int64_t num_features() const { return num_features_; }
  double eps() const { return eps_; }
  const Tensor& weight() const { return weight_; }  // undefined when not affine
  const Tensor& bias() const { return bias_; }
  const Tensor& running_mean() const { return running_mean_; }
  const Tensor& running_var() const { return running_var_; }
  const Tensor& num_batches_tracked() const { return num_batches_tracked_; }

 protected:
  std::string extra_repr() const override;

 private:
  int64_t num_features_;
  double eps_;
  std::optional<double> momentum_;
  Tensor weight_, bias_;
  Tensor running_mean_, running_var_, num_batches_tracked_;
};

}  // namespace kiln
