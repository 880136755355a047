// conv2d_test.cpp: Conv2d against the definition.
//
//  1. Gradient checks in double (x, w, b) over a table of odd shapes: stride 2 and 3,
//     padding, batch 1, 1x1 kernels, one input channel, kernels as large as the input.
//  2. The hand kernels (f32 and f64) against a naive 7-loop reference written here from the
//     definition, forward and both backward kernels.
//  3. The vendor path (oneDNN, f32) against the hand path, including the MNIST CNN's shapes.
//  4. Shape errors throw kiln::Error that prints the shapes; the module's init and printing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/impl.h"
#include "engine/ops.h"
#include "layers/conv2d.h"
#include "layers/layout.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::gradcheck;
using testing::max_abs_diff;
using testing::random_tensor;

struct Case {
  int64_t n, c, h, w, k, r, s, stride, pad;
  bool bias;
};

// Odd shapes on purpose: every branch of im2col/col2im (padding rows, partial rows, strides
// that skip input columns) and of the kernels (1x1 without im2col, batch 1 with no team).
const std::vector<Case> kCases = {
    {2, 3, 7, 5, 4, 3, 3, 1, 0, true},   // plain 3x3
    {1, 2, 6, 7, 3, 3, 3, 2, 1, true},   // batch 1, stride 2, padding 1
    {3, 4, 5, 5, 2, 1, 1, 1, 0, true},   // 1x1: no im2col
    {2, 3, 5, 4, 2, 1, 1, 2, 1, false},  // 1x1 with stride and padding: im2col again
    {2, 1, 8, 8, 3, 3, 3, 1, 1, false},  // one input channel (the first layer)
    {1, 3, 9, 7, 5, 3, 2, 3, 2, true},   // non-square kernel, stride 3, padding 2
    {2, 2, 5, 6, 3, 5, 5, 1, 0, true},   // kernel as tall as the input: P = 1
    {5, 2, 3, 3, 1, 3, 3, 1, 2, true},   // padding wider than needed: border outputs see zeros
};

std::string name(const Case& c) {
  return detail::str("x [", c.n, ", ", c.c, ", ", c.h, ", ", c.w, "] w [", c.k, ", ", c.c, ", ",
                     c.r, ", ", c.s, "] stride ", c.stride, " pad ", c.pad,
                     c.bias ? " bias" : " no bias");
}

// ---- the definition, as plain loops --------------------------------------------------------------
struct Ref {
  std::vector<double> y, dx, dw, db;
};

// y = conv(x, w) + b; and for a given dy, dx = dL/dx, dw = dL/dw, db = dL/db of L = <y, dy>.
Ref reference(const Case& cs, const std::vector<double>& x, const std::vector<double>& w,
              const std::vector<double>& b, const std::vector<double>& dy) {
  const int64_t p_ = (cs.h + 2 * cs.pad - cs.r) / cs.stride + 1;
  const int64_t q_ = (cs.w + 2 * cs.pad - cs.s) / cs.stride + 1;
  Ref out;
  out.y.assign(static_cast<size_t>(cs.n * cs.k * p_ * q_), 0.0);
  out.dx.assign(x.size(), 0.0);
  out.dw.assign(w.size(), 0.0);
  out.db.assign(static_cast<size_t>(cs.k), 0.0);
  for (int64_t n = 0; n < cs.n; ++n)
    for (int64_t k = 0; k < cs.k; ++k)
      for (int64_t p = 0; p < p_; ++p)
        for (int64_t q = 0; q < q_; ++q) {
          const size_t yi = static_cast<size_t>(((n * cs.k + k) * p_ + p) * q_ + q);
          double acc = cs.bias ? b[static_cast<size_t>(k)] : 0.0;
          out.db[static_cast<size_t>(k)] += dy[yi];
          for (int64_t c = 0; c < cs.c; ++c)
            for (int64_t r = 0; r < cs.r; ++r)
              for (int64_t s = 0; s < cs.s; ++s) {
                const int64_t ih = p * cs.stride - cs.pad + r, iw = q * cs.stride - cs.pad + s;
                if (ih < 0 || ih >= cs.h || iw < 0 || iw >= cs.w) continue;
                const size_t xi = static_cast<size_t>(((n * cs.c + c) * cs.h + ih) * cs.w + iw);
                const size_t wi = static_cast<size_t>(((k * cs.c + c) * cs.r + r) * cs.s + s);
                acc += x[xi] * w[wi];
                out.dx[xi] += dy[yi] * w[wi];
                out.dw[wi] += dy[yi] * x[xi];
              }
          out.y[yi] = acc;
        }
  return out;
}

