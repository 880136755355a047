// gemm_sm90_test.cpp: steps 5-7 of the hand GEMM, the Hopper kernels (TMA, mbarriers, wgmma:
// engine/cuda/kernels/gemm_sm90.cu and gemm_sm90_ws.cu), each against a CPU product in double
// of the same rounded inputs: bf16 and f16, all four transpose combinations (three of them through the workspace
// transpose), M, N and K in {1, 17, 129} (below, across and beyond the 128-row block tile and
// the 64-deep K-slice) and larger sizes that are multiples of nothing (K up to 16 slices: the
// 4-stage ring wraps four times, so every barrier's phase parity flips), leading dimensions
// that are not a multiple of 8 and operands off 16-byte alignment (the padded workspace), C off
// 8-byte alignment (scalar stores), K = 0, step 7 with fewer blocks than tiles, and the
// errors. Under the simulator TMA and wgmma run
// on its models of them; on a GPU other than compute capability 9.0 the tests skip.
//
// Tolerance: as for step 4 (tests/cuda/gemm_tensor_core_test.cpp), the products of two 16-bit
// values are exact in f32 and only the f32 summation of K products errs: within
// K u sum_p |a_ip b_pj| (u = 2^-24; Higham, "Accuracy and Stability of Numerical Algorithms",
// 2nd ed., section 3.1); the test allows twice that, for tensor cores that truncate.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "cuda/gemm16_check.h"
#include "engine/cuda/context.h"
#include "engine/error.h"
#include "engine/host_device.h"
#include "engine/ops_cuda.h"
#include "engine/tensor.h"
#include "parity/parity_harness.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"

