// pool2d_cuda_test.cpp: the pooling modules on cuda:0 against the CPU, on a (C, H, W) input, and
// the channels-last kernels on cuda:0: a channels-last input gives a channels-last output and
// gradient with no reordering, the same bits as the CUDA NCHW kernels and as the CPU's
// channels-last kernels.
// The functional ops' parity with the CPU (max pooling bit for bit with ties, NaN and -inf;
// average and adaptive pooling within a few ulp), their gradient checks through CUDA and the
// grid-stride case are rows of the parity table (tests/parity).
// 16-bit activations (bf16, f16) on cuda:0, NCHW and channels-last: the f32 CUDA op on the
// widened input rounded once, and the CPU's 16-bit results, bit for bit.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/memory_format.h"
#include "layers/pool2d.h"
#include "parity/parity_harness.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"
#include "support/pool2d_lowp.h"

namespace kiln {
namespace {

using testing::kCpu;
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

// ---- Channels-last ---------------------------------------------------------------------------

constexpr MemoryFormat kCL = MemoryFormat::ChannelsLast;

struct PoolOp {
  std::string name;
  std::function<Tensor(const Tensor&)> fn;
};

// ResNet's stem pool, 2x2/2, overlapping windows, both average divisors, adaptive to 1x1, 2x3.
std::vector<PoolOp> pool_ops() {
  return {
      {"max k3 s2 p1", [](const Tensor& x) { return max_pool2d(x, 3, 2, 1); }},
      {"max k2 s2", [](const Tensor& x) { return max_pool2d(x, 2, 2, 0); }},
      {"max k3 s1 p1", [](const Tensor& x) { return max_pool2d(x, 3, 1, 1); }},
      {"avg k3 s2 p1", [](const Tensor& x) { return avg_pool2d(x, 3, 2, 1); }},
      {"avg k3 s2 p1 exclude pad",
       [](const Tensor& x) { return avg_pool2d(x, 3, 2, 1, AvgPoolDivisor::ExcludePad); }},
      {"avg k2 s2", [](const Tensor& x) { return avg_pool2d(x, 2, 2, 0); }},
      {"adaptive 1x1", [](const Tensor& x) { return adaptive_avg_pool2d(x, 1, 1); }},
      {"adaptive 2x3", [](const Tensor& x) { return adaptive_avg_pool2d(x, 2, 3); }},
  };
}

struct Pass {
  Tensor y, grad;
};

// Forward and backward of `op` on x (any device and format) with the output gradient gy.
Pass run_pass(const PoolOp& op, const Tensor& x_in, const Tensor& gy) {
  Tensor x = x_in.detach().set_requires_grad(true);
  Tensor y = op.fn(x);
  y.backward(gy);
  return {y, x.grad()};
}

// Channels-last on cuda:0: a channels-last output and gradient, no reordering, and the values
// of the CUDA NCHW kernels and of the CPU's channels-last kernels. Both comparisons are
// same_values (bit for bit): every kernel compares or sums the same elements in the same order
// and divides once, with IEEE-rounded adds and divides on both devices.
TEST(Pool2dChannelsLastCuda, MatchesNchwAndTheCpuWithoutConversions) {
  KILN_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::F64}) {
    for (const Shape& s : {Shape{2, 5, 9, 11}, Shape{2, 40, 8, 7}}) {
      const Tensor x = random_tensor(s, 11, -1.0, 1.0, dt);
      for (const PoolOp& op : pool_ops()) {
        SCOPED_TRACE(op.name + " on " + shape_str(s) + " " + dtype_name(dt));
        const Tensor probe = op.fn(x);
        const Tensor gy = random_tensor(probe.shape(), 12, -1.0, 1.0, dt);
        const Pass nchw = run_pass(op, x.to(kCuda), gy.to(kCuda));
        const Pass cpu_cl = run_pass(op, x.to(kCL), gy.to(kCL));
        const Tensor x_cl = x.to(kCL).to(kCuda), gy_cl = gy.to(kCL).to(kCuda);
        const int64_t before = memory_format_conversions();
        const Pass cl = run_pass(op, x_cl, gy_cl);
        EXPECT_EQ(memory_format_conversions(), before) << "a reordering in forward or backward";
        EXPECT_TRUE(cl.y.is_channels_last());
        EXPECT_TRUE(cl.grad.is_channels_last());
        EXPECT_EQ(cl.y.device(), kCuda);
        EXPECT_TRUE(same_values("y vs CUDA NCHW", cl.y, nchw.y));
        EXPECT_TRUE(same_values("grad vs CUDA NCHW", cl.grad, nchw.grad));
        EXPECT_TRUE(same_values("y vs CPU", cl.y.to(kCpu), cpu_cl.y));
        EXPECT_TRUE(same_values("grad vs CPU", cl.grad.to(kCpu), cpu_cl.grad));
      }
    }
  }
}

