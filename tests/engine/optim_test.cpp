// optim_test.cpp: optimizers against expected values for three steps on a tiny tensor,
// weight decay variants, parameters without gradient, state_dict round trips, LR schedules.
//
// Expected values: p0 = [1, -2, 0.5], gradients g1 = [0.5, 1, -3], g2 = [-0.25, 2, 0],
// g3 = [1, 0, 0.75], computed in double with torch 1.13's torch.optim (Debian python3-torch):
//   p = torch.tensor(p0, dtype=torch.float64, requires_grad=True); opt = torch.optim.X([p], ...)
//   for g in gs: p.grad = torch.tensor(g, dtype=torch.float64); opt.step(); print(p)
// and checked by hand where the closed form is short (comments below).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/optim/adadelta.h"
#include "engine/optim/adam.h"
#include "engine/optim/lr_schedule.h"
#include "engine/optim/sgd.h"
#include "engine/serialize.h"
#include "engine/tensor.h"

namespace kiln {
namespace {

const std::vector<double> kP0 = {1.0, -2.0, 0.5};
const std::vector<std::vector<double>> kGrads = {
    {0.5, 1.0, -3.0}, {-0.25, 2.0, 0.0}, {1.0, 0.0, 0.75}};

using Factory = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)>;

struct Case {
  const char* name;
  Factory make;
  std::vector<std::vector<double>> expected;  // parameter after steps 1, 2, 3
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      // p -= 0.1 g
      {"sgd_plain", [](auto ps) { return std::make_unique<SGD>(ps, 0.1); },
       {{0.95, -2.1, 0.8}, {0.975, -2.3, 0.8}, {0.875, -2.3, 0.725}}},
      // Element 0 by hand: b = 0.5, p = 0.95; b = 0.9*0.5 - 0.25 = 0.2, p = 0.93;
      // b = 0.9*0.2 + 1 = 1.18, p = 0.93 - 0.118 = 0.812.
      {"sgd_momentum", [](auto ps) { return std::make_unique<SGD>(ps, 0.1, 0.9); },
       {{0.95, -2.1, 0.8}, {0.93, -2.39, 1.07}, {0.812, -2.651, 1.238}}},
      // Element 0 step 1 by hand: d = 0.5 + 0.01 = 0.51, b = 0.51, d = 0.51 + 0.9*0.51 = 0.969,
      // p = 1 - 0.0969 = 0.9031.
      {"sgd_nesterov_wd",
       [](auto ps) { return std::make_unique<SGD>(ps, 0.1, 0.9, 0.0, 0.01, true); },
       {{0.9031, -2.1862, 1.06905},
        {0.90757411, -2.64142622, 1.309613805},
        {0.6981892081909999, -2.868078688182, 1.3820951082705002}}},
      // Dampening is not applied on the first step (b = d), as in PyTorch.
      {"sgd_dampening_wd",
       [](auto ps) { return std::make_unique<SGD>(ps, 0.1, 0.9, 0.5, 0.1); },
       {{0.94, -2.08, 0.795},
        {0.8938, -2.2416, 1.056525},
        {0.797751, -2.375832, 1.249114875}}},
      // Step 1 by hand: m = 0.1 g, v = 0.001 g^2, bias corrections 0.1 and 0.001, so the
      // step is lr * g / (|g| + 1e-8) ~ 0.1 * sign(g): p ~ [0.9, -2.1, 0.6].
      {"adam", [](auto ps) { return std::make_unique<Adam>(ps, 0.1); },
       {{0.900000002, -2.099999999, 0.5999999996666667},
        {0.8733662987078463, -2.1965182009718336, 0.6670058247643731},
        {0.8075551396770898, -2.271127050729725, 0.7017439707901032}}},
      {"adam_wd", [](auto ps) { return std::make_unique<Adam>(ps, 0.1, 0.8, 0.99, 1e-3, 0.1); },
       {{0.9001663893510815, -2.099875156054931, 0.5999661131819722},
        {0.8596801144537636, -2.1970182380983903, 0.6613343378365784},
        {0.7838348163161047, -2.259052582247459, 0.6851643468844462}}},
      // AdamW step 1 = Adam step 1 after p *= 1 - 0.1*0.1: 0.99 - 0.1 = 0.89.
      {"adamw", [](auto ps) { return std::make_unique<AdamW>(ps, 0.1, 0.9, 0.999, 1e-8, 0.1); },
       {{0.890000002, -2.079999999, 0.5949999996666666},
        {0.8544662986878463, -2.1557182009818336, 0.6560558247677063},
        {0.7801104766702113, -2.208769868729907, 0.6842334125457593}}},
      // Step 1 element 0 by hand: s = 0.1*0.25 = 0.025, d = sqrt(1e-6)/sqrt(0.025+1e-6)*0.5
      // = 0.0031622..., p = 0.99683778...
      {"adadelta", [](auto ps) { return std::make_unique<Adadelta>(ps); },
       {{0.9968377855834876, -2.0031622618488987, 0.5031622759033489},
        {0.9989228726112789, -2.0072028578026155, 0.5031622759033489},
        {0.9946161569990815, -2.0072028578026155, 0.5019956443980954}}},
      {"adadelta_wd", [](auto ps) { return std::make_unique<Adadelta>(ps, 0.5, 0.8, 1e-4, 0.1); },
       {{0.9888274161591422, -2.011175975124542, 0.5111800187194973},
        {0.9931081523343349, -2.025863902854365, 0.5108737705149868},
        {0.9789089922898772, -2.02342480430246, 0.5060523737425289}}},
  };
  return all;
}

