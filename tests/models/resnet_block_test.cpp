// resnet_block_test.cpp: the residual blocks of models/resnet.h, BasicBlock and Bottleneck
// (v1.5), with and without a downsample shortcut, stride 1 and 2, in training and eval mode:
//   - the block computes the unfused composition written here from conv2d, batch_norm2d, relu
//     and add with torchvision's layout (the stride on the first 3x3 convolution; the 1x1
//     downsample with the block's stride), bit for bit in f32 and f64: the fused kernels
//     (BN + ReLU, add_relu) change no bits;
//   - finite-difference gradient checks in double w.r.t. the input and several parameters
//     (convolution weights, BN weights and biases, the downsample's);
//   - in float with channel counts that are multiples of 16, where the CPU runs a block in the
//     channel-blocked layout (layers/layout.h: oneDNN's blocked convolutions, the blocked
//     BN + ReLU kernels), the output and every gradient against the same NCHW composition,
//     within float rounding (the two layouts sum in different orders).
// The blocks are built in f32 and converted in place to f64 (parameters and buffers). Sizes
// are small (4 to 12 channels, 5x5 and 6x7 images, batch 1 and 2) so each check evaluates the
// block a few thousand times in well under a second.
#include "models/resnet.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parity/parity_harness.h"
#include "engine/autograd.h"
#include "engine/impl.h"
#include "engine/ops.h"
#include "engine/philox.h"
#include "layers/layout.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::bit_identical;
using testing::gradcheck;
using testing::near;
using testing::random_tensor;

// Converts every parameter and floating buffer of m to `dtype` in place: the handles (the
// module's members, named_parameters()) stay the same tensors.
void convert(Module& m, DType dtype) {
  for (auto& [name, t] : m.named_parameters()) t.set_data(t.to(dtype));
  for (auto& [name, t] : m.named_buffers())
    if (is_floating(t.dtype())) t.set_data(t.to(dtype));
}

// The parameter or buffer called `name` (a test failure naming it if there is none).
Tensor tensor_named(const Module& m, const std::string& name) {
  for (const auto& [n, t] : m.named_parameters())
    if (n == name) return t;
  for (const auto& [n, t] : m.named_buffers())
    if (n == name) return t;
  ADD_FAILURE() << m.type_name() << " has no parameter or buffer '" << name << "'";
  return Tensor();
}

// Random BN weights, biases and running statistics, so that neither mode is the identity and
// the BN's affine parameters take part in every gradient.
void randomise_batch_norms(Module& m, uint32_t seed) {
  auto fill = [&](const Tensor& t, double lo, double hi) {
    Tensor handle = t;
    handle.copy_(random_tensor(t.shape(), seed++, lo, hi, t.dtype()));
  };
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  for (const auto& [name, t] : m.named_parameters()) {
    if (t.dim() != 1) continue;  // convolution weights (4-D) keep their initialisation
    if (ends_with(name, "weight")) fill(t, 0.5, 1.5);
    if (ends_with(name, "bias")) fill(t, -0.3, 0.3);
  }
  for (const auto& [name, t] : m.named_buffers()) {
    if (ends_with(name, "running_mean")) fill(t, -0.3, 0.3);
    if (ends_with(name, "running_var")) fill(t, 0.5, 2.0);
  }
}

struct BlockSpec {
  bool bottleneck;
  int64_t inplanes, planes, stride;
  bool downsample;
  int64_t width_per_group;  // Bottleneck only
  Shape input;
  std::vector<std::string> checked;  // parameters the gradient check covers, besides x
};

std::string describe(const BlockSpec& s) {
  return std::string(s.bottleneck ? "Bottleneck" : "BasicBlock") + "(" +
         std::to_string(s.inplanes) + ", " + std::to_string(s.planes) + ", stride " +
         std::to_string(s.stride) + (s.downsample ? ", downsample" : "") + ") on " +
         shape_str(s.input);
}

