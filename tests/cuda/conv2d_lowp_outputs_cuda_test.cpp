// conv2d_lowp_outputs_cuda_test.cpp: conv2d's 16-bit outputs on cuda:0 (AutocastOutputs::
// LowPrecision, engine/autocast.h). cuDNN writes the 16-bit y (no bias) and dx in place, where
// the f32-output path writes the same 16-bit values to scratch and widens them; with a bias the
// f32 sum widen(y16) + b is rounded once more. The hand kernels round their f32 results. Either
// way each element is the f32-output path's element rounded to 16 bits, with the same kernels
// (cuDNN's plan, and so its algorithm, is shared by both paths): bit-identical, NCHW and
// channels-last, bf16 and f16. The gradients keep their tensors' dtypes.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

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

using testing::kCuda;
using testing::random_tensor;

struct Case {
  int64_t n, c, h, w, k, ksize, stride, pad;
  bool bias;
};

const Case kCases[] = {
    {2, 8, 9, 7, 12, 3, 1, 1, false},  // 3x3, same-size output
    {2, 8, 9, 8, 12, 3, 2, 1, true},   // 3x3, stride 2, bias
    {2, 16, 8, 8, 24, 1, 2, 0, false}, // 1x1, stride 2: a ResNet downsample
};

struct Outcome {
  Tensor y, dx, dw;
};

Outcome run(const Case& t, DType low, AutocastOutputs outputs, MemoryFormat format, uint32_t seed) {
  Tensor x = random_tensor({t.n, t.c, t.h, t.w}, seed, -1, 1, DType::F32)
                 .to(low).to(kCuda).to(format).detach();
  Tensor w = random_tensor({t.k, t.c, t.ksize, t.ksize}, seed + 1, -0.5, 0.5, DType::F32)
                 .to(kCuda).detach();
  Tensor b = t.bias ? random_tensor({t.k}, seed + 2, -1, 1, DType::F32).to(kCuda).detach()
                    : Tensor();
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  const int64_t p = (t.h + 2 * t.pad - t.ksize) / t.stride + 1;
  const int64_t q = (t.w + 2 * t.pad - t.ksize) / t.stride + 1;
  const Tensor dy = random_tensor({t.n, t.k, p, q}, seed + 3, -1, 1, DType::F32).to(low).to(kCuda);
  Outcome r;
  {
    AutocastGuard autocast(low, true, outputs);
    r.y = conv2d(x, w, b, t.stride, t.pad);
  }
  backward(r.y, dy.to(r.y.dtype()).to(r.y.memory_format()));
  r.dx = x.grad();
  r.dw = w.grad();
  return r;
}

std::vector<uint16_t> bits_of(const Tensor& t) {
  const Tensor host = t.to(Device()).contiguous();
  const auto* p = static_cast<const uint16_t*>(host.raw_data());
  return std::vector<uint16_t>(p, p + host.numel());
}

void check(Impl impl) {
  KernelsGuard kernels(impl);
  uint32_t seed = 10;
  for (DType low : {DType::BF16, DType::F16})
    for (MemoryFormat format : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast})
      for (const Case& t : kCases) {
        SCOPED_TRACE(std::string(dtype_name(low)) + (format == MemoryFormat::ChannelsLast
                                                         ? " channels-last " : " NCHW ") +
                     std::to_string(t.ksize) + "x" + std::to_string(t.ksize) +
                     (t.bias ? " bias" : ""));
        seed += 10;
        const Outcome ref = run(t, low, AutocastOutputs::F32, format, seed);
        const Outcome got = run(t, low, AutocastOutputs::LowPrecision, format, seed);
        ASSERT_EQ(got.y.dtype(), low);
        EXPECT_EQ(got.y.memory_format(), format);
        EXPECT_EQ(bits_of(got.y), bits_of(ref.y.to(low))) << "y";
        ASSERT_EQ(got.dx.dtype(), low);
        EXPECT_EQ(bits_of(got.dx), bits_of(ref.dx)) << "dx";
        ASSERT_EQ(got.dw.dtype(), DType::F32);
        EXPECT_TRUE(testing::near("dw", got.dw, ref.dw, 0.0));
      }
}

TEST(Conv2dLowpOutputsCuda, CudnnRoundsTheSameSumsOnce) {
  KILN_SKIP_WITHOUT_CUDA();
  check(Impl::Vendor);
}

TEST(Conv2dLowpOutputsCuda, HandKernelsRoundTheSameSumsOnce) {
  KILN_SKIP_WITHOUT_CUDA();
  check(Impl::Hand);
}

}  // namespace
}  // namespace kiln
