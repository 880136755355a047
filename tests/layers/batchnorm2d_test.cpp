// batchnorm2d_test.cpp: BatchNorm2d against a naive per-channel loop written here, the
// running-statistics update of a training step (and the cumulative average of momentum=None),
// eval mode on the running statistics, gradient checks in double in both modes (with and
// without affine parameters, through the module's own parameters), and the shape errors.
// The fused ReLU (BatchNormActivation::Relu): gradient checks in both modes with every output
// kept off the kink, and bit-identity with relu(batch_norm2d(...)) forward and backward, in
// the NCHW layout and the channel-blocked one (layers/layout.h), which has its own kernels,
// including inputs whose normalised value is exactly 0 (the backward's mask must cut exactly
// where the forward wrote 0). 16-bit activations (bf16, f16) in NCHW and channels-last, train
// and eval, with and without the fused ReLU: the f32 layer on the widened input, rounded once.
#include "layers/batchnorm2d.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "parity/parity_harness.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/ops.h"
#include "layers/layout.h"
#include "support/batchnorm_lowp.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::bit_identical;
using testing::check_lowp_matches_f32;
using testing::kCpu;
using testing::ulp16;
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

// ---- Fused ReLU ---------------------------------------------------------------------------

// A bias that keeps every output of batch_norm2d(x, w, bias, ...) at least `margin` away from
// 0, the ReLU's kink: each channel's bias is shifted (which moves the channel's outputs and
// nothing else) by the smallest of 0, +-0.02, +-0.04, ... that clears it. Running stats are
// copied, so the caller's are not updated.
Tensor bias_off_kink(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& rm,
                     const Tensor& rv, bool training, double margin = 0.01) {
  NoGradGuard no_grad;
  const Tensor y = batch_norm2d(x, w, b, rm.defined() ? rm.clone() : Tensor(),
                                rv.defined() ? rv.clone() : Tensor(), training, 0.1, 1e-5);
  const std::vector<double> yv = y.to_vector<double>();
  std::vector<double> bv = b.to_vector<double>();
  const int64_t n = x.size(0), c = x.size(1), hw = x.size(2) * x.size(3);
  for (int64_t ch = 0; ch < c; ++ch) {
    auto clears = [&](double delta) {
      for (int64_t bi = 0; bi < n; ++bi)
        for (int64_t i = 0; i < hw; ++i)
          if (std::abs(yv[static_cast<size_t>((bi * c + ch) * hw + i)] + delta) < margin)
            return false;
      return true;
    };
    double delta = 0;
    for (int k = 1; !clears(delta); ++k) delta = (k % 2 ? 1 : -1) * 0.02 * ((k + 1) / 2);
    bv[static_cast<size_t>(ch)] += delta;
  }
  return Tensor::from_vector(bv, b.shape()).to(b.dtype());
}

// Overwrites the values of a module's parameter or buffer (its accessors return const handles).
void assign(const Tensor& t, const Tensor& values) {
  Tensor handle = t;
  handle.copy_(values);
}

// The fraction of outputs the ReLU zeroed: tests want both sides of the kink populated.
double zero_fraction(const Tensor& y) {
  const std::vector<double> v = y.to_vector<double>();
  return static_cast<double>(std::count(v.begin(), v.end(), 0.0)) / static_cast<double>(v.size());
}

