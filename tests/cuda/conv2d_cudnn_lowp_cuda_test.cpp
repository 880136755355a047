// conv2d_cudnn_lowp_cuda_test.cpp: the mixed-precision cuDNN convolutions (layers/conv2d_cudnn.cu:
// cuda::conv2d_forward_lowp_vendor, conv2d_backward_lowp_vendor; the simulated cuDNN under the
// simulator): bf16 and f16 x, w and dy, f32 b, y, dx, dw, db, against loops in double on the same
// rounded inputs. Odd shapes: batch 1, one channel, stride 2, padding, 1x1 filters, outputs of
// one pixel. Outputs are filled with NaN first (written, never read); each of dx, dw, db may be
// null; an empty batch; repeated backward passes give the same bits; other dtypes are an error.
//
// Tolerances: cuDNN writes y, dx and dw in the input type, so each is rounded once from its
// float sum: half an ulp, within 2^-8 (bf16) or 2^-11 (f16) of the magnitude of the sum
// (near(): relative to the element and the tensor's scale). The bias is added after that
// rounding, in f32, so y is compared with the bias taken off again. db sums dy widened exactly,
// in f32: sum_rtol(F32).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "engine/cuda/context.h"
#include "layers/conv2d_kernels.h"
#include "parity/parity_harness.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::bit_identical;
using testing::kCuda;
using testing::near;
using testing::random_tensor;
using testing::sum_rtol;

struct Case {
  int64_t n, c, h, w, k, r, s, stride, pad;
  ConvGeometry geometry() const {
    ConvGeometry g{};
    g.n = n, g.c = c, g.h = h, g.w = w, g.k = k, g.r = r, g.s = s, g.stride = stride, g.pad = pad;
    g.p = (h + 2 * pad - r) / stride + 1;
    g.q = (w + 2 * pad - s) / stride + 1;
    return g;
  }
};

const Case kCases[] = {
    {2, 3, 7, 6, 4, 3, 3, 1, 1},  // padding, rectangular image
    {1, 1, 9, 8, 3, 3, 2, 2, 0},  // batch 1, one channel, stride 2, a 3x2 filter
    {3, 5, 4, 4, 2, 1, 1, 1, 0},  // 1x1
    {1, 4, 5, 5, 7, 5, 5, 1, 0},  // one output pixel: the whole image under the filter
    {2, 2, 6, 7, 3, 3, 3, 2, 2},  // stride 2 with padding 2
};

std::string describe(const Case& t, DType in) {
  return std::string(dtype_name(in)) + " x [" + std::to_string(t.n) + ", " + std::to_string(t.c) +
         ", " + std::to_string(t.h) + ", " + std::to_string(t.w) + "] w [" + std::to_string(t.k) +
         ", " + std::to_string(t.c) + ", " + std::to_string(t.r) + ", " + std::to_string(t.s) +
         "] stride " + std::to_string(t.stride) + " pad " + std::to_string(t.pad);
}

double rounding_rtol(DType in) { return in == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

const uint16_t* bits(const Tensor& t) {
  return t.defined() ? static_cast<const uint16_t*>(t.raw_data()) : nullptr;
}
float* f32(Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }
Tensor nan_f32(const Shape& shape) {
  return Tensor::full(shape, std::numeric_limits<double>::quiet_NaN(), DType::F32, kCuda);
}

// The convolution in double on the f32 values of x, w, dy (cross-correlation, as Conv2d):
// y = conv(x, w) (no bias), dx, dw, db.
struct Reference {
  Tensor y, dx, dw, db;
};
Reference reference(const ConvGeometry& g, const Tensor& x32, const Tensor& w32,
                    const Tensor& dy32) {
  const std::vector<float> x = x32.to_vector<float>(), w = w32.to_vector<float>();
  const std::vector<float> dy = dy32.to_vector<float>();
  std::vector<double> y(static_cast<size_t>(g.n * g.k * g.p * g.q), 0.0);
  std::vector<double> dx(x.size(), 0.0), dw(w.size(), 0.0), db(static_cast<size_t>(g.k), 0.0);
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t k = 0; k < g.k; ++k)
      for (int64_t p = 0; p < g.p; ++p)
        for (int64_t q = 0; q < g.q; ++q) {
          const size_t yi = static_cast<size_t>(((n * g.k + k) * g.p + p) * g.q + q);
          db[static_cast<size_t>(k)] += dy[yi];
          for (int64_t c = 0; c < g.c; ++c)
            for (int64_t r = 0; r < g.r; ++r)
              for (int64_t s = 0; s < g.s; ++s) {
                const int64_t h = p * g.stride - g.pad + r, ww = q * g.stride - g.pad + s;
                if (h < 0 || h >= g.h || ww < 0 || ww >= g.w) continue;  // padding
                const size_t xi = static_cast<size_t>(((n * g.c + c) * g.h + h) * g.w + ww);
                const size_t wi = static_cast<size_t>(((k * g.c + c) * g.r + r) * g.s + s);
                y[yi] += static_cast<double>(w[wi]) * x[xi];
                dx[xi] += static_cast<double>(w[wi]) * dy[yi];
                dw[wi] += static_cast<double>(dy[yi]) * x[xi];
              }
        }
  return {Tensor::from_vector(y, {g.n, g.k, g.p, g.q}), Tensor::from_vector(dx, {g.n, g.c, g.h, g.w}),
          Tensor::from_vector(dw, {g.k, g.c, g.r, g.s}), Tensor::from_vector(db, {g.k})};
}

