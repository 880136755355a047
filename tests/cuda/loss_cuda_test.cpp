// loss_cuda_test.cpp: the losses' errors on cuda:0: a bad target (an Input error naming the
// first bad row, as on the CPU, found without making the host wait), targets, operands or
// dtypes that do not match. Their parity with the CPU (odd shapes, huge logits, grid-stride
// sizes, each MSE gradient alone) and their gradient checks through CUDA are rows of the
// parity table (tests/parity).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/cuda/context.h"
#include "engine/cuda/graph.h"
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

// A target outside [0, C) is an input error on both devices, naming the first bad row. The CPU
// call throws. The CUDA call does not wait for its kernels: its loss is NaN, and the error comes
// from check_cross_entropy_targets() (which waits), or from a later call on this thread once
// the check has finished.
TEST(CrossEntropyCuda, BadTargetIsAnInputErrorLikeCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor logits = random_tensor({6, 7}, 5, -1.0, 1.0, DType::F32);
  const Tensor good = random_targets(6, 7, 3).to(kCuda);
  auto expect_named = [](const Error& e, int64_t bad) {
    EXPECT_EQ(e.kind(), ErrorKind::Input);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("target " + std::to_string(bad) + " at row 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("outside [0, 7)"), std::string::npos) << msg;
  };
  for (int64_t bad : {int64_t{-1}, int64_t{7}, int64_t{1000}}) {
    std::vector<int64_t> t = {0, 1, 2, 3, 4, 5};
    t[2] = bad;
    t[4] = 7;  // a second bad row: the message names the first
    const Tensor targets = Tensor::from_vector(t, {6});
    EXPECT_THROW(cross_entropy(logits, targets), Error);
    const Tensor loss = cross_entropy(logits.to(kCuda), targets.to(kCuda));
    try {
      check_cross_entropy_targets();
      ADD_FAILURE() << "no error for target " << bad;
    } catch (const Error& e) {
      expect_named(e, bad);
    }
    EXPECT_TRUE(std::isnan(loss.item())) << "the loss of a bad target is not NaN";
    // Found by a later call: the check has finished once the stream has.
    (void)cross_entropy(logits.to(kCuda), targets.to(kCuda));
    cuda::synchronize();
    try {
      (void)cross_entropy(logits.to(kCuda), good);
      ADD_FAILURE() << "no error for target " << bad << " from a later call";
    } catch (const Error& e) {
      expect_named(e, bad);
      EXPECT_NE(std::string(e.what()).find("an earlier call"), std::string::npos) << e.what();
    }
    check_cross_entropy_targets();  // the checks are read: nothing is left to throw
  }
  const Tensor loss = cross_entropy(logits.to(kCuda), good);
  check_cross_entropy_targets();
  EXPECT_TRUE(std::isfinite(loss.item()));
}

// Captured into a CUDA graph, cross_entropy queues its kernels only (a replay runs no host
// code: the deferred check of the targets is left out), and each replay computes the loss of
// the static inputs as they are then, equal to the eager call's bit for bit; a bad target
// still makes the replayed loss NaN.
TEST(CrossEntropyCuda, CapturedInAGraphReplaysTheEagerLoss) {
  KILN_SKIP_WITHOUT_CUDA();
  Tensor logits = random_tensor({6, 7}, 5, -1.0, 1.0, DType::F32).to(kCuda);
  Tensor targets = random_targets(6, 7, 3).to(kCuda);
  check_cross_entropy_targets();
  (void)cross_entropy(logits, targets);  // once eagerly first, as a graph's warm-up
  cuda::Graph graph;
  Tensor loss;
  graph.capture([&] { loss = cross_entropy(logits, targets); });
  for (uint32_t seed : {7u, 8u}) {
    logits.copy_(random_tensor({6, 7}, seed, -1.0, 1.0, DType::F32));
    targets.copy_(random_targets(6, 7, seed));
    graph.replay();
    const Tensor eager = cross_entropy(logits, targets);
    EXPECT_EQ(loss.to_vector<float>(), eager.to_vector<float>()) << "seed " << seed;
  }
  check_cross_entropy_targets();  // the eager calls' checks: all good
  targets.copy_(Tensor::from_vector(std::vector<int64_t>{0, 1, 9, 3, 4, 5}, {6}));
  graph.replay();
  EXPECT_TRUE(std::isnan(loss.item())) << "a replay's loss of a bad target is not NaN";
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