TEST(BatchNorm2d, GradcheckFusedReluTrain) {
  // Odd shapes as for the plain op: batch 1, 1x1 planes, a single channel, M = 2.
  for (Shape s : {Shape{3, 2, 3, 5}, Shape{1, 3, 2, 3}, Shape{4, 1, 1, 1}, Shape{2, 3, 1, 2},
                  Shape{2, 2, 1, 1}}) {
    SCOPED_TRACE(shape_str(s));
    const int64_t c = s[1];
    Tensor x = with_grad(random_tensor(s, 140, -1, 2));
    Tensor w = with_grad(random_tensor({c}, 141, 0.5, 1.5));
    Tensor rm = Tensor::zeros({c}, DType::F64), rv = Tensor::ones({c}, DType::F64);
    Tensor b = with_grad(bias_off_kink(x, w, random_tensor({c}, 142, -0.5, 0.5), rm, rv, true));
    auto f = [&](const std::vector<Tensor>& in) {
      return batch_norm2d(in[0], in[1], in[2], rm, rv, /*training=*/true, 0.1, 1e-5,
                          BatchNormActivation::Relu);
    };
    const double zeros = zero_fraction(f({x, w, b}));
    EXPECT_GT(zeros, 0.0);
    EXPECT_LT(zeros, 1.0);
    EXPECT_TRUE(gradcheck(f, {x, w, b}, 1e-6, 1e-6, 1e-5));
  }
}

TEST(BatchNorm2d, GradcheckFusedReluEval) {
  Tensor x = with_grad(random_tensor({2, 3, 3, 2}, 150));
  Tensor w = with_grad(random_tensor({3}, 151, -1.5, 1.5));  // negative scales too
  Tensor rm = random_tensor({3}, 153), rv = random_tensor({3}, 154, 0.5, 2);
  Tensor b = with_grad(bias_off_kink(x, w, random_tensor({3}, 152), rm, rv, false));
  auto f = [&](const std::vector<Tensor>& in) {
    return batch_norm2d(in[0], in[1], in[2], rm, rv, /*training=*/false, 0.1, 1e-5,
                        BatchNormActivation::Relu);
  };
  const double zeros = zero_fraction(f({x, w, b}));
  EXPECT_GT(zeros, 0.0);
  EXPECT_LT(zeros, 1.0);
  EXPECT_TRUE(gradcheck(f, {x, w, b}));
  // Without affine parameters (the kink is then at the channel's mean; x is moved off it).
  Tensor x2 = random_tensor({2, 2, 3, 3}, 155);
  Tensor rm2 = Tensor::zeros({2}, DType::F64), rv2 = Tensor::ones({2}, DType::F64);
  double* xv = x2.data<double>();
  for (int64_t i = 0; i < x2.numel(); ++i) xv[i] += xv[i] >= 0 ? 0.05 : -0.05;
  x2.set_requires_grad(true);
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) {
    return batch_norm2d(in[0], Tensor(), Tensor(), rm2, rv2, false, 0.1, 1e-5,
                        BatchNormActivation::Relu);
  }, {x2}));
}

TEST(BatchNorm2d, ModuleGradcheckFusedReluThroughItsParameters) {
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "train" : "eval");
    BatchNorm2d bn(3, 1e-5, 0.1, true, DType::F64);
    assign(bn.running_mean(), random_tensor({3}, 160, -0.5, 0.5));
    assign(bn.running_var(), random_tensor({3}, 161, 0.5, 2.0));
    assign(bn.weight(), random_tensor({3}, 162, 0.5, 1.5));
    bn.train(training);
    Tensor x = with_grad(random_tensor({2, 3, 2, 3}, 163, -1, 3));
    assign(bn.bias(), bias_off_kink(x, bn.weight(), bn.bias(), bn.running_mean(),
                                    bn.running_var(), training));
    auto f = [&](const std::vector<Tensor>& in) {
      return bn.forward(in[0], BatchNormActivation::Relu);
    };
    const double zeros = zero_fraction(f({x}));
    EXPECT_GT(zeros, 0.0);
    EXPECT_LT(zeros, 1.0);
    EXPECT_TRUE(gradcheck(f, {x, bn.weight(), bn.bias()}));
  }
}

