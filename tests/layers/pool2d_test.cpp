// pool2d_test.cpp: max / average / adaptive average pooling against naive loops written here,
// exact max-pool indices, gradient checks in double (odd shapes, stride != kernel, padding,
// batch 1, 1x1 outputs, adaptive windows that do not divide the input), and the errors.
// Max-pool inputs are permutations of distinct values, so no window has a tie and the
// finite differences never cross a kink (the gap between values is far above eps).
// 16-bit activations (bf16, f16): each op equals the f32 op on the widened input, rounded once,
// bit for bit, forward and backward (tests/support/pool2d_lowp.h says why 0 ulps).
#include "layers/pool2d.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "support/gradcheck.h"
#include "support/pool2d_lowp.h"

namespace kiln {
namespace {

using testing::gradcheck;
using testing::random_tensor;

struct PoolCase {
  int64_t n, c, h, w, k, s, p;
};

std::string case_str(const PoolCase& t) {
  return detail::str("N=", t.n, " C=", t.c, " H=", t.h, " W=", t.w, " k=", t.k, " s=", t.s,
                     " p=", t.p);
}

// Distinct values in [-1, 1), shuffled: element i gets (perm[i] - numel/2) / (numel/2).
Tensor distinct_tensor(const Shape& shape, uint32_t seed, DType dtype = DType::F64) {
  const int64_t numel = shape_numel(shape);
  std::vector<double> v(static_cast<size_t>(numel));
  std::iota(v.begin(), v.end(), 0.0);
  std::shuffle(v.begin(), v.end(), std::mt19937(seed));
  for (auto& x : v) x = (x - numel / 2.0) / (numel / 2.0 + 1);
  Tensor t = Tensor::from_vector(v, shape);
  return dtype == DType::F64 ? t : t.to(dtype);
}

Tensor with_grad(Tensor t) {
  t.set_requires_grad(true);
  return t;
}

// ---- Naive references (one plane at a time, every index spelled out) ----------------------

struct MaxRef {
  std::vector<double> y;
  std::vector<int64_t> idx;
};

MaxRef max_pool_ref(const std::vector<double>& x, const PoolCase& t) {
  const int64_t oh_n = (t.h + 2 * t.p - t.k) / t.s + 1, ow_n = (t.w + 2 * t.p - t.k) / t.s + 1;
  MaxRef r;
  for (int64_t plane = 0; plane < t.n * t.c; ++plane)
    for (int64_t oh = 0; oh < oh_n; ++oh)
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        double best = -std::numeric_limits<double>::infinity();
        int64_t best_i = -1;
        for (int64_t i = 0; i < t.k; ++i)
          for (int64_t j = 0; j < t.k; ++j) {
            int64_t ih = oh * t.s - t.p + i, iw = ow * t.s - t.p + j;
            if (ih < 0 || ih >= t.h || iw < 0 || iw >= t.w) continue;
            double v = x[static_cast<size_t>(plane * t.h * t.w + ih * t.w + iw)];
            if (best_i < 0 || v > best) {
              best = v;
              best_i = ih * t.w + iw;
            }
          }
        r.y.push_back(best);
        r.idx.push_back(best_i);
      }
  return r;
}

std::vector<double> avg_pool_ref(const std::vector<double>& x, const PoolCase& t,
                                 bool count_include_pad) {
  const int64_t oh_n = (t.h + 2 * t.p - t.k) / t.s + 1, ow_n = (t.w + 2 * t.p - t.k) / t.s + 1;
  std::vector<double> y;
  for (int64_t plane = 0; plane < t.n * t.c; ++plane)
    for (int64_t oh = 0; oh < oh_n; ++oh)
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        double s = 0;
        int64_t valid = 0, in_padded = 0;
        for (int64_t i = 0; i < t.k; ++i)
          for (int64_t j = 0; j < t.k; ++j) {
            int64_t ih = oh * t.s - t.p + i, iw = ow * t.s - t.p + j;
            if (ih < t.h + t.p && iw < t.w + t.p) ++in_padded;  // inside input + padding
            if (ih < 0 || ih >= t.h || iw < 0 || iw >= t.w) continue;
            s += x[static_cast<size_t>(plane * t.h * t.w + ih * t.w + iw)];
            ++valid;
          }
        y.push_back(s / static_cast<double>(count_include_pad ? in_padded : valid));
      }
  return y;
}

