// device_name.h: the name a CUDA device reports (cudaDeviceProp::name), e.g. "NVIDIA H100 80GB
// HBM3"; "Kiln CUDA simulator" under the simulator. Declared in every build, defined in
// device_name.cpp, which only a build with a CUDA backend compiles: other code calls it only
// in `if constexpr (kWithCuda)` branches (engine/build_config.h).
#pragma once

#include <string>

namespace kiln::cuda {

std::string device_name(int index);

}  // namespace kiln::cuda