// batch_norm2d(..., Relu) against relu(batch_norm2d(...)) with the same inputs: the output,
// the running statistics and every gradient are the same bits. One channel has weight 0 and
// bias 0, so its outputs are exactly 0 (the ReLU's tie, masked in both). blocked: x, and so y
// and the gradients, in the channel-blocked layout (C a multiple of 16).
void check_fused_relu_bits(const Shape& s, DType dt, bool training, bool affine, bool running,
                           bool grad_x, bool grad_params, uint32_t seed, bool blocked = false) {
  SCOPED_TRACE(shape_str(s) + " " + dtype_name(dt) + (training ? " train" : " eval") +
               (affine ? " affine" : "") + (running ? " running-stats" : "") +
               (grad_x ? " grad-x" : "") + (grad_params ? " grad-params" : "") +
               (blocked ? " blocked" : ""));
  const int64_t c = s[1];
  auto layout = [&](const Tensor& t) { return blocked ? to_channel_blocks(t).clone() : t; };
  const Tensor x = layout(random_tensor(s, seed, -2.0, 3.0, dt));
  std::vector<double> wv = random_tensor({c}, seed + 1, -1.5, 1.5).to_vector<double>();
  std::vector<double> bv = random_tensor({c}, seed + 2, -0.5, 0.5).to_vector<double>();
  wv[0] = 0;
  bv[0] = 0;
  const Tensor w = Tensor::from_vector(wv, {c}).to(dt), b = Tensor::from_vector(bv, {c}).to(dt);
  const Tensor rm = random_tensor({c}, seed + 3, -0.2, 0.2, dt);
  const Tensor rv = random_tensor({c}, seed + 4, 0.5, 2.0, dt);
  const Tensor gy = layout(random_tensor(s, seed + 5, -1.0, 1.0, dt));
  struct Run {
    Tensor x, w, b, rm, rv, y;
  };
  auto run = [&](bool fused) {
    Run r;
    r.x = x.clone().set_requires_grad(grad_x);
    if (affine) {
      r.w = w.clone().set_requires_grad(grad_params);
      r.b = b.clone().set_requires_grad(grad_params);
    }
    if (running) {
      r.rm = rm.clone();
      r.rv = rv.clone();
    }
    r.y = fused ? batch_norm2d(r.x, r.w, r.b, r.rm, r.rv, training, 0.1, 1e-5,
                               BatchNormActivation::Relu)
                : relu(batch_norm2d(r.x, r.w, r.b, r.rm, r.rv, training, 0.1, 1e-5));
    if (grad_x || (affine && grad_params)) r.y.backward(gy);
    return r;
  };
  const Run plain = run(false), fused = run(true);
  ASSERT_EQ(is_channel_blocked(fused.y), blocked);
  // With affine parameters channel 0 is all zeros; the others must be cut by the ReLU in
  // places, not everywhere.
  const double zeros = zero_fraction(plain.y);
  EXPECT_GT(zeros, affine ? 1.0 / static_cast<double>(c) : 0.0);
  EXPECT_LT(zeros, 1.0);
  EXPECT_TRUE(bit_identical("y", fused.y, plain.y));
  if (running) {
    EXPECT_TRUE(bit_identical("running_mean", fused.rm, plain.rm));
    EXPECT_TRUE(bit_identical("running_var", fused.rv, plain.rv));
  }
  if (grad_x) {
    EXPECT_TRUE(bit_identical("grad x", fused.x.grad(), plain.x.grad()));
  }
  if (affine && grad_params) {
    EXPECT_TRUE(bit_identical("grad weight", fused.w.grad(), plain.w.grad()));
    EXPECT_TRUE(bit_identical("grad bias", fused.b.grad(), plain.b.grad()));
  }
}

