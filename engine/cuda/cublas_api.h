// cublas_api.h: the cuBLAS entry points Kiln calls, resolved the first time a GPU needs them.
//
//   KILN_CUBLAS_CHECK(cuda::cublas().sgemm(cuda::cublas_handle(), ...));
//
// Why not link libcublas: loading it costs resident memory in every process, GPU or not. Its
// libcublasLt.so carries ~100 MB of writable data that the dynamic loader relocates (and so
// copies into the process) at start-up: measured on CUDA 13, dlopen of libcublasLt.so.13 alone
// adds 152 MB to the resident set before a single call. A CPU-only run of a CUDA build paid that
// for nothing (mnist_train: 508 MB peak against 351 MB for the CPU-only build). So the library
// is opened with dlopen(3) on the first cuBLAS call, and a process that never uses a GPU never
// maps it. (TensorFlow's tsl/cuda stubs do the same for the same reason.)
//
// Where it is looked for: next to the CUDA runtime this process loaded (cuBLAS ships in the
// same toolkit directory), then by its soname through the usual search (LD_LIBRARY_PATH,
// ld.so.cache). Under the CUDA simulator the table points at the simulated subset
// (engine/cuda/sim/cublas.h) and nothing is loaded.
#pragma once

#if KILN_CUDA_SIM
#include "engine/cuda/sim/cublas.h"
#else
#include <cublas_v2.h>
#endif

namespace kiln::cuda {

// cublasGemmEx with a cublasComputeType_t (the headers also declare a C++ overload taking a
// cudaDataType compute type, so decltype cannot name it).
using CublasGemmExFn = cublasStatus_t (*)(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* a, cudaDataType_t a_type,
                                          int lda, const void* b, cudaDataType_t b_type, int ldb,
                                          const void* beta, void* c, cudaDataType_t c_type,
                                          int ldc, cublasComputeType_t compute_type,
                                          cublasGemmAlgo_t algo);

struct CublasApi {
  decltype(&cublasCreate) create;
  decltype(&cublasDestroy) destroy;
  decltype(&cublasSetStream) set_stream;
  decltype(&cublasGetStream) get_stream;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasGetMathMode) get_math_mode;
  decltype(&cublasSgemm) sgemm;
  decltype(&cublasDgemm) dgemm;
  CublasGemmExFn gemm_ex;
  decltype(&cublasGetStatusName) status_name;
  decltype(&cublasGetStatusString) status_string;
};

// The table, loading cuBLAS on the first call (thread-safe). Throws kiln::Error naming the
// library and what to do when it cannot be loaded or lacks an entry point.
const CublasApi& cublas();

// Whether this process has loaded libcublas (always false under the simulator): a CPU-only run
// must not have.
bool cublas_loaded();

}  // namespace kiln::cuda
