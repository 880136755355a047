// blas.cpp: cuBLAS handles per device and host thread, and the TF32 switch (see blas.h).
#include "engine/cuda/blas.h"

#include <atomic>
#include <cstddef>
#include <string>
#include <vector>

#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/env_switch.h"
#include "engine/error.h"

namespace kiln::cuda {
namespace {

std::atomic<int> tf32_setting{-1};  // -1: never set in code, the environment decides

bool tf32_from_env() {
  static const bool on = env_switch("KILN_TF32", false,
                                    "allow TF32 tensor cores in FP32 products",
                                    "FP32 products in full FP32, the default");
  return on;
}

// This thread's handles, one slot per device, destroyed when the thread ends.
struct ThreadHandles {
  std::vector<cublasHandle_t> by_device;
  ~ThreadHandles() {
    for (size_t d = 0; d < by_device.size(); ++d) {
      if (!by_device[d]) continue;
      (void)cudaSetDevice(static_cast<int>(d));
      (void)cublas().destroy(by_device[d]);
    }
  }
};

thread_local ThreadHandles thread_handles;

}  // namespace

void set_allow_tf32(bool allow) { tf32_setting = allow ? 1 : 0; }

bool tf32_enabled() {
  const int s = tf32_setting.load();
  return s < 0 ? tf32_from_env() : s == 1;
}

cublasHandle_t cublas_handle() {
  // The stream first: thread-locals are destroyed in reverse order of construction, so this
  // thread's handles are destroyed before the streams they are bound to.
  cudaStream_t stream = current_stream();
  const size_t device = static_cast<size_t>(current_device());
  std::vector<cublasHandle_t>& handles = thread_handles.by_device;
  if (handles.size() <= device) handles.resize(static_cast<size_t>(device_count()), nullptr);
  cublasHandle_t& h = handles[device];
  const CublasApi& api = cublas();
  if (!h) KILN_CUBLAS_CHECK(api.create(&h));
  KILN_CUBLAS_CHECK(api.set_stream(h, stream));
  KILN_CUBLAS_CHECK(
      api.set_math_mode(h, tf32_enabled() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  return h;
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  std::string detail;
#if KILN_CUDA_SIM
  if (*sim::last_library_error()) detail = std::string(": ") + sim::last_library_error();
#endif
  throw Error(std::string("cuBLAS error: ") + call + " failed with " +
              cublas().status_name(status) + " (" + cublas().status_string(status) + ")" + detail +
              " at " + file + ":" + std::to_string(line));
}

}  // namespace kiln::cuda