TEST(BatchNorm2d, FusedReluIsReluOfBatchNormBitForBit) {
  // Small shapes, and one of 8 x 16 x 16 x 17 = 34,816 >= 2^15 elements: the kernels'
  // multi-threaded branch.
  const Shape shapes[] = {{3, 2, 3, 5}, {1, 3, 2, 3}, {2, 5, 1, 1}, {8, 16, 16, 17}};
  uint32_t seed = 200;
  for (DType dt : {DType::F32, DType::F64})
    for (const Shape& s : shapes)
      for (bool training : {true, false}) {
        check_fused_relu_bits(s, dt, training, true, true, true, true, seed += 10);
        check_fused_relu_bits(s, dt, training, false, true, true, false, seed += 10);
        check_fused_relu_bits(s, dt, training, true, false, true, true, seed += 10);
        check_fused_relu_bits(s, dt, training, true, true, true, false, seed += 10);
        check_fused_relu_bits(s, dt, training, true, true, false, true, seed += 10);
      }
  // The channel-blocked kernels: 32 channels (two blocks), and 2 x 64 x 16 x 16 = 32,768
  // elements for their multi-threaded branch.
  for (DType dt : {DType::F32, DType::F64})
    for (const Shape& s : {Shape{3, 32, 5, 4}, Shape{2, 64, 16, 16}})
      for (bool training : {true, false}) {
        check_fused_relu_bits(s, dt, training, true, true, true, true, seed += 10, true);
        check_fused_relu_bits(s, dt, training, false, true, true, false, seed += 10, true);
        check_fused_relu_bits(s, dt, training, true, true, false, true, seed += 10, true);
      }
}

// x * scale + shift computed with two roundings, as the kernels must (volatile: no FMA).
template <typename T>
T affine_two_roundings(T x, T scale, T shift) {
  volatile T product = x * scale;
  return product + shift;
}

// The fused ReLU's mask where the sign of x * scale + shift depends on its rounding: 0 when
// the product is rounded before the addition, the product's rounding error (of either sign)
// when both are one fused multiply-add. Eval mode with running mean 0, running var 0.25 and
// eps 0 makes scale = 2 * weight and shift = bias exactly; each channel's bias is
// -(x0 * scale) rounded, for its own x0, and the channel holds x0 and its neighbouring floats.
// Whichever rounding the kernels use, and however the backward finds the mask (reading the
// output, or recomputing the affine map), it must cut exactly where the forward wrote 0: the
// fused op is relu(batch_norm2d(...)) to the bit, in NCHW and in blocks.
TEST(BatchNorm2d, FusedReluMaskAtExactZerosOfTheAffineMap) {
  for (DType dt : {DType::F32, DType::F64})
    for (bool blocked : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (blocked ? " blocked" : " NCHW"));
      const int64_t c = 16, hw = 6;
      std::vector<double> xv(static_cast<size_t>(2 * c * hw)), bv(static_cast<size_t>(c));
      const std::vector<double> wv =
          random_tensor({c}, 180, 0.3, 1.7).to(dt).to_vector<double>();
      const std::vector<double> x0 =
          random_tensor({c}, 181, -2.0, 2.0).to(dt).to_vector<double>();
      int zeros = 0, fma_differs = 0;
      for (int64_t ch = 0; ch < c; ++ch) {
        const auto cs = static_cast<size_t>(ch);
        auto fill = [&](auto tag) {
          using T = decltype(tag);
          const T scale = static_cast<T>(2 * wv[cs]), x = static_cast<T>(x0[cs]);
          const T shift = -(x * scale);  // exact negation of the rounded product
          bv[cs] = static_cast<double>(shift);
          const T up = std::nextafter(x, T(10)), down = std::nextafter(x, T(-10));
          const T values[] = {x, up, down, x, std::nextafter(up, T(10)),
                              std::nextafter(down, T(-10))};
          for (int64_t b = 0; b < 2; ++b)
            for (int64_t i = 0; i < hw; ++i) {
              const T v = values[i];
              xv[static_cast<size_t>((b * c + ch) * hw + i)] = static_cast<double>(v);
              const T y = affine_two_roundings(v, scale, shift);
              zeros += y == T(0);
              fma_differs += (y > T(0)) != (std::fma(v, scale, shift) > T(0));
            }
        };
        if (dt == DType::F32) fill(float()); else fill(double());
      }
      // The data exercises the tie: exact zeros with two roundings, and elements where one
      // rounding fewer flips the sign.
      ASSERT_GT(zeros, 0);
      ASSERT_GT(fma_differs, 0);
      const Tensor x_nchw = Tensor::from_vector(xv, {2, c, 1, hw}).to(dt);
      const Tensor gy_nchw = random_tensor({2, c, 1, hw}, 182, -1.0, 1.0, dt);
      auto layout = [&](const Tensor& t) { return blocked ? to_channel_blocks(t).clone() : t; };
      const Tensor rm = Tensor::zeros({c}, dt), rv = Tensor::full({c}, 0.25, dt);
      auto run = [&](bool fused) {
        Tensor x = layout(x_nchw).clone().set_requires_grad(true);
        Tensor w = Tensor::from_vector(wv, {c}).to(dt).set_requires_grad(true);
        Tensor b = Tensor::from_vector(bv, {c}).to(dt).set_requires_grad(true);
        Tensor y = fused ? batch_norm2d(x, w, b, rm, rv, false, 0.1, 0.0,
                                        BatchNormActivation::Relu)
                         : relu(batch_norm2d(x, w, b, rm, rv, false, 0.1, 0.0));
        y.backward(layout(gy_nchw));
        return std::vector<Tensor>{y, x.grad(), w.grad(), b.grad()};
      };
      const std::vector<Tensor> plain = run(false), fused = run(true);
      const char* what[] = {"y", "grad x", "grad weight", "grad bias"};
      for (size_t i = 0; i < plain.size(); ++i)
        EXPECT_TRUE(bit_identical(what[i], fused[i], plain[i]));
    }
}

