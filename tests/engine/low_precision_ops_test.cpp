// low_precision_ops_test.cpp: the elementwise ops, their gradients and sum/mean on 16-bit
// activations (f16, bf16) on the CPU. The accuracy statement: a 16-bit result is the f32 op
// applied to the widened inputs, rounded once, bit for bit (the f32 loop runs the same
// operations in the same order); a 16-bit sum or mean is the f32 one of the widened input, as
// an F32 tensor; every gradient has its tensor's dtype. Sizes cross the kernels' block (1024),
// their 16-wide vector steps and the parallel threshold; values include the ones where the
// conversions could part ways (subnormals, infinities, NaN, -0, f16 overflow).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/memory_format.h"
#include "engine/ops.h"
#include "parity/parity_harness.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::bit_identical;
using testing::random_tensor;

const DType kLow[] = {DType::BF16, DType::F16};

// n values in [-4, 4), rounded to `dtype`, with special values at the front.
Tensor activations(int64_t n, uint32_t seed, DType dtype, const Shape& shape = {}) {
  std::vector<double> v = random_tensor({n}, seed, -4.0, 4.0).to_vector<double>();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> special = {0.0,   -0.0, 1e-6,  -3e-8, 1e-39, inf,
                                       -inf, std::numeric_limits<double>::quiet_NaN(),
                                       60000, -65504, 0.5, 1.0 + 1.0 / 512};
  for (size_t i = 0; i < special.size() && i < v.size(); ++i) v[i] = special[i];
  return Tensor::from_vector(v, shape.empty() ? Shape{n} : shape).to(dtype);
}

using BinaryFn = std::function<Tensor(const Tensor&, const Tensor&)>;

TEST(LowPrecisionOps, ElementwiseIsTheF32OpRoundedOnce) {
  const std::vector<std::pair<std::string, BinaryFn>> ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
      {"add_relu", [](const Tensor& a, const Tensor& b) { return add_relu(a, b); }},
      {"relu", [](const Tensor& a, const Tensor&) { return relu(a); }},
      {"neg", [](const Tensor& a, const Tensor&) { return neg(a); }},
      {"mul_scalar", [](const Tensor& a, const Tensor&) { return mul(a, 0.3); }},
      {"add_scalar", [](const Tensor& a, const Tensor&) { return add(a, -1.7); }},
  };
  for (DType dt : kLow) {
    for (int64_t n : {int64_t{7}, int64_t{3000 + 5}, int64_t{40000 + 3}}) {
      const Tensor a = activations(n, 1, dt), b = activations(n, 2, dt);
      const Tensor aw = a.to(DType::F32), bw = b.to(DType::F32);
      for (const auto& [name, f] : ops) {
        const std::string what = name + " " + dtype_name(dt) + " n=" + std::to_string(n);
        const Tensor got = f(a, b);
        ASSERT_EQ(got.dtype(), dt) << what;
        EXPECT_TRUE(bit_identical(what, got, f(aw, bw).to(dt)));
      }
      // Broadcasts: one element, a row of the last dimension.
      const Tensor s = activations(1, 5, dt).reshape({1});
      for (const auto& [name, f] : ops) {
        if (name == "add_relu" || name == "relu" || name == "neg" || name.find("scalar") != std::string::npos)
          continue;
        const std::string what = name + " scalar-broadcast " + dtype_name(dt);
        EXPECT_TRUE(bit_identical(what, f(a, s), f(aw, s.to(DType::F32)).to(dt)));
      }
    }
    const Tensor m = activations(6 * 1500, 3, dt, {6, 1500}), row = activations(1500, 4, dt);
    EXPECT_TRUE(bit_identical(std::string("add row-broadcast ") + dtype_name(dt), add(m, row),
                              add(m.to(DType::F32), row.to(DType::F32)).to(dt)));
    EXPECT_TRUE(bit_identical(std::string("mul row-broadcast ") + dtype_name(dt), mul(m, row),
                              mul(m.to(DType::F32), row.to(DType::F32)).to(dt)));
  }
}

