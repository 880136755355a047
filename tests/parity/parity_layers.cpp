// parity_layers.cpp: the parity table's rows of layers/ (Conv2d, pooling, BatchNorm2d, losses,
// Dropout, Linear, activations, layout conversions). Tolerances: see parity_cases.cpp.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/impl.h"
#include "engine/ops.h"
#include "engine/philox.h"
#include "layers/activation.h"
#include "layers/batchnorm2d.h"
#include "layers/conv2d.h"
#include "layers/dropout.h"
#include "layers/layout.h"
#include "layers/leaky_relu.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/pool2d.h"
#include "parity/parity_cases.h"
#include "support/gradcheck.h"
#if KILN_WITH_CUDA
#include "layers/conv2d_kernels.h"
#endif

namespace kiln::parity {
namespace {

using testing::random_tensor;

std::string dims(const Shape& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "x" : "") + std::to_string(s[i]);
  return out;
}
std::string n(int64_t v) { return std::to_string(v); }
Outputs one(const Tensor& t) { return {t}; }

// ---- Conv2d ---------------------------------------------------------------------------------

struct Conv {
  int64_t n, c, h, w, k, r, s, stride, pad;
  bool bias;
  std::string name() const {
    return "x" + dims({n, c, h, w}) + "_w" + dims({k, c, r, s}) + "_s" + std::to_string(stride) +
           "_p" + std::to_string(pad) + (bias ? "" : "_nobias");
  }
};

enum class Grads { All, FrozenWeight, NoInputGrad };

Case conv_case(const std::string& name, const Conv& t, Grads g) {
  Case c(name);
  c.in(uniform({t.n, t.c, t.h, t.w}, -1.0, 1.0, g != Grads::NoInputGrad))
      .in(uniform({t.k, t.c, t.r, t.s}, -1.0, 1.0, g != Grads::FrozenWeight))
      .in(t.bias ? uniform({t.k}) : absent());
  const int64_t stride = t.stride, pad = t.pad;
  c.fn([=](const Inputs& v) { return one(conv2d(v[0], v[1], v[2], stride, pad)); });
  return c;
}

std::vector<Variant> conv_cuda_variants(bool with_default) {
  std::vector<Variant> out;
  if (with_default) out.push_back({"default", nullptr, nullptr});
#if KILN_WITH_CUDA
  for (cuda::ConvKernel kernel : {cuda::ConvKernel::ImplicitGemm, cuda::ConvKernel::Direct})
    out.push_back({std::string("hand ") + cuda::conv_kernel_name(kernel),
                   [kernel] {
                     testing::enter_kernels(Impl::Hand);
                     cuda::set_conv2d_cuda_options({kernel, cuda::ConvTile::Auto, 0});
                   },
                   [] {
                     cuda::set_conv2d_cuda_options({});
                     testing::leave_kernels();
                   }});
#endif
  return out;
}

void conv2d_channels_last_rows(std::vector<Case>& rows);

void conv2d_rows(std::vector<Case>& rows) {
  // CPU vs CUDA and hand vs cuDNN: stride 1, 2 and 3; padding 0, 1, 2; 1x1, 2x2, 3x3 and 5x5
  // kernels; batch 1; 1x1 images; a kernel as large as the padded image (1x1 output); channel
  // and pixel counts just above the GEMM tiles (70 > 64 rows, 312 > 128 columns, C*R*S = 81
  // not a multiple of the slice of 8). Each with three sets of gradients: all (x, w, b), a
  // frozen weight (dx and a lone db), an input that needs none (dw and db, a first layer).
  const Conv device[] = {
      {2, 3, 7, 7, 4, 3, 3, 1, 1, true},    {1, 2, 9, 8, 5, 3, 3, 2, 0, true},
      {2, 3, 11, 9, 3, 5, 5, 2, 2, true},   {3, 5, 6, 5, 7, 1, 1, 1, 0, false},
      {2, 4, 1, 1, 3, 1, 1, 1, 0, true},    {2, 3, 1, 1, 2, 3, 3, 1, 1, true},
      {1, 1, 5, 5, 1, 5, 5, 1, 0, true},    {2, 3, 8, 8, 4, 3, 3, 2, 1, true},
      {1, 2, 6, 7, 3, 2, 2, 3, 1, false},   {2, 9, 13, 12, 70, 3, 3, 1, 1, true},
  };
  uint32_t seed = 100;
  for (const Conv& t : device) {
    const std::pair<Grads, const char*> gs[] = {
        {Grads::All, ""}, {Grads::FrozenWeight, "_frozen_weight"}, {Grads::NoInputGrad, "_no_input_grad"}};
    for (const auto& [g, suffix] : gs) {
      Case c = conv_case("conv2d_" + t.name() + suffix, t, g);
      c.tol(DTol::rel(5e-5, 1e-11)).vendor(DTol::rel(5e-5, 1e-11)).with_seed(seed += 10);
      c.variants(conv_cuda_variants(true));
      // Hand == cuDNN on the whole table (all gradients).
      c.suites(g == Grads::All ? kDevice | kVendorCuda | kAutocastCuda : unsigned{kDevice});
      rows.push_back(c);
    }
  }
  // Finite differences in double on the CPU: odd shapes, every branch of im2col/col2im.
  const Conv gradcheck[] = {
      {2, 3, 7, 5, 4, 3, 3, 1, 0, true},  {1, 2, 6, 7, 3, 3, 3, 2, 1, true},
      {3, 4, 5, 5, 2, 1, 1, 1, 0, true},  {2, 3, 5, 4, 2, 1, 1, 2, 1, false},
      {2, 1, 8, 8, 3, 3, 3, 1, 1, false}, {1, 3, 9, 7, 5, 3, 2, 3, 2, true},
      {2, 2, 5, 6, 3, 5, 5, 1, 0, true},  {5, 2, 3, 3, 1, 3, 3, 1, 2, true},
  };
  for (const Conv& t : gradcheck) {
    Case c = conv_case("gradcheck_conv2d_" + t.name(), t, Grads::All);
    // Hand vs oneDNN (float) on the same shapes.
    rows.push_back(c.vendor(DTol::abs(1e-3, 1e-3)).suites(kGradcheck | kVendorCpu));
  }
  // The MNIST CNN's convolutions, hand vs oneDNN.
  for (const Conv& t : {Conv{3, 1, 28, 28, 32, 3, 3, 1, 0, true},
                        Conv{3, 32, 26, 26, 64, 3, 3, 1, 0, true}})
    rows.push_back(conv_case("conv2d_mnist_" + t.name(), t, Grads::All)
                       .vendor(DTol::abs(1e-3, 1e-3)).suites(kVendorCpu));
  // x needs no gradient (the first layer sees images): only w and b; a frozen weight: only x.
  rows.push_back(conv_case("gradcheck_conv2d_no_input_grad",
                           {2, 1, 6, 5, 3, 3, 3, 1, 1, true}, Grads::NoInputGrad)
                     .suites(kGradcheck));
  Conv frozen{2, 2, 5, 5, 3, 3, 3, 2, 1, false};
  rows.push_back(conv_case("gradcheck_conv2d_frozen_weight", frozen, Grads::FrozenWeight)
                     .suites(kGradcheck));
  // Through cuda:0, with each hand kernel, stride 1 and 2.
  for (int64_t stride : {1, 2})
    rows.push_back(conv_case("gradcheck_cuda_conv2d_s" + n(stride),
                             {2, 2, 5, 4, 3, 3, 3, stride, 1, true}, Grads::All)
                       .variants(conv_cuda_variants(false))
                       .suites(kGradcheckCuda));
  conv2d_channels_last_rows(rows);
}

// The same op on a channels-last input (docs/memory_format.md): every kernel (hand and vendor,
// CPU and CUDA) reads and writes NHWC itself, so these rows run the NHWC kernels, compared in
// NCHW order against the other device, the vendor and finite differences.
void conv2d_channels_last_rows(std::vector<Case>& rows) {
  auto cl_case = [](const std::string& name, const Conv& t, Grads g) {
    Case c = conv_case(name, t, g);
    const int64_t stride = t.stride, pad = t.pad;
    c.fn([=](const Inputs& v) {
      return one(conv2d(v[0].to(MemoryFormat::ChannelsLast), v[1], v[2], stride, pad)
                     .contiguous());
    });
    return c;
  };
  // 3x3 stride 1 and 2, a ResNet downsample (1x1 stride 2), 5x5 with padding 2, a 1x1 image,
  // channels above the GEMM tiles (70 > 64).
  const Conv device[] = {
      {2, 3, 7, 7, 4, 3, 3, 1, 1, true},  {1, 2, 9, 8, 5, 3, 3, 2, 0, true},
      {2, 6, 7, 6, 5, 1, 1, 2, 0, false}, {2, 3, 11, 9, 3, 5, 5, 2, 2, true},
      {2, 3, 1, 1, 2, 3, 3, 1, 1, true},  {2, 9, 13, 12, 70, 3, 3, 1, 1, true},
  };
  uint32_t seed = 700;
  for (const Conv& t : device) {
    const std::pair<Grads, const char*> gs[] = {{Grads::All, ""},
                                                {Grads::FrozenWeight, "_frozen_weight"},
                                                {Grads::NoInputGrad, "_no_input_grad"}};
    for (const auto& [g, suffix] : gs) {
      Case c = cl_case("conv2d_channels_last_" + t.name() + suffix, t, g);
      c.tol(DTol::rel(5e-5, 1e-11)).vendor(DTol::rel(5e-5, 1e-11)).with_seed(seed += 10);
      c.variants(conv_cuda_variants(true));
      c.suites(g == Grads::All ? kDevice | kVendorCuda | kAutocastCuda : unsigned{kDevice});
      rows.push_back(c);
    }
  }
  // Finite differences in double (the hand kernels: oneDNN has no f64) and hand vs oneDNN.
  const Conv gradcheck[] = {
      {2, 3, 7, 5, 4, 3, 3, 1, 0, true},
      {1, 2, 6, 7, 3, 3, 3, 2, 1, true},
      {2, 3, 5, 4, 2, 1, 1, 2, 1, false},
      {1, 3, 9, 7, 5, 3, 2, 3, 2, true},
  };
  for (const Conv& t : gradcheck)
    rows.push_back(cl_case("gradcheck_conv2d_channels_last_" + t.name(), t, Grads::All)
                       .vendor(DTol::abs(1e-3, 1e-3))
                       .suites(kGradcheck | kVendorCpu));
  for (int64_t stride : {1, 2})
    rows.push_back(cl_case("gradcheck_cuda_conv2d_channels_last_s" + n(stride),
                           {2, 2, 5, 4, 3, 3, 3, stride, 1, true}, Grads::All)
                       .variants(conv_cuda_variants(false))
                       .suites(kGradcheckCuda));
}

// ---- Pooling --------------------------------------------------------------------------------

struct Window {
  int64_t n, c, h, w, k, s, p;
  std::string name() const {
    return dims({n, c, h, w}) + "_k" + std::to_string(k) + "_s" + std::to_string(s) + "_p" +
           std::to_string(p);
  }
};

// Input values: continuous (no ties), small integers (ties everywhere), or with NaN and -inf.
Input special(const Shape& shape) {
  return {[=](DType dt, uint32_t seed) {
            std::vector<double> v = random_tensor(shape, seed, -3.0, 3.0).to_vector<double>();
            for (size_t i = 0; i < v.size(); ++i) {
              if (i % 7 == 3) v[i] = std::numeric_limits<double>::quiet_NaN();
              if (i % 5 == 1) v[i] = -std::numeric_limits<double>::infinity();
            }
            return Tensor::from_vector(v, shape).to(dt);
          },
          true};
}

void pool_rows(std::vector<Case>& rows) {
  // CPU vs CUDA: the MNIST pool (the CPU's 2x2 fast path), odd sizes (floor mode), batch 1,
  // padding, overlapping windows (stride < kernel), 1x1 planes, even kernels, strides that
  // skip pixels (stride > kernel), many planes.
  const Window device[] = {
      {2, 3, 8, 8, 2, 2, 0},  {2, 3, 9, 7, 2, 2, 0},    {1, 2, 7, 9, 3, 2, 1},
      {2, 1, 5, 5, 3, 1, 1},  {1, 3, 1, 1, 1, 1, 0},    {2, 2, 6, 5, 2, 1, 0},
      {1, 1, 11, 13, 4, 3, 2}, {2, 2, 10, 9, 2, 3, 0}, {3, 33, 4, 4, 2, 2, 0},
  };
  uint32_t seed = 10;
  for (const Window& t : device) {
    const Shape s{t.n, t.c, t.h, t.w};
    const int64_t k = t.k, st = t.s, p = t.p;
    auto maxpool = [=](const Inputs& v) {
      auto [y, idx] = max_pool2d_with_indices(v[0], k, st, p);
      return Outputs{y, idx};
    };
    rows.push_back(Case("max_pool2d_" + t.name()).in(uniform(s, -3.0, 3.0)).fn(maxpool)
                       .tol(DTol::values()).with_seed(seed += 10).suites(kDevice));
    rows.push_back(Case("max_pool2d_" + t.name() + "_ties").in(ties(s, -3.0, 3.0)).fn(maxpool)
                       .tol(DTol::values()).with_seed(seed += 10).suites(kDevice));
    rows.push_back(Case("max_pool2d_" + t.name() + "_nan_inf").in(special(s)).fn(maxpool)
                       .tol(DTol::values()).with_seed(seed += 10).suites(kDevice));
    for (AvgPoolDivisor d : {AvgPoolDivisor::IncludePad, AvgPoolDivisor::ExcludePad})
      rows.push_back(
          Case("avg_pool2d_" + t.name() +
               (d == AvgPoolDivisor::IncludePad ? "_include_pad" : "_exclude_pad"))
              .in(uniform(s, -2.0, 2.0)).with_seed(seed += 10)
              .fn([=](const Inputs& v) { return one(avg_pool2d(v[0], k, st, p, d)); })
              .tol(DTol::rel(1e-6, 1e-14)).suites(kDevice));
  }
  // 4 x 8 x 260 x 260 = 2,163,200 inputs > 8192 blocks x 256 threads: the backward loop wraps.
  rows.push_back(Case("max_pool2d_grid_stride_4x8x260x260_k2_s2_p0")
                     .in(uniform({4, 8, 260, 260}, -3.0, 3.0))
                     .fn([](const Inputs& v) {
                       auto [y, idx] = max_pool2d_with_indices(v[0], 2, 2, 0);
                       return Outputs{y, idx};
                     })
                     .tol(DTol::values()).dtypes({DType::F32}).suites(kDevice));
  // A (C, H, W) input is one image.
  rows.push_back(Case("max_pool2d_3x7x6_k3_s2_p1").in(uniform({3, 7, 6}, -1.0, 1.0, false))
                     .fn([](const Inputs& v) { return one(max_pool2d(v[0], 3, 2, 1)); })
                     .tol(DTol::values()).dtypes({DType::F32}).suites(kDevice));
  rows.push_back(Case("adaptive_avg_pool2d_3x7x6_to_3x4").in(uniform({3, 7, 6}, -1.0, 1.0, false))
                     .fn([](const Inputs& v) { return one(adaptive_avg_pool2d(v[0], 3, 4)); })
                     .tol(DTol::rel(1e-6, 1e-14)).dtypes({DType::F32}).suites(kDevice));

  // Adaptive: sizes that do not divide (overlapping windows), global, identity, output larger
  // than the input (pixels repeat), 1x1 planes.
  const std::array<int64_t, 6> adaptive[] = {{2, 3, 7, 5, 3, 2},  {1, 2, 10, 10, 1, 1},
                                             {2, 2, 5, 7, 5, 7},  {1, 3, 4, 6, 3, 4},
                                             {1, 1, 3, 3, 5, 4},  {2, 4, 1, 1, 1, 1},
                                             {3, 5, 9, 11, 4, 3}};
  seed = 2000;
  for (const auto& a : adaptive) {
    const int64_t oh = a[4], ow = a[5];
    rows.push_back(Case("adaptive_avg_pool2d_" + dims({a[0], a[1], a[2], a[3]}) + "_to_" +
                        dims({oh, ow}))
                       .in(uniform({a[0], a[1], a[2], a[3]}, -2.0, 2.0)).with_seed(seed += 10)
                       .fn([=](const Inputs& v) { return one(adaptive_avg_pool2d(v[0], oh, ow)); })
                       .tol(DTol::rel(1e-6, 1e-14)).suites(kDevice));
  }

  // 16-bit activations (kLowPrecision, kLowPrecisionCuda): the 16-bit kernels are the f32
  // ones' templates, comparing or summing in f32 in the same order and rounding once, so every
  // output and gradient is the f32 op's rounded once, bit for bit (0 ulps both ways), in NCHW
  // and channels-last (computed channels-last, compared in NCHW). Max pooling with overlapping
  // windows (its backward adds two gradients into one input), average pooling with padding,
  // the ResNet head's adaptive pooling to 1x1 and an uneven one.
  for (bool channels_last : {false, true}) {
    const std::string cl = channels_last ? "channels_last_" : "";
    auto in_format = [=](const Tensor& x) {
      return channels_last ? x.to(MemoryFormat::ChannelsLast) : x;
    };
    const Shape s{2, 12, 7, 6};
    rows.push_back(Case("lp_max_pool2d_" + cl + dims(s) + "_k3_s2_p1").in(distinct(s))
                       .fn([=](const Inputs& v) {
                         return one(max_pool2d(in_format(v[0]), 3, 2, 1).contiguous());
                       })
                       .low_precision({0}, 0, 0).suites(kLowPrecision | kLowPrecisionCuda));
    rows.push_back(Case("lp_avg_pool2d_" + cl + dims(s) + "_k3_s2_p1").in(uniform(s))
                       .fn([=](const Inputs& v) {
                         return one(avg_pool2d(in_format(v[0]), 3, 2, 1,
                                               AvgPoolDivisor::IncludePad).contiguous());
                       })
                       .low_precision({0}, 0, 0).suites(kLowPrecision | kLowPrecisionCuda));
    for (const auto& out : {std::array<int64_t, 2>{1, 1}, std::array<int64_t, 2>{3, 4}}) {
      const int64_t oh = out[0], ow = out[1];
      rows.push_back(Case("lp_adaptive_avg_pool2d_" + cl + dims(s) + "_to_" + dims({oh, ow}))
                         .in(uniform(s))
                         .fn([=](const Inputs& v) {
                           return one(adaptive_avg_pool2d(in_format(v[0]), oh, ow).contiguous());
                         })
                         .low_precision({0}, 0, 0).suites(kLowPrecision | kLowPrecisionCuda));
    }
  }

  // Finite differences in double (inputs of at most 600 elements; max pooling on distinct
  // values: no ties, and gaps far above eps).
  const Window gradcheck[] = {
      {1, 2, 7, 5, 2, 2, 0},  {2, 3, 7, 9, 3, 2, 1}, {1, 2, 6, 7, 3, 1, 1},
      {1, 1, 3, 3, 3, 3, 0},  {3, 1, 8, 6, 2, 2, 1}, {1, 3, 11, 13, 2, 3, 0},
      {2, 2, 5, 5, 5, 1, 2},  {1, 1, 1, 1, 1, 1, 0},
  };
  for (const Window& t : gradcheck) {
    const Shape s{t.n, t.c, t.h, t.w};
    const int64_t k = t.k, st = t.s, p = t.p;
    rows.push_back(Case("gradcheck_max_pool2d_" + t.name()).in(distinct(s)).with_seed(3)
                       .fn([=](const Inputs& v) { return one(max_pool2d(v[0], k, st, p)); })
                       .suites(kGradcheck));
    for (AvgPoolDivisor d : {AvgPoolDivisor::IncludePad, AvgPoolDivisor::ExcludePad})
      rows.push_back(Case("gradcheck_avg_pool2d_" + t.name() +
                          (d == AvgPoolDivisor::IncludePad ? "_include_pad" : "_exclude_pad"))
                         .in(uniform(s)).with_seed(4)
                         .fn([=](const Inputs& v) { return one(avg_pool2d(v[0], k, st, p, d)); })
                         .suites(kGradcheck));
  }
  const std::array<int64_t, 6> gc_adaptive[] = {{2, 3, 6, 4, 3, 2}, {1, 2, 7, 5, 3, 2},
                                                {2, 2, 5, 7, 1, 1}, {1, 1, 3, 3, 5, 4},
                                                {3, 1, 10, 9, 4, 7}, {1, 1, 1, 1, 1, 1}};
  for (const auto& a : gc_adaptive) {
    const int64_t oh = a[4], ow = a[5];
    rows.push_back(Case("gradcheck_adaptive_avg_pool2d_" + dims({a[0], a[1], a[2], a[3]}) +
                        "_to_" + dims({oh, ow}))
                       .in(uniform({a[0], a[1], a[2], a[3]})).with_seed(8)
                       .fn([=](const Inputs& v) { return one(adaptive_avg_pool2d(v[0], oh, ow)); })
                       .suites(kGradcheck));
  }
  // Through cuda:0.
  rows.push_back(Case("gradcheck_cuda_max_pool2d_2x2x7x6_k3_s2_p1").in(uniform({2, 2, 7, 6}))
                     .with_seed(31)
                     .fn([](const Inputs& v) { return one(max_pool2d(v[0], 3, 2, 1)); })
                     .suites(kGradcheckCuda));
  for (AvgPoolDivisor d : {AvgPoolDivisor::IncludePad, AvgPoolDivisor::ExcludePad})
    rows.push_back(Case(std::string("gradcheck_cuda_avg_pool2d_1x2x6x7_k3_s2_p1") +
                        (d == AvgPoolDivisor::IncludePad ? "_include_pad" : "_exclude_pad"))
                       .in(uniform({1, 2, 6, 7})).with_seed(41)
                       .fn([=](const Inputs& v) { return one(avg_pool2d(v[0], 3, 2, 1, d)); })
                       .suites(kGradcheckCuda));
  rows.push_back(Case("gradcheck_cuda_adaptive_avg_pool2d_2x2x7x5_to_3x2")
                     .in(uniform({2, 2, 7, 5})).with_seed(51)
                     .fn([](const Inputs& v) { return one(adaptive_avg_pool2d(v[0], 3, 2)); })
                     .suites(kGradcheckCuda));
}

// ---- BatchNorm2d ----------------------------------------------------------------------------

struct Bn {
  bool affine, running, training;
  bool grad_x, grad_params;
  std::string name() const {
    return std::string(training ? "train" : "eval") + (affine ? "" : "_no_affine") +
           (running ? "" : "_no_running_stats") + (grad_x ? "_grad_x" : "") +
           (grad_params && affine ? "_grad_params" : "");
  }
};

// Inputs x, weight, bias, running_mean, running_var; outputs y and the running statistics
// after the call (copies: training updates them in place, and every call must start alike).
Case bn_case(const std::string& name, const Shape& s, const Bn& k, BatchNormActivation act) {
  const int64_t c = s[1];
  Case row(name);
  row.in(uniform(s, -2.0, 3.0, k.grad_x))
      .in(k.affine ? uniform({c}, 0.5, 1.5, k.grad_params) : absent())
      .in(k.affine ? uniform({c}, -0.5, 0.5, k.grad_params) : absent())
      .in(k.running ? uniform({c}, -0.2, 0.2, false) : absent())
      .in(k.running ? uniform({c}, 0.5, 2.0, false) : absent());
  const bool training = k.training;
  row.fn([=](const Inputs& v) {
    Tensor m = v[3].defined() ? v[3].clone() : Tensor(), var = v[4].defined() ? v[4].clone() : Tensor();
    Tensor y = batch_norm2d(v[0], v[1], v[2], m, var, training, 0.1, 1e-5, act);
    return Outputs{y, m, var};
  });
  row.tol(DTol::rel(2e-5, 1e-12));
  // grad_x = k * grad_y - a * (x - mean) + d per channel, k = weight * invstd, each term of
  // the size of k * grad_y. With two values per channel x_hat is +-1 up to eps and the terms
  // cancel to ~eps / var of their size, so one rounding of a term, which the devices may place
  // differently (a fused multiply-add or not), is a large part of the result: errors are also
  // allowed relative to the terms' size.
  const bool batch_stats = k.training || !k.running;
  const bool affine = k.affine;
  row.grad0_scale = [=](const Inputs& in, const Tensor& dy) {
    const std::vector<double> xv = in[0].to_vector<double>();
    const std::vector<double> wv = affine ? in[1].to_vector<double>() : std::vector<double>();
    const std::vector<double> rv = in[4].defined() ? in[4].to_vector<double>() : std::vector<double>();
    const int64_t nn = s[0], cc = s[1], hw = s[2] * s[3];
    double terms = 0;
    for (int64_t ch = 0; ch < cc; ++ch) {
      double var = batch_stats ? 0.0 : rv[static_cast<size_t>(ch)];
      if (batch_stats) {
        double sum = 0, sq = 0;
        for (int64_t b = 0; b < nn; ++b)
          for (int64_t i = 0; i < hw; ++i) sum += xv[static_cast<size_t>((b * cc + ch) * hw + i)];
        const double mean = sum / static_cast<double>(nn * hw);
        for (int64_t b = 0; b < nn; ++b)
          for (int64_t i = 0; i < hw; ++i) {
            const double d = xv[static_cast<size_t>((b * cc + ch) * hw + i)] - mean;
            sq += d * d;
          }
        var = sq / static_cast<double>(nn * hw);
      }
      const double weight = affine ? std::fabs(wv[static_cast<size_t>(ch)]) : 1.0;
      terms = std::max(terms, weight / std::sqrt(var + 1e-5));
    }
    double max_gy = 0;
    for (double g : dy.to_vector<double>()) max_gy = std::max(max_gy, std::fabs(g));
    return terms * max_gy;
  };
  if (act == BatchNormActivation::Relu) {
    // On cuda:0 the fused ReLU changes no bits against relu(batch_norm2d(...)): both run the
    // same kernels on the same values, whose multiply-adds are spelled out (fma_t / mul_rn in
    // layers/batchnorm2d_cuda.cu), so no compiler's choice of what to fuse can tell them apart.
    row.same_bits = [=](const Inputs& v) {
      Tensor m = v[3].defined() ? v[3].clone() : Tensor(), var = v[4].defined() ? v[4].clone() : Tensor();
      Tensor y = relu(batch_norm2d(v[0], v[1], v[2], m, var, training, 0.1, 1e-5));
      return Outputs{y, m, var};
    };
    // The ReLU cut some outputs, not all (where there are enough of them).
    row.sanity = [](const Outputs& y) -> ::testing::AssertionResult {
      const std::vector<double> v = y[0].to_vector<double>();
      const auto zeros = std::count(v.begin(), v.end(), 0.0);
      if (v.size() >= 8 && (zeros == 0 || zeros == static_cast<int64_t>(v.size())))
        return ::testing::AssertionFailure() << zeros << " of " << v.size() << " outputs cut";
      return ::testing::AssertionSuccess();
    };
  }
  return row;
}

void batchnorm_rows(std::vector<Case>& rows) {
  // C = 1; N = 1; 1x1 images with C = 33; M = 2 values per channel (the fewest batch
  // statistics allow); M = 429 > 256 threads (each sums several); C = 33.
  const Shape shapes[] = {{2, 1, 3, 3}, {1, 3, 2, 5}, {4, 33, 1, 1},
                          {1, 1, 1, 2}, {3, 3, 13, 11}, {2, 33, 4, 5}};
  for (BatchNormActivation act : {BatchNormActivation::None, BatchNormActivation::Relu}) {
    const std::string pre =
        act == BatchNormActivation::Relu ? "batch_norm2d_relu_" : "batch_norm2d_";
    uint32_t seed = act == BatchNormActivation::Relu ? 6000 : 10;
    auto add = [&](const Shape& s, const Bn& k, std::vector<DType> dts = {DType::F32, DType::F64}) {
      rows.push_back(bn_case(pre + dims(s) + "_" + k.name(), s, k, act)
                         .with_seed(seed += 10).dtypes(dts).suites(kDevice));
    };
    for (const Shape& s : shapes)
      for (bool training : {true, false}) {
        add(s, {true, true, training, true, true});
        add(s, {false, true, training, true, false});
      }
    // One value per channel is fine in eval mode (no batch statistics).
    add({1, 3, 1, 1}, {true, true, false, true, true}, {DType::F32});
    // Without running statistics: batch statistics in both modes.
    for (bool training : {true, false}) add({3, 3, 5, 7}, {true, false, training, true, true});
    // Each branch of the backward launcher: only grad_x, only the parameter gradients.
    for (bool training : {true, false}) {
      add({2, 3, 4, 5}, {true, true, training, true, false});
      add({2, 3, 4, 5}, {true, true, training, false, true});
    }
    // 2 x 3 x 420 x 420 = 1,058,400 elements > 4096 blocks x 256 threads: the grid-stride
    // loops take a second lap, and each channel reduces 352,800 values.
    add({2, 3, 420, 420}, {true, true, true, true, true}, {DType::F32});
  }

  // Finite differences in double. Odd shapes: batch 1, 1x1 planes (M = N), a single channel.
  for (const Shape& s : {Shape{3, 2, 3, 5}, Shape{1, 3, 2, 3}, Shape{4, 1, 1, 1}, Shape{2, 3, 1, 2}}) {
    const int64_t c = s[1];
    rows.push_back(Case("gradcheck_batch_norm2d_train_" + dims(s))
                       .in(uniform(s, -1.0, 2.0)).in(uniform({c}, 0.5, 1.5)).in(uniform({c}))
                       .with_seed(40)
                       .fn([](const Inputs& v) {
                         Tensor m = Tensor::zeros({v[1].size(0)}, v[1].dtype());
                         Tensor var = Tensor::ones({v[1].size(0)}, v[1].dtype());
                         return one(batch_norm2d(v[0], v[1], v[2], m, var, true, 0.1, 1e-5));
                       })
                       .suites(kGradcheck));
  }
  rows.push_back(Case("gradcheck_batch_norm2d_eval_2x3x3x2")
                     .in(uniform({2, 3, 3, 2})).in(uniform({3}, 0.5, 1.5)).in(uniform({3}))
                     .in(uniform({3}, -1.0, 1.0, false)).in(uniform({3}, 0.5, 2.0, false))
                     .with_seed(50)
                     .fn([](const Inputs& v) {
                       return one(batch_norm2d(v[0], v[1], v[2], v[3], v[4], false, 0.1, 1e-5));
                     })
                     .suites(kGradcheck));
  rows.push_back(Case("gradcheck_batch_norm2d_train_no_affine_2x2x3x3")
                     .in(uniform({2, 2, 3, 3})).with_seed(60)
                     .fn([](const Inputs& v) {
                       return one(batch_norm2d(v[0], Tensor(), Tensor(), Tensor(), Tensor(), true,
                                               0.1, 1e-5));
                     })
                     .suites(kGradcheck));
  // Only the weight requires grad (x is data): gradients still flow to it.
  rows.push_back(Case("gradcheck_batch_norm2d_train_weight_only_2x2x3x3")
                     .in(uniform({2, 2, 3, 3}, -1.0, 1.0, false)).in(uniform({2}, 0.5, 1.5))
                     .with_seed(61)
                     .fn([](const Inputs& v) {
                       return one(batch_norm2d(v[0], v[1], Tensor(), Tensor(), Tensor(), true,
                                               0.1, 1e-5));
                     })
                     .suites(kGradcheck));
  // Through cuda:0, both modes, plain and with the fused ReLU (inputs whose outputs keep at
  // least 1e-3 from the ReLU's kink: checked by the row's sanity on the CPU run).
  for (BatchNormActivation act : {BatchNormActivation::None, BatchNormActivation::Relu})
    for (bool training : {true, false}) {
      const bool relu_act = act == BatchNormActivation::Relu;
      Case row(std::string("gradcheck_cuda_batch_norm2d") + (relu_act ? "_relu_" : "_") +
               (training ? "train" : "eval") + "_2x3x2x3");
      const uint32_t base = relu_act ? 71 : 61;
      row.make = [=](DType) {
        Inputs in = {random_tensor({2, 3, 2, 3}, base + 2), random_tensor({3}, base + 3, 0.5, 1.5),
                     random_tensor({3}, base + 4, -0.5, 0.5), random_tensor({3}, base, -0.2, 0.2),
                     random_tensor({3}, base + 1, 0.5, 2.0)};
        if (relu_act) {
          NoGradGuard no_grad;
          const std::vector<double> pre =
              batch_norm2d(in[0], in[1], in[2], in[3].clone(), in[4].clone(), training)
                  .to_vector<double>();
          int positive = 0;
          for (double v : pre) {
            if (std::fabs(v) <= 1e-3) ADD_FAILURE() << "an output at the kink: pick other inputs";
            positive += v > 0;
          }
          EXPECT_GT(positive, 0);
          EXPECT_LT(positive, static_cast<int>(pre.size()));
        }
        return in;
      };
      row.grads = {true, true, true, false, false};
      row.fn([=](const Inputs& v) {
        Tensor m = v[3].clone(), var = v[4].clone();
        return one(batch_norm2d(v[0], v[1], v[2], m, var, training, 0.1, 1e-5, act));
      });
      rows.push_back(row.suites(kGradcheckCuda));
    }

  // 16-bit activations (kLowPrecision, kLowPrecisionCuda): x rounded to bf16 / f16, the
  // parameters and running statistics f32. NCHW and channels-last (computed channels-last,
  // compared in NCHW): C = 5 (odd: the CUDA rows reductions one channel per thread, the
  // element-wise passes' one-by-one remainder), C = 8 (two channels per 4-byte load), C = 32
  // (the CPU's channel-blocked view of channels-last). y is the f32 op's rounded once on each
  // device; 1 ulp covers the CPU against cuda:0, whose f32 statistics round differently.
  for (const Shape& s : {Shape{3, 5, 4, 3}, Shape{2, 8, 5, 7}, Shape{2, 32, 3, 5}})
    for (bool channels_last : {false, true})
      for (bool training : {true, false})
        for (BatchNormActivation act : {BatchNormActivation::None, BatchNormActivation::Relu}) {
          const std::string name = std::string("lp_batch_norm2d") +
                                   (act == BatchNormActivation::Relu ? "_relu_" : "_") +
                                   (channels_last ? "channels_last_" : "") + dims(s) +
                                   (training ? "_train" : "_eval");
          Case row = bn_case(name, s, {true, true, training, true, true}, act);
          row.fn([=](const Inputs& v) {
            Tensor m = v[3].clone(), var = v[4].clone();
            const Tensor x = channels_last ? v[0].to(MemoryFormat::ChannelsLast) : v[0];
            Tensor y = batch_norm2d(x, v[1], v[2], m, var, training, 0.1, 1e-5, act);
            return Outputs{y.contiguous(), m, var};
          });
          rows.push_back(row.with_seed(7000 + static_cast<uint32_t>(rows.size()))
                             .low_precision({0}, 1)
                             .suites(kLowPrecision | kLowPrecisionCuda));
        }
}

// ---- Losses ---------------------------------------------------------------------------------

void loss_rows(std::vector<Case>& rows) {
  // Cross-entropy: batch 1, 7 classes; one class (loss and gradient 0); a row one longer than
  // a warp; rows over four warp laps (37 rows = 5 blocks, the last partial); more rows than
  // the finishing block's 256 threads.
  auto ce = [](const Inputs& v) { return one(cross_entropy(v[0], v[1])); };
  const DTol ce_tol = DTol::rel(2e-6, 1e-13);
  uint32_t seed = 100;
  for (const auto& [nn, c] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 7}, {5, 7}, {3, 1}, {9, 33}, {37, 129}, {300, 10}})
    rows.push_back(Case("cross_entropy_" + dims({nn, c})).in(uniform({nn, c}, -4.0, 4.0))
                       .in(targets(nn, c)).with_seed(seed += 10).fn(ce).tol(ce_tol)
                       .suites(kDevice));
  // 1100 x 250 = 275,000 logits > 1024 blocks x 256 threads: the backward's loop wraps.
  rows.push_back(Case("cross_entropy_grid_stride_1100x250").in(uniform({1100, 250}, -4.0, 4.0))
                     .in(targets(1100, 250)).with_seed(7).fn(ce).tol(ce_tol)
                     .dtypes({DType::F32}).suites(kDevice));
  // Logits of +-1000: exp would overflow without the max subtraction; the loss stays finite.
  rows.push_back(Case("cross_entropy_huge_logits_6x7").in(uniform({6, 7}, -1000.0, 1000.0))
                     .in(targets(6, 7)).with_seed(3).fn(ce).tol(ce_tol).suites(kDevice));
  rows.push_back(Case("gradcheck_cross_entropy_3x7").in(uniform({3, 7}, -2.0, 2.0))
                     .in(values({6, 0, 3}, {3}, false)).with_seed(2)
                     .fn([](const Inputs& v) {
                       return one(cross_entropy(v[0], v[1].to(DType::I64)));
                     })
                     .suites(kGradcheck));
  rows.push_back(Case("gradcheck_cross_entropy_1x1").in(uniform({1, 1})).with_seed(3)
                     .fn([](const Inputs& v) {
                       return one(cross_entropy(v[0], Tensor::from_vector<int64_t>({0}, {1})));
                     })
                     .suites(kGradcheck));
  rows.push_back(Case("gradcheck_cuda_cross_entropy_4x7").in(uniform({4, 7}, -2.0, 2.0))
                     .in(targets(4, 7)).with_seed(8).fn(ce).suites(kGradcheckCuda));

  // MSE: the CUDA kernel sums in double, so its reference is the CPU op in double, rounded.
  auto mse = [](const Inputs& v) { return one(mse_loss(v[0], v[1])); };
  auto mse_case = [&](const std::string& name, const Shape& s, bool ga, bool gb) {
    Case c(name);
    c.in(uniform(s, -2.0, 2.0, ga)).in(uniform(s, -2.0, 2.0, gb)).fn(mse)
        .tol(DTol::rel(1e-6, 1e-13)).suites(kDevice);
    c.reference_f64 = true;
    c.has_same_dtype_fwd = true;
    c.same_dtype_fwd = DTol::rel(1e-4, 1e-12);
    return c;
  };
  seed = 200;
  for (const Shape& s : {Shape{1}, Shape{7, 3}, Shape{2, 3, 5, 7}, Shape{257}, Shape{1000, 3}})
    rows.push_back(mse_case("mse_loss_" + dims(s), s, true, true).with_seed(seed += 10));
  rows.push_back(mse_case("mse_loss_5x7_grad_a_only", {5, 7}, true, false).with_seed(300));
  rows.push_back(mse_case("mse_loss_5x7_grad_b_only", {5, 7}, false, true).with_seed(310));
  // 2 * 1024 * 256 + 7 elements: more than the capped grid covers in one lap.
  rows.push_back(mse_case("mse_loss_grid_stride_524295", {2 * 1024 * 256 + 7}, true, true)
                     .dtypes({DType::F32}).with_seed(400));
  rows.push_back(Case("gradcheck_mse_loss_2x3").in(uniform({2, 3})).in(uniform({2, 3}))
                     .with_seed(4).fn(mse).suites(kGradcheck));
  rows.push_back(Case("gradcheck_cuda_mse_loss_3x5").in(uniform({3, 5})).in(uniform({3, 5}))
                     .with_seed(11).fn(mse).suites(kGradcheckCuda));
}

