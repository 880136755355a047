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
//
// 16-bit activations (bf16, f16; NCHW and channels-last, the latter through the rows
// reductions; train and eval; with and without the fused ReLU): on cuda:0 the f32 op on the
// widened input rounded once (tests/support/batchnorm_lowp.h states the bounds), and the CPU's
// 16-bit results within 1 ulp of the 16-bit format plus the f32 tolerance above (the two
// devices' f32 results differ by that much before the one rounding).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/memory_format.h"
#include "layers/batchnorm2d.h"
#include "parity/parity_harness.h"
#include "support/batchnorm_lowp.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::kCpu;
using testing::kCuda;
using testing::near;
using testing::random_tensor;
using testing::ulp16;

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

// Channels-last activations on cuda:0 (the NCHW kernels on the (N * H * W, C) view, whose
// reductions read a row's neighbouring channels together: batchnorm2d_rows_cuda.cu) against the
// CPU on NCHW: training and eval, with and without the fused ReLU, every gradient, no
// conversion. 40 channels make a partial block of 32; 1024 rows are cut into several pieces.
// An NCHW input with 1x1 images takes the same kernels.
TEST(BatchNorm2dCuda, ChannelsLastMatchesTheCpuWithoutConversions) {
  KILN_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::F32, DType::F64}) {
    for (bool training : {true, false}) {
      for (auto act : {BatchNormActivation::None, BatchNormActivation::Relu}) {
        for (const Shape& shape : {Shape{4, 40, 16, 16}, Shape{6, 40, 1, 1}, Shape{2, 3, 5, 3}}) {
          SCOPED_TRACE(::testing::Message()
                       << dtype_name(dtype) << " training=" << training << " relu="
                       << (act == BatchNormActivation::Relu) << " " << shape_str(shape));
          const double tol = tolerance(dtype);
          const int64_t c = shape[1];
          const Tensor x = random_tensor(shape, 120, -2.0, 3.0, dtype);
          const Tensor gy = random_tensor(shape, 121, -1.0, 1.0, dtype);
          Tensor w = random_tensor({c}, 122, 0.5, 1.5, dtype), b = random_tensor({c}, 123, -1, 1, dtype);
          const Tensor rm = random_tensor({c}, 124, -0.5, 0.5, dtype);
          const Tensor rv = random_tensor({c}, 125, 0.5, 2.0, dtype);
          Tensor xc = x.clone().set_requires_grad(true), wc = w.clone().set_requires_grad(true),
                 bc = b.clone().set_requires_grad(true);
          Tensor rm_c = rm.clone(), rv_c = rv.clone();
          const Tensor yc = batch_norm2d(xc, wc, bc, rm_c, rv_c, training, 0.1, 1e-5, act);
          backward(yc, gy);
          Tensor xg = x.to(kCuda).to(MemoryFormat::ChannelsLast).detach().set_requires_grad(true);
          Tensor wg = w.to(kCuda).set_requires_grad(true), bg = b.to(kCuda).set_requires_grad(true);
          Tensor rm_g = rm.to(kCuda), rv_g = rv.to(kCuda);
          const Tensor gy_g = gy.to(kCuda).to(MemoryFormat::ChannelsLast);
          const int64_t before = memory_format_conversions();
          const Tensor yg = batch_norm2d(xg, wg, bg, rm_g, rv_g, training, 0.1, 1e-5, act);
          backward(yg, gy_g);
          EXPECT_EQ(memory_format_conversions() - before, 0);
          EXPECT_TRUE(yg.is_channels_last() || c == 1 || shape[2] * shape[3] == 1);
          EXPECT_TRUE(near("y", yg, yc, tol));
          EXPECT_TRUE(near("running_mean", rm_g, rm_c, tol));
          EXPECT_TRUE(near("running_var", rv_g, rv_c, tol));
          EXPECT_TRUE(near("grad x", xg.grad(), xc.grad(), tol));
          EXPECT_TRUE(near("grad weight", wg.grad(), wc.grad(), tol));
          EXPECT_TRUE(near("grad bias", bg.grad(), bc.grad(), tol));
        }
      }
    }
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

// The 16-bit op on cuda:0 against the f32 op on cuda:0 (batchnorm_lowp.h). 40 channels: a
// partial block of the rows kernels' 32; 8 x 40 x 8 x 8 = 20,480 elements make several row
// pieces and a grid-stride loop of more than one block.
TEST(BatchNorm2dCuda, LowPrecisionIsF32OfWidenedInputRoundedOnce) {
  KILN_SKIP_WITHOUT_CUDA();
  uint32_t seed = 700;
  for (DType dt : {DType::BF16, DType::F16})
    for (const Shape& s : {Shape{3, 5, 4, 3}, Shape{8, 40, 8, 8}})
      for (bool channels_last : {false, true})
        for (bool training : {true, false})
          for (bool relu : {false, true})
            testing::check_lowp_matches_f32(kCuda, dt, s, channels_last, training, relu,
                                            seed += 10);
}

// |got - want| <= 1 ulp of dt at want + 2e-5 of the tensor's scale, element by element.
::testing::AssertionResult within_ulp_and_f32(const std::string& what, const Tensor& got,
                                              const Tensor& want, DType dt) {
  const auto g = got.to(kCpu).contiguous().to_vector<double>();
  const auto w = want.to(kCpu).contiguous().to_vector<double>();
  if (g.size() != w.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  double scale = 0;
  for (double v : w) scale = std::fmax(scale, std::fabs(v));
  for (size_t i = 0; i < w.size(); ++i)
    if (!(std::fabs(g[i] - w[i]) <= ulp16(w[i], dt) + 2e-5 * scale))
      return ::testing::AssertionFailure()
             << what << ": element " << i << " is " << g[i] << " on cuda, " << w[i] << " on cpu";
  return ::testing::AssertionSuccess();
}

// The 16-bit op on cuda:0 against the CPU's 16-bit op: y and grad_x within 1 ulp of dt plus
// the f32 tolerance, the f32 running statistics and parameter gradients within 2e-5.
TEST(BatchNorm2dCuda, LowPrecisionMatchesTheCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::BF16, DType::F16})
    for (bool channels_last : {false, true})
      for (bool training : {true, false})
        for (auto act : {BatchNormActivation::None, BatchNormActivation::Relu}) {
          SCOPED_TRACE(::testing::Message()
                       << dtype_name(dt) << " channels_last=" << channels_last << " training="
                       << training << " relu=" << (act == BatchNormActivation::Relu));
          const Shape shape{4, 40, 4, 4};
          const auto fmt = channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
          const Tensor x = random_tensor(shape, 130, -2.0, 3.0).to(dt).to(fmt);
          Tensor xc = x.clone().set_requires_grad(true);
          Tensor xg = x.to(kCuda).detach().set_requires_grad(true);
          const Tensor gy = random_tensor(shape, 131).to(dt).to(fmt);
          const Tensor w = random_tensor({40}, 132, 0.5, 1.5, DType::F32);
          const Tensor b = random_tensor({40}, 133, -1, 1, DType::F32);
          const Tensor rm = random_tensor({40}, 134, -0.5, 0.5, DType::F32);
          const Tensor rv = random_tensor({40}, 135, 0.5, 2.0, DType::F32);
          Tensor wc = w.clone().set_requires_grad(true), bc = b.clone().set_requires_grad(true);
          Tensor rm_c = rm.clone(), rv_c = rv.clone();
          const Tensor yc = batch_norm2d(xc, wc, bc, rm_c, rv_c, training, 0.1, 1e-5, act);
          backward(yc, gy);
          Tensor wg = w.to(kCuda).set_requires_grad(true), bg = b.to(kCuda).set_requires_grad(true);
          Tensor rm_g = rm.to(kCuda), rv_g = rv.to(kCuda);
          const Tensor yg = batch_norm2d(xg, wg, bg, rm_g, rv_g, training, 0.1, 1e-5, act);
          backward(yg, gy.to(kCuda));
          const std::vector<Tensor> gc = {xc.grad(), wc.grad(), bc.grad()};
          const std::vector<Tensor> gg = {xg.grad(), wg.grad(), bg.grad()};
          ASSERT_EQ(gg[0].dtype(), dt);
          EXPECT_EQ(yg.dtype(), dt);
          EXPECT_EQ(yg.is_channels_last(), channels_last);
          EXPECT_TRUE(within_ulp_and_f32("y", yg, yc, dt));
          EXPECT_TRUE(within_ulp_and_f32("grad x", gg[0], gc[0], dt));
          EXPECT_TRUE(near("running_mean", rm_g, rm_c, 2e-5));
          EXPECT_TRUE(near("running_var", rv_g, rv_c, 2e-5));
          EXPECT_TRUE(near("grad weight", gg[1], gc[1], 2e-5));
          EXPECT_TRUE(near("grad bias", gg[2], gc[2], 2e-5));
        }
}

