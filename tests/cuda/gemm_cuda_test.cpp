// gemm_cuda_test.cpp: every step of the hand GEMM (naive, tiled, register-blocked) and cuBLAS
// against the CPU's BLAS, called directly (raw device pointers, as conv and linear do):
// odd sizes (1, 7, 33, 130, 257: edge tiles in every direction), all four transpose
// combinations, beta = 0 (C must not be read: it is filled with NaN) and beta != 0, pointers
// that are not 16-byte aligned (the register-blocked kernel's scalar path), K = 0, and float
// and double. cuBLAS is the simulated one under the simulator (engine/cuda/sim/cublas.h).
//
// Tolerance: relative to the scale of C (parity/parity_harness.h: near): the GPU sums the K products
// in another order than OpenBLAS, so results differ by rounding: 2e-5 in float, 1e-12 in double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "engine/cuda/context.h"
#include "engine/impl.h"
#include "engine/ops.h"
#include "engine/ops_cpu.h"
#include "engine/ops_cuda.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"
#include "parity/parity_harness.h"

namespace kiln {
namespace {

using cuda::GemmKernel;
using testing::kCpu;
using testing::kCuda;
using testing::near;
using testing::random_tensor;
using testing::sum_rtol;

struct Mnk {
  int64_t m, n, k;
};
// Sizes around the tiles (16 for tiled, 128 for register-blocked) and the warp (32).
const Mnk kSizes[] = {{1, 1, 1},     {1, 7, 33},    {7, 1, 130},   {33, 33, 33},
                      {130, 7, 257}, {257, 130, 7}, {129, 128, 8}, {128, 257, 9}};

// The CUDA path to test: a step of the hand GEMM, or cuBLAS.
struct Path {
  bool vendor;
  GemmKernel kernel;
  std::string name() const { return vendor ? "vendor" : cuda::gemm_kernel_name(kernel); }
};

// C = op(A) op(B) + beta C on cuda:0 with the given path, and on the CPU; compares.
// `misalign`: operands start one element into their buffers (not 16-byte aligned).
template <typename T>
void check_gemm(const Path& path, bool ta, bool tb, const Mnk& s, T beta, bool misalign) {
  const DType dt = dtype_of<T>::value;
  const std::string what = path.name() + " " + dtype_name(dt) + " m" + std::to_string(s.m) +
                           " n" + std::to_string(s.n) + " k" + std::to_string(s.k) +
                           (ta ? " A^T" : "") + (tb ? " B^T" : "") +
                           " beta " + std::to_string(beta) + (misalign ? " misaligned" : "");
  SCOPED_TRACE(what);
  const int64_t off = misalign ? 1 : 0;
  // One extra leading element in every buffer; the matrices start at `off`.
  const Tensor a = random_tensor({s.m * s.k + 1}, 1, -1.0, 1.0, dt);
  const Tensor b = random_tensor({s.k * s.n + 1}, 2, -1.0, 1.0, dt);
  Tensor c0 = random_tensor({s.m * s.n + 1}, 3, -1.0, 1.0, dt);
  if (beta == T(0)) c0.fill_(std::numeric_limits<double>::quiet_NaN());  // must not be read

  Tensor c_cpu = c0.clone();
  if (beta == T(0)) c_cpu.fill_(0.0);  // BLAS with beta = 0 ignores C too, but keep NaN out
  cpu::gemm<T>(cpu::Backend{}, ta, tb, s.m, s.n, s.k, a.data<T>() + off, b.data<T>() + off,
               c_cpu.data<T>() + off, beta);

  const Tensor a_d = a.to(kCuda), b_d = b.to(kCuda);
  Tensor c_d = c0.to(kCuda);
  {
    cuda::DeviceGuard guard(0);
    const T* ap = a_d.data<T>() + off;
    const T* bp = b_d.data<T>() + off;
    T* cp = c_d.data<T>() + off;
    if (path.vendor) cuda::gemm_vendor<T>(cuda::Backend{}, ta, tb, s.m, s.n, s.k, ap, bp, cp, beta);
    else cuda::gemm_hand<T>(path.kernel, ta, tb, s.m, s.n, s.k, ap, bp, cp, beta);
  }
  // Compare the m*n elements of C, then the one element of the buffer outside C: untouched.
  const std::vector<T> got = c_d.to_vector<T>(), want = c_cpu.to_vector<T>();
  const std::vector<T> before = c0.to_vector<T>();
  const std::vector<T> g(got.begin() + off, got.begin() + off + s.m * s.n);
  const std::vector<T> w(want.begin() + off, want.begin() + off + s.m * s.n);
  EXPECT_TRUE(near(what, Tensor::from_vector(g, {s.m, s.n}), Tensor::from_vector(w, {s.m, s.n}),
                   sum_rtol(dt)));
  const size_t outside = off == 1 ? 0 : static_cast<size_t>(s.m * s.n);
  EXPECT_EQ(0, std::memcmp(&got[outside], &before[outside], sizeof(T)))
      << what << ": the element outside C changed to " << got[outside];
}

template <typename T>
void check_path_all_shapes(const Path& path) {
  for (const Mnk& s : kSizes)
    for (int t = 0; t < 4; ++t)
      for (T beta : {T(0), T(0.5)}) check_gemm<T>(path, t & 1, t & 2, s, beta, false);
  // Misaligned operands and odd leading dimensions: the scalar load path.
  for (int t = 0; t < 4; ++t) {
    check_gemm<T>(path, t & 1, t & 2, {130, 257, 33}, T(0), true);
    check_gemm<T>(path, t & 1, t & 2, {128, 128, 16}, T(-1.5), true);
  }
}

TEST(GemmCuda, NaiveMatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  check_path_all_shapes<float>({false, GemmKernel::Naive});
  check_path_all_shapes<double>({false, GemmKernel::Naive});
}

TEST(GemmCuda, TiledMatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  check_path_all_shapes<float>({false, GemmKernel::Tiled});
  check_path_all_shapes<double>({false, GemmKernel::Tiled});
}

TEST(GemmCuda, RegisterBlockedMatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  check_path_all_shapes<float>({false, GemmKernel::RegisterBlocked});
  // Aligned, multiple-of-4 sizes: every load and store takes the float4 path.
  for (int t = 0; t < 4; ++t) {
    check_gemm<float>({false, GemmKernel::RegisterBlocked}, t & 1, t & 2, {256, 128, 64}, 0.0f, false);
    check_gemm<float>({false, GemmKernel::RegisterBlocked}, t & 1, t & 2, {132, 260, 20}, 2.0f, false);
  }
}

TEST(GemmCuda, RegisterBlockedIsFloatOnly) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor a = Tensor::zeros({4}, DType::F64, kCuda);
  cuda::DeviceGuard guard(0);
  double* p = a.data<double>();
  EXPECT_THROW(cuda::gemm_hand<double>(GemmKernel::RegisterBlocked, false, false, 2, 2, 1, p, p, p),
               Error);
}

TEST(GemmCuda, EmptyK) {
  KILN_SKIP_WITHOUT_CUDA();
  // K = 0: C = beta C (and 0 with beta = 0, even over NaN).
  for (GemmKernel kernel : {GemmKernel::Naive, GemmKernel::Tiled, GemmKernel::RegisterBlocked}) {
    check_gemm<float>({false, kernel}, false, false, {7, 33, 0}, 0.0f, false);
    check_gemm<float>({false, kernel}, true, true, {7, 33, 0}, 0.5f, false);
  }
}

TEST(GemmCuda, MatmulRunsTheTwinTheSettingNames) {
  KILN_SKIP_WITHOUT_CUDA();
  // matmul on CUDA runs cuda::gemm (ours) under Hand and cuda::gemm_vendor (cuBLAS, the
  // simulated one under the simulator) under Vendor: the same bits as calling the twin.
  const Tensor a = random_tensor({33, 7}, 5, -1, 1, DType::F32), b = random_tensor({7, 130}, 6, -1, 1, DType::F32);
  const Tensor a_d = a.to(kCuda), b_d = b.to(kCuda);
  Tensor c = Tensor::empty({33, 130});
  cpu::gemm<float>(cpu::Backend{}, false, false, 33, 130, 7, a.data<float>(), b.data<float>(),
                   c.data<float>());
  for (Impl impl : {Impl::Hand, Impl::Vendor}) {
    SCOPED_TRACE(impl_name(impl));
    KernelsGuard kernels(impl);
    EXPECT_EQ(gemm_impl(kCuda, DType::F32), impl);
    const Tensor c_op = matmul(a_d, b_d);
    Tensor c_d = Tensor::empty({33, 130}, DType::F32, kCuda);
    {
      cuda::DeviceGuard guard(0);
      const float *ap = a_d.data<float>(), *bp = b_d.data<float>();
      if (impl == Impl::Hand)
        cuda::gemm<float>(cuda::Backend{}, false, false, 33, 130, 7, ap, bp, c_d.data<float>());
      else
        cuda::gemm_vendor<float>(cuda::Backend{}, false, false, 33, 130, 7, ap, bp,
                                 c_d.data<float>());
    }
    EXPECT_EQ(c_op.to_vector<float>(), c_d.to_vector<float>());
    EXPECT_TRUE(near("cuda::gemm", c_d, c, sum_rtol(DType::F32)));
  }
}

TEST(GemmCuda, VendorMatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  check_path_all_shapes<float>({true, GemmKernel::Naive});
  check_path_all_shapes<double>({true, GemmKernel::Naive});
}

TEST(GemmCuda, DefaultIsTheSameInEveryBuild) {
  KILN_SKIP_WITHOUT_CUDA();
  // No simulator special case: without KILN_KERNELS the default is Vendor here as on a GPU
  // (the simulator's test preset asks for hand through KILN_KERNELS), for CUDA and CPU alike.
  if (const char* env = std::getenv("KILN_KERNELS"); env == nullptr || *env == '\0') {
    EXPECT_EQ(default_impl(), Impl::Vendor);
    EXPECT_EQ(gemm_impl(kCuda, DType::F32), Impl::Vendor);
  }
  EXPECT_EQ(gemm_impl(kCuda, DType::F32), current_impl());
  // matmul through cuBLAS (the simulated one under the simulator).
  const Tensor a = Tensor::ones({2, 3}, DType::F32, kCuda);
  KernelsGuard vendor(Impl::Vendor);
  EXPECT_EQ(matmul(a, a, false, true).to_vector<float>(), std::vector<float>(4, 3.0f));
}

#if !KILN_CUDA_SIM  // too large for the simulator's hand kernels

TEST(GemmCuda, HandMatchesVendorOnLargerSizes) {
  KILN_SKIP_WITHOUT_CUDA();
  // Hand and cuBLAS on the same device, sizes where the register-blocked kernel runs many blocks.
  for (const Mnk& s : {Mnk{1024, 1024, 1024}, Mnk{1000, 520, 777}})
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const Tensor a = random_tensor({s.m * s.k}, 7, -1, 1, DType::F32).to(kCuda);
      const Tensor b = random_tensor({s.k * s.n}, 8, -1, 1, DType::F32).to(kCuda);
      Tensor hand = Tensor::empty({s.m, s.n}, DType::F32, kCuda);
      Tensor vendor = Tensor::empty({s.m, s.n}, DType::F32, kCuda);
      {
        cuda::DeviceGuard guard(0);
        cuda::gemm_hand<float>(GemmKernel::RegisterBlocked, ta, tb, s.m, s.n, s.k, a.data<float>(),
                               b.data<float>(), hand.data<float>());
        cuda::gemm_vendor<float>(cuda::Backend{}, ta, tb, s.m, s.n, s.k, a.data<float>(),
                                 b.data<float>(), vendor.data<float>());
      }
      EXPECT_TRUE(near("hand vs cuBLAS m" + std::to_string(s.m) + (ta ? " A^T" : "") +
                           (tb ? " B^T" : ""),
                       hand, vendor, 1e-5));
    }
}

#endif

}  // namespace
}  // namespace kiln
