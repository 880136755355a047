// device_name.cpp: cudaGetDeviceProperties' name of a device (engine/cuda/device_name.h).
#include "engine/cuda/device_name.h"

#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/cuda/runtime.h"

namespace kiln::cuda {

std::string device_name(int index) {
  check_device(index);
  cudaDeviceProp prop;
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return prop.name;
}

}  // namespace kiln::cuda
