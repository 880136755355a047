// gemm_tensor_core_test.cpp: step 4 of the hand GEMM, the tensor-core kernel
// (engine/cuda/kernels/gemm_tensor_core.cu), against a CPU product in double of the same rounded
// inputs: bf16 and f16, all four transpose combinations, sizes on and off the 16-element fragments
// and the 128x128 block tile (1, 15, 17, 33, 64, 100, 129), K over several 32-deep slices (the
// double buffer), operands one element off 16-byte alignment (the scalar loads and stores), K = 0,
// and the errors. Under the simulator the wmma calls run on sim/mma.h's model; the barriers of the
// kernel are each needed for these results (tools/sim_mutants.sh removes them one at a time; this
// test also runs with the warps shuffled, gemm_tensor_core_test_shuffle).
//
// Tolerance: the products of two 16-bit values are exact in f32, so the only error is the f32
// summation of K products. Recursive summation in any order is within K u sum_p |a_ip b_pj|
// (u = 2^-24; Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., section 3.1);
// the test allows twice that, for a GPU whose tensor cores truncate instead of rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "engine/cuda/context.h"
#include "engine/error.h"
#include "engine/host_device.h"
#include "engine/ops_cuda.h"
#include "engine/tensor.h"
#include "parity/parity_harness.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::kCuda;
using testing::random_tensor;

// bf16 tensor cores need compute capability 8.0: on an older GPU the kernel is a usage error
// and these tests skip. The simulator reports 9.0.
bool has_tensor_cores() {
  int major = 0;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
         major >= 8;
}
#define SKIP_WITHOUT_TENSOR_CORES()                                                      \
  do {                                                                                   \
    KILN_SKIP_WITHOUT_CUDA();                                                            \
    if (!has_tensor_cores()) GTEST_SKIP() << "skipped: cuda:0 is older than compute capability 8.0"; \
  } while (0)

struct Mnk {
  int64_t m, n, k;
};

float widen_bits(DType in, uint16_t bits) {
  return in == DType::BF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
}

const uint16_t* bits_of(const Tensor& t) { return static_cast<const uint16_t*>(t.raw_data()); }