// A parameter of `n` elements repeating kP0 (n = 3 is the tiny case; larger n runs the
// OpenMP loops over many elements, each of which must follow the same 3-element pattern).
Tensor make_param(int64_t n, DType dtype) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = kP0[static_cast<size_t>(i % 3)];
  Tensor p = Tensor::from_vector(v, {n}).to(dtype);
  p.set_requires_grad(true);
  return p;
}

void set_grad(Tensor& p, const std::vector<double>& g) {
  std::vector<double> v(static_cast<size_t>(p.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = g[i % 3];
  p.set_grad(Tensor::from_vector(v, p.shape()).to(p.dtype()));
}

void run_case(const Case& c, int64_t n, DType dtype, double tol) {
  SCOPED_TRACE(::testing::Message() << c.name << " n=" << n << " " << dtype_name(dtype));
  Tensor p = make_param(n, dtype);
  auto opt = c.make({p});
  for (size_t s = 0; s < kGrads.size(); ++s) {
    set_grad(p, kGrads[s]);
    opt->step();
    auto got = p.to_vector<double>();
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], c.expected[s][i % 3], tol) << "step " << s + 1 << " element " << i;
  }
  EXPECT_EQ(opt->step_count(), 3);
}

TEST(Optim, MatchesPyTorchF64) {
  for (const auto& c : cases()) run_case(c, 3, DType::F64, 1e-12);
}

TEST(Optim, MatchesPyTorchF32) {
  for (const auto& c : cases()) run_case(c, 3, DType::F32, 2e-6);
}

TEST(Optim, ManyElementsFollowTheSameRule) {
  for (const auto& c : cases()) run_case(c, 10007, DType::F32, 2e-6);
}

TEST(Optim, ParamsWithoutGradAreSkipped) {
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    Tensor a = make_param(3, DType::F64), b = make_param(3, DType::F64);
    auto opt = c.make({a, b});
    set_grad(a, kGrads[0]);
    opt->step();
    EXPECT_EQ(b.to_vector<double>(), kP0);  // untouched
    auto sd = opt->state_dict();
    EXPECT_EQ(sd.at("param.0.step").item(), 1);
    EXPECT_EQ(sd.at("param.1.step").item(), 0);
    for (const auto& buf : opt->buffer_names()) EXPECT_EQ(sd.count("param.1." + buf), 0u) << buf;
    // b's first real update is its own step 1 (Adam's bias correction counts per parameter).
    set_grad(b, kGrads[0]);
    a.set_grad(Tensor());
    opt->step();
    auto got = b.to_vector<double>();
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(got[i], c.expected[0][i], 1e-12);
  }
}

