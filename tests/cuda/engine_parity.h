// engine_parity.h: comparisons shared by the engine's CUDA parity tests (ops, GEMM, optimizers).
//
//   near(what, got, want, rtol)   element i passes when
//                                   |got_i - want_i| <= rtol * (|want_i| + max_j |want_j|)
//                                 (relative to the element and to the tensor's scale: the
//                                 rounding error of a sum grows with its terms, not its result)
//   bit_identical(what, got, want) the same bytes: for ops whose math is exact on both devices
//                                 (relu, copies, transposes, argmax, single +,-,*,/ per element)
// Both name the first offending element and its two values. Tensors may live on any device.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace kiln::testing {

inline const Device kCpu(DeviceType::CPU, 0);
inline const Device kCuda(DeviceType::CUDA, 0);

// Per-dtype tolerances of results whose summation order differs between devices.
inline double sum_rtol(DType dtype) { return dtype == DType::F64 ? 1e-12 : 2e-5; }

inline ::testing::AssertionResult near(const std::string& what, const Tensor& got,
                                       const Tensor& want, double rtol) {
  if (!got.defined() || got.shape() != want.shape() || got.dtype() != want.dtype())
    return ::testing::AssertionFailure()
           << what << ": got " << (got.defined() ? got.str() : "undefined") << ", want "
           << want.str();
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  double scale = 0;
  for (double v : w) scale = std::fmax(scale, std::fabs(v));
  for (size_t i = 0; i < w.size(); ++i) {
    const double err = std::fabs(g[i] - w[i]);
    const bool both_nan = std::isnan(g[i]) && std::isnan(w[i]);
    if (!both_nan && !(err <= rtol * (std::fabs(w[i]) + scale)))
      return ::testing::AssertionFailure()
             << what << ": element " << i << " of " << shape_str(want.shape()) << " is " << g[i]
             << " on " << got.device().str() << ", " << w[i] << " on " << want.device().str()
             << " (|error| " << err << ", allowed " << rtol * (std::fabs(w[i]) + scale) << ")";
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult bit_identical(const std::string& what, const Tensor& got,
                                                const Tensor& want) {
  if (!got.defined() || got.shape() != want.shape() || got.dtype() != want.dtype())
    return ::testing::AssertionFailure()
           << what << ": got " << (got.defined() ? got.str() : "undefined") << ", want "
           << want.str();
  const Tensor g = got.to(kCpu), w = want.to(kCpu);
  const size_t bytes = static_cast<size_t>(w.numel()) * dtype_size(w.dtype());
  if (bytes == 0 || std::memcmp(g.raw_data(), w.raw_data(), bytes) == 0)
    return ::testing::AssertionSuccess();
  const size_t es = dtype_size(w.dtype());
  const auto* gb = static_cast<const unsigned char*>(g.raw_data());
  const auto* wb = static_cast<const unsigned char*>(w.raw_data());
  const std::vector<double> gv = g.to_vector<double>(), wv = w.to_vector<double>();
  for (size_t i = 0; i < wv.size(); ++i)
    if (std::memcmp(gb + i * es, wb + i * es, es) != 0)
      return ::testing::AssertionFailure()
             << what << ": element " << i << " of " << shape_str(want.shape()) << " is " << gv[i]
             << " on " << got.device().str() << ", " << wv[i] << " on " << want.device().str();
  return ::testing::AssertionFailure() << what << ": bytes differ";
}

// A fresh leaf on `device` with the values of t, requiring grad.
inline Tensor leaf_on(const Tensor& t, Device device) {
  Tensor out = t.to(device).detach();
  out.set_requires_grad(true);
  return out;
}

}  // namespace kiln::testing
