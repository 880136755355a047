// dropout_cuda_test.cpp: dropout on cuda:0 draws the SAME mask as on the CPU, bit for bit: for
// the same generator state the outputs and the gradients are identical (compared as bytes),
// in float and double, for p = 0.25 and 0.5 and sizes that leave a partial group of 4 (1, 3,
// 5, 273, ...), with and without a nonzero starting offset. Also: two consecutive calls draw
// different masks and advance the generator as the CPU does; restoring the generator state
// reproduces a mask (resume); a tensor large enough that the kernel's grid-stride loop wraps.
//
// Exact comparison is right here: the mask is a pure function of (seed, counter, element),
// uniform01 is exact in float on both devices, and a kept element is the single product
// x * scale in T on both: no tolerance is needed, so none is allowed.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "layers/dropout.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::random_tensor;

const Device kCpu(DeviceType::CPU, 0);
const Device kCuda(DeviceType::CUDA, 0);

// Byte equality of two tensors of one dtype, wherever they live; names the first difference.
::testing::AssertionResult bit_identical(const std::string& what, const Tensor& got,
                                         const Tensor& want) {
  if (got.shape() != want.shape() || got.dtype() != want.dtype())
    return ::testing::AssertionFailure() << what << ": " << got.str() << " vs " << want.str();
  const Tensor g = got.to(kCpu), w = want.to(kCpu);
  const size_t bytes = static_cast<size_t>(w.numel()) * dtype_size(w.dtype());
  if (bytes == 0 || std::memcmp(g.raw_data(), w.raw_data(), bytes) == 0)
    return ::testing::AssertionSuccess();
  const std::vector<double> gv = g.to_vector<double>(), wv = w.to_vector<double>();
  for (size_t i = 0; i < wv.size(); ++i)
    if (std::memcmp(&gv[i], &wv[i], sizeof(double)) != 0)
      return ::testing::AssertionFailure() << what << ": element " << i << " is " << gv[i]
                                           << " on CUDA, " << wv[i] << " on the CPU";
  return ::testing::AssertionFailure() << what << ": bytes differ";
}

Tensor leaf(const Tensor& t, Device device) {
  Tensor out = t.to(device).detach();
  out.set_requires_grad(true);
  return out;
}

// Dropout of the same x with two generators in the same state, one per device; forward and
// backward must agree bit for bit, and both generators must have moved on alike.
void check_same_mask(const Shape& shape, DType dtype, double p, uint64_t seed, uint64_t skip) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + shape_str(shape) +
               " p=" + std::to_string(p) + " offset " + std::to_string(skip));
  // Values away from 0, so a dropped element (0) never equals a kept one by accident.
  const Tensor x = random_tensor(shape, static_cast<uint32_t>(seed), 0.5, 2.0, dtype);
  const Tensor gy = random_tensor(shape, static_cast<uint32_t>(seed + 1), -1.0, 1.0, dtype);
  Generator gen_cpu(seed), gen_gpu(seed);
  gen_cpu.reserve(skip);
  gen_gpu.reserve(skip);
  Tensor x_cpu = leaf(x, kCpu), x_gpu = leaf(x, kCuda);
  const Tensor y_cpu = dropout(x_cpu, p, true, gen_cpu);
  const Tensor y_gpu = dropout(x_gpu, p, true, gen_gpu);
  ASSERT_TRUE(y_gpu.device() == kCuda);
  EXPECT_EQ(gen_gpu.offset(), gen_cpu.offset());
  EXPECT_TRUE(bit_identical("y", y_gpu, y_cpu));
  backward(y_cpu, gy);
  backward(y_gpu, gy.to(kCuda));
  EXPECT_TRUE(bit_identical("grad x", x_gpu.grad(), x_cpu.grad()));
}

TEST(DropoutCuda, MaskBitIdenticalToCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  const std::vector<Shape> shapes = {{1}, {3}, {4}, {5}, {3, 7, 13}, {2, 1, 1, 1}, {1027},
                                     {4, 33, 65}};
  uint64_t seed = 1;
  for (DType dtype : {DType::F32, DType::F64})
    for (double p : {0.25, 0.5})
      for (const Shape& shape : shapes) {
        check_same_mask(shape, dtype, p, ++seed, 0);
        check_same_mask(shape, dtype, p, ++seed, 7);  // a base that is not a multiple of 4
      }
}

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

// 4 * 256 * 4096 + 5 elements: more groups of 4 than the capped grid has threads, so the
// grid-stride loop takes a second lap (and the last group is partial).
TEST(DropoutCuda, LargeTensorGridStride) {
  KILN_SKIP_WITHOUT_CUDA();
  check_same_mask({4 * 256 * 4096 + 5}, DType::F32, 0.5, 77, 3);
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
