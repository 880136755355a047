// grad_scaler_test.cpp: loss scaling (engine/optim/grad_scaler.h) on the CPU.
//
//   - unscale_ finds exactly the steps whose gradients hold +inf, -inf or NaN, injected at chosen
//     steps into different parameters (f32 small, f32 large enough for the OpenMP path, f64),
//     and the skipped steps leave the parameters untouched;
//   - the scale follows the rule exactly: a hand-written trace with growth_interval 3, and the
//     default interval of 2000 over 10,000 steps; static mode never changes it; the f32 bounds;
//   - unscale divides exactly: bit-exact against the unscaled values for power-of-two scales,
//     and equal to a division otherwise; a finite gradient that overflows when unscaled counts;
//   - scale() is differentiable; state_dict round trips (also through a checkpoint file) and
//     its strict checks; invalid options.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/optim/grad_scaler.h"
#include "engine/optim/sgd.h"
#include "engine/serialize.h"
#include "engine/tensor.h"

namespace kiln {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// The expected history as (step, scale) pairs.
std::vector<std::pair<int64_t, double>> history_of(const GradScaler& s) {
  std::vector<std::pair<int64_t, double>> out;
  for (const auto& c : s.history()) out.emplace_back(c.step, c.scale);
  return out;
}

TEST(GradScaler, SkipsExactlyTheStepsWithNonFiniteGradients) {
  // Three parameters: f32 (5), f32 (40000: above the CPU kernel's OpenMP threshold), f64 (7).
  std::vector<Tensor> params = {
      Tensor::full({5}, 1.0).set_requires_grad(true),
      Tensor::full({40000}, 2.0).set_requires_grad(true),
      Tensor::full({7}, 3.0, DType::F64).set_requires_grad(true),
  };
  SGD opt(params, 0.25);
  GradScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 4;
  GradScaler scaler(o);
  // step -> (parameter, element, value) injected after scaling.
  struct Inject {
    int step;
    size_t param;
    int64_t elem;
    double value;
  };
  const std::vector<Inject> injections = {
      {2, 0, 4, kInf}, {5, 1, 0, -kInf}, {6, 2, 3, kNaN}, {9, 1, 39999, kNaN},
      {9, 0, 0, kInf},  // two parameters at once
      {13, 1, 20000, kInf},
  };
  std::set<int> bad_steps;
  for (const Inject& in : injections) bad_steps.insert(in.step);

  int64_t skipped = 0;
  for (int step = 0; step < 16; ++step) {
    const double s = scaler.scale_value();
    std::vector<std::vector<double>> before;
    for (Tensor& p : params) before.push_back(p.to_vector<double>());
    // Gradient k of element i: (k + 1) * 0.5^(i % 3), times the scale, as backward would give.
    for (size_t k = 0; k < params.size(); ++k) {
      std::vector<double> g(static_cast<size_t>(params[k].numel()));
      for (size_t i = 0; i < g.size(); ++i) g[i] = (k + 1) * std::ldexp(1.0, -static_cast<int>(i % 3)) * s;
      for (const Inject& in : injections)
        if (in.step == step && in.param == k) g[static_cast<size_t>(in.elem)] = in.value;
      Tensor t = Tensor::from_vector(g, params[k].shape()).to(params[k].dtype());
      params[k].set_grad(t);
    }
    const bool found = scaler.unscale_(params);
    EXPECT_EQ(found, bad_steps.count(step) == 1) << "step " << step;
    if (!found) {
      // Unscaled exactly (power-of-two scale).
      for (size_t k = 0; k < params.size(); ++k) {
        const std::vector<double> g = params[k].grad().to_vector<double>();
        for (size_t i = 0; i < g.size(); ++i)
          ASSERT_EQ(g[i], (k + 1) * std::ldexp(1.0, -static_cast<int>(i % 3))) << k << " " << i;
      }
    }
    const bool run = scaler.update(found);
    EXPECT_EQ(run, !found);
    if (run) opt.step();
    skipped += found ? 1 : 0;
    for (size_t k = 0; k < params.size(); ++k) {
      const std::vector<double> now = params[k].to_vector<double>();
      if (found) {
        EXPECT_EQ(now, before[k]) << "a skipped step changed parameter " << k;
      } else {
        EXPECT_EQ(now[0], before[k][0] - 0.25 * (k + 1)) << "step " << step << " param " << k;
      }
    }
  }
  EXPECT_EQ(scaler.steps(), 16);
  EXPECT_EQ(scaler.skipped_steps(), skipped);
  EXPECT_EQ(skipped, static_cast<int64_t>(bad_steps.size()));
}

TEST(GradScaler, ScaleFollowsTheRuleWithASmallInterval) {
  GradScalerOptions o;
  o.init_scale = 8;
  o.growth_interval = 3;
  GradScaler s(o);
  // F: finite, I: inf. Expected scale AFTER each update, by hand:
  //   F F F   -> 8 8 16     (3 finite in a row: grow; tracker back to 0)
  //   F F I   -> 16 16 8    (inf: back off, tracker 0)
  //   F F F   -> 8 8 16
  //   I I     -> 8 4        (back off twice)
  //   F F F F -> 4 4 8 8
  const std::string pattern = "FFFFFIFFFIIFFFF";
  const std::vector<double> expected = {8, 8, 16, 16, 16, 8, 8, 8, 16, 8, 4, 4, 4, 8, 8};
  const std::vector<int64_t> tracker = {1, 2, 0, 1, 2, 0, 1, 2, 0, 0, 0, 1, 2, 0, 1};
  for (size_t i = 0; i < pattern.size(); ++i) {
    const bool inf = pattern[i] == 'I';
    EXPECT_EQ(s.update(inf), !inf);
    EXPECT_EQ(s.scale_value(), expected[i]) << "after update " << i;
    EXPECT_EQ(s.growth_tracker(), tracker[i]) << "after update " << i;
  }
  EXPECT_EQ(s.steps(), 15);
  EXPECT_EQ(s.skipped_steps(), 3);
  // Each change is stamped with the first step that uses the new scale.
  const std::vector<std::pair<int64_t, double>> want = {
      {0, 8}, {3, 16}, {6, 8}, {9, 16}, {10, 8}, {11, 4}, {14, 8}};
  EXPECT_EQ(history_of(s), want);
}

TEST(GradScaler, DefaultRuleOverTenThousandSteps) {
  GradScaler s;  // 2^16, x2 every 2000 finite steps, x0.5 on inf
  EXPECT_EQ(s.scale_value(), 65536.0);
  for (int i = 0; i < 10000; ++i) ASSERT_TRUE(s.update(false));
  EXPECT_EQ(s.scale_value(), std::ldexp(1.0, 21));  // five growths
  std::vector<std::pair<int64_t, double>> want = {{0, 65536.0}};
  for (int k = 1; k <= 5; ++k) want.emplace_back(2000 * k, std::ldexp(1.0, 16 + k));
  EXPECT_EQ(history_of(s), want);
  // 1999 finite steps, then an inf: the tracker restarts, so 1999 more do not grow it...
  for (int i = 0; i < 1999; ++i) s.update(false);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale_value(), std::ldexp(1.0, 20));
  for (int i = 0; i < 1999; ++i) s.update(false);
  EXPECT_EQ(s.scale_value(), std::ldexp(1.0, 20));
  // ...and the 2000th does.
  s.update(false);
  EXPECT_EQ(s.scale_value(), std::ldexp(1.0, 21));
  EXPECT_EQ(s.steps(), 10000 + 2000 + 2000);
  EXPECT_EQ(s.skipped_steps(), 1);
  want.emplace_back(12000, std::ldexp(1.0, 20));
  want.emplace_back(14000, std::ldexp(1.0, 21));
  EXPECT_EQ(history_of(s), want);
}

