// dnn.cpp: cuDNN handles per device and host thread (see dnn.h).
#include "engine/cuda/dnn.h"

#include <cstddef>
#include <string>
#include <vector>

#include "engine/cuda/context.h"
#include "engine/error.h"

namespace kiln::cuda {
namespace {

// This thread's handles, one slot per device, destroyed when the thread ends.
struct ThreadHandles {
  std::vector<cudnnHandle_t> by_device;
  ~ThreadHandles() {
    for (size_t d = 0; d < by_device.size(); ++d) {
      if (!by_device[d]) continue;
      (void)cudaSetDevice(static_cast<int>(d));
      (void)cudnnDestroy(by_device[d]);
    }
  }
};

thread_local ThreadHandles thread_handles;

}  // namespace

cudnnHandle_t cudnn_handle() {
  // The stream first, so this thread's handles are destroyed before their streams (blas.cpp).
  cudaStream_t stream = current_stream();
  const size_t device = static_cast<size_t>(current_device());
  std::vector<cudnnHandle_t>& handles = thread_handles.by_device;
  if (handles.size() <= device) handles.resize(static_cast<size_t>(device_count()), nullptr);
  cudnnHandle_t& h = handles[device];
  if (!h) KILN_CUDNN_CHECK(cudnnCreate(&h));
  KILN_CUDNN_CHECK(cudnnSetStream(h, stream));
  return h;
}

void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* file, int line) {
  std::string detail;
#if KILN_CUDA_SIM
  if (*sim::last_library_error()) detail = std::string(": ") + sim::last_library_error();
#endif
  throw Error(std::string("cuDNN error: ") + call + " failed with " + cudnnGetErrorString(status) +
              " (status " + std::to_string(static_cast<int>(status)) + ")" + detail + " at " +
              file + ":" + std::to_string(line));
}

}  // namespace kiln::cuda
