// parity_test.cpp: the suites that run the parity table (parity_cases.cpp), one GoogleTest
// test per row and suite, named after the row (e.g. Table/DeviceParity.Run/conv2d_...).
//
// Built twice from this source (tests/parity/CMakeLists.txt):
//   parity_test       (labels unit, gradcheck)  Gradcheck.Double, VendorCpu.HandMatchesOneDnn,
//                     Autocast.CloseToF32, LowPrecision.MatchesF32RoundedOnce
//   parity_cuda_test  (label sim or gpu; KILN_PARITY_CUDA) DeviceParity.Run,
//                     GradcheckCuda.Double, VendorCuda.HandMatchesVendor,
//                     Autocast.CloseToF32OnCuda, LowPrecision.MatchesF32RoundedOnceOnCuda;
//                     they skip, saying
//                     why, where no CUDA device exists.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/impl.h"
#include "parity/parity_cases.h"
#include "parity/parity_harness.h"
#include "parity/parity_leaves.h"
#include "support/gradcheck.h"
#if KILN_PARITY_CUDA
#include "support/cuda_skip.h"
#endif

namespace kiln::parity {

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

namespace {

using testing::bit_identical;
using testing::kCpu;
using testing::kCuda;
using testing::leaf_on;
using testing::matches;
using testing::random_tensor;

std::string test_name(const ::testing::TestParamInfo<Case>& info) {
  std::string out;
  for (char ch : info.param.name)
    out += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return out;
}

// The row under each of its variants (or once, without any).
template <typename Run>
void for_each_variant(const Case& c, Run run) {
  if (c.variant_list.empty()) {
    run();
    return;
  }
  for (const Variant& v : c.variant_list) {
    SCOPED_TRACE("variant " + v.name);
    if (v.enter) v.enter();
    run();
    if (v.leave) v.leave();
  }
}

// ---- (a) finite differences in double, on the CPU (and through cuda:0) -------------------

void gradcheck_row(const Case& c, bool through_cuda) {
  Inputs x = c.build(DType::F64);
  // gradcheck takes the double inputs; the others (class indices, absent ones) stay bound.
  std::vector<size_t> checked;
  Inputs args;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!x[i].defined() || x[i].dtype() != DType::F64) continue;
    if (c.requires_grad(i)) x[i].set_requires_grad(true);
    checked.push_back(i);
    args.push_back(x[i]);
  }
  auto f = [&](const Inputs& v) -> Tensor {
    Inputs all = x;
    for (size_t j = 0; j < checked.size(); ++j) all[checked[j]] = v[j];
    if (!through_cuda) return c.f(all)[0];
    for (Tensor& t : all)
      if (t.defined()) t = t.to(kCuda);
    return c.f(all)[0].to(kCpu);
  };
  EXPECT_TRUE(testing::gradcheck(f, args));
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i].defined() && !c.requires_grad(i)) {
      EXPECT_FALSE(x[i].grad().defined()) << "input " << i << " needs no gradient";
    }
}

// ---- (c) hand kernels against the vendor's, on one device ----------------------------------

struct Run {
  Outputs y;
  Inputs x;
};

Run run_with(const Case& c, Impl impl, Device device, DType dt) {
  testing::ImplScope scope(impl);
  Run r;
  r.x = leaves(c, c.build(dt), device);
  r.y = c.f(r.x);
  if (any_grad(c, r.x))
    backward(r.y[0], random_tensor(r.y[0].shape(), c.seed + 1000, -1.0, 1.0, dt).to(device));
  return r;
}

void hand_vs_vendor(const Case& c, Device device, DType dt) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + " on " + device.str());
  const Run hand = run_with(c, Impl::Hand, device, dt);
  const Run vendor = run_with(c, Impl::Vendor, device, dt);
  const Tol& tol = c.vendor_tol(dt);
  for (size_t k = 0; k < hand.y.size(); ++k)
    EXPECT_TRUE(matches(tol, "output " + std::to_string(k), vendor.y[k], hand.y[k]));
  for (size_t i = 0; i < hand.x.size(); ++i)
    if (hand.x[i].defined() && hand.x[i].requires_grad()) {
      EXPECT_TRUE(matches(tol, "grad of input " + std::to_string(i), vendor.x[i].grad(),
                          hand.x[i].grad()));
    }
}

