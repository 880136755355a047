// batchnorm2d_cuda_test.cpp: BatchNorm2d on cuda:0 against the CPU kernels (the specification),
// in float and double: the training forward (batch statistics and the running-stat update),
// the eval forward (running statistics), backward for x, weight and bias (each alone too, so
// every branch of the backward launcher runs), the module over several training steps
// (momentum 0.1 and the cumulative momentum=None) then in eval mode, and a finite-difference
// gradient check of the CUDA path in double.
//
// Shapes are odd on purpose: C = 1, 3, 33; N = 1; 1x1 images; a channel of M = 2 values (the
// fewest batch statistics allow); channels with more values than a reduction block has threads
// (M > 256, so threads stride); and one tensor large enough that the element-wise kernels'
// grid-stride loop wraps (> 4096 blocks x 256 threads).
//
// The fused ReLU (BatchNormActivation::Relu) runs through the same cases: its forward, running
// statistics and gradients against the CPU's fused op, and against relu(batch_norm2d(...)) on
// cuda:0 bit for bit (the fused kernels change no bits on either device).
//
// Tolerances. Both devices accumulate in double, so in double the results agree to rounding
// (1e-12 relative to the tensor's scale). In float the statistics are rounded from double to
// float on both sides and agree but for the last bit when the two summation orders straddle a
// rounding boundary; a few float operations follow: 2e-5 covers it. With the fused ReLU the
// same bounds hold: the mask is each device's own output > 0, and no output of these inputs
// lies within a rounding error of 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "layers/batchnorm2d.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"
#include "engine_parity.h"

