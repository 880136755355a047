// layout_test.cpp: the channel-blocked activation layout (layers/layout.h). The conversions
// round-trip and are differentiable; Conv2d and BatchNorm2d (with and without the fused ReLU,
// train and eval) on blocked activations compute what their NCHW kernels compute, forward and
// backward: oneDNN's blocked convolution against the NCHW one (f32, both reorder-free and
// reordering paths are oneDNN's), the blocked BN kernels against the NCHW ones in f32 and f64,
// and a gradient check in double of the blocked BN kernels themselves.
#include "layers/layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/impl.h"
#include "engine/ops.h"
#include "layers/batchnorm2d.h"
#include "layers/conv2d.h"
#include "layers/pool2d.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::gradcheck;
using testing::max_abs_diff;
using testing::rel_diff;
using testing::random_tensor;

Tensor with_grad(Tensor t) {
  t.set_requires_grad(true);
  return t;
}


TEST(Layout, RoundTripAndChannelOrder) {
  Tensor x = random_tensor({2, 32, 3, 5}, 1);
  Tensor b = to_channel_blocks(x);
  ASSERT_EQ(b.shape(), Shape({2, 2, 3, 5, 16}));
  EXPECT_TRUE(is_channel_blocked(b));
  EXPECT_EQ(logical_channels(b), 32);
  // Channel c = cb * 16 + l of pixel (h, w) sits at b[n][cb][h][w][l].
  auto xv = x.to_vector<double>(), bv = b.to_vector<double>();
  const int64_t n = 1, c = 21, h = 2, w = 3, cb = c / 16, l = c % 16;
  EXPECT_EQ(bv[static_cast<size_t>((((n * 2 + cb) * 3 + h) * 5 + w) * 16 + l)],
            xv[static_cast<size_t>(((n * 32 + c) * 3 + h) * 5 + w)]);
  EXPECT_EQ(max_abs_diff(from_channel_blocks(b), x), 0.0);
  EXPECT_EQ(as_layout(x, Layout::NCHW).impl(), x.impl());  // no copy when already there
  EXPECT_THROW(to_channel_blocks(random_tensor({1, 20, 2, 2}, 2)), Error);
}

TEST(Layout, PreferredLayoutIsBlockedOnlyWhereItPays) {
  Tensor f32 = Tensor::zeros({1, 16, 2, 2});
  {
    KernelsGuard vendor(Impl::Vendor);
    EXPECT_EQ(preferred_layout(f32, 64), Layout::NCHW16c);
    EXPECT_EQ(preferred_layout(f32, 24), Layout::NCHW);  // not a multiple of 16
    EXPECT_EQ(preferred_layout(f32.to(DType::F64), 64), Layout::NCHW);
  }
  KernelsGuard hand(Impl::Hand);
  EXPECT_EQ(preferred_layout(f32, 64), Layout::NCHW);
}

// Conv2d on blocked activations (oneDNN reading and writing nChw16c) against the NCHW op.
void check_blocked_conv(Impl impl, int64_t stride, int64_t pad, int64_t k, bool bias) {
  KernelsGuard guard(impl);
  Tensor x = random_tensor({3, 32, 9, 7}, 10, -1, 1, DType::F32);
  Tensor w = random_tensor({48, 32, k, k}, 11, -0.2, 0.2, DType::F32);
  Tensor b = bias ? random_tensor({48}, 12, -1, 1, DType::F32) : Tensor();
  Tensor xr = with_grad(x.clone()), wr = with_grad(w.clone());
  Tensor br = bias ? with_grad(b.clone()) : Tensor();
  Tensor xb = with_grad(to_channel_blocks(x)), wb = with_grad(w.clone());
  Tensor bb = bias ? with_grad(b.clone()) : Tensor();
  Tensor yr = conv2d(xr, wr, br, stride, pad);
  Tensor yb = conv2d(xb, wb, bb, stride, pad);
  ASSERT_TRUE(is_channel_blocked(yb));
  EXPECT_LT(rel_diff(from_channel_blocks(yb), yr), 1e-5);
  Tensor g = random_tensor(yr.shape(), 13, -1, 1, DType::F32);
  backward(yr, g);
  backward(yb, to_channel_blocks(g));
  EXPECT_LT(rel_diff(from_channel_blocks(xb.grad()), xr.grad()), 1e-5);
  EXPECT_LT(rel_diff(wb.grad(), wr.grad()), 1e-5);
  if (bias) {
    EXPECT_LT(rel_diff(bb.grad(), br.grad()), 1e-5);
  }
}