const std::vector<BlockSpec> kBlocks = {
    {false, 4, 4, 1, false, 64, {2, 4, 5, 5}, {"conv1.weight", "bn1.weight", "bn2.bias"}},
    {false, 4, 6, 2, true, 64, {2, 4, 6, 7},
     {"conv2.weight", "bn1.bias", "downsample.0.weight", "downsample.1.weight"}},
    // width = planes * width_per_group / 64: 2 here, 6 and 2 below; expansion 4.
    {true, 8, 2, 1, false, 64, {2, 8, 5, 5}, {"conv1.weight", "bn2.weight", "bn3.bias"}},
    {true, 4, 3, 2, true, 128, {2, 4, 6, 7},
     {"conv2.weight", "bn1.bias", "bn3.weight", "downsample.0.weight", "downsample.1.bias"}},
    // A downsample at stride 1 (channels change: layer1's first block), batch 1.
    {true, 4, 2, 1, true, 64, {1, 4, 5, 5}, {"conv3.weight", "bn2.bias", "downsample.1.weight"}},
};

std::shared_ptr<Module> make_block(const BlockSpec& s, DType dtype, uint64_t seed) {
  manual_seed(seed);  // the convolutions' initialisation
  std::shared_ptr<Module> block;
  if (s.bottleneck)
    block = std::make_shared<Bottleneck>(s.inplanes, s.planes, s.stride, s.downsample,
                                         s.width_per_group);
  else
    block = std::make_shared<BasicBlock>(s.inplanes, s.planes, s.stride, s.downsample);
  convert(*block, dtype);
  randomise_batch_norms(*block, static_cast<uint32_t>(seed) + 1000);
  return block;
}

// The block written out from the ops, with torchvision's layout. The running statistics are
// copies: the module's own are updated by its own training forward only.
Tensor reference_forward(const Module& m, const BlockSpec& s, const Tensor& x, bool training) {
  auto p = [&](const std::string& name) { return tensor_named(m, name); };
  auto bn = [&](const std::string& prefix, const Tensor& y) {
    return batch_norm2d(y, p(prefix + ".weight"), p(prefix + ".bias"),
                        p(prefix + ".running_mean").clone(), p(prefix + ".running_var").clone(),
                        training, 0.1, 1e-5);
  };
  Tensor out;
  if (s.bottleneck) {
    out = relu(bn("bn1", conv2d(x, p("conv1.weight"), Tensor(), 1, 0)));
    out = relu(bn("bn2", conv2d(out, p("conv2.weight"), Tensor(), s.stride, 1)));  // v1.5
    out = bn("bn3", conv2d(out, p("conv3.weight"), Tensor(), 1, 0));
  } else {
    out = relu(bn("bn1", conv2d(x, p("conv1.weight"), Tensor(), s.stride, 1)));
    out = bn("bn2", conv2d(out, p("conv2.weight"), Tensor(), 1, 1));
  }
  const Tensor identity =
      s.downsample ? bn("downsample.1", conv2d(x, p("downsample.0.weight"), Tensor(), s.stride, 0))
                   : x;
  return relu(add(out, identity));
}

double zero_fraction(const Tensor& y) {
  const std::vector<double> v = y.to_vector<double>();
  return static_cast<double>(std::count(v.begin(), v.end(), 0.0)) / static_cast<double>(v.size());
}

TEST(ResNetBlocks, ComputeTheUnfusedCompositionBitForBit) {
  uint64_t seed = 10;
  for (DType dt : {DType::F32, DType::F64})
    for (const BlockSpec& s : kBlocks)
      for (bool training : {true, false}) {
        SCOPED_TRACE(describe(s) + " " + dtype_name(dt) + (training ? " train" : " eval"));
        auto block = make_block(s, dt, ++seed);
        block->train(training);
        const Tensor x = random_tensor(s.input, static_cast<uint32_t>(seed), -1.0, 2.0, dt);
        const Tensor want = reference_forward(*block, s, x, training);
        const Tensor got = block->forward(x);
        const int64_t out_channels = s.planes * (s.bottleneck ? Bottleneck::kExpansion : 1);
        const Shape out_shape{s.input[0], out_channels, (s.input[2] - 1) / s.stride + 1,
                              (s.input[3] - 1) / s.stride + 1};
        ASSERT_EQ(got.shape(), out_shape);
        EXPECT_TRUE(bit_identical("block output", got, want));
        const double zeros = zero_fraction(got);
        EXPECT_GT(zeros, 0.0);
        EXPECT_LT(zeros, 1.0);
      }
}

