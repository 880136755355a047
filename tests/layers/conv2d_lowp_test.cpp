// conv2d_lowp_test.cpp: the oneDNN convolutions of mixed precision
// (cpu::conv2d_forward_lowp_vendor, cpu::conv2d_backward_lowp_vendor in layers/conv2d_kernels.h):
// bf16 / f16 x, w and dy, f32 y, dx, dw, db. Against direct loops in double over the same rounded
// inputs, element by element:
//   |got - want| <= 1e-5 * (sum of |products| that make the element),
// the error of f32 sums. Geometries: 1x1, 3x3 pad 1, stride 2, 5x5 as in the MNIST CNN, with
// and without bias; forward, and each gradient alone and all together. Where oneDNN refuses a
// dtype (no JIT kernel: f16 in oneDNN 2.6), the outputs must be left as they were; on a CPU with
// AVX512_BF16, bf16 must not be refused.
#include <gtest/gtest.h>

#include "support/low_precision_bits.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/host_device.h"
#include "layers/conv2d_kernels.h"

namespace kiln {
namespace {

constexpr float kSentinel = -12345.0f;  // what a refused call must leave in its outputs

struct Case {
  const char* name;
  int64_t n, c, h, w, k, r, s, stride, pad;
};

const Case kCases[] = {
    {"1x1", 2, 5, 7, 6, 3, 1, 1, 1, 0},
    {"3x3_pad1", 2, 4, 9, 9, 6, 3, 3, 1, 1},
    {"3x3_stride2", 1, 3, 11, 10, 5, 3, 3, 2, 1},
    {"5x5_mnist_conv1", 2, 1, 28, 28, 8, 5, 5, 1, 0},
    {"5x5_mnist_conv2", 2, 8, 12, 12, 16, 5, 5, 1, 0},
};

ConvGeometry geometry(const Case& t) {
  ConvGeometry g{};
  g.n = t.n, g.c = t.c, g.h = t.h, g.w = t.w, g.k = t.k, g.r = t.r, g.s = t.s;
  g.stride = t.stride, g.pad = t.pad;
  g.p = (t.h + 2 * t.pad - t.r) / t.stride + 1;
  g.q = (t.w + 2 * t.pad - t.s) / t.stride + 1;
  return g;
}

using testing::from_bits;
using testing::random_bits;
using testing::to_bits;


std::vector<double> widen(DType t, const std::vector<uint16_t>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = from_bits(t, v[i]);
  return out;
}

// Values and error bounds (sum of |products|) of the reference.
struct Ref {
  std::vector<double> value, bound;
  explicit Ref(int64_t size) : value(static_cast<size_t>(size)), bound(static_cast<size_t>(size)) {}
  void add(int64_t i, double product) {
    value[static_cast<size_t>(i)] += product;
    bound[static_cast<size_t>(i)] += std::fabs(product);
  }
};

// Direct loops over every (n, k, p, q, c, r, s): y, dx, dw and db of the same products.
struct Reference {
  Ref y, dx, dw, db;
  Reference(const ConvGeometry& g, const std::vector<double>& x, const std::vector<double>& w,
            const std::vector<double>& b, const std::vector<double>& dy)
      : y(g.n * g.k * g.p * g.q), dx(g.n * g.c * g.h * g.w), dw(g.k * g.c * g.r * g.s), db(g.k) {
    for (int64_t n = 0; n < g.n; ++n)
      for (int64_t k = 0; k < g.k; ++k)
        for (int64_t p = 0; p < g.p; ++p)
          for (int64_t q = 0; q < g.q; ++q) {
            const int64_t yi = ((n * g.k + k) * g.p + p) * g.q + q;
            if (!b.empty()) y.add(yi, b[static_cast<size_t>(k)]);
            const double d = dy[static_cast<size_t>(yi)];
            db.add(k, d);
            for (int64_t c = 0; c < g.c; ++c)
              for (int64_t r = 0; r < g.r; ++r)
                for (int64_t s = 0; s < g.s; ++s) {
                  const int64_t ih = p * g.stride - g.pad + r, iw = q * g.stride - g.pad + s;
                  if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
                  const int64_t xi = ((n * g.c + c) * g.h + ih) * g.w + iw;
                  const int64_t wi = ((k * g.c + c) * g.r + r) * g.s + s;
                  y.add(yi, x[static_cast<size_t>(xi)] * w[static_cast<size_t>(wi)]);
                  dx.add(xi, d * w[static_cast<size_t>(wi)]);
                  dw.add(wi, d * x[static_cast<size_t>(xi)]);
                }
          }
  }
};

void expect_close(const std::vector<float>& got, const Ref& want, const std::string& what) {
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 3; ++i) {
    const double err = std::fabs(got[i] - want.value[i]);
    if (!(err <= 1e-5 * want.bound[i] + 1e-30)) {  // NaN fails; the 1e-30: an all-padding 0
      ++bad;
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", want " << want.value[i]
                    << " (error " << err << ", bound " << 1e-5 * want.bound[i] << ")";
    }
  }
}

void expect_untouched(const std::vector<float>& v, const std::string& what) {
  for (float x : v) ASSERT_EQ(x, kSentinel) << what << " was written by a refused call";
}

bool must_run(DType t) {
#if defined(__x86_64__)
  return t == DType::BF16 && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

class Conv2dLowp : public ::testing::TestWithParam<DType> {};

TEST_P(Conv2dLowp, ForwardAndEachGradient) {
  const DType t = GetParam();
  uint32_t seed = 1;
  for (const Case& tc : kCases)
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(std::string(tc.name) + (with_bias ? " with bias" : " without bias") + " " +
                   dtype_name(t));
      const ConvGeometry g = geometry(tc);
      const auto x = random_bits(t, g.n * g.c * g.h * g.w, seed++);
      const auto w = random_bits(t, g.k * g.c * g.r * g.s, seed++);
      const auto dy = random_bits(t, g.n * g.k * g.p * g.q, seed++);
      std::vector<float> b;
      if (with_bias)
        for (uint16_t v : random_bits(DType::BF16, g.k, seed++)) b.push_back(bf16_to_f32(v));
      const Reference ref(g, widen(t, x), widen(t, w), std::vector<double>(b.begin(), b.end()),
                          widen(t, dy));
      const float* bp = with_bias ? b.data() : nullptr;

      std::vector<float> y(ref.y.value.size(), kSentinel);
      const bool ran =
          cpu::conv2d_forward_lowp_vendor(cpu::Backend{}, t, x.data(), w.data(), bp, y.data(), g);
      if (must_run(t)) {
        EXPECT_TRUE(ran) << "oneDNN refused bf16 on a CPU with AVX512_BF16";
      }
      if (ran) expect_close(y, ref.y, "y");
      else expect_untouched(y, "y");

      // Each gradient alone, then all three in one call.
      struct Want {
        bool dx, dw, db;
      };
      for (const Want want : {Want{true, false, false}, Want{false, true, false},
                              Want{false, false, true}, Want{true, true, true}}) {
        if (want.db && !with_bias) continue;
        std::vector<float> dx(ref.dx.value.size(), kSentinel), dw(ref.dw.value.size(), kSentinel),
            db(ref.db.value.size(), kSentinel);
        const bool ran_bwd = cpu::conv2d_backward_lowp_vendor(
            cpu::Backend{}, t, x.data(), dy.data(), w.data(), want.dx ? dx.data() : nullptr,
            want.dw ? dw.data() : nullptr, want.db ? db.data() : nullptr, g);
        if (must_run(t)) {
          EXPECT_TRUE(ran_bwd) << "oneDNN refused bf16 backward";
        }
        const std::string which = std::string(want.dx ? " dx" : "") + (want.dw ? " dw" : "") +
                                  (want.db ? " db" : "");
        if (ran_bwd) {
          if (want.dx) expect_close(dx, ref.dx, "dx of" + which);
          if (want.dw) expect_close(dw, ref.dw, "dw of" + which);
          if (want.db) expect_close(db, ref.db, "db of" + which);
        }
        // Outputs not asked for (or all, after a refusal) are never written.
        if (!ran_bwd || !want.dx) expect_untouched(dx, "dx of" + which);
        if (!ran_bwd || !want.dw) expect_untouched(dw, "dw of" + which);
        if (!ran_bwd || !want.db) expect_untouched(db, "db of" + which);
      }
    }
}

// With g.y_lowp (16-bit activations under autocast) y and dx come out in the inputs' dtype:
// each element is its f32 sum rounded once, so it lies within half an ulp of the 16-bit format
// of that sum, which lies within the f32 bound of the exact value:
//   |got - want| <= 1e-5 * bound + ulp(|want| + 1e-5 * bound) / 2.
// dw and db stay f32 (expect_close).
void expect_rounded_once(DType t, const std::vector<uint16_t>& got, const Ref& want,
                         const std::string& what) {
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 3; ++i) {
    const double f32_err = 1e-5 * want.bound[i];
    const double limit = f32_err + testing::ulp_of(t, std::fabs(want.value[i]) + f32_err) / 2;
    const double value = from_bits(t, got[i]);
    if (!(std::fabs(value - want.value[i]) <= limit)) {
      ++bad;
      ADD_FAILURE() << what << "[" << i << "] = " << value << ", want " << want.value[i]
                    << " within " << limit;
    }
  }
}

