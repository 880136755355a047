// pool2d_cuda_test.cpp: MaxPool2d, AvgPool2d and AdaptiveAvgPool2d on cuda:0 against the CPU
// kernels (the specification), in float and double, forward and backward.
//
// Max pooling is compared bit for bit: outputs, the int32 argmax indices (returned as int64 by
// max_pool2d_with_indices) and the input gradients, also on inputs full of ties (small
// integers), with NaNs (which win their window) and with -inf (windows whose maximum is -inf
// still point at their first element). The CUDA backward gathers in the CPU's scatter order,
// so even pixels shared by overlapping windows get the same bits.
// Average pooling sums in the CPU's order and divides by the same count; it is compared with
// a tolerance of a few units in the last place (1e-6 float, 1e-14 double, relative to the
// magnitude), though in practice it is exact.
// Shapes: odd sizes, batch 1, 1x1 planes, overlapping windows (stride < kernel), padding,
// strides that skip pixels (stride > kernel), adaptive windows that overlap (sizes that do not
// divide) and that repeat pixels (output larger than the input), (C, H, W) inputs, and one
// tensor large enough for the grid-stride loops to wrap.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "layers/pool2d.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::random_tensor;

const Device kCpu(DeviceType::CPU, 0);
const Device kCuda(DeviceType::CUDA, 0);

// Bit-identical values (NaN equals NaN), as doubles (float -> double is exact).
::testing::AssertionResult identical(const std::string& what, const Tensor& got,
                                     const Tensor& want) {
  if (!got.defined() || !want.defined())
    return ::testing::AssertionFailure() << what << ": undefined tensor";
  if (got.shape() != want.shape() || got.dtype() != want.dtype())
    return ::testing::AssertionFailure() << what << ": got " << got.str() << ", expected "
                                         << want.str();
  if (got.dtype() == DType::I64 || got.dtype() == DType::I32) {
    const auto g = got.to(kCpu).to_vector<int64_t>(), w = want.to(kCpu).to_vector<int64_t>();
    for (size_t i = 0; i < w.size(); ++i)
      if (g[i] != w[i])
        return ::testing::AssertionFailure() << what << ": element " << i << " is " << g[i]
                                             << " on CUDA, " << w[i] << " on the CPU";
    return ::testing::AssertionSuccess();
  }
  const auto g = got.to(kCpu).to_vector<double>(), w = want.to(kCpu).to_vector<double>();
  for (size_t i = 0; i < w.size(); ++i) {
    const bool same = std::isnan(w[i]) ? std::isnan(g[i])
                                       : std::memcmp(&g[i], &w[i], sizeof(double)) == 0;
    if (!same)
      return ::testing::AssertionFailure() << what << ": element " << i << " of "
                                           << shape_str(want.shape()) << " is " << g[i]
                                           << " on CUDA, " << w[i] << " on the CPU";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult close(const std::string& what, const Tensor& got, const Tensor& want,
                                 double rtol) {
  if (got.shape() != want.shape())
    return ::testing::AssertionFailure() << what << ": shape " << shape_str(got.shape())
                                         << ", expected " << shape_str(want.shape());
  const auto g = got.to(kCpu).to_vector<double>(), w = want.to(kCpu).to_vector<double>();
  double scale = 0;
  for (double v : w) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < w.size(); ++i) {
    const double err = std::fabs(g[i] - w[i]);
    if (!(err <= rtol * (std::fabs(w[i]) + scale)))
      return ::testing::AssertionFailure() << what << ": element " << i << " is " << g[i]
                                           << " on CUDA, " << w[i] << " on the CPU";
  }
  return ::testing::AssertionSuccess();
}

double avg_tolerance(DType dtype) { return dtype == DType::F64 ? 1e-14 : 1e-6; }

struct WindowCase {
  int64_t n, c, h, w;
  int64_t kernel, stride, pad;
};

std::string describe(const WindowCase& t, DType dtype) {
  return std::string(dtype_name(dtype)) + " [" + std::to_string(t.n) + ", " +
         std::to_string(t.c) + ", " + std::to_string(t.h) + ", " + std::to_string(t.w) +
         "] kernel " + std::to_string(t.kernel) + " stride " + std::to_string(t.stride) +
         " pad " + std::to_string(t.pad);
}

const std::vector<WindowCase> kWindowCases = {
    {2, 3, 8, 8, 2, 2, 0},     // the MNIST pool (the CPU's 2x2 fast path)
    {2, 3, 9, 7, 2, 2, 0},     // odd sizes: the last row/column is dropped (floor mode)
    {1, 2, 7, 9, 3, 2, 1},     // batch 1, padding, overlapping windows
    {2, 1, 5, 5, 3, 1, 1},     // stride 1: each pixel in up to 9 windows
    {1, 3, 1, 1, 1, 1, 0},     // 1x1 planes
    {2, 2, 6, 5, 2, 1, 0},     // stride 1 without padding
    {1, 1, 11, 13, 4, 3, 2},   // even kernel, padding 2
    {2, 2, 10, 9, 2, 3, 0},    // stride > kernel: pixels in no window
    {3, 33, 4, 4, 2, 2, 0},    // many planes
};

// Input values: continuous (no ties), small integers (ties everywhere), or with NaN and -inf.
enum class Values { Continuous, Ties, Special };

Tensor make_input(const Shape& shape, Values values, uint32_t seed, DType dtype) {
  Tensor x = random_tensor(shape, seed, -3.0, 3.0);  // f64 on the CPU
  std::vector<double> v = x.to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i) {
    if (values == Values::Ties) v[i] = std::floor(v[i]);  // -3 .. 2
    if (values == Values::Special) {
      if (i % 7 == 3) v[i] = std::numeric_limits<double>::quiet_NaN();
      if (i % 5 == 1) v[i] = -std::numeric_limits<double>::infinity();
    }
  }
  return Tensor::from_vector(v, shape).to(dtype);
}