TEST(Optim, ZeroGradDropsGradients) {
  Tensor p = make_param(3, DType::F32);
  SGD opt({p}, 0.1);
  set_grad(p, kGrads[0]);
  opt.zero_grad();
  EXPECT_FALSE(p.grad().defined());
  opt.step();  // nothing to do
  EXPECT_EQ(p.to_vector<double>(), kP0);
}

// Step once, save (through a real checkpoint file), load into a fresh optimizer over a copy
// of the parameter, and continue both: they must agree bit for bit.
TEST(Optim, StateDictRoundTripContinuesIdentically) {
  const std::string path = ::testing::TempDir() + "optim_state.kckpt";
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    Tensor p = make_param(7, DType::F32);
    auto opt = c.make({p});
    set_grad(p, kGrads[0]);
    opt->step();
    opt->set_lr(opt->lr() * 0.5);
    write_checkpoint(path, opt->state_dict());
    Checkpoint ck = read_checkpoint(path);

    Tensor q = p.clone();
    q.set_requires_grad(true);
    auto resumed = c.make({q});
    resumed->load_state_dict(ck.tensors);
    EXPECT_EQ(resumed->lr(), opt->lr());
    EXPECT_EQ(resumed->step_count(), 1);
    for (size_t s = 1; s < kGrads.size(); ++s) {
      set_grad(p, kGrads[s]);
      set_grad(q, kGrads[s]);
      opt->step();
      resumed->step();
    }
    EXPECT_EQ(p.to_vector<float>(), q.to_vector<float>());
  }
  std::remove(path.c_str());
}

TEST(Optim, LoadStateDictRejectsMismatches) {
  Tensor p = make_param(3, DType::F64);
  Adam opt({p}, 0.1);
  set_grad(p, kGrads[0]);
  opt.step();
  auto good = opt.state_dict();

  Tensor other = make_param(4, DType::F64);
  Adam wrong_shape({other}, 0.1);
  EXPECT_THROW(wrong_shape.load_state_dict(good), Error);

  SGD wrong_kind({make_param(3, DType::F64)}, 0.1, 0.9);
  try {
    wrong_kind.load_state_dict(good);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input);
    EXPECT_NE(std::string(e.what()).find("exp_avg"), std::string::npos) << e.what();
  }
  auto extra = good;
  extra["param.5.exp_avg"] = good.at("param.0.exp_avg");
  EXPECT_THROW(opt.load_state_dict(extra), Error);
  auto missing = good;
  missing.erase("lr");
  EXPECT_THROW(opt.load_state_dict(missing), Error);
}

TEST(Optim, ValidatesHyperparameters) {
  Tensor p = make_param(3, DType::F32);
  EXPECT_THROW(SGD({p}, -0.1), Error);
  EXPECT_THROW(SGD({p}, 0.1, 0.0, 0.0, 0.0, true), Error);  // Nesterov without momentum
  EXPECT_THROW(SGD({p}, 0.1, 0.9, 0.5, 0.0, true), Error);  // Nesterov with dampening
  EXPECT_THROW(Adam({p}, 0.1, 1.0), Error);
  EXPECT_THROW(Adadelta({p}, 1.0, 1.5), Error);
  EXPECT_THROW(SGD({p, p}, 0.1), Error);  // the same parameter twice
  SGD ok({p}, 0.1);
  EXPECT_THROW(ok.set_lr(std::nan("")), Error);
}

// ---- LR schedules ---------------------------------------------------------------------------

TEST(LRSchedule, StepLR) {
  StepLR s(0.1, 3, 0.5);
  const double want[] = {0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025};
  for (int t = 0; t < 7; ++t) EXPECT_DOUBLE_EQ(s.lr_at(t), want[t]) << t;
  EXPECT_THROW(StepLR(0.1, 0), Error);
}

