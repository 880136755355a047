// pool2d_channels_last_test.cpp: max, average and adaptive average pooling of channels-last
// inputs on the CPU. The channels-last kernels must give the NCHW kernels' results bit for bit
// (each output compares or sums the same elements in the same order), forward and backward,
// return channels-last outputs and gradients, and reorder nothing on the way
// (memory_format_conversions() unchanged); gradient checks in f64 through a channels-last input.
// 16-bit activations: bf16 and f16 channels-last pools give the 16-bit NCHW pools' bits, which
// are the f32 op's on the widened input rounded once (tests/support/pool2d_lowp.h), with more
// channels than the kernels' f32 sums hold on the stack at once.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/memory_format.h"
#include "layers/pool2d.h"
#include "support/gradcheck.h"
#include "support/pool2d_lowp.h"

namespace kiln {
namespace {

using testing::gradcheck;
using testing::random_tensor;

constexpr MemoryFormat kCL = MemoryFormat::ChannelsLast;

// The values of a 4-D integer tensor in the logical (N, C, H, W) order, whatever its format
// (to_vector() reorders a channels-last tensor with a floating-point transpose).
std::vector<int64_t> int_values(const Tensor& t) {
  if (!t.is_channels_last()) return t.to_vector<int64_t>();
  const std::vector<int64_t> nhwc = t.storage_order_view().to_vector<int64_t>();
  const int64_t N = t.size(0), C = t.size(1), H = t.size(2), W = t.size(3);
  std::vector<int64_t> nchw(nhwc.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < W; ++w)
          nchw[static_cast<size_t>(((n * C + c) * H + h) * W + w)] =
              nhwc[static_cast<size_t>(((n * H + h) * W + w) * C + c)];
  return nchw;
}

// The same values, bit for bit, read in the logical (N, C, H, W) order whatever the formats.
::testing::AssertionResult same_bits(const std::string& what, const Tensor& got,
                                     const Tensor& want) {
  if (got.shape() != want.shape() || got.dtype() != want.dtype())
    return ::testing::AssertionFailure() << what << ": got " << got.str() << ", want "
                                         << want.str();
  auto differ = [&](const auto& g, const auto& w) -> ::testing::AssertionResult {
    for (size_t i = 0; i < w.size(); ++i)
      if (std::memcmp(&g[i], &w[i], sizeof(w[i])) != 0)
        return ::testing::AssertionFailure()
               << what << ": element " << i << " of " << shape_str(want.shape()) << " is "
               << g[i] << ", want " << w[i];
    return ::testing::AssertionSuccess();
  };
  switch (want.dtype()) {
    case DType::F32: return differ(got.to_vector<float>(), want.to_vector<float>());
    case DType::F64: return differ(got.to_vector<double>(), want.to_vector<double>());
    case DType::BF16:
    case DType::F16:  // widening is exact and one-to-one: equal f32 bits, equal 16-bit bits
      return differ(got.to(DType::F32).to_vector<float>(), want.to(DType::F32).to_vector<float>());
    default: return differ(int_values(got), int_values(want));
  }
}

// A pooling op of one input, and what a test calls it.
using PoolFn = std::function<Tensor(const Tensor&)>;
struct PoolOp {
  std::string name;
  PoolFn fn;
};

// The ResNet stem's 3x3/2 padded pool, 2x2/2, overlapping 3x3/1, a window with gaps (2x2/3),
// both average divisors, adaptive to 1x1 (global), to 2x3, and to a size that does not divide.
std::vector<PoolOp> pool_ops() {
  return {
      {"max k3 s2 p1", [](const Tensor& x) { return max_pool2d(x, 3, 2, 1); }},
      {"max k2 s2", [](const Tensor& x) { return max_pool2d(x, 2, 2, 0); }},
      {"max k3 s1 p1", [](const Tensor& x) { return max_pool2d(x, 3, 1, 1); }},
      {"max k2 s3", [](const Tensor& x) { return max_pool2d(x, 2, 3, 0); }},
      {"avg k3 s2 p1", [](const Tensor& x) { return avg_pool2d(x, 3, 2, 1); }},
      {"avg k3 s2 p1 exclude pad",
       [](const Tensor& x) { return avg_pool2d(x, 3, 2, 1, AvgPoolDivisor::ExcludePad); }},
      {"avg k2 s2", [](const Tensor& x) { return avg_pool2d(x, 2, 2, 0); }},
      {"avg k3 s1 p1 exclude pad",
       [](const Tensor& x) { return avg_pool2d(x, 3, 1, 1, AvgPoolDivisor::ExcludePad); }},
      {"adaptive 1x1", [](const Tensor& x) { return adaptive_avg_pool2d(x, 1, 1); }},
      {"adaptive 2x3", [](const Tensor& x) { return adaptive_avg_pool2d(x, 2, 3); }},
      {"adaptive 4x3", [](const Tensor& x) { return adaptive_avg_pool2d(x, 4, 3); }},
  };
}

// Odd sizes, one channel, and one large enough (>= 2^15 elements) for the threaded branch.
const std::vector<Shape> kShapes = {{2, 5, 9, 11}, {1, 1, 7, 6}, {3, 8, 8, 8}, {2, 24, 33, 31}};

// Forward and backward of `op` on x in NCHW and in channels-last: the same bits, channels-last
// results, and no reordering between the channels-last input and its gradient.
void expect_channels_last_matches_nchw(const PoolOp& op, const Tensor& x_nchw, uint32_t seed) {
  Tensor x = x_nchw.detach().set_requires_grad(true);
  Tensor y = op.fn(x);
  const Tensor gy = random_tensor(y.shape(), seed, -1.0, 1.0, x.dtype());
  y.backward(gy);

  Tensor x_cl = x_nchw.to(kCL).detach().set_requires_grad(true);
  const Tensor gy_cl = gy.to(kCL);
  const int64_t before = memory_format_conversions();
  Tensor y_cl = op.fn(x_cl);
  y_cl.backward(gy_cl);
  EXPECT_EQ(memory_format_conversions(), before) << "a reordering copy in forward or backward";

  EXPECT_TRUE(y_cl.is_channels_last());
  EXPECT_TRUE(x_cl.grad().is_channels_last());
  EXPECT_TRUE(same_bits("y", y_cl, y));
  EXPECT_TRUE(same_bits("grad x", x_cl.grad(), x.grad()));
}

TEST(Pool2dChannelsLast, MatchesNchwBitForBitWithoutConversions) {
  for (DType dt : {DType::F32, DType::F64}) {
    for (const Shape& s : kShapes) {
      for (const PoolOp& op : pool_ops()) {
        SCOPED_TRACE(op.name + " on " + shape_str(s) + " " + dtype_name(dt));
        expect_channels_last_matches_nchw(op, random_tensor(s, 3, -1.0, 1.0, dt), 4);
      }
    }
  }
}

TEST(Pool2dChannelsLast, MaxPoolIndicesAreNchwIndicesInNhwcOrder) {
  const Tensor x = random_tensor({2, 6, 9, 10}, 5, -1.0, 1.0, DType::F32);
  auto [y, idx] = max_pool2d_with_indices(x, 3, 2, 1);
  auto [y_cl, idx_cl] = max_pool2d_with_indices(x.to(kCL), 3, 2, 1);
  EXPECT_TRUE(idx_cl.is_channels_last());
  EXPECT_EQ(idx_cl.dtype(), DType::I64);
  EXPECT_TRUE(same_bits("indices", idx_cl, idx));
  EXPECT_TRUE(same_bits("y", y_cl, y));
}

// Ties keep the first element of the window and NaN wins, as in NCHW.
TEST(Pool2dChannelsLast, TiesAndNaNFollowTheNchwRule) {
  std::vector<float> v(2 * 3 * 4 * 4, 0.5f);
  v[1 * 16 + 5] = NAN;  // channel 1, pixel (1, 1)
  v[2 * 16 + 2] = 2.f;  // channel 2: a tie between (0, 2) and (0, 3)
  v[2 * 16 + 3] = 2.f;
  const Tensor x = Tensor::from_vector(v, {2, 3, 4, 4});
  for (int64_t k : {2, 3}) {
    SCOPED_TRACE(k);
    auto [y, idx] = max_pool2d_with_indices(x, k, 1, 1);
    auto [y_cl, idx_cl] = max_pool2d_with_indices(x.to(kCL), k, 1, 1);
    EXPECT_TRUE(same_bits("indices", idx_cl, idx));
    EXPECT_TRUE(same_bits("y", y_cl, y));
  }
}

// The gradient reaching a channels-last pool may be NCHW (its consumer wanted that): it is
// brought into channels-last (one counted reordering) and gives the same gradient.
TEST(Pool2dChannelsLast, AContiguousGradientIsBroughtIntoChannelsLast) {
  const Tensor x = random_tensor({2, 5, 9, 11}, 6, -1.0, 1.0, DType::F32);
  for (const PoolOp& op : pool_ops()) {
    SCOPED_TRACE(op.name);
    Tensor a = x.to(kCL).detach().set_requires_grad(true);
    Tensor b = x.to(kCL).detach().set_requires_grad(true);
    Tensor ya = op.fn(a), yb = op.fn(b);
    const Tensor gy = random_tensor(ya.shape(), 7, -1.0, 1.0, DType::F32);
    ya.backward(gy.to(kCL));
    const int64_t before = memory_format_conversions();
    yb.backward(gy);
    // No copy where both orders are the same bytes (a 1x1 output).
    EXPECT_EQ(memory_format_conversions() - before, formats_coincide(gy) ? 0 : 1);
    EXPECT_TRUE(b.grad().is_channels_last());
    EXPECT_TRUE(same_bits("grad x", b.grad(), a.grad()));
  }
}

TEST(Pool2dChannelsLast, ModulesKeepTheFormat) {
  const Tensor x = random_tensor({2, 4, 8, 8}, 8, -1.0, 1.0, DType::F32).to(kCL);
  MaxPool2d mp(3, 2, 1);
  AvgPool2d ap(2);
  AdaptiveAvgPool2d gap(1);
  EXPECT_TRUE(mp(x).is_channels_last());
  EXPECT_TRUE(ap(x).is_channels_last());
  EXPECT_TRUE(gap(x).is_channels_last());
  EXPECT_TRUE(same_bits("max", mp(x), mp(x.contiguous())));
}

// Gradient checks in f64 through a channels-last input (the leaf is NCHW: gradcheck perturbs
// its elements in place, and the conversion's own gradient is exact). Max-pool values are
// distinct and far apart, so the finite differences never cross a kink.
TEST(Pool2dChannelsLast, GradientChecksInDouble) {
  std::vector<double> v(2 * 3 * 5 * 6);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 37) % v.size()) / 10.0;
  Tensor distinct = Tensor::from_vector(v, {2, 3, 5, 6}).set_requires_grad(true);
  Tensor x = random_tensor({2, 3, 5, 6}, 9).set_requires_grad(true);
  for (const PoolOp& op : pool_ops()) {
    SCOPED_TRACE(op.name);
    const bool is_max = op.name.rfind("max", 0) == 0;
    EXPECT_TRUE(gradcheck(
        [&](const std::vector<Tensor>& in) {
          Tensor y = op.fn(in[0].to(kCL));
          EXPECT_TRUE(y.is_channels_last());
          return y.contiguous();  // gradcheck's sum reads NCHW
        },
        {is_max ? distinct : x}));
  }
}

