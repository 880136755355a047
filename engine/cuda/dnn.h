// dnn.h: cuDNN handles. Under the CUDA simulator cuDNN is the simulated subset of
// engine/cuda/sim/cudnn.h (docs/cuda_simulator.md).
//
//   KILN_CUDNN_CHECK(cudnnConvolutionForward(cuda::cudnn_handle(), ...));
//
// Like cuBLAS handles, one per device and host thread, created on first use; cudnn_handle()
// binds it to this thread's current_stream() of the current device on every call.
#pragma once

#if KILN_CUDA_SIM
#include "engine/cuda/sim/cudnn.h"
#else
#include <cudnn.h>
#endif

#include "engine/cuda/launch_count.h"
#include "engine/cuda/runtime.h"

namespace kiln::cuda {

cudnnHandle_t cudnn_handle();  // current device, this host thread, on current_stream()

[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* file,
                                    int line);

}  // namespace kiln::cuda

// KILN_CUDNN_CHECK(call): a failed cuDNN call becomes a kiln::Error naming it, what cuDNN said
// (cudnnGetErrorString), file and line.
#define KILN_CUDNN_CHECK(call)                                                 \
  do {                                                                         \
    cudnnStatus_t kiln_status_ = (call);                                       \
    if (kiln_status_ != CUDNN_STATUS_SUCCESS)                                  \
      ::kiln::cuda::throw_cudnn_error(kiln_status_, #call, __FILE__, __LINE__); \
  } while (0)

// KILN_CUDNN_LAUNCH(call): KILN_CUDNN_CHECK for a call that queues device work (a convolution
// pass, a bias add, an algorithm search), counted as one launch (engine/cuda/launch_count.h).
#define KILN_CUDNN_LAUNCH(call)        \
  do {                                 \
    KILN_CUDNN_CHECK(call);            \
    ::kiln::cuda::count_launch();      \
  } while (0)
