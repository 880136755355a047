// channels_last_test.cpp: the layers on channels-last activations (MemoryFormat, engine/tensor.h;
// Layout::NHWC, layers/layout.h). Each computes what it computes on NCHW, forward and backward,
// keeps the format, and converts nothing where it has a channels-last kernel:
//   - Conv2d: oneDNN's nhwc convolution (CPU, f32) and the hand im2col + GEMM kernels (f32,
//     f64, and under autocast) against their NCHW ones, without a conversion;
//   - BatchNorm2d: the same kernels on the (N * H * W, C) view, no copy;
//   - a whole ResNet moved with Module::to(MemoryFormat): one conversion per training step (the
//     image, at the entry) and the loss and gradients of the NCHW model, in f32 and under
//     bf16 autocast.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/impl.h"
#include "engine/memory_format.h"
#include "engine/ops.h"
#include "engine/philox.h"
#include "layers/batchnorm2d.h"
#include "layers/conv2d.h"
#include "layers/layout.h"
#include "layers/loss.h"
#include "models/resnet.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::gradcheck;
using testing::max_abs_diff;
using testing::rel_diff;
using testing::random_tensor;

constexpr MemoryFormat kCl = MemoryFormat::ChannelsLast;

Tensor with_grad(Tensor t) {
  t.set_requires_grad(true);
  return t;
}


// conv2d on a channels-last input against the NCHW op; `conversions` is how many reorderings
// forward and backward may make (0 where the kernels read channels-last). c input channels.
void check_conv(Impl impl, int64_t stride, int64_t pad, int64_t k, bool bias,
                int64_t conversions, DType dtype = DType::F32, int64_t c = 24) {
  KernelsGuard guard(impl);
  Tensor x = random_tensor({3, c, 9, 7}, 10, -1, 1, dtype);
  Tensor w = random_tensor({40, c, k, k}, 11, -0.2, 0.2, dtype);
  Tensor b = bias ? random_tensor({40}, 12, -1, 1, dtype) : Tensor();
  Tensor xr = with_grad(x.clone()), wr = with_grad(w.clone());
  Tensor br = bias ? with_grad(b.clone()) : Tensor();
  Tensor xc = with_grad(x.to(kCl)), wc = with_grad(w.clone());
  Tensor bc = bias ? with_grad(b.clone()) : Tensor();
  Tensor yr = conv2d(xr, wr, br, stride, pad);
  Tensor g = random_tensor(yr.shape(), 13, -1, 1, dtype);
  Tensor gc = g.to(kCl);
  const int64_t before = memory_format_conversions();
  Tensor yc = conv2d(xc, wc, bc, stride, pad);
  backward(yc, gc);
  EXPECT_EQ(memory_format_conversions() - before, conversions);
  ASSERT_TRUE(yc.is_channels_last());
  ASSERT_TRUE(xc.grad().is_channels_last());
  backward(yr, g);
  // Both are sums of at most a few hundred products in another order: a few roundings apart.
  const double tol = dtype == DType::F64 ? 1e-13 : 1e-5;
  EXPECT_LT(rel_diff(yc, yr), tol);
  EXPECT_LT(rel_diff(xc.grad(), xr.grad()), tol);
  EXPECT_LT(rel_diff(wc.grad(), wr.grad()), tol);
  if (bias) {
    EXPECT_LT(rel_diff(bc.grad(), br.grad()), tol);
  }
}

TEST(ChannelsLast, ConvReadsAndWritesNhwcWithOneDnn) {
  check_conv(Impl::Vendor, 1, 1, 3, false, 0);
  check_conv(Impl::Vendor, 2, 1, 3, true, 0);
  check_conv(Impl::Vendor, 2, 0, 1, false, 0);  // a ResNet downsample
}

// The hand im2col + GEMM kernels read and write NHWC themselves (layers/conv2d_cpu.cpp).
TEST(ChannelsLast, ConvReadsAndWritesNhwcWithTheHandKernels) {
  check_conv(Impl::Hand, 2, 1, 3, true, 0);
  check_conv(Impl::Hand, 1, 1, 3, false, 0);
  check_conv(Impl::Hand, 2, 0, 1, false, 0);                 // a ResNet downsample
  check_conv(Impl::Hand, 2, 3, 7, false, 0, DType::F32, 3);  // a stem
  check_conv(Impl::Hand, 1, 1, 3, true, 0, DType::F64);
  check_conv(Impl::Hand, 2, 3, 7, true, 0, DType::F64, 3);
}