namespace kiln {
namespace {

using testing::random_tensor;

const Device kCpu(DeviceType::CPU, 0);
const Device kCuda(DeviceType::CUDA, 0);

double tolerance(DType dtype) { return dtype == DType::F64 ? 1e-12 : 2e-5; }

// |got - want| <= rtol * (|want| + max|want|) + atol element by element, got on any device.
::testing::AssertionResult close(const std::string& what, const Tensor& got, const Tensor& want,
                                 double rtol, double atol = 0) {
  if (!got.defined() || !want.defined())
    return ::testing::AssertionFailure() << what << ": undefined tensor (got "
                                         << got.defined() << ", want " << want.defined() << ")";
  if (got.shape() != want.shape())
    return ::testing::AssertionFailure() << what << ": shape " << shape_str(got.shape())
                                         << ", CPU " << shape_str(want.shape());
  const std::vector<double> g = got.to(kCpu).to_vector<double>();
  const std::vector<double> w = want.to(kCpu).to_vector<double>();
  double scale = 0;
  for (double v : w) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < w.size(); ++i) {
    const double err = std::fabs(g[i] - w[i]);
    if (!(err <= rtol * (std::fabs(w[i]) + scale) + atol))  // also catches NaN
      return ::testing::AssertionFailure()
             << what << ": element " << i << " of " << shape_str(want.shape()) << " is " << g[i]
             << " on CUDA, " << w[i] << " on the CPU (|error| " << err << ", rtol " << rtol
             << ")";
  }
  return ::testing::AssertionSuccess();
}

Tensor leaf(const Tensor& t, Device device, bool requires_grad) {
  Tensor out = t.to(device).detach();
  out.set_requires_grad(requires_grad);
  return out;
}

struct Shape4 {
  int64_t n, c, h, w;
};

std::string describe(const Shape4& s, DType dtype) {
  return std::string(dtype_name(dtype)) + " (" + std::to_string(s.n) + ", " +
         std::to_string(s.c) + ", " + std::to_string(s.h) + ", " + std::to_string(s.w) + ")";
}

// The shapes every functional test runs on.
const std::vector<Shape4> kShapes = {
    {2, 1, 3, 3},    // C = 1
    {1, 3, 2, 5},    // N = 1
    {4, 33, 1, 1},   // 1x1 images, C = 33
    {1, 1, 1, 2},    // M = 2: the smallest batch statistics
    {3, 3, 13, 11},  // M = 429 > 256 threads: each thread sums several values
    {2, 33, 4, 5},
};

// What to give the op: weight/bias present or not, running stats present or not, mode.
struct Config {
  bool affine, running, training;
  bool grad_x, grad_params;  // which inputs require grad
};

std::string describe(const Config& k) {
  return std::string(k.training ? "train" : "eval") + (k.affine ? " affine" : " no-affine") +
         (k.running ? " running-stats" : " no-running-stats") + (k.grad_x ? " grad-x" : "") +
         (k.grad_params ? " grad-params" : "");
}

// Runs batch_norm2d with the same inputs on the CPU and on cuda:0, forward and backward, and
// compares the output, the running statistics after the call and every gradient. With a fused
// ReLU, also runs relu(batch_norm2d(...)) on cuda:0 and requires the same bits as the fused op.
void check_parity(const Shape4& s, DType dtype, const Config& k, uint32_t seed,
                  BatchNormActivation activation = BatchNormActivation::None) {
  const bool fused_relu = activation == BatchNormActivation::Relu;
  SCOPED_TRACE(describe(s, dtype) + " " + describe(k) + (fused_relu ? " fused-relu" : ""));
  const double tol = tolerance(dtype);
  const Tensor x = random_tensor({s.n, s.c, s.h, s.w}, seed, -2.0, 3.0, dtype);
  const Tensor w = random_tensor({s.c}, seed + 1, 0.5, 1.5, dtype);
  const Tensor b = random_tensor({s.c}, seed + 2, -0.5, 0.5, dtype);
  const Tensor rm = random_tensor({s.c}, seed + 3, -0.2, 0.2, dtype);
  const Tensor rv = random_tensor({s.c}, seed + 4, 0.5, 2.0, dtype);
  const Tensor gy = random_tensor({s.n, s.c, s.h, s.w}, seed + 5, -1.0, 1.0, dtype);

  struct Run {
    Tensor x, w, b, rm, rv, y;
  };
  auto run = [&](Device device, bool unfused = false) {
    Run r;
    r.x = leaf(x, device, k.grad_x);
    if (k.affine) {
      r.w = leaf(w, device, k.grad_params);
      r.b = leaf(b, device, k.grad_params);
    }
    if (k.running) {  // copies: training updates them in place (to(kCpu) would share)
      r.rm = rm.clone().to(device);
      r.rv = rv.clone().to(device);
    }
    r.y = unfused ? relu(batch_norm2d(r.x, r.w, r.b, r.rm, r.rv, k.training, 0.1, 1e-5))
                  : batch_norm2d(r.x, r.w, r.b, r.rm, r.rv, k.training, 0.1, 1e-5, activation);
    if (k.grad_x || (k.affine && k.grad_params)) backward(r.y, gy.to(device));
    return r;
  };
  const Run cpu = run(kCpu);
  const Run gpu = run(kCuda);
  ASSERT_TRUE(gpu.y.device() == kCuda);
  EXPECT_TRUE(close("y", gpu.y, cpu.y, tol));
  if (fused_relu) {
    // The ReLU cut some outputs, not all (checked where there are enough of them: the two
    // values of shape (1, 1, 1, 2) may well be both cut).
    const std::vector<double> yv = cpu.y.to_vector<double>();
    const auto zeros = std::count(yv.begin(), yv.end(), 0.0);
    if (yv.size() >= 8) {
      EXPECT_GT(zeros, 0);
      EXPECT_LT(zeros, static_cast<int64_t>(yv.size()));
    }
    const Run plain = run(kCuda, /*unfused=*/true);
    EXPECT_TRUE(testing::bit_identical("fused y vs relu(y)", gpu.y, plain.y));
    if (k.running) {
      EXPECT_TRUE(testing::bit_identical("fused running_mean", gpu.rm, plain.rm));
      EXPECT_TRUE(testing::bit_identical("fused running_var", gpu.rv, plain.rv));
    }
    if (k.grad_x) {
      EXPECT_TRUE(testing::bit_identical("fused grad x", gpu.x.grad(), plain.x.grad()));
    }
    if (k.affine && k.grad_params) {
      EXPECT_TRUE(testing::bit_identical("fused grad weight", gpu.w.grad(), plain.w.grad()));
      EXPECT_TRUE(testing::bit_identical("fused grad bias", gpu.b.grad(), plain.b.grad()));
    }
  }
  if (k.running) {
    EXPECT_TRUE(close("running_mean", gpu.rm, cpu.rm, tol));
    EXPECT_TRUE(close("running_var", gpu.rv, cpu.rv, tol));
  }
  if (k.grad_x) {
    // grad_x = k * grad_y - a * (x - mean) + d per channel, k = weight * invstd, each term of
    // the size of k * grad_y. With two values per channel (M = 2) x_hat is +-1 up to eps and
    // the terms cancel to ~eps / var of their size, so one rounding of a term, which the two
    // devices may place differently (whether a multiply-add is fused is up to each kernel and
    // compiler), is a large part of the result. Errors are also allowed relative to the
    // terms' size.
    const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>();
    const std::vector<double> rvv = rv.to_vector<double>(), gyv = gy.to_vector<double>();
    const bool batch_stats = k.training || !k.running;
    const int64_t hw = s.h * s.w;
    double terms = 0;
    for (int64_t ch = 0; ch < s.c; ++ch) {
      double var = rvv[static_cast<size_t>(ch)];
      if (batch_stats) {
        double sum = 0, sq = 0;
        for (int64_t b = 0; b < s.n; ++b)
          for (int64_t i = 0; i < hw; ++i)
            sum += xv[static_cast<size_t>((b * s.c + ch) * hw + i)];
        const double mean = sum / static_cast<double>(s.n * hw);
        for (int64_t b = 0; b < s.n; ++b)
          for (int64_t i = 0; i < hw; ++i) {
            const double dx = xv[static_cast<size_t>((b * s.c + ch) * hw + i)] - mean;
            sq += dx * dx;
          }
        var = sq / static_cast<double>(s.n * hw);
      }
      const double weight = k.affine ? std::fabs(wv[static_cast<size_t>(ch)]) : 1.0;
      terms = std::max(terms, weight / std::sqrt(var + 1e-5));
    }
    double max_gy = 0;
    for (double g : gyv) max_gy = std::max(max_gy, std::fabs(g));
    EXPECT_TRUE(close("grad x", gpu.x.grad(), cpu.x.grad(), tol, tol * terms * max_gy));
  }
  if (k.affine && k.grad_params) {
    EXPECT_TRUE(close("grad weight", gpu.w.grad(), cpu.w.grad(), tol));
    EXPECT_TRUE(close("grad bias", gpu.b.grad(), cpu.b.grad(), tol));
  }
}

TEST(BatchNorm2dCuda, TrainingMatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  uint32_t seed = 10;
  for (DType dtype : {DType::F32, DType::F64})
    for (const Shape4& s : kShapes) {
      check_parity(s, dtype, {true, true, true, true, true}, seed += 10);
      check_parity(s, dtype, {false, true, true, true, false}, seed += 10);
    }
}

TEST(BatchNorm2dCuda, EvalUsesRunningStatsLikeCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  uint32_t seed = 1000;
  for (DType dtype : {DType::F32, DType::F64})
    for (const Shape4& s : kShapes) {
      check_parity(s, dtype, {true, true, false, true, true}, seed += 10);
      check_parity(s, dtype, {false, true, false, true, false}, seed += 10);
    }
  // One value per channel is fine in eval mode (no batch statistics).
  check_parity({1, 3, 1, 1}, DType::F32, {true, true, false, true, true}, 7);
}

TEST(BatchNorm2dCuda, WithoutRunningStatsUsesBatchStatsInBothModes) {
  KILN_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::F32, DType::F64})
    for (bool training : {true, false})
      check_parity({3, 3, 5, 7}, dtype, {true, false, training, true, true}, 3000);
}

