// fp_contract_cuda_test.cpp: how kernels compile a * b + c (tests/cuda/fp_contract_kernels.cu),
// on a GPU and under the simulator alike. nvcc contracts a multiply followed by an add into one
// fused multiply-add by default (--fmad=true; CUDA C++ Best Practices Guide, "Math Libraries",
// and nvcc's --fmad option), including the loop-carried multiply-add of a reduction; the _rn
// intrinsics are never contracted and __fma_rn always fuses (CUDA Math API). The simulator
// compiles kernels so that they do the same (cmake/KilnCuda.cmake; docs/cuda_simulator.md,
// "Floating point: contraction as nvcc does it"): without that, a kernel could pass here with
// bits that the GPU does not give.
//
// The inputs make the two roundings visible: with a = b = 1 + 2^-12 (f32), a * b =
// 1 + 2^-11 + 2^-24 is a tie that rounds to 1 + 2^-11, so with c = -(1 + 2^-11) the unfused
// a * b + c is 0 and the fused one 2^-24. In f64 the same with 2^-27 (1 + 2^-26 + 2^-54).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/fp_contract_kernels.h"
#include "engine/cuda/context.h"
#include "engine/dtype.h"
#include "engine/tensor.h"
#include "parity/parity_harness.h"
#include "support/cuda_skip.h"

namespace kiln {
namespace {

using testing::fp_kernels_can_contract;
using testing::fp_madd_cuda;
using testing::kCuda;
using testing::MaddForm;

// The half-ulp step h (2^-12 in f32, 2^-27 in f64): a = b = 1 + h, c = -(1 + 2h).
template <typename T>
T step() {
  return std::ldexp(T(1), sizeof(T) == 4 ? -12 : -27);
}

// out of one kernel form over n elements, a[i] = b[i] = 1 + h and c[i] = -(1 + 2h) for each i
// (LoopSum: a and b are 1 + h at element 0 and 0 after it, c = {-(1 + 2h), 0}).
template <typename T>
std::vector<T> run(MaddForm form, int64_t n) {
  const T h = step<T>();
  std::vector<T> a(static_cast<size_t>(n), 1 + h), b = a, c(static_cast<size_t>(n), -(1 + 2 * h));
  if (form == MaddForm::LoopSum) {
    for (int64_t i = 1; i < n; ++i) a[static_cast<size_t>(i)] = b[static_cast<size_t>(i)] = 0;
    c = {-(1 + 2 * h), 0};
  }
  const Tensor a_d = Tensor::from_vector(a, {n}).to(kCuda), b_d = Tensor::from_vector(b, {n}).to(kCuda);
  const Tensor c_d = Tensor::from_vector(c, {static_cast<int64_t>(c.size())}).to(kCuda);
  Tensor out = Tensor::zeros({form == MaddForm::LoopSum ? 2 : n}, dtype_of<T>::value, kCuda);
  {
    cuda::DeviceGuard guard(0);
    fp_madd_cuda<T>(form, a_d.data<T>(), b_d.data<T>(), c_d.data<T>(), out.data<T>(), n);
  }
  return out.to_vector<T>();
}

// Every element of `got` is `want` (as bits: 0 and 2^-24 are what is told apart).
template <typename T>
::testing::AssertionResult all_equal(const std::string& what, const std::vector<T>& got, T want) {
  for (size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want))
      return ::testing::AssertionFailure()
             << what << ": element " << i << " is " << got[i] << ", want " << want
             << (want == 0 ? " (the product rounded before the add)"
                           : " (one rounding: a fused multiply-add)");
  return ::testing::AssertionSuccess();
}

template <typename T>
void check_forms() {
  SCOPED_TRACE(sizeof(T) == 4 ? "f32" : "f64");
  const T h = step<T>();
  const T fused = h * h;  // 2^-24 or 2^-54: exact
  const int64_t n = 70;   // more than one block of the kernel's 64 threads
  EXPECT_TRUE(all_equal("__fmul_rn(a, b) + c", run<T>(MaddForm::MulRn, n), T(0)));
  EXPECT_TRUE(all_equal("__fadd_rn(a * b, c)", run<T>(MaddForm::AddRn, n), T(0)));
  EXPECT_TRUE(all_equal("__fma_rn(a, b, c)", run<T>(MaddForm::FmaRn, n), fused));
  if (!fp_kernels_can_contract()) {
    GTEST_SKIP() << "this build's kernels cannot contract: the simulator's host compiler forms "
                    "fused multiply-adds only for a CPU that has them (-march=native on an "
                    "x86-64 with FMA) and with optimisation on";
  }
  EXPECT_TRUE(all_equal("a * b + c", run<T>(MaddForm::Plain, n), fused));
  const std::vector<T> loop = run<T>(MaddForm::LoopSum, n);
  EXPECT_TRUE(all_equal("c + sum a * (b - 0) in a loop", std::vector<T>{loop[0]}, fused));
  EXPECT_EQ(loop[1], 1 + h) << "the plain sum beside it";
}

TEST(FpContractCuda, KernelsContractMultiplyAddsAsNvccDoesF32) {
  KILN_SKIP_WITHOUT_CUDA();
  check_forms<float>();
}

TEST(FpContractCuda, KernelsContractMultiplyAddsAsNvccDoesF64) {
  KILN_SKIP_WITHOUT_CUDA();
  check_forms<double>();
}

}  // namespace
}  // namespace kiln
