// batchnorm_lowp.h: the check of batch_norm2d on 16-bit activations against the f32 op on the
// widened input, on any device (tests/layers/batchnorm2d_test.cpp on the CPU,
// tests/cuda/batchnorm2d_cuda_test.cpp on cuda:0).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/memory_format.h"
#include "engine/tensor.h"
#include "layers/batchnorm2d.h"
#include "parity/parity_harness.h"
#include "support/gradcheck.h"

namespace kiln::testing {

// The spacing of the 16-bit format dt around |v| (its ulp; subnormal spacing below the normals).
inline double ulp16(double v, DType dt) {
  const int mant = dt == DType::BF16 ? 7 : 10;
  const int min_exp = dt == DType::BF16 ? -126 : -14;
  const int e =
      v == 0 ? min_exp : std::max(static_cast<int>(std::floor(std::log2(std::fabs(v)))), min_exp);
  return std::ldexp(1.0, e - mant);
}

// A 16-bit input x16 through batch_norm2d on `device`, and the same op in f32 on x16 widened
// (the f32 kernels are the specification): y, the running statistics and the three gradients.
// The 16-bit kernels are the f32 templates instantiated for Half / BFloat16, in the same order
// of operations, so:
//   - y is the f32 y rounded once: bit for bit (the forward's multiply-add is spelled out,
//     bn_apply on the CPU, fma_t / mul_rn on CUDA, and the statistics are the same double sums
//     of the same values);
//   - running_mean / running_var are the f32 op's bit for bit (the same doubles from the same
//     statistics);
//   - grad_weight / grad_bias are sums in double of the same products, rounded to f32: they may
//     differ only where the compiler contracts a multiply-add of the two instantiations
//     differently, by an f32 rounding: 2^-22 of the largest;
//   - grad_x = k * gy - a * (x - mean) + d rounded once to 16 bits. Its three terms cancel (BN's
//     backward removes the mean and the xhat component of gy), so an f32 rounding difference in
//     one term (a contraction, above) is 2^-24 of that term, not of the result: the bound is 1
//     ulp of the 16-bit format plus 3 f32 roundings of the largest term, |k| * max|gy| * (2 +
//     max|xhat|) per channel (|a * (x - mean)| <= |k| * |xhat| * max|gy|, |d| <= |k| * max|gy|).
inline void check_lowp_matches_f32(const Device& device, DType dt, const Shape& shape,
                                   bool channels_last, bool training, bool relu, uint32_t seed) {
  const auto fmt = channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  const int64_t c = shape[1];
  auto on = [&](const Tensor& t) { return t.to(device); };
  Tensor x16 = on(random_tensor(shape, seed, -2, 3).to(dt)).to(fmt);
  x16.set_requires_grad(true);
  Tensor x32 = x16.detach().to(DType::F32).set_requires_grad(true);
  ASSERT_EQ(x32.is_channels_last(), channels_last);
  const Tensor w = on(random_tensor({c}, seed + 1, 0.5, 1.5, DType::F32));
  const Tensor b = on(random_tensor({c}, seed + 2, -0.5, 0.5, DType::F32));
  Tensor w16 = w.clone().set_requires_grad(true), b16 = b.clone().set_requires_grad(true);
  Tensor w32 = w.clone().set_requires_grad(true), b32 = b.clone().set_requires_grad(true);
  Tensor rm16 = on(random_tensor({c}, seed + 3, -0.5, 0.5, DType::F32));
  Tensor rv16 = on(random_tensor({c}, seed + 4, 0.5, 2.0, DType::F32));
  const Tensor rm_before = rm16.to(kCpu), rv_before = rv16.to(kCpu);
  Tensor rm32 = rm16.clone(), rv32 = rv16.clone();
  const auto act = relu ? BatchNormActivation::Relu : BatchNormActivation::None;
  const std::string what = std::string(dtype_name(dt)) + " " + device.str() +
                           (channels_last ? " channels-last" : " NCHW") +
                           (training ? " train" : " eval") + (relu ? " relu " : " ") +
                           shape_str(shape);
  Tensor y16 = batch_norm2d(x16, w16, b16, rm16, rv16, training, 0.1, 1e-5, act);
  Tensor y32 = batch_norm2d(x32, w32, b32, rm32, rv32, training, 0.1, 1e-5, act);
  ASSERT_EQ(y16.dtype(), dt) << what;
  ASSERT_EQ(y16.is_channels_last(), channels_last) << what;
  EXPECT_TRUE(bit_identical(what + " y", y16.contiguous(), y32.to(dt).contiguous()));
  EXPECT_TRUE(bit_identical(what + " running_mean", rm16, rm32));
  EXPECT_TRUE(bit_identical(what + " running_var", rv16, rv32));

  const Tensor g16 = on(random_tensor(shape, seed + 5).to(dt)).to(fmt);
  backward(y16, g16);
  backward(y32, g16.to(DType::F32));
  const std::vector<Tensor> grads16 = {x16.grad(), w16.grad(), b16.grad()};
  ASSERT_EQ(grads16[0].dtype(), dt) << what;
  ASSERT_EQ(grads16[0].is_channels_last(), channels_last) << what;
  ASSERT_EQ(grads16[1].dtype(), DType::F32) << what;
  const Tensor zeros = on(Tensor::zeros({c}, DType::F32));
  const double gscale_w = max_abs_diff(w32.grad(), zeros);
  const double gscale_b = max_abs_diff(b32.grad(), zeros);
  EXPECT_LE(max_abs_diff(grads16[1], w32.grad()), std::ldexp(gscale_w, -22)) << what;
  EXPECT_LE(max_abs_diff(grads16[2], b32.grad()), std::ldexp(gscale_b, -22)) << what;

  // grad_x, element by element (NCHW order), against the bound above, with each channel's
  // mean and invstd in double (the batch's in training, the running ones before the step in
  // eval).
  const auto dx16 = grads16[0].to(kCpu).contiguous().to_vector<double>();
  const auto dx32 = x32.grad().to(kCpu).contiguous().to_vector<double>();
  const auto xv = x32.detach().to(kCpu).contiguous().to_vector<double>();
  const auto gv = g16.to(kCpu).contiguous().to_vector<double>();
  const auto wv = w.to(kCpu).to_vector<double>();
  const auto rmv = rm_before.to_vector<double>(), rvv = rv_before.to_vector<double>();
  const int64_t n = shape[0], hw = shape[2] * shape[3];
  const double m = static_cast<double>(n * hw);
  auto at = [&](int64_t bi, int64_t ch, int64_t i) {
    return static_cast<size_t>((bi * c + ch) * hw + i);
  };
  for (int64_t ch = 0; ch < c; ++ch) {
    const auto cs = static_cast<size_t>(ch);
    double mu = rmv[cs], var = rvv[cs];
    if (training) {
      double s = 0, sq = 0;
      for (int64_t bi = 0; bi < n; ++bi)
        for (int64_t i = 0; i < hw; ++i) s += xv[at(bi, ch, i)];
      mu = s / m;
      for (int64_t bi = 0; bi < n; ++bi)
        for (int64_t i = 0; i < hw; ++i) sq += (xv[at(bi, ch, i)] - mu) * (xv[at(bi, ch, i)] - mu);
      var = sq / m;
    }
    const double invstd = 1 / std::sqrt(var + 1e-5);
    double max_gy = 0, max_xhat = 0;
    for (int64_t bi = 0; bi < n; ++bi)
      for (int64_t i = 0; i < hw; ++i) {
        max_gy = std::max(max_gy, std::fabs(gv[at(bi, ch, i)]));
        max_xhat = std::max(max_xhat, std::fabs((xv[at(bi, ch, i)] - mu) * invstd));
      }
    const double slack =
        3 * std::ldexp(std::fabs(wv[cs]) * invstd * max_gy * (2 + max_xhat), -24);
    for (int64_t bi = 0; bi < n; ++bi)
      for (int64_t i = 0; i < hw; ++i) {
        const size_t k = at(bi, ch, i);
        ASSERT_LE(std::fabs(dx16[k] - dx32[k]), ulp16(dx32[k], dt) + slack)
            << what << " grad_x[" << k << "] = " << dx16[k] << ", f32 " << dx32[k];
      }
  }
}

}  // namespace kiln::testing