// ---- Max pooling ---------------------------------------------------------------------------

void check_max_pool(const WindowCase& t, DType dtype, Values values, uint32_t seed) {
  SCOPED_TRACE(describe(t, dtype) + (values == Values::Ties      ? " ties"
                                     : values == Values::Special ? " NaN/-inf"
                                                                 : ""));
  const Tensor x = make_input({t.n, t.c, t.h, t.w}, values, seed, dtype);
  Tensor xc = x.detach(), xg = x.to(kCuda).detach();
  xc.set_requires_grad(true);
  xg.set_requires_grad(true);
  auto [yc, ic] = max_pool2d_with_indices(xc, t.kernel, t.stride, t.pad);
  auto [yg, ig] = max_pool2d_with_indices(xg, t.kernel, t.stride, t.pad);
  ASSERT_TRUE(yg.device() == kCuda);
  EXPECT_TRUE(identical("y", yg, yc));
  EXPECT_TRUE(identical("indices", ig, ic));
  const Tensor dy = random_tensor(yc.shape(), seed + 1, -1.0, 1.0, dtype);
  backward(yc, dy);
  backward(yg, dy.to(kCuda));
  EXPECT_TRUE(identical("dx", xg.grad(), xc.grad()));
}

TEST(MaxPool2dCuda, MatchesCpuBitForBit) {
  KILN_SKIP_WITHOUT_CUDA();
  uint32_t seed = 10;
  for (DType dtype : {DType::F32, DType::F64})
    for (const WindowCase& t : kWindowCases)
      for (Values values : {Values::Continuous, Values::Ties, Values::Special})
        check_max_pool(t, dtype, values, seed += 10);
}

// A (C, H, W) input, and the module.
TEST(MaxPool2dCuda, ThreeDimensionalInputAndModule) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor x = random_tensor({3, 7, 6}, 5, -1.0, 1.0, DType::F32);
  MaxPool2d pool(3, 2, 1);
  EXPECT_TRUE(identical("y", pool.forward(x.to(kCuda)), pool.forward(x)));
}

// 4 x 8 x 260 x 260 = 2,163,200 inputs > 8192 blocks x 256 threads: the backward loop wraps.
TEST(MaxPool2dCuda, LargeTensorGridStride) {
  KILN_SKIP_WITHOUT_CUDA();
  check_max_pool({4, 8, 260, 260, 2, 2, 0}, DType::F32, Values::Continuous, 99);
}

TEST(MaxPool2dCuda, GradcheckDouble) {
  KILN_SKIP_WITHOUT_CUDA();
  auto f = [](const std::vector<Tensor>& in) {
    return max_pool2d(in[0].to(kCuda), 3, 2, 1).to(kCpu);
  };
  Tensor x = random_tensor({2, 2, 7, 6}, 31, -1.0, 1.0);  // continuous: no ties
  x.set_requires_grad(true);
  EXPECT_TRUE(testing::gradcheck(f, {x}));
}

// ---- Average pooling -----------------------------------------------------------------------