std::vector<double> adaptive_ref(const std::vector<double>& x, int64_t planes, int64_t h,
                                 int64_t w, int64_t oh_n, int64_t ow_n) {
  std::vector<double> y;
  for (int64_t plane = 0; plane < planes; ++plane)
    for (int64_t oh = 0; oh < oh_n; ++oh)
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        auto h0 = static_cast<int64_t>(std::floor(double(oh) * h / oh_n));
        auto h1 = static_cast<int64_t>(std::ceil(double(oh + 1) * h / oh_n));
        auto w0 = static_cast<int64_t>(std::floor(double(ow) * w / ow_n));
        auto w1 = static_cast<int64_t>(std::ceil(double(ow + 1) * w / ow_n));
        double s = 0;
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw)
            s += x[static_cast<size_t>(plane * h * w + ih * w + iw)];
        y.push_back(s / static_cast<double>((h1 - h0) * (w1 - w0)));
      }
  return y;
}

// Windows of every kind: the 2x2/stride-2 fast path (even and odd sizes), overlapping
// windows (stride < kernel), gaps (stride > kernel), padding, batch 1, 1x1 outputs; the
// first two are large enough (>= 2^15 elements) for the kernels' multi-threaded branch.
const std::vector<PoolCase> kCases = {
    {4, 16, 24, 24, 2, 2, 0}, {3, 11, 35, 33, 3, 2, 1}, {2, 3, 24, 24, 2, 2, 0},
    {1, 2, 7, 5, 2, 2, 0},    {2, 3, 7, 9, 3, 2, 1},
    {1, 2, 6, 7, 3, 1, 1},   {1, 1, 3, 3, 3, 3, 0}, {3, 1, 8, 6, 2, 2, 1},
    {1, 3, 11, 13, 2, 3, 0}, {2, 2, 5, 5, 5, 1, 2}, {1, 1, 1, 1, 1, 1, 0},
};

// ---- Max pooling --------------------------------------------------------------------------

TEST(MaxPool2d, MatchesReferenceWithExactIndices) {
  for (DType dt : {DType::F32, DType::F64}) {
    for (const auto& t : kCases) {
      SCOPED_TRACE(case_str(t) + " " + dtype_name(dt));
      Tensor x = distinct_tensor({t.n, t.c, t.h, t.w}, 7, dt);
      auto [y, idx] = max_pool2d_with_indices(x, t.k, t.s, t.p);
      MaxRef ref = max_pool_ref(x.to_vector<double>(), t);
      ASSERT_EQ(y.dtype(), dt);
      ASSERT_EQ(idx.dtype(), DType::I64);
      ASSERT_EQ(y.shape(), (Shape{t.n, t.c, (t.h + 2 * t.p - t.k) / t.s + 1,
                                  (t.w + 2 * t.p - t.k) / t.s + 1}));
      EXPECT_EQ(y.to_vector<double>(), ref.y);
      EXPECT_EQ(idx.to_vector<int64_t>(), ref.idx);
    }
  }
}

TEST(MaxPool2d, BackwardScattersThroughIndices) {
  for (const auto& t : kCases) {
    SCOPED_TRACE(case_str(t));
    Tensor x = with_grad(distinct_tensor({t.n, t.c, t.h, t.w}, 11, DType::F32));
    Tensor y = max_pool2d(x, t.k, t.s, t.p);
    Tensor gy = random_tensor(y.shape(), 5, -1, 1, DType::F32);
    y.backward(gy);
    MaxRef ref = max_pool_ref(x.to_vector<double>(), t);
    std::vector<double> expect(static_cast<size_t>(x.numel()), 0.0);
    const int64_t out_plane = y.size(2) * y.size(3);
    auto g = gy.to_vector<float>();  // accumulate in float in output order, like the kernel
    std::vector<float> acc(expect.size(), 0.f);
    for (size_t o = 0; o < g.size(); ++o) {
      int64_t plane = static_cast<int64_t>(o) / out_plane;
      acc[static_cast<size_t>(plane * t.h * t.w + ref.idx[o])] += g[o];
    }
    EXPECT_EQ(x.grad().to_vector<float>(), acc);
  }
}

TEST(MaxPool2d, TiesPickTheFirstElementAndNaNPropagates) {
  // All equal: every output points at the first element of its window (row-major).
  Tensor x = Tensor::full({1, 1, 4, 6}, 0.5, DType::F32);
  auto [y, idx] = max_pool2d_with_indices(x, 2);
  EXPECT_EQ(idx.to_vector<int64_t>(), (std::vector<int64_t>{0, 2, 4, 12, 14, 16}));
  auto [y3, idx3] = max_pool2d_with_indices(x, 3, 1, 1);
  EXPECT_EQ(idx3.to_vector<int64_t>()[0], 0);  // window starts in the padding
  EXPECT_EQ(idx3.to_vector<int64_t>()[7], 0);  // (1, 1): rows 0..2, cols 0..2
  // A tie inside a window: the first in row-major order wins, in the fast path too.
  std::vector<float> v = {1, 5, 5, 0};
  Tensor t = Tensor::from_vector(v, {1, 1, 2, 2});
  EXPECT_EQ(max_pool2d_with_indices(t, 2).second.to_vector<int64_t>()[0], 1);
  EXPECT_EQ(max_pool2d_with_indices(t, 2, 1, 1).second.to_vector<int64_t>()[4], 1);  // (1, 1)
  // NaN wins.
  v = {1, NAN, 3, 2};
  t = Tensor::from_vector(v, {1, 1, 2, 2});
  auto [yn, in] = max_pool2d_with_indices(t, 2);
  EXPECT_TRUE(std::isnan(yn.to_vector<float>()[0]));
  EXPECT_EQ(in.to_vector<int64_t>()[0], 1);
}

