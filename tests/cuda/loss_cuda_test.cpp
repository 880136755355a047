// loss_cuda_test.cpp: the fused cross-entropy and the mean squared error on cuda:0 against the
// CPU, in float and double: loss values and gradients (with a seed gradient other than 1, so
// the kernels' read of the incoming gradient is tested), odd shapes (batch 1, 1 class, 7
// classes, rows longer than a warp, more rows than the reduction block has threads, more
// elements than the capped grids cover), huge logits (the max-subtraction), a bad target
// (the CUDA op throws like the CPU's, naming the first bad row), device and dtype errors, and
// finite-difference gradient checks of the CUDA path in double.
//
// Tolerances. Cross-entropy: expf/logf on the device and std::exp/log on the CPU differ by an
// ulp or so, and the row sums run in different orders; in float 2e-6 of the largest value
// covers it, in double 1e-13. MSE: the CPU composes sub, square and mean, and its mean sums in
// T in order (float error grows with n), while the CUDA kernel sums in double. So the CUDA
// result is compared with the CPU op run in double and rounded: 1e-6 in float, 1e-13 in double.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "layers/loss.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::random_tensor;

const Device kCpu(DeviceType::CPU, 0);
const Device kCuda(DeviceType::CUDA, 0);

// |got - want| <= rtol * (|want| + max|want|) element by element, got on any device.
::testing::AssertionResult close(const std::string& what, const Tensor& got, const Tensor& want,
                                 double rtol) {
  if (!got.defined() || !want.defined())
    return ::testing::AssertionFailure() << what << ": undefined tensor";
  if (got.shape() != want.shape())
    return ::testing::AssertionFailure() << what << ": shape " << shape_str(got.shape())
                                         << ", CPU " << shape_str(want.shape());
  const std::vector<double> g = got.to(kCpu).to_vector<double>();
  const std::vector<double> w = want.to(kCpu).to_vector<double>();
  double scale = 0;
  for (double v : w) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < w.size(); ++i) {
    const double err = std::fabs(g[i] - w[i]);
    if (!(err <= rtol * (std::fabs(w[i]) + scale)))
      return ::testing::AssertionFailure()
             << what << ": element " << i << " of " << shape_str(want.shape()) << " is " << g[i]
             << " on CUDA, " << w[i] << " on the CPU (|error| " << err << ", rtol " << rtol
             << ")";
  }
  return ::testing::AssertionSuccess();
}

Tensor leaf(const Tensor& t, Device device, bool requires_grad = true) {
  Tensor out = t.to(device).detach();
  out.set_requires_grad(requires_grad);
  return out;
}

// (N) i64 targets in [0, C), from a fixed seed.
Tensor random_targets(int64_t n, int64_t c, uint32_t seed) {
  std::vector<int64_t> t(static_cast<size_t>(n));
  uint32_t s = seed;
  for (auto& v : t) {
    s = s * 1664525u + 1013904223u;
    v = static_cast<int64_t>((s >> 8) % static_cast<uint32_t>(c));
  }
  return Tensor::from_vector(t, {n});
}

// ---- Cross-entropy --------------------------------------------------------------------------

void check_cross_entropy(int64_t n, int64_t c, DType dtype, uint32_t seed, double lo = -4.0,
                         double hi = 4.0) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " (" + std::to_string(n) + ", " +
               std::to_string(c) + ")");
  const double tol = dtype == DType::F64 ? 1e-13 : 2e-6;
  const Tensor logits = random_tensor({n, c}, seed, lo, hi, dtype);
  const Tensor targets = random_targets(n, c, seed + 1);
  Tensor l_cpu = leaf(logits, kCpu), l_gpu = leaf(logits, kCuda);
  const Tensor loss_cpu = cross_entropy(l_cpu, targets);
  const Tensor loss_gpu = cross_entropy(l_gpu, targets.to(kCuda));
  ASSERT_TRUE(loss_gpu.device() == kCuda);
  ASSERT_EQ(loss_gpu.dim(), 0);
  EXPECT_TRUE(close("loss", loss_gpu, loss_cpu, tol));
  backward(loss_cpu, Tensor::full({}, 0.7, dtype));
  backward(loss_gpu, Tensor::full({}, 0.7, dtype, kCuda));
  EXPECT_TRUE(close("grad logits", l_gpu.grad(), l_cpu.grad(), tol));
}

