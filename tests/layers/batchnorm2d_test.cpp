// batchnorm2d_test.cpp: BatchNorm2d against a naive per-channel loop written here, the
// running-statistics update of a training step (and the cumulative average of momentum=None),
// eval mode on the running statistics, gradient checks in double in both modes (with and
// without affine parameters, through the module's own parameters), and the shape errors.
#include "layers/batchnorm2d.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/autograd.h"
#include "engine/error.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::gradcheck;
using testing::max_abs_diff;
using testing::random_tensor;

Tensor with_grad(Tensor t) {
  t.set_requires_grad(true);
  return t;
}

// Per-channel batch statistics of x (N, C, H, W), in double: mean, biased and unbiased var.
struct Stats {
  std::vector<double> mean, var, var_unbiased;
};
Stats ref_stats(const Tensor& x) {
  auto v = x.to_vector<double>();
  const int64_t n = x.size(0), c = x.size(1), hw = x.size(2) * x.size(3);
  const double m = static_cast<double>(n * hw);
  Stats s;
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0, sq = 0;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < hw; ++i) sum += v[static_cast<size_t>((b * c + ch) * hw + i)];
    const double mu = sum / m;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < hw; ++i) {
        double d = v[static_cast<size_t>((b * c + ch) * hw + i)] - mu;
        sq += d * d;
      }
    s.mean.push_back(mu);
    s.var.push_back(sq / m);
    s.var_unbiased.push_back(sq / (m - 1));
  }
  return s;
}

// y = (x - mean) / sqrt(var + eps) * w + b, channel by channel.
std::vector<double> ref_normalise(const Tensor& x, const std::vector<double>& mean,
                                  const std::vector<double>& var, const std::vector<double>& w,
                                  const std::vector<double>& b, double eps) {
  auto v = x.to_vector<double>();
  const int64_t n = x.size(0), c = x.size(1), hw = x.size(2) * x.size(3);
  std::vector<double> y(v.size());
  for (int64_t bi = 0; bi < n; ++bi)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t i = 0; i < hw; ++i) {
        size_t k = static_cast<size_t>((bi * c + ch) * hw + i);
        auto cs = static_cast<size_t>(ch);
        y[k] = (v[k] - mean[cs]) / std::sqrt(var[cs] + eps) * w[cs] + b[cs];
      }
  return y;
}

