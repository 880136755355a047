// gradcheck.h: finite-difference gradient checks, in double.
//
// For f: inputs -> output, we check the autograd gradient of L = sum(f(x) * w), where w is a
// fixed random tensor (so every output element matters with a different weight), against
// the central difference (L(x + eps) - L(x - eps)) / 2eps for every input element.
// Inputs must be f64 and keep away from kinks (ReLU at 0, max-pool ties): the caller's job.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/tensor.h"

namespace kiln::testing {

// A tensor of f64 values uniform in [lo, hi), from a fixed seed.
inline Tensor random_tensor(const Shape& shape, uint32_t seed, double lo = -1.0, double hi = 1.0,
                            DType dtype = DType::F64) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) x = dist(gen);
  Tensor t = Tensor::from_vector(v, shape);
  return dtype == DType::F64 ? t : t.to(dtype);
}

using TensorFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Checks d/dx_i of sum(f(x) * w) for every input i with requires_grad. Returns a gtest
// assertion result naming the first input and element that disagrees.
inline ::testing::AssertionResult gradcheck(const TensorFn& f, std::vector<Tensor> inputs,
                                            double eps = 1e-6, double atol = 1e-6,
                                            double rtol = 1e-5) {
  for (auto& x : inputs) {
    if (x.dtype() != DType::F64)
      return ::testing::AssertionFailure() << "gradcheck needs f64 inputs, got " << x.str();
  }
  // Analytic gradients.
  for (auto& x : inputs)
    if (x.requires_grad()) x.set_grad(Tensor());
  Tensor out = f(inputs);
  Tensor w = random_tensor(out.shape(), 1234).to(out.device());
  Tensor loss = sum(mul(out, w));
  loss.backward();

  auto eval = [&]() {
    NoGradGuard ng;
    return sum(mul(f(inputs), w)).item();
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor& x = inputs[i];
    if (!x.requires_grad()) continue;
    Tensor g = x.grad();
    if (!g.defined()) return ::testing::AssertionFailure() << "input " << i << " got no gradient";
    if (g.shape() != x.shape())
      return ::testing::AssertionFailure() << "input " << i << " gradient has shape "
                                           << shape_str(g.shape()) << ", expected "
                                           << shape_str(x.shape());
    std::vector<double> analytic = g.to_vector<double>();
    double* xp = x.data<double>();
    for (int64_t k = 0; k < x.numel(); ++k) {
      double orig = xp[k];
      xp[k] = orig + eps;
      double lp = eval();
      xp[k] = orig - eps;
      double lm = eval();
      xp[k] = orig;
      double numeric = (lp - lm) / (2 * eps);
      double a = analytic[static_cast<size_t>(k)];
      if (std::abs(a - numeric) > atol + rtol * std::abs(numeric)) {
        return ::testing::AssertionFailure()
               << "input " << i << " " << shape_str(x.shape()) << " element " << k
               << ": autograd " << a << " vs finite difference " << numeric;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// Max |a - b| over all elements, both converted to double.
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  auto va = a.to_vector<double>();
  auto vb = b.to_vector<double>();
  if (va.size() != vb.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < va.size(); ++i) m = std::max(m, std::abs(va[i] - vb[i]));
  return m;
}

// Largest |a - b| relative to max |b|: how two computations of one result in different orders
// of operations compare.
inline double rel_diff(const Tensor& a, const Tensor& b) {
  double scale = 0;
  for (double v : b.to_vector<double>()) scale = std::max(scale, std::abs(v));
  return max_abs_diff(a, b) / (scale > 0 ? scale : 1.0);
}

}  // namespace kiln::testing