double max_abs_diff(const Tensor& a, const std::vector<double>& b) {
  auto va = a.to_vector<double>();
  if (va.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < va.size(); ++i) m = std::max(m, std::abs(va[i] - b[i]));
  return m;
}

// Runs conv2d forward and backward (with upstream gradient dy) in `dtype` under `impl`.
struct Grads {
  Tensor y, dx, dw, db;
};
Grads run(const Case& cs, const Tensor& x64, const Tensor& w64, const Tensor& b64,
        const Tensor& dy64, DType dtype, Impl impl) {
  KernelsGuard kernels(impl);
  // Fresh leaves every time (to() may return the same tensor when the dtype already fits).
  auto leaf = [dtype](const Tensor& t) { return t.to(dtype).clone().set_requires_grad(true); };
  Tensor x = leaf(x64), w = leaf(w64);
  Tensor b = cs.bias ? leaf(b64) : Tensor();
  Tensor y = conv2d(x, w, b, cs.stride, cs.pad);
  y.backward(dy64.to(dtype));
  return {y, x.grad(), w.grad(), cs.bias ? b.grad() : Tensor()};
}

TEST(Conv2d, HandMatchesNaiveReference) {
  uint32_t seed = 100;
  for (const Case& cs : kCases) {
    SCOPED_TRACE(name(cs));
    const int64_t p = (cs.h + 2 * cs.pad - cs.r) / cs.stride + 1;
    const int64_t q = (cs.w + 2 * cs.pad - cs.s) / cs.stride + 1;
    Tensor x = random_tensor({cs.n, cs.c, cs.h, cs.w}, seed++);
    Tensor w = random_tensor({cs.k, cs.c, cs.r, cs.s}, seed++);
    Tensor b = random_tensor({cs.k}, seed++);
    Tensor dy = random_tensor({cs.n, cs.k, p, q}, seed++);
    Ref ref = reference(cs, x.to_vector<double>(), w.to_vector<double>(), b.to_vector<double>(),
                        dy.to_vector<double>());
    for (DType dt : {DType::F64, DType::F32}) {
      SCOPED_TRACE(dtype_name(dt));
      const double tol = dt == DType::F64 ? 1e-12 : 1e-5;
      Grads r = run(cs, x, w, b, dy, dt, Impl::Hand);
      EXPECT_LT(max_abs_diff(r.y, ref.y), tol);
      EXPECT_LT(max_abs_diff(r.dx, ref.dx), tol);
      EXPECT_LT(max_abs_diff(r.dw, ref.dw), tol);
      if (cs.bias) {
        EXPECT_LT(max_abs_diff(r.db, ref.db), tol);
      }
    }
  }
}

TEST(Conv2d, FrozenWeightTrainedBias) {
  // Only x and b need gradients: backward-weight runs for db alone (x is not even saved).
  Case cs{3, 2, 6, 5, 4, 3, 3, 1, 1, true};
  Tensor x64 = random_tensor({3, 2, 6, 5}, 7), w64 = random_tensor({4, 2, 3, 3}, 8);
  Tensor b64 = random_tensor({4}, 9), dy64 = random_tensor({3, 4, 6, 5}, 10);
  Ref ref = reference(cs, x64.to_vector<double>(), w64.to_vector<double>(),
                      b64.to_vector<double>(), dy64.to_vector<double>());
  for (Impl impl : {Impl::Hand, Impl::Vendor}) {
    SCOPED_TRACE(impl_name(impl));
    KernelsGuard kernels(impl);
    Tensor x = x64.to(DType::F32).set_requires_grad(true);
    Tensor w = w64.to(DType::F32);
    Tensor b = b64.to(DType::F32).set_requires_grad(true);
    conv2d(x, w, b, cs.stride, cs.pad).backward(dy64.to(DType::F32));
    EXPECT_FALSE(w.grad().defined());
    EXPECT_LT(max_abs_diff(x.grad(), ref.dx), 1e-5);
    EXPECT_LT(max_abs_diff(b.grad(), ref.db), 1e-5);
  }
}

TEST(Conv2d, HandBackwardIsBitReproducible) {
  // Big enough (> 2^20 multiply-adds) for the kernels to split the batch over threads.
  Case cs{17, 8, 12, 12, 8, 3, 3, 1, 1, true};
  Tensor x = random_tensor({17, 8, 12, 12}, 1), w = random_tensor({8, 8, 3, 3}, 2);
  Tensor b = random_tensor({8}, 3), dy = random_tensor({17, 8, 12, 12}, 4);
  Grads a = run(cs, x, w, b, dy, DType::F32, Impl::Hand);
  Grads c = run(cs, x, w, b, dy, DType::F32, Impl::Hand);
  EXPECT_EQ(a.dw.to_vector<float>(), c.dw.to_vector<float>());
  EXPECT_EQ(a.db.to_vector<float>(), c.db.to_vector<float>());
}

