// ReLU and Flatten modules.
#include <gtest/gtest.h>

#include "layers/activation.h"
#include "support/gradcheck.h"

using namespace kiln;

TEST(ReLU, ZeroesNegativesAndPassesGradientOnlyWherePositive) {
  ReLU r;
  Tensor x = Tensor::from_vector<double>({-2, -0.5, 0.5, 3}, {2, 2}).set_requires_grad(true);
  Tensor y = r(x);
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{0, 0, 0.5, 3}));
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0, 1, 1}));
  Tensor z = Tensor::from_vector<double>({-0.7, 0.3, 1.1, -2.2, 0.9, -0.4}, {2, 3}).set_requires_grad(true);
  EXPECT_TRUE(kiln::testing::gradcheck([&](const std::vector<Tensor>& v) { return r(v[0]); }, {z}));
}

TEST(Flatten, KeepsBatchDimAndIsDifferentiable) {
  Flatten f;
  Tensor x = kiln::testing::random_tensor({2, 3, 4, 5}, 3).set_requires_grad(true);
  EXPECT_EQ(f(x).shape(), (Shape{2, 60}));
  EXPECT_TRUE(kiln::testing::gradcheck([&](const std::vector<Tensor>& v) { return f(v[0]); }, {x}));
}