// ---- (d) under autocast against f32, on one device -------------------------------------------

// The row in f32, its forward under AutocastGuard(low) when low is given; backward after the
// guard, as a training step runs it.
Run run_autocast(const Case& c, Device device, std::optional<DType> low, int64_t* casts) {
  Run r;
  r.x = leaves(c, c.build(DType::F32), device);
  {
    std::optional<AutocastGuard> guard;
    if (low) guard.emplace(*low);
    const int64_t before = autocast_cast_calls();
    r.y = c.f(r.x);
    if (casts) *casts = autocast_cast_calls() - before;
  }
  if (any_grad(c, r.x))
    backward(r.y[0], random_tensor(r.y[0].shape(), c.seed + 1000, -1.0, 1.0, DType::F32)
                         .to(device));
  return r;
}

void autocast_vs_f32(const Case& c, Device device) {
  const Run ref = run_autocast(c, device, std::nullopt, nullptr);
  for (DType low : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(std::string("autocast ") + dtype_name(low) + " on " + device.str());
    int64_t casts = 0;
    const Run ac = run_autocast(c, device, low, &casts);
    // Ops that autocast leaves alone must not change by a bit; the others within the bound.
    auto same = [&](const std::string& what, const Tensor& got, const Tensor& want) {
      if (casts == 0 || !is_float(want)) return bit_identical(what, got, want);
      return testing::close_in_norm(what, got, want, autocast_rtol(low));
    };
    ASSERT_EQ(ac.y.size(), ref.y.size());
    for (size_t k = 0; k < ref.y.size(); ++k) {
      if (!ref.y[k].defined()) continue;
      EXPECT_TRUE(same("output " + std::to_string(k), ac.y[k], ref.y[k]));
    }
    for (size_t i = 0; i < ref.x.size(); ++i)
      if (ref.x[i].defined() && ref.x[i].requires_grad()) {
        EXPECT_TRUE(same("grad of input " + std::to_string(i), ac.x[i].grad(), ref.x[i].grad()));
      }
  }
}

// ---- (e) 16-bit activations against the f32 op rounded once (parity_cases.h) ----------------

bool is_low(const Tensor& t) { return t.defined() && is_low_precision(t.dtype()); }

// The unit roundoff of a 16-bit format: half its ulp at 1.
double unit_roundoff(DType low) { return low == DType::BF16 ? 0x1p-8 : 0x1p-11; }

// A 16-bit float's bits as an integer in value order: neighbours differ by 1 (+0 and -0 are 0).
int32_t ordered16(uint16_t b) {
  return (b & 0x8000u) ? -static_cast<int32_t>(b & 0x7fffu) : static_cast<int32_t>(b);
}

// got and want (16-bit, same dtype and shape) within `ulps` ulps of the format element by
// element, or within `slack` in value; NaN matches NaN.
::testing::AssertionResult within_ulps(const std::string& what, const Tensor& got,
                                       const Tensor& want, double ulps, double slack) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape())
    return ::testing::AssertionFailure() << what << ": got " << got.str() << ", want " << want.str();
  const Tensor g = got.to(kCpu).contiguous(), w = want.to(kCpu).contiguous();
  const auto* gb = static_cast<const uint16_t*>(g.raw_data());
  const auto* wb = static_cast<const uint16_t*>(w.raw_data());
  const std::vector<double> gv = g.to_vector<double>(), wv = w.to_vector<double>();
  for (size_t i = 0; i < wv.size(); ++i) {
    if (std::isnan(wv[i]) && std::isnan(gv[i])) continue;
    const double d = std::abs(static_cast<double>(ordered16(gb[i]) - ordered16(wb[i])));
    if (d <= ulps || std::abs(gv[i] - wv[i]) <= slack) continue;
    return ::testing::AssertionFailure()
           << what << ": element " << i << " of " << shape_str(want.shape()) << " is " << gv[i]
           << ", want " << wv[i] << " (" << d << " ulps of " << dtype_name(want.dtype())
           << ", bound " << ulps << " ulps or " << slack << ")";
  }
  return ::testing::AssertionSuccess();
}