// ---- Average pooling ----------------------------------------------------------------------

TEST(AvgPool2d, MatchesReference) {
  for (AvgPoolDivisor d : {AvgPoolDivisor::IncludePad, AvgPoolDivisor::ExcludePad}) {
    for (const auto& t : kCases) {
      SCOPED_TRACE(case_str(t));
      Tensor x = random_tensor({t.n, t.c, t.h, t.w}, 9);
      Tensor y = avg_pool2d(x, t.k, t.s, t.p, d);
      auto ref = avg_pool_ref(x.to_vector<double>(), t, d == AvgPoolDivisor::IncludePad);
      ASSERT_EQ(y.numel(), static_cast<int64_t>(ref.size()));
      auto got = y.to_vector<double>();
      for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 1e-12) << i;
    }
  }
}

// ---- Adaptive average pooling -------------------------------------------------------------

struct AdaptiveCase {
  int64_t n, c, h, w, oh, ow;
};
// Divisible, non-divisible (overlapping windows), global (1x1), output larger than input.
const std::vector<AdaptiveCase> kAdaptive = {
    {2, 3, 6, 4, 3, 2}, {1, 2, 7, 5, 3, 2}, {2, 2, 5, 7, 1, 1},
    {1, 1, 3, 3, 5, 4}, {3, 1, 10, 9, 4, 7}, {1, 1, 1, 1, 1, 1},
    {2, 16, 34, 31, 5, 3},  // >= 2^15 elements: the multi-threaded branch
};

TEST(AdaptiveAvgPool2d, MatchesReference) {
  for (const auto& t : kAdaptive) {
    SCOPED_TRACE(detail::str(t.h, "x", t.w, " -> ", t.oh, "x", t.ow));
    Tensor x = random_tensor({t.n, t.c, t.h, t.w}, 2);
    Tensor y = adaptive_avg_pool2d(x, t.oh, t.ow);
    ASSERT_EQ(y.shape(), (Shape{t.n, t.c, t.oh, t.ow}));
    auto ref = adaptive_ref(x.to_vector<double>(), t.n * t.c, t.h, t.w, t.oh, t.ow);
    auto got = y.to_vector<double>();
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 1e-12) << i;
  }
}

// ---- Modules, 3-D inputs, errors ----------------------------------------------------------

TEST(Pool2dModules, MatchFunctionalOps) {
  Tensor x = distinct_tensor({2, 3, 9, 8}, 1, DType::F32);
  MaxPool2d mp(3, 2, 1);
  AvgPool2d ap(2);
  AdaptiveAvgPool2d gap(1);
  EXPECT_EQ(mp(x).to_vector<float>(), max_pool2d(x, 3, 2, 1).to_vector<float>());
  EXPECT_EQ(ap(x).to_vector<float>(), avg_pool2d(x, 2).to_vector<float>());
  EXPECT_EQ(gap(x).shape(), (Shape{2, 3, 1, 1}));
  EXPECT_EQ(mp.describe(), "MaxPool2d(kernel_size=3, stride=2, padding=1)");
  EXPECT_EQ(mp.num_parameters(), 0);
}

TEST(Pool2dModules, ThreeDimensionalInputIsOneImage) {
  Tensor x = distinct_tensor({3, 6, 5}, 4);
  Tensor y = max_pool2d(x, 2);
  ASSERT_EQ(y.shape(), (Shape{3, 3, 2}));
  EXPECT_EQ(y.to_vector<double>(), max_pool2d(x.reshape({1, 3, 6, 5}), 2).to_vector<double>());
  EXPECT_EQ(avg_pool2d(x, 3, 1, 1).shape(), (Shape{3, 6, 5}));
  EXPECT_EQ(adaptive_avg_pool2d(x, 2, 2).shape(), (Shape{3, 2, 2}));
  Tensor xg = with_grad(distinct_tensor({2, 4, 3}, 6));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return max_pool2d(in[0], 2, 1); },
                        {xg}));
}