TEST(LowPrecisionOps, MixedDtypesAndF32OnlyOpsAreErrors) {
  const Tensor b16 = Tensor::ones({4}, DType::BF16), h16 = Tensor::ones({4}, DType::F16);
  EXPECT_THROW(add(b16, h16), Error);
  EXPECT_THROW(add(b16, Tensor::ones({4})), Error);
  EXPECT_THROW(add_relu(h16, Tensor::ones({4})), Error);
  EXPECT_THROW(kiln::exp(b16), Error);
  EXPECT_THROW(kiln::log(h16), Error);
  EXPECT_THROW(div(b16, b16), Error);
}

// relu's gradient passes dy's 16-bit bits where y > 0 and is +0 elsewhere; the gradients of the
// binary ops are the f32 ones rounded once (they are dy itself, or one multiply).
TEST(LowPrecisionOps, GradientsHaveTheInputDtype) {
  for (DType dt : kLow) {
    const int64_t n = 2000 + 9;
    const Tensor dy = activations(n, 7, dt);
    auto grads = [&](DType run, const std::function<Tensor(const Tensor&, const Tensor&)>& f) {
      Tensor a = activations(n, 1, dt).to(run), b = activations(n, 2, dt).to(run);
      a.set_requires_grad(true);
      b.set_requires_grad(true);
      backward(f(a, b), dy.to(run));
      return std::vector<Tensor>{a.grad(), b.grad()};
    };
    const std::vector<std::pair<std::string, BinaryFn>> ops = {
        {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }},
        {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }},
        {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
        {"add_relu", [](const Tensor& a, const Tensor& b) { return add_relu(a, b); }},
        {"relu", [](const Tensor& a, const Tensor& b) { return add(relu(a), b); }},
        {"mul_scalar", [](const Tensor& a, const Tensor& b) { return add(mul(a, 0.3), b); }},
    };
    for (const auto& [name, f] : ops) {
      const std::vector<Tensor> low = grads(dt, f), ref = grads(DType::F32, f);
      for (size_t i = 0; i < 2; ++i) {
        const std::string what = name + " grad " + std::to_string(i) + " " + dtype_name(dt);
        ASSERT_TRUE(low[i].defined()) << what;
        ASSERT_EQ(low[i].dtype(), dt) << what;
        EXPECT_TRUE(bit_identical(what, low[i], ref[i].to(dt)));
      }
    }
    // One-element broadcast: b's gradient is sum(dy) (f32 accumulation), rounded once.
    Tensor a = activations(n, 1, dt), s = activations(1, 9, dt).reshape({1});
    Tensor aw = a.to(DType::F32), sw = s.to(DType::F32);
    for (Tensor* t : {&a, &s, &aw, &sw}) t->set_requires_grad(true);
    backward(sub(a, s), dy);
    backward(sub(aw, sw), dy.to(DType::F32));
    ASSERT_EQ(s.grad().dtype(), dt);
    EXPECT_TRUE(bit_identical(std::string("scalar-broadcast grad ") + dtype_name(dt), s.grad(),
                              sw.grad().to(dt)));
  }
}

// A residual join: x is used twice (y = add_relu(relu(x * 0.5), x)), so its two gradients are
// added, in its dtype. With dy = 1 every gradient is 0, 1 or 1.5: exact in both formats.
TEST(LowPrecisionOps, ResidualBackwardAccumulatesInTheTensorDtype) {
  for (DType dt : kLow) {
    for (DType run : {dt, DType::F32}) {
      Tensor x = activations(4 * 3 * 5 * 5, 11, dt, {4, 3, 5, 5}).to(run);
      x = x.to(MemoryFormat::ChannelsLast).detach();
      x.set_requires_grad(true);
      const Tensor y = add_relu(relu(mul(x, 0.5)), x);
      EXPECT_EQ(y.dtype(), run);
      const Tensor loss = sum(y.flatten(1));
      EXPECT_EQ(loss.dtype(), DType::F32);
      loss.backward();
      ASSERT_EQ(x.grad().dtype(), run);
    }
    Tensor x16 = activations(300, 12, dt).detach(), x32 = x16.to(DType::F32);
    x16.set_requires_grad(true);
    x32.set_requires_grad(true);
    sum(add_relu(relu(mul(x16, 0.5)), x16)).backward();
    sum(add_relu(relu(mul(x32, 0.5)), x32)).backward();
    EXPECT_TRUE(bit_identical(std::string("residual grad ") + dtype_name(dt), x16.grad(),
                              x32.grad().to(dt)));
  }
}

