// Losses: cross-entropy against log-softmax by hand, stability, bad targets; MSE (gradient
// checks: tests/parity).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "engine/error.h"
#include "layers/loss.h"
#include "support/gradcheck.h"

using namespace kiln;
using kiln::testing::random_tensor;

TEST(CrossEntropy, MatchesLogSoftmaxByHand) {
  Tensor logits = random_tensor({4, 5}, 1, -3, 3);
  Tensor targets = Tensor::from_vector<int64_t>({0, 4, 2, 2}, {4});
  auto lsm = log_softmax(logits).to_vector<double>();
  double expected = -(lsm[0] + lsm[5 + 4] + lsm[10 + 2] + lsm[15 + 2]) / 4;
  EXPECT_NEAR(cross_entropy(logits, targets).item(), expected, 1e-12);
}

TEST(CrossEntropy, StableForHugeLogits) {
  Tensor logits = Tensor::from_vector<float>({1e4f, 0, -1e4f}, {1, 3});
  Tensor t = Tensor::from_vector<int64_t>({0}, {1});
  EXPECT_NEAR(cross_entropy(logits, t).item(), 0.0, 1e-6);
  EXPECT_TRUE(std::isfinite(cross_entropy(logits, Tensor::from_vector<int64_t>({2}, {1})).item()));
}

TEST(CrossEntropy, BadTargetsAreClearErrors) {
  Tensor logits = Tensor::zeros({2, 3});
  try {
    cross_entropy(logits, Tensor::from_vector<int64_t>({1, 3}, {2}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 3 at row 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cross_entropy(logits, Tensor::zeros({2}, DType::I32)), Error);
  EXPECT_THROW(cross_entropy(logits, Tensor::zeros({3}, DType::I64)), Error);
}

TEST(MSELoss, Value) {
  Tensor a = Tensor::from_vector<double>({1, 2, 3}, {3});
  Tensor b = Tensor::from_vector<double>({1, 0, 0}, {3});
  EXPECT_NEAR(mse_loss(a, b).item(), (0 + 4 + 9) / 3.0, 1e-12);
}