// One run of a row for the 16-bit suites: the activation inputs rounded to `low` (and, for
// the reference, widened back to f32), on `device`; backward with the fixed dy, rounded to
// `low` when output 0 of the 16-bit run is 16-bit (round_dy; the reference is told).
struct LowRun {
  Outputs y;
  Inputs x;
  bool round_dy = false;
};

LowRun run_low(const Case& c, Device device, DType low, bool widened, bool round_dy = false) {
  Inputs x = c.build(DType::F32);
  for (size_t i : c.lp_inputs)
    if (i < x.size() && x[i].defined()) {
      x[i] = x[i].to(low);
      if (widened) x[i] = x[i].to(DType::F32);
    }
  LowRun r;
  bool grads = false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!x[i].defined()) {
      r.x.emplace_back();
      continue;
    }
    const bool rg = c.requires_grad(i) && (is_float(x[i]) || is_low(x[i]));
    grads = grads || rg;
    r.x.push_back(leaf_on(x[i], device, rg));
  }
  r.y = c.f(r.x);
  r.round_dy = widened ? round_dy : is_low(r.y[0]);
  if (grads) {
    Tensor dy = random_tensor(r.y[0].shape(), c.seed + 1000, -1.0, 1.0, DType::F32);
    if (r.round_dy) dy = dy.to(low).to(r.y[0].dtype());
    backward(r.y[0], dy.to(device));
  }
  return r;
}

// `got` (a 16-bit run) against `want` (the reference, or the 16-bit run on another device)
// under the row's bounds.
void compare_low(const Case& c, DType low, const LowRun& got, const LowRun& want,
                 const std::string& label) {
  ASSERT_EQ(got.y.size(), want.y.size());
  for (size_t k = 0; k < want.y.size(); ++k) {
    if (!want.y[k].defined()) continue;
    const std::string what = label + ": output " + std::to_string(k);
    const Tensor& g = got.y[k];
    if (is_low(g)) {
      EXPECT_TRUE(within_ulps(what, g, want.y[k].to(low), c.lp_fwd_ulps, 0.0));
    } else if (is_float(g)) {
      EXPECT_TRUE(testing::close_in_norm(what, g, want.y[k], c.lp_f32_rtol));
    } else {
      EXPECT_TRUE(bit_identical(what, g, want.y[k]));
    }
  }
  for (size_t i = 0; i < got.x.size(); ++i) {
    if (!got.x[i].defined() || !got.x[i].requires_grad()) continue;
    const std::string what = label + ": grad of input " + std::to_string(i);
    const Tensor& gg = got.x[i].grad();
    const Tensor& wg = want.x[i].grad();
    ASSERT_TRUE(gg.defined() && wg.defined()) << what << ": none";
    ASSERT_EQ(gg.dtype(), got.x[i].dtype()) << what << " has another dtype than its input";
    if (is_low(gg)) {
      double max_abs = 0;
      for (double v : wg.to(kCpu).to_vector<double>())
        if (std::isfinite(v)) max_abs = std::max(max_abs, std::abs(v));
      const double slack = c.lp_bwd_slack * unit_roundoff(low) * max_abs;
      EXPECT_TRUE(within_ulps(what, gg, wg.to(low), c.lp_bwd_ulps, slack));
    } else {
      EXPECT_TRUE(testing::close_in_norm(what, gg, wg, c.lp_f32_rtol));
    }
  }
}

// The 16-bit run against the f32 reference rounded once, on `device`; returns the 16-bit run.
LowRun low_vs_reference(const Case& c, Device device, DType low) {
  SCOPED_TRACE(std::string(dtype_name(low)) + " on " + device.str());
  LowRun lr = run_low(c, device, low, false);
  const LowRun ref = run_low(c, device, low, true, lr.round_dy);
  compare_low(c, low, lr, ref, std::string(dtype_name(low)) + " vs f32 rounded once");
  return lr;
}

