// check.h: every CUDA runtime call goes through KILN_CUDA_CHECK, which turns a failure into a
// kiln::Error naming the call, the file and the line, and what the runtime said (and, for a
// broken CUDA graph capture rule, which rule and what to do: capture_rules.h).
#pragma once

#include <string>

#include "engine/cuda/capture_rules.h"
#include "engine/cuda/runtime.h"
#include "engine/error.h"

namespace kiln::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, const char* file,
                                          int line) {
  std::string what = std::string("CUDA error: ") + call + " failed with " +
                     cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ") at " + file +
                     ":" + std::to_string(line);
#if KILN_CUDA_SIM
  // A GPU says only "unspecified launch failure"; the simulator knows which work faulted.
  const std::string fault = ::kiln::sim::fault_message();
  if (!fault.empty()) what += "; the device faulted earlier: " + fault;
#endif
  if (const char* advice = capture_rule_advice(err)) {
    what += std::string(". CUDA graph capture: ") + advice;
  }
  throw Error(what);
}

}  // namespace kiln::cuda

#define KILN_CUDA_CHECK(call)                                                    \
  do {                                                                           \
    cudaError_t kiln_err_ = (call);                                              \
    if (kiln_err_ != cudaSuccess) {                                              \
      (void)cudaGetLastError(); /* clear the sticky-free error state */          \
      ::kiln::cuda::throw_cuda_error(kiln_err_, #call, __FILE__, __LINE__);      \
    }                                                                            \
  } while (0)
