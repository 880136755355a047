// dropout_cuda_test.cpp: dropout on cuda:0 beyond the parity table (tests/parity, where the
// mask is bit-identical to the CPU's for the same generator state, forward and backward, on
// sizes that leave a partial group of 4, with and without a starting offset): the kept
// fraction follows p, two consecutive calls draw different masks and advance the generator as
// the CPU does, restoring the generator state reproduces a mask (resume), and eval or p = 0 is
// the identity.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "layers/dropout.h"
#include "parity/parity_harness.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::bit_identical;
using testing::kCpu;
using testing::kCuda;
using testing::random_tensor;

// The kept fraction is what p says (a sanity check that the mask is not all ones or zeros).
TEST(DropoutCuda, KeptFractionFollowsP) {
  KILN_SKIP_WITHOUT_CUDA();
  Generator gen(5);
  const Tensor y = dropout(Tensor::ones({100000}).to(kCuda), 0.25, true, gen);
  double kept = 0;
  for (float v : y.to(kCpu).to_vector<float>()) kept += v != 0;
  EXPECT_NEAR(kept / 100000, 0.75, 0.01);
}

TEST(DropoutCuda, ConsecutiveCallsDrawDifferentMasks) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor x = random_tensor({7, 9}, 3, 0.5, 2.0, DType::F32).to(kCuda);
  Generator gen(11), ref(11);
  const Tensor a = dropout(x, 0.5, true, gen);
  const Tensor b = dropout(x, 0.5, true, gen);
  EXPECT_NE(a.to(kCpu).to_vector<float>(), b.to(kCpu).to_vector<float>());
  // ... and each is the CPU's mask for the same state.
  const Tensor x_cpu = x.to(kCpu);
  EXPECT_TRUE(bit_identical("first call", a, dropout(x_cpu, 0.5, true, ref)));
  EXPECT_TRUE(bit_identical("second call", b, dropout(x_cpu, 0.5, true, ref)));
}

// Saving (seed, offset) and restoring it later draws the same mask again: a resumed run
// reproduces an uninterrupted one, across devices too.
TEST(DropoutCuda, RestoredGeneratorStateReproducesTheMask) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor x = random_tensor({5, 11}, 4, 0.5, 2.0, DType::F64).to(kCuda);
  Generator gen(21);
  (void)dropout(x, 0.5, true, gen);  // some earlier step
  const uint64_t saved_seed = gen.seed(), saved_offset = gen.offset();
  const Tensor first = dropout(x, 0.5, true, gen);
  (void)dropout(x, 0.5, true, gen);  // the run goes on
  gen.set_state(saved_seed, saved_offset);
  EXPECT_TRUE(bit_identical("resumed on CUDA", dropout(x, 0.5, true, gen), first));
  Generator cpu_gen(0);
  cpu_gen.set_state(saved_seed, saved_offset);
  EXPECT_TRUE(bit_identical("resumed on the CPU", dropout(x.to(kCpu), 0.5, true, cpu_gen), first));
}

TEST(DropoutCuda, EvalAndZeroPAreTheIdentity) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor x = random_tensor({3, 4}, 5, -1.0, 1.0, DType::F32).to(kCuda);
  Generator gen(1);
  EXPECT_TRUE(bit_identical("eval", dropout(x, 0.5, false, gen), x));
  EXPECT_TRUE(bit_identical("p = 0", dropout(x, 0.0, true, gen), x));
  EXPECT_EQ(gen.offset(), 0u);  // nothing drawn
}

}  // namespace
}  // namespace kiln
