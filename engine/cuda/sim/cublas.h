// sim/cublas.h: the CUDA simulator's stand-in for <cublas_v2.h>: the subset of cuBLAS Kiln
// calls, with cuBLAS's own names, signatures and enum values (docs/cuda_simulator.md, "Vendor
// libraries"). engine/cuda/blas.h includes it under KILN_CUDA_SIM.
//
// Semantics follow the cuBLAS documentation (https://docs.nvidia.com/cuda/cublas/): column-major
// matrices, C = alpha op(A) op(B) + beta C, host pointer mode (alpha and beta are read before the
// call returns), C not read when beta is 0, the documented argument checks and status codes.
// The product is computed on the host (sim/cublas.cpp) and queued on the handle's stream.
//
// The real header names the entry points cublasCreate_v2, cublasSgemm_v2, ... behind macros;
// here they are the plain names, which is all Kiln's source spells.
#pragma once

#include "engine/cuda/sim/api.h"
#include "engine/cuda/sim/library_error.h"  // IWYU pragma: export

// The enums have a fixed underlying type (int): any int converted to one is then a valid value,
// which the simulator checks and rejects as cuBLAS does (an out-of-range value of an enum
// without one would be undefined behaviour, reported by UBSan before the check could run).
enum cublasStatus_t : int {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16,
};

enum cublasOperation_t : int {
  CUBLAS_OP_N = 0,
  CUBLAS_OP_T = 1,
  CUBLAS_OP_C = 2,      // conjugate transpose: the transpose for real types
  CUBLAS_OP_CONJG = 3,  // not supported by cuBLAS's GEMM: CUBLAS_STATUS_INVALID_VALUE
};

// Only DEFAULT, PEDANTIC and TF32_TENSOR_OP (each optionally with the
// DISALLOW_REDUCED_PRECISION_REDUCTION flag) are simulated; cublasSetMathMode answers
// CUBLAS_STATUS_NOT_SUPPORTED for the others (TENSOR_OP_MATH would round FP32 to FP16).
enum cublasMath_t : int {
  CUBLAS_DEFAULT_MATH = 0,
  CUBLAS_TENSOR_OP_MATH = 1,
  CUBLAS_PEDANTIC_MATH = 2,
  CUBLAS_TF32_TENSOR_OP_MATH = 3,
  CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16,
};

// The compute types of cublasGemmEx (the real values). Simulated: CUBLAS_COMPUTE_32F (which
// follows the handle's math mode: TF32 applies to FP32 inputs) and CUBLAS_COMPUTE_32F_PEDANTIC
// (never TF32); the others are CUBLAS_STATUS_NOT_SUPPORTED.
enum cublasComputeType_t : int {
  CUBLAS_COMPUTE_16F = 64,
  CUBLAS_COMPUTE_16F_PEDANTIC = 65,
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_PEDANTIC = 69,
  CUBLAS_COMPUTE_64F = 70,
  CUBLAS_COMPUTE_64F_PEDANTIC = 71,
  CUBLAS_COMPUTE_32I = 72,
  CUBLAS_COMPUTE_32I_PEDANTIC = 73,
  CUBLAS_COMPUTE_32F_FAST_16F = 74,
  CUBLAS_COMPUTE_32F_FAST_16BF = 75,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
};

// cublasGemmEx's algorithm: the library's heuristic choice. The numbered algorithms
// (CUBLAS_GEMM_ALGO0...) are not simulated (CUBLAS_STATUS_NOT_SUPPORTED).
enum cublasGemmAlgo_t : int {
  CUBLAS_GEMM_DEFAULT = -1,
  CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99,  // deprecated synonym of DEFAULT since CUDA 11
};

struct cublasContext;
using cublasHandle_t = cublasContext*;

// The handle belongs to the device current at creation; its stream starts as the legacy
// default stream (nullptr).
cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode);
const char* cublasGetStatusName(cublasStatus_t status);    // "CUBLAS_STATUS_INVALID_VALUE"
const char* cublasGetStatusString(cublasStatus_t status);  // what it means, in words

// C (m x n, ldc) = alpha op(A) op(B) + beta C, column-major; op(A) is m x k, op(B) is k x n.
// A is stored m x k (lda >= max(1, m)) for CUBLAS_OP_N, else k x m (lda >= max(1, k)); B is
// k x n (ldb >= max(1, k)) for CUBLAS_OP_N, else n x k (ldb >= max(1, n)); ldc >= max(1, m).
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc);
cublasStatus_t cublasDgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const double* alpha,
                           const double* A, int lda, const double* B, int ldb,
                           const double* beta, double* C, int ldc);

// C (m x n, ldc) = alpha op(A) op(B) + beta C with typed operands, column-major, shapes and
// leading dimensions as cublasSgemm. Simulated combinations (the cuBLAS documentation's table for
// cublasGemmEx), alpha and beta float in host memory:
//   computeType CUBLAS_COMPUTE_32F or _32F_PEDANTIC, and Atype = Btype =
//     CUDA_R_16F  with Ctype CUDA_R_16F or CUDA_R_32F,
//     CUDA_R_16BF with Ctype CUDA_R_16BF or CUDA_R_32F,
//     CUDA_R_32F  with Ctype CUDA_R_32F.
// The 16-bit inputs are widened exactly to FP32 and the products summed in FP32; a 16-bit C is
// computed in FP32 (alpha acc + beta C) and rounded once to nearest even. Other combinations, and
// algorithms other than the default, are CUBLAS_STATUS_NOT_SUPPORTED.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo);
