// sim_cublas_test.cpp: the simulated cuBLAS (engine/cuda/sim/cublas.h) against a naive
// column-major reference: every transpose combination, leading dimensions larger than the
// rows (and the gaps between columns left untouched), alpha and beta (beta = 0 over NaN), K = 0,
// SGEMM, DGEMM and GemmEx (f16 / bf16 inputs with an f32 or 16-bit C, f32 inputs), TF32 math;
// the documented argument errors (GemmEx's unsupported type combinations), the simulator's
// range checks, the handle's stream, and the error message Kiln builds from them
// (engine/cuda/blas.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/cuda/blas.h"
#include "engine/cuda/sim/library.h"
#include "engine/error.h"
#include "engine/host_device.h"
#include "sim_vendor_test_util.h"

namespace {

using kiln::sim_test::DeviceBuffer;
using kiln::sim_test::near_all;
using kiln::sim_test::random_values;

class SimCublas : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cublasCreate(&handle_), CUBLAS_STATUS_SUCCESS);
  }
  void TearDown() override {
    EXPECT_EQ(cublasDestroy(handle_), CUBLAS_STATUS_SUCCESS);
    (void)cudaSetDevice(0);
  }
  cublasHandle_t handle_ = nullptr;
};

// One GEMM case: op(A) m x k, op(B) k x n, leading dimensions padded by the given amounts.
struct Case {
  cublasOperation_t ta, tb;
  int m, n, k;
  int pad_a, pad_b, pad_c;
  double alpha, beta;
};

// C = alpha op(A) op(B) + beta C in double, column-major, C (m x n) with leading dim ldc.
template <typename T>
std::vector<double> reference(const Case& t, const std::vector<T>& a, int lda,
                              const std::vector<T>& b, int ldb, const std::vector<T>& c0, int ldc,
                              bool tf32 = false) {
  auto val = [&](T v) {
    if constexpr (std::is_same_v<T, float>)
      if (tf32) return static_cast<double>(kiln::sim::round_tf32(v));
    return static_cast<double>(v);
  };
  std::vector<double> c(c0.begin(), c0.end());
  for (int j = 0; j < t.n; ++j)
    for (int i = 0; i < t.m; ++i) {
      double acc = 0;
      for (int p = 0; p < t.k; ++p) {
        const T av = t.ta == CUBLAS_OP_N ? a[p * lda + i] : a[i * lda + p];
        const T bv = t.tb == CUBLAS_OP_N ? b[j * ldb + p] : b[p * ldb + j];
        acc += val(av) * val(bv);
      }
      double& cij = c[static_cast<size_t>(j) * ldc + i];
      cij = t.alpha * acc + (t.beta == 0 ? 0.0 : t.beta * cij);
    }
  return c;
}

template <typename T>
cublasStatus_t gemm(cublasHandle_t h, const Case& t, const T* a, int lda, const T* b, int ldb,
                    T* c, int ldc) {
  const T alpha = static_cast<T>(t.alpha), beta = static_cast<T>(t.beta);
  if constexpr (std::is_same_v<T, float>)
    return cublasSgemm(h, t.ta, t.tb, t.m, t.n, t.k, &alpha, a, lda, b, ldb, &beta, c, ldc);
  else
    return cublasDgemm(h, t.ta, t.tb, t.m, t.n, t.k, &alpha, a, lda, b, ldb, &beta, c, ldc);
}