namespace kiln {
namespace cuda {
// The step's name in test listings (gtest_discover_tests prints each test's parameter).
void PrintTo(Sm90Step step, std::ostream* os) { *os << sm90_step_name(step); }
}  // namespace cuda

namespace {

using testing::kCuda;
using testing::bits_of;
using testing::Mnk;
using testing::random_tensor;

// Compute capability of cuda:0 as "major.minor" ("" when it cannot be read).
std::string capability() {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess)
    return "";
  return std::to_string(major) + "." + std::to_string(minor);
}

// The kernel is sm_90a code: on any other GPU it is a usage error and these tests skip. The
// simulator reports 9.0.
#define SKIP_WITHOUT_SM90()                                                                  \
  do {                                                                                       \
    KILN_SKIP_WITHOUT_CUDA();                                                                \
    if (capability() != "9.0")                                                               \
      GTEST_SKIP() << "skipped: cuda:0 has compute capability " << capability()              \
                   << "; the Hopper GEMM (TMA, wgmma) runs on 9.0 only";                     \
  } while (0)

// C = op(A) op(B) with gemm_sm90's step `step` on cuda:0, against double on the CPU
// (gemm16_check.h). blocks: step 7's grid (0: one block per SM).
void check_sm90(cuda::Sm90Step step, DType in, bool ta, bool tb, const Mnk& s, bool misalign,
                int blocks = 0) {
  SCOPED_TRACE(cuda::sm90_step_name(step));
  const auto gemm = [step, blocks](DType t, bool a_t, bool b_t, int64_t m, int64_t n, int64_t k,
                                   const uint16_t* a, const uint16_t* b, float* c) {
    cuda::gemm_sm90(t, a_t, b_t, m, n, k, a, b, c, step, blocks);
  };
  testing::check_gemm16(gemm, 21, in, ta, tb, s, misalign);
}

// Every combination of M, N, K in {1, 17, 129}: one element, a part of a tile and of a slice,
// and just over the 128-row tile and two 64-deep slices. 17 and 1 are not multiples of 8, so
// the K-major operands with those K go through the padded workspace.
std::vector<Mnk> small_sizes() {
  std::vector<Mnk> sizes;
  for (int64_t m : {1, 17, 129})
    for (int64_t n : {1, 17, 129})
      for (int64_t k : {1, 17, 129}) sizes.push_back({m, n, k});
  return sizes;
}

// Larger and multiples of nothing: several tiles both ways (N = 264 and 300 cross step 6's 256
// columns too), K of 5 and 16 slices (the ring of 4 stages wraps, each stage's barriers
// complete phases 0, 1, 0, 1, ...), and one exactly on step 5's tiles.
const Mnk kLargeSizes[] = {{200, 300, 300}, {72, 264, 1000}, {256, 128, 256}};

// Each test runs every Hopper step: 5 (Pipelined), 6 (WarpSpecialized), 7 (Persistent).
class GemmSm90 : public ::testing::TestWithParam<cuda::Sm90Step> {};

// The transpose combinations (bit 0: A^T, bit 1: B^T) a step's small shapes run: all four for
// step 5; for steps 6 and 7, whose operands go through the same host code, the one the kernels
// read directly (B^T) and the one that transposes both.
std::vector<int> transposes(cuda::Sm90Step step) {
  if (step == cuda::Sm90Step::Pipelined) return {0, 1, 2, 3};
  return {2, 1};
}

TEST_P(GemmSm90, MatchesCpuBf16) {
  SKIP_WITHOUT_SM90();
  for (const Mnk& s : small_sizes())
    for (int t : transposes(GetParam())) check_sm90(GetParam(), DType::BF16, t & 1, t & 2, s, false);
}

TEST_P(GemmSm90, MatchesCpuF16) {
  SKIP_WITHOUT_SM90();
  for (const Mnk& s : small_sizes())
    for (int t : transposes(GetParam())) check_sm90(GetParam(), DType::F16, t & 1, t & 2, s, false);
}

TEST_P(GemmSm90, MatchesCpuOnLargerShapesAcrossTheRing) {
  SKIP_WITHOUT_SM90();
  for (const Mnk& s : kLargeSizes)
    for (int t = 0; t < 4; ++t)
      check_sm90(GetParam(), t % 2 ? DType::F16 : DType::BF16, t & 1, t & 2, s, false);
}

// Bases one element off 16-byte alignment, with K a multiple of 8: only the alignment sends the
// K-major operands through the padded workspace; C takes the scalar stores.
TEST_P(GemmSm90, MisalignedOperandsGoThroughTheWorkspace) {
  SKIP_WITHOUT_SM90();
  for (DType in : {DType::BF16, DType::F16})
    for (int t = 0; t < 4; ++t) check_sm90(GetParam(), in, t & 1, t & 2, {40, 48, 136}, true);
}

// Leading dimensions that are not a multiple of 8 elements: A (M,K) and B^T (N,K) with K = 100
// (200-byte rows, which no tensor map can describe), and transposed operands whose transposed
// copy then needs padding too.
TEST_P(GemmSm90, UnalignedLeadingDimensionsGoThroughTheWorkspace) {
  SKIP_WITHOUT_SM90();
  for (int t = 0; t < 4; ++t) check_sm90(GetParam(), DType::BF16, t & 1, t & 2, {33, 70, 100}, false);
}

TEST_P(GemmSm90, EmptyKGivesZeros) {
  SKIP_WITHOUT_SM90();
  check_sm90(GetParam(), DType::BF16, false, false, {7, 33, 0}, false);
  check_sm90(GetParam(), DType::F16, true, true, {7, 33, 0}, false);
}

// The f32 accumulation across slices and stages: 384 products (6 slices) of 1 + 2^-7 (exact in
// bf16) and 1 sum to 387, which bf16 cannot hold (its neighbours are 386 and 388).
TEST_P(GemmSm90, AccumulatesInF32) {
  SKIP_WITHOUT_SM90();
  const int64_t k = 384;
  const Tensor a = Tensor::full({k}, 1.0 + 1.0 / 128, DType::F32).to(DType::BF16).to(kCuda);
  const Tensor b = Tensor::full({k}, 1.0, DType::F32).to(DType::BF16).to(kCuda);
  Tensor c = Tensor::empty({1}, DType::F32, kCuda);
  {
    cuda::DeviceGuard guard(0);
    cuda::gemm_sm90(DType::BF16, false, true, 1, 1, k, bits_of(a), bits_of(b),
                    static_cast<float*>(c.raw_data()), GetParam());
  }
  EXPECT_EQ(c.to_vector<float>()[0], 387.0f);
}

INSTANTIATE_TEST_SUITE_P(Steps, GemmSm90,
                         ::testing::Values(cuda::Sm90Step::Pipelined,
                                           cuda::Sm90Step::WarpSpecialized,
                                           cuda::Sm90Step::Persistent),
                         [](const ::testing::TestParamInfo<cuda::Sm90Step>& info) {
                           switch (info.param) {
                             case cuda::Sm90Step::Pipelined: return std::string("Step5");
                             case cuda::Sm90Step::WarpSpecialized: return std::string("Step6");
                             case cuda::Sm90Step::Persistent: return std::string("Step7");
                           }
                           return std::string("Unknown");
                         });

// Step 7 with fewer blocks than tiles: each block loops over several tiles, so its ring and
// barriers carry on from one tile to the next (K = 200 is 4 slices: a tile's slices end on a
// different stage each time), and M spans 18 tile rows, more than one band of 16 in the
// grouped tile order, whose last band is shorter.
TEST(GemmSm90Persistent, FewerBlocksThanTilesCarryTheRingAcrossTiles) {
  SKIP_WITHOUT_SM90();
  check_sm90(cuda::Sm90Step::Persistent, DType::BF16, false, true, {300, 600, 200}, false, 2);
  check_sm90(cuda::Sm90Step::Persistent, DType::F16, false, true, {2181, 300, 72}, false, 5);
  check_sm90(cuda::Sm90Step::Persistent, DType::BF16, true, false, {129, 257, 65}, false, 1);
}

TEST(GemmSm90Persistent, RejectsNegativeBlocks) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor t = Tensor::zeros({16}, DType::BF16, kCuda);
  Tensor c = Tensor::zeros({4}, DType::F32, kCuda);
  cuda::DeviceGuard guard(0);
  try {
    cuda::gemm_sm90(DType::BF16, false, true, 2, 2, 2, bits_of(t), bits_of(t),
                    static_cast<float*>(c.raw_data()), cuda::Sm90Step::Persistent, -1);
    ADD_FAILURE() << "blocks = -1 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("blocks"), std::string::npos) << e.what();
  }
}