TEST(ChannelsLast, ConvGradcheckWithTheHandKernels) {
  // gradcheck perturbs its inputs in NCHW order: the input goes channels-last inside.
  KernelsGuard hand(Impl::Hand);
  for (int64_t k : {1, 3}) {
    SCOPED_TRACE(k);
    Tensor x = with_grad(random_tensor({2, 3, 5, 4}, 80, -1, 1));
    Tensor w = with_grad(random_tensor({4, 3, k, k}, 81, -1, 1));
    Tensor b = with_grad(random_tensor({4}, 82, -1, 1));
    EXPECT_TRUE(gradcheck(
        [k](const std::vector<Tensor>& in) {
          Tensor y = conv2d(in[0].to(kCl), in[1], in[2], 2, k / 2);
          EXPECT_TRUE(y.is_channels_last());
          return y;
        },
        {x, w, b}));
  }
}

// Autocast's hand path widens the rounded operands to f32 in their format: no conversion.
TEST(ChannelsLast, AutocastConvWithTheHandKernelsKeepsTheFormat) {
  KernelsGuard hand(Impl::Hand);
  Tensor x = random_tensor({2, 16, 8, 6}, 90, -1, 1, DType::F32);
  Tensor w = random_tensor({32, 16, 3, 3}, 91, -0.2, 0.2, DType::F32);
  Tensor xr = with_grad(x.clone()), wr = with_grad(w.clone());
  Tensor xc = with_grad(x.to(kCl)), wc = with_grad(w.clone());
  Tensor yr, yc;
  int64_t conversions = 0;
  {
    AutocastGuard autocast(DType::BF16);
    yr = conv2d(xr, wr, Tensor(), 2, 1);
    const int64_t before = memory_format_conversions();
    yc = conv2d(xc, wc, Tensor(), 2, 1);
    conversions = memory_format_conversions() - before;
  }
  Tensor g = random_tensor(yr.shape(), 92, -1, 1, DType::F32);
  Tensor gc = g.to(kCl);
  const int64_t before = memory_format_conversions();
  backward(yc, gc);
  conversions += memory_format_conversions() - before;
  backward(yr, g);
  EXPECT_EQ(conversions, 0);
  ASSERT_TRUE(yc.is_channels_last());
  ASSERT_TRUE(xc.grad().is_channels_last());
  // The same rounded operands, products exact in f32, summed in another order.
  EXPECT_LT(rel_diff(yc, yr), 1e-5);
  EXPECT_LT(rel_diff(xc.grad(), xr.grad()), 1e-5);
  EXPECT_LT(rel_diff(wc.grad(), wr.grad()), 1e-5);
}

// Under autocast the 16-bit convolution reads the channels-last input too: oneDNN's bf16 kernels
// where this CPU has them, else the rounded values widened to f32 and oneDNN's f32 kernels.
TEST(ChannelsLast, AutocastConvKeepsTheFormat) {
  KernelsGuard vendor(Impl::Vendor);
  for (DType low : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(low));
    Tensor x = random_tensor({2, 16, 8, 6}, 70, -1, 1, DType::F32);
    Tensor w = random_tensor({32, 16, 3, 3}, 71, -0.2, 0.2, DType::F32);
    Tensor xr = with_grad(x.clone()), wr = with_grad(w.clone());
    Tensor xc = with_grad(x.to(kCl)), wc = with_grad(w.clone());
    Tensor yr, yc;
    int64_t conversions = 0;
    {
      AutocastGuard autocast(low);
      yr = conv2d(xr, wr, Tensor(), 2, 1);
      const int64_t before = memory_format_conversions();
      yc = conv2d(xc, wc, Tensor(), 2, 1);
      conversions = memory_format_conversions() - before;
    }
    Tensor g = random_tensor(yr.shape(), 72, -1, 1, DType::F32);
    Tensor gc = g.to(kCl);
    const int64_t before = memory_format_conversions();
    backward(yc, gc);
    conversions += memory_format_conversions() - before;
    backward(yr, g);
    EXPECT_EQ(conversions, 0);
    ASSERT_TRUE(yc.is_channels_last());
    EXPECT_EQ(yc.dtype(), DType::F32);
    ASSERT_TRUE(xc.grad().is_channels_last());
    // The same rounded operands, products exact in f32, summed in another order.
    EXPECT_LT(rel_diff(yc, yr), 1e-5);
    EXPECT_LT(rel_diff(xc.grad(), xr.grad()), 1e-5);
    EXPECT_LT(rel_diff(wc.grad(), wr.grad()), 1e-5);
  }
}