// Runs one case and compares all of C (the gaps between columns must keep their value).
template <typename T>
void check(cublasHandle_t h, const Case& t, double rtol) {
  const int a_rows = t.ta == CUBLAS_OP_N ? t.m : t.k, a_cols = t.ta == CUBLAS_OP_N ? t.k : t.m;
  const int b_rows = t.tb == CUBLAS_OP_N ? t.k : t.n, b_cols = t.tb == CUBLAS_OP_N ? t.n : t.k;
  const int lda = std::max(1, a_rows + t.pad_a), ldb = std::max(1, b_rows + t.pad_b);
  const int ldc = std::max(1, t.m + t.pad_c);
  const std::vector<T> a = random_values<T>(static_cast<size_t>(lda) * a_cols, 1);
  const std::vector<T> b = random_values<T>(static_cast<size_t>(ldb) * b_cols, 2);
  std::vector<T> c0 = random_values<T>(static_cast<size_t>(ldc) * t.n, 3);
  if (t.beta == 0) std::fill(c0.begin(), c0.end(), std::numeric_limits<T>::quiet_NaN());
  DeviceBuffer<T> da(a), db(b), dc(c0);
  ASSERT_EQ(gemm<T>(h, t, da.get(), lda, db.get(), ldb, dc.get(), ldc), CUBLAS_STATUS_SUCCESS)
      << kiln::sim::last_library_error();
  std::vector<double> want = reference(t, a, lda, b, ldb, c0, ldc);
  std::vector<T> got = dc.download();
  // The gaps (rows m..ldc-1) are not touched: compare them exactly, NaN included.
  for (int j = 0; j < t.n; ++j)
    for (int i = t.m; i < ldc; ++i) {
      const size_t at = static_cast<size_t>(j) * ldc + i;
      EXPECT_TRUE(std::memcmp(&got[at], &c0[at], sizeof(T)) == 0) << "gap element " << at;
      got[at] = 0, want[at] = 0;
    }
  const std::string what = std::string(t.ta == CUBLAS_OP_N ? "N" : "T") +
                           (t.tb == CUBLAS_OP_N ? "N" : "T") + " m" + std::to_string(t.m) +
                           " n" + std::to_string(t.n) + " k" + std::to_string(t.k) + " beta " +
                           std::to_string(t.beta);
  EXPECT_TRUE(near_all(what, got, want, rtol));
}

template <typename T>
void all_cases(cublasHandle_t h, double rtol) {
  const cublasOperation_t ops[] = {CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C};
  for (cublasOperation_t ta : ops)
    for (cublasOperation_t tb : ops)
      for (double beta : {0.0, 0.5})
        for (const auto& s : {std::array<int, 3>{5, 7, 3}, std::array<int, 3>{1, 1, 1},
                              std::array<int, 3>{33, 17, 40}})
          check<T>(h, {ta, tb, s[0], s[1], s[2], 2, 1, 3, 1.5, beta}, rtol);
  // Tight leading dimensions too.
  check<T>(h, {CUBLAS_OP_T, CUBLAS_OP_N, 9, 4, 6, 0, 0, 0, -1.0, 2.0}, rtol);
}

TEST_F(SimCublas, SgemmMatchesReference) { all_cases<float>(handle_, 1e-5); }
TEST_F(SimCublas, DgemmMatchesReference) { all_cases<double>(handle_, 1e-13); }

TEST_F(SimCublas, KZeroOrAlphaZeroScalesCWithoutReadingAB) {
  // k = 0: C = beta C, and A and B may be null (not read); beta = 0 writes zeros over NaN.
  DeviceBuffer<float> c(6);
  const float alpha = 1, zero = 0, half = 0.5f;
  ASSERT_EQ(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 3, 0, &alpha, nullptr, 2, nullptr, 1,
                        &zero, c.get(), 2),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(c.download(), std::vector<float>(6, 0.0f));
  c.upload(std::vector<float>(6, 4.0f));
  DeviceBuffer<float> a(4), b(6);  // NaN: alpha = 0 must not read them
  ASSERT_EQ(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 3, 2, &zero, a.get(), 2, b.get(), 2,
                        &half, c.get(), 2),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(c.download(), std::vector<float>(6, 2.0f));
}