// The backward launcher's branches: only grad_x (no parameter sums in eval mode), only the
// parameter gradients (no grad_x workspace), both.
TEST(BatchNorm2dCuda, EachGradientAlone) {
  KILN_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::F32, DType::F64})
    for (bool training : {true, false}) {
      check_parity({2, 3, 4, 5}, dtype, {true, true, training, true, false}, 4000);
      check_parity({2, 3, 4, 5}, dtype, {true, true, training, false, true}, 4100);
    }
}

// 2 x 3 x 420 x 420 = 1,058,400 elements > 4096 blocks x 256 threads: the element-wise
// kernels' grid-stride loops take a second lap, and each channel reduces 352,800 values.
TEST(BatchNorm2dCuda, LargeTensorGridStride) {
  KILN_SKIP_WITHOUT_CUDA();
  check_parity({2, 3, 420, 420}, DType::F32, {true, true, true, true, true}, 5000);
}

// ---- Fused ReLU -----------------------------------------------------------------------------

TEST(BatchNorm2dCuda, FusedReluTrainingMatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  uint32_t seed = 6000;
  for (DType dtype : {DType::F32, DType::F64})
    for (const Shape4& s : kShapes) {
      check_parity(s, dtype, {true, true, true, true, true}, seed += 10,
                   BatchNormActivation::Relu);
      check_parity(s, dtype, {false, true, true, true, false}, seed += 10,
                   BatchNormActivation::Relu);
    }
}

