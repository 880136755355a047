// grid_stride.h: the grid size of the kernels that loop over more work than one grid covers.
//
// Such a kernel (transpose over many matrices, column sums over many slices) launches at most
// 65535 blocks along y or z and lets each block loop: `for (m = blockIdx.z; m < n; m +=
// gridDim.z)`. The second pass of that loop is where a block reuses its shared memory, so the
// barrier before the reuse matters only there, and on a GPU it takes 65536 matrices to get
// there. Under the simulator, KILN_SIM_GRID_STRIDE_CAP=n lowers the cap, so a test with a
// handful of matrices makes every block loop (tests/cuda: the *_grid_stride runs).
#pragma once

#include <cstdint>
#if KILN_CUDA_SIM
#include <cstdlib>
#endif

namespace kiln::cuda {

// min(n, limit), and under the simulator min(n, KILN_SIM_GRID_STRIDE_CAP) when it is set.
inline unsigned grid_stride_blocks(int64_t n, unsigned limit) {
#if KILN_CUDA_SIM
  static const unsigned cap = [] {
    const char* v = std::getenv("KILN_SIM_GRID_STRIDE_CAP");
    const long c = v ? std::strtol(v, nullptr, 10) : 0;
    return c > 0 ? static_cast<unsigned>(c) : 0u;
  }();
  if (cap > 0 && cap < limit) limit = cap;
#endif
  return static_cast<unsigned>(n < limit ? n : limit);
}

}  // namespace kiln::cuda