TEST_F(SimCublas, Tf32MathRoundsInputsTo10MantissaBits) {
  // 1 + 2^-12 needs 12 mantissa bits: FP32 keeps it, TF32 rounds it to 1.
  const float x = 1.0f + std::ldexp(1.0f, -12);
  DeviceBuffer<float> a(std::vector<float>{x}), b(std::vector<float>{x}), c(1);
  const float one = 1, zero = 0;
  auto product = [&](cublasMath_t mode) {
    EXPECT_EQ(cublasSetMathMode(handle_, mode), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, a.get(), 1, b.get(), 1,
                          &zero, c.get(), 1),
              CUBLAS_STATUS_SUCCESS);
    return c.download()[0];
  };
  EXPECT_EQ(product(CUBLAS_DEFAULT_MATH), x * x);
  EXPECT_EQ(product(CUBLAS_PEDANTIC_MATH), x * x);
  EXPECT_EQ(product(CUBLAS_TF32_TENSOR_OP_MATH), 1.0f);
  cublasMath_t mode;
  ASSERT_EQ(cublasGetMathMode(handle_, &mode), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(mode, CUBLAS_TF32_TENSOR_OP_MATH);
  // DGEMM ignores TF32.
  DeviceBuffer<double> ad(std::vector<double>{x}), cd(1);
  const double oned = 1, zerod = 0;
  ASSERT_EQ(cublasDgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &oned, ad.get(), 1, ad.get(),
                        1, &zerod, cd.get(), 1),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cd.download()[0], static_cast<double>(x) * x);
  // A whole product under TF32 matches the reference on rounded inputs, not the FP32 one.
  const Case t{CUBLAS_OP_N, CUBLAS_OP_T, 20, 30, 50, 0, 0, 0, 1.0, 0.0};
  const std::vector<float> av = random_values<float>(20 * 50, 7), bv = random_values<float>(30 * 50, 8);
  DeviceBuffer<float> a2(av), b2(bv), c2(20 * 30);
  ASSERT_EQ(gemm<float>(handle_, t, a2.get(), 20, b2.get(), 30, c2.get(), 20), CUBLAS_STATUS_SUCCESS);
  const std::vector<float> got = c2.download();
  const std::vector<float> c0(20 * 30, 0.0f);
  EXPECT_TRUE(near_all("tf32", got, reference(t, av, 20, bv, 30, c0, 20, true), 1e-5));
  EXPECT_FALSE(near_all("tf32 vs fp32", got, reference(t, av, 20, bv, 30, c0, 20, false), 1e-5));
  EXPECT_EQ(cublasSetMathMode(handle_, CUBLAS_TENSOR_OP_MATH), CUBLAS_STATUS_NOT_SUPPORTED);
}

