// gemm_lowp.cu: mixed-precision GEMM on the GPU: C (M,N) f32 = op(A) op(B) with A and B in bf16
// or f16 (stored as their 16-bit patterns) and the products summed in f32, the matrix product
// of mixed-precision training (Micikevicius et al., "Mixed Precision Training", ICLR 2018,
// https://arxiv.org/abs/1710.03740). Shapes, transposes and leading dimensions as gemm.cu
// (engine/cuda/kernels/gemm_shape.h); declared in engine/ops_cuda.h.
//
// gemm_lowp_vendor: cublasGemmEx with CUDA_R_16BF / CUDA_R_16F inputs, a CUDA_R_32F output and
//   CUBLAS_COMPUTE_32F (cuBLAS Library, "cublasGemmEx", https://docs.nvidia.com/cuda/cublas/).
//   The product of two 16-bit values is exact in f32, so the tensor cores' result differs from
//   an f32 GEMM on the widened inputs only in the order of the sum. Like gemm.cu's cuBLAS path,
//   the row-major product is asked of the column-major library as C^T = op(B)^T op(A)^T: a
//   row-major (M,N) matrix is a column-major (N,M) one, so the operands swap places.
//
// gemm_lowp (ours): on Hopper (compute capability 9.0, and the simulator, which reports 9.0)
//   step 7 of our GEMM (gemm_sm90_ws.cu: TMA, warp-specialised wgmma, persistent tiles);
//   KILN_GEMM_SM90=0 in the environment keeps step 4 there, to compare the two. On the other
//   devices with bf16/f16 tensor cores (compute capability 8.0+) step 4 (gemm_tensor_core.cu)
//   reads the 16-bit values directly. Elsewhere A and B are widened to f32 on the device
//   (copy.h's convert: the exact widening of engine/host_device.h) into scratch tensors from the
//   caching allocator, and the f32 hand GEMM multiplies them. The scratch goes back to the
//   allocator when the call returns; the kernels that read it are queued on current_stream(),
//   where the next user of the block queues too.
//
// Which of the two an op runs is decided by gemm_impl (engine/impl.h), not here; which step
// gemm_lowp runs, by lowp_gemm_choice (engine/cuda/lowp_gemm_choice.h).
#include "engine/cuda/runtime.h"

#include <cstdint>

#include "engine/cuda/blas.h"
#include "engine/cuda/context.h"
#include "engine/cuda/kernels/copy.h"
#include "engine/cuda/kernels/gemm_shape.h"
#include "engine/cuda/lowp_gemm_choice.h"
#include "engine/env_switch.h"
#include "engine/error.h"
#include "engine/ops_cuda.h"
#include "engine/tensor.h"

namespace kiln::cuda {

namespace {

// f32 scratch of n elements on the current device (caching allocator; freed with the Tensor).
Tensor f32_scratch(int64_t n) {
  return Tensor::empty({n}, DType::F32, Device(DeviceType::CUDA, current_device()));
}

// The shape of the product, after checking `in` and the sizes (s.m or s.n 0: nothing to write).
GemmShape lowp_shape(DType in, bool ta, bool tb, int64_t m, int64_t n, int64_t k) {
  KILN_CHECK(is_low_precision(in), "gemm_lowp: the inputs must be bf16 or f16, not ",
             dtype_name(in), " (use cuda::gemm for f32 and f64)");
  return gemm_shape("gemm_lowp", ta, tb, m, n, k);
}

// Whether the Hopper step may serve gemm_lowp: KILN_GEMM_SM90 unset or 1 (0: step 4 instead).
bool sm90_allowed() {
  static const bool allowed =
      env_switch("KILN_GEMM_SM90", true,
                 "the Hopper GEMM for mixed-precision products on compute capability 9.0, the "
                 "default",
                 "the WMMA step there too");
  return allowed;
}

}  // namespace

LowpGemm lowp_gemm_choice() {
  if (sm90_allowed() && sm90_gemm_available()) return LowpGemm::Sm90Persistent;
  if (tensor_cores_available()) return LowpGemm::TensorCore;
  return LowpGemm::WidenedF32;
}

const char* lowp_gemm_name(LowpGemm choice) {
  switch (choice) {
    case LowpGemm::Sm90Persistent: return "sm90-persistent";
    case LowpGemm::TensorCore: return "tensor-core";
    case LowpGemm::WidenedF32: return "widened-f32";
  }
  return "?";
}

// A (M,K) or (K,M) and B (K,N) or (N,K) are widened whole: their element counts do not depend
// on the transposes.
void gemm_lowp(Backend, DType in, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
               const uint16_t* a, const uint16_t* b, float* c) {
  const GemmShape s = lowp_shape(in, ta, tb, m, n, k);
  if (s.m == 0 || s.n == 0) return;
  const LowpGemm choice = lowp_gemm_choice();
  if (choice == LowpGemm::Sm90Persistent) {  // step 7: TMA and wgmma
    gemm_sm90(in, ta, tb, s.m, s.n, s.k, a, b, c, Sm90Step::Persistent);
    return;
  }
  if (choice == LowpGemm::TensorCore) {  // step 4: the 16-bit values straight in
    gemm_tensor_core(in, ta, tb, s.m, s.n, s.k, a, b, c);
    return;
  }
  const int64_t a_count = static_cast<int64_t>(s.m) * s.k;
  const int64_t b_count = static_cast<int64_t>(s.k) * s.n;
  const Tensor a32 = f32_scratch(a_count), b32 = f32_scratch(b_count);
  convert(a, in, a32.raw_data(), DType::F32, a_count);
  convert(b, in, b32.raw_data(), DType::F32, b_count);
  gemm_hand<float>(GemmKernel::RegisterBlocked, ta, tb, s.m, s.n, s.k,
                   static_cast<const float*>(a32.raw_data()),
                   static_cast<const float*>(b32.raw_data()), c, 0.0f);
}

// cublasGemmEx, row-major through the column-major identity (file comment).
void gemm_lowp_vendor(Backend, DType in, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                      const uint16_t* a, const uint16_t* b, float* c) {
  const GemmShape s = lowp_shape(in, ta, tb, m, n, k);
  if (s.m == 0 || s.n == 0) return;
  const cudaDataType_t type = in == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  const float alpha = 1.0f, beta = 0.0f;
  // Leading dimensions must be >= 1 even for empty operands.
  const int lda = s.lda > 0 ? s.lda : 1, ldb = s.ldb > 0 ? s.ldb : 1, ldc = s.n > 0 ? s.n : 1;
  KILN_CUBLAS_LAUNCH(cublas().gemm_ex(cublas_handle(), tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     ta ? CUBLAS_OP_T : CUBLAS_OP_N, s.n, s.m, s.k, &alpha, b,
                                     type, ldb, a, type, lda, &beta, c, CUDA_R_32F, ldc,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace kiln::cuda
