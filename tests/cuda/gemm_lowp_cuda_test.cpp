// gemm_lowp_cuda_test.cpp: the mixed-precision GEMM (cuda::gemm_lowp, engine/cuda/kernels/
// gemm_lowp.cu): bf16 and f16 inputs, f32 output, both paths (Hand: widen + the hand f32 GEMM;
// Vendor: cublasGemmEx, the simulated one under the simulator, where Vendor is asked for
// explicitly), all four transpose combinations and odd sizes around the tiles, against a CPU
// reference in double on the same rounded inputs; C filled with NaN first (it must be written,
// never read); K = 0; the hand path and the f32 hand GEMM on the widened inputs are both f32
// GEMMs of the same exact products (bit for bit the same only where the hand path is that f32
// GEMM: devices without tensor cores); a dtype other than bf16 or f16 is an error.
//
// Tolerance: the products of two 16-bit values are exact in f32, so only the f32 summation order
// differs from the double reference: sum_rtol(F32) (parity/parity_harness.h) relative to the
// scale of C.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "engine/cuda/context.h"
#include "engine/cuda/lowp_gemm_choice.h"
#include "engine/impl.h"
#include "engine/ops_cuda.h"
#include "parity/parity_harness.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::bit_identical;
using testing::kCpu;
using testing::kCuda;
using testing::near;
using testing::random_tensor;
using testing::sum_rtol;

struct Mnk {
  int64_t m, n, k;
};
// Around the hand kernel's 128x128 block tile, its 8-deep K-step, and the warp; a dimension of 1.
const Mnk kSizes[] = {{1, 1, 1},    {1, 7, 33},   {7, 1, 130},  {33, 33, 33},
                      {130, 7, 257}, {129, 128, 9}, {17, 131, 8}};

const uint16_t* bits(const Tensor& t) { return static_cast<const uint16_t*>(t.raw_data()); }

// C (M,N) = op(A) op(B) in double from the f32 values of A and B (row-major, A stored (M,K) or
// (K,M) when ta, B (K,N) or (N,K) when tb).
Tensor reference(bool ta, bool tb, const Mnk& s, const Tensor& a32, const Tensor& b32) {
  const std::vector<float> a = a32.to_vector<float>(), b = b32.to_vector<float>();
  std::vector<double> c(static_cast<size_t>(s.m * s.n), 0.0);
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < s.k; ++p) {
        const double av = ta ? a[p * s.m + i] : a[i * s.k + p];
        const double bv = tb ? b[j * s.k + p] : b[p * s.n + j];
        acc += av * bv;
      }
      c[static_cast<size_t>(i * s.n + j)] = acc;
    }
  return Tensor::from_vector(c, {s.m, s.n});
}

// The twin of `impl`: cuda::gemm_lowp (ours) or cuda::gemm_lowp_vendor (cuBLAS).
void gemm_lowp_of(Impl impl, DType in, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                  const uint16_t* a, const uint16_t* b, float* c) {
  if (impl == Impl::Vendor) cuda::gemm_lowp_vendor(cuda::Backend{}, in, ta, tb, m, n, k, a, b, c);
  else cuda::gemm_lowp(cuda::Backend{}, in, ta, tb, m, n, k, a, b, c);
}

// One case: random inputs rounded to `in`, C on cuda:0 through `impl`, against the reference.
void check(DType in, Impl impl, bool ta, bool tb, const Mnk& s, uint32_t seed) {
  const std::string what = std::string(impl_name(impl)) + " " + dtype_name(in) + " m" +
                           std::to_string(s.m) + " n" + std::to_string(s.n) + " k" +
                           std::to_string(s.k) + (ta ? " A^T" : "") + (tb ? " B^T" : "");
  SCOPED_TRACE(what);
  const Tensor a16 = random_tensor({s.m * s.k}, seed, -1, 1, DType::F32).to(in);
  const Tensor b16 = random_tensor({s.k * s.n}, seed + 1, -1, 1, DType::F32).to(in);
  const Tensor want = reference(ta, tb, s, a16.to(DType::F32), b16.to(DType::F32));
  const Tensor a_d = a16.to(kCuda), b_d = b16.to(kCuda);
  Tensor c_d = Tensor::full({s.m, s.n}, std::numeric_limits<double>::quiet_NaN(), DType::F32, kCuda);
  {
    cuda::DeviceGuard guard(0);
    gemm_lowp_of(impl, in, ta, tb, s.m, s.n, s.k, bits(a_d), bits(b_d), c_d.data<float>());
  }
  EXPECT_TRUE(near(what, c_d.to(DType::F64), want, sum_rtol(DType::F32)));
}

