// Core ops: values against hand-computed results, and a gradient check in double for each.
// add_relu (relu(a + b) in one pass) is also checked against its unfused composition, bit for
// bit, values and gradients, including the special values where the two could part ways.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "engine/error.h"
#include "engine/ops.h"
#include "cuda/engine_parity.h"
#include "support/gradcheck.h"

using namespace kiln;
using kiln::testing::bit_identical;
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

// add_relu is relu(add(a, b)) to the bit, forward and backward, in f32 and f64: at the kink
// (a = -b, +-0), at infinities (inf + -inf is NaN, which relu maps to 0) and at NaN.
TEST(Ops, AddReluIsReluOfAddBitForBit) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> av = {1.5,  -2.0, 0.25,  -0.0, 0.0, -0.0,
                                  inf,  inf,  -inf,  nan,  3.0, 1e-300};
  const std::vector<double> bv = {-0.5, 1.0,  -0.25, -0.0, -0.0, 0.0,
                                  -inf, 1.0,  5.0,   1.0,  nan, -1e-300};
  for (DType dt : {DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(dt));
    const Shape shape{3, 4};
    const Tensor a0 = Tensor::from_vector(av, shape).to(dt);
    const Tensor b0 = Tensor::from_vector(bv, shape).to(dt);
    // Hand-computed where the values are finite: relu(1.5 - 0.5) = 1, relu(-1) = 0, 0, ...
    const std::vector<double> y = add_relu(a0, b0).to_vector<double>();
    const std::vector<double> want = {1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, inf, 0.0, 0.0, 0.0, 0.0};
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(y[i], want[i]) << "element " << i;
    EXPECT_FALSE(std::signbit(y[3])) << "relu(-0 + -0) is +0, as relu(-0)";

    // Unfused and fused, each with its own leaves; the upstream gradient is random.
    Tensor a1 = param(a0.clone()), b1 = param(b0.clone());
    Tensor a2 = param(a0.clone()), b2 = param(b0.clone());
    const Tensor unfused = relu(add(a1, b1));
    const Tensor fused = add_relu(a2, b2);
    EXPECT_TRUE(bit_identical("forward", fused, unfused));
    const Tensor g = random_tensor(shape, 99, -1.0, 1.0, dt);
    unfused.backward(g);
    fused.backward(g);
    EXPECT_TRUE(bit_identical("grad a", a2.grad(), a1.grad()));
    EXPECT_TRUE(bit_identical("grad b", b2.grad(), b1.grad()));
    // The mask is y > 0: only the elements with a positive output pass the gradient.
    const std::vector<double> ga = a2.grad().to_vector<double>(), gv = g.to_vector<double>();
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_EQ(ga[i], want[i] > 0 ? gv[i] : 0.0) << "grad element " << i;
  }
}

// add_relu(x, x) is relu(2x): both edges lead to the same leaf, whose gradient is the sum.
TEST(Ops, AddReluOfATensorWithItself) {
  Tensor x = param(Tensor::from_vector<double>({-1.0, 0.5, 2.0, -0.25}, {4}));
  Tensor y = add_relu(x, x);
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{0.0, 1.0, 4.0, 0.0}));
  y.backward(Tensor::from_vector<double>({1, 2, 3, 4}, {4}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 4, 6, 0}));
}

TEST(Ops, AddReluErrors) {
  const Tensor a = Tensor::zeros({2, 3});
  // No broadcasting: the residual join adds two tensors of one shape.
  for (const Tensor& b : {Tensor::zeros({3}), Tensor::zeros({1}), Tensor::zeros({3, 2})}) {
    try {
      add_relu(a, b);
      ADD_FAILURE() << "add_relu of [2, 3] and " << shape_str(b.shape()) << " did not throw";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("add_relu"), std::string::npos) << msg;
      EXPECT_NE(msg.find(shape_str(b.shape())), std::string::npos) << msg;
    }
  }
  EXPECT_THROW(add_relu(a, a.to(DType::F64)), Error);
  EXPECT_THROW(add_relu(a, a.to("cpu:1")), Error);
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

// Inputs off the kink: wherever |a + b| < 0.1, b moves 0.2 away from it; both sides of the
// kink stay populated, so the mask is tested.
TEST(OpsGradcheck, AddRelu) {
  Tensor a = param(random_tensor({3, 5, 2}, 15));
  Tensor b = param(random_tensor({3, 5, 2}, 16));
  double* av = a.data<double>();
  double* bv = b.data<double>();
  int positive = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double s = av[i] + bv[i];
    if (std::abs(s) < 0.1) bv[i] += s >= 0 ? 0.2 : -0.2;
    positive += av[i] + bv[i] > 0;
  }
  ASSERT_GT(positive, 5);
  ASSERT_LT(positive, a.numel() - 5);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return add_relu(v[0], v[1]); }, {a, b}));
  // Only one operand requires grad (the other is data, as an identity shortcut from an input).
  const Tensor b_data = b.detach();
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& v) { return add_relu(v[0], b_data); }, {a}));
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& v) { return add_relu(b_data, v[0]); }, {a}));
  // The same tensor as both operands: relu(2x), both edges into one leaf.
  Tensor x = param(random_tensor({4, 3}, 17));
  double* xv = x.data<double>();
  for (int64_t i = 0; i < x.numel(); ++i) xv[i] += xv[i] >= 0 ? 0.1 : -0.1;
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& v) { return add_relu(v[0], v[0]); }, {x}));
  // Downstream of other ops: add_relu(a * b, a), a reached along two paths (a * b + a is off
  // the kink too: checked, not assumed).
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_GT(std::abs(av[i] * bv[i] + av[i]), 1e-3) << i;
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& v) { return add_relu(mul(v[0], v[1]), v[0]); }, {a, b}));
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