TEST(Layout, BlockedConvMatchesNchwWithOneDnn) {
  check_blocked_conv(Impl::Vendor, 1, 1, 3, false);
  check_blocked_conv(Impl::Vendor, 2, 1, 3, true);
  check_blocked_conv(Impl::Vendor, 2, 0, 1, false);  // a ResNet downsample
}

TEST(Layout, BlockedConvFallsBackToNchwKernels) {
  check_blocked_conv(Impl::Hand, 2, 1, 3, true);
}

TEST(Layout, BlockedConvLoneBiasGradient) {
  KernelsGuard vendor(Impl::Vendor);
  Tensor x = random_tensor({2, 16, 5, 5}, 20, -1, 1, DType::F32);
  Tensor w = random_tensor({16, 16, 3, 3}, 21, -0.2, 0.2, DType::F32);
  Tensor b = with_grad(random_tensor({16}, 22, -1, 1, DType::F32));
  Tensor br = with_grad(b.detach().clone());
  Tensor g = random_tensor({2, 16, 5, 5}, 23, -1, 1, DType::F32);
  backward(conv2d(to_channel_blocks(x), w, b, 1, 1), to_channel_blocks(g));
  backward(conv2d(x, w, br, 1, 1), g);
  EXPECT_LT(rel_diff(b.grad(), br.grad()), 1e-6);
}

TEST(Layout, BlockedConvRejectsChannelCountsThatDoNotBlock) {
  KernelsGuard vendor(Impl::Vendor);
  Tensor xb = to_channel_blocks(Tensor::zeros({1, 16, 4, 4}));
  EXPECT_THROW(conv2d(xb, Tensor::zeros({8, 16, 1, 1}), Tensor()), Error);   // K = 8
  EXPECT_THROW(conv2d(xb, Tensor::zeros({16, 32, 1, 1}), Tensor()), Error);  // C = 32
}

TEST(Layout, NchwInputBlockedOutputConv) {
  // A ResNet stem: 3 input channels (cannot be blocked) and a blocked output.
  for (Impl impl : {Impl::Vendor, Impl::Hand}) {
    KernelsGuard guard(impl);
    Tensor x = random_tensor({2, 3, 11, 10}, 50, -1, 1, DType::F32);
    Tensor w = with_grad(random_tensor({16, 3, 7, 7}, 51, -0.2, 0.2, DType::F32));
    Tensor wr = with_grad(w.detach().clone());
    Tensor yb = conv2d(x, w, Tensor(), 2, 3, Layout::NCHW16c);
    Tensor yr = conv2d(x, wr, Tensor(), 2, 3);
    ASSERT_TRUE(is_channel_blocked(yb));
    EXPECT_LT(rel_diff(from_channel_blocks(yb), yr), 1e-5);
    Tensor g = random_tensor(yr.shape(), 52, -1, 1, DType::F32);
    backward(yb, to_channel_blocks(g));
    backward(yr, g);
    EXPECT_LT(rel_diff(w.grad(), wr.grad()), 1e-5);
  }
}

