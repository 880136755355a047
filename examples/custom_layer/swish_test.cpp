// swish_test.cpp: Swish's gradients against finite differences (double), its CUDA kernels
// against its CPU kernels (when Kiln has a CUDA backend and a device is present: a GPU, or the
// simulator's), and a training run whose loss falls.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "spirals.h"
#include "swish.h"
#include "engine/cuda/context.h"  // cuda::is_available() (false in a build without CUDA)

using kiln::Tensor;
using swish_example::swish;

namespace {

std::vector<double> random_values(int64_t n, uint32_t seed, double lo, double hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = u(rng);
  return v;
}

std::vector<double> values_of(const Tensor& t) {
  const Tensor c = t.detach().to(kiln::Device()).to(kiln::DType::F64);
  return std::vector<double>(c.data<double>(), c.data<double>() + c.numel());
}

// L(x, beta) = sum(swish(x, beta) * w): a loss whose gradient reaches every element.
double loss_value(const std::vector<double>& x, double beta, const Tensor& w) {
  kiln::NoGradGuard no_grad;
  const int64_t n = static_cast<int64_t>(x.size());
  const Tensor y = swish(Tensor::from_vector(x, {n}), Tensor::from_vector(std::vector<double>{beta}, {1}));
  return kiln::sum(y * w).item();
}

bool cuda_device_present() { return kiln::cuda::is_available(); }

}  // namespace

TEST(Swish, MatchesTheFormula) {
  const std::vector<double> x = {-3.0, -0.5, 0.0, 0.25, 2.0};
  const double beta = 1.5;
  const std::vector<double> y = values_of(
      swish(Tensor::from_vector(x, {5}), Tensor::from_vector(std::vector<double>{beta}, {1})));
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(y[i], x[i] / (1.0 + std::exp(-beta * x[i])), 1e-15) << "element " << i;
}

TEST(Swish, GradientsMatchFiniteDifferencesInDouble) {
  const int64_t n = 24;
  const std::vector<double> x0 = random_values(n, 1, -4.0, 4.0);
  const Tensor w = Tensor::from_vector(random_values(n, 2, -1.0, 1.0), {n});
  for (double beta0 : {0.5, 1.0, 1.7}) {
    Tensor x = Tensor::from_vector(x0, {n});
    Tensor beta = Tensor::from_vector(std::vector<double>{beta0}, {1});
    x.set_requires_grad(true);
    beta.set_requires_grad(true);
    kiln::sum(swish(x, beta) * w).backward();
    const std::vector<double> gx = values_of(x.grad());
    const double gbeta = values_of(beta.grad())[0];

    const double h = 1e-6;  // central differences: error O(h^2), rounding O(eps / h)
    for (int64_t i = 0; i < n; ++i) {
      std::vector<double> plus = x0, minus = x0;
      plus[static_cast<size_t>(i)] += h;
      minus[static_cast<size_t>(i)] -= h;
      const double numeric = (loss_value(plus, beta0, w) - loss_value(minus, beta0, w)) / (2 * h);
      EXPECT_NEAR(gx[static_cast<size_t>(i)], numeric, 1e-7) << "dL/dx[" << i << "], beta " << beta0;
    }
    const double numeric_beta =
        (loss_value(x0, beta0 + h, w) - loss_value(x0, beta0 - h, w)) / (2 * h);
    EXPECT_NEAR(gbeta, numeric_beta, 1e-7) << "dL/dbeta, beta " << beta0;
  }
}

// The CUDA kernels against the CPU kernels: forward, dx and dbeta, in f32 and f64, on a size
// that is not a multiple of the block (a partial last block).
TEST(Swish, CudaMatchesCpu) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA backend in this Kiln build, or no device";
  const int64_t n = 1000;
  for (kiln::DType dtype : {kiln::DType::F32, kiln::DType::F64}) {
    const double tol = dtype == kiln::DType::F32 ? 1e-5 : 1e-12;
    std::vector<double> y[2], gx[2], gbeta[2];
    int d = 0;
    for (kiln::Device device : {kiln::Device("cpu"), kiln::Device("cuda")}) {
      Tensor x = Tensor::from_vector(random_values(n, 3, -5.0, 5.0), {n}).to(dtype).to(device);
      Tensor beta = Tensor::full({1}, 1.3, dtype, device);
      const Tensor w = Tensor::from_vector(random_values(n, 4, -1.0, 1.0), {n}).to(dtype).to(device);
      x.set_requires_grad(true);
      beta.set_requires_grad(true);
      const Tensor out = swish(x, beta);
      kiln::sum(out * w).backward();
      y[d] = values_of(out);
      gx[d] = values_of(x.grad());
      gbeta[d] = values_of(beta.grad());
      ++d;
    }
    for (int64_t i = 0; i < n; ++i) {
      const size_t k = static_cast<size_t>(i);
      ASSERT_NEAR(y[0][k], y[1][k], tol * (1 + std::abs(y[0][k]))) << "y[" << i << "]";
      ASSERT_NEAR(gx[0][k], gx[1][k], tol * (1 + std::abs(gx[0][k]))) << "gx[" << i << "]";
    }
    // A sum of n terms, reduced in a different order on each device.
    EXPECT_NEAR(gbeta[0][0], gbeta[1][0], tol * 100 * (1 + std::abs(gbeta[0][0])));
  }
}

TEST(Swish, RejectsABetaOfTheWrongShape) {
  const Tensor x = Tensor::ones({3});
  EXPECT_THROW(swish(x, Tensor::ones({2})), kiln::Error);
}

// The MLP learns the spirals: the loss falls to well under half and the held-out accuracy is
// high (measured on the CPU: loss 1.10 -> ~0.05, accuracy ~99%).
TEST(SwishTraining, LossFallsOnTheCpu) {
  const swish_example::TrainResult r = swish_example::train_spirals(kiln::Device("cpu"), 300, 0);
  EXPECT_LT(r.final_loss, 0.5 * r.first_loss);
  EXPECT_GT(r.accuracy, 0.9);
  EXPECT_NE(r.beta1, 1.0);  // beta is learnt
}

TEST(SwishTraining, LossFallsOnCuda) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA backend in this Kiln build, or no device";
  const swish_example::TrainResult r = swish_example::train_spirals(kiln::Device("cuda"), 100, 0);
  EXPECT_LT(r.final_loss, 0.5 * r.first_loss);
}