// The fused ReLU through the blocked kernels, finite differences in double. The bias is moved
// off the kink on the NCHW twin of x (the same function).
TEST(BatchNorm2d, GradcheckFusedReluBlocked) {
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "train" : "eval");
    const Tensor x_nchw = random_tensor({2, 16, 3, 2}, 170, -1, 2);
    Tensor x = with_grad(to_channel_blocks(x_nchw).clone());
    Tensor w = with_grad(random_tensor({16}, 171, 0.5, 1.5));
    Tensor rm = random_tensor({16}, 172, -0.3, 0.3), rv = random_tensor({16}, 173, 0.5, 2.0);
    Tensor b = with_grad(bias_off_kink(x_nchw, w, random_tensor({16}, 174, -0.5, 0.5), rm, rv,
                                       training));
    auto f = [&](const std::vector<Tensor>& in) {
      Tensor m = rm.clone(), v = rv.clone();  // training updates them: keep every call equal
      return batch_norm2d(in[0], in[1], in[2], m, v, training, 0.1, 1e-5,
                          BatchNormActivation::Relu);
    };
    const Tensor y = f({x, w, b});
    ASSERT_TRUE(is_channel_blocked(y));
    const double zeros = zero_fraction(y);
    EXPECT_GT(zeros, 0.0);
    EXPECT_LT(zeros, 1.0);
    EXPECT_TRUE(gradcheck(f, {x, w, b}));
  }
}

// The module: forward(x, Relu) against relu(forward(x)) on a twin, over training steps
// (momentum 0.1 and None) then in eval mode.
TEST(BatchNorm2d, ModuleFusedReluIsReluOfForwardBitForBit) {
  for (DType dt : {DType::F32, DType::F64})
    for (std::optional<double> momentum : {std::optional<double>(0.1), std::optional<double>()}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (momentum ? " momentum 0.1" : " momentum None"));
      BatchNorm2d plain(4, 1e-5, momentum, true, dt), fused(4, 1e-5, momentum, true, dt);
      for (BatchNorm2d* bn : {&plain, &fused}) {
        assign(bn->weight(), random_tensor({4}, 300, -1.5, 1.5));
        assign(bn->bias(), random_tensor({4}, 301, -0.5, 0.5));
      }
      for (uint32_t step = 0; step < 3; ++step) {
        const Tensor x = random_tensor({2, 4, 3, 5}, 310 + step, -1.0 - step, 2.0 + step, dt);
        const Tensor gy = random_tensor({2, 4, 3, 5}, 320 + step, -1.0, 1.0, dt);
        const Tensor y_plain = relu(plain(x));
        const Tensor y_fused = fused.forward(x, BatchNormActivation::Relu);
        y_plain.backward(gy);
        y_fused.backward(gy);
        const std::string at = " step " + std::to_string(step);
        EXPECT_TRUE(bit_identical("train y" + at, y_fused, y_plain));
        EXPECT_TRUE(
            bit_identical("grad weight" + at, fused.weight().grad(), plain.weight().grad()));
        EXPECT_TRUE(bit_identical("grad bias" + at, fused.bias().grad(), plain.bias().grad()));
      }
      EXPECT_TRUE(bit_identical("running_mean", fused.running_mean(), plain.running_mean()));
      EXPECT_TRUE(bit_identical("running_var", fused.running_var(), plain.running_var()));
      EXPECT_EQ(fused.num_batches_tracked().item(), 3);
      plain.eval();
      fused.eval();
      const Tensor x = random_tensor({2, 4, 3, 3}, 330, -1.0, 1.0, dt);
      EXPECT_TRUE(
          bit_identical("eval y", fused.forward(x, BatchNormActivation::Relu), relu(plain(x))));
    }
}

