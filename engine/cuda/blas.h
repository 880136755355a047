// blas.h: cuBLAS handles and the TF32 switch. Under the CUDA simulator cuBLAS is the simulated
// subset of engine/cuda/sim/cublas.h (docs/cuda_simulator.md).
//
//   cuda::cublas().sgemm(cuda::cublas_handle(), ...);   // queued on cuda::current_stream()
//
// cuBLAS is called through the table of cublas_api.h, which loads the library on first use.
//
// A cuBLAS handle holds per-device state and is not safe to share between host threads, so
// there is one per device and host thread, created on first use. cublas_handle() binds it to
// this thread's current_stream() of the current device and applies the math mode on every call,
// so library calls are ordered with our own kernels.
//
// TF32: FP32 matrix products on tensor cores round the inputs to 10 mantissa bits (~1e-3
// relative error) for several times the speed. Off by default (results match the CPU to FP32
// precision); on with set_allow_tf32(true) or env KILN_TF32=1. The cuDNN convolutions read the
// same switch (tf32_enabled()).
#pragma once

#include "engine/cuda/cublas_api.h"
#include "engine/cuda/launch_count.h"

#include "engine/cuda/runtime.h"

namespace kiln::cuda {

cublasHandle_t cublas_handle();  // current device, this host thread, on current_stream()

void set_allow_tf32(bool allow);
bool tf32_enabled();  // set_allow_tf32(), else env KILN_TF32 (1|0), else false

[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file,
                                     int line);

}  // namespace kiln::cuda

// KILN_CUBLAS_CHECK(call): a failed cuBLAS call becomes a kiln::Error naming it, file and line.
#define KILN_CUBLAS_CHECK(call)                                                 \
  do {                                                                          \
    cublasStatus_t kiln_status_ = (call);                                       \
    if (kiln_status_ != CUBLAS_STATUS_SUCCESS)                                  \
      ::kiln::cuda::throw_cublas_error(kiln_status_, #call, __FILE__, __LINE__); \
  } while (0)

// KILN_CUBLAS_LAUNCH(call): KILN_CUBLAS_CHECK for a call that queues device work (a GEMM),
// counted as one launch (engine/cuda/launch_count.h).
#define KILN_CUBLAS_LAUNCH(call)       \
  do {                                 \
    KILN_CUBLAS_CHECK(call);           \
    ::kiln::cuda::count_launch();      \
  } while (0)
