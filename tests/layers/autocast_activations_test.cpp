// autocast_activations_test.cpp: 16-bit activations between ops (AutocastOutputs::LowPrecision,
// engine/autocast.h). Under such a guard conv2d returns the guard's dtype; each element is the
// f32 sum that the f32-output autocast path returns, rounded once. The kernels of the two paths
// may add the products in different orders (oneDNN picks a kernel per output type), so an
// element may differ from round(f32 result) by one ulp of the 16-bit format where the f32 sums
// differ in their last bits across a rounding boundary: the bound is 1 ulp, and all of the
// bulk is expected to be exact (checked: at least 90% of the elements).
// The gradients follow their tensors' dtypes: dx is 16-bit for a 16-bit x and f32 for an f32
// one (a network's first convolution), dw stays f32 (the master weights).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/impl.h"
#include "engine/memory_format.h"
#include "engine/ops.h"
#include "layers/conv2d.h"
#include "support/autocast_resnet_step.h"
#include "support/gradcheck.h"
#include "support/low_precision_bits.h"

namespace kiln {
namespace {

using testing::random_tensor;

Tensor with_grad(Tensor t) {
  t.set_requires_grad(true);
  return t;
}

// Every element of `got` (16-bit) within one ulp of `want` (f32) rounded to got's dtype, and
// at least 90% of them equal to it.
void expect_within_one_ulp(const Tensor& got, const Tensor& want, const char* what) {
  ASSERT_TRUE(is_low_precision(got.dtype())) << what;
  ASSERT_EQ(want.dtype(), DType::F32) << what;
  const std::vector<float> g = got.contiguous().to(DType::F32).to_vector<float>();
  const std::vector<float> w =
      want.contiguous().to(got.dtype()).to(DType::F32).to_vector<float>();
  ASSERT_EQ(g.size(), w.size()) << what;
  size_t exact = 0;
  int bad = 0;
  for (size_t i = 0; i < g.size() && bad < 3; ++i) {
    const double err = std::fabs(static_cast<double>(g[i]) - w[i]);
    if (err == 0) ++exact;
    if (!(err <= testing::ulp_of(got.dtype(), w[i]))) {
      ++bad;
      ADD_FAILURE() << what << "[" << i << "] = " << g[i] << ", want " << w[i] << " +- 1 ulp";
    }
  }
  EXPECT_GE(exact, g.size() * 9 / 10) << what << ": fewer than 90% of the elements are exact";
}

struct ConvRun {
  Tensor y, dx, dw;
};

// conv2d of x (f32, or rounded to `x_dtype`) under an autocast guard with the given outputs, and
// the backward of sum(y * dy).
ConvRun run_conv(DType low, AutocastOutputs outputs, DType x_dtype, MemoryFormat format) {
  Tensor x = random_tensor({2, 16, 9, 9}, 1, -1, 1, DType::F32).to(x_dtype).to(format);
  x = with_grad(x);
  Tensor w = with_grad(random_tensor({24, 16, 3, 3}, 2, -0.3, 0.3, DType::F32));
  const Tensor dy = random_tensor({2, 24, 9, 9}, 3, -1, 1, DType::F32);
  ConvRun r;
  {
    AutocastGuard autocast(low, true, outputs);
    r.y = conv2d(x, w, Tensor(), 1, 1);
  }
  backward(r.y, dy.to(r.y.dtype()).to(r.y.memory_format()));
  r.dx = x.grad();
  r.dw = w.grad();
  return r;
}

class AutocastActivations : public ::testing::TestWithParam<DType> {};

TEST_P(AutocastActivations, ConvReturnsTheGuardsDtypeRoundedOnce) {
  const DType low = GetParam();
  for (MemoryFormat format : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
    SCOPED_TRACE(format == MemoryFormat::ChannelsLast ? "channels-last" : "NCHW");
    // A 16-bit x: the reference is the f32-output path on the same 16-bit x.
    const ConvRun ref = run_conv(low, AutocastOutputs::F32, low, format);
    const ConvRun got = run_conv(low, AutocastOutputs::LowPrecision, low, format);
    EXPECT_EQ(got.y.dtype(), low);
    EXPECT_EQ(got.y.memory_format(), format);
    expect_within_one_ulp(got.y, ref.y.to(DType::F32), "y");
    ASSERT_TRUE(got.dx.defined());
    EXPECT_EQ(got.dx.dtype(), low) << "the gradient of a 16-bit x is 16-bit";
    EXPECT_EQ(ref.dx.dtype(), low);
    // The reference rounded dx once too (to x's dtype), from the same f32 sums.
    expect_within_one_ulp(got.dx, ref.dx.to(DType::F32), "dx");
    EXPECT_EQ(got.dw.dtype(), DType::F32);
    // dw: f32 sums of the same 16-bit products, with dy rounded to 16 bits in both runs.
    EXPECT_LT(testing::rel_diff(got.dw, ref.dw), 1e-5);
  }
}

TEST_P(AutocastActivations, AnF32InputGetsAnF32Gradient) {
  const DType low = GetParam();
  const ConvRun got =
      run_conv(low, AutocastOutputs::LowPrecision, DType::F32, MemoryFormat::Contiguous);
  EXPECT_EQ(got.y.dtype(), low);
  EXPECT_EQ(got.dx.dtype(), DType::F32);
  EXPECT_EQ(got.dw.dtype(), DType::F32);
}

TEST_P(AutocastActivations, F32OutputsAreTheDefault) {
  const DType low = GetParam();
  Tensor x = random_tensor({1, 3, 5, 5}, 1, -1, 1, DType::F32);
  Tensor w = random_tensor({4, 3, 3, 3}, 2, -1, 1, DType::F32);
  AutocastGuard autocast(low);
  EXPECT_EQ(autocast_output_dtype(), DType::F32);
  EXPECT_EQ(conv2d(x, w, Tensor(), 1, 1).dtype(), DType::F32);
}

TEST_P(AutocastActivations, ASixteenBitInputNeedsItsGuard) {
  const DType low = GetParam();
  Tensor x = random_tensor({1, 3, 5, 5}, 1, -1, 1, DType::F32).to(low);
  Tensor w = random_tensor({4, 3, 3, 3}, 2, -1, 1, DType::F32);
  EXPECT_THROW(conv2d(x, w, Tensor(), 1, 1), Error);  // no guard
  const DType other = low == DType::BF16 ? DType::F16 : DType::BF16;
  AutocastGuard autocast(other, true, AutocastOutputs::LowPrecision);
  EXPECT_THROW(conv2d(x, w, Tensor(), 1, 1), Error);  // a guard of the other dtype
}

TEST_P(AutocastActivations, MatmulTakesASixteenBitActivation) {
  const DType low = GetParam();
  Tensor a = with_grad(random_tensor({4, 8}, 1, -1, 1, DType::F32).to(low));
  Tensor b = with_grad(random_tensor({8, 3}, 2, -1, 1, DType::F32));
  Tensor c;
  {
    AutocastGuard autocast(low, true, AutocastOutputs::LowPrecision);
    c = matmul(a, b);
  }
  EXPECT_EQ(c.dtype(), DType::F32);  // logits feed the loss: matmul's sums stay f32
  sum(c).backward();
  EXPECT_EQ(a.grad().dtype(), low);
  EXPECT_EQ(b.grad().dtype(), DType::F32);
}

// With oneDNN's convolutions, which read and write channels-last themselves (the sanitizer
// trees run with KILN_KERNELS=hand; the hand ones read it too: channels_last_test.cpp).
TEST_P(AutocastActivations, AResNetTrainsWithSixteenBitActivations) {
  KernelsGuard vendor(Impl::Vendor);
  testing::check_resnet_with_16bit_activations(GetParam(), Device());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AutocastActivations, ::testing::Values(DType::BF16, DType::F16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

}  // namespace
}  // namespace kiln