TEST(CrossEntropyCuda, MatchesCpuOnOddShapes) {
  KILN_SKIP_WITHOUT_CUDA();
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 7},     // batch 1, 7 classes
      {5, 7},
      {3, 1},     // one class: the loss is 0, the gradient 0
      {9, 33},    // a row one longer than a warp
      {37, 129},  // rows over four warp laps; 37 rows = 5 blocks, the last partial
      {300, 10},  // more rows than the finishing block's 256 threads
  };
  uint32_t seed = 100;
  for (DType dtype : {DType::F32, DType::F64})
    for (auto [n, c] : shapes) check_cross_entropy(n, c, dtype, seed += 10);
}

// 1100 x 250 = 275,000 logits > 1024 blocks x 256 threads: the backward's grid-stride loop wraps.
TEST(CrossEntropyCuda, LargeBatchGridStride) {
  KILN_SKIP_WITHOUT_CUDA();
  check_cross_entropy(1100, 250, DType::F32, 7);
}

// Logits of +-1000: exp would overflow without the max subtraction; the loss stays finite.
TEST(CrossEntropyCuda, HugeLogitsStayFinite) {
  KILN_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::F32, DType::F64}) {
    check_cross_entropy(6, 7, dtype, 3, -1000.0, 1000.0);
    const Tensor loss =
        cross_entropy(random_tensor({6, 7}, 3, -1000.0, 1000.0, dtype).to(kCuda),
                      random_targets(6, 7, 4).to(kCuda));
    EXPECT_TRUE(std::isfinite(loss.to(kCpu).item()));
  }
}

// A target outside [0, C) is an input error on both devices; CUDA names the first bad row.
TEST(CrossEntropyCuda, BadTargetThrowsLikeCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor logits = random_tensor({6, 7}, 5, -1.0, 1.0, DType::F32);
  for (int64_t bad : {int64_t{-1}, int64_t{7}, int64_t{1000}}) {
    std::vector<int64_t> t = {0, 1, 2, 3, 4, 5};
    t[2] = bad;
    t[4] = 7;  // a second bad row: the message names the first
    const Tensor targets = Tensor::from_vector(t, {6});
    EXPECT_THROW(cross_entropy(logits, targets), Error);
    try {
      cross_entropy(logits.to(kCuda), targets.to(kCuda));
      ADD_FAILURE() << "no error for target " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Input);
      const std::string msg = e.what();
      EXPECT_NE(msg.find("target " + std::to_string(bad) + " at row 2"), std::string::npos)
          << msg;
      EXPECT_NE(msg.find("outside [0, 7)"), std::string::npos) << msg;
    }
  }
}

TEST(CrossEntropyCuda, TargetsOnAnotherDeviceAreAnError) {
  KILN_SKIP_WITHOUT_CUDA();
  EXPECT_THROW(cross_entropy(Tensor::zeros({2, 3}).to(kCuda), random_targets(2, 3, 1)), Error);
}

TEST(CrossEntropyCuda, GradcheckDouble) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor targets = random_targets(4, 7, 9).to(kCuda);
  auto f = [&](const std::vector<Tensor>& in) {
    return cross_entropy(in[0].to(kCuda), targets).to(kCpu);
  };
  Tensor logits = random_tensor({4, 7}, 8, -2.0, 2.0);
  logits.set_requires_grad(true);
  EXPECT_TRUE(testing::gradcheck(f, {logits}));
}

// ---- Mean squared error ---------------------------------------------------------------------