// Max pooling on blocked activations: the same values, the same gradient routing (indices,
// ties, NaN) as the NCHW kernels, which are checked against PyTorch elsewhere.
TEST(Layout, BlockedMaxPoolMatchesNchw) {
  for (DType dt : {DType::F32, DType::F64}) {
    Tensor x = random_tensor({2, 32, 9, 8}, 60, -1, 1, dt);
    {
      // Ties and a NaN in the first image's channel 17 (block 1, lane 1).
      NoGradGuard no_grad;
      std::vector<double> v = x.to_vector<double>();
      const int64_t plane = 9 * 8, base = 17 * plane;
      v[static_cast<size_t>(base + 0)] = v[static_cast<size_t>(base + 1)] = 5.0;
      v[static_cast<size_t>(base + 3 * 8 + 4)] = NAN;
      x = Tensor::from_vector(v, x.shape()).to(dt);
    }
    Tensor xr = with_grad(x.clone()), xb = with_grad(to_channel_blocks(x));
    Tensor yr = max_pool2d(xr, 3, 2, 1);
    Tensor yb = max_pool2d(xb, 3, 2, 1);
    ASSERT_TRUE(is_channel_blocked(yb));
    auto a = from_channel_blocks(yb).to_vector<double>(), e = yr.to_vector<double>();
    ASSERT_EQ(a.size(), e.size());
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_TRUE(a[i] == e[i] || (std::isnan(a[i]) && std::isnan(e[i]))) << "element " << i;
    Tensor g = random_tensor(yr.shape(), 61, -1, 1, dt);
    backward(yr, g);
    backward(yb, to_channel_blocks(g));
    EXPECT_EQ(max_abs_diff(from_channel_blocks(xb.grad()), xr.grad()), 0.0);
  }
}

// batch_norm2d on blocked activations against the NCHW kernels.
void check_blocked_bn(DType dtype, bool training, BatchNormActivation act, double tol) {
  const int64_t c = 32;
  Tensor x = random_tensor({3, c, 5, 4}, 30, -2, 3, dtype);
  Tensor w = random_tensor({c}, 31, 0.5, 1.5, dtype), b = random_tensor({c}, 32, -1, 1, dtype);
  Tensor rm = random_tensor({c}, 33, -0.5, 0.5, dtype), rv = random_tensor({c}, 34, 0.5, 2, dtype);
  Tensor rm_b = rm.clone(), rv_b = rv.clone();
  Tensor xr = with_grad(x.clone()), wr = with_grad(w.clone()), br = with_grad(b.clone());
  Tensor xb = with_grad(to_channel_blocks(x)), wb = with_grad(w.clone()), bb = with_grad(b.clone());
  Tensor yr = batch_norm2d(xr, wr, br, rm, rv, training, 0.1, 1e-5, act);
  Tensor yb = batch_norm2d(xb, wb, bb, rm_b, rv_b, training, 0.1, 1e-5, act);
  ASSERT_TRUE(is_channel_blocked(yb));
  EXPECT_LT(rel_diff(from_channel_blocks(yb), yr), tol);
  EXPECT_LT(rel_diff(rm_b, rm), tol);
  EXPECT_LT(rel_diff(rv_b, rv), tol);
  Tensor g = random_tensor(yr.shape(), 35, -1, 1, dtype);
  backward(yr, g);
  backward(yb, to_channel_blocks(g));
  EXPECT_LT(rel_diff(from_channel_blocks(xb.grad()), xr.grad()), tol);
  EXPECT_LT(rel_diff(wb.grad(), wr.grad()), tol);
  EXPECT_LT(rel_diff(bb.grad(), br.grad()), tol);
}

TEST(Layout, BlockedBatchNormMatchesNchw) {
  for (bool training : {true, false}) {
    for (auto act : {BatchNormActivation::None, BatchNormActivation::Relu}) {
      SCOPED_TRACE(::testing::Message() << "training=" << training
                                        << " relu=" << (act == BatchNormActivation::Relu));
      // Both kernels sum in double, in another order: f32 results differ by a rounding.
      check_blocked_bn(DType::F32, training, act, 1e-6);
      check_blocked_bn(DType::F64, training, act, 1e-13);
    }
  }
}

TEST(Layout, BlockedBatchNormGradcheck) {
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "train" : "eval");
    Tensor x = with_grad(random_tensor({2, 1, 3, 2, 16}, 40, -2, 2));
    Tensor w = with_grad(random_tensor({16}, 41, 0.5, 1.5));
    Tensor b = with_grad(random_tensor({16}, 42, -1, 1));
    Tensor rm = random_tensor({16}, 43), rv = random_tensor({16}, 44, 0.5, 2);
    EXPECT_TRUE(gradcheck(
        [&](const std::vector<Tensor>& in) {
          Tensor m = rm.clone(), v = rv.clone();  // the update must not drift between calls
          return batch_norm2d(in[0], in[1], in[2], m, v, training);
        },
        {x, w, b}));
  }
}

}  // namespace
}  // namespace kiln
