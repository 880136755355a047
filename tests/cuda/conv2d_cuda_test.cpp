// conv2d_cuda_test.cpp: Conv2d on cuda:0 beyond the parity table (tests/parity, which runs
// the CPU vs CUDA cases for both hand kernels and the default, gradient checks through CUDA and
// hand == cuDNN): every tile shape of the implicit GEMM, the backward-weight split along the
// sum, bit-reproducible backward, an empty batch, the module, and cuDNN's strict FP32.
//
// Tolerances as in the table: the CPU and the GPU sum the same products in different orders;
// relative to the tensor's scale, 5e-5 in float and 1e-11 in double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/cuda/blas.h"
#include "engine/impl.h"
#include "layers/conv2d.h"
#include "layers/conv2d_kernels.h"
#include "parity/parity_harness.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::ImplScope;
using testing::kCpu;
using testing::kCuda;
using testing::near;
using testing::random_tensor;

double tolerance(DType dtype) { return dtype == DType::F64 ? 1e-11 : 5e-5; }

// Sets the hand kernels' options (kernel, tile, splits) for the scope.
class OptionsScope {
 public:
  explicit OptionsScope(const cuda::ConvCudaOptions& options)
      : saved_(cuda::conv2d_cuda_options()) {
    cuda::set_conv2d_cuda_options(options);
  }
  ~OptionsScope() { cuda::set_conv2d_cuda_options(saved_); }

 private:
  cuda::ConvCudaOptions saved_;
};

struct ConvCase {
  int64_t n, c, h, w;       // input
  int64_t k, ksize;         // K filters of ksize x ksize
  int64_t stride, pad;
  bool bias;
};

std::string describe(const ConvCase& t, DType dtype) {
  return std::string(dtype_name(dtype)) + " x [" + std::to_string(t.n) + ", " +
         std::to_string(t.c) + ", " + std::to_string(t.h) + ", " + std::to_string(t.w) +
         "] w [" + std::to_string(t.k) + ", " + std::to_string(t.c) + ", " +
         std::to_string(t.ksize) + ", " + std::to_string(t.ksize) + "] stride " +
         std::to_string(t.stride) + " pad " + std::to_string(t.pad) +
         (t.bias ? " bias" : " no-bias");
}

const std::vector<ConvCase> kCases = {
    {2, 3, 7, 7, 4, 3, 1, 1, true},      // 3x3, pad 1: same-size output
    {1, 2, 9, 8, 5, 3, 2, 0, true},      // batch 1, stride 2, no padding, odd sizes
    {2, 3, 11, 9, 3, 5, 2, 2, true},     // 5x5, stride 2, pad 2
    {3, 5, 6, 5, 7, 1, 1, 0, false},     // 1x1 (pointwise), no bias
    {2, 4, 1, 1, 3, 1, 1, 0, true},      // 1x1 images, 1x1 kernel
    {2, 3, 1, 1, 2, 3, 1, 1, true},      // 1x1 images, 3x3 kernel over the padding
    {1, 1, 5, 5, 1, 5, 1, 0, true},      // kernel as large as the image: 1x1 output
    {2, 3, 8, 8, 4, 3, 2, 1, true},      // stride 2, pad 1
    {1, 2, 6, 7, 3, 2, 3, 1, false},     // 2x2 kernel, stride 3: pixels no window reads
    {2, 9, 13, 12, 70, 3, 1, 1, true},   // tiles: 70 > 64 rows, 312 > 128 columns, CRS = 81
};

// Which inputs require a gradient.
enum class Grads { All, FrozenWeight, NoInputGrad };

const char* grads_name(Grads g) {
  switch (g) {
    case Grads::All: return "grads x, w, b";
    case Grads::FrozenWeight: return "frozen weight (dx, lone db)";
    case Grads::NoInputGrad: return "no input grad (dw, db)";
  }
  return "?";
}

struct Result {
  Tensor x, w, b, y;
};

Result run_conv(const ConvCase& t, DType dtype, Grads grads, Device device, uint32_t seed) {
  Result r;
  const Tensor x = random_tensor({t.n, t.c, t.h, t.w}, seed, -1.0, 1.0, dtype);
  const Tensor w = random_tensor({t.k, t.c, t.ksize, t.ksize}, seed + 1, -1.0, 1.0, dtype);
  const Tensor b = random_tensor({t.k}, seed + 2, -1.0, 1.0, dtype);
  r.x = x.to(device).detach();
  r.w = w.to(device).detach();
  r.x.set_requires_grad(grads != Grads::NoInputGrad);
  r.w.set_requires_grad(grads != Grads::FrozenWeight);
  if (t.bias) {
    r.b = b.to(device).detach();
    r.b.set_requires_grad(true);
  }
  r.y = conv2d(r.x, r.w, r.b, t.stride, t.pad);
  const Tensor dy = random_tensor(r.y.shape(), seed + 3, -1.0, 1.0, dtype).to(device);
  backward(r.y, dy);
  return r;
}