// ---- Dropout --------------------------------------------------------------------------------

void dropout_rows(std::vector<Case>& rows) {
  // The same mask on both devices for the same generator state, bit for bit, forward and
  // backward; the generator's offset after the call is the second output. Values away from 0,
  // so a dropped element never equals a kept one by accident. Sizes that leave a partial
  // group of 4; a base offset that is not a multiple of 4.
  auto drop = [](double p, uint64_t seed, uint64_t skip) {
    return [=](const Inputs& v) {
      Generator gen(seed);
      gen.reserve(skip);
      Tensor y = dropout(v[0], p, true, gen);
      return Outputs{y, Tensor::from_vector<int64_t>({static_cast<int64_t>(gen.offset())}, {1})};
    };
  };
  uint32_t seed = 1;
  for (double p : {0.25, 0.5})
    for (const Shape& s : {Shape{1}, Shape{3}, Shape{4}, Shape{5}, Shape{3, 7, 13},
                           Shape{2, 1, 1, 1}, Shape{1027}, Shape{4, 33, 65}})
      for (uint64_t skip : {0, 7}) {
        ++seed;
        rows.push_back(Case("dropout_p" + std::to_string(static_cast<int>(p * 100)) + "_" +
                            dims(s) + "_offset" + std::to_string(skip))
                           .in(uniform(s, 0.5, 2.0)).with_seed(seed).fn(drop(p, seed, skip))
                           .suites(kDevice));
      }
  // 4 * 256 * 4096 + 5 elements: the grid-stride loop takes a second lap.
  rows.push_back(Case("dropout_p50_grid_stride_4194309_offset3")
                     .in(uniform({4 * 256 * 4096 + 5}, 0.5, 2.0)).with_seed(77)
                     .fn(drop(0.5, 77, 3)).dtypes({DType::F32}).suites(kDevice));
  // Finite differences of x * dropout(x) (mask and x both matter), the same mask every time.
  for (const Shape& s : {Shape{1}, Shape{1, 7}, Shape{3, 5, 2}})
    rows.push_back(Case("gradcheck_dropout_p40_" + dims(s)).in(uniform(s)).with_seed(3)
                       .fn([](const Inputs& v) {
                         Generator gen(4242);
                         gen.set_state(4242, 5);
                         return one(mul(dropout(v[0], 0.4, true, gen), v[0]));
                       })
                       .suites(kGradcheck));
}

