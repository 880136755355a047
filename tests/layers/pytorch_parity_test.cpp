// pytorch_parity_test.cpp: golden tests against PyTorch 1.13. Each case loads a fixture that
// tests/reference/make_fixtures.py wrote with PyTorch (inputs, parameters, hyper-parameters,
// outputs, gradients of a fixed random upstream gradient "grad_out", updated buffers), runs
// the same computation in Kiln and compares every tensor. Conv2d runs under both kernel
// implementations (Impl::Hand and Impl::Vendor) against the same fixture.
//
// Tolerances (where they come from). Element i of a tensor passes when
//     |actual_i - expected_i| <= rtol * (|expected_i| + max_j |expected_j|)
// i.e. relative to the element and to the tensor's scale: rounding errors of a sum grow with
// the size of its terms, not of its result, so a gradient element that cancels to ~0 is
// judged against the tensor's magnitude. Values:
//  - f32 layers, rtol = 1e-5: f32 rounds at u = 6e-8; the sums here have at most ~140 terms
//    (C*R*S for conv, N*H*W for BN statistics) that Kiln adds in another order than PyTorch
//    or oneDNN (blocking, SIMD lanes, threads). The error bound is ~K*u*sum|terms| (worst
//    case ~1e-5), typically sqrt(K)*u ~ 1e-6. A real bug (a wrong index, a missing term, a
//    biased var) shows as 1e-3 or more.
//  - f32 optimizers, rtol = 1e-6: a few elementwise operations per element, the same formula
//    as PyTorch but possibly another evaluation order: a few u.
//  - f64 everything, rtol = 1e-12: the same sums with u = 1.1e-16.
//  - max-pool indices and num_batches_tracked: exact.
// Measured (2 threads, both conv impls): worst f32 layer error 1.8e-7, worst f32 Adam step 1.0e-7,
// worst f64 6e-17, pooling, linear and SGD f64 exact: every tolerance has a margin of >= 10x.
// KILN_PARITY_VERBOSE=1 prints the measured error of every comparison (error / (|e| + max|e|));
// the comparisons themselves (close, equal) live in tests/support/fixture.h.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "engine/impl.h"
#include "engine/optim/adam.h"
#include "engine/optim/sgd.h"
#include "layers/batchnorm2d.h"
#include "layers/conv2d.h"
#include "layers/leaky_relu.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/pool2d.h"
#include "support/fixture.h"