class LowPrecision : public ::testing::TestWithParam<Case> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(LowPrecision);

class Gradcheck : public ::testing::TestWithParam<Case> {};
class VendorCpu : public ::testing::TestWithParam<Case> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Gradcheck);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(VendorCpu);
class Autocast : public ::testing::TestWithParam<Case> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Autocast);

#if !KILN_PARITY_CUDA
TEST_P(Gradcheck, Double) { gradcheck_row(GetParam(), false); }

// oneDNN is float only (double always runs the hand kernels).
TEST_P(VendorCpu, HandMatchesOneDnn) { hand_vs_vendor(GetParam(), kCpu, DType::F32); }

INSTANTIATE_TEST_SUITE_P(Table, Gradcheck, ::testing::ValuesIn(cases_in(kGradcheck)), test_name);
INSTANTIATE_TEST_SUITE_P(Table, VendorCpu, ::testing::ValuesIn(cases_in(kVendorCpu)), test_name);

// Both kernel sets: oneDNN's bf16 kernels and ours (the AVX-512 BF16 GEMM, widened operands).
TEST_P(Autocast, CloseToF32) {
  for (Impl impl : {Impl::Hand, Impl::Vendor}) {
    SCOPED_TRACE(impl_name(impl));
    testing::ImplScope scope(impl);
    autocast_vs_f32(GetParam(), kCpu);
  }
}
INSTANTIATE_TEST_SUITE_P(Table, Autocast, ::testing::ValuesIn(cases_in(kAutocast)), test_name);

TEST_P(LowPrecision, MatchesF32RoundedOnce) {
  for (DType low : {DType::BF16, DType::F16}) low_vs_reference(GetParam(), kCpu, low);
}
INSTANTIATE_TEST_SUITE_P(Table, LowPrecision, ::testing::ValuesIn(cases_in(kLowPrecision)),
                         test_name);
#endif

#if KILN_PARITY_CUDA
// ---- (b) the CPU against cuda:0, forward and backward ---------------------------------------

void device_parity(const Case& c, DType dt) {
  SCOPED_TRACE(dtype_name(dt));
  const Inputs x = c.build(dt);
  Inputs on_cpu = leaves(c, x, kCpu, c.reference_f64), on_cuda = leaves(c, x, kCuda);
  const Outputs yc = c.f(on_cpu), yg = c.f(on_cuda);
  ASSERT_EQ(yg.size(), yc.size());
  ASSERT_TRUE(yg[0].device() == kCuda) << "output on " << yg[0].device().str();
  if (c.sanity) {
    EXPECT_TRUE(c.sanity(yc));
  }
  auto in_dt = [&](const Tensor& t) { return c.reference_f64 && is_float(t) ? t.to(dt) : t; };
  for (size_t k = 0; k < yc.size(); ++k)
    EXPECT_TRUE(matches(c.fwd(dt), "output " + std::to_string(k), yg[k], in_dt(yc[k])));
  if (c.has_same_dtype_fwd) {
    NoGradGuard no_grad;
    EXPECT_TRUE(matches(c.same_dtype_fwd(dt), "output 0 vs the CPU in the dtype", yg[0],
                        c.f(x)[0]));
  }
  const bool grads = any_grad(c, on_cuda);
  const Tensor dy = random_tensor(yc[0].shape(), c.seed + 1000, -1.0, 1.0, dt);
  if (grads) {
    backward(yc[0], c.reference_f64 ? dy.to(DType::F64) : dy);
    backward(yg[0], dy.to(kCuda));
    for (size_t i = 0; i < x.size(); ++i) {
      if (!x[i].defined()) continue;
      const std::string what = "grad of input " + std::to_string(i);
      if (!on_cuda[i].requires_grad()) {
        EXPECT_FALSE(on_cuda[i].grad().defined()) << what;
        continue;
      }
      ASSERT_TRUE(on_cuda[i].grad().defined()) << what << ": none";
      const Tol& tol = c.bwd(dt);
      const double extra = i == 0 && c.grad0_scale ? tol.bound * c.grad0_scale(x, dy) : 0.0;
      EXPECT_TRUE(matches(tol, what, on_cuda[i].grad(), in_dt(on_cpu[i].grad()), extra));
    }
  }
  if (c.same_bits) {
    Inputs again = leaves(c, x, kCuda);
    const Outputs ys = c.same_bits(again);
    for (size_t k = 0; k < ys.size() && k < yg.size(); ++k)
      EXPECT_TRUE(matches(Tol::exact(), "composed output " + std::to_string(k), ys[k], yg[k]));
    if (grads) {
      backward(ys[0], dy.to(kCuda));
      for (size_t i = 0; i < x.size(); ++i)
        if (again[i].defined() && again[i].requires_grad()) {
          EXPECT_TRUE(bit_identical("composed grad of input " + std::to_string(i),
                                    again[i].grad(), on_cuda[i].grad()));
        }
    }
  }
}