// ---- Linear, activations, layout ------------------------------------------------------------

void small_layer_rows(std::vector<Case>& rows) {
  for (const Shape& xs : {Shape{1, 3}, Shape{4, 7}}) {
    rows.push_back(Case("gradcheck_linear_" + dims(xs)).in(uniform(xs)).in(uniform({2, xs[1]}))
                       .in(uniform({2})).with_seed(4)
                       .fn([](const Inputs& v) { return one(linear(v[0], v[1], v[2])); })
                       .suites(kGradcheck));
    rows.push_back(Case("gradcheck_linear_no_bias_" + dims(xs)).in(uniform(xs))
                       .in(uniform({2, xs[1]})).with_seed(4)
                       .fn([](const Inputs& v) { return one(linear(v[0], v[1], Tensor())); })
                       .suites(kGradcheck));
  }
  rows.push_back(Case("gradcheck_relu_module_2x3")
                     .in(values({-0.7, 0.3, 1.1, -2.2, 0.9, -0.4}, {2, 3}))
                     .fn([](const Inputs& v) { ReLU r; return one(r(v[0])); })
                     .suites(kGradcheck));
  rows.push_back(Case("gradcheck_flatten_module_2x3x4x5").in(uniform({2, 3, 4, 5})).with_seed(3)
                     .fn([](const Inputs& v) { Flatten f; return one(f(v[0])); })
                     .suites(kGradcheck));
  rows.push_back(Case("gradcheck_to_channel_blocks_1x16x2x3").in(uniform({1, 16, 2, 3}))
                     .with_seed(3)
                     .fn([](const Inputs& v) { return one(to_channel_blocks(v[0])); })
                     .suites(kGradcheck));
  rows.push_back(Case("gradcheck_from_channel_blocks_2x1x3x2x16").in(uniform({2, 1, 3, 2, 16}))
                     .with_seed(4)
                     .fn([](const Inputs& v) { return one(from_channel_blocks(v[0])); })
                     .suites(kGradcheck));
}

