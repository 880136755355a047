// gemm_lowp_test.cpp: cpu::gemm_lowp (engine/gemm_lowp_cpu.h), bf16/f16 inputs with f32 sums.
// Every path (oneDNN, the hand AVX-512 BF16 kernel, convert+f32) that this CPU can run, for each
// dtype, against a double-precision reference computed from the same rounded inputs:
//   |C - C_ref| <= 1e-5 * sum_k |A[i][k]| |B[k][j]|      per element,
// the error of an f32 sum (unit roundoff 6e-8 times a growth far below K for random signs).
// Shapes: all four transpositions; sizes of 1, odd sizes, K odd (vdpbf16ps works on pairs of
// k), edges of the hand kernel's 6 x 64 micro-tile and 96 x 256 blocks, and K past its 256
// slice (the slices after the first add to C). C starts as NaN: a path that reads C fails.
// Small-integer inputs give exact sums on every path: the packing is checked bit for bit.
#include <gtest/gtest.h>

#include "support/low_precision_bits.h"

#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "engine/gemm_bf16_avx512.h"
#include "engine/gemm_lowp_cpu.h"
#include "engine/host_device.h"
#include "engine/impl.h"

namespace kiln {
namespace {

using cpu::LowpGemmPath;

struct Shape {
  int64_t m, n, k;
};

// Sizes of 1, odd sizes and odd K, a full micro-tile (6 x 64) and one past it, more than one
// block of C (96 rows, 256 columns), K past one slice (256) and odd.
const Shape kShapes[] = {{1, 1, 1},     {1, 7, 3},    {7, 1, 5},     {7, 33, 2},
                         {33, 7, 1},    {6, 64, 16},  {7, 65, 33},   {64, 64, 64},
                         {13, 130, 130}, {97, 257, 7}, {130, 33, 257}, {100, 300, 301}};

using testing::from_bits;
using testing::random_bits;
using testing::to_bits;


// n small integers in [-4, 4]: every product and every partial sum is exact in f32.
std::vector<uint16_t> integer_bits(DType t, int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(-4, 4);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (uint16_t& x : v) x = to_bits(t, static_cast<float>(dist(gen)));
  return v;
}

struct Reference {
  std::vector<double> c, bound;  // op(A) op(B), and sum |a| |b| per element
};

Reference reference(DType t, bool ta, bool tb, const Shape& s, const std::vector<uint16_t>& a,
                    const std::vector<uint16_t>& b) {
  Reference r{std::vector<double>(static_cast<size_t>(s.m * s.n)),
              std::vector<double>(static_cast<size_t>(s.m * s.n))};
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      double sum = 0, abs_sum = 0;
      for (int64_t kk = 0; kk < s.k; ++kk) {
        const double x = from_bits(t, a[static_cast<size_t>(ta ? kk * s.m + i : i * s.k + kk)]);
        const double y = from_bits(t, b[static_cast<size_t>(tb ? j * s.k + kk : kk * s.n + j)]);
        sum += x * y;
        abs_sum += std::fabs(x * y);
      }
      r.c[static_cast<size_t>(i * s.n + j)] = sum;
      r.bound[static_cast<size_t>(i * s.n + j)] = abs_sum;
    }
  return r;
}

std::string describe(LowpGemmPath p, DType t, bool ta, bool tb, const Shape& s) {
  return std::string(cpu::lowp_gemm_path_name(p)) + " " + dtype_name(t) + " ta=" +
         std::to_string(ta) + " tb=" + std::to_string(tb) + " m=" + std::to_string(s.m) +
         " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k);
}

// A C buffer that fails every comparison unless the path writes each element.
std::vector<float> nan_filled(const Shape& s) {
  return std::vector<float>(static_cast<size_t>(s.m * s.n),
                            std::numeric_limits<float>::quiet_NaN());
}

struct PathCase {
  LowpGemmPath path;
  DType dtype;
};

void PrintTo(const PathCase& c, std::ostream* os) {
  *os << cpu::lowp_gemm_path_name(c.path) << " " << dtype_name(c.dtype);
}

class GemmLowpPath : public ::testing::TestWithParam<PathCase> {
 protected:
  void SetUp() override {
    if (!cpu::lowp_gemm_path_available(GetParam().path, GetParam().dtype))
      GTEST_SKIP() << cpu::lowp_gemm_path_name(GetParam().path) << " cannot run "
                   << dtype_name(GetParam().dtype) << " on this CPU";
  }
};

TEST_P(GemmLowpPath, MatchesDoubleReferenceWithinF32Rounding) {
  const auto [path, t] = GetParam();
  uint32_t seed = 1;
  for (const Shape& s : kShapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const auto a = random_bits(t, s.m * s.k, seed++), b = random_bits(t, s.k * s.n, seed++);
        std::vector<float> c = nan_filled(s);
        cpu::gemm_lowp_with(path, t, ta, tb, s.m, s.n, s.k, a.data(), b.data(), c.data());
        const Reference r = reference(t, ta, tb, s, a, b);
        int bad = 0;
        for (size_t e = 0; e < c.size() && bad < 3; ++e) {
          const double err = std::fabs(c[e] - r.c[e]);
          if (!(err <= 1e-5 * r.bound[e])) {  // NaN fails
            ++bad;
            ADD_FAILURE() << describe(path, t, ta, tb, s) << ": C[" << e / s.n << "]["
                          << e % s.n << "] = " << c[e] << ", want " << r.c[e] << " (error "
                          << err << ", bound " << 1e-5 * r.bound[e] << ")";
          }
        }
      }
}

TEST_P(GemmLowpPath, SmallIntegersAreExact) {
  const auto [path, t] = GetParam();
  uint32_t seed = 100;
  for (const Shape& s : kShapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const auto a = integer_bits(t, s.m * s.k, seed++), b = integer_bits(t, s.k * s.n, seed++);
        std::vector<float> c = nan_filled(s);
        cpu::gemm_lowp_with(path, t, ta, tb, s.m, s.n, s.k, a.data(), b.data(), c.data());
        const Reference r = reference(t, ta, tb, s, a, b);
        int bad = 0;
        for (size_t e = 0; e < c.size() && bad < 3; ++e)
          if (!(c[e] == r.c[e])) {
            ++bad;
            ADD_FAILURE() << describe(path, t, ta, tb, s) << ": C[" << e / s.n << "]["
                          << e % s.n << "] = " << c[e] << ", want exactly " << r.c[e];
          }
      }
}

// K = 0 is the empty sum (C = 0); M or N = 0 writes nothing.
TEST_P(GemmLowpPath, EmptyProducts) {
  const auto [path, t] = GetParam();
  const uint16_t one = to_bits(t, 1.0f);
  std::vector<float> c(6, std::numeric_limits<float>::quiet_NaN());
  cpu::gemm_lowp_with(path, t, false, false, 2, 3, 0, &one, &one, c.data());
  for (float v : c) EXPECT_EQ(v, 0.0f);
  std::vector<float> untouched(1, 7.0f);
  cpu::gemm_lowp_with(path, t, false, false, 0, 1, 1, &one, &one, untouched.data());
  cpu::gemm_lowp_with(path, t, false, false, 1, 0, 1, &one, &one, untouched.data());
  EXPECT_EQ(untouched[0], 7.0f);
}

INSTANTIATE_TEST_SUITE_P(
    AllPaths, GemmLowpPath,
    ::testing::Values(PathCase{LowpGemmPath::OneDnn, DType::BF16},
                      PathCase{LowpGemmPath::OneDnn, DType::F16},
                      PathCase{LowpGemmPath::Avx512Bf16, DType::BF16},
                      PathCase{LowpGemmPath::ConvertF32, DType::BF16},
                      PathCase{LowpGemmPath::ConvertF32, DType::F16}),
    [](const ::testing::TestParamInfo<PathCase>& info) {
      std::string name = std::string(cpu::lowp_gemm_path_name(info.param.path)) + "_" +
                         dtype_name(info.param.dtype);
      for (char& ch : name)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return name;
    });

// The path each twin takes, and that it computes what that path computes.
TEST(GemmLowp, ChoosesThePathItReports) {
  EXPECT_STREQ(cpu::gemm_lowp_path(DType::BF16, Impl::Hand),
               cpu::cpu_has_avx512_bf16() ? "avx512-bf16" : "convert+f32");
  EXPECT_STREQ(cpu::gemm_lowp_path(DType::F16, Impl::Hand), "convert+f32");  // no hand f16
  for (DType t : {DType::BF16, DType::F16})
    EXPECT_STREQ(cpu::gemm_lowp_path(t, Impl::Vendor),
                 cpu::lowp_gemm_path_available(LowpGemmPath::OneDnn, t) ? "onednn" : "convert+f32");

  const Shape s{37, 70, 45};
  for (DType t : {DType::BF16, DType::F16})
    for (Impl impl : {Impl::Hand, Impl::Vendor}) {
      const auto a = random_bits(t, s.m * s.k, 7), b = random_bits(t, s.k * s.n, 8);
      std::vector<float> c = nan_filled(s);
      if (impl == Impl::Vendor)
        cpu::gemm_lowp_vendor(cpu::Backend{}, t, true, false, s.m, s.n, s.k, a.data(), b.data(),
                              c.data());
      else
        cpu::gemm_lowp(cpu::Backend{}, t, true, false, s.m, s.n, s.k, a.data(), b.data(), c.data());
      const Reference r = reference(t, true, false, s, a, b);
      for (size_t e = 0; e < c.size(); ++e)
        ASSERT_LE(std::fabs(c[e] - r.c[e]), 1e-5 * r.bound[e])
            << dtype_name(t) << " " << impl_name(impl) << " element " << e;
    }
}

// This CPU has AVX512_BF16 where the x86 feature list says so: the hand path is not silently
// skipped on a machine that can run it.
TEST(GemmLowp, HandKernelAvailableWhereTheCpuHasIt) {
#if defined(__x86_64__)
  EXPECT_EQ(cpu::lowp_gemm_path_available(LowpGemmPath::Avx512Bf16, DType::BF16),
            static_cast<bool>(__builtin_cpu_supports("avx512bf16")));
#endif
  EXPECT_FALSE(cpu::lowp_gemm_path_available(LowpGemmPath::Avx512Bf16, DType::F16));
}

TEST(GemmLowp, RefusesWhatItCannotRun) {
  float c = 0;
  const uint16_t x = 0;
  EXPECT_THROW(cpu::gemm_lowp(cpu::Backend{}, DType::F32, false, false, 1, 1, 1, &x, &x, &c),
               Error);
  EXPECT_THROW(
      cpu::gemm_lowp_vendor(cpu::Backend{}, DType::F32, false, false, 1, 1, 1, &x, &x, &c), Error);
  EXPECT_THROW(cpu::gemm_lowp_with(LowpGemmPath::Avx512Bf16, DType::F16, false, false, 1, 1, 1,
                                   &x, &x, &c),
               Error);
}

}  // namespace
}  // namespace kiln