void check_avg_pool(const WindowCase& t, DType dtype, AvgPoolDivisor divisor, uint32_t seed) {
  SCOPED_TRACE(describe(t, dtype) +
               (divisor == AvgPoolDivisor::IncludePad ? " include-pad" : " exclude-pad"));
  const Tensor x = random_tensor({t.n, t.c, t.h, t.w}, seed, -2.0, 2.0, dtype);
  Tensor xc = x.detach(), xg = x.to(kCuda).detach();
  xc.set_requires_grad(true);
  xg.set_requires_grad(true);
  const Tensor yc = avg_pool2d(xc, t.kernel, t.stride, t.pad, divisor);
  const Tensor yg = avg_pool2d(xg, t.kernel, t.stride, t.pad, divisor);
  ASSERT_TRUE(yg.device() == kCuda);
  EXPECT_TRUE(close("y", yg, yc, avg_tolerance(dtype)));
  const Tensor dy = random_tensor(yc.shape(), seed + 1, -1.0, 1.0, dtype);
  backward(yc, dy);
  backward(yg, dy.to(kCuda));
  EXPECT_TRUE(close("dx", xg.grad(), xc.grad(), avg_tolerance(dtype)));
}

TEST(AvgPool2dCuda, MatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  uint32_t seed = 1000;
  for (DType dtype : {DType::F32, DType::F64})
    for (const WindowCase& t : kWindowCases)
      for (AvgPoolDivisor divisor : {AvgPoolDivisor::IncludePad, AvgPoolDivisor::ExcludePad})
        check_avg_pool(t, dtype, divisor, seed += 10);
}

TEST(AvgPool2dCuda, GradcheckDouble) {
  KILN_SKIP_WITHOUT_CUDA();
  for (AvgPoolDivisor divisor : {AvgPoolDivisor::IncludePad, AvgPoolDivisor::ExcludePad}) {
    auto f = [&](const std::vector<Tensor>& in) {
      return avg_pool2d(in[0].to(kCuda), 3, 2, 1, divisor).to(kCpu);
    };
    Tensor x = random_tensor({1, 2, 6, 7}, 41, -1.0, 1.0);
    x.set_requires_grad(true);
    EXPECT_TRUE(testing::gradcheck(f, {x}));
  }
}

// ---- Adaptive average pooling --------------------------------------------------------------

struct AdaptiveCase {
  int64_t n, c, h, w, out_h, out_w;
};

const std::vector<AdaptiveCase> kAdaptiveCases = {
    {2, 3, 7, 5, 3, 2},    // sizes that do not divide: overlapping windows
    {1, 2, 10, 10, 1, 1},  // global average pooling
    {2, 2, 5, 7, 5, 7},    // identity
    {1, 3, 4, 6, 3, 4},
    {1, 1, 3, 3, 5, 4},    // output larger than the input: pixels repeat
    {2, 4, 1, 1, 1, 1},    // 1x1 planes
    {3, 5, 9, 11, 4, 3},
};

TEST(AdaptiveAvgPool2dCuda, MatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  uint32_t seed = 2000;
  for (DType dtype : {DType::F32, DType::F64})
    for (const AdaptiveCase& t : kAdaptiveCases) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " [" + std::to_string(t.n) + ", " +
                   std::to_string(t.c) + ", " + std::to_string(t.h) + ", " +
                   std::to_string(t.w) + "] -> (" + std::to_string(t.out_h) + ", " +
                   std::to_string(t.out_w) + ")");
      const Tensor x = random_tensor({t.n, t.c, t.h, t.w}, seed += 10, -2.0, 2.0, dtype);
      Tensor xc = x.detach(), xg = x.to(kCuda).detach();
      xc.set_requires_grad(true);
      xg.set_requires_grad(true);
      const Tensor yc = adaptive_avg_pool2d(xc, t.out_h, t.out_w);
      const Tensor yg = adaptive_avg_pool2d(xg, t.out_h, t.out_w);
      ASSERT_TRUE(yg.device() == kCuda);
      EXPECT_TRUE(close("y", yg, yc, avg_tolerance(dtype)));
      const Tensor dy = random_tensor(yc.shape(), seed + 1, -1.0, 1.0, dtype);
      backward(yc, dy);
      backward(yg, dy.to(kCuda));
      EXPECT_TRUE(close("dx", xg.grad(), xc.grad(), avg_tolerance(dtype)));
    }
}

TEST(AdaptiveAvgPool2dCuda, ThreeDimensionalInputAndModule) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor x = random_tensor({3, 7, 6}, 6, -1.0, 1.0, DType::F32);
  AdaptiveAvgPool2d pool(3, 4);
  EXPECT_TRUE(close("y", pool.forward(x.to(kCuda)), pool.forward(x), avg_tolerance(DType::F32)));
}

TEST(AdaptiveAvgPool2dCuda, GradcheckDouble) {
  KILN_SKIP_WITHOUT_CUDA();
  auto f = [](const std::vector<Tensor>& in) {
    return adaptive_avg_pool2d(in[0].to(kCuda), 3, 2).to(kCpu);
  };
  Tensor x = random_tensor({2, 2, 7, 5}, 51, -1.0, 1.0);
  x.set_requires_grad(true);
  EXPECT_TRUE(testing::gradcheck(f, {x}));
}

}  // namespace
}  // namespace kiln