// ---- 16-bit activations ---------------------------------------------------------------------

TEST(BatchNorm2d, LowPrecisionIsF32OfWidenedInputRoundedOnce) {
  // C = 3: channels-last takes the rows view (N * H * W, C); C = 32: on the CPU its
  // channel-blocked view (C % 16 == 0). 8 x 32 x 12 x 12 = 36,864 elements: the multi-threaded
  // branch of the kernels.
  const Shape shapes[] = {{4, 3, 5, 6}, {2, 32, 3, 5}, {8, 32, 12, 12}};
  uint32_t seed = 900;
  for (DType dt : {DType::BF16, DType::F16})
    for (const Shape& s : shapes)
      for (bool channels_last : {false, true})
        for (bool training : {true, false})
          for (bool relu : {false, true})
            check_lowp_matches_f32(kCpu, dt, s, channels_last, training, relu, seed += 10);
}

// The channel-blocked layout (nChw16c) takes 16-bit activations too (its kernels are the ones
// channels-last inputs with C % 16 == 0 run): the same values as the NCHW op.
TEST(BatchNorm2d, LowPrecisionBlockedMatchesNchw) {
  for (DType dt : {DType::BF16, DType::F16}) {
    const Tensor x = random_tensor({2, 32, 3, 4}, 990, -1, 2).to(dt);
    const Tensor w = random_tensor({32}, 991, 0.5, 1.5, DType::F32);
    const Tensor b = random_tensor({32}, 992, -0.5, 0.5, DType::F32);
    const Tensor y = batch_norm2d(x, w, b, Tensor(), Tensor(), true, 0.1, 1e-5,
                                  BatchNormActivation::Relu);
    const Tensor yb = from_channel_blocks(batch_norm2d(to_channel_blocks(x), w, b, Tensor(),
                                                       Tensor(), true, 0.1, 1e-5,
                                                       BatchNormActivation::Relu));
    // The blocked statistics are one pass (E[x^2] - mean^2, batchnorm2d_blocked_cpu.cpp), the
    // NCHW ones two: the same values to within a few f32 roundings, so y within 1 ulp of dt.
    const auto yv = y.to_vector<double>(), ybv = yb.to_vector<double>();
    for (size_t i = 0; i < yv.size(); ++i)
      ASSERT_LE(std::fabs(yv[i] - ybv[i]), ulp16(yv[i], dt)) << dtype_name(dt) << " " << i;
  }
}

TEST(BatchNorm2d, LowPrecisionParametersMustBeF32) {
  const Tensor x = random_tensor({2, 3, 2, 2}, 995).to(DType::BF16);
  const Tensor w_bf16 = Tensor::ones({3}, DType::BF16);
  EXPECT_THROW(batch_norm2d(x, w_bf16, Tensor(), Tensor(), Tensor(), true), Error);
  BatchNorm2d bn(3);
  EXPECT_EQ(bn.forward(x).dtype(), DType::BF16);
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