TEST_F(SimCublas, DocumentedArgumentErrors) {
  DeviceBuffer<float> a(12), b(12), c(12);
  const float one = 1, zero = 0;
  auto sgemm = [&](cublasHandle_t h, cublasOperation_t ta, int m, int n, int k, const float* al,
                   int lda, int ldb, int ldc) {
    return cublasSgemm(h, ta, CUBLAS_OP_N, m, n, k, al, a.get(), lda, b.get(), ldb, &zero, c.get(),
                       ldc);
  };
  EXPECT_EQ(sgemm(handle_, CUBLAS_OP_N, 3, 4, 3, &one, 3, 3, 3), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(sgemm(nullptr, CUBLAS_OP_N, 3, 4, 3, &one, 3, 3, 3), CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(sgemm(handle_, CUBLAS_OP_N, 3, 4, 3, &one, 2, 3, 3), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_NE(std::string(kiln::sim::last_library_error()).find("lda = 2"), std::string::npos);
  EXPECT_EQ(sgemm(handle_, CUBLAS_OP_T, 3, 4, 2, &one, 1, 3, 3), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(sgemm(handle_, CUBLAS_OP_N, 3, 4, 3, &one, 3, 2, 3), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(sgemm(handle_, CUBLAS_OP_N, 3, 4, 3, &one, 3, 3, 2), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(sgemm(handle_, CUBLAS_OP_N, -1, 4, 3, &one, 3, 3, 3), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(sgemm(handle_, CUBLAS_OP_CONJG, 3, 4, 3, &one, 3, 3, 3), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(sgemm(handle_, CUBLAS_OP_N, 3, 4, 3, nullptr, 3, 3, 3), CUBLAS_STATUS_INVALID_VALUE);
  // Leading dimensions must be >= 1 even when the matrix is empty.
  EXPECT_EQ(sgemm(handle_, CUBLAS_OP_N, 0, 4, 3, &one, 0, 3, 1), CUBLAS_STATUS_INVALID_VALUE);
  cublasHandle_t dead = nullptr;
  ASSERT_EQ(cublasCreate(&dead), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasDestroy(dead), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(sgemm(dead, CUBLAS_OP_N, 3, 4, 3, &one, 3, 3, 3), CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasDestroy(dead), CUBLAS_STATUS_NOT_INITIALIZED);
}

TEST_F(SimCublas, RangesOutsideOneAllocationAreRefused) {
  // A is 4 x 3 with lda 4: it spans 12 floats. An allocation of 11 is too small by one.
  DeviceBuffer<float> small(11), a(std::vector<float>(12, 1.0f)), b(std::vector<float>(12, 1.0f));
  DeviceBuffer<float> c(16);
  const float one = 1, zero = 0;
  auto sgemm = [&](const float* pa, int lda, const float* pb, float* pc) {
    return cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 3, &one, pa, lda, pb, 3, &zero, pc,
                       4);
  };
  EXPECT_EQ(sgemm(a.get(), 4, b.get(), c.get()), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(sgemm(small.get(), 4, b.get(), c.get()), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_NE(std::string(kiln::sim::last_library_error()).find("past its end"), std::string::npos)
      << kiln::sim::last_library_error();
  // A wrong (too large) leading dimension reads past the buffer: refused, not a neighbour read.
  EXPECT_EQ(sgemm(a.get(), 5, b.get(), c.get()), CUBLAS_STATUS_INVALID_VALUE);
  // Offsets into a buffer count: C + 1 leaves 15 floats for 16.
  EXPECT_EQ(sgemm(a.get(), 4, b.get(), c.get() + 1), CUBLAS_STATUS_INVALID_VALUE);
  std::vector<float> host(16);
  EXPECT_EQ(sgemm(a.get(), 4, b.get(), host.data()), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_NE(std::string(kiln::sim::last_library_error()).find("not device memory"),
            std::string::npos);
  EXPECT_EQ(sgemm(a.get(), 4, nullptr, c.get()), CUBLAS_STATUS_INVALID_VALUE);
  // Memory of device 1 with a handle of device 0.
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  {
    DeviceBuffer<float> other(16);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    EXPECT_EQ(sgemm(a.get(), 4, b.get(), other.get()), CUBLAS_STATUS_INVALID_VALUE);
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  // A refused call queued nothing: C still holds what the successful call wrote.
  EXPECT_EQ(c.download(), std::vector<float>(16, 3.0f));
}

TEST_F(SimCublas, WorkGoesOnTheHandlesStream) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cublasSetStream(handle_, s), CUBLAS_STATUS_SUCCESS);
  cudaStream_t got = nullptr;
  ASSERT_EQ(cublasGetStream(handle_, &got), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(got, s);
  // A is written by a delayed step on s; the product queued after it on s must read the new A.
  DeviceBuffer<float> a(4), b(std::vector<float>{1, 0, 0, 1}), c(4);
  float* pa = a.get();
  kiln::sim_test::delayed_write(s, 50, [pa] {
    for (int i = 0; i < 4; ++i) pa[i] = static_cast<float>(i + 1);
  });
  const float one = 1, zero = 0;
  ASSERT_EQ(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, a.get(), 2, b.get(), 2,
                        &zero, c.get(), 2),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(c.download(), (std::vector<float>{1, 2, 3, 4}));
  // A destroyed stream, or one of another device, cannot take the work.
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, a.get(), 2, b.get(), 2,
                        &zero, c.get(), 2),
            CUBLAS_STATUS_EXECUTION_FAILED);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t s1 = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s1), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cublasSetStream(handle_, s1), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, a.get(), 2, b.get(), 2,
                        &zero, c.get(), 2),
            CUBLAS_STATUS_EXECUTION_FAILED);
  ASSERT_EQ(cublasSetStream(handle_, nullptr), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s1), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

// ---- GemmEx ---------------------------------------------------------------------------------

// A 16-bit type's bits of a float (nearest even) and back (exact): engine/host_device.h.
uint16_t to_bits(cudaDataType_t t, float v) {
  return t == CUDA_R_16F ? kiln::f32_to_f16(v) : kiln::f32_to_bf16(v);
}
double from_bits(cudaDataType_t t, uint16_t b) {
  return t == CUDA_R_16F ? kiln::f16_to_f32(b) : kiln::bf16_to_f32(b);
}

// Random values rounded to a 16-bit type: the stored bits, and the values the reference reads.
struct Values16 {
  std::vector<uint16_t> bits;
  std::vector<double> values;
};
Values16 random_16(cudaDataType_t t, size_t count, uint32_t seed) {
  Values16 v;
  for (float f : random_values<float>(count, seed)) {
    v.bits.push_back(to_bits(t, f));
    v.values.push_back(from_bits(t, v.bits.back()));
  }
  return v;
}

// One GemmEx case with 16-bit A and B of type `in` and C of type `out` (CUDA_R_32F or `in`),
// compared with the double reference on the rounded inputs, the gaps of C exactly. The sums run
// in FP32: rtol 1e-5 for an FP32 C; a 16-bit C is rounded once more, by half an ulp at most.
void check_ex(cublasHandle_t h, const Case& t, cudaDataType_t in, cudaDataType_t out) {
  const int a_rows = t.ta == CUBLAS_OP_N ? t.m : t.k, a_cols = t.ta == CUBLAS_OP_N ? t.k : t.m;
  const int b_rows = t.tb == CUBLAS_OP_N ? t.k : t.n, b_cols = t.tb == CUBLAS_OP_N ? t.n : t.k;
  const int lda = std::max(1, a_rows + t.pad_a), ldb = std::max(1, b_rows + t.pad_b);
  const int ldc = std::max(1, t.m + t.pad_c);
  const size_t c_count = static_cast<size_t>(ldc) * t.n;
  const Values16 a = random_16(in, static_cast<size_t>(lda) * a_cols, 11);
  const Values16 b = random_16(in, static_cast<size_t>(ldb) * b_cols, 12);
  DeviceBuffer<uint16_t> da(a.bits), db(b.bits);
  const float alpha = static_cast<float>(t.alpha), beta = static_cast<float>(t.beta);
  const std::string what = std::string(in == CUDA_R_16F ? "f16" : "bf16") + " -> " +
                           (out == CUDA_R_32F ? "f32 " : "16-bit ") +
                           (t.ta == CUBLAS_OP_N ? "N" : "T") + (t.tb == CUBLAS_OP_N ? "N" : "T") +
                           " m" + std::to_string(t.m) + " n" + std::to_string(t.n) + " k" +
                           std::to_string(t.k) + " beta " + std::to_string(t.beta);
  std::vector<double> got, before;  // C after and before, as doubles (NaN stays NaN)
  std::vector<double> c0_values;
  if (out == CUDA_R_32F) {
    std::vector<float> c0 = random_values<float>(c_count, 13);
    if (t.beta == 0) std::fill(c0.begin(), c0.end(), std::numeric_limits<float>::quiet_NaN());
    DeviceBuffer<float> dc(c0);
    ASSERT_EQ(cublasGemmEx(h, t.ta, t.tb, t.m, t.n, t.k, &alpha, da.get(), in, lda, db.get(), in,
                           ldb, &beta, dc.get(), out, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS)
        << what << ": " << kiln::sim::last_library_error();
    for (float v : dc.download()) got.push_back(v);
    before.assign(c0.begin(), c0.end());
  } else {
    Values16 c0 = random_16(out, c_count, 13);
    if (t.beta == 0) std::fill(c0.bits.begin(), c0.bits.end(), uint16_t{0xFFFF});  // NaN
    DeviceBuffer<uint16_t> dc(c0.bits);
    ASSERT_EQ(cublasGemmEx(h, t.ta, t.tb, t.m, t.n, t.k, &alpha, da.get(), in, lda, db.get(), in,
                           ldb, &beta, dc.get(), out, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS)
        << what << ": " << kiln::sim::last_library_error();
    for (uint16_t v : dc.download()) got.push_back(from_bits(out, v));
    for (uint16_t v : c0.bits) before.push_back(from_bits(out, v));
  }
  std::vector<double> want = reference(t, a.values, lda, b.values, ldb, before, ldc);
  for (int j = 0; j < t.n; ++j)
    for (int i = t.m; i < ldc; ++i) {  // the gaps: untouched (NaN compares as NaN)
      const size_t at = static_cast<size_t>(j) * ldc + i;
      EXPECT_TRUE(got[at] == before[at] || (std::isnan(got[at]) && std::isnan(before[at])))
          << what << ": gap element " << at;
      got[at] = 0, want[at] = 0;
    }
  const double rtol = out == CUDA_R_32F ? 1e-5 : out == CUDA_R_16F ? std::ldexp(1.0, -11)
                                                                   : std::ldexp(1.0, -8);
  EXPECT_TRUE(near_all(what, got, want, rtol));
}

TEST_F(SimCublas, GemmExSixteenBitInputsMatchReference) {
  const cublasOperation_t ops[] = {CUBLAS_OP_N, CUBLAS_OP_T};
  for (cudaDataType_t in : {CUDA_R_16F, CUDA_R_16BF})
    for (cudaDataType_t out : {CUDA_R_32F, in})
      for (cublasOperation_t ta : ops)
        for (cublasOperation_t tb : ops)
          for (double beta : {0.0, 0.5})
            for (const auto& s : {std::array<int, 3>{5, 7, 3}, std::array<int, 3>{1, 1, 1},
                                  std::array<int, 3>{33, 17, 40}})
              check_ex(handle_, {ta, tb, s[0], s[1], s[2], 2, 1, 3, 1.5, beta}, in, out);
}

TEST_F(SimCublas, GemmExRoundsA16BitCOnceToNearest) {
  // C = 1 + x with x = 0.75 ulp of 1 in the output type: nearest rounds up to 1 + ulp, where
  // truncation (or rounding the two terms separately) would give 1.
  for (cudaDataType_t t : {CUDA_R_16F, CUDA_R_16BF}) {
    const int ulp_exp = t == CUDA_R_16F ? -10 : -7;
    const float x = std::ldexp(1.0f, ulp_exp - 1) + std::ldexp(1.0f, ulp_exp - 2);
    DeviceBuffer<uint16_t> a(std::vector<uint16_t>{to_bits(t, 1.0f), to_bits(t, x)});
    DeviceBuffer<uint16_t> b(std::vector<uint16_t>{to_bits(t, 1.0f), to_bits(t, 1.0f)}), c(1);
    const float one = 1, zero = 0;
    // (1 x 2) (2 x 1): A stored 1 x 2 (lda 1), B 2 x 1.
    ASSERT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 2, &one, a.get(), t, 1, b.get(),
                           t, 2, &zero, c.get(), t, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS)
        << kiln::sim::last_library_error();
    EXPECT_EQ(from_bits(t, c.download()[0]), 1.0 + std::ldexp(1.0, ulp_exp)) << t;
  }
}

TEST_F(SimCublas, GemmExFp32FollowsTf32UnlessPedantic) {
  // 1 + 2^-12 needs 12 mantissa bits: TF32 (COMPUTE_32F under TF32 math) rounds it to 1,
  // COMPUTE_32F_PEDANTIC keeps FP32.
  const float x = 1.0f + std::ldexp(1.0f, -12);
  DeviceBuffer<float> a(std::vector<float>{x}), c(1);
  const float one = 1, zero = 0;
  ASSERT_EQ(cublasSetMathMode(handle_, CUBLAS_TF32_TENSOR_OP_MATH), CUBLAS_STATUS_SUCCESS);
  auto product = [&](cublasComputeType_t compute) {
    EXPECT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, a.get(), CUDA_R_32F,
                           1, a.get(), CUDA_R_32F, 1, &zero, c.get(), CUDA_R_32F, 1, compute,
                           CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
    return c.download()[0];
  };
  EXPECT_EQ(product(CUBLAS_COMPUTE_32F), 1.0f);
  EXPECT_EQ(product(CUBLAS_COMPUTE_32F_PEDANTIC), x * x);
  ASSERT_EQ(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(product(CUBLAS_COMPUTE_32F), x * x);
}

TEST_F(SimCublas, GemmExArgumentErrors) {
  // A 3 x 2, B 2 x 4, C 3 x 4: f16 A and B need 6 and 8 halves, not floats.
  DeviceBuffer<uint16_t> a(std::vector<uint16_t>(6, 0x3C00)), b(std::vector<uint16_t>(8, 0x3C00));
  DeviceBuffer<uint16_t> a_short(5);
  DeviceBuffer<float> c(12);
  const float one = 1, zero = 0;
  auto ex = [&](cublasHandle_t h, const void* pa, cudaDataType_t at, int lda, cudaDataType_t bt,
                void* pc, cudaDataType_t ct, cublasComputeType_t compute, cublasGemmAlgo_t algo,
                const float* alpha = nullptr) {
    return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 3, 4, 2, alpha ? alpha : &one, pa, at, lda,
                        b.get(), bt, 2, &zero, pc, ct, 3, compute, algo);
  };
  const cublasComputeType_t c32 = CUBLAS_COMPUTE_32F;
  const cublasGemmAlgo_t dflt = CUBLAS_GEMM_DEFAULT;
  EXPECT_EQ(ex(handle_, a.get(), CUDA_R_16F, 3, CUDA_R_16F, c.get(), CUDA_R_32F, c32, dflt),
            CUBLAS_STATUS_SUCCESS)
      << kiln::sim::last_library_error();
  EXPECT_EQ(c.download(), std::vector<float>(12, 2.0f));
  EXPECT_EQ(ex(handle_, a.get(), CUDA_R_16F, 3, CUDA_R_16F, c.get(), CUDA_R_32F,
               CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT_TENSOR_OP),
            CUBLAS_STATUS_SUCCESS);
  // Type combinations cuBLAS does not offer: mixed inputs, a 16-bit C of the other format, FP32
  // inputs into a 16-bit C.
  EXPECT_EQ(ex(handle_, a.get(), CUDA_R_16F, 3, CUDA_R_16BF, c.get(), CUDA_R_32F, c32, dflt),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_NE(std::string(kiln::sim::last_library_error()).find("Btype CUDA_R_16BF"),
            std::string::npos)
      << kiln::sim::last_library_error();
  EXPECT_EQ(ex(handle_, a.get(), CUDA_R_16F, 3, CUDA_R_16F, c.get(), CUDA_R_16BF, c32, dflt),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(ex(handle_, a.get(), CUDA_R_32F, 3, CUDA_R_32F, c.get(), CUDA_R_16F, c32, dflt),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(ex(handle_, a.get(), CUDA_R_64F, 3, CUDA_R_64F, c.get(), CUDA_R_64F, c32, dflt),
            CUBLAS_STATUS_NOT_SUPPORTED);
  // Compute types and algorithms outside the simulated subset.
  EXPECT_EQ(ex(handle_, a.get(), CUDA_R_16F, 3, CUDA_R_16F, c.get(), CUDA_R_16F,
               CUBLAS_COMPUTE_16F, dflt),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(ex(handle_, a.get(), CUDA_R_16BF, 3, CUDA_R_16BF, c.get(), CUDA_R_32F,
               CUBLAS_COMPUTE_32F_FAST_16BF, dflt),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(ex(handle_, a.get(), CUDA_R_16F, 3, CUDA_R_16F, c.get(), CUDA_R_32F, c32,
               static_cast<cublasGemmAlgo_t>(0)),
            CUBLAS_STATUS_NOT_SUPPORTED);
  // The shape checks of every GEMM, and the handle.
  EXPECT_EQ(ex(handle_, a.get(), CUDA_R_16F, 2, CUDA_R_16F, c.get(), CUDA_R_32F, c32, dflt),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_NE(std::string(kiln::sim::last_library_error()).find("lda = 2"), std::string::npos);
  const float* null_alpha = nullptr;
  EXPECT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 3, 4, 2, null_alpha, a.get(),
                         CUDA_R_16F, 3, b.get(), CUDA_R_16F, 2, &zero, c.get(), CUDA_R_32F, 3, c32,
                         dflt),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(ex(nullptr, a.get(), CUDA_R_16F, 3, CUDA_R_16F, c.get(), CUDA_R_32F, c32, dflt),
            CUBLAS_STATUS_NOT_INITIALIZED);
  // Ranges count 2-byte elements: one half short is refused.
  EXPECT_EQ(ex(handle_, a_short.get(), CUDA_R_16F, 3, CUDA_R_16F, c.get(), CUDA_R_32F, c32, dflt),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_NE(std::string(kiln::sim::last_library_error()).find("past its end"), std::string::npos);
  // Kiln's check macro names the status and the reason.
  try {
    KILN_CUBLAS_CHECK(ex(kiln::cuda::cublas_handle(), a.get(), CUDA_R_16F, 3, CUDA_R_16BF, c.get(),
                         CUDA_R_32F, c32, dflt));
    FAIL() << "no error";
  } catch (const kiln::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("CUBLAS_STATUS_NOT_SUPPORTED"), std::string::npos) << what;
    EXPECT_NE(what.find("not a supported combination"), std::string::npos) << what;
  }
}

TEST_F(SimCublas, StatusNamesAndKilnErrorMessage) {
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  EXPECT_STRNE(cublasGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED), "");
  // Kiln's check macro names the call, the status and the simulator's reason.
  DeviceBuffer<float> a(4);
  const float one = 1, zero = 0;
  try {
    KILN_CUBLAS_CHECK(cublasSgemm(kiln::cuda::cublas_handle(), CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2,
                                  &one, a.get(), 1, a.get(), 2, &zero, a.get(), 2));
    FAIL() << "no error";
  } catch (const kiln::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("CUBLAS_STATUS_INVALID_VALUE"), std::string::npos) << what;
    EXPECT_NE(what.find("lda = 1"), std::string::npos) << what;
  }
}

}  // namespace
