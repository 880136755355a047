// conv2d_nhwc_cuda_test.cpp: the hand CUDA convolution (layers/conv2d_cuda.cu, the direct
// kernels and the implicit GEMM of layers/conv2d_implicit_gemm.cuh) on channels-last x, y, dx
// and dy, with the weight and dw in either order (KCRS or KRSC, g.w_nhwc).
//
// The kernels are called directly (every format combination, every tile shape, every split of
// backward-weight's sum) and compared with the CPU's NCHW kernels in double. The bound is the
// problem's own: a sum of L products computed in floating point with unit roundoff u is within
// about L*u*sum|terms| of the exact sum, whatever the order (Higham, "Accuracy and Stability of
// Numerical Algorithms", 2nd ed., section 3.1); sum|terms| is the same convolution run on |x|,
// |w| and |dy|. Double on the GPU is held to that bound with u = 2^-53 (tight), float with
// u = 2^-24 against the double of the same inputs (the inputs are float values, exact in
// double). Then the orders the code fixes, bit for bit: the weight's order changes addresses
// only; the direct kernels sum in the same order in both formats; backward-weight sums over
// (n, p, q) in both. Last, conv2d() itself with the hand kernels: channels-last in and out, and
// no conversion of activations (only the weight's KRSC copies that conv2d.cpp makes on CUDA).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/impl.h"
#include "engine/memory_format.h"
#include "layers/conv2d.h"
#include "layers/conv2d_kernels.h"
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

struct Case {
  int64_t n, c, h, w, k, ksize, stride, pad;
  const char* what;
};

const Case kCases[] = {
    {2, 9, 13, 12, 70, 3, 1, 1, "3x3: C = 9 and K = 70 not multiples of any tile, several tiles"},
    {2, 16, 8, 8, 24, 1, 2, 0, "1x1 stride 2 (a ResNet downsample)"},
    {1, 3, 15, 13, 8, 7, 2, 3, "7x7 stride 2 pad 3 (a ResNet stem)"},
    {3, 5, 7, 6, 7, 2, 3, 1, "2x2 stride 3: pixels no window reads, edge tiles everywhere"},
};

ConvGeometry geometry(const Case& t) {
  ConvGeometry g{};
  g.n = t.n, g.c = t.c, g.h = t.h, g.w = t.w, g.k = t.k, g.r = t.ksize, g.s = t.ksize;
  g.stride = t.stride, g.pad = t.pad;
  g.p = (t.h + 2 * t.pad - t.ksize) / t.stride + 1;
  g.q = (t.w + 2 * t.pad - t.ksize) / t.stride + 1;
  return g;
}

// The operands, float values held in double (NCHW, KCRS).
struct Operands {
  Tensor x, w, b, dy;
};

Operands operands(const Case& t, uint32_t seed) {
  const ConvGeometry g = geometry(t);
  auto make = [&](const Shape& s, uint32_t k) {
    return random_tensor(s, seed + k, -1, 1, DType::F32).to(DType::F64);
  };
  return {make({t.n, t.c, t.h, t.w}, 0), make({t.k, t.c, t.ksize, t.ksize}, 1), make({t.k}, 2),
          make({t.n, t.k, g.p, g.q}, 3)};
}

// y, dx, dw, db as NCHW / KCRS doubles on the CPU.
struct Results {
  std::vector<double> y, dx, dw, db;
};

// The CPU's hand kernels in double on NCHW (abs: on |x|, |w|, |b|, |dy|: the sums of |terms|).
Results cpu_reference(const Case& t, const Operands& o, bool abs) {
  const ConvGeometry g = geometry(t);
  auto in = [&](const Tensor& v) {
    std::vector<double> e = v.contiguous().to_vector<double>();
    if (abs)
      for (double& a : e) a = std::fabs(a);
    return Tensor::from_vector(e, v.shape());
  };
  const Tensor x = in(o.x), w = in(o.w), b = in(o.b), dy = in(o.dy);
  Tensor y = Tensor::empty({g.n, g.k, g.p, g.q}, DType::F64);
  Tensor dx = Tensor::empty(x.shape(), DType::F64), dw = Tensor::empty(w.shape(), DType::F64);
  Tensor db = Tensor::empty({g.k}, DType::F64);
  const cpu::Backend be;
  cpu::conv2d_forward(be, x.data<double>(), w.data<double>(), b.data<double>(), y.data<double>(),
                      g);
  cpu::conv2d_backward_data(be, dy.data<double>(), w.data<double>(), dx.data<double>(), g);
  cpu::conv2d_backward_weight(be, x.data<double>(), dy.data<double>(), dw.data<double>(),
                              db.data<double>(), g);
  return {y.to_vector<double>(), dx.to_vector<double>(), dw.to_vector<double>(),
          db.to_vector<double>()};
}

// The CUDA hand kernels in T, x/y/dx/dy channels-last when `nhwc`, w/dw KRSC when `krsc`, with
// the current options; the results brought back as NCHW / KCRS doubles.
template <typename T>
Results gpu_run(const Case& t, const Operands& o, bool nhwc, bool krsc) {
  ConvGeometry g = geometry(t);
  g.x_nhwc = g.y_nhwc = nhwc;
  g.w_nhwc = krsc;
  const DType dt = dtype_of<T>::value;
  const MemoryFormat act = nhwc ? kCl : MemoryFormat::Contiguous;
  const MemoryFormat wf = krsc ? kCl : MemoryFormat::Contiguous;
  const Tensor x = o.x.to(dt).to(kCuda).to(act), w = o.w.to(dt).to(kCuda).to(wf);
  const Tensor b = o.b.to(dt).to(kCuda), dy = o.dy.to(dt).to(kCuda).to(act);
  Tensor y = Tensor::empty({g.n, g.k, g.p, g.q}, dt, kCuda, act);
  Tensor dx = Tensor::empty(x.shape(), dt, kCuda, act);
  Tensor dw = Tensor::empty(w.shape(), dt, kCuda, wf);
  Tensor db = Tensor::empty({g.k}, dt, kCuda);
  const cuda::Backend be;
  cuda::conv2d_forward(be, x.data_any_format<T>(), w.data_any_format<T>(), b.data<T>(),
                       y.data_any_format<T>(), g);
  cuda::conv2d_backward_data(be, dy.data_any_format<T>(), w.data_any_format<T>(),
                             dx.data_any_format<T>(), g);
  cuda::conv2d_backward_weight(be, x.data_any_format<T>(), dy.data_any_format<T>(),
                               dw.data_any_format<T>(), db.data<T>(), g);
  EXPECT_EQ(y.is_channels_last(), nhwc);
  auto back = [](const Tensor& v) {
    return v.to(kCpu).contiguous().to(DType::F64).to_vector<double>();
  };
  return {back(y), back(dx), back(dw), back(db)};
}

// |got - want| <= (L + 2) * u * sum|terms| element by element (L + 2: the products' roundings,
// and the bias add; u the sum of both sides' unit roundoffs).
::testing::AssertionResult within_bound(const char* what, const std::vector<double>& got,
                                        const std::vector<double>& want,
                                        const std::vector<double>& abs_sum, int64_t terms,
                                        double u) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = static_cast<double>(terms + 2) * u * abs_sum[i];
    if (!(std::fabs(got[i] - want[i]) <= bound))
      return ::testing::AssertionFailure() << what << "[" << i << "] = " << got[i] << ", want "
                                           << want[i] << " (bound " << bound << ")";
  }
  return ::testing::AssertionSuccess();
}

// Checks all four results of a GPU run in T against the CPU's double.
template <typename T>
void check_against_cpu(const Case& t, const Results& got, const Results& want,
                       const Results& abs) {
  const ConvGeometry g = geometry(t);
  const double u = (sizeof(T) == 4 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -53)) +
                   std::ldexp(1.0, -53);
  EXPECT_TRUE(within_bound("y", got.y, want.y, abs.y, g.c * g.r * g.s, u));
  EXPECT_TRUE(within_bound("dx", got.dx, want.dx, abs.dx, g.k * g.r * g.s, u));
  EXPECT_TRUE(within_bound("dw", got.dw, want.dw, abs.dw, g.n * g.p * g.q, u));
  EXPECT_TRUE(within_bound("db", got.db, want.db, abs.db, g.n * g.p * g.q, u));
}

const char* kernel_name(cuda::ConvKernel k) { return cuda::conv_kernel_name(k); }

// Both steps, both weight orders, double and float, every case.
TEST(Conv2dCudaNhwc, HandKernelsMatchTheCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  uint32_t seed = 10;
  for (const Case& t : kCases) {
    const Operands o = operands(t, seed += 10);
    const Results want = cpu_reference(t, o, false), abs = cpu_reference(t, o, true);
    for (cuda::ConvKernel kernel : {cuda::ConvKernel::Direct, cuda::ConvKernel::ImplicitGemm}) {
      OptionsScope options({kernel, cuda::ConvTile::Auto, 0});
      for (bool krsc : {false, true}) {
        SCOPED_TRACE(std::string(t.what) + ", " + kernel_name(kernel) +
                     (krsc ? ", w KRSC" : ", w KCRS"));
        check_against_cpu<double>(t, gpu_run<double>(t, o, true, krsc), want, abs);
        check_against_cpu<float>(t, gpu_run<float>(t, o, true, krsc), want, abs);
      }
    }
  }
}

// Every float tile of the implicit GEMM (double runs 64x64 only), and backward-weight's sum
// split in 1, 2, 3, 7 and 100 pieces (more than the slices: the launcher trims them), and the
// automatic split on a long sum (N*P*Q = 1600).
TEST(Conv2dCudaNhwc, EveryTileAndWeightSplit) {
  KILN_SKIP_WITHOUT_CUDA();
  const Case& t = kCases[0];
  const Operands o = operands(t, 300);
  const Results want = cpu_reference(t, o, false), abs = cpu_reference(t, o, true);
  for (cuda::ConvTile tile : {cuda::ConvTile::T64x64, cuda::ConvTile::T64x128,
                              cuda::ConvTile::T128x128}) {
    SCOPED_TRACE("tile " + std::to_string(static_cast<int>(tile)));
    OptionsScope options({cuda::ConvKernel::ImplicitGemm, tile, 0});
    for (bool krsc : {false, true})
      check_against_cpu<float>(t, gpu_run<float>(t, o, true, krsc), want, abs);
  }
  for (int splits : {1, 2, 3, 7, 100}) {
    SCOPED_TRACE("splits " + std::to_string(splits));
    OptionsScope options({cuda::ConvKernel::ImplicitGemm, cuda::ConvTile::Auto, splits});
    check_against_cpu<float>(t, gpu_run<float>(t, o, true, true), want, abs);
    check_against_cpu<double>(t, gpu_run<double>(t, o, true, false), want, abs);
  }
  const Case long_sum{4, 8, 20, 20, 6, 3, 1, 1, "long sum"};
  const Operands lo = operands(long_sum, 400);
  const Results lwant = cpu_reference(long_sum, lo, false);
  const Results labs = cpu_reference(long_sum, lo, true);
  check_against_cpu<float>(long_sum, gpu_run<float>(long_sum, lo, true, true), lwant, labs);
  check_against_cpu<double>(long_sum, gpu_run<double>(long_sum, lo, true, true), lwant, labs);
}

void expect_same_bits(const char* what, const std::vector<double>& a,
                      const std::vector<double>& b) {
  EXPECT_EQ(a, b) << what;
}

// The orders the code fixes. The weight's order is addresses only: KCRS and KRSC give the same
// bits. The direct kernels sum over (c, r, s), (k, r, s) and (n, p, q) in both formats: NHWC and
// NCHW give the same bits. Backward-weight's implicit GEMM sums over (n, p, q) in both formats
// (only its columns are reordered): the same dw.
TEST(Conv2dCudaNhwc, OrdersFixedByTheCodeGiveTheSameBits) {
  KILN_SKIP_WITHOUT_CUDA();
  uint32_t seed = 500;
  for (const Case& t : kCases) {
    SCOPED_TRACE(t.what);
    const Operands o = operands(t, seed += 10);
    {
      OptionsScope options({cuda::ConvKernel::ImplicitGemm, cuda::ConvTile::Auto, 0});
      const Results kcrs = gpu_run<float>(t, o, true, false);
      const Results krsc = gpu_run<float>(t, o, true, true);
      expect_same_bits("implicit GEMM y, KCRS vs KRSC", kcrs.y, krsc.y);
      expect_same_bits("implicit GEMM dx, KCRS vs KRSC", kcrs.dx, krsc.dx);
      expect_same_bits("implicit GEMM dw, KCRS vs KRSC", kcrs.dw, krsc.dw);
      const Results nchw = gpu_run<float>(t, o, false, false);
      expect_same_bits("implicit GEMM dw, NHWC vs NCHW", kcrs.dw, nchw.dw);
    }
    OptionsScope options({cuda::ConvKernel::Direct, cuda::ConvTile::Auto, 0});
    const Results nhwc = gpu_run<float>(t, o, true, true);
    const Results nchw = gpu_run<float>(t, o, false, false);
    expect_same_bits("direct y, NHWC vs NCHW", nhwc.y, nchw.y);
    expect_same_bits("direct dx, NHWC vs NCHW", nhwc.dx, nchw.dx);
    expect_same_bits("direct dw, NHWC vs NCHW", nhwc.dw, nchw.dw);
  }
}

// conv2d() with the hand kernels on a channels-last x: y and dx channels-last, and the only
// conversions are the weight's KRSC copy forward and its gradient back (none for 1x1).
struct Outcome {
  Tensor x, w, b, y;
  int64_t conversions = 0;
};

Outcome run_op(const Case& t, DType dtype, Device device, bool nhwc, uint32_t seed) {
  const Operands o = operands(t, seed);
  const MemoryFormat act = nhwc ? kCl : MemoryFormat::Contiguous;
  Outcome r;
  r.x = o.x.to(dtype).to(device).to(act).detach().set_requires_grad(true);
  r.w = o.w.to(dtype).to(device).detach().set_requires_grad(true);
  r.b = o.b.to(dtype).to(device).detach().set_requires_grad(true);
  const Tensor dy = o.dy.to(dtype).to(device).to(act);
  const int64_t before = memory_format_conversions();
  r.y = conv2d(r.x, r.w, r.b, t.stride, t.pad);
  backward(r.y, dy);
  r.conversions = memory_format_conversions() - before;
  return r;
}

TEST(Conv2dCudaNhwc, ConvReadsChannelsLastWithoutActivationConversions) {
  KILN_SKIP_WITHOUT_CUDA();
  KernelsGuard hand(Impl::Hand);
  for (DType dtype : {DType::F32, DType::F64}) {
    for (const Case& t : kCases) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + ", " + t.what);
      const double tol = dtype == DType::F64 ? 1e-11 : 5e-5;  // as conv2d_cuda_test
      const Outcome cpu = run_op(t, dtype, kCpu, false, 700);
      const Outcome gpu = run_op(t, dtype, kCuda, true, 700);
      EXPECT_EQ(gpu.conversions, t.ksize == 1 ? 0 : 2);
      EXPECT_TRUE(gpu.y.is_channels_last());
      EXPECT_TRUE(gpu.x.grad().is_channels_last());
      EXPECT_FALSE(gpu.w.grad().is_channels_last());
      EXPECT_TRUE(near("y", gpu.y.contiguous(), cpu.y, tol));
      EXPECT_TRUE(near("dx", gpu.x.grad().contiguous(), cpu.x.grad(), tol));
      EXPECT_TRUE(near("dw", gpu.w.grad(), cpu.w.grad(), tol));
      EXPECT_TRUE(near("db", gpu.b.grad(), cpu.b.grad(), tol));
    }
  }
}

// Autocast's hand path widens the bf16/f16 operands to f32 in their format and runs the f32
// kernels: channels-last throughout, the same conversions, the NCHW autocast result up to the
// order of the f32 sums.
TEST(Conv2dCudaNhwc, AutocastHandPathReadsChannelsLast) {
  KILN_SKIP_WITHOUT_CUDA();
  KernelsGuard hand(Impl::Hand);
  for (DType low : {DType::BF16, DType::F16}) {
    for (const Case& t : {kCases[0], kCases[1]}) {
      SCOPED_TRACE(std::string(t.what) + ", autocast " + dtype_name(low));
      AutocastGuard autocast(low);
      const Outcome nchw = run_op(t, DType::F32, kCuda, false, 800);
      const Outcome nhwc = run_op(t, DType::F32, kCuda, true, 800);
      EXPECT_EQ(nhwc.conversions, t.ksize == 1 ? 0 : 2);
      EXPECT_TRUE(nhwc.y.is_channels_last());
      EXPECT_TRUE(nhwc.x.grad().is_channels_last());
      EXPECT_TRUE(near("y", nhwc.y.contiguous(), nchw.y, 5e-5));
      EXPECT_TRUE(near("dx", nhwc.x.grad().contiguous(), nchw.x.grad(), 5e-5));
      EXPECT_TRUE(near("dw", nhwc.w.grad(), nchw.w.grad(), 5e-5));
      EXPECT_TRUE(near("db", nhwc.b.grad(), nchw.b.grad(), 5e-5));
    }
  }
}

}  // namespace
}  // namespace kiln
