// batchnorm2d_cuda_test.cpp: the BatchNorm2d module on cuda:0 against the CPU over several
// training steps (momentum 0.1 and the cumulative momentum=None; with and without the fused
// ReLU), then in eval mode: outputs, parameter gradients, running statistics and
// num_batches_tracked stay equal. The functional op's parity (training and eval, every
// gradient alone, the fused ReLU against relu(batch_norm2d(...)) bit for bit, the grid-stride
// case) and its gradient checks through CUDA are rows of the parity table (tests/parity).
//
// Tolerance: both devices accumulate in double, so in double the results agree to rounding
// (1e-12 relative to the tensor's scale); in float the statistics round from double on both
// sides and differ at most in the last bit, and a few float operations follow: 2e-5.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>

#include "engine/autograd.h"
#include "layers/batchnorm2d.h"
#include "parity/parity_harness.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::kCpu;
using testing::kCuda;
using testing::near;
using testing::random_tensor;

double tolerance(DType dtype) { return dtype == DType::F64 ? 1e-12 : 2e-5; }

// The module's forward(x, Relu) on cuda:0 and on the CPU over training steps, then eval.
TEST(BatchNorm2dCuda, ModuleFusedReluOverTrainingStepsThenEval) {
  KILN_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(dtype));
    const double tol = tolerance(dtype);
    BatchNorm2d cpu(5, 1e-5, 0.1, true, dtype);
    BatchNorm2d gpu(5, 1e-5, 0.1, true, dtype);
    gpu.to(kCuda);
    for (uint32_t step = 0; step < 3; ++step) {
      const std::string at = ", step " + std::to_string(step);
      const Tensor x = random_tensor({3, 5, 4, 3}, 90 + step, -1.0 - step, 2.0 + step, dtype);
      const Tensor gy = random_tensor({3, 5, 4, 3}, 95 + step, -1.0, 1.0, dtype);
      const Tensor y_cpu = cpu.forward(x, BatchNormActivation::Relu);
      const Tensor y_gpu = gpu.forward(x.to(kCuda), BatchNormActivation::Relu);
      EXPECT_TRUE(near("train y" + at, y_gpu, y_cpu, tol));
      backward(y_cpu, gy);
      backward(y_gpu, gy.to(kCuda));
      EXPECT_TRUE(near("grad weight" + at, gpu.weight().grad(), cpu.weight().grad(), tol));
      EXPECT_TRUE(near("grad bias" + at, gpu.bias().grad(), cpu.bias().grad(), tol));
    }
    EXPECT_TRUE(near("running_mean", gpu.running_mean(), cpu.running_mean(), tol));
    EXPECT_TRUE(near("running_var", gpu.running_var(), cpu.running_var(), tol));
    cpu.eval();
    gpu.eval();
    const Tensor x = random_tensor({2, 5, 3, 3}, 99, -1.0, 1.0, dtype);
    EXPECT_TRUE(near("eval y", gpu.forward(x.to(kCuda), BatchNormActivation::Relu),
                      cpu.forward(x, BatchNormActivation::Relu), tol));
  }
}

// The module on cuda:0 and on the CPU through several training steps (new batches each time),
// then eval mode: running statistics, num_batches_tracked and outputs stay equal.
TEST(BatchNorm2dCuda, ModuleRunningStatsOverTrainingStepsThenEval) {
  KILN_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::F32, DType::F64})
    for (std::optional<double> momentum : {std::optional<double>(0.1), std::optional<double>()}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) +
                   (momentum ? " momentum 0.1" : " momentum None"));
      const double tol = tolerance(dtype);
      BatchNorm2d cpu(5, 1e-5, momentum, true, dtype);
      BatchNorm2d gpu(5, 1e-5, momentum, true, dtype);
      gpu.to(kCuda);
      ASSERT_TRUE(gpu.running_mean().device() == kCuda);
      for (uint32_t step = 0; step < 4; ++step) {
        // A different scale and offset each step, so the running statistics keep moving.
        const Tensor x =
            random_tensor({3, 5, 4, 3}, 50 + step, -1.0 - step, 2.0 + 2 * step, dtype);
        const Tensor y_cpu = cpu(x);
        const Tensor y_gpu = gpu(x.to(kCuda));
        EXPECT_TRUE(near("train y, step " + std::to_string(step), y_gpu, y_cpu, tol));
      }
      EXPECT_TRUE(near("running_mean", gpu.running_mean(), cpu.running_mean(), tol));
      EXPECT_TRUE(near("running_var", gpu.running_var(), cpu.running_var(), tol));
      EXPECT_EQ(gpu.num_batches_tracked().to(kCpu).item(), 4);
      cpu.eval();
      gpu.eval();
      const Tensor x = random_tensor({2, 5, 3, 3}, 99, -1.0, 1.0, dtype);
      EXPECT_TRUE(near("eval y", gpu(x.to(kCuda)), cpu(x), tol));
    }
}

}  // namespace
}  // namespace kiln