TEST(BatchNorm2dCuda, FusedReluEvalMatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  uint32_t seed = 7000;
  for (DType dtype : {DType::F32, DType::F64}) {
    for (const Shape4& s : kShapes) {
      check_parity(s, dtype, {true, true, false, true, true}, seed += 10,
                   BatchNormActivation::Relu);
      check_parity(s, dtype, {false, true, false, true, false}, seed += 10,
                   BatchNormActivation::Relu);
    }
    // No running statistics: batch statistics in eval mode too.
    check_parity({3, 3, 5, 7}, dtype, {true, false, false, true, true}, seed += 10,
                 BatchNormActivation::Relu);
  }
  // Batch 1 of 1x1 images: one value per channel, fine in eval mode.
  check_parity({1, 3, 1, 1}, DType::F32, {true, true, false, true, true}, 17,
               BatchNormActivation::Relu);
}

// The masked gradient through each branch of the backward launcher: grad_x alone, the
// parameter gradients alone.
TEST(BatchNorm2dCuda, FusedReluEachGradientAlone) {
  KILN_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::F32, DType::F64})
    for (bool training : {true, false}) {
      check_parity({2, 3, 4, 5}, dtype, {true, true, training, true, false}, 8000,
                   BatchNormActivation::Relu);
      check_parity({2, 3, 4, 5}, dtype, {true, true, training, false, true}, 8100,
                   BatchNormActivation::Relu);
    }
}

// > 4096 blocks x 256 threads: the fused forward and the masked backward take a second lap of
// their grid-stride loops.
TEST(BatchNorm2dCuda, FusedReluLargeTensorGridStride) {
  KILN_SKIP_WITHOUT_CUDA();
  check_parity({2, 3, 420, 420}, DType::F32, {true, true, true, true, true}, 8200,
               BatchNormActivation::Relu);
}

// The module's forward(x, Relu) on cuda:0 and on the CPU over training steps, then eval.
TEST(BatchNorm2dCuda, ModuleFusedReluOverTrainingStepsThenEval) {
  KILN_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(dtype));
    const double tol = tolerance(dtype);
    BatchNorm2d cpu(5, 1e-5, 0.1, true, dtype);
    BatchNorm2d gpu(5, 1e-5, 0.1, true, dtype);
    gpu.to(kCuda);
    for (uint32_t step = 0; step < 3; ++step) {
      const std::string at = ", step " + std::to_string(step);
      const Tensor x = random_tensor({3, 5, 4, 3}, 90 + step, -1.0 - step, 2.0 + step, dtype);
      const Tensor gy = random_tensor({3, 5, 4, 3}, 95 + step, -1.0, 1.0, dtype);
      const Tensor y_cpu = cpu.forward(x, BatchNormActivation::Relu);
      const Tensor y_gpu = gpu.forward(x.to(kCuda), BatchNormActivation::Relu);
      EXPECT_TRUE(close("train y" + at, y_gpu, y_cpu, tol));
      backward(y_cpu, gy);
      backward(y_gpu, gy.to(kCuda));
      EXPECT_TRUE(close("grad weight" + at, gpu.weight().grad(), cpu.weight().grad(), tol));
      EXPECT_TRUE(close("grad bias" + at, gpu.bias().grad(), cpu.bias().grad(), tol));
    }
    EXPECT_TRUE(close("running_mean", gpu.running_mean(), cpu.running_mean(), tol));
    EXPECT_TRUE(close("running_var", gpu.running_var(), cpu.running_var(), tol));
    cpu.eval();
    gpu.eval();
    const Tensor x = random_tensor({2, 5, 3, 3}, 99, -1.0, 1.0, dtype);
    EXPECT_TRUE(close("eval y", gpu.forward(x.to(kCuda), BatchNormActivation::Relu),
                      cpu.forward(x, BatchNormActivation::Relu), tol));
  }
}