// The CPU op in double, rounded to dtype: what the CUDA kernel (double accumulation) computes.
struct MseReference {
  Tensor loss, grad_a, grad_b;
};
MseReference mse_reference(const Tensor& a, const Tensor& b, double g, DType dtype) {
  Tensor a64 = leaf(a.to(DType::F64), kCpu), b64 = leaf(b.to(DType::F64), kCpu);
  const Tensor loss = mse_loss(a64, b64);
  backward(loss, Tensor::full({}, g, DType::F64));
  return {loss.to(dtype), a64.grad().to(dtype), b64.grad().to(dtype)};
}

void check_mse(const Shape& shape, DType dtype, uint32_t seed, bool grad_a, bool grad_b) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + shape_str(shape) +
               (grad_a ? " grad a" : "") + (grad_b ? " grad b" : ""));
  const double tol = dtype == DType::F64 ? 1e-13 : 1e-6;
  const Tensor a = random_tensor(shape, seed, -2.0, 2.0, dtype);
  const Tensor b = random_tensor(shape, seed + 1, -2.0, 2.0, dtype);
  const MseReference ref = mse_reference(a, b, 0.3, dtype);
  Tensor a_gpu = leaf(a, kCuda, grad_a), b_gpu = leaf(b, kCuda, grad_b);
  const Tensor loss = mse_loss(a_gpu, b_gpu);
  ASSERT_TRUE(loss.device() == kCuda);
  ASSERT_EQ(loss.dim(), 0);
  EXPECT_TRUE(close("loss", loss, ref.loss, tol));
  backward(loss, Tensor::full({}, 0.3, dtype, kCuda));
  if (grad_a) {
    EXPECT_TRUE(close("grad a", a_gpu.grad(), ref.grad_a, tol));
  }
  if (grad_b) {
    EXPECT_TRUE(close("grad b", b_gpu.grad(), ref.grad_b, tol));
  }
  // The CPU op in dtype itself, loosely (its float mean sums in float).
  EXPECT_TRUE(close("loss vs the CPU op in " + std::string(dtype_name(dtype)), loss,
                    mse_loss(a, b), dtype == DType::F64 ? 1e-12 : 1e-4));
}

TEST(MseLossCuda, MatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  const std::vector<Shape> shapes = {{1}, {7, 3}, {2, 3, 5, 7}, {257}, {1000, 3}};
  uint32_t seed = 200;
  for (DType dtype : {DType::F32, DType::F64})
    for (const Shape& shape : shapes) check_mse(shape, dtype, seed += 10, true, true);
}

TEST(MseLossCuda, EachGradientAlone) {
  KILN_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::F32, DType::F64}) {
    check_mse({5, 7}, dtype, 300, true, false);
    check_mse({5, 7}, dtype, 310, false, true);
  }
}

// 2 * 1024 * 256 + 7 elements: more than the capped grid covers in one lap.
TEST(MseLossCuda, LargeTensorGridStride) {
  KILN_SKIP_WITHOUT_CUDA();
  check_mse({2 * 1024 * 256 + 7}, DType::F32, 400, true, true);
}

TEST(MseLossCuda, MixedDevicesOrDtypesAreErrors) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor a = Tensor::zeros({3}).to(kCuda);
  EXPECT_THROW(mse_loss(a, Tensor::zeros({3})), Error);
  EXPECT_THROW(mse_loss(a, Tensor::zeros({3}, DType::F64).to(kCuda)), Error);
  EXPECT_THROW(mse_loss(a, Tensor::zeros({4}).to(kCuda)), Error);
}

TEST(MseLossCuda, GradcheckDouble) {
  KILN_SKIP_WITHOUT_CUDA();
  auto f = [](const std::vector<Tensor>& in) {
    return mse_loss(in[0].to(kCuda), in[1].to(kCuda)).to(kCpu);
  };
  Tensor a = random_tensor({3, 5}, 11), b = random_tensor({3, 5}, 12);
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  EXPECT_TRUE(testing::gradcheck(f, {a, b}));
}

}  // namespace
}  // namespace kiln
