// Core ops: values against hand-computed results, and a gradient check in double for each.
// add_relu (relu(a + b) in one pass) is also checked against its unfused composition, bit for
// bit, values and gradients, including the special values where the two could part ways.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "engine/error.h"
#include "engine/ops.h"
#include "parity/parity_harness.h"
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