class DeviceParity : public ::testing::TestWithParam<Case> {};
class GradcheckCuda : public ::testing::TestWithParam<Case> {};
class VendorCuda : public ::testing::TestWithParam<Case> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DeviceParity);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GradcheckCuda);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(VendorCuda);

TEST_P(DeviceParity, Run) {
  KILN_SKIP_WITHOUT_CUDA();
  const Case& c = GetParam();
  for_each_variant(c, [&] {
    for (DType dt : c.dtype_list) device_parity(c, dt);
  });
}

TEST_P(GradcheckCuda, Double) {
  KILN_SKIP_WITHOUT_CUDA();
  const Case& c = GetParam();
  for_each_variant(c, [&] { gradcheck_row(c, true); });
}

// cuBLAS/cuDNN: the simulated stand-ins under the simulator.
TEST_P(VendorCuda, HandMatchesVendor) {
  KILN_SKIP_WITHOUT_CUDA();
  const Case& c = GetParam();
  for (DType dt : c.dtype_list) hand_vs_vendor(c, kCuda, dt);
}

INSTANTIATE_TEST_SUITE_P(Table, DeviceParity, ::testing::ValuesIn(cases_in(kDevice)), test_name);
INSTANTIATE_TEST_SUITE_P(Table, GradcheckCuda, ::testing::ValuesIn(cases_in(kGradcheckCuda)),
                         test_name);
INSTANTIATE_TEST_SUITE_P(Table, VendorCuda, ::testing::ValuesIn(cases_in(kVendorCuda)),
                         test_name);

// Hand: the tensor-core GEMM (step 4, gemm_tensor_core.cu), widened operands for conv; Vendor: cuBLAS
// GemmEx and cuDNN's bf16/f16 convolutions (the simulator's stand-ins under the simulator).
TEST_P(Autocast, CloseToF32OnCuda) {
  KILN_SKIP_WITHOUT_CUDA();
  for (Impl impl : {Impl::Hand, Impl::Vendor}) {
    SCOPED_TRACE(impl_name(impl));
    testing::ImplScope scope(impl);
    autocast_vs_f32(GetParam(), kCuda);
  }
}
INSTANTIATE_TEST_SUITE_P(Table, Autocast, ::testing::ValuesIn(cases_in(kAutocastCuda)),
                         test_name);

// On cuda:0 against the f32 reference there, then against the CPU's 16-bit run.
TEST_P(LowPrecision, MatchesF32RoundedOnceOnCuda) {
  KILN_SKIP_WITHOUT_CUDA();
  const Case& c = GetParam();
  for (DType low : {DType::BF16, DType::F16}) {
    const LowRun gpu = low_vs_reference(c, kCuda, low);
    SCOPED_TRACE(std::string(dtype_name(low)) + ": cuda:0 vs cpu");
    const LowRun cpu = run_low(c, kCpu, low, false);
    compare_low(c, low, gpu, cpu, std::string(dtype_name(low)) + " cuda:0 vs cpu");
  }
}
INSTANTIATE_TEST_SUITE_P(Table, LowPrecision, ::testing::ValuesIn(cases_in(kLowPrecisionCuda)),
                         test_name);
#endif

}  // namespace
}  // namespace kiln::parity