void expect_near(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

TEST(BatchNorm2d, TrainForwardMatchesReference) {
  for (DType dt : {DType::F64, DType::F32}) {
    const double tol = dt == DType::F64 ? 1e-12 : 2e-5;
    // Shift and scale the inputs so the mean matters: values in [2, 6).
    Tensor x = random_tensor({3, 5, 7, 2}, 1, 2.0, 6.0, dt);
    Tensor w = random_tensor({5}, 2, 0.5, 1.5, dt), b = random_tensor({5}, 3, -1, 1, dt);
    Tensor y = batch_norm2d(x, w, b, Tensor(), Tensor(), /*training=*/true, 0.1, 1e-5);
    Stats s = ref_stats(x);
    expect_near(y.to_vector<double>(),
                ref_normalise(x, s.mean, s.var, w.to_vector<double>(), b.to_vector<double>(),
                              1e-5),
                tol);
  }
}

TEST(BatchNorm2d, TrainStepUpdatesRunningStats) {
  BatchNorm2d bn(3);  // momentum 0.1
  Tensor x1 = random_tensor({4, 3, 5, 3}, 10, -2, 3, DType::F32);
  Tensor x2 = random_tensor({2, 3, 2, 7}, 11, 0, 1, DType::F32);
  Stats s1 = ref_stats(x1), s2 = ref_stats(x2);
  bn(x1);
  std::vector<double> rm(3), rv(3);
  for (size_t c = 0; c < 3; ++c) {
    rm[c] = 0.9 * 0.0 + 0.1 * s1.mean[c];
    rv[c] = 0.9 * 1.0 + 0.1 * s1.var_unbiased[c];  // unbiased, as PyTorch
  }
  expect_near(bn.running_mean().to_vector<double>(), rm, 1e-6);
  expect_near(bn.running_var().to_vector<double>(), rv, 1e-6);
  EXPECT_EQ(bn.num_batches_tracked().to_vector<int64_t>(), std::vector<int64_t>{1});
  bn(x2);
  for (size_t c = 0; c < 3; ++c) {
    rm[c] = 0.9 * rm[c] + 0.1 * s2.mean[c];
    rv[c] = 0.9 * rv[c] + 0.1 * s2.var_unbiased[c];
  }
  expect_near(bn.running_mean().to_vector<double>(), rm, 1e-6);
  expect_near(bn.running_var().to_vector<double>(), rv, 1e-6);
  EXPECT_EQ(bn.num_batches_tracked().to_vector<int64_t>(), std::vector<int64_t>{2});
  EXPECT_FALSE(bn.running_mean().requires_grad());

  // Eval uses the running statistics and leaves them alone.
  bn.eval();
  Tensor x3 = random_tensor({2, 3, 3, 3}, 12, -1, 1, DType::F32);
  Tensor y = bn(x3);
  expect_near(y.to_vector<double>(),
              ref_normalise(x3, rm, rv, {1, 1, 1}, {0, 0, 0}, 1e-5), 1e-5);
  expect_near(bn.running_mean().to_vector<double>(), rm, 1e-6);
  EXPECT_EQ(bn.num_batches_tracked().to_vector<int64_t>(), std::vector<int64_t>{2});
}

TEST(BatchNorm2d, MomentumNoneIsTheCumulativeAverage) {
  BatchNorm2d bn(2, 1e-5, std::nullopt, true, DType::F64);
  Tensor x1 = random_tensor({3, 2, 4, 4}, 20, -1, 2);
  Tensor x2 = random_tensor({3, 2, 4, 4}, 21, 1, 5);
  bn(x1);
  bn(x2);
  Stats s1 = ref_stats(x1), s2 = ref_stats(x2);
  // momentum 1/1 then 1/2: the plain average of the two batches' statistics.
  expect_near(bn.running_mean().to_vector<double>(),
              {(s1.mean[0] + s2.mean[0]) / 2, (s1.mean[1] + s2.mean[1]) / 2}, 1e-12);
  expect_near(bn.running_var().to_vector<double>(),
              {(s1.var_unbiased[0] + s2.var_unbiased[0]) / 2,
               (s1.var_unbiased[1] + s2.var_unbiased[1]) / 2},
              1e-12);
}

TEST(BatchNorm2d, EvalForwardUsesRunningStats) {
  Tensor x = random_tensor({2, 4, 3, 5}, 30);
  Tensor rm = random_tensor({4}, 31, -1, 1), rv = random_tensor({4}, 32, 0.5, 2);
  Tensor w = random_tensor({4}, 33), b = random_tensor({4}, 34);
  Tensor rm0 = rm.clone();
  Tensor y = batch_norm2d(x, w, b, rm, rv, /*training=*/false, 0.1, 1e-3);
  expect_near(y.to_vector<double>(),
              ref_normalise(x, rm.to_vector<double>(), rv.to_vector<double>(),
                            w.to_vector<double>(), b.to_vector<double>(), 1e-3),
              1e-12);
  EXPECT_EQ(max_abs_diff(rm, rm0), 0.0);
}

// A batch large enough (>= 2^15 elements) for the kernels' multi-threaded branch, forward
// and backward against the reference, backward written as in the paper:
//   grad_x = w * invstd * (gy - mean(gy) - xhat * mean(gy * xhat)).
TEST(BatchNorm2d, LargeBatchTrainForwardBackwardMatchReference) {
  const int64_t n = 8, c = 16, h = 16, w = 17, hw = h * w;
  Tensor x = with_grad(random_tensor({n, c, h, w}, 80, -1, 3));
  Tensor wt = with_grad(random_tensor({c}, 81, 0.5, 1.5));
  Tensor bs = with_grad(random_tensor({c}, 82));
  Tensor y = batch_norm2d(x, wt, bs, Tensor(), Tensor(), true, 0.1, 1e-5);
  Stats s = ref_stats(x);
  auto wv = wt.to_vector<double>();
  expect_near(y.to_vector<double>(),
              ref_normalise(x, s.mean, s.var, wv, bs.to_vector<double>(), 1e-5), 1e-12);
  Tensor gy = random_tensor(y.shape(), 83);
  y.backward(gy);
  auto xv = x.to_vector<double>(), gv = gy.to_vector<double>();
  std::vector<double> gx(xv.size()), gw(static_cast<size_t>(c)), gb(static_cast<size_t>(c));
  const double m = static_cast<double>(n * hw);
  for (int64_t ch = 0; ch < c; ++ch) {
    auto cs = static_cast<size_t>(ch);
    const double invstd = 1 / std::sqrt(s.var[cs] + 1e-5);
    auto at = [&](int64_t b, int64_t i) { return static_cast<size_t>((b * c + ch) * hw + i); };
    double mean_gy = 0, mean_gy_xhat = 0;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < hw; ++i) {
        mean_gy += gv[at(b, i)] / m;
        mean_gy_xhat += gv[at(b, i)] * (xv[at(b, i)] - s.mean[cs]) * invstd / m;
      }
    gb[cs] = mean_gy * m;
    gw[cs] = mean_gy_xhat * m;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < hw; ++i) {
        double xhat = (xv[at(b, i)] - s.mean[cs]) * invstd;
        gx[at(b, i)] = wv[cs] * invstd * (gv[at(b, i)] - mean_gy - xhat * mean_gy_xhat);
      }
  }
  expect_near(x.grad().to_vector<double>(), gx, 1e-10);
  expect_near(wt.grad().to_vector<double>(), gw, 1e-9);
  expect_near(bs.grad().to_vector<double>(), gb, 1e-9);
}

