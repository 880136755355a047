// leaky_relu_test.cpp: what the parity table (tests/parity) does not cover for LeakyReLU: the
// rule element by element (signs, zero, the default slope), the module, and the errors.
// Gradient checks and CPU vs CUDA are rows of tests/parity/parity_layers.cpp; the PyTorch fixture
// is compared in tests/layers/pytorch_parity_test.cpp.
#include "layers/leaky_relu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "engine/error.h"

namespace kiln {
namespace {

TEST(LeakyRelu, FollowsTheRuleElementByElement) {
  for (DType dtype : {DType::F32, DType::F64}) {
    Tensor x = Tensor::from_vector(std::vector<double>{-2.0, -0.5, 0.0, 0.25, 3.0}, {5}).to(dtype);
    const std::vector<double> y = leaky_relu(x, 0.2).to_vector<double>();
    const std::vector<double> want = {-0.4, -0.1, 0.0, 0.25, 3.0};
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(y[i], want[i], dtype == DType::F32 ? 1e-7 : 1e-15) << "element " << i;
  }
}

TEST(LeakyRelu, DefaultSlopeIsPyTorchs) {
  EXPECT_DOUBLE_EQ(LeakyReLU().negative_slope(), 0.01);
  Tensor x = Tensor::from_vector(std::vector<double>{-1.0}, {1});
  EXPECT_DOUBLE_EQ(leaky_relu(x).item(), -0.01);
}

TEST(LeakyRelu, BackwardAtZeroTakesTheSlope) {
  Tensor x = Tensor::from_vector(std::vector<double>{0.0, -1.0, 1.0}, {3});
  x.set_requires_grad(true);
  leaky_relu(x, 0.3).backward(Tensor::ones({3}, DType::F64));
  const std::vector<double> g = x.grad().to_vector<double>();
  EXPECT_DOUBLE_EQ(g[0], 0.3);
  EXPECT_DOUBLE_EQ(g[1], 0.3);
  EXPECT_DOUBLE_EQ(g[2], 1.0);
}

TEST(LeakyRelu, ModuleForwardAndRepr) {
  LeakyReLU act(0.1);
  Tensor x = Tensor::from_vector(std::vector<double>{-1.0, 2.0}, {1, 2});
  EXPECT_EQ(act.forward(x).to_vector<double>(), (std::vector<double>{-0.1, 2.0}));
  EXPECT_EQ(act.describe(), "LeakyReLU(negative_slope=0.1)");
}

TEST(LeakyRelu, ErrorsNameTheProblem) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  try {
    LeakyReLU bad(nan);
    FAIL() << "a NaN slope was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("negative_slope must be a finite number"),
              std::string::npos) << e.what();
  }
  EXPECT_THROW(leaky_relu(Tensor::ones({2}, DType::I64)), Error);
  EXPECT_THROW(leaky_relu(Tensor()), Error);
}

}  // namespace
}  // namespace kiln