// The case on the CPU and on cuda:0 with the current implementation and options; compares y
// and every gradient that exists.
void check_case(const ConvCase& t, DType dtype, Grads grads, uint32_t seed) {
  SCOPED_TRACE(describe(t, dtype) + ", " + grads_name(grads));
  const double tol = tolerance(dtype);
  const Result cpu = run_conv(t, dtype, grads, kCpu, seed);
  const Result gpu = run_conv(t, dtype, grads, kCuda, seed);
  ASSERT_TRUE(gpu.y.device() == kCuda);
  EXPECT_TRUE(near("y", gpu.y, cpu.y, tol));
  if (grads != Grads::NoInputGrad) {
    EXPECT_TRUE(near("dx", gpu.x.grad(), cpu.x.grad(), tol));
  } else {
    EXPECT_FALSE(gpu.x.grad().defined());
  }
  if (grads != Grads::FrozenWeight) {
    EXPECT_TRUE(near("dw", gpu.w.grad(), cpu.w.grad(), tol));
  } else {
    EXPECT_FALSE(gpu.w.grad().defined());
  }
  if (t.bias) {
    EXPECT_TRUE(near("db", gpu.b.grad(), cpu.b.grad(), tol));
  }
}


// Every float tile shape of the implicit GEMM (double always runs 64x64), on the case that
// spans several tiles in every GEMM dimension and on one smaller than any tile.
TEST(Conv2dCuda, EveryTileShapeMatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  ImplScope impl(Impl::Hand);
  for (cuda::ConvTile tile : {cuda::ConvTile::T64x64, cuda::ConvTile::T64x128,
                              cuda::ConvTile::T128x128}) {
    SCOPED_TRACE("tile " + std::to_string(static_cast<int>(tile)));
    OptionsScope options({cuda::ConvKernel::ImplicitGemm, tile, 0});
    check_case(kCases[9], DType::F32, Grads::All, 3000);
    check_case(kCases[4], DType::F32, Grads::All, 3100);
    check_case(kCases[1], DType::F64, Grads::All, 3200);
  }
}

// Backward-weight split along the N*P*Q sum: forced split counts (including more splits than
// slices, which the launcher trims, and splits of unequal length), and the automatic choice
// on a shape long enough to split by itself (N*P*Q = 1600 >= 3 * 512).
TEST(Conv2dCuda, WeightGradientSplitAlongTheSum) {
  KILN_SKIP_WITHOUT_CUDA();
  ImplScope impl(Impl::Hand);
  for (int splits : {1, 2, 3, 7, 100}) {
    SCOPED_TRACE("splits " + std::to_string(splits));
    OptionsScope options({cuda::ConvKernel::ImplicitGemm, cuda::ConvTile::Auto, splits});
    check_case(kCases[9], DType::F32, Grads::NoInputGrad, 4000);
    check_case(kCases[2], DType::F64, Grads::NoInputGrad, 4100);
  }
  OptionsScope options({cuda::ConvKernel::ImplicitGemm, cuda::ConvTile::Auto, 0});
  const ConvCase long_sum{4, 2, 20, 20, 3, 3, 1, 1, true};
  for (DType dtype : {DType::F32, DType::F64}) check_case(long_sum, dtype, Grads::All, 4200);
}

// The same inputs give the same bits, run after run (no atomics anywhere).
TEST(Conv2dCuda, BackwardIsDeterministic) {
  KILN_SKIP_WITHOUT_CUDA();
  ImplScope impl(Impl::Hand);
  OptionsScope options({cuda::ConvKernel::ImplicitGemm, cuda::ConvTile::Auto, 3});
  const ConvCase t = kCases[9];
  const Result a = run_conv(t, DType::F32, Grads::All, kCuda, 77);
  const Result b = run_conv(t, DType::F32, Grads::All, kCuda, 77);
  EXPECT_EQ(a.y.to(kCpu).to_vector<float>(), b.y.to(kCpu).to_vector<float>());
  EXPECT_EQ(a.x.grad().to(kCpu).to_vector<float>(), b.x.grad().to(kCpu).to_vector<float>());
  EXPECT_EQ(a.w.grad().to(kCpu).to_vector<float>(), b.w.grad().to(kCpu).to_vector<float>());
  EXPECT_EQ(a.b.grad().to(kCpu).to_vector<float>(), b.b.grad().to(kCpu).to_vector<float>());
}