TEST_P(Conv2dLowp, SixteenBitOutputsAreTheSumsRoundedOnce) {
  const DType t = GetParam();
  uint32_t seed = 100;
  for (const Case& tc : kCases) {
    SCOPED_TRACE(std::string(tc.name) + " " + dtype_name(t));
    ConvGeometry g = geometry(tc);
    g.y_lowp = true;
    const auto x = random_bits(t, g.n * g.c * g.h * g.w, seed++);
    const auto w = random_bits(t, g.k * g.c * g.r * g.s, seed++);
    const auto dy = random_bits(t, g.n * g.k * g.p * g.q, seed++);
    const Reference ref(g, widen(t, x), widen(t, w), {}, widen(t, dy));
    const uint16_t kUnwritten = 0x7fff;  // a NaN in both formats
    std::vector<uint16_t> y(ref.y.value.size(), kUnwritten);
    const bool ran =
        cpu::conv2d_forward_lowp_vendor(cpu::Backend{}, t, x.data(), w.data(), nullptr, y.data(), g);
    if (must_run(t)) {
      EXPECT_TRUE(ran) << "oneDNN refused a bf16 output on a CPU with AVX512_BF16";
    }
    if (!ran) continue;  // the op then rounds the f32 kernels' results (conv2d_lowp.cpp)
    expect_rounded_once(t, y, ref.y, "y");
    std::vector<uint16_t> dx(ref.dx.value.size(), kUnwritten);
    std::vector<float> dw(ref.dw.value.size(), kSentinel);
    if (cpu::conv2d_backward_lowp_vendor(cpu::Backend{}, t, x.data(), dy.data(), w.data(),
                                         dx.data(), dw.data(), nullptr, g)) {
      expect_rounded_once(t, dx, ref.dx, "dx");
      expect_close(dw, ref.dw, "dw");
    }
  }
}

TEST_P(Conv2dLowp, RefusesBlockedLayoutsAndOtherDtypes) {
  ConvGeometry g = geometry(kCases[0]);
  g.x_blocked = true;
  const std::vector<uint16_t> x(512), w(512);
  std::vector<float> y(512);
  EXPECT_THROW(cpu::conv2d_forward_lowp_vendor(cpu::Backend{}, GetParam(), x.data(), w.data(),
                                               nullptr, y.data(), g),
               Error);
  g.x_blocked = false;
  EXPECT_THROW(cpu::conv2d_forward_lowp_vendor(cpu::Backend{}, DType::F32, x.data(), w.data(),
                                               nullptr, y.data(), g),
               Error);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Conv2dLowp, ::testing::Values(DType::BF16, DType::F16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

}  // namespace
}  // namespace kiln
