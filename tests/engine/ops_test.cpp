// Core ops: values against hand-computed results, and a gradient check in double for each.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/error.h"
#include "engine/ops.h"
#include "support/gradcheck.h"

using namespace kiln;
using kiln::testing::gradcheck;
using kiln::testing::random_tensor;

static Tensor param(Tensor t) {
  t.set_requires_grad(true);
  return t;
}

TEST(Ops, ElementwiseValuesAndBroadcast) {
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor row = Tensor::from_vector<float>({10, 20, 30}, {3});
  Tensor one = Tensor::from_vector<float>({2}, {1});
  EXPECT_EQ(add(a, row).to_vector<float>(), (std::vector<float>{11, 22, 33, 14, 25, 36}));
  EXPECT_EQ(mul(a, one).to_vector<float>(), (std::vector<float>{2, 4, 6, 8, 10, 12}));
  EXPECT_EQ(sub(a, a).to_vector<float>(), std::vector<float>(6, 0));
  EXPECT_EQ((a / 2.0).to_vector<float>()[1], 1.0f);
  EXPECT_EQ(relu(a - 3.5).to_vector<float>(), (std::vector<float>{0, 0, 0, 0.5, 1.5, 2.5}));
  EXPECT_THROW(add(a, Tensor::zeros({2})), Error);  // not a row of the last dim
  EXPECT_THROW(add(a, a.to(DType::F64)), Error);
  EXPECT_THROW(add(a, a.to("cpu:1")), Error);
}

TEST(Ops, ReductionValues) {
  Tensor a = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_DOUBLE_EQ(sum(a).item(), 21);
  EXPECT_DOUBLE_EQ(mean(a).item(), 3.5);
  EXPECT_EQ(sum(a, {0}).to_vector<double>(), (std::vector<double>{5, 7, 9}));
  EXPECT_EQ(sum(a, {1}, true).shape(), (Shape{2, 1}));
  EXPECT_EQ(mean(a, {-1}).to_vector<double>(), (std::vector<double>{2, 5}));
  EXPECT_EQ(argmax(a, 1).to_vector<int64_t>(), (std::vector<int64_t>{2, 2}));
  EXPECT_THROW(sum(a, {2}), Error);
}

TEST(Ops, MatmulAndTransposeValues) {
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::from_vector<float>({1, 0, 0, 1, 1, 1}, {3, 2});
  EXPECT_EQ(matmul(a, b).to_vector<float>(), (std::vector<float>{4, 5, 10, 11}));
  EXPECT_EQ(transpose(a, 0, 1).to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(matmul(a, a, false, true).to_vector<float>(), (std::vector<float>{14, 32, 32, 77}));
  EXPECT_THROW(matmul(a, a), Error);
}

TEST(Ops, SoftmaxIsStableAndNormalised) {
  Tensor x = Tensor::from_vector<float>({1000, 1001, 1002, -5, 0, 5}, {2, 3});
  auto p = softmax(x).to_vector<float>();
  EXPECT_NEAR(p[0] + p[1] + p[2], 1.0, 1e-6);
  EXPECT_NEAR(p[2], std::exp(2.0) / (1 + std::exp(1.0) + std::exp(2.0)), 1e-6);
  auto lp = log_softmax(x).to_vector<float>();
  EXPECT_NEAR(lp[2], std::log(p[2]), 1e-4);  // |x| ~ 1000 in f32: ulp ~ 6e-5
}

// ---- Gradient checks ----------------------------------------------------------------------------

TEST(OpsGradcheck, Binary) {
  Tensor a = param(random_tensor({3, 5}, 1));
  Tensor b = param(random_tensor({3, 5}, 2, 0.5, 2.0));
  Tensor row = param(random_tensor({5}, 3, 0.5, 2.0));
  Tensor scal = param(random_tensor({1}, 4, 0.5, 2.0));
  for (Tensor other : {b, row, scal}) {
    EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return add(v[0], v[1]); }, {a, other}));
    EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return sub(v[0], v[1]); }, {a, other}));
    EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return mul(v[0], v[1]); }, {a, other}));
    EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return div(v[0], v[1]); }, {a, other}));
  }
}

TEST(OpsGradcheck, Unary) {
  Tensor x = param(random_tensor({4, 3}, 5, 0.2, 2.0));  // positive: log is defined
  Tensor y = param(random_tensor({4, 3}, 6));
  // Keep relu inputs away from the kink at 0.
  auto yv = y.data<double>();
  for (int64_t i = 0; i < y.numel(); ++i) yv[i] += yv[i] >= 0 ? 0.1 : -0.1;
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return exp(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return log(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return square(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return neg(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return relu(v[0]); }, {y}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return v[0] * 3.0 + 1.0; }, {y}));
}

TEST(OpsGradcheck, Reductions) {
  Tensor x = param(random_tensor({2, 3, 4}, 7));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return sum(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return mean(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return sum(v[0], {1}); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return mean(v[0], {0, 2}, true); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return sum(v[0], {2, 0}); }, {x}));
}

TEST(OpsGradcheck, MatmulAllTransposes) {
  Tensor a = param(random_tensor({3, 4}, 8));
  Tensor at = param(random_tensor({4, 3}, 9));
  Tensor b = param(random_tensor({4, 5}, 10));
  Tensor bt = param(random_tensor({5, 4}, 11));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return matmul(v[0], v[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return matmul(v[0], v[1], true, false); }, {at, b}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return matmul(v[0], v[1], false, true); }, {a, bt}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return matmul(v[0], v[1], true, true); }, {at, bt}));
}

TEST(OpsGradcheck, ShapeOps) {
  Tensor x = param(random_tensor({2, 3, 4}, 12));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return transpose(v[0], 0, 2); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return v[0].reshape({6, 4}); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return v[0].to("cpu:1"); }, {x}));
}

TEST(OpsGradcheck, Softmax) {
  Tensor x = param(random_tensor({3, 5}, 13, -3, 3));
  Tensor y = param(random_tensor({2, 3, 4}, 14, -3, 3));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return softmax(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return log_softmax(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return softmax(v[0], 1); }, {y}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return log_softmax(v[0], 0); }, {y}));
}