// The inputs of one case, rounded to `in`, on the CPU and on cuda:0.
struct Inputs {
  Tensor x16, w16, dy16, b32;  // CPU
  Tensor x_d, w_d, dy_d, b_d;  // cuda:0
};
Inputs make_inputs(const ConvGeometry& g, DType in, uint32_t seed) {
  Inputs t;
  t.x16 = random_tensor({g.n, g.c, g.h, g.w}, seed, -1, 1, DType::F32).to(in);
  t.w16 = random_tensor({g.k, g.c, g.r, g.s}, seed + 1, -1, 1, DType::F32).to(in);
  t.dy16 = random_tensor({g.n, g.k, g.p, g.q}, seed + 2, -1, 1, DType::F32).to(in);
  t.b32 = random_tensor({g.k}, seed + 3, -1, 1, DType::F32);
  t.x_d = t.x16.to(kCuda), t.w_d = t.w16.to(kCuda), t.dy_d = t.dy16.to(kCuda);
  t.b_d = t.b32.to(kCuda);
  return t;
}

// y - b (per channel), in double: the rounded convolution before the f32 bias was added.
Tensor without_bias(const Tensor& y, const Tensor& b) {
  std::vector<double> v = y.to(DType::F64).to_vector<double>();
  const std::vector<float> bv = b.to_vector<float>();
  const int64_t k = y.shape()[1], pq = y.shape()[2] * y.shape()[3];
  for (size_t i = 0; i < v.size(); ++i) v[i] -= bv[static_cast<size_t>((static_cast<int64_t>(i) / pq) % k)];
  return Tensor::from_vector(v, y.shape());
}

void check_case(const Case& t, DType in, uint32_t seed) {
  const std::string what = describe(t, in);
  SCOPED_TRACE(what);
  const ConvGeometry g = t.geometry();
  const Inputs in_t = make_inputs(g, in, seed);
  const Reference ref =
      reference(g, in_t.x16.to(DType::F32), in_t.w16.to(DType::F32), in_t.dy16.to(DType::F32));
  const double rtol = rounding_rtol(in);

  Tensor y = nan_f32({g.n, g.k, g.p, g.q}), y_nobias = nan_f32({g.n, g.k, g.p, g.q});
  Tensor dx = nan_f32({g.n, g.c, g.h, g.w}), dw = nan_f32({g.k, g.c, g.r, g.s}), db = nan_f32({g.k});
  {
    cuda::DeviceGuard guard(0);
    cuda::conv2d_forward_lowp_vendor(cuda::Backend{}, in, bits(in_t.x_d), bits(in_t.w_d),
                                     in_t.b_d.data<float>(), f32(y), g);
    cuda::conv2d_forward_lowp_vendor(cuda::Backend{}, in, bits(in_t.x_d), bits(in_t.w_d), nullptr,
                                     f32(y_nobias), g);
    cuda::conv2d_backward_lowp_vendor(cuda::Backend{}, in, bits(in_t.x_d), bits(in_t.dy_d),
                                      bits(in_t.w_d), f32(dx), f32(dw), f32(db), g);
  }
  EXPECT_TRUE(near(what + " y - b", without_bias(y.to(testing::kCpu), in_t.b32), ref.y, rtol));
  EXPECT_TRUE(near(what + " y (no bias)", y_nobias.to(DType::F64), ref.y, rtol));
  EXPECT_TRUE(near(what + " dx", dx.to(DType::F64), ref.dx, rtol));
  EXPECT_TRUE(near(what + " dw", dw.to(DType::F64), ref.dw, rtol));
  EXPECT_TRUE(near(what + " db", db.to(DType::F64), ref.db, sum_rtol(DType::F32)));
}

TEST(Conv2dCudnnLowp, Bf16MatchesReference) {
  KILN_SKIP_WITHOUT_CUDA();
  uint32_t seed = 10;
  for (const Case& t : kCases) check_case(t, DType::BF16, seed += 10);
}

TEST(Conv2dCudnnLowp, F16MatchesReference) {
  KILN_SKIP_WITHOUT_CUDA();
  uint32_t seed = 100;
  for (const Case& t : kCases) check_case(t, DType::F16, seed += 10);
}

