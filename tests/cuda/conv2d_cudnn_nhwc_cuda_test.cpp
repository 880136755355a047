// conv2d_cudnn_nhwc_cuda_test.cpp: Conv2d on channels-last activations on cuda:0 with the
// vendor kernels (cuDNN; the simulated one here): x, y and their gradients stay channels-last
// and cuDNN reads and writes them as they are (CUDNN_TENSOR_NHWC), the weight is handed over
// KRSC (layers/conv2d_cudnn.cu says why). Forward and backward against the CPU's NCHW op, f32
// and f64, stride 1 and 2, 3x3, 5x5 and 1x1 filters, and the conversions counted honestly:
// none of activations; a channels-last weight (Module::to(MemoryFormat::ChannelsLast)) is read
// as it lies and its gradient comes back channels-last, no conversion; a KCRS weight (R S > 1)
// is reordered once forward and its gradient once backward; a 1x1 weight's two orders are the
// same bytes. Autocast's bf16/f16 convolutions take the same path. The hand kernels read
// channels-last too (conv2d_nhwc_cuda_test.cpp tests them in depth).
//
// Tolerances as in conv2d_cuda_test: the same products summed in another order; relative to the
// tensor's scale, 5e-5 in float and 1e-11 in double.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/impl.h"
#include "engine/memory_format.h"
#include "layers/conv2d.h"
#include "parity/parity_harness.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::kCpu;
using testing::kCuda;
using testing::near;
using testing::random_tensor;

constexpr MemoryFormat kCl = MemoryFormat::ChannelsLast;

struct Case {
  int64_t n, c, h, w, k, ksize, stride, pad;
  bool bias;
};

const Case kCases[] = {
    {2, 8, 9, 7, 12, 3, 1, 1, true},   // 3x3, same-size output
    {2, 8, 9, 8, 12, 3, 2, 1, true},   // 3x3, stride 2
    {2, 6, 11, 9, 5, 5, 2, 2, false},  // 5x5, stride 2
    {3, 16, 6, 5, 8, 1, 1, 0, true},   // 1x1 (pointwise)
    {2, 16, 8, 8, 24, 1, 2, 0, false}, // 1x1, stride 2: a ResNet downsample
};

std::string describe(const Case& t, DType dtype) {
  return std::string(dtype_name(dtype)) + " x [" + std::to_string(t.n) + ", " +
         std::to_string(t.c) + ", " + std::to_string(t.h) + ", " + std::to_string(t.w) + "] " +
         std::to_string(t.ksize) + "x" + std::to_string(t.ksize) + " stride " +
         std::to_string(t.stride) + (t.bias ? " bias" : "");
}

struct Outcome {
  Tensor x, w, b, y;
  int64_t conversions = 0;  // made by conv2d and its backward
};

// conv2d and its backward on `device`, x (and dy) channels-last when `nhwc`; the weight KCRS,
// or KRSC when `cl_weight`. Gradients for x, b, and for w unless `frozen_weight`.
Outcome run(const Case& t, DType dtype, Device device, bool nhwc, bool frozen_weight, uint32_t seed,
            bool cl_weight = false) {
  Outcome r;
  const MemoryFormat format = nhwc ? kCl : MemoryFormat::Contiguous;
  const MemoryFormat w_format = cl_weight ? kCl : MemoryFormat::Contiguous;
  r.x = random_tensor({t.n, t.c, t.h, t.w}, seed, -1, 1, dtype).to(device).to(format).detach();
  r.w = random_tensor({t.k, t.c, t.ksize, t.ksize}, seed + 1, -0.5, 0.5, dtype)
            .to(device)
            .to(w_format)
            .detach();
  r.x.set_requires_grad(true);
  r.w.set_requires_grad(!frozen_weight);
  if (t.bias) {
    r.b = random_tensor({t.k}, seed + 2, -1, 1, dtype).to(device).detach();
    r.b.set_requires_grad(true);
  }
  const int64_t p = (t.h + 2 * t.pad - t.ksize) / t.stride + 1;
  const int64_t q = (t.w + 2 * t.pad - t.ksize) / t.stride + 1;
  const Tensor dy = random_tensor({t.n, t.k, p, q}, seed + 3, -1, 1, dtype).to(device).to(format);
  const int64_t before = memory_format_conversions();
  r.y = conv2d(r.x, r.w, r.b, t.stride, t.pad);
  backward(r.y, dy);
  r.conversions = memory_format_conversions() - before;
  return r;
}

void check(const Case& t, DType dtype, bool frozen_weight, uint32_t seed) {
  const double tol = dtype == DType::F64 ? 1e-11 : 5e-5;
  const Outcome cpu = run(t, dtype, kCpu, /*nhwc=*/false, frozen_weight, seed);
  KernelsGuard vendor(Impl::Vendor);
  for (bool cl_weight : {false, true}) {
    SCOPED_TRACE(describe(t, dtype) + (frozen_weight ? ", frozen weight" : "") +
                 (cl_weight ? ", channels-last weight" : ", KCRS weight"));
    const Outcome gpu = run(t, dtype, kCuda, /*nhwc=*/true, frozen_weight, seed, cl_weight);
    // A KCRS weight's reorders: to KRSC forward, dw back to KCRS backward; none for a 1x1
    // filter. A channels-last weight is already what cuDNN reads: none.
    const int64_t weight_copies = cl_weight || t.ksize == 1 ? 0 : frozen_weight ? 1 : 2;
    EXPECT_EQ(gpu.conversions, weight_copies);
    ASSERT_TRUE(gpu.y.device() == kCuda);
    EXPECT_TRUE(gpu.y.is_channels_last());
    EXPECT_TRUE(gpu.x.grad().is_channels_last());
    EXPECT_TRUE(near("y", gpu.y.contiguous(), cpu.y, tol));
    EXPECT_TRUE(near("dx", gpu.x.grad().contiguous(), cpu.x.grad(), tol));
    if (!frozen_weight) {
      // In the weight's own format, as the optimizers read it (parameter and gradient alike).
      EXPECT_EQ(gpu.w.grad().is_channels_last(), cl_weight);
      EXPECT_TRUE(near("dw", gpu.w.grad().contiguous(), cpu.w.grad(), tol));
    }
    if (t.bias) {
      EXPECT_TRUE(near("db", gpu.b.grad(), cpu.b.grad(), tol));
    }
  }
}

