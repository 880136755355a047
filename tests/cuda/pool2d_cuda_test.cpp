// pool2d_cuda_test.cpp: the pooling modules on cuda:0 against the CPU, on a (C, H, W) input.
// The functional ops' parity with the CPU (max pooling bit for bit with ties, NaN and -inf;
// average and adaptive pooling within a few ulp), their gradient checks through CUDA and the
// grid-stride case are rows of the parity table (tests/parity).
#include <gtest/gtest.h>

#include "layers/pool2d.h"
#include "parity/parity_harness.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::kCuda;
using testing::near;
using testing::random_tensor;
using testing::same_values;

double avg_tolerance(DType dtype) { return dtype == DType::F64 ? 1e-14 : 1e-6; }

// A (C, H, W) input, and the module.
TEST(MaxPool2dCuda, ThreeDimensionalInputAndModule) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor x = random_tensor({3, 7, 6}, 5, -1.0, 1.0, DType::F32);
  MaxPool2d pool(3, 2, 1);
  EXPECT_TRUE(same_values("y", pool.forward(x.to(kCuda)), pool.forward(x)));
}

TEST(AdaptiveAvgPool2dCuda, ThreeDimensionalInputAndModule) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor x = random_tensor({3, 7, 6}, 6, -1.0, 1.0, DType::F32);
  AdaptiveAvgPool2d pool(3, 4);
  EXPECT_TRUE(near("y", pool.forward(x.to(kCuda)), pool.forward(x), avg_tolerance(DType::F32)));
}

}  // namespace
}  // namespace kiln