TEST(BatchNorm2d, GradcheckTrain) {
  // Odd shapes: batch 1, 1x1 planes (M = N), a single channel.
  for (Shape s : {Shape{3, 2, 3, 5}, Shape{1, 3, 2, 3}, Shape{4, 1, 1, 1}, Shape{2, 3, 1, 2}}) {
    SCOPED_TRACE(shape_str(s));
    const int64_t c = s[1];
    Tensor x = with_grad(random_tensor(s, 40, -1, 2));
    Tensor w = with_grad(random_tensor({c}, 41, 0.5, 1.5));
    Tensor b = with_grad(random_tensor({c}, 42));
    Tensor rm = Tensor::zeros({c}, DType::F64), rv = Tensor::ones({c}, DType::F64);
    EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) {
      return batch_norm2d(in[0], in[1], in[2], rm, rv, /*training=*/true, 0.1, 1e-5);
    }, {x, w, b}, 1e-6, 1e-6, 1e-5));
  }
}

TEST(BatchNorm2d, GradcheckEval) {
  Tensor x = with_grad(random_tensor({2, 3, 3, 2}, 50));
  Tensor w = with_grad(random_tensor({3}, 51, 0.5, 1.5));
  Tensor b = with_grad(random_tensor({3}, 52));
  Tensor rm = random_tensor({3}, 53), rv = random_tensor({3}, 54, 0.5, 2);
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) {
    return batch_norm2d(in[0], in[1], in[2], rm, rv, /*training=*/false, 0.1, 1e-5);
  }, {x, w, b}));
}

TEST(BatchNorm2d, GradcheckWithoutAffineAndPartialGrads) {
  Tensor x = with_grad(random_tensor({2, 2, 3, 3}, 60));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) {
    return batch_norm2d(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5);
  }, {x}));
  // Only the weight requires grad (x is data): gradients still flow to it.
  Tensor xd = random_tensor({2, 2, 3, 3}, 61);
  Tensor w = with_grad(random_tensor({2}, 62, 0.5, 1.5));
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) {
    return batch_norm2d(xd, in[0], Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5);
  }, {w}));
}

TEST(BatchNorm2d, ModuleGradcheckThroughItsParameters) {
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "train" : "eval");
    BatchNorm2d bn(3, 1e-5, 0.1, true, DType::F64);
    bn.train(training);
    Tensor x = with_grad(random_tensor({2, 3, 2, 3}, 70, -1, 3));
    // The module's own leaves are perturbed in place by the check.
    EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return bn(in[0]); },
                          {x, bn.weight(), bn.bias()}));
  }
}

TEST(BatchNorm2d, ModuleState) {
  BatchNorm2d bn(4);
  auto sd = bn.state_dict();
  for (const char* k : {"weight", "bias", "running_mean", "running_var", "num_batches_tracked"})
    EXPECT_EQ(sd.count(k), 1u) << k;
  EXPECT_EQ(bn.num_parameters(), 8);
  EXPECT_EQ(bn.weight().to_vector<float>(), std::vector<float>(4, 1.f));
  EXPECT_EQ(bn.running_var().to_vector<float>(), std::vector<float>(4, 1.f));
  EXPECT_EQ(bn.num_batches_tracked().dtype(), DType::I64);
  EXPECT_EQ(bn.describe(), "BatchNorm2d(4, eps=1e-05, momentum=0.1, affine=true)");
  BatchNorm2d plain(4, 1e-5, 0.1, /*affine=*/false);
  EXPECT_EQ(plain.num_parameters(), 0);
  EXPECT_EQ(plain.named_buffers().size(), 3u);
}

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

TEST(BatchNorm2d, ErrorsNameTheShapes) {
  BatchNorm2d bn(3);
  expect_error([&] { bn(Tensor::zeros({2, 4, 5, 5})); }, {"BatchNorm2d(3)", "[2, 4, 5, 5]"});
  expect_error([&] { bn(Tensor::zeros({3, 5, 5})); }, {"BatchNorm2d", "[3, 5, 5]"});
  expect_error([&] { bn(Tensor::zeros({1, 3, 1, 1})); }, {"more than 1 value", "[1, 3, 1, 1]"});
  Tensor x = Tensor::zeros({2, 3, 2, 2});
  expect_error([&] { batch_norm2d(x, Tensor::ones({4}), Tensor(), Tensor(), Tensor(), true); },
               {"weight", "[4]", "[2, 3, 2, 2]"});
  expect_error([&] {
    batch_norm2d(x, Tensor(), Tensor(), Tensor::zeros({3}, DType::F64), Tensor::ones({3}), false);
  }, {"running_mean", "f64"});
  expect_error([&] { batch_norm2d(x, Tensor(), Tensor(), Tensor::zeros({3}), Tensor(), false); },
               {"running_var"});
  expect_error([] { BatchNorm2d(0); }, {"num_features=0"});
  expect_error([] { BatchNorm2d(3, 1e-5, 1.5); }, {"momentum"});
  // Eval with running statistics works on a single value per channel.
  bn.eval();
  EXPECT_EQ(bn(Tensor::ones({1, 3, 1, 1})).shape(), (Shape{1, 3, 1, 1}));
}

}  // namespace
}  // namespace kiln