void check_all(DType in, Impl impl) {
  uint32_t seed = 1;
  for (const Mnk& s : kSizes)
    for (int t = 0; t < 4; ++t) check(in, impl, t & 1, t & 2, s, seed += 2);
}

TEST(GemmLowpCuda, HandBf16MatchesReference) {
  KILN_SKIP_WITHOUT_CUDA();
  check_all(DType::BF16, Impl::Hand);
}

TEST(GemmLowpCuda, HandF16MatchesReference) {
  KILN_SKIP_WITHOUT_CUDA();
  check_all(DType::F16, Impl::Hand);
}

TEST(GemmLowpCuda, VendorBf16MatchesReference) {
  KILN_SKIP_WITHOUT_CUDA();
  check_all(DType::BF16, Impl::Vendor);
}

TEST(GemmLowpCuda, VendorF16MatchesReference) {
  KILN_SKIP_WITHOUT_CUDA();
  check_all(DType::F16, Impl::Vendor);
}

TEST(GemmLowpCuda, EmptyKWritesZeros) {
  KILN_SKIP_WITHOUT_CUDA();
  // K = 0: C = 0 over NaN, on both paths; A and B are empty.
  for (Impl impl : {Impl::Hand, Impl::Vendor}) {
    const Tensor empty = Tensor::empty({0}, DType::BF16, kCuda);
    Tensor c = Tensor::full({7, 33}, std::numeric_limits<double>::quiet_NaN(), DType::F32, kCuda);
    {
      cuda::DeviceGuard guard(0);
      gemm_lowp_of(impl, DType::BF16, false, true, 7, 33, 0, bits(empty), bits(empty),
                   c.data<float>());
    }
    EXPECT_EQ(c.to_vector<float>(), std::vector<float>(7 * 33, 0.0f)) << impl_name(impl);
  }
}

// The error bound of an f32 GEMM of widened 16-bit inputs against the exact product: every
// product a_ip b_pj is exact in f32 (at most 22 significant bits), so only the K - 1 additions
// round. Summed one after another in any order, |computed - exact| <= gamma(K-1) sum_p |a_ip b_pj|
// with gamma(n) = n u / (1 - n u), u = 2^-24 (N. J. Higham, "Accuracy and Stability of Numerical
// Algorithms", 2nd ed., SIAM 2002, section 4.2). Tensor cores add several aligned products at
// once and truncate instead of rounding to nearest (M. Fasi, N. J. Higham, M. Mikaitis, S.
// Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ Computer Science 7:e330, 2021):
// a unit roundoff of up to 2u = eps_f32 per addition. K * eps_f32 * sum_p |a_ip||b_pj| bounds
// both, and the double reference's own error (K * 2^-53 of the same sum) is far below it.
// a32, b32: the widened inputs, stored as for gemm_hand(ta = tb = true), on the CPU.
::testing::AssertionResult within_f32_gemm_bound(const std::string& what, const Tensor& got,
                                                 const Tensor& a32, const Tensor& b32,
                                                 const Mnk& s) {
  const std::vector<float> a = a32.to_vector<float>(), b = b32.to_vector<float>();
  const std::vector<float> g = got.to_vector<float>();
  const double eps = std::numeric_limits<float>::epsilon();
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      double exact = 0, magnitude = 0;
      for (int64_t p = 0; p < s.k; ++p) {
        const double t = static_cast<double>(a[p * s.m + i]) * b[j * s.k + p];  // exact
        exact += t;
        magnitude += std::fabs(t);
      }
      const double bound = static_cast<double>(s.k) * eps * magnitude;
      const double v = g[static_cast<size_t>(i * s.n + j)];
      if (!(std::fabs(v - exact) <= bound))
        return ::testing::AssertionFailure()
               << what << ": element (" << i << ", " << j << ") is " << v << ", the exact sum "
               << exact << " (|error| " << std::fabs(v - exact) << ", bound K eps sum|ab| "
               << bound << ")";
    }
  return ::testing::AssertionSuccess();
}