// bf16 and f16 channels-last, forward and backward: the f32 op on the widened input (its
// channels-last kernels), rounded once, with its indices; the 16-bit NCHW op's bits; no
// reordering. 300 channels: the 16-bit kernels sum 256 channels of a pixel at a time in f32, so
// a second, partial block is taken.
TEST(Pool2dChannelsLast, SixteenBitsMatchTheF32OpRoundedOnceAndNchw) {
  for (DType dt : {DType::BF16, DType::F16}) {
    for (const Shape& s : {Shape{2, 5, 9, 11}, Shape{1, 300, 5, 6}, Shape{2, 24, 33, 31}}) {
      const Tensor x = random_tensor(s, 31, -1.0, 1.0, dt);
      const Tensor x_cl = x.to(kCL);
      for (const testing::LowpPoolOp& op : testing::lowp_pool_ops()) {
        SCOPED_TRACE(op.name + " on " + shape_str(s) + " " + dtype_name(dt));
        const Tensor gy = random_tensor(op.fn(x).shape(), 32, -1.0, 1.0, dt);
        const Tensor gy_cl = gy.to(kCL);
        const int64_t before = memory_format_conversions();
        const testing::LowpPass cl = testing::lowp_pass(op, x_cl, gy_cl);
        EXPECT_EQ(memory_format_conversions(), before) << "a reordering in forward or backward";
        const testing::LowpPass nchw = testing::lowp_pass(op, x, gy);
        EXPECT_TRUE(same_bits("y vs NCHW", cl.y, nchw.y));
        EXPECT_TRUE(same_bits("grad x vs NCHW", cl.grad, nchw.grad));
        testing::expect_lowp_matches_f32(op, x_cl, gy_cl);
      }
    }
  }
}

}  // namespace
}  // namespace kiln
