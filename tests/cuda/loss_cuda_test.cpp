// loss_cuda_test.cpp: the losses' errors on cuda:0: a bad target (the CUDA op throws like the
// CPU's, naming the first bad row), targets, operands or dtypes that do not match. Their
// parity with the CPU (odd shapes, huge logits, grid-stride sizes, each MSE gradient alone)
// and their gradient checks through CUDA are rows of the parity table (tests/parity).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/error.h"
#include "layers/loss.h"
#include "parity/parity_harness.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::kCuda;
using testing::random_tensor;

// (N) i64 targets in [0, C), from a fixed seed.
Tensor random_targets(int64_t n, int64_t c, uint32_t seed) {
  std::vector<int64_t> t(static_cast<size_t>(n));
  uint32_t s = seed;
  for (auto& v : t) {
    s = s * 1664525u + 1013904223u;
    v = static_cast<int64_t>((s >> 8) % static_cast<uint32_t>(c));
  }
  return Tensor::from_vector(t, {n});
}

// A target outside [0, C) is an input error on both devices; CUDA names the first bad row.
TEST(CrossEntropyCuda, BadTargetThrowsLikeCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor logits = random_tensor({6, 7}, 5, -1.0, 1.0, DType::F32);
  for (int64_t bad : {int64_t{-1}, int64_t{7}, int64_t{1000}}) {
    std::vector<int64_t> t = {0, 1, 2, 3, 4, 5};
    t[2] = bad;
    t[4] = 7;  // a second bad row: the message names the first
    const Tensor targets = Tensor::from_vector(t, {6});
    EXPECT_THROW(cross_entropy(logits, targets), Error);
    try {
      cross_entropy(logits.to(kCuda), targets.to(kCuda));
      ADD_FAILURE() << "no error for target " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Input);
      const std::string msg = e.what();
      EXPECT_NE(msg.find("target " + std::to_string(bad) + " at row 2"), std::string::npos)
          << msg;
      EXPECT_NE(msg.find("outside [0, 7)"), std::string::npos) << msg;
    }
  }
}

TEST(CrossEntropyCuda, TargetsOnAnotherDeviceAreAnError) {
  KILN_SKIP_WITHOUT_CUDA();
  EXPECT_THROW(cross_entropy(Tensor::zeros({2, 3}).to(kCuda), random_targets(2, 3, 1)), Error);
}

TEST(MseLossCuda, MixedDevicesOrDtypesAreErrors) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor a = Tensor::zeros({3}).to(kCuda);
  EXPECT_THROW(mse_loss(a, Tensor::zeros({3})), Error);
  EXPECT_THROW(mse_loss(a, Tensor::zeros({3}, DType::F64).to(kCuda)), Error);
  EXPECT_THROW(mse_loss(a, Tensor::zeros({4}).to(kCuda)), Error);
}

}  // namespace
}  // namespace kiln