// C = op(A) op(B) with the tensor-core kernel on cuda:0, against double on the CPU.
// `misalign`: A, B and C start one element into their buffers (not 16-byte aligned).
void check_tensor_core(DType in, bool ta, bool tb, const Mnk& s, bool misalign) {
  const std::string what = std::string(dtype_name(in)) + " m" + std::to_string(s.m) + " n" +
                           std::to_string(s.n) + " k" + std::to_string(s.k) + (ta ? " A^T" : "") +
                           (tb ? " B^T" : "") + (misalign ? " misaligned" : "");
  SCOPED_TRACE(what);
  const int64_t off = misalign ? 1 : 0;
  // One extra leading element in every buffer; the matrices start at `off`. Rounded on the CPU.
  const Tensor a = random_tensor({s.m * s.k + 1}, 11, -1.0, 1.0, DType::F32).to(in);
  const Tensor b = random_tensor({s.k * s.n + 1}, 12, -1.0, 1.0, DType::F32).to(in);
  Tensor c0 = Tensor::empty({s.m * s.n + 1}, DType::F32);
  c0.fill_(std::numeric_limits<double>::quiet_NaN());  // C is only written, never read

  const Tensor a_d = a.to(kCuda), b_d = b.to(kCuda);
  Tensor c_d = c0.to(kCuda);
  {
    cuda::DeviceGuard guard(0);
    cuda::gemm_tensor_core(in, ta, tb, s.m, s.n, s.k, bits_of(a_d) + off, bits_of(b_d) + off,
                           static_cast<float*>(c_d.raw_data()) + off);
  }
  const std::vector<float> got = c_d.to_vector<float>();

  // op(A)(i, p) and op(B)(p, j) of the rounded inputs, as in cpu::gemm's layout rules.
  const uint16_t* ab = bits_of(a) + off;
  const uint16_t* bb = bits_of(b) + off;
  const int64_t lda = ta ? s.m : s.k, ldb = tb ? s.k : s.n;
  auto op_a = [&](int64_t i, int64_t p) {
    return static_cast<double>(widen_bits(in, ta ? ab[p * lda + i] : ab[i * lda + p]));
  };
  auto op_b = [&](int64_t p, int64_t j) {
    return static_cast<double>(widen_bits(in, tb ? bb[j * ldb + p] : bb[p * ldb + j]));
  };
  const double u = std::ldexp(1.0, -24);
  int64_t bad = 0;
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      double want = 0, mag = 0;
      for (int64_t p = 0; p < s.k; ++p) {
        want += op_a(i, p) * op_b(p, j);
        mag += std::fabs(op_a(i, p) * op_b(p, j));
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

// Sizes below, at and above the 16x16 fragment and the 128x128 block tile; K of one slice
// (<= 32) and of several (the double buffer), not a multiple of 16 too.
const Mnk kSizes[] = {{1, 1, 1},    {15, 17, 33},  {17, 15, 16}, {33, 64, 17},
                      {64, 64, 64}, {100, 33, 100}, {129, 130, 31}, {16, 136, 72}};

TEST(GemmTensorCore, MatchesCpuBf16) {
  SKIP_WITHOUT_TENSOR_CORES();
  for (const Mnk& s : kSizes)
    for (int t = 0; t < 4; ++t) check_tensor_core(DType::BF16, t & 1, t & 2, s, false);
}

TEST(GemmTensorCore, MatchesCpuF16) {
  SKIP_WITHOUT_TENSOR_CORES();
  for (const Mnk& s : kSizes)
    for (int t = 0; t < 4; ++t) check_tensor_core(DType::F16, t & 1, t & 2, s, false);
}

TEST(GemmTensorCore, MisalignedOperandsTakeTheScalarPath) {
  SKIP_WITHOUT_TENSOR_CORES();
  for (DType in : {DType::BF16, DType::F16})
    for (int t = 0; t < 4; ++t) check_tensor_core(in, t & 1, t & 2, {40, 48, 64}, true);
}

TEST(GemmTensorCore, EmptyKGivesZeros) {
  SKIP_WITHOUT_TENSOR_CORES();
  check_tensor_core(DType::BF16, false, false, {7, 33, 0}, false);
  check_tensor_core(DType::F16, true, true, {7, 33, 0}, false);
}

// The f32 accumulation is what makes the result exact here: 384 products of 1 + 2^-7 (exact
// in bf16) and 1 sum to 387, which bf16 cannot even hold (its neighbours are 386 and 388).
TEST(GemmTensorCore, AccumulatesInF32) {
  SKIP_WITHOUT_TENSOR_CORES();
  const int64_t k = 384;
  const Tensor a = Tensor::full({k}, 1.0 + 1.0 / 128, DType::F32).to(DType::BF16).to(kCuda);
  const Tensor b = Tensor::full({k}, 1.0, DType::F32).to(DType::BF16).to(kCuda);
  Tensor c = Tensor::empty({1}, DType::F32, kCuda);
  {
    cuda::DeviceGuard guard(0);
    cuda::gemm_tensor_core(DType::BF16, false, false, 1, 1, k, bits_of(a), bits_of(b),
                           static_cast<float*>(c.raw_data()));
  }
  EXPECT_EQ(c.to_vector<float>()[0], 387.0f);
}

TEST(GemmTensorCore, RejectsOtherDtypesAndNegativeSizes) {
  KILN_SKIP_WITHOUT_CUDA();  // checked before the device's capability: runs on every GPU
  const Tensor t = Tensor::zeros({16}, DType::F32, kCuda);
  cuda::DeviceGuard guard(0);
  const uint16_t* p = static_cast<const uint16_t*>(t.raw_data());
  float* c = static_cast<float*>(t.raw_data());
  try {
    cuda::gemm_tensor_core(DType::F32, false, false, 2, 2, 2, p, p, c);
    ADD_FAILURE() << "f32 inputs were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("bf16 or f16"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cuda::gemm_tensor_core(DType::BF16, false, false, -1, 2, 2, p, p, c), Error);
}

}  // namespace
}  // namespace kiln
