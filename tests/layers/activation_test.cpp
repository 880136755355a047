// ReLU and Flatten modules (their gradient checks: tests/parity).
#include <gtest/gtest.h>

#include <vector>

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
}

TEST(Flatten, KeepsBatchDim) {
  Flatten f;
  Tensor x = kiln::testing::random_tensor({2, 3, 4, 5}, 3);
  EXPECT_EQ(f(x).shape(), (Shape{2, 60}));
}