// gradcheck perturbs the block's own parameters in place (the handles of named_parameters()).
// In training mode every evaluation also moves the running statistics, which the output does
// not read.
TEST(ResNetBlocks, GradcheckDouble) {
  uint64_t seed = 100;
  for (const BlockSpec& s : kBlocks)
    for (bool training : {true, false}) {
      SCOPED_TRACE(describe(s) + (training ? " train" : " eval"));
      auto block = make_block(s, DType::F64, ++seed);
      block->train(training);
      Tensor x = random_tensor(s.input, static_cast<uint32_t>(seed), -1.0, 2.0);
      x.set_requires_grad(true);
      std::vector<Tensor> inputs{x};
      for (const std::string& name : s.checked) inputs.push_back(tensor_named(*block, name));
      ASSERT_EQ(inputs.size(), s.checked.size() + 1);
      auto f = [&](const std::vector<Tensor>& in) { return block->forward(in[0]); };
      const double zeros = zero_fraction(f(inputs));
      EXPECT_GT(zeros, 0.0);
      EXPECT_LT(zeros, 1.0);
      EXPECT_TRUE(gradcheck(f, inputs, 1e-6, 1e-6, 1e-5));
    }
}

// Blocks whose convolutions all have multiples of 16 channels: on the CPU in f32 with the
// vendor kernels (asked for here) they run channel-blocked and return a blocked output. Compared
// with the NCHW composition above (plain kernels), forward and backward, in both modes.
// Tolerance (near: relative to each tensor's largest value). The blocked BatchNorm kernels sum
// their statistics in another order (and in float), so the normalised values differ by a few
// float roundings, which the next convolution and BatchNorm pass on. Measured worst: 3.3e-7
// (a weight gradient); 1e-5 leaves a margin and is far below a wrong channel order or mask.
TEST(ResNetBlocks, BlockedLayoutMatchesTheNchwComposition) {
  KernelsGuard vendor(Impl::Vendor);
  const std::vector<BlockSpec> blocks = {
      {false, 16, 16, 1, false, 64, {2, 16, 6, 7}, {}},
      {false, 16, 32, 2, true, 64, {2, 16, 6, 7}, {}},
      {true, 64, 16, 1, false, 64, {2, 64, 5, 5}, {}},  // width 16, 64 out
      {true, 32, 16, 2, true, 64, {2, 32, 6, 7}, {}},
  };
  uint64_t seed = 300;
  for (const BlockSpec& s : blocks)
    for (bool training : {true, false}) {
      SCOPED_TRACE(describe(s) + (training ? " train" : " eval"));
      auto block = make_block(s, DType::F32, ++seed);
      block->train(training);
      const Tensor x = random_tensor(s.input, static_cast<uint32_t>(seed), -1.0, 2.0, DType::F32);
      const bool blocked = preferred_layout(x, kChannelBlock) == Layout::NCHW16c;

      Tensor x_block = x.clone();
      x_block.set_requires_grad(true);
      const Tensor y_block = block->forward(x_block);
      ASSERT_EQ(is_channel_blocked(y_block), blocked);
      const Tensor y = blocked ? from_channel_blocks(y_block) : y_block;
      const Tensor g = random_tensor(y.shape(), static_cast<uint32_t>(seed) + 1, -1.0, 1.0,
                                     DType::F32);
      backward(y, g);
      NamedTensors grads;
      for (const auto& [name, p] : block->named_parameters()) grads.emplace_back(name, p.grad());
      block->zero_grad();

      Tensor x_ref = x.clone();
      x_ref.set_requires_grad(true);
      const Tensor y_ref = reference_forward(*block, s, x_ref, training);
      backward(y_ref, g);
      EXPECT_TRUE(near("output", y, y_ref, 1e-5));
      EXPECT_TRUE(near("grad x", x_block.grad(), x_ref.grad(), 1e-5));
      const NamedTensors params = block->named_parameters();
      ASSERT_EQ(params.size(), grads.size());
      for (size_t i = 0; i < params.size(); ++i)
        EXPECT_TRUE(
            near("grad " + params[i].first, grads[i].second, params[i].second.grad(), 1e-5));
    }
}

}  // namespace
}  // namespace kiln