// Expects `fn` to throw kiln::Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected kiln::Error";
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
        << "message: " << e.what() << "\nmissing: " << p;
  }
}

TEST(Pool2dErrors, NameShapesAndParameters) {
  Tensor x2 = Tensor::zeros({4, 5});
  expect_error([&] { max_pool2d(x2, 2); }, {"max_pool2d", "[4, 5]"});
  expect_error([&] { avg_pool2d(Tensor::zeros({1, 2, 3, 4, 5}), 2); },
               {"avg_pool2d", "[1, 2, 3, 4, 5]"});
  expect_error([&] { adaptive_avg_pool2d(x2, 1, 1); }, {"adaptive_avg_pool2d", "[4, 5]"});
  expect_error([&] { max_pool2d(Tensor::zeros({1, 1, 3, 3}), 5, 1, 0); },
               {"[1, 1, 3, 3]", "kernel_size=5"});
  expect_error([&] { max_pool2d(Tensor::zeros({1, 1, 8, 8}), 2, 2, 2); }, {"padding=2"});
  expect_error([&] { avg_pool2d(Tensor::zeros({1, 1, 8, 8}), 2, 0); }, {"stride=0"});
  expect_error([&] { adaptive_avg_pool2d(Tensor::zeros({1, 1, 8, 8}), 0, 2); }, {"(0, 2)"});
  expect_error([&] { max_pool2d(Tensor::zeros({1, 1, 4, 4}, DType::I64), 2); }, {"i64"});
  expect_error([] { MaxPool2d(3, 1, 2); }, {"MaxPool2d", "padding=2"});
  expect_error([] { AdaptiveAvgPool2d(0); }, {"AdaptiveAvgPool2d"});
}

// ---- 16-bit activations ---------------------------------------------------------------------

// An input of `dt` with many ties (values on a grid of 1/8, so windows hold equal maxima) or
// without (uniform in [-1, 1), rounded).
Tensor lowp_input(const Shape& shape, uint32_t seed, DType dt, bool ties) {
  std::vector<double> v = random_tensor(shape, seed).to_vector<double>();
  if (ties)
    for (double& e : v) e = std::round(e * 8.0) / 8.0;
  return Tensor::from_vector(v, shape).to(dt);
}

// bf16 and f16, NCHW, forward and backward: the f32 op on the widened input, rounded once, with
// the f32 op's max-pool indices. The largest shape is pooled by several OpenMP threads.
TEST(Pool2dLowPrecision, MatchesTheF32OpRoundedOnce) {
  for (DType dt : {DType::BF16, DType::F16}) {
    for (const Shape& s : {Shape{2, 5, 9, 11}, Shape{1, 3, 7, 6}, Shape{2, 16, 32, 33}}) {
      for (bool ties : {false, true}) {
        const Tensor x = lowp_input(s, 21, dt, ties);
        for (const testing::LowpPoolOp& op : testing::lowp_pool_ops()) {
          SCOPED_TRACE(op.name + " on " + shape_str(s) + " " + dtype_name(dt) +
                       (ties ? " with ties" : ""));
          const Tensor gy = random_tensor(op.fn(x).shape(), 22, -1.0, 1.0, DType::F32).to(dt);
          testing::expect_lowp_matches_f32(op, x, gy);
        }
      }
    }
  }
}

// NaN propagates and -inf is a value: the f32 op's results and indices, in 16 bits.
TEST(Pool2dLowPrecision, NanAndInfinityAsTheF32Op) {
  for (DType dt : {DType::BF16, DType::F16}) {
    std::vector<double> v = random_tensor({1, 2, 6, 7}, 23).to_vector<double>();
    v[3] = std::numeric_limits<double>::quiet_NaN();
    v[17] = -std::numeric_limits<double>::infinity();
    v[50] = std::numeric_limits<double>::infinity();
    const Tensor x = Tensor::from_vector(v, {1, 2, 6, 7}).to(dt);
    for (const testing::LowpPoolOp& op : testing::lowp_pool_ops()) {
      SCOPED_TRACE(op.name + " " + dtype_name(dt));
      const Tensor gy = random_tensor(op.fn(x).shape(), 24, -1.0, 1.0, DType::F32).to(dt);
      testing::expect_lowp_matches_f32(op, x, gy);
    }
  }
}

// The channel-blocked layout holds f32 and f64 only (autocast never picks it): a 16-bit blocked
// tensor is refused by name.
TEST(Pool2dLowPrecision, BlockedLayoutRefusesSixteenBits) {
  const Tensor xb = Tensor::zeros({1, 1, 4, 4, 16}, DType::BF16);
  try {
    max_pool2d(xb, 2);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("channel-blocked"), std::string::npos) << msg;
    EXPECT_NE(msg.find("bf16"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace kiln