TEST(GradScaler, StaticScaleNeverChangesButStillSkips) {
  GradScalerOptions o;
  o.init_scale = 128;
  o.dynamic = false;
  o.growth_interval = 1;
  GradScaler s(o);
  const std::string pattern = "FFIFFFIIFF";
  for (char c : pattern) {
    EXPECT_EQ(s.update(c == 'I'), c != 'I');
    EXPECT_EQ(s.scale_value(), 128.0);
  }
  EXPECT_EQ(s.skipped_steps(), 3);
  EXPECT_EQ(s.steps(), 10);
  EXPECT_EQ(s.history().size(), 1u);
}

TEST(GradScaler, ScaleStaysAPositiveFiniteF32) {
  GradScalerOptions o;
  o.init_scale = std::ldexp(1.0, 126);
  o.growth_interval = 1;
  GradScaler grow(o);
  grow.update(false);
  EXPECT_EQ(grow.scale_value(), std::ldexp(1.0, 127));
  grow.update(false);  // 2^128 is inf in f32: not made, and not recorded
  EXPECT_EQ(grow.scale_value(), std::ldexp(1.0, 127));
  EXPECT_EQ(grow.history().size(), 2u);

  o.init_scale = std::ldexp(1.0, -148);  // the second smallest f32 subnormal
  GradScaler shrink(o);
  shrink.update(true);
  EXPECT_EQ(shrink.scale_value(), std::ldexp(1.0, -149));
  shrink.update(true);  // 0: not made
  EXPECT_EQ(shrink.scale_value(), std::ldexp(1.0, -149));

  // A factor that is not a power of two: computed in f32, as PyTorch does.
  GradScalerOptions p;
  p.init_scale = 1.0;
  p.growth_factor = 1.1;
  p.growth_interval = 1;
  GradScaler odd(p);
  odd.update(false);
  odd.update(false);
  EXPECT_EQ(odd.scale_value(), static_cast<double>(1.1f * 1.1f));
}