TEST(GemmLowpCuda, HandIsAnF32GemmOfTheWidenedInputs) {
  KILN_SKIP_WITHOUT_CUDA();
  // The Hand path is a tensor-core GEMM where the device has bf16/f16 tensor cores (step 7 on
  // compute capability 9.0 and the simulator, step 4 on 8.0+: lowp_gemm_choice), else the register-blocked f32 GEMM on inputs widened
  // exactly. Either way an f32 GEMM of the widened inputs, as is gemm_hand<float> called on
  // inputs converted by Tensor::to: all three stay within the f32 bound of the exact product.
  // Bit for bit only where they are the same kernel: a tensor core's order and rounding of the
  // additions are its own (an H200 differed from the register-blocked GEMM in the last bit of
  // some elements, bf16 and f16 alike), and the simulator's model of mma_sync (sim/mma.h, a
  // plain ordered f32 sum) is no promise about them.
  const Mnk s{130, 33, 40};
  const bool tensor_cores = [] {
    cuda::DeviceGuard guard(0);
    return cuda::lowp_gemm_choice() != cuda::LowpGemm::WidenedF32;
  }();
  for (DType in : {DType::BF16, DType::F16}) {
    const Tensor a16 = random_tensor({s.k * s.m}, 40, -1, 1, DType::F32).to(in).to(kCuda);
    const Tensor b16 = random_tensor({s.n * s.k}, 41, -1, 1, DType::F32).to(in).to(kCuda);
    const Tensor a32 = a16.to(DType::F32), b32 = b16.to(DType::F32);
    Tensor got = Tensor::empty({s.m, s.n}, DType::F32, kCuda);
    Tensor want = Tensor::empty({s.m, s.n}, DType::F32, kCuda);
    {
      cuda::DeviceGuard guard(0);
      cuda::gemm_lowp(cuda::Backend{}, in, true, true, s.m, s.n, s.k, bits(a16), bits(b16),
                      got.data<float>());
      cuda::gemm_hand<float>(cuda::GemmKernel::RegisterBlocked, true, true, s.m, s.n, s.k,
                             a32.data<float>(), b32.data<float>(), want.data<float>());
    }
    const std::string name = dtype_name(in);
    const Tensor a_host = a32.to(kCpu), b_host = b32.to(kCpu);
    EXPECT_TRUE(within_f32_gemm_bound(name + " hand", got, a_host, b_host, s));
    EXPECT_TRUE(within_f32_gemm_bound(name + " f32 hand", want, a_host, b_host, s));
    if (!tensor_cores) {
      EXPECT_TRUE(bit_identical(name, got, want));
    }
  }
}

// Which step gemm_lowp runs: the Hopper GEMM's step 7 exactly on compute capability 9.0 (the
// simulator reports 9.0) unless KILN_GEMM_SM90=0 (ctest runs this test a second time so:
// gemm_lowp_cuda_test_wmma), step 4 on the other devices with tensor cores, and the product
// of the widened inputs elsewhere. The choice is what the hand path computed with: HandBf16 and
// the tests above ran through it.
TEST(GemmLowpCuda, RunsTheHopperStepOnComputeCapability90UnlessSwitchedOff) {
  KILN_SKIP_WITHOUT_CUDA();
  cuda::DeviceGuard guard(0);
  const char* env = std::getenv("KILN_GEMM_SM90");
  const bool switched_off = env != nullptr && std::string(env) == "0";
  const cuda::LowpGemm choice = cuda::lowp_gemm_choice();
  SCOPED_TRACE(cuda::lowp_gemm_name(choice));
  if (cuda::sm90_gemm_available() && !switched_off)
    EXPECT_EQ(choice, cuda::LowpGemm::Sm90Persistent);
  else if (cuda::tensor_cores_available())
    EXPECT_EQ(choice, cuda::LowpGemm::TensorCore);
  else
    EXPECT_EQ(choice, cuda::LowpGemm::WidenedF32);
}

TEST(GemmLowpCuda, OtherDtypesAreAnError) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor a = Tensor::zeros({4}, DType::F32, kCuda);
  cuda::DeviceGuard guard(0);
  const uint16_t* p = bits(a);
  float* c = a.data<float>();
  for (DType bad : {DType::F32, DType::F64}) {
    try {
      cuda::gemm_lowp(cuda::Backend{}, bad, false, false, 1, 1, 1, p, p, c);
      FAIL() << "no error for " << dtype_name(bad);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bf16 or f16"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(
      cuda::gemm_lowp_vendor(cuda::Backend{}, DType::BF16, false, false, -1, 1, 1, p, p, c), Error);
}

}  // namespace
}  // namespace kiln