TEST(GemmSm90, AvailableExactlyOnComputeCapability90) {
  KILN_SKIP_WITHOUT_CUDA();
  cuda::DeviceGuard guard(0);
  // Every build with a CUDA backend holds the sm_90a code (or simulates it).
  EXPECT_EQ(cuda::sm90_gemm_available(), capability() == "9.0") << "compute capability " << capability();
}

TEST(GemmSm90, RejectsOtherDtypesAndNegativeSizes) {
  KILN_SKIP_WITHOUT_CUDA();  // checked before the device's capability: runs on every GPU
  const Tensor t = Tensor::zeros({16}, DType::F32, kCuda);
  cuda::DeviceGuard guard(0);
  const uint16_t* p = static_cast<const uint16_t*>(t.raw_data());
  float* c = static_cast<float*>(t.raw_data());
  try {
    cuda::gemm_sm90(DType::F32, false, true, 2, 2, 2, p, p, c);
    ADD_FAILURE() << "f32 inputs were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("bf16 or f16"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cuda::gemm_sm90(DType::BF16, false, true, -1, 2, 2, p, p, c), Error);
}

// On a GPU other than 9.0 the call is a usage error naming the device and what to use instead.
TEST(GemmSm90, RefusesOtherDevicesWithAUsageError) {
  KILN_SKIP_WITHOUT_CUDA();
  if (capability() == "9.0") GTEST_SKIP() << "skipped: cuda:0 is compute capability 9.0";
  const Tensor t = Tensor::zeros({16}, DType::BF16, kCuda);
  Tensor c = Tensor::zeros({4}, DType::F32, kCuda);
  cuda::DeviceGuard guard(0);
  try {
    cuda::gemm_sm90(DType::BF16, false, true, 2, 2, 2, bits_of(t), bits_of(t),
                    static_cast<float*>(c.raw_data()));
    ADD_FAILURE() << "compute capability " << capability() << " was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("gemm_tensor_core"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace kiln