// Finite differences through the fused CUDA kernels, in both modes. The inputs are checked to
// keep every output at least 1e-3 from the ReLU's kink (central differences step 1e-6).
TEST(BatchNorm2dCuda, FusedReluGradcheckDouble) {
  KILN_SKIP_WITHOUT_CUDA();
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "train" : "eval");
    const Tensor rm = random_tensor({3}, 71, -0.2, 0.2).to(kCuda);
    const Tensor rv = random_tensor({3}, 72, 0.5, 2.0).to(kCuda);
    auto f = [&](const std::vector<Tensor>& in, BatchNormActivation act) {
      Tensor m = rm.to(kCpu).to(kCuda), v = rv.to(kCpu).to(kCuda);
      return batch_norm2d(in[0].to(kCuda), in[1].to(kCuda), in[2].to(kCuda), m, v, training,
                          0.1, 1e-5, act)
          .to(kCpu);
    };
    Tensor x = random_tensor({2, 3, 2, 3}, 73, -1.0, 1.0);
    Tensor w = random_tensor({3}, 74, 0.5, 1.5);
    Tensor b = random_tensor({3}, 75, -0.5, 0.5);
    const std::vector<double> pre = f({x, w, b}, BatchNormActivation::None).to_vector<double>();
    int positive = 0;
    for (double v : pre) {
      ASSERT_GT(std::fabs(v), 1e-3) << "an output at the kink: pick other inputs";
      positive += v > 0;
    }
    EXPECT_GT(positive, 0);
    EXPECT_LT(positive, static_cast<int>(pre.size()));
    for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
    EXPECT_TRUE(testing::gradcheck(
        [&](const std::vector<Tensor>& in) { return f(in, BatchNormActivation::Relu); },
        {x, w, b}));
  }
}

// The module on cuda:0 and on the CPU through several training steps (new batches each time),
// then eval mode: running statistics, num_batches_tracked and outputs stay equal.
TEST(BatchNorm2dCuda, ModuleRunningStatsOverTrainingStepsThenEval) {
  KILN_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::F32, DType::F64})
    for (std::optional<double> momentum : {std::optional<double>(0.1), std::optional<double>()}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) +
                   (momentum ? " momentum 0.1" : " momentum None"));
      const double tol = tolerance(dtype);
      BatchNorm2d cpu(5, 1e-5, momentum, true, dtype);
      BatchNorm2d gpu(5, 1e-5, momentum, true, dtype);
      gpu.to(kCuda);
      ASSERT_TRUE(gpu.running_mean().device() == kCuda);
      for (uint32_t step = 0; step < 4; ++step) {
        // A different scale and offset each step, so the running statistics keep moving.
        const Tensor x =
            random_tensor({3, 5, 4, 3}, 50 + step, -1.0 - step, 2.0 + 2 * step, dtype);
        const Tensor y_cpu = cpu(x);
        const Tensor y_gpu = gpu(x.to(kCuda));
        EXPECT_TRUE(close("train y, step " + std::to_string(step), y_gpu, y_cpu, tol));
      }
      EXPECT_TRUE(close("running_mean", gpu.running_mean(), cpu.running_mean(), tol));
      EXPECT_TRUE(close("running_var", gpu.running_var(), cpu.running_var(), tol));
      EXPECT_EQ(gpu.num_batches_tracked().to(kCpu).item(), 4);
      cpu.eval();
      gpu.eval();
      const Tensor x = random_tensor({2, 5, 3, 3}, 99, -1.0, 1.0, dtype);
      EXPECT_TRUE(close("eval y", gpu(x.to(kCuda)), cpu(x), tol));
    }
}

// Finite differences through the CUDA kernels: the inputs live on the CPU (gradcheck nudges
// them there) and the op runs on cuda:0 between two differentiable copies.
TEST(BatchNorm2dCuda, GradcheckDouble) {
  KILN_SKIP_WITHOUT_CUDA();
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "train" : "eval");
    const Tensor rm = random_tensor({3}, 61, -0.2, 0.2).to(kCuda);
    const Tensor rv = random_tensor({3}, 62, 0.5, 2.0).to(kCuda);
    auto f = [&](const std::vector<Tensor>& in) {
      // Running stats are updated by every training call: copies keep gradcheck's repeated
      // evaluations identical.
      Tensor m = rm.to(kCpu).to(kCuda), v = rv.to(kCpu).to(kCuda);
      return batch_norm2d(in[0].to(kCuda), in[1].to(kCuda), in[2].to(kCuda), m, v, training)
          .to(kCpu);
    };
    Tensor x = random_tensor({2, 3, 2, 3}, 63, -1.0, 1.0);
    Tensor w = random_tensor({3}, 64, 0.5, 1.5);
    Tensor b = random_tensor({3}, 65, -0.5, 0.5);
    for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
    EXPECT_TRUE(testing::gradcheck(f, {x, w, b}));
  }
}

}  // namespace
}  // namespace kiln
