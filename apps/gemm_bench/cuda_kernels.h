// cuda_kernels.h: gemm_bench's CUDA kernels by name (rows.h's kCudaKernels, the --kernels words
// of --device cuda), what each takes and how one product of it is queued; cuda_rows.cpp times
// and checks them.
//   naive, tiled, regblock  steps 1-3 on f32 inputs (engine/cuda/kernels/gemm.cu)
//   hand                    what matmul uses with KILN_KERNELS=hand: regblock for float
//   vendor                  cuBLAS SGEMM (TF32 only with KILN_TF32=1)
//   tc_bf16, tc_f16         step 4, tensor cores (cuda::gemm_tensor_core): A and B rounded to
//                           bf16 / f16, f32 sums; compute capability 8.0+
//   sm90_bf16, sm90_f16     step 5, Hopper: TMA, mbarriers and wgmma (cuda::gemm_sm90 with
//                           Sm90Step::Pipelined) on the same rounded inputs
//   sm90ws_bf16, sm90ws_f16 step 6, warp-specialised (Sm90Step::WarpSpecialized)
//   sm90p_bf16, sm90p_f16   step 7, persistent blocks (Sm90Step::Persistent, one per SM)
//   vendor_bf16             cublasGemmEx on the bf16 inputs, f32 sums (cuda::gemm_lowp_vendor)
// Steps 5-7 need compute capability 9.0 and read B transposed (stored (N,K)): see run_kernel.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/dtype.h"
#include "engine/ops_cuda.h"

namespace kiln::apps::gemm_bench {

// The input dtype of a kernel: bf16 / f16 for the tensor-core and cublasGemmEx rows, else f32.
DType input_dtype(const std::string& kernel);
// Step 4 (WMMA, compute capability 8.0+).
bool is_tensor_core(const std::string& kernel);
// The Hopper step a kernel runs (steps 5-7), or none for the others.
std::optional<cuda::Sm90Step> sm90_step(const std::string& kernel);

// One product with the named kernel, queued on the current stream: C (n,n) f32 = A B. a and b
// are float, or bf16 / f16 bit patterns where input_dtype says so; for the Hopper kernels b
// holds B^T (stored (n,n) as (N,K)), which they multiply as B: their K-major layout, so the
// time is the kernel's alone, not the workspace transpose a (K,N) B would cost on every call.
void run_kernel(const std::string& kernel, int64_t n, const void* a, const void* b, float* c);

}  // namespace kiln::apps::gemm_bench