TEST(GradScaler, UnscaleIsExactForPowersOfTwoAndADivisionOtherwise) {
  // Values with every mantissa pattern across a wide exponent range.
  std::vector<float> v;
  uint32_t x = 12345;
  for (int i = 0; i < 5000; ++i) {
    x = x * 1664525u + 1013904223u;
    const float m = 1.0f + static_cast<float>(x >> 9) * 0x1p-23f;
    v.push_back(std::ldexp((x & 1) ? -m : m, static_cast<int>(x % 120) - 60));
  }
  for (double scale : {65536.0, 1.0, 0.25, std::ldexp(1.0, 40), 3.0, 1000.0}) {
    GradScalerOptions o;
    o.init_scale = scale;
    GradScaler s(o);
    Tensor p = Tensor::zeros({static_cast<int64_t>(v.size())}).set_requires_grad(true);
    std::vector<float> scaled(v.size());
    for (size_t i = 0; i < v.size(); ++i) scaled[i] = v[i] * static_cast<float>(scale);
    p.set_grad(Tensor::from_vector(scaled, p.shape()));
    ASSERT_FALSE(s.unscale_({p}));
    const std::vector<float> g = p.grad().to_vector<float>();
    const bool pow2 = std::exp2(std::round(std::log2(scale))) == scale;
    for (size_t i = 0; i < v.size(); ++i) {
      const float want = pow2 ? v[i] : scaled[i] / static_cast<float>(scale);
      ASSERT_EQ(bits_of(g[i]), bits_of(want)) << "scale " << scale << " element " << i;
    }
  }
}

TEST(GradScaler, AFiniteGradientThatOverflowsWhenUnscaledCounts) {
  GradScalerOptions o;
  o.init_scale = 0.5;  // a scale below 1 multiplies when unscaling
  GradScaler s(o);
  Tensor p = Tensor::zeros({3}).set_requires_grad(true);
  p.set_grad(Tensor::from_vector<float>({1.0f, 3e38f, -2.0f}, {3}));
  EXPECT_TRUE(s.unscale_({p}));
  p.set_grad(Tensor::from_vector<float>({1.0f, 1e38f, -2.0f}, {3}));
  EXPECT_FALSE(s.unscale_({p}));
  EXPECT_EQ(p.grad().to_vector<float>(), (std::vector<float>{2.0f, 2e38f, -4.0f}));
}

TEST(GradScaler, ParametersWithoutGradientsAreSkipped) {
  GradScaler s;
  Tensor a = Tensor::zeros({2}).set_requires_grad(true);
  Tensor b = Tensor::zeros({2}).set_requires_grad(true);
  EXPECT_FALSE(s.unscale_({a, b}));  // no gradient at all
  b.set_grad(Tensor::from_vector<float>({65536.0f, kNaN}, {2}));
  EXPECT_TRUE(s.unscale_({a, b}));
  EXPECT_FALSE(a.grad().defined());
}