TEST(Conv2dCudnnNhwc, FloatMatchesCpuWithoutActivationConversions) {
  KILN_SKIP_WITHOUT_CUDA();
  uint32_t seed = 10;
  for (const Case& t : kCases) check(t, DType::F32, /*frozen_weight=*/false, seed += 10);
}

TEST(Conv2dCudnnNhwc, DoubleMatchesCpuWithoutActivationConversions) {
  KILN_SKIP_WITHOUT_CUDA();
  uint32_t seed = 100;
  for (const Case& t : kCases) check(t, DType::F64, /*frozen_weight=*/false, seed += 10);
}

// dx and a lone db: the weight is reordered forward only.
TEST(Conv2dCudnnNhwc, FrozenWeight) {
  KILN_SKIP_WITHOUT_CUDA();
  check(kCases[1], DType::F32, /*frozen_weight=*/true, 200);
  check(kCases[4], DType::F32, /*frozen_weight=*/true, 210);
}

// Under autocast (bf16 and f16 through cuDNN, sums in f32): the channels-last result is the
// NCHW one permuted, bit for bit (the simulated cuDNN computes NHWC in NCHW's order; a GPU's
// NHWC kernels sum in their own), with the same conversions as f32.
TEST(Conv2dCudnnNhwc, AutocastMatchesNchwAutocast) {
  KILN_SKIP_WITHOUT_CUDA();
  KernelsGuard vendor(Impl::Vendor);
  for (DType low : {DType::BF16, DType::F16}) {
    for (const Case& t : {kCases[1], kCases[4]}) {
      SCOPED_TRACE(describe(t, DType::F32) + " autocast " + dtype_name(low));
      AutocastGuard autocast(low);
      const Outcome nchw = run(t, DType::F32, kCuda, /*nhwc=*/false, false, 400);
      const Outcome nhwc = run(t, DType::F32, kCuda, /*nhwc=*/true, false, 400);
      EXPECT_EQ(nhwc.conversions, t.ksize == 1 ? 0 : 2);
      // A channels-last weight: its bf16/f16 cast keeps the format, nothing is reordered.
      const Outcome cl = run(t, DType::F32, kCuda, /*nhwc=*/true, false, 400, /*cl_weight=*/true);
      EXPECT_EQ(cl.conversions, 0);
      EXPECT_TRUE(cl.w.grad().is_channels_last());
      EXPECT_TRUE(near("y (channels-last weight)", cl.y.contiguous(), nchw.y, 0));
      EXPECT_TRUE(near("dw (channels-last weight)", cl.w.grad().contiguous(), nchw.w.grad(), 0));
      EXPECT_TRUE(nhwc.y.is_channels_last());
      EXPECT_TRUE(nhwc.x.grad().is_channels_last());
      EXPECT_TRUE(near("y", nhwc.y.contiguous(), nchw.y, 0));
      EXPECT_TRUE(near("dx", nhwc.x.grad().contiguous(), nchw.x.grad(), 0));
      EXPECT_TRUE(near("dw", nhwc.w.grad(), nchw.w.grad(), 0));
      if (t.bias) {
        EXPECT_TRUE(near("db", nhwc.b.grad(), nchw.b.grad(), 0));
      }
    }
  }
}

// The hand implicit-GEMM kernels read channels-last as well and take the weight in x's order
// as cuDNN does: no conversion of activations; a KCRS weight's two copies, none of a KRSC one.
TEST(Conv2dCudnnNhwc, HandKernelsReadChannelsLastToo) {
  KILN_SKIP_WITHOUT_CUDA();
  const Case& t = kCases[1];
  const Outcome cpu = run(t, DType::F32, kCpu, false, false, 300);
  KernelsGuard hand(Impl::Hand);
  for (bool cl_weight : {false, true}) {
    SCOPED_TRACE(cl_weight ? "channels-last weight" : "KCRS weight");
    const Outcome gpu = run(t, DType::F32, kCuda, true, false, 300, cl_weight);
    EXPECT_EQ(gpu.conversions, cl_weight ? 0 : 2);
    EXPECT_TRUE(gpu.y.is_channels_last());
    EXPECT_TRUE(gpu.x.grad().is_channels_last());
    EXPECT_EQ(gpu.w.grad().is_channels_last(), cl_weight);
    EXPECT_TRUE(near("y", gpu.y.contiguous(), cpu.y, 5e-5));
    EXPECT_TRUE(near("dw", gpu.w.grad().contiguous(), cpu.w.grad(), 5e-5));
  }
}

}  // namespace
}  // namespace kiln