// 16-bit views that start 2 bytes into their storage: the element-wise passes cannot use their
// 16-byte accesses (batchnorm2d_cuda.cu) and go one element per thread, with the same
// arithmetic: y and every gradient equal those of aligned copies bit for bit.
TEST(BatchNorm2dCuda, LowPrecisionUnalignedViewsMatchAlignedCopies) {
  KILN_SKIP_WITHOUT_CUDA();
  const Shape shape{2, 3, 5, 3};
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x_store = random_tensor({91}, 140, -2.0, 3.0).to(dt).to(kCuda);
    const Tensor g_store = random_tensor({91}, 141).to(dt).to(kCuda);
    Tensor x_off = Tensor::from_storage(x_store.impl()->storage, shape, dt, 1);
    const Tensor g_off = Tensor::from_storage(g_store.impl()->storage, shape, dt, 1);
    Tensor x_al = x_off.clone();
    const Tensor g_al = g_off.clone();
    x_off.set_requires_grad(true);
    x_al.set_requires_grad(true);
    const Tensor w = random_tensor({3}, 142, 0.5, 1.5, DType::F32).to(kCuda);
    const Tensor b = random_tensor({3}, 143, -1, 1, DType::F32).to(kCuda);
    for (bool training : {true, false}) {
      const Tensor y_off = batch_norm2d(x_off, w, b, Tensor(), Tensor(), training, 0.1, 1e-5,
                                        BatchNormActivation::Relu);
      const Tensor y_al = batch_norm2d(x_al, w, b, Tensor(), Tensor(), training, 0.1, 1e-5,
                                       BatchNormActivation::Relu);
      EXPECT_TRUE(testing::bit_identical("y", y_off, y_al));
      backward(y_off, g_off);
      backward(y_al, g_al);
      EXPECT_TRUE(testing::bit_identical("grad x", x_off.grad(), x_al.grad()));
      x_off.set_grad(Tensor());
      x_al.set_grad(Tensor());
    }
  }
}

}  // namespace
}  // namespace kiln