TEST(GradScaler, ScaleIsDifferentiable) {
  GradScalerOptions o;
  o.init_scale = 256;
  GradScaler s(o);
  Tensor w = Tensor::from_vector<float>({1.0f, -2.0f, 0.5f}, {3}).set_requires_grad(true);
  Tensor loss = sum(square(w));
  Tensor scaled = s.scale(loss);
  EXPECT_EQ(scaled.item(), 256.0 * loss.item());
  scaled.backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{512.0f, -1024.0f, 256.0f}));
  EXPECT_FALSE(s.unscale_({w}));
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{2.0f, -4.0f, 1.0f}));
}

TEST(GradScaler, StateDictRoundTripContinuesIdentically) {
  GradScalerOptions o;
  o.init_scale = 32;
  o.growth_interval = 3;
  GradScaler a(o);
  const std::string first = "FFFFIFF";  // ends with the tracker at 2
  for (char c : first) a.update(c == 'I');
  // Through a checkpoint file, as a training app saves it.
  const std::string path = ::testing::TempDir() + "grad_scaler_state.kiln";
  write_checkpoint(path, a.state_dict(), {});
  GradScaler b(o);
  b.load_state_dict(read_checkpoint(path).tensors);
  std::remove(path.c_str());
  EXPECT_EQ(b.scale_value(), a.scale_value());
  EXPECT_EQ(b.growth_tracker(), 2);
  EXPECT_EQ(b.steps(), a.steps());
  EXPECT_EQ(b.skipped_steps(), 1);
  EXPECT_EQ(history_of(b), history_of(a));
  const std::string rest = "FIFFFFFF";
  for (char c : rest) {
    EXPECT_EQ(a.update(c == 'I'), b.update(c == 'I'));
    EXPECT_EQ(a.scale_value(), b.scale_value());
  }
  EXPECT_EQ(history_of(b), history_of(a));
}

TEST(GradScaler, LoadStateDictIsStrict) {
  GradScalerOptions o;
  o.growth_interval = 3;
  GradScaler good(o);
  good.update(false);
  auto expect_input_error = [&](std::map<std::string, Tensor> state, const std::string& says) {
    GradScaler s(o);
    try {
      s.load_state_dict(state);
      ADD_FAILURE() << "accepted a state where " << says;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Input);
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
    EXPECT_EQ(s.steps(), 0) << "a refused state was partly loaded";
  };
  auto state = good.state_dict();
  auto missing = state;
  missing.erase("growth_tracker");
  expect_input_error(missing, "missing 'growth_tracker'");
  auto extra = state;
  extra["momentum"] = Tensor::zeros({1});
  expect_input_error(extra, "unexpected entry 'momentum'");
  auto tracker = state;
  tracker["growth_tracker"] = Tensor::from_vector(std::vector<int64_t>{3}, {1});
  expect_input_error(tracker, "growth_interval");
  auto scale = state;
  scale["scale"] = Tensor::from_vector(std::vector<double>{-1.0}, {1});
  expect_input_error(scale, "'scale'");
  auto skipped = state;
  skipped["skipped_steps"] = Tensor::from_vector(std::vector<int64_t>{2}, {1});
  expect_input_error(skipped, "skipped steps");
  auto history = state;
  history["history.scale"] = Tensor::from_vector(std::vector<double>{1.0}, {1});
  expect_input_error(history, "last change");
}

TEST(GradScaler, InvalidOptionsAreInputErrors) {
  auto refuses = [](GradScalerOptions o, const char* name) {
    try {
      GradScaler s(o);
      ADD_FAILURE() << "accepted a bad " << name;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Input);
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  GradScalerOptions o;
  o.init_scale = 0;
  refuses(o, "init_scale");
  o.init_scale = 1e39;  // beyond f32
  refuses(o, "init_scale");
  o = {};
  o.growth_factor = 1.0;
  refuses(o, "growth_factor");
  o = {};
  o.backoff_factor = 1.0;
  refuses(o, "backoff_factor");
  o = {};
  o.growth_interval = 0;
  refuses(o, "growth_interval");
}

}  // namespace
}  // namespace kiln