namespace kiln {

// So gtest prints "hand"/"vendor" for a parameter, not its bytes (found by ADL).
inline void PrintTo(Impl impl, std::ostream* os) { *os << impl_name(impl); }

namespace {

using testing::Fixture;
using testing::close;
using testing::equal;
using testing::verbose;

constexpr double kRtolF32 = 1e-5;        // f32 layers: reordered sums of <= ~140 terms
constexpr double kRtolF32Optim = 1e-6;   // f32 optimizer steps: a few elementwise roundings
constexpr double kRtolF64 = 1e-12;       // f64: the same sums with u = 1.1e-16

double rtol_for(DType t, double f32_rtol = kRtolF32) {
  return t == DType::F64 ? kRtolF64 : f32_rtol;
}


// Test names are the fixture names ("PyTorch/LinearParity.ForwardBackward/linear").
std::string case_name(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

// Prints the case name as the test starts (for KILN_PARITY_VERBOSE).
void announce(const std::string& name) {
  if (verbose()) std::printf("%s\n", name.c_str());
}

// ---- Linear ------------------------------------------------------------------------------

class LinearParity : public ::testing::TestWithParam<std::string> {};

TEST_P(LinearParity, ForwardBackward) {
  const std::string name = GetParam();
  announce(name);
  Fixture f(name);
  Tensor x = f.leaf("x"), w = f.leaf("weight");
  Tensor b = f.has("bias") ? f.leaf("bias") : Tensor();
  Tensor y = linear(x, w, b);
  y.backward(f.tensor("grad_out"));
  const double rtol = rtol_for(x.dtype());
  EXPECT_TRUE(close(name + " y", y, f.tensor("y"), rtol));
  EXPECT_TRUE(close(name + " grad_x", x.grad(), f.tensor("grad_x"), rtol));
  EXPECT_TRUE(close(name + " grad_weight", w.grad(), f.tensor("grad_weight"), rtol));
  if (b.defined()) {
    EXPECT_TRUE(close(name + " grad_bias", b.grad(), f.tensor("grad_bias"), rtol));
  }
}

INSTANTIATE_TEST_SUITE_P(PyTorch, LinearParity,
                         ::testing::Values("linear", "linear_batch1_nobias"),
                         case_name);

// ---- LeakyReLU -------------------------------------------------------------------------------

// One multiplication per element on both sides: the same bits as PyTorch's.
TEST(LeakyReluParity, ForwardBackward) {
  Fixture f("leaky_relu");
  Tensor x = f.leaf("x");
  Tensor y = leaky_relu(x, f.real("negative_slope"));
  y.backward(f.tensor("grad_out"));
  EXPECT_TRUE(close("leaky_relu y", y, f.tensor("y"), 0.0));
  EXPECT_TRUE(close("leaky_relu grad_x", x.grad(), f.tensor("grad_x"), 0.0));
}

// ---- Conv2d, under both kernel implementations -----------------------------------------------

class Conv2dParity : public ::testing::TestWithParam<std::tuple<std::string, Impl>> {};

TEST_P(Conv2dParity, ForwardBackward) {
  const std::string name = std::get<0>(GetParam());
  const Impl impl = std::get<1>(GetParam());
  const std::string tag = name + " [" + impl_name(impl) + "]";
  announce(tag);
  KernelsGuard kernels(impl);  // f64 always runs the hand kernels (oneDNN here is f32 only)
  Fixture f(name);
  Tensor x = f.leaf("x"), w = f.leaf("weight");
  Tensor b = f.has("bias") ? f.leaf("bias") : Tensor();
  Tensor y = conv2d(x, w, b, f.integer("stride"), f.integer("padding"));
  y.backward(f.tensor("grad_out"));
  const double rtol = rtol_for(x.dtype());
  EXPECT_TRUE(close(tag + " y", y, f.tensor("y"), rtol));
  EXPECT_TRUE(close(tag + " grad_x", x.grad(), f.tensor("grad_x"), rtol));
  EXPECT_TRUE(close(tag + " grad_weight", w.grad(), f.tensor("grad_weight"), rtol));
  if (b.defined()) {
    EXPECT_TRUE(close(tag + " grad_bias", b.grad(), f.tensor("grad_bias"), rtol));
  }
}

INSTANTIATE_TEST_SUITE_P(
    PyTorch, Conv2dParity,
    ::testing::Combine(::testing::Values("conv2d_s1_p0", "conv2d_s2_p1", "conv2d_k1",
                                         "conv2d_k1_s2", "conv2d_odd_s3_p2_nobias",
                                         "conv2d_s2_p1_f64"),
                       ::testing::Values(Impl::Hand, Impl::Vendor)),
    [](const auto& info) {
      return std::get<0>(info.param) + "_" + impl_name(std::get<1>(info.param));
    });

// ---- Pooling ---------------------------------------------------------------------------------

class MaxPool2dParity : public ::testing::TestWithParam<std::string> {};

TEST_P(MaxPool2dParity, ForwardBackwardIndices) {
  const std::string name = GetParam();
  announce(name);
  Fixture f(name);
  Tensor x = f.leaf("x");
  const int64_t k = f.integer("kernel_size"), s = f.integer("stride"), p = f.integer("padding");
  auto [y, indices] = max_pool2d_with_indices(x, k, s, p);
  EXPECT_TRUE(equal(name + " indices", indices, f.tensor("indices")));
  Tensor y2 = max_pool2d(x, k, s, p);
  y2.backward(f.tensor("grad_out"));
  // Max pooling copies values and routes gradients: no rounding at all, so exact.
  EXPECT_TRUE(close(name + " y (with_indices)", y, f.tensor("y"), 0.0));
  EXPECT_TRUE(close(name + " y", y2, f.tensor("y"), 0.0));
  EXPECT_TRUE(close(name + " grad_x", x.grad(), f.tensor("grad_x"), 0.0));
}

INSTANTIATE_TEST_SUITE_P(PyTorch, MaxPool2dParity,
                         ::testing::Values("max_pool2d_k2", "max_pool2d_k3_s2_p1"),
                         case_name);

class AvgPool2dParity : public ::testing::TestWithParam<std::string> {};

TEST_P(AvgPool2dParity, ForwardBackward) {
  const std::string name = GetParam();
  announce(name);
  Fixture f(name);
  Tensor x = f.leaf("x");
  const AvgPoolDivisor divisor = f.integer("count_include_pad") != 0
                                     ? AvgPoolDivisor::IncludePad
                                     : AvgPoolDivisor::ExcludePad;
  Tensor y = avg_pool2d(x, f.integer("kernel_size"), f.integer("stride"), f.integer("padding"),
                        divisor);
  y.backward(f.tensor("grad_out"));
  EXPECT_TRUE(close(name + " y", y, f.tensor("y"), kRtolF32));
  EXPECT_TRUE(close(name + " grad_x", x.grad(), f.tensor("grad_x"), kRtolF32));
}

INSTANTIATE_TEST_SUITE_P(PyTorch, AvgPool2dParity,
                         ::testing::Values("avg_pool2d_k2", "avg_pool2d_k3_s2_p1",
                                           "avg_pool2d_k3_s2_p1_exclude_pad"),
                         case_name);

// ---- BatchNorm2d: the functional op and the module, train and eval ---------------------------

class BatchNorm2dParity : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchNorm2dParity, Functional) {
  const std::string name = GetParam();
  announce(name + " (functional)");
  Fixture f(name);
  Tensor x = f.leaf("x"), w = f.leaf("weight"), b = f.leaf("bias");
  Tensor running_mean = f.tensor("running_mean_before");
  Tensor running_var = f.tensor("running_var_before");
  Tensor y = batch_norm2d(x, w, b, running_mean, running_var, f.integer("training") != 0,
                          f.real("momentum"), f.real("eps"));
  y.backward(f.tensor("grad_out"));
  EXPECT_TRUE(close(name + " y", y, f.tensor("y"), kRtolF32));
  EXPECT_TRUE(close(name + " grad_x", x.grad(), f.tensor("grad_x"), kRtolF32));
  EXPECT_TRUE(close(name + " grad_weight", w.grad(), f.tensor("grad_weight"), kRtolF32));
  EXPECT_TRUE(close(name + " grad_bias", b.grad(), f.tensor("grad_bias"), kRtolF32));
  EXPECT_TRUE(close(name + " running_mean", running_mean, f.tensor("running_mean_after"),
                    kRtolF32));
  EXPECT_TRUE(close(name + " running_var", running_var, f.tensor("running_var_after"),
                    kRtolF32));
}

TEST_P(BatchNorm2dParity, Module) {
  const std::string name = GetParam();
  announce(name + " (module)");
  Fixture f(name);
  Tensor x = f.leaf("x");
  BatchNorm2d bn(x.size(1), f.real("eps"), f.real("momentum"));
  bn.load_state_dict({{"weight", f.tensor("weight")},
                      {"bias", f.tensor("bias")},
                      {"running_mean", f.tensor("running_mean_before")},
                      {"running_var", f.tensor("running_var_before")},
                      {"num_batches_tracked", Tensor::zeros({1}, DType::I64)}});
  bn.train(f.integer("training") != 0);
  Tensor y = bn(x);
  y.backward(f.tensor("grad_out"));
  EXPECT_TRUE(close(name + " y", y, f.tensor("y"), kRtolF32));
  EXPECT_TRUE(close(name + " grad_x", x.grad(), f.tensor("grad_x"), kRtolF32));
  EXPECT_TRUE(close(name + " grad_weight", bn.weight().grad(), f.tensor("grad_weight"),
                    kRtolF32));
  EXPECT_TRUE(close(name + " grad_bias", bn.bias().grad(), f.tensor("grad_bias"), kRtolF32));
  EXPECT_TRUE(close(name + " running_mean", bn.running_mean(), f.tensor("running_mean_after"),
                    kRtolF32));
  EXPECT_TRUE(close(name + " running_var", bn.running_var(), f.tensor("running_var_after"),
                    kRtolF32));
  EXPECT_TRUE(equal(name + " num_batches_tracked", bn.num_batches_tracked(),
                    f.tensor("num_batches_tracked_after")));
}

INSTANTIATE_TEST_SUITE_P(PyTorch, BatchNorm2dParity,
                         ::testing::Values("batch_norm2d_train", "batch_norm2d_eval"),
                         case_name);

// ---- Cross-entropy ---------------------------------------------------------------------------

class CrossEntropyParity : public ::testing::TestWithParam<std::string> {};

TEST_P(CrossEntropyParity, LossAndGrad) {
  const std::string name = GetParam();
  announce(name);
  Fixture f(name);
  Tensor logits = f.leaf("logits");
  Tensor loss = cross_entropy(logits, f.tensor("targets"));
  loss.backward();
  const double rtol = rtol_for(logits.dtype());
  // PyTorch's loss is 0-d, stored as [1]; compare the value whatever Kiln's scalar shape.
  EXPECT_EQ(loss.numel(), 1) << name << ": loss " << loss.str();
  EXPECT_TRUE(close(name + " loss", loss.reshape({1}), f.tensor("loss"), rtol));
  EXPECT_TRUE(close(name + " grad_logits", logits.grad(), f.tensor("grad_logits"), rtol));
}

INSTANTIATE_TEST_SUITE_P(PyTorch, CrossEntropyParity,
                         ::testing::Values("cross_entropy", "cross_entropy_large",
                                           "cross_entropy_f64"),
                         case_name);

// ---- Optimizers: two steps on two parameters with given gradients ----------------------------

// Runs two steps of `opt` on the fixture's parameters and compares after each step.
void run_two_steps(const std::string& name, const Fixture& f, std::vector<Tensor>& params,
                   Optimizer& opt) {
  const double rtol = rtol_for(params[0].dtype(), kRtolF32Optim);
  for (int step = 1; step <= 2; ++step) {
    for (size_t i = 0; i < params.size(); ++i)
      params[i].set_grad(f.tensor("p" + std::to_string(i) + "_grad" + std::to_string(step)));
    opt.step();
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string key = "p" + std::to_string(i) + "_step" + std::to_string(step);
      EXPECT_TRUE(close(name + " " + key, params[i], f.tensor(key), rtol));
    }
  }
}

std::vector<Tensor> fixture_params(const Fixture& f) {
  return {f.leaf("p0_init"), f.leaf("p1_init")};
}

class SGDParity : public ::testing::TestWithParam<std::string> {};

TEST_P(SGDParity, TwoSteps) {
  const std::string name = GetParam();
  announce(name);
  Fixture f(name);
  std::vector<Tensor> params = fixture_params(f);
  SGD opt(params, f.real("lr"), f.real("momentum"), f.real("dampening"),
          f.real("weight_decay"), f.integer("nesterov") != 0);
  run_two_steps(name, f, params, opt);
}

INSTANTIATE_TEST_SUITE_P(PyTorch, SGDParity,
                         ::testing::Values("sgd_momentum_f32", "sgd_nesterov_f32",
                                           "sgd_momentum_f64", "sgd_nesterov_f64"),
                         case_name);

class AdamParity : public ::testing::TestWithParam<std::string> {};

TEST_P(AdamParity, TwoSteps) {
  const std::string name = GetParam();
  announce(name);
  Fixture f(name);
  std::vector<Tensor> params = fixture_params(f);
  const double lr = f.real("lr"), b1 = f.real("beta1"), b2 = f.real("beta2");
  const double eps = f.real("eps"), wd = f.real("weight_decay");
  if (f.integer("decoupled") != 0) {
    AdamW opt(params, lr, b1, b2, eps, wd);
    run_two_steps(name, f, params, opt);
  } else {
    Adam opt(params, lr, b1, b2, eps, wd);
    run_two_steps(name, f, params, opt);
  }
}

INSTANTIATE_TEST_SUITE_P(PyTorch, AdamParity,
                         ::testing::Values("adam_f32", "adamw_f32", "adam_f64", "adamw_f64"),
                         case_name);

// ---- The reader itself: its errors say what to do --------------------------------------------

TEST(FixtureReader, MissingFileSaysHowToGenerate) {
  try {
    Fixture f("no_such_fixture");
    FAIL() << "expected kiln::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("make_fixtures.py"), std::string::npos) << e.what();
    EXPECT_EQ(e.kind(), ErrorKind::Input);
  }
}

TEST(FixtureReader, MissingRecordIsNamed) {
  Fixture f("linear");
  try {
    f.tensor("no_such_record");
    FAIL() << "expected kiln::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_record"), std::string::npos) << e.what();
  }
}

