// gemm16_check.h: the check that the GEMM tests of 16-bit inputs share (steps 4 and 5:
// tests/cuda/gemm_tensor_core_test.cpp, gemm_sm90_test.cpp). C = op(A) op(B) on cuda:0 by the
// kernel under test, against a CPU product in double of the same rounded inputs.
//
// Tolerance: the products of two 16-bit values are exact in f32 and only the f32 summation of
// K products errs: within K u sum_p |a_ip b_pj| (u = 2^-24; Higham, "Accuracy and Stability of
// Numerical Algorithms", 2nd ed., section 3.1); the check allows twice that, for tensor cores
// that truncate.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "engine/cuda/context.h"
#include "engine/host_device.h"
#include "engine/tensor.h"
#include "parity/parity_harness.h"
#include "support/gradcheck.h"

namespace kiln::testing {

struct Mnk {
  int64_t m, n, k;
};

inline float widen_bits(DType in, uint16_t bits) {
  return in == DType::BF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
}

inline const uint16_t* bits_of(const Tensor& t) {
  return static_cast<const uint16_t*>(t.raw_data());
}

// A GEMM of 16-bit inputs (bit patterns) into f32: cuda::gemm_tensor_core, cuda::gemm_sm90 with
// a chosen step.
using Gemm16 = std::function<void(DType in, bool trans_a, bool trans_b, int64_t m, int64_t n,
                                  int64_t k, const uint16_t* a, const uint16_t* b, float* c)>;

// Runs `gemm` on random inputs (seeds `seed` for A, `seed` + 1 for B) and checks every element
// of C and that the buffer's one element outside C stays NaN. `misalign`: A, B and C start one
// element into their buffers (A and B not 16-byte aligned, C not 8-byte aligned).
inline void check_gemm16(const Gemm16& gemm, uint32_t seed, DType in, bool ta, bool tb, const Mnk& s,
                         bool misalign) {
  const std::string what = std::string(dtype_name(in)) + " m" + std::to_string(s.m) + " n" +
                           std::to_string(s.n) + " k" + std::to_string(s.k) + (ta ? " A^T" : "") +
                           (tb ? " B^T" : "") + (misalign ? " misaligned" : "");
  SCOPED_TRACE(what);
  const int64_t off = misalign ? 1 : 0;
  // One extra leading element in every buffer; the matrices start at `off`. Rounded on the CPU.
  const Tensor a = random_tensor({s.m * s.k + 1}, seed, -1.0, 1.0, DType::F32).to(in);
  const Tensor b = random_tensor({s.k * s.n + 1}, seed + 1, -1.0, 1.0, DType::F32).to(in);
  Tensor c0 = Tensor::empty({s.m * s.n + 1}, DType::F32);
  c0.fill_(std::numeric_limits<double>::quiet_NaN());  // C is only written, never read

  const Tensor a_d = a.to(kCuda), b_d = b.to(kCuda);
  Tensor c_d = c0.to(kCuda);
  {
    cuda::DeviceGuard guard(0);
    gemm(in, ta, tb, s.m, s.n, s.k, bits_of(a_d) + off, bits_of(b_d) + off,
         static_cast<float*>(c_d.raw_data()) + off);
  }
  const std::vector<float> got = c_d.to_vector<float>();

  // op(A)(i, p) and op(B)(p, j) of the rounded inputs, widened once, as in cpu::gemm's layout
  // rules.
  const uint16_t* ab = bits_of(a) + off;
  const uint16_t* bb = bits_of(b) + off;
  const int64_t lda = ta ? s.m : s.k, ldb = tb ? s.k : s.n;
  std::vector<double> opa(s.m * s.k), opb(s.k * s.n);
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t p = 0; p < s.k; ++p)
      opa[i * s.k + p] = widen_bits(in, ta ? ab[p * lda + i] : ab[i * lda + p]);
  for (int64_t p = 0; p < s.k; ++p)
    for (int64_t j = 0; j < s.n; ++j)
      opb[p * s.n + j] = widen_bits(in, tb ? bb[j * ldb + p] : bb[p * ldb + j]);
  const double u = std::ldexp(1.0, -24);
  int64_t bad = 0;
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      double want = 0, mag = 0;
      for (int64_t p = 0; p < s.k; ++p) {
        const double t = opa[i * s.k + p] * opb[p * s.n + j];
        want += t;
        mag += std::fabs(t);
      }
      const double g = got[off + i * s.n + j];
      const double tol = 2.0 * static_cast<double>(s.k) * u * mag;
      if (!(std::fabs(g - want) <= tol) && bad++ < 5)  // NaN fails
        ADD_FAILURE() << what << ": C(" << i << ", " << j << ") = " << g << ", want " << want
                      << " (tolerance " << tol << ")";
    }
  EXPECT_EQ(bad, 0) << what << ": elements out of tolerance";
  // The one element of the buffer outside C is untouched (still NaN).
  const size_t outside = off == 1 ? 0 : static_cast<size_t>(s.m * s.n);
  EXPECT_TRUE(std::isnan(got[outside])) << what << ": the element outside C became " << got[outside];
}

}  // namespace kiln::testing
