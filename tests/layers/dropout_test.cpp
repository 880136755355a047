// dropout_test.cpp: the Philox dropout mask (determinism, the rule of dropout.h element by
// element, fraction kept), scaling, eval identity, backward with the same mask, gradcheck in
// double (mask fixed by resetting the generator before each forward), p validation.
#include "layers/dropout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::gradcheck;
using testing::random_tensor;

TEST(Dropout, MaskFollowsThePhiloxRuleElementByElement) {
  for (DType dtype : {DType::F32, DType::F64}) {
    Generator gen(2024);
    gen.reserve(10);  // start at a nonzero base (3 counters in)
    const uint64_t base = gen.offset();
    const double p = 0.37;
    Tensor x = Tensor::ones({3, 7, 13}, dtype);  // 273 elements: not a multiple of 4
    Tensor y = dropout(x, p, true, gen);
    EXPECT_EQ(gen.offset(), base + (273 + 3) / 4);
    auto v = y.to_vector<double>();
    const double scale = static_cast<double>(dtype == DType::F32 ? float(1 / (1 - p)) : 1 / (1 - p));
    for (uint64_t i = 0; i < v.size(); ++i) {
      bool keep = dropout_keep(2024, base, i, static_cast<float>(p));
      ASSERT_EQ(v[i], keep ? scale : 0.0) << dtype_name(dtype) << " element " << i;
    }
  }
}

TEST(Dropout, SameSeedAndOffsetSameMask) {
  Tensor x = random_tensor({5, 11}, 1, 0.5, 2.0, DType::F32);
  Generator gen(7);
  Tensor a = dropout(x, 0.5, true, gen);
  Tensor b = dropout(x, 0.5, true, gen);  // the offset moved on: another mask
  EXPECT_NE(a.to_vector<float>(), b.to_vector<float>());
  gen.set_state(7, 0);
  Tensor c = dropout(x, 0.5, true, gen);
  EXPECT_EQ(a.to_vector<float>(), c.to_vector<float>());
  Generator other(8);
  EXPECT_NE(a.to_vector<float>(), dropout(x, 0.5, true, other).to_vector<float>());
}

TEST(Dropout, FractionKeptAndScaling) {
  for (double p : {0.1, 0.25, 0.5, 0.9}) {
    SCOPED_TRACE(p);
    Generator gen(99);
    const int64_t n = 100003;
    Tensor x = Tensor::full({n}, 3.0, DType::F32);
    auto v = dropout(x, p, true, gen).to_vector<float>();
    const float kept_value = 3.0f * static_cast<float>(1.0 / (1.0 - p));
    int64_t kept = 0;
    for (float e : v) {
      ASSERT_TRUE(e == 0.0f || e == kept_value) << e;
      kept += e != 0.0f;
    }
    // Binomial: the standard deviation of the fraction is sqrt(p(1-p)/n) <= 0.0016.
    EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 0.008);
  }
}

TEST(Dropout, EvalAndZeroPAreIdentity) {
  Generator gen(1);
  Tensor x = random_tensor({2, 3}, 5);
  EXPECT_TRUE(dropout(x, 0.5, false, gen).same(x));
  EXPECT_TRUE(dropout(x, 0.0, true, gen).same(x));
  EXPECT_EQ(gen.offset(), 0u);  // no numbers drawn

  Dropout layer(0.5, gen);
  layer.eval();
  EXPECT_TRUE(layer(x).same(x));
  layer.train();
  EXPECT_NE(layer(x).to_vector<double>(), x.to_vector<double>());
  EXPECT_EQ(layer.type_name(), "Dropout");
  EXPECT_TRUE(layer.parameters().empty());
}

TEST(Dropout, BackwardUsesTheForwardMask) {
  Generator gen(31);
  Tensor x = Tensor::ones({1, 17}, DType::F64);
  x.set_requires_grad(true);
  Tensor y = dropout(x, 0.3, true, gen);
  Tensor g = random_tensor({1, 17}, 6);
  y.backward(g);
  auto gx = x.grad().to_vector<double>();
  auto yv = y.to_vector<double>();  // x = 1, so y is the scaled mask
  auto gv = g.to_vector<double>();
  for (size_t i = 0; i < gx.size(); ++i) EXPECT_DOUBLE_EQ(gx[i], gv[i] * yv[i]) << i;
}

TEST(Dropout, RejectsBadP) {
  Tensor x = Tensor::ones({2});
  for (double p : {-0.1, 1.0, 1.5, std::nan("")}) {
    SCOPED_TRACE(p);
    try {
      dropout(x, p, true);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage);
      EXPECT_NE(std::string(e.what()).find("[0, 1)"), std::string::npos) << e.what();
    }
    EXPECT_THROW(dropout(x, p, false), Error);  // checked in eval too
    EXPECT_THROW(Dropout{p}, Error);
  }
  EXPECT_THROW(dropout(Tensor::ones({2}, DType::I64), 0.5, true), Error);
}

}  // namespace
}  // namespace kiln
