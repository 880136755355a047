// launch.h: the one way a Kiln kernel is launched.
//
//   launch(my_kernel<float>, LaunchConfig{grid, block, shared_bytes, stream}, args...);
//
// Under nvcc this is `my_kernel<<<grid, block, shared_bytes, stream>>>(args...)` followed by a
// cudaGetLastError check, so a bad configuration fails at the launch that caused it, naming it.
// Under the simulator it runs the grid on the CPU (engine/cuda/sim/launch.h): one call site,
// two machines. Arguments are converted to the kernel's parameter types first, so passing an
// int64_t where the kernel takes an int behaves the same on both. Each launch is counted
// (engine/cuda/launch_count.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/cuda/check.h"
#include "engine/cuda/launch_count.h"
#include "engine/cuda/runtime.h"
#if KILN_CUDA_SIM
#include "engine/cuda/sim/launch.h"
#endif

namespace kiln::cuda {

struct LaunchConfig {
  dim3 grid;
  dim3 block;
  size_t shared_bytes = 0;      // dynamic shared memory (KILN_DYNAMIC_SHARED)
  cudaStream_t stream = nullptr;
};

// Blocks of `threads` needed to cover n elements (at least 1, so empty launches stay valid).
inline unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b > 0 ? b : 1);
}

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), const LaunchConfig& cfg, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "launch: wrong number of kernel arguments");
  count_launch();
#if KILN_CUDA_SIM
  sim::launch(cfg.grid, cfg.block, cfg.shared_bytes, cfg.stream, kernel,
              static_cast<Params>(args)...);
#else
  kernel<<<cfg.grid, cfg.block, cfg.shared_bytes, cfg.stream>>>(static_cast<Params>(args)...);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw Error(std::string("CUDA kernel launch failed: ") + cudaGetErrorString(err) + " (grid " +
                std::to_string(cfg.grid.x) + "x" + std::to_string(cfg.grid.y) + "x" +
                std::to_string(cfg.grid.z) + ", block " + std::to_string(cfg.block.x) + "x" +
                std::to_string(cfg.block.y) + "x" + std::to_string(cfg.block.z) + ", " +
                std::to_string(cfg.shared_bytes) + " B dynamic shared memory)");
  }
#endif
}

}  // namespace kiln::cuda