// A channels-last input on cuda:0 gives a channels-last output, and the module's too.
TEST(Pool2dChannelsLastCuda, ChannelsLastInChannelsLastOut) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor x = random_tensor({2, 4, 8, 8}, 13, -1.0, 1.0, DType::F32).to(kCL).to(kCuda);
  ASSERT_TRUE(x.is_channels_last());
  EXPECT_TRUE(MaxPool2d(3, 2, 1).forward(x).is_channels_last());
  EXPECT_TRUE(AvgPool2d(2).forward(x).is_channels_last());
  EXPECT_TRUE(AdaptiveAvgPool2d(2, 3).forward(x).is_channels_last());
  auto [y, idx] = max_pool2d_with_indices(x, 3, 2, 1);
  EXPECT_TRUE(y.is_channels_last() && idx.is_channels_last());
  EXPECT_EQ(idx.device(), kCuda);
}

// The max-pool indices on cuda:0 equal the CPU's (read in storage order: both channels-last).
TEST(Pool2dChannelsLastCuda, MaxPoolIndicesMatchTheCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor x = random_tensor({2, 6, 9, 10}, 14, -1.0, 1.0, DType::F32).to(kCL);
  auto [y, idx] = max_pool2d_with_indices(x.to(kCuda), 3, 2, 1);
  auto [y_cpu, idx_cpu] = max_pool2d_with_indices(x, 3, 2, 1);
  EXPECT_EQ(idx.to(kCpu).storage_order_view().to_vector<int64_t>(),
            idx_cpu.storage_order_view().to_vector<int64_t>());
}

// Gradient check in f64 through a channels-last input on cuda:0.
TEST(Pool2dChannelsLastCuda, GradientCheckInDouble) {
  KILN_SKIP_WITHOUT_CUDA();
  Tensor x = random_tensor({2, 3, 5, 6}, 15).set_requires_grad(true);
  for (const PoolOp& op : pool_ops()) {
    if (op.name.rfind("avg", 0) != 0 && op.name.rfind("adaptive", 0) != 0) continue;  // smooth
    SCOPED_TRACE(op.name);
    EXPECT_TRUE(testing::gradcheck(
        [&](const std::vector<Tensor>& in) {
          return op.fn(in[0].to(kCL).to(kCuda)).to(kCpu).contiguous();
        },
        {x}));
  }
}

// ---- 16-bit activations ------------------------------------------------------------------------

// bf16 and f16 on cuda:0 in both formats, forward and backward: bit for bit the f32 CUDA op on
// the widened input rounded once (with its indices) and the CPU's 16-bit op. Channel counts: 40
// (a multiple of 8: the channels-last kernels' 16-byte loads), 12 (8 and a tail of 4), 5 (below
// one vector).
TEST(Pool2dLowPrecisionCuda, MatchesTheF32OpAndTheCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::BF16, DType::F16}) {
    for (const Shape& s : {Shape{2, 5, 9, 11}, Shape{2, 40, 8, 7}, Shape{1, 12, 6, 9}}) {
      for (MemoryFormat f : {MemoryFormat::Contiguous, kCL}) {
        const Tensor x = random_tensor(s, 41, -1.0, 1.0, dt).to(f);
        for (const testing::LowpPoolOp& op : testing::lowp_pool_ops()) {
          SCOPED_TRACE(op.name + " on " + shape_str(s) + " " + dtype_name(dt) +
                       (f == kCL ? " channels-last" : " NCHW"));
          const Tensor gy = random_tensor(op.fn(x).shape(), 42, -1.0, 1.0, dt).to(f);
          const testing::LowpPass gpu =
              testing::expect_lowp_matches_f32(op, x.to(kCuda), gy.to(kCuda));
          const testing::LowpPass cpu = testing::lowp_pass(op, x, gy);
          EXPECT_TRUE(testing::same_lowp_bits("y vs CPU", gpu.y, cpu.y));
          EXPECT_TRUE(testing::same_lowp_bits("grad vs CPU", gpu.grad, cpu.grad));
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln
