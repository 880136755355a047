// pool2d_lowp.h: the accuracy rule of pooling on 16-bit activations (bf16, f16), shared by the
// CPU, channels-last and CUDA pooling tests.
//
// The rule: a 16-bit pool returns a 16-bit y (and a 16-bit gradient) equal, bit for bit, to the
// f32 op applied to the widened 16-bit input (and widened output gradient) and rounded once to
// the 16-bit format. 0 ulps, because the 16-bit kernels are the f32 kernels' templates: every
// element is widened exactly, the window is compared or summed in f32 in the f32 kernel's order,
// divided by the same count, and rounded once as it is stored. Max pooling moves the winning
// element (its rounding is exact); its indices equal the f32 op's. A kernel that summed in 16
// bits, or rounded a backward gather's partial sums, fails: the overlapping windows below add up
// to four terms per input element.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/tensor.h"
#include "layers/pool2d.h"

namespace kiln::testing {

struct LowpPoolOp {
  std::string name;
  std::function<Tensor(const Tensor&)> fn;
  bool max = false;  // max pooling: its indices (kernel k, stride s, padding p) are compared too
  int64_t k = 0, s = 0, p = 0;
};

// ResNet's stem pool and overlapping windows (gradients of up to 4 outputs meet in one input),
// 2x2/2, both average divisors, adaptive pooling with overlapping windows and to 1x1 (the head).
inline std::vector<LowpPoolOp> lowp_pool_ops() {
  return {
      {"max k3 s2 p1", [](const Tensor& x) { return max_pool2d(x, 3, 2, 1); }, true, 3, 2, 1},
      {"max k2 s2", [](const Tensor& x) { return max_pool2d(x, 2, 2, 0); }, true, 2, 2, 0},
      {"max k3 s1 p1", [](const Tensor& x) { return max_pool2d(x, 3, 1, 1); }, true, 3, 1, 1},
      {"avg k3 s2 p1", [](const Tensor& x) { return avg_pool2d(x, 3, 2, 1); }},
      {"avg k3 s1 p1 exclude pad",
       [](const Tensor& x) { return avg_pool2d(x, 3, 1, 1, AvgPoolDivisor::ExcludePad); }},
      {"avg k2 s2", [](const Tensor& x) { return avg_pool2d(x, 2, 2, 0); }},
      {"adaptive 1x1", [](const Tensor& x) { return adaptive_avg_pool2d(x, 1, 1); }},
      {"adaptive 3x4", [](const Tensor& x) { return adaptive_avg_pool2d(x, 3, 4); }},
  };
}

struct LowpPass {
  Tensor y, grad, indices;  // indices: max pooling only
};

// Forward and backward of `op` on x (any device, format and dtype) with output gradient gy.
inline LowpPass lowp_pass(const LowpPoolOp& op, const Tensor& x_in, const Tensor& gy) {
  Tensor x = x_in.detach().set_requires_grad(true);
  Tensor y = op.fn(x);
  y.backward(gy);
  LowpPass r{y, x.grad(), Tensor()};
  if (op.max) r.indices = max_pool2d_with_indices(x_in.detach(), op.k, op.s, op.p).second;
  return r;
}

// The bits of a 16-bit tensor's elements in logical (N, C, H, W) order, on any device and in
// either format. Widening to f32 is exact and one-to-one (a quiet NaN keeps its payload), so
// equal f32 bits mean equal 16-bit bits.
inline std::vector<uint32_t> lowp_bits(const Tensor& t) {
  const std::vector<float> v = t.to(Device(DeviceType::CPU, 0)).to(DType::F32).to_vector<float>();
  std::vector<uint32_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) std::memcpy(&b[i], &v[i], sizeof(float));
  return b;
}

inline ::testing::AssertionResult same_lowp_bits(const std::string& what, const Tensor& got,
                                                 const Tensor& want) {
  if (got.shape() != want.shape() || got.dtype() != want.dtype())
    return ::testing::AssertionFailure() << what << ": got " << got.str() << ", want "
                                         << want.str();
  const std::vector<uint32_t> g = lowp_bits(got), w = lowp_bits(want);
  for (size_t i = 0; i < w.size(); ++i)
    if (g[i] != w[i]) {
      float gf, wf;
      std::memcpy(&gf, &g[i], sizeof gf);
      std::memcpy(&wf, &w[i], sizeof wf);
      return ::testing::AssertionFailure() << what << ": element " << i << " of "
                                           << shape_str(want.shape()) << " is " << gf
                                           << ", want " << wf;
    }
  return ::testing::AssertionSuccess();
}

// The rule above for one op: x16 and gy16 are 16-bit (any device, either format). Returns the
// 16-bit pass for further comparisons.
inline LowpPass expect_lowp_matches_f32(const LowpPoolOp& op, const Tensor& x16,
                                        const Tensor& gy16) {
  const DType dt = x16.dtype();
  const LowpPass lo = lowp_pass(op, x16, gy16);
  const LowpPass wide = lowp_pass(op, x16.to(DType::F32), gy16.to(DType::F32));
  EXPECT_EQ(lo.y.dtype(), dt);
  EXPECT_EQ(lo.grad.dtype(), dt);
  EXPECT_EQ(lo.y.memory_format(), x16.memory_format());
  EXPECT_EQ(lo.grad.memory_format(), x16.memory_format());
  EXPECT_EQ(lo.y.device(), x16.device());
  EXPECT_TRUE(same_lowp_bits("y", lo.y, wide.y.to(dt)));
  EXPECT_TRUE(same_lowp_bits("grad x", lo.grad, wide.grad.to(dt)));
  if (op.max) {  // both in x16's format: compared in storage order
    const Device cpu(DeviceType::CPU, 0);
    EXPECT_EQ(lo.indices.to(cpu).storage_order_view().to_vector<int64_t>(),
              wide.indices.to(cpu).storage_order_view().to_vector<int64_t>());
  }
  return lo;
}

}  // namespace kiln::testing