// A fixture cut short, or one that is not a fixture, is an error naming the file.
TEST(FixtureReader, TruncatedOrForeignFileIsAnError) {
  const auto src = testing::fixture_dir() / "linear.kfix";
  std::ifstream in(src, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 100u) << src;
  const auto dir = std::filesystem::temp_directory_path();
  const auto truncated = dir / "kiln_parity_truncated.kfix";
  const auto foreign = dir / "kiln_parity_foreign.kfix";
  std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() - 7);
  std::ofstream(foreign, std::ios::binary) << "NOTAFIX!" << bytes.substr(8);
  try {
    Fixture f(truncated.string());
    FAIL() << "expected kiln::Error for a truncated file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  try {
    Fixture f(foreign.string());
    FAIL() << "expected kiln::Error for a bad magic";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KILNFIX1"), std::string::npos) << e.what();
  }
  std::filesystem::remove(truncated);
  std::filesystem::remove(foreign);
}

TEST(FixtureReader, RecordsHaveShapesAndDtypes) {
  Fixture f("conv2d_s2_p1_f64");
  EXPECT_EQ(f.tensor("x").shape(), (Shape{2, 3, 6, 7}));
  EXPECT_EQ(f.tensor("x").dtype(), DType::F64);
  EXPECT_EQ(f.integer("stride"), 2);
  EXPECT_EQ(Fixture("cross_entropy").tensor("targets").dtype(), DType::I64);
}

}  // namespace
}  // namespace kiln