TEST(LRSchedule, CosineLR) {
  CosineLR s(1.0, 10, 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.55);                                   // halfway: the mean
  EXPECT_NEAR(s.lr_at(2), 0.1 + 0.9 * (1 + std::cos(M_PI * 0.2)) / 2, 1e-15);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(25), 0.1);                                   // stays at the floor
  for (int t = 1; t <= 10; ++t) EXPECT_LT(s.lr_at(t), s.lr_at(t - 1));  // monotone
}

// Reference values for OneCycleLR and CyclicLR: PyTorch 1.13's schedulers driving a one-parameter
// SGD (momentum 0.9, cycle_momentum=False), get_last_lr()[0] recorded before each of the steps,
// printed with repr(); the constructor arguments are the ones in each test.
void expect_matches_torch(const LRSchedule& s, const std::vector<double>& want) {
  for (size_t t = 0; t < want.size(); ++t) {
    EXPECT_NEAR(s.lr_at(static_cast<int64_t>(t)), want[t], 1e-12 * std::max(1.0, want[t])) << t;
  }
}

TEST(LRSchedule, OneCycleCosMatchesTorch) {
  // OneCycleLR(max_lr=1.0, total_steps=20, pct_start=0.3, anneal_strategy='cos',
  //            div_factor=25, final_div_factor=1e4)
  OneCycleLR s(1.0, 20, 0.3, 25, 1e4);
  expect_matches_torch(s, {0.040000000000000036, 0.1316718427000253, 0.3716718427000253,
                           0.6683281572999747, 0.9083281572999747, 1.0, 0.9874640062350873,
                           0.9504846320134737, 0.89091617757105, 0.8117456539497631,
                           0.7169430017913008, 0.6112620219362893, 0.500002,
                           0.38874197806371075, 0.28306099820869923, 0.18825834605023697,
                           0.10908782242895004, 0.049519367986526286, 0.012539993764912554,
                           4e-06});
  EXPECT_DOUBLE_EQ(s.lr_at(20), s.lr_at(19));  // stays at the floor max_lr / (25 * 1e4)
  EXPECT_DOUBLE_EQ(s.lr_at(1000), 4e-06);
}

TEST(LRSchedule, OneCycleLinearMatchesTorch) {
  // OneCycleLR(max_lr=0.5, total_steps=12, pct_start=0.25, anneal_strategy='linear',
  //            div_factor=10, final_div_factor=100)
  OneCycleLR s(0.5, 12, 0.25, 10, 100, OneCycleLR::Anneal::Linear);
  expect_matches_torch(s, {0.05, 0.275, 0.5, 0.4445, 0.389, 0.3335, 0.278, 0.22249999999999998,
                           0.16700000000000004, 0.11149999999999999, 0.05600000000000005,
                           0.0005000000000000004});
}

TEST(LRSchedule, OneCycleValidates) {
  EXPECT_THROW(OneCycleLR(1.0, 1), Error);          // one step: no cycle
  EXPECT_THROW(OneCycleLR(1.0, 100, 0.0), Error);   // no rising phase
  EXPECT_THROW(OneCycleLR(1.0, 100, 1.0), Error);   // no falling phase
  EXPECT_THROW(OneCycleLR(1.0, 3, 0.3), Error);     // 0.3 * 3 - 1 < 0: too few steps
  EXPECT_THROW(OneCycleLR(1.0, 100, 0.3, 0.5), Error);
  EXPECT_THROW(OneCycleLR(-1.0, 100), Error);
}

