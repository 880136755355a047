// autocast_resnet_step.h: one training step of a narrow ResNet-18 with 16-bit activations
// between its layers (AutocastOutputs::LowPrecision, engine/autocast.h) against the same step in
// f32, on the CPU (tests/layers/autocast_activations_test.cpp) and on cuda:0
// (tests/cuda/autocast_activations_cuda_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/memory_format.h"
#include "engine/philox.h"
#include "layers/loss.h"
#include "models/resnet.h"
#include "support/gradcheck.h"

namespace kiln::testing {

struct AutocastResNetStep {
  double loss = 0;
  std::map<std::string, Tensor> grads;  // on the CPU
  int64_t conversions = 0;              // memory-format conversions in forward and backward
  std::vector<DType> piece_dtypes;      // of each piece's output (stem, blocks, head)
  // The conversions a channels-last step must make: the image at the entry. None of
  // activations, none of weights: Module::to(MemoryFormat) made them KRSC, the order cuDNN
  // wants with channels-last activations (layers/conv2d_cudnn.cu) and oneDNN reads.
  int64_t expected_conversions = 0;
};

// One step of a narrow ResNet-18 (stem, 8 blocks with downsamples, head) from fixed weights on
// `device`, under autocast with `outputs` (in f32 when `low` is F32).
inline AutocastResNetStep autocast_resnet_step(Device device, MemoryFormat format, DType low,
                                               AutocastOutputs outputs) {
  Generator gen(5);
  GeneratorScope scope(gen);
  auto model = make_resnet(ResNetConfig{ResNetBlock::Basic, {2, 2, 2, 2}, 10, 16, 16});
  model->to(device);
  model->to(format);
  const Tensor x = random_tensor({4, 3, 64, 64}, 60, -1, 1, DType::F32).to(device);
  const Tensor y = Tensor::from_vector(std::vector<int64_t>{1, 7, 3, 9}, {4}).to(device);
  AutocastResNetStep s;
  const int64_t before = memory_format_conversions();
  Tensor loss;
  {
    AutocastGuard mixed(low, low != DType::F32, outputs);
    loss = cross_entropy((*model)(x), y);
  }
  loss.backward();
  s.conversions = memory_format_conversions() - before;
  s.loss = loss.to(Device()).item();
  s.expected_conversions = 1;
  for (auto& [name, p] : model->named_parameters()) {
    EXPECT_EQ(p.grad().dtype(), DType::F32) << name << ": master gradients stay f32";
    EXPECT_EQ(p.grad().memory_format(), p.memory_format()) << name << ": in the weight's format";
    if (p.dim() == 4) {
      EXPECT_EQ(p.memory_format(), format) << name << ": moved with the model";
    }
    s.grads[name] = p.grad().to(Device());
  }
  NoGradGuard no_grad;
  AutocastGuard mixed(low, low != DType::F32, outputs);
  Tensor a = x.to(format);
  for (const ResNetPiece& piece : model->pieces()) {
    a = piece.module->forward(a);
    s.piece_dtypes.push_back(a.dtype());
  }
  return s;
}

// The step with 16-bit activations against the f32 step, in NCHW and channels-last, at 64x64,
// batch 4 (at 32x32 the last stage is 1x1 and its BatchNorms normalise four values: both
// autocast policies' gradients then differ from f32 by 60-140%, measured). The f32-output
// autocast step sets the scale: it rounds every conv operand (2^-9 relative for bf16, 2^-12
// for f16), and in bf16 its gradients are 0.3% to 83% from f32 here (norm-wise), BatchNorm's
// backward amplifying the roundings. 16-bit activations round about twice as often (the conv
// output before BatchNorm and the gradients between layers, besides the conv operands), so
// their errors may be about twice as large if they add up linearly: the bound is 3x the
// f32-output step's (measured: up to 2.1x above the floor), with a floor of 32 units of the
// format where that step is very close. The loss agrees to a few roundings.
inline void check_resnet_with_16bit_activations(DType low, Device device) {
  for (MemoryFormat format : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
    SCOPED_TRACE(format == MemoryFormat::ChannelsLast ? "channels-last" : "NCHW");
    const auto f32 = autocast_resnet_step(device, format, DType::F32, AutocastOutputs::F32);
    const auto mixed = autocast_resnet_step(device, format, low, AutocastOutputs::F32);
    const auto lowp = autocast_resnet_step(device, format, low, AutocastOutputs::LowPrecision);
    if (format == MemoryFormat::ChannelsLast) {
      EXPECT_EQ(lowp.conversions, lowp.expected_conversions)
          << "the image at the entry";
    }
    // The stem and every block pass on 16-bit activations; the head's mean promotes to f32.
    ASSERT_GE(lowp.piece_dtypes.size(), 3u);
    for (size_t i = 0; i + 1 < lowp.piece_dtypes.size(); ++i)
      EXPECT_EQ(lowp.piece_dtypes[i], low) << "piece " << i;
    EXPECT_EQ(lowp.piece_dtypes.back(), DType::F32) << "the logits";
    const double unit = std::ldexp(1.0, low == DType::BF16 ? -8 : -11);
    EXPECT_NEAR(lowp.loss, f32.loss, 16 * unit * std::abs(f32.loss));
    ASSERT_EQ(lowp.grads.size(), f32.grads.size());
    for (const auto& [name, g] : f32.grads) {
      SCOPED_TRACE(name);
      const double mixed_err = rel_diff(mixed.grads.at(name), g);
      const double lowp_err = rel_diff(lowp.grads.at(name), g);
      EXPECT_LT(lowp_err, std::max(3 * mixed_err, 32 * unit))
          << "f32-output autocast: " << mixed_err;
    }
  }
}

}  // namespace kiln::testing