TEST(ChannelsLast, ConvLoneBiasGradient) {
  KernelsGuard vendor(Impl::Vendor);
  Tensor x = random_tensor({2, 16, 5, 5}, 20, -1, 1, DType::F32);
  Tensor w = random_tensor({16, 16, 3, 3}, 21, -0.2, 0.2, DType::F32);
  Tensor b = with_grad(random_tensor({16}, 22, -1, 1, DType::F32));
  Tensor br = with_grad(b.detach().clone());
  Tensor g = random_tensor({2, 16, 5, 5}, 23, -1, 1, DType::F32);
  backward(conv2d(x.to(kCl), w, b, 1, 1), g.to(kCl));
  backward(conv2d(x, w, br, 1, 1), g);
  EXPECT_LT(rel_diff(b.grad(), br.grad()), 1e-6);
}

TEST(ChannelsLast, ConvOutputLayoutsMeetAtTheFormat) {
  KernelsGuard vendor(Impl::Vendor);
  Tensor x = random_tensor({2, 3, 11, 10}, 50, -1, 1, DType::F32);  // a stem: 3 channels
  Tensor w = random_tensor({16, 3, 7, 7}, 51, -0.2, 0.2, DType::F32);
  Tensor y = conv2d(x, w, Tensor(), 2, 3);
  Tensor nhwc = conv2d(x, w, Tensor(), 2, 3, Layout::NHWC);
  EXPECT_TRUE(nhwc.is_channels_last());
  EXPECT_EQ(max_abs_diff(nhwc, y), 0.0);  // the NCHW kernel, then a copy
  Tensor back = conv2d(x.to(kCl), w, Tensor(), 2, 3, Layout::NCHW);
  EXPECT_FALSE(back.is_channels_last());
  EXPECT_LT(rel_diff(back, y), 1e-5);
  EXPECT_EQ(layout_of(nhwc), Layout::NHWC);
  EXPECT_EQ(preferred_layout(nhwc, 64), Layout::NHWC);  // the input's choice stands
  EXPECT_EQ(max_abs_diff(as_layout(as_layout(y, Layout::NHWC), Layout::NCHW16c),
                         to_channel_blocks(y)),
            0.0);
}

// batch_norm2d on channels-last activations against the NCHW op: the kernels sum the same
// values per channel in double, in another grouping, so results may differ by a rounding of
// the dtype (tol).
void check_bn(int64_t c, DType dtype, bool training, BatchNormActivation act, double tol) {
  Tensor x = random_tensor({3, c, 5, 4}, 30, -2, 3, dtype);
  Tensor w = random_tensor({c}, 31, 0.5, 1.5, dtype), b = random_tensor({c}, 32, -1, 1, dtype);
  Tensor rm = random_tensor({c}, 33, -0.5, 0.5, dtype), rv = random_tensor({c}, 34, 0.5, 2, dtype);
  Tensor rm_c = rm.clone(), rv_c = rv.clone();
  Tensor xr = with_grad(x.clone()), wr = with_grad(w.clone()), br = with_grad(b.clone());
  Tensor xc = with_grad(x.to(kCl)), wc = with_grad(w.clone()), bc = with_grad(b.clone());
  Tensor yr = batch_norm2d(xr, wr, br, rm, rv, training, 0.1, 1e-5, act);
  Tensor g = random_tensor(yr.shape(), 35, -1, 1, dtype);
  Tensor gc = g.to(kCl);
  const int64_t before = memory_format_conversions();
  Tensor yc = batch_norm2d(xc, wc, bc, rm_c, rv_c, training, 0.1, 1e-5, act);
  backward(yc, gc);
  EXPECT_EQ(memory_format_conversions() - before, 0);
  ASSERT_TRUE(yc.is_channels_last());
  backward(yr, g);
  EXPECT_LT(rel_diff(yc, yr), tol);
  EXPECT_LT(rel_diff(rm_c, rm), tol);
  EXPECT_LT(rel_diff(rv_c, rv), tol);
  EXPECT_LT(rel_diff(xc.grad(), xr.grad()), tol);
  EXPECT_LT(rel_diff(wc.grad(), wr.grad()), tol);
  EXPECT_LT(rel_diff(bc.grad(), br.grad()), tol);
}

