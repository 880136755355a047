// conv2d_cpu_nhwc_test.cpp: the hand CPU convolution kernels (layers/conv2d_cpu.cpp) on
// channels-last activations (g.x_nhwc) and KRSC weights (g.w_nhwc), in every combination,
// against the NCHW kernels with KCRS weights in double:
//   - a weight in the other order than the kernels want is repacked, nothing else changes: the
//     results are bit-identical to the same kernels given the repacked weight;
//   - NHWC sums the same products as NCHW in another order: each element within the rounding
//     error bound of a sum of m products, |error| <= m * u * sum |products| (Higham, "Accuracy
//     and Stability of Numerical Algorithms", 2002, section 3.1), for each of the two, where
//     sum |products| is the same kernel run on the absolute values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/backend.h"
#include "layers/conv2d_kernels.h"

namespace kiln {
namespace {

struct Case {
  int64_t n, c, h, w, k, r, s, stride, pad;
};

ConvGeometry geometry(const Case& t, bool x_nhwc, bool w_nhwc) {
  ConvGeometry g{};
  g.n = t.n, g.c = t.c, g.h = t.h, g.w = t.w, g.k = t.k, g.r = t.r, g.s = t.s;
  g.stride = t.stride, g.pad = t.pad;
  g.p = (t.h + 2 * t.pad - t.r) / t.stride + 1;
  g.q = (t.w + 2 * t.pad - t.s) / t.stride + 1;
  g.x_nhwc = g.y_nhwc = x_nhwc;
  g.w_nhwc = w_nhwc;
  return g;
}

// Values exactly representable in float, so the f32 kernels see the f64 case's inputs.
std::vector<double> random_values(size_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<double> v(count);
  for (double& e : v) e = dist(gen);
  return v;
}

// (A, B, D, E) -> (A, D, E, B): NCHW -> NHWC of activations, KCRS -> KRSC of weights.
std::vector<double> to_last(const std::vector<double>& v, int64_t a, int64_t b, int64_t de) {
  std::vector<double> out(v.size());
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j)
      for (int64_t l = 0; l < de; ++l) out[(i * de + l) * b + j] = v[(i * b + j) * de + l];
  return out;
}

std::vector<double> abs_of(std::vector<double> v) {
  for (double& e : v) e = std::abs(e);
  return v;
}

template <typename T>
std::vector<T> as(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

// The four results of one case: y, dx, dw, db, each in the byte order g asks for.
template <typename T>
struct Results {
  std::vector<T> y, dx, dw, db;
};

template <typename T>
Results<T> run(const ConvGeometry& g, const std::vector<double>& x, const std::vector<double>& w,
               const std::vector<double>& b, const std::vector<double>& dy) {
  const std::vector<T> xt = as<T>(x), wt = as<T>(w), bt = as<T>(b), dyt = as<T>(dy);
  Results<T> r;
  r.y.resize(dy.size());
  r.dx.resize(x.size());
  r.dw.resize(w.size());
  r.db.resize(b.size());
  cpu::conv2d_forward(cpu::Backend{}, xt.data(), wt.data(), bt.data(), r.y.data(), g);
  cpu::conv2d_backward_data(cpu::Backend{}, dyt.data(), wt.data(), r.dx.data(), g);
  cpu::conv2d_backward_weight(cpu::Backend{}, xt.data(), dyt.data(), r.dw.data(), r.db.data(), g);
  return r;
}

// |got - want| <= 2 * m * u * bound elementwise (each side's error is at most m * u * bound).
template <typename T>
::testing::AssertionResult within(const std::vector<T>& got, const std::vector<double>& want,
                                  const std::vector<double>& bound, int64_t m, double u) {
  for (size_t i = 0; i < want.size(); ++i) {
    const double tol = 2.0 * static_cast<double>(m) * u * bound[i] + 1e-300;
    if (!(std::abs(static_cast<double>(got[i]) - want[i]) <= tol))
      return ::testing::AssertionFailure() << "element " << i << ": " << got[i] << " vs "
                                           << want[i] << ", tolerance " << tol;
  }
  return ::testing::AssertionSuccess();
}

void check_case(const Case& t) {
  SCOPED_TRACE(::testing::Message() << "n=" << t.n << " c=" << t.c << " " << t.h << "x" << t.w
                                    << " k=" << t.k << " " << t.r << "x" << t.s << " stride="
                                    << t.stride << " pad=" << t.pad);
  const ConvGeometry nchw = geometry(t, false, false);
  const int64_t hw = t.h * t.w, pq = nchw.p * nchw.q, rs = t.r * t.s;
  const std::vector<double> x = random_values(t.n * t.c * hw, 1);
  const std::vector<double> w = random_values(t.k * t.c * rs, 2);
  const std::vector<double> b = random_values(t.k, 3);
  const std::vector<double> dy = random_values(t.n * t.k * pq, 4);
  // The reference, and the bounds: the same kernels on the absolute values.
  const Results<double> ref = run<double>(nchw, x, w, b, dy);
  const Results<double> mag = run<double>(nchw, abs_of(x), abs_of(w), abs_of(b), abs_of(dy));
  // The reference in channels-last order, and KRSC.
  const auto x_last = [&](const std::vector<double>& v, int64_t ch, int64_t plane) {
    return to_last(v, t.n, ch, plane);
  };
  const auto w_last = [&](const std::vector<double>& v) { return to_last(v, t.k, t.c, rs); };
  const std::vector<double> y_cl = x_last(ref.y, t.k, pq), dx_cl = x_last(ref.dx, t.c, hw);
  const std::vector<double> y_bound = x_last(mag.y, t.k, pq), dx_bound = x_last(mag.dx, t.c, hw);

  // NCHW with a KRSC weight: the weight repacked, the same sums: bit-identical.
  const Results<double> nchw_krsc =
      run<double>(geometry(t, false, true), x, w_last(w), b, dy);
  EXPECT_EQ(nchw_krsc.y, ref.y);
  EXPECT_EQ(nchw_krsc.dx, ref.dx);
  EXPECT_EQ(nchw_krsc.dw, w_last(ref.dw));
  EXPECT_EQ(nchw_krsc.db, ref.db);

  const double u64 = std::ldexp(1.0, -53), u32 = std::ldexp(1.0, -24);
  const std::vector<double> x_cl = x_last(x, t.c, hw), dy_cl = x_last(dy, t.k, pq);
  // Sums of m products: forward c*r*s (and the bias), dx k*r*s, dw n*p*q, db n*p*q.
  const int64_t m_y = t.c * rs + 1, m_dx = t.k * rs, m_dw = t.n * pq;
  const auto check = [&](const auto& got, bool w_nhwc, double u) {
    EXPECT_TRUE(within(got.y, y_cl, y_bound, m_y, u));
    EXPECT_TRUE(within(got.dx, dx_cl, dx_bound, m_dx, u));
    EXPECT_TRUE(within(got.dw, w_nhwc ? w_last(ref.dw) : ref.dw,
                       w_nhwc ? w_last(mag.dw) : mag.dw, m_dw, u));
    EXPECT_TRUE(within(got.db, ref.db, mag.db, m_dw, u));
  };
  // f64 and f32 NHWC, the weight in either order; the two orders bit-identical to each other.
  const Results<double> d_kcrs = run<double>(geometry(t, true, false), x_cl, w, b, dy_cl);
  const Results<double> d_krsc = run<double>(geometry(t, true, true), x_cl, w_last(w), b, dy_cl);
  check(d_kcrs, false, u64);
  check(d_krsc, true, u64);
  const Results<float> f_kcrs = run<float>(geometry(t, true, false), x_cl, w, b, dy_cl);
  const Results<float> f_krsc = run<float>(geometry(t, true, true), x_cl, w_last(w), b, dy_cl);
  check(f_kcrs, false, u32);
  check(f_krsc, true, u32);
  EXPECT_EQ(f_krsc.y, f_kcrs.y);
  EXPECT_EQ(f_krsc.dx, f_kcrs.dx);
  EXPECT_EQ(f_krsc.dw, as<float>(w_last(std::vector<double>(f_kcrs.dw.begin(), f_kcrs.dw.end()))));
  EXPECT_EQ(f_krsc.db, f_kcrs.db);
  EXPECT_EQ(d_krsc.y, d_kcrs.y);
  EXPECT_EQ(d_krsc.dw, w_last(d_kcrs.dw));

  // Only one of dw and db (the other null), and backward-weight without x for a lone db.
  const ConvGeometry cl = geometry(t, true, false);
  std::vector<double> dw(w.size()), db(b.size());
  cpu::conv2d_backward_weight(cpu::Backend{}, x_cl.data(), dy_cl.data(), dw.data(),
                              static_cast<double*>(nullptr), cl);
  EXPECT_EQ(dw, d_kcrs.dw);
  cpu::conv2d_backward_weight(cpu::Backend{}, static_cast<const double*>(nullptr), dy_cl.data(),
                              static_cast<double*>(nullptr), db.data(), cl);
  EXPECT_EQ(db, d_kcrs.db);
}

TEST(Conv2dCpuNhwc, MatchesNchwInEveryWeightOrder) {
  check_case({2, 5, 7, 6, 4, 3, 3, 1, 1});     // 3x3, stride 1, pad 1
  check_case({2, 6, 8, 7, 5, 1, 1, 2, 0});     // 1x1 stride 2: a ResNet downsample
  check_case({2, 4, 5, 5, 3, 1, 1, 1, 0});     // 1x1 stride 1: x is the column matrix
  check_case({2, 3, 11, 10, 8, 7, 7, 2, 3});   // a stem: 7x7 stride 2 pad 3, 3 channels
  check_case({3, 3, 6, 9, 4, 2, 3, 2, 1});     // a non-square filter, stride 2
  check_case({1, 2, 3, 3, 2, 3, 3, 1, 2});     // padding wider than the image's border
  check_case({4, 16, 16, 16, 16, 3, 3, 1, 1});  // big enough to split over threads
}

}  // namespace
}  // namespace kiln