TEST(Conv2dCudnnLowp, EachGradientMayBeLeftOut) {
  KILN_SKIP_WITHOUT_CUDA();
  // Every subset of {dx, dw, db}: the requested ones match the full call bit for bit, and the
  // call touches nothing else (x is left out with dw, w with dx, as the op does).
  const Case t = kCases[0];
  const ConvGeometry g = t.geometry();
  const Inputs in_t = make_inputs(g, DType::BF16, 7);
  Tensor dx_all = nan_f32({g.n, g.c, g.h, g.w}), dw_all = nan_f32({g.k, g.c, g.r, g.s});
  Tensor db_all = nan_f32({g.k});
  {
    cuda::DeviceGuard guard(0);
    cuda::conv2d_backward_lowp_vendor(cuda::Backend{}, DType::BF16, bits(in_t.x_d), bits(in_t.dy_d),
                                      bits(in_t.w_d), f32(dx_all), f32(dw_all), f32(db_all), g);
  }
  for (int mask = 0; mask < 8; ++mask) {
    const bool want_dx = mask & 1, want_dw = mask & 2, want_db = mask & 4;
    Tensor dx = want_dx ? nan_f32({g.n, g.c, g.h, g.w}) : Tensor();
    Tensor dw = want_dw ? nan_f32({g.k, g.c, g.r, g.s}) : Tensor();
    Tensor db = want_db ? nan_f32({g.k}) : Tensor();
    {
      cuda::DeviceGuard guard(0);
      cuda::conv2d_backward_lowp_vendor(
          cuda::Backend{}, DType::BF16, want_dw ? bits(in_t.x_d) : nullptr, bits(in_t.dy_d),
          want_dx ? bits(in_t.w_d) : nullptr, f32(dx), f32(dw), f32(db), g);
    }
    const std::string what = "mask " + std::to_string(mask);
    if (want_dx) {
      EXPECT_TRUE(bit_identical(what + " dx", dx, dx_all));
    }
    if (want_dw) {
      EXPECT_TRUE(bit_identical(what + " dw", dw, dw_all));
    }
    if (want_db) {
      EXPECT_TRUE(bit_identical(what + " db", db, db_all));
    }
  }
}

TEST(Conv2dCudnnLowp, BackwardIsDeterministic) {
  KILN_SKIP_WITHOUT_CUDA();
  // The plan keeps deterministic algorithms: two runs give the same bits.
  const Case t = kCases[4];
  const ConvGeometry g = t.geometry();
  const Inputs in_t = make_inputs(g, DType::F16, 3);
  Tensor dx[2], dw[2], db[2];
  for (int run = 0; run < 2; ++run) {
    dx[run] = nan_f32({g.n, g.c, g.h, g.w}), dw[run] = nan_f32({g.k, g.c, g.r, g.s});
    db[run] = nan_f32({g.k});
    cuda::DeviceGuard guard(0);
    cuda::conv2d_backward_lowp_vendor(cuda::Backend{}, DType::F16, bits(in_t.x_d), bits(in_t.dy_d),
                                      bits(in_t.w_d), f32(dx[run]), f32(dw[run]), f32(db[run]), g);
  }
  EXPECT_TRUE(bit_identical("dx", dx[0], dx[1]));
  EXPECT_TRUE(bit_identical("dw", dw[0], dw[1]));
  EXPECT_TRUE(bit_identical("db", db[0], db[1]));
}

TEST(Conv2dCudnnLowp, EmptyBatchAndOtherDtypes) {
  KILN_SKIP_WITHOUT_CUDA();
  Case t = kCases[0];
  t.n = 0;
  const ConvGeometry g = t.geometry();
  Tensor y = Tensor::empty({0}, DType::F32, kCuda);
  cuda::DeviceGuard guard(0);
  // N = 0: nothing to compute, nothing touched (the op zeroes dw and db of an empty batch).
  EXPECT_NO_THROW(cuda::conv2d_forward_lowp_vendor(cuda::Backend{}, DType::BF16, nullptr, nullptr,
                                                   nullptr, y.data<float>(), g));
  EXPECT_NO_THROW(cuda::conv2d_backward_lowp_vendor(cuda::Backend{}, DType::F16, nullptr, nullptr,
                                                    nullptr, nullptr, nullptr, nullptr, g));
  for (DType bad : {DType::F32, DType::F64}) {
    try {
      cuda::conv2d_forward_lowp_vendor(cuda::Backend{}, bad, nullptr, nullptr, nullptr, nullptr,
                                       kCases[0].geometry());
      FAIL() << "no error for " << dtype_name(bad);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bf16 or f16"), std::string::npos) << e.what();
    }
    EXPECT_THROW(cuda::conv2d_backward_lowp_vendor(cuda::Backend{}, bad, nullptr, nullptr, nullptr,
                                                   nullptr, nullptr, nullptr, kCases[0].geometry()),
                 Error);
  }
}

}  // namespace
}  // namespace kiln