// An empty batch: an empty output, and zero weight and bias gradients.
TEST(Conv2dCuda, EmptyBatch) {
  KILN_SKIP_WITHOUT_CUDA();
  ImplScope impl(Impl::Hand);
  Tensor x = Tensor::zeros({0, 2, 5, 5}, DType::F32, kCuda);
  Tensor w = random_tensor({3, 2, 3, 3}, 5, -1.0, 1.0, DType::F32).to(kCuda).detach();
  Tensor b = Tensor::ones({3}, DType::F32, kCuda);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor y = conv2d(x, w, b, 1, 1);
  EXPECT_EQ(y.shape(), Shape({0, 3, 5, 5}));
  backward(y, Tensor::zeros(y.shape(), DType::F32, kCuda));
  for (double v : w.grad().to(kCpu).to_vector<double>()) EXPECT_EQ(v, 0.0);
  for (double v : b.grad().to(kCpu).to_vector<double>()) EXPECT_EQ(v, 0.0);
}

// The Conv2d module moved to the GPU gives the CPU module's output.
TEST(Conv2dCuda, ModuleMatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  ImplScope impl(Impl::Hand);
  Generator gen(3);
  Conv2d conv(3, 6, 3, 2, 1, true, gen);
  const Tensor x = random_tensor({2, 3, 9, 10}, 11, -1.0, 1.0, DType::F32);
  const Tensor want = conv.forward(x);
  const Tensor got = conv2d(x.to(kCuda), conv.weight.to(kCuda), conv.bias.to(kCuda), 2, 1);
  EXPECT_TRUE(near("y", got, want, tolerance(DType::F32)));
}


// cuDNN's FP32 convolutions stay FP32 unless TF32 is switched on: the plan keeps only
// CUDNN_FMA_MATH algorithms (conv2d_cudnn.cu), though the fastest ones listed are tensor-op
// kernels. Inputs of 1 + 2^-12 tell the two apart: TF32 reads them as 1.
TEST(Conv2dCuda, CudnnFp32IsStrictUnlessTf32) {
  KILN_SKIP_WITHOUT_CUDA();
  ImplScope impl(Impl::Vendor);
  const float v = 1.0f + std::ldexp(1.0f, -12);
  // Centre outputs of a 3x3, pad-1 convolution over 5x5: all taps inside. With dy = 1:
  // y = 18 x w (2 channels x 9 taps), dx = 27 w (3 filters x 9 taps), dw = 25 x (all pixels).
  auto run = [&](double* y, double* dx, double* dw) {
    Tensor x = Tensor::full({1, 2, 5, 5}, v, DType::F32, kCuda).detach();
    Tensor w = Tensor::full({3, 2, 3, 3}, v, DType::F32, kCuda).detach();
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    const Tensor out = conv2d(x, w, Tensor(), 1, 1);
    backward(out, Tensor::ones(out.shape(), DType::F32, kCuda));
    *y = out.to(kCpu).to_vector<double>()[2 * 5 + 2];
    *dx = x.grad().to(kCpu).to_vector<double>()[2 * 5 + 2];
    *dw = w.grad().to(kCpu).to_vector<double>()[4];  // tap (1, 1) of filter 0, channel 0
  };
  if (std::getenv("KILN_TF32") == nullptr) {
    double y, dx, dw;
    run(&y, &dx, &dw);
    EXPECT_NEAR(y, 18.0 * v * v, 1e-4);
    EXPECT_NEAR(dx, 27.0 * v, 1e-4);
    EXPECT_NEAR(dw, 25.0 * v, 1e-4);
    EXPECT_GT(y, 18.003);  // TF32 would give 18
  }
#if KILN_CUDA_SIM
  // The simulated cuDNN ranks a tensor-op algorithm first for each pass: with TF32 allowed the
  // plan takes it, and it reads its inputs as TF32 (on a GPU the fastest may be either).
  cuda::set_allow_tf32(true);
  double y, dx, dw;
  run(&y, &dx, &dw);
  cuda::set_allow_tf32(false);
  EXPECT_EQ(y, 18.0);
  EXPECT_EQ(dx, 27.0);
  EXPECT_EQ(dw, 25.0);
#endif
}

}  // namespace
}  // namespace kiln
