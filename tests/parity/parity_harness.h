// parity_harness.h: the comparisons every Kiln test of an op against a second implementation
// uses (CPU against CUDA, hand kernels against vendor kernels, a fused op against its
// composition), and the row type of the parity table (tests/parity/parity_cases.cpp).
//
//   near(what, got, want, rtol, atol = 0)  element i passes when
//       |got_i - want_i| <= rtol * (|want_i| + max_j |want_j|) + atol
//       (relative to the element and to the tensor's scale: the rounding error of a sum grows
//       with its terms, not its result; two NaNs in the same place pass)
//   abs_close(what, got, want, atol)       max_i |got_i - want_i| <= atol
//   bit_identical(what, got, want)         the same bytes: for ops whose math is exact on both
//       sides (relu, copies, transposes, argmax, a single + - * / per element, dropout masks)
//   same_values(what, got, want)           the same values read as double, any NaN equal to any
//       NaN (max pooling, whose NaNs may differ in payload)
// All name the first offending element and its two values; tensors may live on any device.
//
// Adding a row to the parity table: see parity_cases.h.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/impl.h"
#include "engine/tensor.h"

namespace kiln::testing {

inline const Device kCpu(DeviceType::CPU, 0);
inline const Device kCuda(DeviceType::CUDA, 0);

// Per-dtype tolerances of results whose summation order differs between devices.
inline double sum_rtol(DType dtype) { return dtype == DType::F64 ? 1e-12 : 2e-5; }

namespace detail_parity {
inline ::testing::AssertionResult same_kind(const std::string& what, const Tensor& got,
                                            const Tensor& want) {
  if (!got.defined() || !want.defined() || got.shape() != want.shape() ||
      got.dtype() != want.dtype())
    return ::testing::AssertionFailure()
           << what << ": got " << (got.defined() ? got.str() : "undefined") << ", want "
           << (want.defined() ? want.str() : "undefined");
  return ::testing::AssertionSuccess();
}
}  // namespace detail_parity

inline ::testing::AssertionResult near(const std::string& what, const Tensor& got,
                                       const Tensor& want, double rtol, double atol = 0) {
  if (auto r = detail_parity::same_kind(what, got, want); !r) return r;
  const std::vector<double> g = got.to(kCpu).to_vector<double>();
  const std::vector<double> w = want.to(kCpu).to_vector<double>();
  double scale = 0;
  for (double v : w) scale = std::fmax(scale, std::fabs(v));
  for (size_t i = 0; i < w.size(); ++i) {
    const double err = std::fabs(g[i] - w[i]);
    const double allowed = rtol * (std::fabs(w[i]) + scale) + atol;
    const bool both_nan = std::isnan(g[i]) && std::isnan(w[i]);
    if (!both_nan && !(err <= allowed))
      return ::testing::AssertionFailure()
             << what << ": element " << i << " of " << shape_str(want.shape()) << " is " << g[i]
             << " on " << got.device().str() << ", " << w[i] << " on " << want.device().str()
             << " (|error| " << err << ", allowed " << allowed << ")";
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult abs_close(const std::string& what, const Tensor& got,
                                            const Tensor& want, double atol) {
  if (auto r = detail_parity::same_kind(what, got, want); !r) return r;
  const std::vector<double> g = got.to(kCpu).to_vector<double>();
  const std::vector<double> w = want.to(kCpu).to_vector<double>();
  for (size_t i = 0; i < w.size(); ++i)
    if (!(std::fabs(g[i] - w[i]) < atol))
      return ::testing::AssertionFailure()
             << what << ": element " << i << " of " << shape_str(want.shape()) << " is " << g[i]
             << ", want " << w[i] << " (|error| " << std::fabs(g[i] - w[i]) << ", allowed "
             << atol << ")";
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult bit_identical(const std::string& what, const Tensor& got,
                                                const Tensor& want) {
  if (auto r = detail_parity::same_kind(what, got, want); !r) return r;
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

inline ::testing::AssertionResult same_values(const std::string& what, const Tensor& got,
                                              const Tensor& want) {
  if (auto r = detail_parity::same_kind(what, got, want); !r) return r;
  if (got.dtype() == DType::I64 || got.dtype() == DType::I32) return bit_identical(what, got, want);
  const std::vector<double> g = got.to(kCpu).to_vector<double>();
  const std::vector<double> w = want.to(kCpu).to_vector<double>();
  for (size_t i = 0; i < w.size(); ++i) {
    const bool same = std::isnan(w[i]) ? std::isnan(g[i])
                                       : std::memcmp(&g[i], &w[i], sizeof(double)) == 0;
    if (!same)
      return ::testing::AssertionFailure()
             << what << ": element " << i << " of " << shape_str(want.shape()) << " is " << g[i]
             << " on " << got.device().str() << ", " << w[i] << " on " << want.device().str();
  }
  return ::testing::AssertionSuccess();
}

// Norm-wise relative error ||got - want||_2 <= rtol * ||want||_2: for results whose every element
// carries rounding errors of its inputs (autocast's bf16/f16 operands), where sums that cancel
// make an element-wise relative bound meaningless. NaN and inf must sit at the same places.
inline ::testing::AssertionResult close_in_norm(const std::string& what, const Tensor& got,
                                                const Tensor& want, double rtol) {
  if (auto r = detail_parity::same_kind(what, got, want); !r) return r;
  const std::vector<double> g = got.to(kCpu).to_vector<double>();
  const std::vector<double> w = want.to(kCpu).to_vector<double>();
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (!std::isfinite(w[i]) || !std::isfinite(g[i])) {
      const bool same = std::isnan(w[i]) ? std::isnan(g[i]) : g[i] == w[i];
      if (!same)
        return ::testing::AssertionFailure() << what << ": element " << i << " is " << g[i]
                                             << ", want " << w[i];
      continue;
    }
    err2 += (g[i] - w[i]) * (g[i] - w[i]);
    ref2 += w[i] * w[i];
  }
  const double err = std::sqrt(err2), ref = std::sqrt(ref2);
  if (err <= rtol * ref) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": relative error " << err / ref
                                       << " in the 2-norm over " << w.size()
                                       << " elements, allowed " << rtol;
}

// A fresh leaf on `device` with the values of t, requiring grad.
inline Tensor leaf_on(const Tensor& t, Device device, bool requires_grad = true) {
  Tensor out = t.to(device).detach();
  out.set_requires_grad(requires_grad);
  return out;
}

// Sets the kernel implementation (hand or vendor) of this thread for a scope.
using ImplScope = KernelsGuard;

// The same for a Variant's enter and leave callbacks, which cannot hold a scoped guard: enter
// pushes a KernelsGuard on this thread's stack, leave pops it (they nest as guards do).
inline std::vector<std::unique_ptr<KernelsGuard>>& variant_kernels() {
  thread_local std::vector<std::unique_ptr<KernelsGuard>> guards;
  return guards;
}
inline void enter_kernels(Impl impl) {
  variant_kernels().push_back(std::make_unique<KernelsGuard>(impl));
}
inline void leave_kernels() { variant_kernels().pop_back(); }

// How a result is compared: the kind, and for Near (relative, see near()) or Abs (absolute)
// the bound. Tol::exact() is bit_identical, Tol::same_values() same_values().
struct Tol {
  enum class Kind { Exact, SameValues, Near, Abs } kind = Kind::Exact;
  double bound = 0;
  static Tol exact() { return {Kind::Exact, 0}; }
  static Tol values() { return {Kind::SameValues, 0}; }
  static Tol rel(double rtol) { return {Kind::Near, rtol}; }
  static Tol abs(double atol) { return {Kind::Abs, atol}; }
};

// One tolerance per floating dtype.
struct DTol {
  Tol f32 = Tol::exact(), f64 = Tol::exact();
  const Tol& operator()(DType dt) const { return dt == DType::F64 ? f64 : f32; }
  static DTol exact() { return {}; }
  static DTol rel(double f32, double f64) { return {Tol::rel(f32), Tol::rel(f64)}; }
  static DTol values() { return {Tol::values(), Tol::values()}; }
  static DTol abs(double f32, double f64) { return {Tol::abs(f32), Tol::abs(f64)}; }
};

// Compares per `tol`; extra_atol widens a Near comparison by an absolute term.
inline ::testing::AssertionResult matches(const Tol& tol, const std::string& what,
                                          const Tensor& got, const Tensor& want,
                                          double extra_atol = 0) {
  if (!got.defined() && !want.defined()) return ::testing::AssertionSuccess();
  switch (tol.kind) {
    case Tol::Kind::Exact: return bit_identical(what, got, want);
    case Tol::Kind::SameValues: return same_values(what, got, want);
    case Tol::Kind::Near: return near(what, got, want, tol.bound, extra_atol);
    case Tol::Kind::Abs: return abs_close(what, got, want, tol.bound);
  }
  return ::testing::AssertionFailure() << what << ": unknown tolerance";
}

}  // namespace kiln::testing