// sum and mean promote: f32 accumulation, an F32 result equal to the f32 op on the widened
// input (same order), and a gradient of the input's dtype equal to the f32 one rounded once.
TEST(LowPrecisionOps, SumAndMeanPromoteToF32) {
  using Reduce = std::function<Tensor(const Tensor&)>;
  const std::vector<std::pair<std::string, Reduce>> reductions = {
      {"sum", [](const Tensor& x) { return sum(x); }},
      {"mean", [](const Tensor& x) { return mean(x); }},
      {"mean_23", [](const Tensor& x) { return mean(x, {2, 3}); }},
      {"sum_1_keepdim", [](const Tensor& x) { return sum(x, {1}, true); }},
      {"mean_nhwc_1", [](const Tensor& x) { return mean(x.reshape({2, -1, 6}), {1}); }},
      {"mean_channels_last", [](const Tensor& x) { return mean(x.to(MemoryFormat::ChannelsLast)); }},
  };
  for (DType dt : kLow) {
    const Tensor x16 = random_tensor({2, 6, 7, 5}, 21, -2.0, 3.0).to(dt);
    const Tensor dy_seed = random_tensor({2, 6, 7, 5}, 22);
    for (const auto& [name, f] : reductions) {
      const std::string what = name + " " + dtype_name(dt);
      Tensor a = x16.detach(), w = x16.to(DType::F32);
      a.set_requires_grad(true);
      w.set_requires_grad(true);
      const Tensor ya = f(a), yw = f(w);
      ASSERT_EQ(ya.dtype(), DType::F32) << what;
      EXPECT_TRUE(bit_identical(what, ya, yw));
      const Tensor dy = random_tensor(yw.shape(), 23).to(DType::F32);
      backward(ya, dy);
      backward(yw, dy);
      ASSERT_EQ(a.grad().dtype(), dt) << what;
      EXPECT_TRUE(bit_identical(what + " grad", a.grad(), w.grad().to(dt)));
    }
  }
}

// What a ResNet's forward and backward do to activations besides the arithmetic: views,
// layout conversions, copies. All move 16-bit elements unchanged.
TEST(LowPrecisionOps, LayoutAndCopyOpsKeepTheBits) {
  for (DType dt : kLow) {
    const Tensor x = activations(2 * 3 * 4 * 5, 31, dt, {2, 3, 4, 5});
    const Tensor cl = x.to(MemoryFormat::ChannelsLast);
    EXPECT_EQ(cl.dtype(), dt);
    EXPECT_TRUE(bit_identical("channels-last round trip", cl.contiguous(), x));
    EXPECT_TRUE(bit_identical("flatten", x.flatten(1).reshape({2, 3, 4, 5}), x));
    EXPECT_TRUE(bit_identical("clone", x.clone(), x));
    Tensor z = Tensor::zeros(x.shape(), dt);
    z.copy_(cl);
    EXPECT_TRUE(bit_identical("copy_", z, x));
    // The gradient through a layout conversion and a reshape keeps the dtype.
    Tensor leaf = x.detach();
    leaf.set_requires_grad(true);
    const Tensor y = relu(leaf.to(MemoryFormat::ChannelsLast)).reshape({2, -1});
    backward(y, Tensor::ones(y.shape(), dt));
    ASSERT_EQ(leaf.grad().dtype(), dt);
    std::vector<float> mask = x.to_vector<float>();
    for (float& v : mask) v = v > 0 ? 1.0f : 0.0f;
    EXPECT_TRUE(bit_identical("relu grad through layout", leaf.grad(),
                              Tensor::from_vector(mask, x.shape()).to(dt)));
  }
}

}  // namespace
}  // namespace kiln