// ---- LeakyReLU (docs/adding_a_layer.md builds it step by step) -----------------------------

void leaky_relu_rows(std::vector<Case>& rows) {
  // Odd shapes, batch 1, 1x1 images, a flat vector; slopes below and above 1. The rule is one
  // comparison and one multiplication on both devices: bit-identical. Gradcheck inputs keep
  // 0.05 away from the kink at 0.
  for (const Shape& s : {Shape{2, 3, 5, 7}, Shape{1, 4, 1, 1}, Shape{1, 1, 3, 3}, Shape{1031}})
    for (double slope : {0.01, 0.2, 1.5}) {
      const std::string name = "leaky_relu_" + dims(s) + "_slope" +
                               std::to_string(static_cast<int>(slope * 100));
      rows.push_back(Case(name).in(off_zero(uniform(s), 0.05)).with_seed(11)
                         .fn([slope](const Inputs& v) { return one(leaky_relu(v[0], slope)); })
                         .tol(DTol::exact())
                         .suites(kGradcheck | kDevice));
    }
  rows.push_back(Case("leaky_relu_module_2x3")
                     .in(values({-0.7, 0.3, 1.1, -2.2, 0.9, -0.4}, {2, 3}))
                     .fn([](const Inputs& v) { LeakyReLU m(0.1); return one(m(v[0])); })
                     .tol(DTol::exact())
                     .suites(kGradcheck | kDevice));
}

}  // namespace

void add_layer_rows(std::vector<Case>& rows) {
  conv2d_rows(rows);
  pool_rows(rows);
  batchnorm_rows(rows);
  loss_rows(rows);
  dropout_rows(rows);
  small_layer_rows(rows);
  leaky_relu_rows(rows);
}

}  // namespace kiln::parity
