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
namespace {

using testing::kCuda;
using testing::bits_of;
using testing::Mnk;
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

// C = op(A) op(B) with gemm_tensor_core on cuda:0, against double on the CPU (gemm16_check.h).
void check_tensor_core(DType in, bool ta, bool tb, const Mnk& s, bool misalign) {
  testing::check_gemm16(cuda::gemm_tensor_core, 11, in, ta, tb, s, misalign);
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