TEST(ChannelsLast, BatchNormMatchesNchwWithoutConversions) {
  for (bool training : {true, false}) {
    for (auto act : {BatchNormActivation::None, BatchNormActivation::Relu}) {
      SCOPED_TRACE(::testing::Message() << "training=" << training
                                        << " relu=" << (act == BatchNormActivation::Relu));
      // 12 channels: the NCHW kernels on the (N * H * W, C, 1, 1) view; 32: the CPU's
      // channel-blocked kernels on the (N * H * W, C/16, 1, 1, 16) view.
      for (int64_t c : {12, 32}) {
        check_bn(c, DType::F32, training, act, 1e-6);
        check_bn(c, DType::F64, training, act, 1e-13);
      }
    }
  }
}

TEST(ChannelsLast, BatchNormGradcheck) {
  // gradcheck perturbs its inputs element by element in NCHW order: the input goes channels-last
  // inside the function.
  Tensor x = with_grad(random_tensor({2, 3, 3, 2}, 40, -2, 2));
  Tensor w = with_grad(random_tensor({3}, 41, 0.5, 1.5));
  Tensor b = with_grad(random_tensor({3}, 42, -1, 1));
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return batch_norm2d(in[0].to(kCl), in[1], in[2], Tensor(), Tensor(), true, 0.1, 1e-5,
                            BatchNormActivation::None);
      },
      {x, w, b}));
}

// One training step of a narrow ResNet-18 (stem, 8 blocks with downsamples, head), NCHW and
// channels-last, from the same weights.
struct Step {
  double loss = 0;
  std::map<std::string, Tensor> grads;
  int64_t conversions = 0;
};

Step train_step(MemoryFormat format, Impl impl, DType autocast = DType::F32) {
  KernelsGuard guard(impl);
  Generator gen(5);
  GeneratorScope scope(gen);
  auto model = make_resnet(ResNetConfig{ResNetBlock::Basic, {2, 2, 2, 2}, 10, 16, 16});
  model->to(format);
  Tensor x = random_tensor({4, 3, 32, 32}, 60, -1, 1, DType::F32);
  Tensor y = Tensor::from_vector(std::vector<int64_t>{1, 7, 3, 9}, {4});
  Step s;
  const int64_t before = memory_format_conversions();
  Tensor loss;
  {
    AutocastGuard mixed(autocast, autocast != DType::F32);
    loss = cross_entropy((*model)(x), y);
  }
  loss.backward();
  s.conversions = memory_format_conversions() - before;
  s.loss = loss.item();
  for (auto& [name, p] : model->named_parameters()) {
    // Conv weights moved with the model, their gradients in their format (oneDNN's `ohwi`).
    EXPECT_EQ(p.is_channels_last(), p.dim() == 4 && format == kCl) << name;
    EXPECT_EQ(p.grad().memory_format(), p.memory_format()) << name;
    s.grads[name] = p.grad();
  }
  return s;
}

TEST(ChannelsLast, AResNetTrainsWithOneConversionPerStep) {
  const Step nchw = train_step(MemoryFormat::Contiguous, Impl::Vendor);
  const Step cl = train_step(kCl, Impl::Vendor);
  EXPECT_EQ(cl.conversions, 1) << "only the image, at the entry";
  // f32 through 18 layers in another summation order: the loss agrees to a few roundings, the
  // gradients to what BatchNorm's division by small batch deviations amplifies.
  EXPECT_NEAR(cl.loss, nchw.loss, 1e-5 * std::abs(nchw.loss));
  ASSERT_EQ(cl.grads.size(), nchw.grads.size());
  for (const auto& [name, g] : nchw.grads) {
    SCOPED_TRACE(name);
    EXPECT_LT(rel_diff(cl.grads.at(name), g), 1e-3);
  }
}

TEST(ChannelsLast, AResNetTrainsInBf16WithOneConversionPerStep) {
  const Step nchw = train_step(MemoryFormat::Contiguous, Impl::Vendor, DType::BF16);
  const Step cl = train_step(kCl, Impl::Vendor, DType::BF16);
  EXPECT_EQ(cl.conversions, 1) << "only the image, at the entry";
  // The same bf16 operands; f32 sums in another order, so a product rounded to bf16 downstream
  // may land on the neighbouring value (2^-8 relative): the loss agrees to that, the gradients
  // point the same way.
  EXPECT_NEAR(cl.loss, nchw.loss, std::ldexp(1.0, -8) * std::abs(nchw.loss));
  for (const auto& [name, g] : nchw.grads) {
    SCOPED_TRACE(name);
    EXPECT_LT(rel_diff(cl.grads.at(name), g), 0.1);
  }
}

}  // namespace
}  // namespace kiln