TEST(LRSchedule, CyclicTriangularMatchesTorch) {
  // CyclicLR(base_lr=0.01, max_lr=0.1, step_size_up=4, mode='triangular')
  expect_matches_torch(CyclicLR(0.01, 0.1, 4),
                       {0.01, 0.0325, 0.05500000000000001, 0.0775, 0.1, 0.0775,
                        0.05500000000000001, 0.0325, 0.01, 0.0325, 0.05500000000000001, 0.0775,
                        0.1, 0.0775, 0.05500000000000001, 0.0325, 0.01, 0.0325,
                        0.05500000000000001, 0.0775});
  // CyclicLR(base_lr=0.01, max_lr=0.1, step_size_up=3, step_size_down=5, mode='triangular')
  expect_matches_torch(CyclicLR(0.01, 0.1, 3, 5),
                       {0.01, 0.04, 0.07, 0.1, 0.082, 0.064, 0.046000000000000006,
                        0.028000000000000004, 0.01, 0.04, 0.07, 0.1, 0.082, 0.064,
                        0.046000000000000006, 0.028000000000000004, 0.01, 0.04, 0.07, 0.1});
}

TEST(LRSchedule, CyclicTriangular2MatchesTorch) {
  // CyclicLR(base_lr=0.01, max_lr=0.1, step_size_up=4, mode='triangular2')
  expect_matches_torch(CyclicLR(0.01, 0.1, 4, -1, CyclicLR::Mode::Triangular2),
                       {0.01, 0.0325, 0.05500000000000001, 0.0775, 0.1, 0.0775,
                        0.05500000000000001, 0.0325, 0.01, 0.02125, 0.0325,
                        0.043750000000000004, 0.05500000000000001, 0.043750000000000004, 0.0325,
                        0.02125, 0.01, 0.015625, 0.02125, 0.026875000000000003, 0.0325,
                        0.026875000000000003, 0.02125, 0.015625, 0.01, 0.012812500000000001});
  EXPECT_THROW(CyclicLR(0.1, 0.01, 4), Error);  // base above max
  EXPECT_THROW(CyclicLR(0.01, 0.1, 0), Error);
}

TEST(LRSchedule, LinearWarmupWrapsAnySchedule) {
  auto inner = std::make_shared<StepLR>(0.8, 10, 0.1);
  LinearWarmup w(inner, 4, 0.25);
  EXPECT_DOUBLE_EQ(w.lr_at(0), 0.2);  // 0.8 * 0.25
  EXPECT_DOUBLE_EQ(w.lr_at(1), 0.8 * (0.25 + 0.75 * 0.25));
  EXPECT_DOUBLE_EQ(w.lr_at(2), 0.8 * 0.625);
  EXPECT_DOUBLE_EQ(w.lr_at(4), 0.8);
  EXPECT_DOUBLE_EQ(w.lr_at(9), 0.8);
  EXPECT_NEAR(w.lr_at(10), 0.08, 1e-15);  // the inner schedule at the same absolute step
  LinearWarmup none(inner, 0);
  EXPECT_DOUBLE_EQ(none.lr_at(0), 0.8);
  EXPECT_THROW(LinearWarmup(inner, 4, 0.0), Error);
}

TEST(LRSchedule, ResumingIsJustCallingWithTheRestoredStep) {
  auto sched = std::make_shared<LinearWarmup>(std::make_shared<CosineLR>(0.4, 100), 5);
  Tensor p = make_param(3, DType::F32);
  SGD a({p}, 0.0), b({p}, 0.0);
  for (int t = 0; t < 37; ++t) sched->apply(a, t);
  sched->apply(b, 36);  // a "resumed" run jumps straight to its step
  EXPECT_EQ(a.lr(), b.lr());
  EXPECT_DOUBLE_EQ(a.lr(), sched->lr_at(36));
}

TEST(LRSchedule, LinearScalingRule) {
  EXPECT_DOUBLE_EQ(linear_scaled_lr(0.1, 8192, 256), 3.2);  // Goyal et al.'s ImageNet setting
  EXPECT_DOUBLE_EQ(linear_scaled_lr(1.0, 64, 128), 0.5);
  EXPECT_DOUBLE_EQ(world_scaled_lr(0.01, 4), 0.04);
  EXPECT_THROW(linear_scaled_lr(0.1, 0, 256), Error);
  EXPECT_THROW(world_scaled_lr(0.1, 0), Error);
}

}  // namespace
}  // namespace kiln
