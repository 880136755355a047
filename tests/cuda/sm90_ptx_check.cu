// sm90_ptx_check.cu: every PTX instruction of engine/cuda/sm90/mbarrier.h and tma.h in one
// kernel, so that ptxas checks their syntax. Not part of the build (its kernel is never
// launched); compile it by hand with the toolkit:
//   nvcc -std=c++17 -arch=sm_90a -I. -c tests/cuda/sm90_ptx_check.cu -o /tmp/sm90_ptx_check.o
// (-ptx instead of -c shows the instructions.) For other architectures the same header
// compiles to __trap().
#include <cstdint>

#include "engine/cuda/runtime.h"
#include "engine/cuda/sm90/mbarrier.h"
#include "engine/cuda/sm90/tma.h"

namespace sm90 = kiln::cuda::sm90;

__global__ void sm90_ptx_check_kernel(const __grid_constant__ CUtensorMap map, float* out) {
  __shared__ alignas(1024) uint16_t tile[64 * 64];
  __shared__ sm90::Mbarrier bar;
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(&bar, 1);
    sm90::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    sm90::mbarrier_arrive_expect_tx(&bar, sizeof tile);
    sm90::tma_load_2d(tile, &map, 0, 64, &bar);
  }
  sm90::mbarrier_wait(&bar, 0);
  sm90::fence_proxy_async_shared();
  sm90::mbarrier_arrive(&bar);
  out[threadIdx.x] = tile[threadIdx.x] + (sm90::mbarrier_try_wait(&bar, 1) ? 1.0f : 0.0f);
}