// The error message must contain `needle` (e.g. a shape in full).
void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected kiln::Error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Conv2d, WrongShapesThrow) {
  Tensor x = Tensor::zeros({2, 3, 8, 8});
  Tensor w = Tensor::zeros({4, 3, 3, 3});
  Tensor b = Tensor::zeros({4});
  expect_error([&] { conv2d(x, Tensor::zeros({4, 2, 3, 3}), b); }, "[4, 2, 3, 3]");
  expect_error([&] { conv2d(x, Tensor::zeros({4, 2, 3, 3}), b); }, "[2, 3, 8, 8]");
  expect_error([&] { conv2d(Tensor::zeros({3, 8, 8}), w, b); }, "[3, 8, 8]");
  expect_error([&] { conv2d(x, Tensor::zeros({4, 3, 3}), b); }, "[4, 3, 3]");
  expect_error([&] { conv2d(x, w, Tensor::zeros({5})); }, "[5]");
  expect_error([&] { conv2d(Tensor::zeros({1, 3, 2, 2}), w, b); }, "[1, 3, 2, 2]");
  expect_error([&] { conv2d(x, w, b, 0); }, "stride");
  expect_error([&] { conv2d(x, w, b, 1, -1); }, "padding");
  expect_error([&] { conv2d(x.to(DType::F64), w, b); }, "conv2d");
  EXPECT_THROW(Conv2d(0, 4, 3), Error);
}

TEST(Conv2d, ModuleShapesInitAndPrinting) {
  Conv2d conv(3, 5, 3, 2, 1);
  EXPECT_EQ(conv.weight.shape(), Shape({5, 3, 3, 3}));
  EXPECT_EQ(conv.bias.shape(), Shape({5}));
  EXPECT_EQ(conv.parameters().size(), 2u);
  const double bound = 1.0 / std::sqrt(27.0);
  for (double v : conv.weight.to_vector<double>()) EXPECT_LE(std::abs(v), bound);
  for (double v : conv.bias.to_vector<double>()) EXPECT_LE(std::abs(v), bound);
  Tensor y = conv(Tensor::zeros({2, 3, 7, 6}));
  EXPECT_EQ(y.shape(), Shape({2, 5, 4, 3}));
  EXPECT_NE(conv.describe().find("Conv2d(3, 5, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1))"),
            std::string::npos)
      << conv.describe();
  Conv2d nobias(1, 2, 1, 1, 0, false);
  EXPECT_EQ(nobias.parameters().size(), 1u);
  EXPECT_NE(nobias.describe().find("bias=False"), std::string::npos) << nobias.describe();
}

// set_conv_winograd(true): oneDNN may compute 3x3 stride-1 convolutions with Winograd's
// F(4x4, 3x3); forward and both gradients agree with the direct algorithm to the larger
// rounding error that transform has (1e-4 relative allowed).
TEST(Conv2d, WinogradAgreesWithDirect) {
  KernelsGuard kernels(Impl::Vendor);
  Tensor x = random_tensor({32, 64, 16, 16}, 70, -1, 1, DType::F32);
  Tensor w = random_tensor({64, 64, 3, 3}, 71, -0.1, 0.1, DType::F32);
  Tensor g = random_tensor({32, 64, 16, 16}, 72, -1, 1, DType::F32);
  auto run = [&](bool winograd, Tensor& dx, Tensor& dw) {
    set_conv_winograd(winograd);
    Tensor xi = x.clone(), wi = w.clone();
    xi.set_requires_grad(true);
    wi.set_requires_grad(true);
    // Channel-blocked activations (layers/layout.h), as ResNet runs them on the CPU.
    Tensor y = from_channel_blocks(conv2d(to_channel_blocks(xi), wi, Tensor(), 1, 1));
    backward(y, g);
    dx = xi.grad();
    dw = wi.grad();
    return y;
  };
  auto rel = [](const Tensor& a, const Tensor& b) {
    double scale = 0;
    for (double v : b.to_vector<double>()) scale = std::max(scale, std::abs(v));
    return max_abs_diff(a, b) / scale;
  };
  Tensor dx0, dw0, dx1, dw1;
  Tensor y0 = run(false, dx0, dw0);
  Tensor y1 = run(true, dx1, dw1);
  set_conv_winograd(false);
  EXPECT_LT(rel(y1, y0), 1e-4);
  EXPECT_LT(rel(dx1, dx0), 1e-4);
  EXPECT_LT(rel(dw1, dw0), 1e-4);
}

}  // namespace
}  // namespace kiln
