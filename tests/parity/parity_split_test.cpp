// parity_split_test.cpp: the backward pass in two halves (backward_input_grads, then
// WeightGradients::run(); engine/autograd.h) against the whole backward, for every row of the
// parity table that has a gradient: the same gradients, bit for bit where the whole backward
// itself is (run twice, it gives the same bits), within the row's tolerance where it is not.
//
// Input 0 is the row's activation (the table's convention); every other input stands for a
// weight. Each row runs split twice: with input 0 named as the input (a middle pipeline stage:
// its gradient comes in the first half, the others' only in the second), and with no inputs
// named (the first stage: every leaf's gradient waits for the second half).
//
//   parity_test       SplitBackward.EqualsWhole        CPU, hand and vendor kernels, f32 and
//                                                      under autocast bf16
//   parity_cuda_test  SplitBackward.EqualsWholeOnCuda  cuda:0, hand and vendor, f32 and under
//                                                      autocast bf16 (the rows of kDevice)
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <optional>
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
namespace {

using testing::bit_identical;
using testing::kCpu;
using testing::kCuda;

enum class Pass { Whole, SplitAfterInput, SplitNoInputs };

struct Grads {
  std::vector<Tensor> g;  // per input: its gradient, or undefined
};

// The row once on `device` in `dt` (forward under autocast `low` if given), its backward as
// `pass` says. For the split passes, checks what the first half must and must not produce.
Grads run_pass(const Case& c, Device device, DType dt, std::optional<DType> low, Pass pass) {
  Inputs x = leaves(c, c.build(dt), device);
  Outputs y;
  {
    std::optional<AutocastGuard> guard;
    if (low) guard.emplace(*low);
    y = c.f(x);
  }
  const Tensor dy =
      testing::random_tensor(y[0].shape(), c.seed + 1000, -1.0, 1.0, DType::F32)
          .to(y[0].dtype())
          .to(device);
  if (pass == Pass::Whole) {
    backward(y[0], dy);
  } else {
    const bool named = pass == Pass::SplitAfterInput && x[0].defined() && x[0].requires_grad();
    WeightGradients w = backward_input_grads(y[0], dy, named ? Inputs{x[0]} : Inputs{});
    for (size_t i = 0; i < x.size(); ++i) {
      if (!x[i].defined() || !x[i].requires_grad()) continue;
      if (named && i == 0) {
        EXPECT_TRUE(x[0].grad().defined()) << "the input's gradient after the first half";
      } else {
        EXPECT_FALSE(x[i].grad().defined()) << "input " << i << "'s gradient before run()";
      }
    }
    // The layers that promise to split (SplitMode) never run whole.
    for (const std::string& name : w.ran_whole()) {
      for (const char* splits : {"Conv2dBackward", "Conv2dAutocastBackward", "MatmulBackward",
                                 "MatmulAutocastBackward", "BatchNorm2dBackward",
                                 "BinaryBackward"})
        EXPECT_NE(name, splits) << "ran whole in the first half";
    }
    w.run();
    EXPECT_FALSE(w.pending());
  }
  Grads out;
  for (const Tensor& t : x) out.g.push_back(t.defined() && t.requires_grad() ? t.grad() : Tensor());
  return out;
}

void split_vs_whole(const Case& c, Device device, DType dt, std::optional<DType> low) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + (low ? std::string(" autocast ") + dtype_name(*low)
                                                  : std::string()) +
               " on " + device.str());
  if (!any_grad(c, c.build(dt))) return;
  const Grads whole = run_pass(c, device, dt, low, Pass::Whole);
  const Grads again = run_pass(c, device, dt, low, Pass::Whole);
  // Bit for bit only where the whole backward repeats itself bit for bit (a kernel summing with
  // atomics in a varying order does not, on a GPU).
  bool repeatable = true;
  for (size_t i = 0; i < whole.g.size(); ++i)
    if (whole.g[i].defined())
      repeatable = repeatable && static_cast<bool>(bit_identical("", again.g[i], whole.g[i]));
  for (Pass pass : {Pass::SplitAfterInput, Pass::SplitNoInputs}) {
    SCOPED_TRACE(pass == Pass::SplitAfterInput ? "input 0 named" : "no input named");
    const Grads split = run_pass(c, device, dt, low, pass);
    for (size_t i = 0; i < whole.g.size(); ++i) {
      if (!whole.g[i].defined()) {
        EXPECT_FALSE(split.g[i].defined()) << "input " << i;
        continue;
      }
      const std::string what = "grad of input " + std::to_string(i);
      if (repeatable)
        EXPECT_TRUE(bit_identical(what, split.g[i], whole.g[i]));
      else
        EXPECT_TRUE(testing::matches(c.bwd(dt), what, split.g[i], whole.g[i]));
    }
  }
}

bool runs_f32(const Case& c) {
  return std::find(c.dtype_list.begin(), c.dtype_list.end(), DType::F32) != c.dtype_list.end();
}

std::vector<Case> rows_in(Suite s) {
  std::vector<Case> out;
  for (const Case& c : cases_in(s))
    if (runs_f32(c)) out.push_back(c);
  return out;
}

std::string row_name(const ::testing::TestParamInfo<Case>& info) {
  std::string out;
  for (char ch : info.param.name) out += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return out;
}

class SplitBackward : public ::testing::TestWithParam<Case> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(SplitBackward);

#if !KILN_PARITY_CUDA
TEST_P(SplitBackward, EqualsWhole) {
  for (Impl impl : {Impl::Hand, Impl::Vendor}) {
    SCOPED_TRACE(impl_name(impl));
    testing::ImplScope scope(impl);
    split_vs_whole(GetParam(), kCpu, DType::F32, std::nullopt);
    split_vs_whole(GetParam(), kCpu, DType::F32, DType::BF16);
  }
}
// Every row that runs in f32 (the autocast suite's rows).
INSTANTIATE_TEST_SUITE_P(Table, SplitBackward, ::testing::ValuesIn(rows_in(kAutocast)), row_name);
#else
TEST_P(SplitBackward, EqualsWholeOnCuda) {
  KILN_SKIP_WITHOUT_CUDA();
  const Case& c = GetParam();
  for (Impl impl : {Impl::Hand, Impl::Vendor}) {
    SCOPED_TRACE(impl_name(impl));
    testing::ImplScope scope(impl);
    split_vs_whole(c, kCuda, DType::F32, std::nullopt);
    if (c.has(kAutocastCuda)) split_vs_whole(c, kCuda, DType::F32, DType::BF16);
  }
}
INSTANTIATE_TEST_SUITE_P(Table, SplitBackward, ::testing::ValuesIn(rows_in(kDevice)), row_name);
#endif

}  // namespace
}  // namespace kiln::parity
