// precision_gap.h: how far a case's float results are from its double results on the CPU, per
// tensor, and the tolerances of a float comparison (CUDA against the CPU) derived from that gap.
//
// Why. A float comparison of two devices can only be as tight as float carries the case. Where
// a computation cancels (a BatchNorm backward over two values per channel, docs/resnet.md), the
// CPU's own float results are already far from its double ones, two float implementations with
// different summation orders disagree as far, and a fixed tolerance cannot tell a kernel bug
// from rounding: it either fails on rounding or is so loose that it hides bugs. So a model test
// first runs its case on the CPU in double and in float, from the same f32 weights and inputs,
// and measures, per tensor T,
//     gap(T)   = max_i |f32_i - f64_i|          scale(T) = max_i |f64_i|
// Then:
//   conditioning: every tensor must keep a few digits in float, gap <= max_gap * scale, else
//       well_conditioned() fails with "the case is ill-conditioned: f32 and f64 on the CPU
//       already differ by X in T": the remedy is a better case, not a looser tolerance;
//   tolerance: a float result of another device passes when every element is within
//       factor * gap + floor * scale of the CPU's float result (near_within_gap()). The CPU's
//       float error is the measured gap; another device's has the same size for the same
//       reasons, in another summation order, so a small factor covers both, and the floor
//       covers tensors the CPU happens to compute almost exactly. A double comparison of the
//       same case takes the gap scaled by 2^-29 (double's unit roundoff over float's).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/tensor.h"
#include "layers/module.h"

namespace kiln::testing {

struct PrecisionGap {
  std::string name;
  double gap = 0;    // max_i |f32_i - f64_i|
  double scale = 0;  // max_i |f64_i|
  // gap / scale: the float result's error relative to the tensor's size.
  double relative() const { return scale > 0 ? gap / scale : (gap > 0 ? INFINITY : 0.0); }
};

// The gap of one tensor: f32 and f64 of the same shape, on any device.
inline PrecisionGap precision_gap(const std::string& name, const Tensor& f32, const Tensor& f64) {
  PrecisionGap g;
  g.name = name;
  const std::vector<double> a = f32.to(Device(DeviceType::CPU, 0)).to_vector<double>();
  const std::vector<double> b = f64.to(Device(DeviceType::CPU, 0)).to_vector<double>();
  EXPECT_EQ(a.size(), b.size()) << name;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    g.gap = std::fmax(g.gap, std::fabs(a[i] - b[i]));
    g.scale = std::fmax(g.scale, std::fabs(b[i]));
  }
  return g;
}

// The gaps of two lists of named results with the same names in the same order (the floating
// tensors only: counters such as num_batches_tracked are compared exactly elsewhere).
inline std::vector<PrecisionGap> precision_gaps(const NamedTensors& f32, const NamedTensors& f64) {
  std::vector<PrecisionGap> gaps;
  EXPECT_EQ(f32.size(), f64.size());
  for (size_t i = 0; i < std::min(f32.size(), f64.size()); ++i) {
    EXPECT_EQ(f32[i].first, f64[i].first);
    if (!is_floating(f64[i].second.dtype())) continue;
    gaps.push_back(precision_gap(f64[i].first, f32[i].second, f64[i].second));
  }
  return gaps;
}

// The gap named `name` in `gaps`, or null.
inline const PrecisionGap* find_gap(const std::vector<PrecisionGap>& gaps,
                                    const std::string& name) {
  for (const PrecisionGap& g : gaps)
    if (g.name == name) return &g;
  return nullptr;
}

// The largest relative gap of `gaps` (the least well carried tensor).
inline const PrecisionGap& worst_gap(const std::vector<PrecisionGap>& gaps) {
  return *std::max_element(gaps.begin(), gaps.end(), [](const auto& a, const auto& b) {
    return a.relative() < b.relative();
  });
}

// Success when every tensor's gap is at most max_gap times its scale.
inline ::testing::AssertionResult well_conditioned(const std::vector<PrecisionGap>& gaps,
                                                   double max_gap) {
  if (gaps.empty()) return ::testing::AssertionFailure() << "no results to measure";
  const PrecisionGap& w = worst_gap(gaps);
  if (!(w.relative() <= max_gap))
    return ::testing::AssertionFailure()
           << "the case is ill-conditioned: f32 and f64 on the CPU already differ by " << w.gap
           << " in " << w.name << " (largest |value| " << w.scale << ", relative "
           << w.relative() << ", allowed " << max_gap
           << "); a float comparison of this case cannot tell a bug from rounding: change "
              "the case (docs/resnet.md, conditioning)";
  return ::testing::AssertionSuccess();
}

// How a comparison's tolerance follows from the gap. For a double comparison, `unit` scales
// the float gap to double's rounding (2^-29, the ratio of their unit roundoffs): a
// well-conditioned case amplifies both dtypes' rounding alike.
struct GapRule {
  double max_gap;  // the case is ill-conditioned beyond this relative gap
  double factor;   // allowed error = factor * unit * gap + floor * scale
  double floor;
  double unit = 1;
  double allowed(const PrecisionGap& g) const { return factor * unit * g.gap + floor * g.scale; }
};

// got (a result of another device) within rule.allowed(gap) of want (the CPU's result of the
// same dtype) in every element; two NaNs in the same place pass.
inline ::testing::AssertionResult near_within_gap(const std::string& what, const Tensor& got,
                                                  const Tensor& want, const PrecisionGap& gap,
                                                  const GapRule& rule) {
  if (!got.defined() || !want.defined() || got.shape() != want.shape())
    return ::testing::AssertionFailure()
           << what << ": got " << (got.defined() ? got.str() : "undefined") << ", want "
           << (want.defined() ? want.str() : "undefined");
  const std::vector<double> g = got.to(Device(DeviceType::CPU, 0)).to_vector<double>();
  const std::vector<double> w = want.to(Device(DeviceType::CPU, 0)).to_vector<double>();
  const double allowed = rule.allowed(gap);
  for (size_t i = 0; i < w.size(); ++i) {
    const double err = std::fabs(g[i] - w[i]);
    if (!(err <= allowed) && !(std::isnan(g[i]) && std::isnan(w[i])))
      return ::testing::AssertionFailure()
             << what << ": element " << i << " of " << shape_str(want.shape()) << " is " << g[i]
             << " on " << got.device().str() << ", " << w[i] << " on " << want.device().str()
             << " (|error| " << err << ", allowed " << allowed << " = " << rule.factor
             << " x the f32-vs-f64 CPU gap " << gap.gap
             << " x " << rule.unit << " + " << rule.floor
             << " x the largest |value| " << gap.scale << ")";
  }
  return ::testing::AssertionSuccess();
}

// One line per gap, the worst first: name, gap, scale, relative gap.
inline std::string gap_table(std::vector<PrecisionGap> gaps, size_t max_rows = SIZE_MAX) {
  std::sort(gaps.begin(), gaps.end(),
            [](const auto& a, const auto& b) { return a.relative() > b.relative(); });
  std::string out;
  char line[256];
  for (size_t i = 0; i < gaps.size() && i < max_rows; ++i) {
    std::snprintf(line, sizeof line, "  %-36s gap %10.3g  max|f64| %10.3g  relative %10.3g\n",
                  gaps[i].name.c_str(), gaps[i].gap, gaps[i].scale, gaps[i].relative());
    out += line;
  }
  return out;
}

}  // namespace kiln::testing
